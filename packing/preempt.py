"""Card-aware preemption: which of kube-scheduler's proposed victims must go for a pod to fit.

kube-scheduler's DefaultPreemption picks victims with its own filters only: it counts
``nvidia.com/gpu-memory`` node-wide and knows nothing of cards, models, card sizes or NVLink. So
it can propose evicting pods on a node where, afterwards, no single card has the slice the
preemptor needs, or whose cards are the wrong model. It then asks the extender's ``preempt`` verb
(``ProcessPreemption``) about each candidate node and its proposed victims; this module answers
for one node, as a what-if on a copy of that node's :class:`~packing.model.CardArrays` row:

1. give back the cards of every proposed victim (:func:`packing.model.book`, sign -1) and ask
   :func:`packing.decide.feasible` whether the preemptor fits then: if not, no subset helps and
   the node is dropped;
2. otherwise search the smallest subset that still lets it fit — fewest pods, then the lowest
   highest priority, then the lowest priority sum — never a pod the scheduler did not propose.

Two rules keep the answer one kube-scheduler can act on:

- a victim that holds no cards (a CPU-only pod, or one Stowage does not know) was proposed for
  something the cards cannot show (CPU, host memory, pod count, affinity): it is always kept;
- the subset must still free what kube-scheduler's own node-wide count needs
  (:class:`Counts`: whole cards, share memory and compute, as the device plugin advertises
  them). Otherwise the scheduler's NodeResourcesFit would still reject the preemptor after the
  evictions and it would preempt again.

Higher-or-equal-priority pods nominated to the node (:class:`Nominee`) are booked on each trial
copy once the victims are gone (:func:`reserve`): kube-scheduler accounts them the same way in
its dry run, and the extender's filter holds their cards against lower-priority pods.

Pure: no I/O, no caches. The search is bounded (``budget`` fits per node, then a greedy pass).
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Iterable, Sequence

from stowage.resources import CORE_MILLI_PER_CARD, GpuRequest

from .decide import feasible
from .model import AllocatableGpu, CardArrays, ClusterModel, Counts, PodAllocation, book, book_request, request_counts
from .placer import choose_cards_default
from .pod_policy import PodPolicy

DEFAULT_BUDGET = 128  # subset fits tried per node before the greedy pass (~0.25 ms each)


@dataclass(frozen=True)
class Holder:
    """A pod on the node: what it holds there (``cards`` empty: nothing Stowage knows of), its
    priority (``spec.priority``; 0 when unknown, as for a pod without a PriorityClass) and what
    kube-scheduler counts it as asking (``kube``; None: unknown, counted from its cards)."""

    uid: str
    name: str = ""
    priority: int = 0
    cards: tuple[int, ...] = ()
    mem_mib: tuple[int, ...] = ()
    core_milli: tuple[int, ...] = ()
    whole: bool = False
    cpu_milli: int = 0
    host_mem_mib: int = 0
    kube: Counts | None = None

    @property
    def holds_cards(self) -> bool:
        return bool(self.cards)

    def counts(self) -> Counts:
        """What this pod takes in kube-scheduler's count: what it asks (``kube``), also when it
        holds no card in the model (another scheduler's GPU pod); unknown, what its cards say: a
        whole-GPU pod its cards, a share its memory and compute."""
        if self.kube is not None:
            return self.kube
        if not self.cards:
            return Counts()
        if self.whole:
            return Counts(gpus=len(self.cards))
        return Counts(mem_mib=int(sum(self.mem_mib)), core_milli=int(sum(self.core_milli)))


@dataclass(frozen=True)
class Nominee:
    """A pending pod kube-scheduler nominated to a node (``status.nominatedNodeName``) after it
    preempted for it: its cards are held for it there against pods of lower priority."""

    uid: str
    name: str
    priority: int
    req: GpuRequest
    policy: PodPolicy


@dataclass(frozen=True)
class Verdict:
    """The answer for one node: ``victims`` (uids, a subset of those proposed, in the order
    proposed) or None when evicting them would not let the pod fit; ``why`` in words."""

    victims: tuple[str, ...] | None
    why: str
    tried: int = 0

    @property
    def kept(self) -> bool:
        return self.victims is not None


def scheduler_free(a: CardArrays, i: int, on_node: Iterable[Holder],
                   stated: AllocatableGpu = AllocatableGpu()) -> Counts:
    """What kube-scheduler's count says is free on node i, as its NodeResourcesFit has it: the
    node's ``status.allocatable`` (``stated``) less what every pod bound there asks (``on_node``:
    all of them, those that hold no card in the model too). A resource the node does not state
    falls back on an estimate: the healthy cards' totals, what Stowage's device plugin advertises
    (kube-scheduler reads a missing one as 0 and proposes no victims there for a pod asking it,
    so the estimate only answers hand-made and simulated nodes). It is not the count where the
    device plugin advertises fewer, or a card just went unhealthy and the kubelet has not yet
    lowered allocatable."""
    healthy = a.exists[i] & a.healthy[i]
    n = int(healthy.sum())
    total = Counts(gpus=n if stated.gpus is None else stated.gpus,
                   mem_mib=int(a.mem_total[i][healthy].sum()) if stated.mem_mib is None else stated.mem_mib,
                   core_milli=n * CORE_MILLI_PER_CARD if stated.core_milli is None else stated.core_milli)
    used = Counts()
    for h in on_node:
        used = used + h.counts()
    return total - used


def row_copy(a: CardArrays, i: int) -> CardArrays:
    """Node i alone as a 1-node :class:`CardArrays` that may be changed (a deep copy)."""
    return CardArrays(**{f.name: getattr(a, f.name)[i:i + 1].copy() for f in dataclasses.fields(CardArrays)})


def give_back(row: CardArrays, holders: Iterable[Holder]) -> None:
    """Release the holders' cards on the 1-node ``row`` (what their eviction would free)."""
    for h in holders:
        if h.cards:
            book(row, 0, h.cards, h.mem_mib, h.core_milli, h.cpu_milli, h.host_mem_mib, sign=-1)


def fits(row: CardArrays, models: Sequence[str], req: GpuRequest, policy: PodPolicy) -> bool:
    """Whether the pod fits on the 1-node ``row`` now (step 1 of :mod:`packing.decide`)."""
    return bool(feasible(row, models, req, policy)[1].ok[0])


def reserve(row: CardArrays, models: Sequence[str], nominees: Iterable[Nominee]) -> list[str]:
    """Book the nominees on the 1-node ``row``, highest priority first, each on the cards the
    default card choice would give it; a nominee that does not fit is skipped (it cannot be
    placed there either). Returns the uids booked."""
    booked = []
    for nom in sorted(nominees, key=lambda n: (-n.priority, n.uid)):
        _, f = feasible(row, models, nom.req, nom.policy)
        if not f.ok[0]:
            continue
        cards = choose_cards_default(row, 0, nom.req, f.usable[0], nom.policy)
        book_request(row, 0, cards, nom.req)
        booked.append(nom.uid)
    return booked


def choose_victims(row: CardArrays, models: Sequence[str], req: GpuRequest, policy: PodPolicy,
                   proposed: Sequence[Holder], sched_free: Counts, nominees: Sequence[Nominee] = (), *,
                   budget: int = DEFAULT_BUDGET) -> Verdict:
    """The smallest subset of ``proposed`` whose eviction lets the pod fit on the 1-node ``row``
    (not changed), after the ``nominees`` (higher or equal priority, nominated to this node) took
    their cards from what is free then. ``sched_free``: kube-scheduler's count of what is free
    on the node now, nominees counted (:func:`scheduler_free`)."""
    if not proposed:
        return Verdict(None, "no victims proposed")
    order = {h.uid: j for j, h in enumerate(proposed)}
    fixed = [h for h in proposed if not h.holds_cards]   # proposed for what the cards cannot show
    gpu = sorted((h for h in proposed if h.holds_cards), key=lambda h: (h.priority, order[h.uid]))
    # The victims kept whatever the cards say are evicted too: what they ask is freed in the count.
    fixed_free = Counts()
    for h in fixed:
        fixed_free = fixed_free + h.counts()
    need = (request_counts(req) - sched_free - fixed_free).at_least_zero()

    def ok(chosen: Sequence[Holder]) -> bool:
        freed = Counts()
        for h in chosen:
            freed = freed + h.counts()
        if not freed.covers(need):
            return False
        trial = row_copy(row, 0)
        give_back(trial, chosen)
        reserve(trial, models, nominees)
        return fits(trial, models, req, policy)

    def answer(chosen: Iterable[Holder], why: str, tried: int) -> Verdict:
        uids = {h.uid for h in chosen} | {h.uid for h in fixed}
        return Verdict(tuple(h.uid for h in proposed if h.uid in uids), why, tried)

    tried = 1
    if not ok(gpu):
        return Verdict(None, f"evicting all {len(proposed)} proposed pods would not free cards for "
                             f"{req.describe()}", tried)
    if not gpu or ok(()):
        # The cards do not need any of them gone: the scheduler proposed them for something
        # Stowage cannot see, and its judgement stands.
        return answer(gpu, "kept as proposed (the cards need none of them gone)", tried + 1)
    for k in range(1, len(gpu) + 1):
        best: tuple | None = None
        for combo in itertools.combinations(range(len(gpu)), k):
            if tried >= budget:
                return _greedy(gpu, ok, answer, tried)
            chosen = [gpu[j] for j in combo]
            tried += 1
            if ok(chosen):
                prios = [h.priority for h in chosen]
                key = (max(prios), sum(prios), combo)
                if best is None or key < best[0]:
                    best = (key, chosen)
        if best is not None:
            return answer(best[1], f"{k} of {len(gpu)} card holders must go", tried)
    return answer(gpu, "all card holders must go", tried)  # unreachable: ok(gpu) held


def _greedy(gpu: list[Holder], ok, answer, tried: int) -> Verdict:
    """Past the budget: take victims lowest priority first until the pod fits, then put back
    any of them (highest priority first) the pod does not need gone."""
    chosen: list[Holder] = []
    for h in gpu:
        chosen.append(h)
        tried += 1
        if ok(chosen):
            break
    for h in sorted(chosen, key=lambda h: -h.priority):
        rest = [c for c in chosen if c is not h]
        tried += 1
        if rest and ok(rest):
            chosen = rest
    return answer(chosen, f"{len(chosen)} of {len(gpu)} card holders must go (greedy: many candidates)", tried)


def pdb_violations(reported: int, kept: int) -> int:
    """PodDisruptionBudget violations among the victims kept. kube-scheduler reports only a
    count for the set it proposed, not which pods violate; the violators among a subset are at
    most that count and at most the subset's size. The bound is what we report: it never
    understates a violation, so the scheduler never prefers a node for fewer violations than
    it would really cause."""
    return max(0, min(int(reported), int(kept)))


def holder(alloc: PodAllocation, priority: int = 0) -> Holder:
    """A model allocation as a :class:`Holder`."""
    return Holder(uid=alloc.uid, name=alloc.name, priority=int(priority), cards=tuple(alloc.cards),
                  mem_mib=tuple(alloc.mem_mib), core_milli=tuple(alloc.core_milli), whole=alloc.whole,
                  cpu_milli=alloc.cpu_milli, host_mem_mib=alloc.host_mem_mib, kube=alloc.kube_request)


def judge_node(model: ClusterModel, node: str, req: GpuRequest, policy: PodPolicy, victims: Sequence[str],
               priority_of: dict[str, int], nominees: Iterable[Nominee] = (), *,
               budget: int = DEFAULT_BUDGET) -> Verdict:
    """:func:`choose_victims` for the proposed ``victims`` (uids) on ``node`` of the model. A victim
    the model holds no cards for on that node is one that holds none (kept, see the module doc).
    Read-only; the caller holds ``model.lock``."""
    i = model.index.get(node)
    if i is None:
        return Verdict(None, "node unknown to Stowage")
    meta = model.meta.get(node)
    on_node = [model.allocations[u] for u in sorted(meta.pods if meta else ()) if u in model.allocations]
    proposed: list[Holder] = []
    seen: set[str] = set()
    for uid in victims:
        if uid in seen:
            continue
        seen.add(uid)
        alloc = model.allocations.get(uid)
        prio = int(priority_of.get(uid, 0))
        if alloc is not None and alloc.node == node and alloc.applied:
            proposed.append(holder(alloc, prio))
        else:
            proposed.append(Holder(uid=uid, priority=prio))
    nominees = list(nominees)
    sched = scheduler_free(model.a, i, (holder(a) for a in on_node if a.applied),
                           meta.gpu_allocatable if meta is not None else AllocatableGpu())
    for nom in nominees:  # kube-scheduler's dry run counts them on the node too
        sched = sched - request_counts(nom.req)
    return choose_victims(row_copy(model.a, i), model.models, req, policy, proposed, sched, nominees,
                          budget=budget)
