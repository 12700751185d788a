"""``stowage-frag``: Stowage's fragmentation score, the part of ``stowage.io/node-policy: pack``
that scores every pod (registered alone for comparison). The ``pack`` default (``stowage``,
:mod:`.stowage`) adds the Sum-of-Squares share packing on top of it.

Why not plain FGD: on the Alibaba openb trace the paper's best policy (FGD) still leaves ~4.8 %
of the GPUs unallocated when the arrived workload equals the cluster, and replaying it shows why:
~85 % of the GPU-milli of the pods that fail had a GPU free for them — on nodes whose *host
memory* (mostly) or CPU was already gone. FGD's fragmentation measure checks typical pods'
CPU but not their memory, and it only notices host exhaustion once a typical pod no longer
fits; by then the node's idle GPUs are stranded for good (pods never leave). The GPUs are
unevenly fed: an 8-GPU G2 node has 48 GiB of memory per GPU, a 2-GPU T4 node 243 GiB, and the
trace's GPU pods ask for ~41 GiB per GPU on average — memory-hungry pods (and CPU-only pods)
belong where memory is plentiful.

So the score of placing a pod on a node (higher is better) is::

    (F_before - F_after)  -  w * (stranded_after - stranded_before)

- ``F`` is FGD's fragmentation (:mod:`packing.frag`) over a typical workload *learned online* from the
  pods the extender has seen (``observe``; no look-ahead), with host memory counted in "does this
  class fit" alongside CPU;
- ``stranded`` is the node's idle GPU-milli that its remaining CPU and memory could not feed at
  the workload's mean CPU and memory per GPU-milli (also learned online):
  ``max(0, idle - min(cpu_free / cpu_per_milli, mem_free / mem_per_milli))``;
- ``w`` = 2 (chosen on seed 42 of the default trace; 1..3 are within 0.1 point).

Model pressure. Pods may be limited to lists of GPU models. The learned classes keep their
lists (``observe(req, models)``), so ``F`` knows which cards a class cannot use; and a GPU pod
pays ``pressure_weight * rho(m)`` per GPU-milli it takes on a card of model m, where
``rho(m) = min(1, sum over lists S holding m of q_S * all cards / S's cards)`` and ``q_S`` is
S's share of the GPU demand seen: the share of m's cards the limited pods will want if the mix
holds until the cluster is full. Without it, pods that may run anywhere (pulled by the stranding
term to the memory-rich T4/P100 nodes of the openb cluster) took the cards the T4-only and
P100-only pods needed: 2.1x FGD's unallocated GPUs on a variant with a quarter of the GPU pods
limited (docs/binpack.md). No pod limited to models: every ``rho`` is 0, nothing changes.
``rho`` is computed once per rebuild of the learned table, so scores stay row-local.

Saturated models. Where the limited pods want every card of a model (the sum behind ``rho(m)``
reaches 1: their share of the demand is at least the model's share of the cards), each of its
cards a pod takes is one a limited pod will not get, whatever else happens; a pod with a choice
must then take such a card last, not trade it against the other terms. So on a saturated model
the cost per GPU-milli is :data:`SATURATED_COST` instead of ``rho`` (1: a tier above every other
term: 10 GPU-milli of it outweigh the churn cost of opening a node, and a share's SS term).
Pods limited to the model pay it on every card they may use, so it changes nothing for them.
Without it two things went wrong on the constrained variants: the pressure (at most 1,000 per
card) lost to the capability pressure of an empty 8-card node (r * 8,000) and the fragmentation
gain of filling a card the multi-GPU classes cannot use, so 1-GPU pods that could run anywhere
filled the T4 cards first (a burst at the elastic scenario's start); and in churn mode, where an
empty node costs CHURN_COST, they took the T4 cards of nodes in use rather than open a node. On
the arrival replay (median of 10 seeds) spec33 gains 0.7-0.8 point at 90-100 % arrived and
spec40 1.8-1.9 (past saturation spec40 loses 0.3: flexible pods wait while T4 cards are kept);
the elastic scenario: docs/elastic.md. docs/binpack.md, "Saturated models".

Capability pressure. Some whole-GPU classes fit on only a few nodes at all: on the openb
cluster an 8-GPU pod asking for 120 cores and 720 GiB fits only the 39 G3 nodes (128 cores,
768 GiB), which are also the 8-card nodes with the most host memory per GPU, so the stranding
term sends memory-hungry pods (and CPU-only ones) there first. For every whole-GPU class seen,
S is the set of nodes that could host it empty (cards of an allowed model and size, allocatable
CPU and memory: ``CardArrays.cpu_total``/``hmem_total``) and q its share of the GPU demand seen;
``r = min(1, q * (K_all - K_S) / K_S)`` (cards) is the demand it puts on S beyond what a class
that may use every card would (0 when every node can host it). A node's ability to host the
class is worth ``r * its cards * 1000`` GPU-milli, and a pod that takes it away (a card of the
class's last whole set, or the CPU or memory it needs) pays that, ``capability_weight`` = 1,
the unit of ``F``. It is FGD's "does the class still fit here" weighted by the class's GPU
volume and scarcity instead of its pod count: a rare class that only a few nodes can host
is protected, one that can go anywhere is not. That scarcity is over the empty cluster; a class
that is rare against its capable set (r small) still loses its nodes one by one to pods that
could go anywhere. So the scarcity is also measured on the cluster as it is: c, the pods of the
class its nodes could host now, against lam, the pods of the class to expect until the idle GPU
is used up at the demand mix seen (Poisson). The c-th place is needed when at least c of them
come, so ``r`` is at least ``P(X >= c)``: ~0 while places are plentiful, rising to 1 as they run
out. Computed once per learned table (row-local).

The same protects shares limited to GPU models (:func:`protectable`): a share's capable set is
the nodes with a card of its models and the host CPU and memory it asks for, its value ``r *``
its GPU-milli, and a node loses it when no card could still hold the share or its host room
is gone. On the openb cluster a P100-only share asking 12 cores and 46 GiB fits a 16-core
P100 node once; a pod that could run anywhere (11 cores, 48 GiB) placed there first takes that
place, and nothing else valued it: the model pressure counts cards, and P100 cards were not
scarce, the P100 nodes' host room was (the elastic scenario on spec33 lost most of its P100
shares that way; docs/elastic.md). Shares that may use any card are left out: nearly every
node can host them (r ~ 0), and the stranding term keeps host room for GPUs in general.

Churn mode. In a cluster where pods come and go, an empty node is worth more than any
fragmentation gain: the cluster autoscaler can remove it (and a node that stays empty keeps
room for the biggest pods). So once the placer learns that GPU pods have LEFT the cluster
(:meth:`watch_releases`: the extender hands it the model's count of GPU releases; the elastic
benchmark the same), it switches for good to preferring nodes that already run a GPU pod:
placing a GPU pod on a node with none costs :data:`CHURN_COST` (1e5, far above any fragmentation
delta), so the score orders nodes lexicographically — used nodes first, then the fragmentation
score above. The switch bumps :attr:`version` (cached scores are dropped). Scores stay
row-local: the cost reads only the node's own ``pods`` row. Where pods never leave (the static
trace replay) the mode never switches on, so those results are unchanged by construction.

Scores are exact (not FGD's integer sigmoid), so ties are real ties and go to the scheduler's
node order. A share pod goes on the card of the chosen node with the best score (the card
policy ``spread`` asks for the emptiest card instead); whole-GPU pods take free cards that keep
NVLink/NUMA locality. Cost per request: one vectorised evaluation over the feasible
(node, card) pairs with per-node state kept incrementally (:class:`packing.frag.FragIndex`).
"""
from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from stowage.inventory import model_matches
from stowage.resources import GpuRequest

from ..frag import MILLI, FragPlacerBase, PodClass, model_list, same_as_previous_card
from ..model import CardArrays, models_epoch
from ..fit import row_count
from ..placer import choose_cards_default, choose_whole_cards, first_free_cards, segment_max
from ..pod_policy import SPREAD, PodPolicy

STRAND_WEIGHT = 2.0
PRESSURE_WEIGHT = 1.0  # model pressure: cost per GPU-milli taken on a card whose model is wanted
SATURATED_COST = 1e4   # cost per GPU-milli on a card of a model the limited pods want all of
CAPABILITY_WEIGHT = 1.0  # capability pressure: cost per GPU-milli of scarce capability lost
MAX_SHARES_KEPT = 1 << 18   # share pods kept one by one before they are compacted (see _compact_shares)
MAX_MODEL_LISTS = 256  # distinct model lists whose demand the model pressure keeps (see _model_acc)
CHURN_COST = 1e5   # churn mode: placing a GPU pod on a node that runs no GPU pod (see the module doc)


POISSON_EXACT_BELOW = 700.0   # lam past which exp(-lam) nears the float range's end (0.0 past ~745)


def poisson_at_least(lam: float, c: int) -> float:
    """P(X >= c) for X ~ Poisson(lam): the terms' sum below :data:`POISSON_EXACT_BELOW`, the normal
    approximation with continuity correction above it (within 0.01 there, which is all a cost
    needs; the sum from exp(-lam) would start from 0.0 and answer 1 whatever c)."""
    if c <= 0:
        return 1.0
    if lam <= 0 or c > lam + 12.0 * math.sqrt(lam) + 30.0:
        return 0.0   # below 1e-12
    if lam > POISSON_EXACT_BELOW:
        return 0.5 * math.erfc((c - 0.5 - lam) / math.sqrt(2.0 * lam))
    term = math.exp(-lam)
    below = 0.0
    for k in range(c):
        below += term
        term *= lam / (k + 1)
    return max(0.0, 1.0 - below)


def protectable(cls: PodClass) -> bool:
    """Whether the capability pressure protects a class's places: whole-GPU classes (their
    capable set can be a few big nodes), and shares limited to GPU models (their capable set is
    the nodes of those models with the host room for them). A share that may use any card fits
    almost anywhere; the stranding term keeps host room for it."""
    return bool(cls.gpus) or (cls.is_gpu and bool(cls.models))


@dataclass(frozen=True)
class ProtectedClasses:
    """The classes the capability pressure protects, as arrays over them: table group, cards
    needed (1 for a share), host CPU and memory, the GPU-milli a node's ability to host one is
    worth, and for a share its card memory and compute (-1 for a whole-GPU class)."""

    group: np.ndarray
    need: np.ndarray
    cpu: np.ndarray
    mem: np.ndarray
    value: np.ndarray
    share_mem: np.ndarray
    share_core: np.ndarray

    @classmethod
    def of(cls, rows: Sequence[tuple[int, int, float, float, float, int, int]]) -> "ProtectedClasses":
        cols = list(zip(*rows)) if rows else [()] * 7
        types = (np.int64, np.int64, np.float64, np.float64, np.float64, np.int64, np.int64)
        return cls(*[np.array(c, t) for c, t in zip(cols, types)])

    @property
    def shares(self) -> np.ndarray:
        """[C] whether each protected class is a share."""
        return self.share_mem >= 0


def next_rebuild(seen: int) -> int:
    """The learned table's next rebuild point after ``seen`` pods: 1, 2, 4, ... 256, then every
    128 (256 + 128 k), the first one above ``seen``."""
    if seen < 256:
        point = 1
        while point <= seen:
            point *= 2
        return point
    return 256 + 128 * ((seen - 256) // 128 + 1)


class StowageFragPlacer(FragPlacerBase):
    """Fragmentation + host-resource stranding + churn mode (see the module doc)."""

    name = "stowage-frag"
    host_memory = True
    strand_weight = STRAND_WEIGHT
    pressure_weight = PRESSURE_WEIGHT
    saturated_cost = SATURATED_COST
    capability_weight = CAPABILITY_WEIGHT
    scarcity_now = True     # capability pressure also from the nodes that can host a class now

    def __init__(self) -> None:
        self._version = 0
        self._churn = False                     # churn mode on (GPU pods have left the cluster)
        self._release_count: Callable[[], int] | None = None
        self._release_base = 0
        super().__init__()
        self.seen = 0
        self._next = 1
        self.whole_milli = 0.0  # GPU-milli of the whole-GPU pods seen; CPU and host memory of all GPU pods
        self.gpu_cpu = 0.0
        self.gpu_mem = 0.0
        # Share pods seen, as (compute milli, card memory, weight): how many milli-cards a share
        # is depends on the card it lands on (10 GiB is 1/8 of an 80 GiB card, 5/12 of a 24 GiB
        # one), so it is converted per card size when needed, incrementally (see gpu_milli_on).
        # One entry per pod (weight 1) until MAX_SHARES_KEPT, then compacted (_compact_shares).
        self._share_core = array("q")
        self._share_mem = array("q")
        self._share_w = array("d")
        self.shares_seen = 0
        self._milli_on: dict[float, tuple[int, float]] = {}
        # GPU demand seen, [whole-GPU milli, share compute milli, share card memory]: of all GPU
        # pods, and per list of allowed models (see model_pressure).
        self.gpu_demand = [0.0, 0.0, 0.0]
        self.model_demand: dict[tuple[str, ...], list[float]] = {}
        self._pressure: np.ndarray | None = None
        # The names _pressure's ids stood for when computed or last renumbered, the bound
        # table's renumbering epoch then, and the ids whose names it never saw (None: none).
        self._pressure_names: list[str] = []
        self._pressure_epoch = 0
        self._pressure_unseen: np.ndarray | None = None
        # Capability pressure (see capability_pressure): the protected classes and what a
        # node's ability to host each is worth; None until computed for the current table.
        self._capability: ProtectedClasses | None = None
        self._cap_basis: tuple[list, list[float]] = ([], [0.0, 0.0, 0.0])

    # ------------------------------------------------------------------ churn mode
    @property
    def version(self) -> int:  # type: ignore[override]
        """Changes whenever learned state changes scores. Reading it first checks for churn, so
        a row cache (which reads the version before trusting cached scores) drops its scores
        the moment a release is known, whichever rows it was about to score."""
        self._poll_churn()
        return self._version

    @version.setter
    def version(self, value: int) -> None:
        self._version = value

    @property
    def churn(self) -> bool:
        """Whether churn mode is on (checks the release count first)."""
        self._poll_churn()
        return self._churn

    def watch_releases(self, count: Callable[[], int]) -> None:
        """Read the cluster's count of GPU pods released (never decreasing, cheap to read:
        ``ClusterModel.gpu_releases``) before every score, card choice and version read; churn
        mode switches on once it moves past its value now. A cluster-wide counter, not the
        rows being scored: the row cache asks for a subset of rows, and a bind elsewhere can
        hide a release in any per-row or total pod count."""
        self._release_count = count
        self._release_base = count()

    def note_release(self) -> None:
        """A GPU pod left (for callers without a model counter to watch)."""
        self._set_churn()

    def _poll_churn(self) -> None:
        if not self._churn and self._release_count is not None and self._release_count() > self._release_base:
            self._set_churn()

    def _set_churn(self) -> None:
        if not self._churn:
            self._churn = True
            self._version += 1

    def churn_cost(self, a: CardArrays, req: GpuRequest, idx: np.ndarray) -> np.ndarray | float:
        """[n] cost of placing ``req`` on nodes ``idx``: CHURN_COST on a node with no GPU pod, in
        churn mode and for GPU pods only (a CPU-only pod does not keep a node's GPUs busy)."""
        if not self._churn or not req.is_gpu:
            return 0.0
        return np.where((a.pods[idx] > 0).any(axis=1), 0.0, CHURN_COST)

    # ------------------------------------------------------------------ learning
    def observe(self, req: GpuRequest, models: Sequence[str] = (), count: int = 1) -> None:
        """Learn the workload: class counts (with the GPU models each class may use) and host
        resources per GPU-milli. The typical-pod table is rebuilt at 1, 2, 4, ... 256 pods, then
        every 128 pods (a full recompute); ``count`` pods of one shape at once cross at most one
        such point, and the next is the schedule's next (:func:`next_rebuild`), so an extender
        that learned its predecessor's departed pods in bulk rebuilds at the same counts as the
        predecessor did."""
        if count < 1:
            return
        allowed = model_list(models)
        self.workload.add(PodClass.of(req, allowed, host_memory=self.host_memory), float(count))
        if req.is_gpu and allowed and not self.model_demand:
            # The first pod limited to GPU models switches the model pressure on (pressure_cost
            # is 0 while no list was seen): every score may move, so cached scores must go.
            self.version += 1
        if req.is_gpu:
            for acc in (self.gpu_demand, self._model_acc(allowed) if allowed else None):
                if acc is None:
                    continue
                if req.is_whole:
                    acc[0] += req.gpus * MILLI * count
                else:
                    acc[1] += req.core_milli * count
                    acc[2] += req.mem_mib * count
            key = self._strand_key()
            if req.is_whole:
                self.whole_milli += req.gpus * MILLI * count
            else:
                self._share_core.append(req.core_milli)
                self._share_mem.append(req.mem_mib)
                self._share_w.append(float(count))
                self.shares_seen += count
                if len(self._share_core) > MAX_SHARES_KEPT:
                    self._compact_shares()
            self.gpu_cpu += req.cpu_milli * count
            self.gpu_mem += req.host_mem_mib * count
            if self._strand_key() != key:  # the stranded term's ratios moved: scores change
                self.version += 1
        self.seen += count
        if self.seen >= self._next:
            self._rebuild()
            self._next = next_rebuild(self.seen)

    def _model_acc(self, allowed: tuple[str, ...]) -> list[float] | None:
        """The demand accumulator of a model list. Bounded like the learned classes (a model
        name is whatever a pod's author wrote): past ``MAX_MODEL_LISTS`` lists, a new one is
        counted in the kept list with the most names in common, or not at all if none shares a
        name (its pods still count in the total demand)."""
        acc = self.model_demand.get(allowed)
        if acc is None and len(self.model_demand) < MAX_MODEL_LISTS:
            acc = self.model_demand[allowed] = [0.0, 0.0, 0.0]
        if acc is not None:
            return acc
        names = set(allowed)
        best = max(self.model_demand, key=lambda kept: len(names.intersection(kept)))
        return self.model_demand[best] if names.intersection(best) else None

    def _strand_key(self) -> tuple | None:
        """The learned values :meth:`stranded` depends on. Pods with no host CPU/memory (as in
        the extender, where kube-scheduler checks those) make the term 0 whatever the GPU
        figures, so they leave the key constant and do not invalidate cached scores."""
        if self.gpu_cpu <= 0 and self.gpu_mem <= 0:
            return None
        return (self.gpu_cpu, self.gpu_mem, self.whole_milli, self.shares_seen)

    def gpu_milli_on(self, card_mem_mib: float) -> float:
        """Milli-cards the GPU pods seen so far would take on cards of ``card_mem_mib``.

        A share pod counts max(compute, memory / card memory) of one card (at most the card);
        on the trace's 1000-unit cards that is its ``gpu_milli``. Kept per card size and
        brought up to date with only the pods seen since the last call."""
        n, total = self._milli_on.get(card_mem_mib, (0, 0.0))
        if n < len(self._share_core):
            core = np.asarray(self._share_core[n:], np.float64)
            mem = np.asarray(self._share_mem[n:], np.float64)
            w = np.asarray(self._share_w[n:], np.float64)   # 1.0 per pod until compacted: exact
            total += float((np.minimum(MILLI, np.maximum(core, mem * MILLI / max(card_mem_mib, 1.0))) * w).sum())
            self._milli_on[card_mem_mib] = (len(self._share_core), total)
        return self.whole_milli + total

    def _compact_shares(self) -> None:
        """Keep the shares seen in bounded memory: one entry per distinct (compute, memory)
        with its count as weight, every card size's total brought up to date first. Where the
        distinct shapes alone exceed half of MAX_SHARES_KEPT (only pods written to be unlike
        each other do that) the memory is rounded to ever coarser steps until they do not: a
        small error in the stranding term's ratios, for pods that asked for it."""
        self._sync_share_caches()
        core = np.asarray(self._share_core, np.int64)
        mem = np.asarray(self._share_mem, np.int64)
        w = np.asarray(self._share_w, np.float64)
        step = 1
        while True:
            q = ((mem + step // 2) // step) * step     # nearest step: no bias
            keys, inv = np.unique(np.stack([core, q], axis=1), axis=0, return_inverse=True)
            if len(keys) <= MAX_SHARES_KEPT // 2:
                break
            step *= 2
        weights = np.bincount(inv.ravel(), weights=w, minlength=len(keys))
        self._share_core = array("q", keys[:, 0].tolist())
        self._share_mem = array("q", keys[:, 1].tolist())
        self._share_w = array("d", weights.tolist())
        self._rebase_share_caches(len(self._share_core))

    def _sync_share_caches(self) -> None:
        """Bring every per-card-size total over the shares seen up to date (before compaction)."""
        for card in list(self._milli_on):
            self.gpu_milli_on(card)

    def _rebase_share_caches(self, entries: int) -> None:
        """After compaction: every cached total covers all ``entries`` kept."""
        self._milli_on = {card: (entries, total) for card, (_, total) in self._milli_on.items()}

    def stranded(self, idle: np.ndarray, cpu: np.ndarray, hmem: np.ndarray,
                 card_mem_mib: np.ndarray | float = MILLI) -> np.ndarray:
        """Idle GPU-milli a node's CPU/memory left could not feed, at the mean CPU and memory per
        milli-card of the GPU pods seen, their shares counted on the node's own card size."""
        shape = np.shape(idle)
        if self._strand_key() is None:
            return np.zeros(shape)
        card = np.asarray(card_mem_mib, np.float64)
        first = float(card.flat[0]) if card.size else float(MILLI)
        if card.ndim == 0 or (card == first).all():          # one card size (the trace): scalar ratios
            milli = self.gpu_milli_on(first)
            if milli <= 0:
                return np.zeros(shape)
            feed = np.minimum(cpu / max(self.gpu_cpu / milli, 1e-9), hmem / max(self.gpu_mem / milli, 1e-9))
            return np.maximum(idle - np.maximum(feed, 0), 0)
        sizes, inv = np.unique(np.broadcast_to(card, shape), return_inverse=True)
        milli = np.array([self.gpu_milli_on(float(c)) for c in sizes])[inv.reshape(shape)]
        with np.errstate(invalid="ignore", divide="ignore"):
            # Ratios are >= 1e-9, so feed is finite or +inf (host resources not modelled): never NaN.
            feed = np.minimum(cpu / np.maximum(self.gpu_cpu / milli, 1e-9),
                              hmem / np.maximum(self.gpu_mem / milli, 1e-9))
        feed = np.where(milli > 0, feed, np.inf)
        return np.maximum(idle - np.maximum(feed, 0), 0)

    # ------------------------------------------------------------------ model pressure
    def _learned_state(self, copy: bool) -> tuple:
        # With the demand per GPU kind as of the rebuild point (the capability pressure's basis).
        return super()._learned_state(copy), list(self.gpu_demand)

    def _build(self, state: tuple) -> None:
        workload, demand = state
        super()._build(workload)
        self._pressure = None       # the demand shares moved: recompute with the new table
        self._capability = None
        # What the capability pressure is computed from, as of this table: it is computed at
        # the first score after the rebuild, and a host that skips scoring (the row cache)
        # must get the same values as one that scores every pod.
        self._cap_basis = ([(c, n) for c, n in workload.counts.items() if protectable(c)], demand)

    def bind_models(self, models: Sequence[str]) -> None:
        super().bind_models(models)
        self._pressure = None
        self._capability = None

    def model_pressure(self, a: CardArrays) -> np.ndarray:
        """[model ids] the share of a card of each GPU model that pods limited to a list of
        models holding it will want, learned online (see the module doc): for every list S
        seen, q_S (its share of the GPU demand seen) times all cards over S's cards, summed
        over the lists a model is on, at most 1. All zeros while no pod has been limited to
        models. Computed once per learned table (kept until the table is rebuilt, so a score
        stays a function of the node's row and :attr:`version`)."""
        if self._pressure is not None:
            if models_epoch(self._models) != self._pressure_epoch:
                self._renumber_pressure()
            if (len(self._pressure) > int(a.model.max(initial=0))
                    and (self._pressure_unseen is None or not self._pressure_unseen[a.model].any())):
                return self._pressure
            self.version += 1   # a model the table did not know: the pressures move
        nids = int(a.model.max(initial=0)) + 1
        names = list(self._models) + ["UNKNOWN"] * max(0, nids - len(self._models))
        self._pressure_names, self._pressure_epoch = names, models_epoch(self._models)
        self._pressure_unseen = None
        rho = np.zeros(max(nids, len(names)))
        valid = a.exists & a.healthy
        if self.model_demand and valid.any():
            supply = np.bincount(a.model[valid], minlength=len(rho)).astype(np.float64)
            card = float(np.median(a.mem_total[valid]))
            total = self._demand_milli(self.gpu_demand, card)
            for allowed, acc in self.model_demand.items():
                on = np.array([any(model_matches(p, m) for p in allowed) for m in names], bool)
                if total > 0 and supply[on].sum() > 0:
                    rho[on] += self._demand_milli(acc, card) / total * supply.sum() / supply[on].sum()
        self._pressure = np.minimum(rho, 1.0)
        return self._pressure

    def _renumber_pressure(self) -> None:
        """The model table was renumbered (``ClusterModel.compact_models``): carry each name's
        pressure over to its new id, so scores stay what they were. A name the pressures never
        saw (it came after they were computed) is marked, and recomputes them once on a card,
        as its new id beyond the old table did."""
        by_name = dict(zip(self._pressure_names, self._pressure.tolist()))
        names = list(self._models)
        self._pressure = np.array([by_name.get(n, 0.0) for n in names], np.float64)
        unseen = np.array([n not in by_name for n in names], bool)
        self._pressure_unseen = unseen if unseen.any() else None
        self._pressure_names, self._pressure_epoch = names, models_epoch(self._models)

    def model_cost(self, a: CardArrays) -> np.ndarray:
        """[model ids] the cost per GPU-milli a pod pays on a card of each model: its pressure
        ``rho``, or :attr:`saturated_cost` where the limited pods want every card of it
        (``rho`` reached 1; see "Saturated models" in the module doc)."""
        rho = self.model_pressure(a)
        return np.where(rho >= 1.0 - 1e-9, self.saturated_cost, rho)

    def _demand_milli(self, acc: list[float], card: float) -> float:
        """GPU-milli of a demand accumulator ([whole milli, share compute, share memory]) on
        cards of ``card`` MiB."""
        return acc[0] + max(acc[1], acc[2] * MILLI / max(card, 1.0))

    def capability_pressure(self, a: CardArrays) -> "ProtectedClasses | None":
        """The classes of the learned table that only part of the cluster can host (whole-GPU
        classes, and shares limited to GPU models: :func:`protectable`), and what a node's
        ability to host each is worth (see the module doc, "Capability pressure"), or None when
        there is none. A class's capable set S is the nodes that could host it if they were
        empty (enough cards of an allowed model and size, enough allocatable CPU and host
        memory); with q its share of the GPU demand seen (GPU-milli), its scarcity is
        ``r = min(1, q * (K_all - K_S) / K_S)`` (cards), the demand it puts on S beyond what a
        class that may use every card would: 0 for a class every node can host. The value is
        ``r * m``, m the GPU-milli of the class's pod (cards * 1000, or a share's milli on the
        cluster's typical card), weighted by its scarcity.
        ``r`` is at least ``P(X >= c)`` (:attr:`scarcity_now`), c the class's places on the
        nodes as they are and X ~ Poisson(q * idle GPU-milli / m) its pods to come until the
        idle GPU is used up.
        Computed once per learned table (a score stays a function of the node's row and
        :attr:`version`)."""
        if self._capability is not None:
            return self._capability if len(self._capability.group) else None
        self._capability = ProtectedClasses.of([])
        t, ix = self.table, self.index
        n = a.shape[0]
        valid = a.exists & a.healthy & a.node_ok[:, None]
        k_all = float(valid.sum())
        classes, demand = self._cap_basis
        if t is None or ix is None or k_all <= 0 or demand[0] + demand[1] + demand[2] <= 0:
            return None
        card = float(np.median(a.mem_total[valid]))
        total = self._demand_milli(demand, card)
        cpu_cap = a.cpu_total if len(a.cpu_total) == n else np.full(n, np.inf)
        mem_cap = a.hmem_total if len(a.hmem_total) == n else np.full(n, np.inf)
        allowed = ix.allowed(a)                                                   # [G, M]
        gidx = {key: g for g, key in enumerate(t.keys)}
        out: list[tuple[int, int, float, float, float, int, int]] = []
        # Every protectable class seen, not only the typical ones: a class can be rare by count
        # (0.1 % of the pods) and still want most of the few nodes that can host it. Its fit
        # is read from the table group of its GPU shape (cards or share, models, card size),
        # which a typical class of the same shape provides; the host CPU and memory are its own.
        node_ok = a.node_ok if len(a.node_ok) == n else np.ones(n, bool)
        idle = float(ix.idle[node_ok].sum())        # GPU-milli the cluster can still place
        for cls, count in classes:
            g = gidx.get((cls.gpus, cls.mem_mib, cls.core_milli, cls.models, cls.min_card_mem_mib))
            if g is None:
                continue
            need = max(cls.gpus, 1)
            milli = cls.gpus * MILLI if cls.gpus else cls.share_milli(card)   # GPU-milli of one pod
            if milli <= 0:
                continue
            ok = (valid & allowed[g][a.model] & (a.mem_total >= cls.min_card_mem_mib)
                  & (a.mem_total >= cls.mem_mib))                                                  # [N, K]
            capable = (row_count(ok) >= need) & (cpu_cap >= cls.cpu_milli) & (mem_cap >= cls.host_mem_mib)
            k_s = float(ok[capable].sum())
            if k_s <= 0:
                continue   # no node can ever host it: nothing to protect
            q = count * milli / max(total, 1.0)
            r = min(1.0, q * (k_all - k_s) / k_s)
            if r > 0 and self.scarcity_now:
                # Scarcity now: how many of the class's pods the nodes could host as they are
                # (c), and how many of them to expect until the idle GPU is used up at the demand
                # mix seen (Poisson, mean lam). The c-th place is needed when at least c come:
                # a place is worth at least P(X >= c) of the class's pod. (A share's places are
                # counted one per card that can hold it.)
                # (floor of a division: host resources not modelled are +inf, and inf // x is NaN;
                # the card count is always finite)
                places = np.minimum(ix.cnt[g] // need,
                                    np.floor(np.minimum(a.cpu_free / max(cls.cpu_milli, 1),
                                                        a.hmem_free / max(cls.host_mem_mib, 1))))
                c = int(np.clip(places[node_ok], 0, None).sum())
                lam = q * idle / milli
                r = max(r, poisson_at_least(lam, c))
            if r * milli >= 1.0:   # worth at least one GPU-milli (the unit of F)
                share = not cls.gpus
                out.append((g, need, float(cls.cpu_milli), float(cls.host_mem_mib), r * milli,
                            cls.mem_mib if share else -1, cls.core_milli if share else -1))
        self._capability = ProtectedClasses.of(out)
        return self._capability if out else None

    def capability_cost(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray | None,
                        rows: np.ndarray | None, kk: np.ndarray | None) -> np.ndarray | float:
        """The value of the protected classes (:meth:`capability_pressure`) that the node could
        host before the pod and no longer could after it: per node for whole-GPU and CPU-only
        pods, per (node, card) pair for a share. O(protected classes x cards) per node."""
        cap = self.capability_pressure(a)
        if cap is None:
            return 0.0
        grp, need, cpu_c, mem_c, value = cap.group, cap.need, cap.cpu, cap.mem, cap.value
        ix = self.index
        cnt0 = ix.cnt[np.ix_(grp, idx)]                                                  # [C, n]
        cpu0, mem0 = a.cpu_free[idx], a.hmem_free[idx]
        host0 = (cpu0[None] >= cpu_c[:, None]) & (mem0[None] >= mem_c[:, None])
        fit0 = (cnt0 >= need[:, None]) & host0
        host1 = ((cpu0 - req.cpu_milli)[None] >= cpu_c[:, None]) & ((mem0 - req.host_mem_mib)[None] >= mem_c[:, None])
        if rows is None:
            if req.is_whole:
                u = usable[idx] if usable is not None else (a.exists[idx] & a.healthy[idx] & (a.pods[idx] == 0))
                take = u & (np.cumsum(u, axis=1) <= req.gpus)                        # first usable cards
                # Cards taken that fit each class, as integers: over booleans einsum's sum is
                # an "any" (an 8-GPU pod took one card from the count, not eight).
                cnt1 = cnt0 - np.einsum("cnk,nk->cn", ix.fits[np.ix_(grp, idx)], take.astype(np.int64))
            else:
                cnt1 = cnt0
            lost = fit0 & ~((cnt1 >= need[:, None]) & host1)
            return value @ lost
        ii = idx[rows]
        # The card the share lands on no longer counts for a protected class: a whole-GPU class
        # needs it free; a protected share only if what is left on it is too little for one.
        gone = ix.fits[grp[:, None], ii[None], kk[None]]                                  # [C, P]
        s = cap.shares
        if s.any():
            still = ((a.mem_free[ii, kk] - req.mem_mib)[None] >= cap.share_mem[s][:, None]) & \
                    ((a.core_free[ii, kk] - req.core_milli)[None] >= cap.share_core[s][:, None])
            gone[s] &= ~still
        cnt1 = cnt0[:, rows] - gone
        lost = fit0[:, rows] & ~((cnt1 >= need[:, None]) & host1[:, rows])
        return value @ lost

    def pressure_cost(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray | None,
                      rows: np.ndarray | None, kk: np.ndarray | None) -> np.ndarray | float:
        """GPU-milli the pod takes times the cost per GPU-milli of the cards' model
        (:meth:`model_cost`): per node for a whole-GPU pod (its usable cards' mean cost), per
        (node, card) pair for a share."""
        if not req.is_gpu or not self.model_demand:
            return 0.0
        rho = self.model_cost(a)
        if not rho.any():
            return 0.0
        if rows is None:
            u = usable[idx] if usable is not None else (a.exists[idx] & a.healthy[idx])
            mean = (u * rho[a.model[idx]]).sum(axis=1) / np.maximum(u.sum(axis=1), 1)
            return req.gpus * MILLI * mean
        ii = idx[rows]
        ix = self.index
        taken = ix.left[ii, kk] - ix.left_after_share(a, ii, kk, req)
        return np.maximum(taken, 0) * rho[a.model[ii, kk]]

    def _pair_scores(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray,
                     pairs: tuple[np.ndarray, np.ndarray] | None = None):
        """(score, rows, cards) of a share per usable (node, card) pair (``pairs``: only those,
        see :meth:`frag_after`), or (score per node, None, None) for other pods: the
        fragmentation and stranding score less the model pressure cost."""
        s, rows, kk = self._base_scores(a, req, idx, usable, pairs)
        cost = self.pressure_cost(a, req, idx, usable, rows, kk)
        s = s - self.pressure_weight * cost if np.ndim(cost) else s
        lost = self.capability_cost(a, req, idx, usable, rows, kk)
        return (s - self.capability_weight * lost if np.ndim(lost) else s), rows, kk

    def _base_scores(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray,
                     pairs: tuple[np.ndarray, np.ndarray] | None = None):
        before, after, rows, kk = self.frag_after(a, req, idx, usable, pairs)
        ix = self.index
        n = len(idx)
        if self._strand_key() is None:
            # No host resources learned (the extender: kube-scheduler checks CPU and memory):
            # nothing is stranded, st0 = st1 = 0 as stranded() would return.
            st0 = np.zeros(n)
            if rows is None:
                return before - after - self.strand_weight * (st0 - st0), None, None
            return before[rows] - after - self.strand_weight * (np.zeros(len(rows)) - st0[rows]), rows, kk
        cpu0, mem0 = a.cpu_free[idx], a.hmem_free[idx]
        cpu1, mem1 = cpu0 - req.cpu_milli, mem0 - req.host_mem_mib
        card = a.mem_total[idx].max(axis=1)          # the node's card size (MiB; 1000 in the trace)
        st0 = self.stranded(ix.idle[idx], cpu0, mem0, card)
        if rows is None:
            idle1 = ix.idle[idx] - (req.gpus * MILLI if req.is_whole else 0)
            st1 = self.stranded(idle1, cpu1, mem1, card)
            return before - after - self.strand_weight * (st1 - st0), None, None
        ii = idx[rows]
        idle1 = ix.idle[ii] - ix.left[ii, kk] + ix.left_after_share(a, ii, kk, req)
        st1 = self.stranded(idle1, cpu1[rows], mem1[rows], card[rows])
        return before[rows] - after - self.strand_weight * (st1 - st0[rows]), rows, kk

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        self._poll_churn()
        s, rows, kk = self._pair_scores(a, req, idx, usable)
        s = s if rows is None else segment_max(s, rows, len(idx))
        return s - self.churn_cost(a, req, idx)

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        # The churn cost is the same for every card of the node: it never changes the card.
        self._poll_churn()
        if req.is_whole:
            # Which free cards a whole-GPU pod takes does not change the node's fragmentation
            # (free cards are interchangeable for it), so NVLink/NUMA locality and the card
            # policy decide, as for every placer (on the trace, without topology: the lowest).
            return choose_whole_cards(a, i, req.gpus, np.flatnonzero(usable_row), policy)
        if not req.is_shared:
            return first_free_cards(a, i, req, usable_row)
        if policy.card == SPREAD:  # the pod asked for the emptiest card (stowage.io/card-policy)
            return choose_cards_default(a, i, req, usable_row, policy)
        # The node's usable cards as pairs, a card identical to the one before it left out: it
        # would score the same, and argmax takes the first of equal scores anyway.
        kk = np.flatnonzero(usable_row)
        if len(kk) > 1:
            dup = same_as_previous_card(a, np.full(len(kk), i), kk)
            if dup.any():
                kk = kk[np.concatenate(([True], ~dup))]
        s, rows, kk = self._pair_scores(a, req, np.array([i]), None, (np.zeros(len(kk), np.int64), kk))
        return [int(kk[int(np.argmax(s))])] if len(kk) else []
