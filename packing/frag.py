"""Fragmentation of GPU nodes with respect to a workload, vectorised and kept up to date incrementally.

The measure is the one of FGD (Weng et al., USENIX ATC '23): given the *typical workload* — pod
classes with their frequencies p_t — a node's fragmentation is the expected amount of its idle
GPU that the next pod could not use::

    F(node) = sum_t p_t * ( small_t(node)  if class t fits on the node now
                            idle(node)     otherwise )

where ``idle`` is all idle GPU-milli on the node and ``small_t`` the idle milli on cards too
small (or of a model not allowed) for class t. A class "fits" when the node has the CPU for it
and enough cards that can hold its per-card share (whole free cards for whole-GPU classes).
CPU-only classes count the whole idle GPU (a CPU pod never uses it).

Rewritten with ``big_t = idle - small_t`` (idle milli on cards that *can* hold class t) this is::

    F = P * idle - sum_g W_g(cpu_free) * [cnt_g >= n_g] * big_g

with classes grouped by their GPU shape g (cards needed n_g, per-card share, allowed models);
``cnt_g``/``big_g`` are per-node card counts/sums and ``W_g(c)`` the total frequency of the
group's classes needing at most ``c`` CPU. That form lets :class:`FragIndex` keep ``cnt``,
``big`` and ``F`` for every node as arrays, recompute only the rows that changed since the last
call (one node per placement), and evaluate "F after placing this pod on card k of node i" for
every candidate at once — which is what makes FGD-style scoring cheap enough for the extender's
per-request budget and for the benchmark's 100k placements.

Card capacity is in milli-cards: a card's idle share is ``min(core_free, 1000*mem_free/mem_total)``.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from stowage.inventory import model_matches
from stowage.resources import CORE_MILLI_PER_CARD, GpuRequest

from .fit import row_any, row_count
from .model import CardArrays, models_epoch
from .placer import PlacerBase

MILLI = CORE_MILLI_PER_CARD


def _features(cls: "PodClass") -> tuple[int, int, int, int, int]:
    """A class's requests, for :meth:`Workload.nearest` (non-negative, compared in log scale)."""
    return (max(cls.mem_mib, 0), max(cls.core_milli, 0), max(cls.cpu_milli, 0), max(cls.host_mem_mib, 0),
            max(cls.min_card_mem_mib, 0))


def model_list(models: Sequence[str]) -> tuple[str, ...]:
    """A pod's allowed GPU models as a class key: sorted, without repeats or blanks, so the
    same list written twice or in another order (``V100M16|V100M32|V100M32``) is one class."""
    return tuple(sorted({m for m in models if m}))


LOOKUP_ABOVE = 64   # FragTable.weight: classes above which W is looked up, not summed
# FragTable's 2-D lookup (groups x CPU thresholds x memory thresholds, float64) holds at most
# this many cells (8 MiB); past it the rarest thresholds are merged (see FragTable). The openb
# traces and variants need at most ~74,000 (56 groups x 33 x 40), so this never engages there.
MAX_TABLE_CELLS = 1 << 20


@dataclass(frozen=True)
class PodClass:
    """The shape of a pod as far as packing is concerned (FGD's "typical pod" key)."""

    cpu_milli: int
    gpus: int = 0          # whole cards
    mem_mib: int = 0       # share of one card (0 for whole-GPU / CPU-only pods)
    core_milli: int = 0
    models: tuple[str, ...] = ()
    host_mem_mib: int = 0  # 0 when the measure ignores host memory (as the paper's FGD does)
    min_card_mem_mib: int = 0  # whole-GPU pods: smallest card (total MiB) they accept

    # Units: ``mem_mib`` is an absolute amount of card memory (MiB in the extender, 1/1000 of a
    # card in the trace), so a class "fits" a card by its real free memory whatever the card's
    # size: a 20 GiB slice fits four times on an 80 GiB card and once on a 24 GiB card.

    @classmethod
    def of(cls, req: GpuRequest, models: Sequence[str] = (), *, host_memory: bool = False) -> "PodClass":
        hm = req.host_mem_mib if host_memory else 0
        if req.is_whole:
            return cls(req.cpu_milli, gpus=req.gpus, models=tuple(models), host_mem_mib=hm,
                       min_card_mem_mib=req.min_card_mem_mib)
        if req.is_shared:
            return cls(req.cpu_milli, mem_mib=req.mem_mib, core_milli=req.core_milli, models=tuple(models),
                       host_mem_mib=hm)
        return cls(req.cpu_milli, host_mem_mib=hm)

    @property
    def is_gpu(self) -> bool:
        return self.gpus > 0 or self.mem_mib > 0 or self.core_milli > 0

    def share_milli(self, card_mem_mib: float = MILLI) -> float:
        """Milli-cards one card of this class takes on a card of ``card_mem_mib``: 1000 for whole
        cards, max(compute, memory share) for a share pod, 0 for CPU-only."""
        if self.gpus:
            return float(MILLI)
        if not self.is_gpu:
            return 0.0
        return float(min(MILLI, max(self.core_milli, self.mem_mib * MILLI / max(card_mem_mib, 1))))

    @property
    def milli_per_gpu(self) -> int:
        """FGD's MilliGpu on a trace card (1000 memory units): only orders equally frequent classes."""
        if self.gpus:
            return MILLI
        return max(self.core_milli, self.mem_mib) if self.is_gpu else 0

    @property
    def gpu_number(self) -> int:
        return self.gpus if self.gpus else (1 if self.is_gpu else 0)

    def sort_key(self) -> tuple:
        """FGD's order of equally frequent classes, then every other field, so that no two
        classes tie: which of two tied classes :meth:`Workload.typical` keeps must not depend on
        which was seen first (a restarted extender learns the departed pods first)."""
        return (self.cpu_milli, self.milli_per_gpu, self.gpu_number, "|".join(self.models), self.host_mem_mib,
                self.min_card_mem_mib, self.mem_mib, self.core_milli, self.models)


MAX_CLASSES = 1024   # distinct pod classes a learned workload keeps (see Workload)


@dataclass
class Workload:
    """Counts of pod classes; :meth:`typical` is FGD's typical-pod list (most frequent first,
    until ``coverage`` of all pods is covered, renormalised).

    Bounded: a pod's class comes from what its author wrote (CPU and memory requests, share
    sizes, model names), so a stream of pods each with a new request would grow the table
    without end, and every rebuild (sorting the classes, the capability pressure's pass over
    them) with it. Past ``max_classes`` distinct classes a new class is counted in the nearest
    one already kept: the same card count, kind (GPU or not) and model list where there is one,
    then the closest requests (log scale). The openb traces and variants have 145-473 classes,
    so nothing is folded there."""

    counts: dict[PodClass, float] = field(default_factory=dict)
    total: float = 0.0
    max_classes: int = MAX_CLASSES
    _kept: tuple | None = field(default=None, repr=False, compare=False)   # the full table's features

    def add(self, cls: PodClass, weight: float = 1.0) -> None:
        if cls not in self.counts and len(self.counts) >= self.max_classes:
            cls = self.nearest(cls)
        self.counts[cls] = self.counts.get(cls, 0.0) + weight
        self.total += weight

    def nearest(self, cls: PodClass) -> PodClass:
        """The kept class a new one is counted in once the table is full (see the class doc)."""
        if self._kept is None or len(self._kept[0]) != len(self.counts):
            keys = list(self.counts)
            model_ids: dict[tuple[str, ...], int] = {}
            self._kept = (keys,
                          np.array([c.gpus for c in keys], np.int64),
                          np.array([c.is_gpu for c in keys], bool),
                          np.array([model_ids.setdefault(c.models, len(model_ids)) for c in keys], np.int64),
                          np.log1p(np.array([_features(c) for c in keys], np.float64)),
                          model_ids)
        keys, gpus, is_gpu, models, feats, model_ids = self._kept
        cost = (np.abs(np.log1p(np.array(_features(cls), np.float64))[None] - feats).sum(axis=1)
                + 1e4 * (models != model_ids.get(cls.models, -1))
                + 1e5 * (is_gpu != cls.is_gpu) + 1e6 * (gpus != cls.gpus))
        return keys[int(np.argmin(cost))]

    def typical(self, coverage: float = 0.95) -> list[tuple[PodClass, float]]:
        if self.total <= 0:
            return []
        ranked = sorted(self.counts.items(), key=lambda kv: (kv[1], kv[0].sort_key()), reverse=True)
        out, cum = [], 0.0
        for cls, n in ranked:
            if cum >= coverage * self.total:
                break
            out.append((cls, n))
            cum += n
        return [(cls, n / cum) for cls, n in out]


@dataclass(frozen=True)
class TableBound:
    """What :class:`FragTable`'s cell budget merged: the 2-D lookup's thresholds per axis
    before and after, and its cells wanted (groups x (CPU+1) x (memory+1)) and kept."""

    cells_wanted: int
    cells: int
    cpu: tuple[int, int]     # (distinct CPU requests, thresholds kept)
    mem: tuple[int, int]     # (distinct host-memory requests, thresholds kept)

    def describe(self) -> str:
        return (f"the fragmentation table would need {self.cells_wanted:,} cells "
                f"({self.cpu[0]} distinct CPU x {self.mem[0]} distinct host-memory requests of GPU pod classes); "
                f"kept {self.cells:,} by merging the rarest into the next larger kept one "
                f"({self.cpu[1]} CPU and {self.mem[1]} memory thresholds)")


def axis_caps(n_cpu: int, n_mem: int, per_group: int) -> tuple[int, int]:
    """Thresholds to keep per axis so that (CPU+1) x (memory+1) cells fit ``per_group``: an
    axis that fits within its half keeps all, the other gets the rest; at least one each."""
    k = max(1, int(np.sqrt(max(per_group, 4))) - 1)
    if n_cpu <= k:
        return n_cpu, max(1, min(n_mem, per_group // (n_cpu + 1) - 1))
    if n_mem <= k:
        return max(1, min(n_cpu, per_group // (n_mem + 1) - 1)), n_mem
    return k, k


def merge_rare(thresholds: np.ndarray, values: Sequence[float], weights: Sequence[float], keep: int) -> np.ndarray:
    """At most ``keep`` of the sorted ``thresholds``, chosen by weighted quantile: the axis is
    cut into ``keep`` runs of about equal class frequency and each run keeps its largest
    threshold (so the largest of all is kept, and any threshold with 1/keep of the frequency).
    A class whose threshold is dropped counts at the next kept one: it is taken to need a
    little more than it asks (never to fit where it does not), and the frequency so moved
    past any point of the axis is under 1/keep of the total."""
    if len(thresholds) <= keep:
        return thresholds
    w = np.zeros(len(thresholds))
    np.add.at(w, np.searchsorted(thresholds, np.asarray(values, np.float64)), np.asarray(weights, np.float64))
    total = w.sum()
    before = np.concatenate(([0.0], np.cumsum(w)[:-1]))
    run = np.minimum((before * keep / total).astype(np.int64), keep - 1) if total > 0 else \
        np.arange(len(thresholds)) * keep // len(thresholds)
    last = np.concatenate((run[1:] != run[:-1], [True]))
    return thresholds[last]


class FragTable:
    """A typical workload compiled into per-group arrays over a model table.

    ``max_cells`` bounds the 2-D lookup of :meth:`weight` (``cum_w2``, groups x CPU thresholds x
    memory thresholds): a class's CPU and host memory are whatever its pod's author wrote, so
    classes differing in all three make the lookup grow as classes^3 (gigabytes at 1,000
    classes). Past the budget each axis keeps at most a quantile's worth of thresholds
    (:func:`merge_rare`) and :attr:`bound` says what was merged; under it (every real workload
    seen) the table is exactly the unbounded one. ``None``: no bound (the reference in tests)."""

    def __init__(self, classes: Sequence[tuple[PodClass, float]], max_cells: int | None = MAX_TABLE_CELLS) -> None:
        self.p_all = float(sum(p for _, p in classes))
        keys: list[tuple] = []
        gidx: dict[tuple, int] = {}
        cls_g, cls_cpu, cls_mem, cls_p = [], [], [], []
        for cls, p in classes:
            if not cls.is_gpu:
                continue
            key = (cls.gpus, cls.mem_mib, cls.core_milli, cls.models, cls.min_card_mem_mib)
            if key not in gidx:
                gidx[key] = len(keys)
                keys.append(key)
            cls_g.append(gidx[key])
            cls_cpu.append(cls.cpu_milli)
            cls_mem.append(cls.host_mem_mib)
            cls_p.append(p)
        self.keys = keys
        self.whole = np.array([k[0] > 0 for k in keys], bool)
        self.need = np.array([k[0] if k[0] > 0 else 1 for k in keys], np.int64)        # cards needed
        self.mem = np.array([k[1] for k in keys], np.int64)
        self.core = np.array([k[2] for k in keys], np.int64)
        self.models = [k[3] for k in keys]
        self.min_card = np.array([k[4] for k in keys], np.int64)                    # whole: card MiB >= this
        self.share_idx = np.flatnonzero(~self.whole)
        # Host-resource thresholds per class: W = M @ [cpu >= cpu_t and mem >= mem_t].
        self.cls_cpu = np.array(cls_cpu, np.float64)[:, None]
        self.cls_mem = np.array(cls_mem, np.float64)[:, None]
        self.uses_mem = bool(np.any(self.cls_mem > 0))
        self.m = np.zeros((len(keys), len(cls_p)))
        self.m[cls_g, np.arange(len(cls_p))] = cls_p
        # CPU-only thresholds: a cumulative table and one searchsorted (the common, fast case).
        self.thresholds = np.unique(np.array(cls_cpu, np.float64))
        cum = np.zeros((len(keys), len(self.thresholds) + 1))
        for g, c, p in zip(cls_g, cls_cpu, cls_p):
            cum[g, int(np.searchsorted(self.thresholds, c)) + 1] += p
        self.cum_w = np.cumsum(cum, axis=1)
        # With host memory and many classes: the same as a 2-D cumulative table over (CPU,
        # memory) thresholds, so W is one lookup per node whatever the number of classes (a
        # matrix product over the classes cost most of a request once model lists multiplied
        # the classes). Up to LOOKUP_ABOVE classes the product stays: equal up to float
        # rounding, and rounding decides near-ties, so the openb traces without model lists
        # (53 classes) replay exactly as before.
        # Built only where weight() reads it, and bounded by ``max_cells`` (see the class doc):
        # ``cpu_thresholds2`` is its CPU axis, ``thresholds`` itself unless rare ones were merged.
        self.mem_thresholds = np.unique(np.array(cls_mem, np.float64))
        self.cpu_thresholds2 = self.thresholds
        self.bound: TableBound | None = None
        self.cum_w2: np.ndarray | None = None
        self._allowed_for: tuple[tuple, np.ndarray] | None = None
        if not self.uses_mem or len(cls_p) <= LOOKUP_ABOVE:
            return
        wanted = len(keys) * (len(self.thresholds) + 1) * (len(self.mem_thresholds) + 1)
        if max_cells is not None and wanted > max_cells:
            n_cpu, n_mem = len(self.thresholds), len(self.mem_thresholds)
            kc, km = axis_caps(n_cpu, n_mem, max_cells // max(len(keys), 1))
            self.cpu_thresholds2 = merge_rare(self.thresholds, cls_cpu, cls_p, kc)
            self.mem_thresholds = merge_rare(self.mem_thresholds, cls_mem, cls_p, km)
            self.bound = TableBound(wanted, len(keys) * (len(self.cpu_thresholds2) + 1) * (len(self.mem_thresholds) + 1),
                                    (n_cpu, len(self.cpu_thresholds2)), (n_mem, len(self.mem_thresholds)))
        cum2 = np.zeros((len(keys), len(self.cpu_thresholds2) + 1, len(self.mem_thresholds) + 1))
        for g, c, hm, p in zip(cls_g, cls_cpu, cls_mem, cls_p):
            cum2[g, int(np.searchsorted(self.cpu_thresholds2, c)) + 1,
                 int(np.searchsorted(self.mem_thresholds, hm)) + 1] += p
        self.cum_w2 = np.cumsum(np.cumsum(cum2, axis=1), axis=2)

    @property
    def size(self) -> int:
        return len(self.keys)

    def allowed(self, models: Sequence[str], version: tuple = ()) -> np.ndarray:
        """[G, M] whether group g may use a card of model m. Kept while ``models`` has the same
        length and ``version`` (the caller's word that the names are the same:
        :meth:`FragIndex.allowed` passes the bound table's renumbering epoch and length)."""
        key = (len(models), version)
        if self._allowed_for is None or self._allowed_for[0] != key:
            ok = np.ones((self.size, len(models)), bool)
            for gi, pats in enumerate(self.models):
                if pats:
                    ok[gi] = [any(model_matches(p, m) for p in pats) for m in models]
            self._allowed_for = (key, ok)
        return self._allowed_for[1]

    def weight(self, cpu_free: np.ndarray, hmem_free: np.ndarray) -> np.ndarray:
        """[G, n] W_g: frequency of group g's classes whose CPU (and host memory) fit what is left."""
        if not self.uses_mem:
            pos = np.searchsorted(self.thresholds, np.minimum(cpu_free, 1e18), side="right")
            return self.cum_w[:, pos]
        if self.m.shape[1] <= LOOKUP_ABOVE:
            ok = (self.cls_cpu <= cpu_free[None]) & (self.cls_mem <= hmem_free[None])
            return self.m @ ok
        pc = np.searchsorted(self.cpu_thresholds2, np.minimum(cpu_free, 1e18), side="right")
        pm = np.searchsorted(self.mem_thresholds, np.minimum(hmem_free, 1e18), side="right")
        return self.cum_w2[:, pc, pm]


def same_as_previous_card(a: CardArrays, ii: np.ndarray, kk: np.ndarray) -> np.ndarray:
    """[P-1] bool: pair q+1 is on the same node as pair q and its card is identical (free memory
    and compute, size, model, presence, health): every what-if of a share on it is the same."""
    same = ii[1:] == ii[:-1]
    for arr in (a.mem_free, a.core_free, a.mem_total, a.model, a.exists, a.healthy):
        col = arr[ii, kk]
        same &= col[1:] == col[:-1]
    return same


def card_left(a: CardArrays, rows: np.ndarray | slice) -> np.ndarray:
    """[n, K] idle milli per card (0 for missing/unhealthy cards)."""
    valid = a.exists[rows] & a.healthy[rows]
    mem = a.mem_free[rows] * MILLI // np.maximum(a.mem_total[rows], 1)
    return np.where(valid, np.minimum(a.core_free[rows], mem), 0)


class FragIndex:
    """``cnt``, ``big``, idle and F for every node of one :class:`CardArrays`, kept in sync.

    :meth:`sync` recomputes only the rows that changed since the last call, so the cost per
    placement is one node's cards, not the cluster's. Which rows changed comes from the
    owner's per-row change counters when it has them (``ClusterModel.row_gen``: one [N]
    comparison), else from comparing the arrays with a snapshot of the last call.
    """

    def __init__(self, table: FragTable, models: Sequence[str]) -> None:
        self.t = table
        self.models = models
        self._snap: tuple[np.ndarray, ...] | None = None
        self._gen: np.ndarray | None = None
        self._src: CardArrays | None = None
        self._tick: int | None = None

    # ------------------------------------------------------------------ state
    def allowed(self, a: CardArrays) -> np.ndarray:
        """[G, M] group may use model id m; ids beyond the known names count as unknown models."""
        need = int(a.model.max(initial=0)) + 1
        names = list(self.models) + ["UNKNOWN"] * max(0, need - len(self.models))
        # The bound table only grows between renumberings (models_epoch), so its epoch and
        # length name its contents (the padding is a function of the two and ``need``).
        return self.t.allowed(names, (models_epoch(self.models), len(self.models)))

    def _fits(self, a: CardArrays, rows, left: np.ndarray) -> np.ndarray:
        """[G, n, K] card k of node can hold one card's worth of group g."""
        t = self.t
        allowed = self.allowed(a)[:, a.model[rows]]                               # [G, n, K]
        whole = (left[None] >= MILLI) & (a.mem_total[rows][None] >= t.min_card[:, None, None])
        share = (a.mem_free[rows][None] >= t.mem[:, None, None]) & (a.core_free[rows][None] >= t.core[:, None, None])
        valid = (a.exists[rows] & a.healthy[rows])[None]
        return allowed & valid & np.where(t.whole[:, None, None], whole, share)

    def _compute(self, a: CardArrays, rows) -> None:
        left = card_left(a, rows)
        fits = self._fits(a, rows, left)
        if not isinstance(rows, slice):  # a few rows: move their cards in the gap histogram
            # (bincounts, not np.subtract.at/np.add.at: those cost tens of us per call)
            gone = np.minimum(np.maximum(self.left[rows], 0), MILLI).ravel()
            came = np.minimum(np.maximum(left, 0), MILLI).ravel()
            self.gap_hist += np.bincount(came, minlength=MILLI + 1) - np.bincount(gone, minlength=MILLI + 1)
        self.left[rows] = left
        # einsum / popcount instead of .sum over the 8-card axis: numpy's short-axis reductions
        # made a full recompute (after every workload-table rebuild) tens of ms on 5,000 nodes.
        self.idle[rows] = np.einsum("nk->n", left)
        self.fits[:, rows] = fits
        self.cnt[:, rows] = row_count(fits.reshape(-1, fits.shape[2])).reshape(fits.shape[:2])
        self.big[:, rows] = np.einsum("gnk,nk->gn", fits, left)
        self.frag[rows] = self.frag_of(a.cpu_free[rows], a.hmem_free[rows], self.idle[rows],
                                       self.cnt[:, rows], self.big[:, rows])

    def frag_of(self, cpu: np.ndarray, hmem: np.ndarray, idle: np.ndarray, cnt: np.ndarray,
                big: np.ndarray) -> np.ndarray:
        t = self.t
        w = t.weight(cpu, hmem) * (cnt >= t.need[:, None])
        return t.p_all * idle - np.einsum("gn,gn->n", w, big)

    def sync(self, a: CardArrays, gen: np.ndarray | None = None,
             groups: Callable[[], tuple[np.ndarray, np.ndarray] | None] | None = None,
             tick: int | None = None) -> None:
        """Bring the state up to date with ``a``.

        ``gen``: per-row change counters of ``a`` (a row's counter moves whenever anything in
        the row changes, as ``ClusterModel.row_gen`` does); without them the arrays are
        compared with a snapshot, which costs a few whole-array passes per call.
        ``groups``: called only for a full build, returns ``(reps, inverse)`` such that every
        row of ``a`` has the same content as row ``reps[inverse[i]]`` (or None): the state is
        a function of a row's content, so it is computed for the representatives and copied.
        ``tick``: the owner's latest change counter (``ClusterModel.row_tick``); the same
        value as at the last call, on the same arrays, means nothing changed since."""
        if gen is not None:
            if (tick is not None and tick == self._tick and self._src is a and self._gen is not None
                    and self._gen.shape == gen.shape):
                return
            if self._src is not a or self._gen is None or self._gen.shape != gen.shape:
                self._rebuild(a, groups() if groups is not None else None)
            else:
                rows = np.flatnonzero(self._gen != gen)
                if rows.size:
                    self._compute(a, rows)
            self._src, self._snap, self._gen, self._tick = a, None, gen.copy(), tick
            return
        self._gen = self._tick = None
        snap = (a.core_free, a.mem_free, a.cpu_free, a.exists, a.healthy, a.model, a.hmem_free)
        if self._src is not a or self._snap is None or self._snap[0].shape != a.core_free.shape:
            self._rebuild(a)
        else:
            old = self._snap
            changed = (old[2] != a.cpu_free) | (old[6] != a.hmem_free)
            changed |= row_any(old[0] != a.core_free) | row_any(old[1] != a.mem_free)
            changed |= row_any(old[3] != a.exists) | row_any(old[4] != a.healthy) | row_any(old[5] != a.model)
            rows = np.flatnonzero(changed)
            if rows.size:
                self._compute(a, rows)
        self._src = a
        self._snap = tuple(x.copy() for x in snap)

    def _rebuild(self, a: CardArrays, groups: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        n, k = a.shape
        g = self.t.size
        self.left = np.zeros((n, k), np.int64)
        self.idle = np.zeros(n, np.int64)
        self.cnt = np.zeros((g, n), np.int64)
        self.big = np.zeros((g, n), np.int64)
        self.frag = np.zeros(n)
        self.fits = np.zeros((g, n, k), bool)
        self.gap_hist = np.zeros(MILLI + 1, np.int64)
        if groups is None:
            self._compute(a, slice(None))
            self._count_gaps()
            return
        reps, inverse = groups
        self._compute(a, reps)
        src = reps[inverse]  # each row's representative (a row with the same content)
        self.left, self.idle = self.left[src], self.idle[src]
        # np.take keeps C order (a[:, src] would not): same layout, same float sums as a plain build.
        self.cnt, self.big, self.fits = (np.take(self.cnt, src, axis=1), np.take(self.big, src, axis=1),
                                         np.take(self.fits, src, axis=1))
        # F over all rows in one call, exactly as the plain build computes it: a float sum's
        # last bit depends on the batch, and the FGD placer's integer quantisation can see it.
        self.frag = self.frag_of(a.cpu_free, a.hmem_free, self.idle, self.cnt, self.big)
        self._count_gaps()

    def _count_gaps(self) -> None:
        """``gap_hist[g]``: how many card slots have ``g`` idle milli (clipped to 0..1000), over
        every slot of the arrays; kept up to date row by row by :meth:`_compute`."""
        self.gap_hist = np.bincount(np.clip(self.left, 0, MILLI).ravel(), minlength=MILLI + 1)

    # ------------------------------------------------------------ what-ifs
    def after_cpu(self, a: CardArrays, rows: np.ndarray, cpu: int, hmem: int = 0) -> np.ndarray:
        """F of ``rows`` after a CPU-only pod takes ``cpu``."""
        return self.frag_of(a.cpu_free[rows] - cpu, a.hmem_free[rows] - hmem, self.idle[rows],
                            self.cnt[:, rows], self.big[:, rows])

    def after_whole(self, a: CardArrays, rows: np.ndarray, req: GpuRequest,
                    usable: np.ndarray | None = None) -> np.ndarray:
        """F of ``rows`` after ``req.gpus`` whole free cards (in index order) go to the pod.

        ``usable`` ([len(rows), K], the fit's usable cards of those rows) restricts the choice
        to the cards the pod may use (model rules), as the card choice does; default: any free card.
        """
        t = self.t
        if usable is None:
            usable = a.exists[rows] & a.healthy[rows] & (a.pods[rows] == 0)
        take = usable & (np.cumsum(usable, axis=1) <= req.gpus)                 # first free cards
        g, n = t.size, len(rows)
        if not (row_count(take) == req.gpus).all():
            # A row without req.gpus usable cards (not a feasible node): sum over the mask.
            fits = self.fits[:, rows] & take[None]                               # [G, n, K]
            left = np.where(take, self.left[rows], 0)
            cnt = self.cnt[:, rows] - row_count(fits.reshape(-1, fits.shape[2])).reshape(g, n)
            big = self.big[:, rows] - np.einsum("gnk,nk->gn", fits, left)
            idle = self.idle[rows] - np.einsum("nk->n", left)
        else:
            r, k = np.nonzero(take)                                             # req.gpus per row
            ii = rows[r]
            left = self.left[ii, k]
            fits = self.fits[:, ii, k]                                           # [G, n*gpus]
            # Explicit shapes: with no GPU class in the workload (g == 0) "-1" cannot be inferred.
            cnt = self.cnt[:, rows] - fits.reshape(g, n, req.gpus).sum(axis=2)
            big = self.big[:, rows] - (fits * left[None]).reshape(g, n, req.gpus).sum(axis=2)
            idle = self.idle[rows] - left.reshape(n, req.gpus).sum(axis=1)
        return self.frag_of(a.cpu_free[rows] - req.cpu_milli, a.hmem_free[rows] - req.host_mem_mib, idle, cnt, big)

    @staticmethod
    def left_after_share(a: CardArrays, ii: np.ndarray, kk: np.ndarray, req: GpuRequest) -> np.ndarray:
        """Idle milli of card kk[q] of node ii[q] once the share pod is on it."""
        mem1 = a.mem_free[ii, kk] - req.mem_mib
        core1 = a.core_free[ii, kk] - req.core_milli
        return np.minimum(core1, mem1 * MILLI // np.maximum(a.mem_total[ii, kk], 1))

    def after_share(self, a: CardArrays, ii: np.ndarray, kk: np.ndarray, req: GpuRequest,
                    distinct: bool = False) -> np.ndarray:
        """F of node ii[q] after the share pod goes on its card kk[q], for every pair q.

        Only share groups can still fit the card afterwards (it is no longer whole), so the
        "after" fit is computed for them alone.

        A card identical to the one before it on the same node (the free cards of a node usually
        are) gives the same F, so each run of identical cards is computed once and copied out:
        on a half-empty cluster that is a fraction of the pairs. ``distinct``: the caller
        already dropped such cards (the same pairs this would compute)."""
        if len(ii) > 1 and not distinct:
            same = same_as_previous_card(a, ii, kk)
            if same.any():
                first = np.concatenate(([True], ~same))
                return self.after_share(a, ii[first], kk[first], req)[np.cumsum(first) - 1]
        t = self.t
        mem1 = a.mem_free[ii, kk] - req.mem_mib
        core1 = a.core_free[ii, kk] - req.core_milli
        left0 = self.left[ii, kk]
        left1 = np.minimum(core1, mem1 * MILLI // np.maximum(a.mem_total[ii, kk], 1))
        fit0 = self.fits[:, ii, kk]                                              # [G, U]
        fit1 = np.zeros_like(fit0)
        s = t.share_idx
        if len(s):
            allowed = self.allowed(a)[s][:, a.model[ii, kk]]
            fit1[s] = allowed & (mem1[None] >= t.mem[s, None]) & (core1[None] >= t.core[s, None])
        cnt = self.cnt[:, ii] - fit0 + fit1
        big = self.big[:, ii] - fit0 * left0[None] + fit1 * left1[None]
        idle = self.idle[ii] - left0 + left1
        new = np.concatenate(([True], ii[1:] != ii[:-1]))                    # pairs come grouped by node
        nodes = ii[new]
        w = t.weight(a.cpu_free[nodes] - req.cpu_milli, a.hmem_free[nodes] - req.host_mem_mib)
        w = w[:, np.cumsum(new) - 1] * (cnt >= t.need[:, None])
        return t.p_all * idle - np.einsum("gn,gn->n", w, big)


POPULARITY = 0.95         # typical pods cover 95 % of the workload's pods


class FragPlacerBase(PlacerBase):
    """Shared plumbing of the fragmentation-aware placers: a workload, its table and index."""

    coverage = POPULARITY
    host_memory = False     # count host memory in "does a class fit" (the paper's FGD does not)

    def __init__(self) -> None:
        self.workload = Workload()
        self.table: FragTable | None = None
        self.index: FragIndex | None = None
        self._models: Sequence[str] = ()
        # Changes whenever the learned state changes scores (table rebuilt, model table bound):
        # hosts may cache each node's score per version.
        self.version = 0
        # The owner's per-row change counters of an arrays object, or None (see track_rows).
        self._row_gen_of: Callable[[CardArrays], np.ndarray | None] | None = None
        self._row_groups_of: Callable[[CardArrays], tuple[np.ndarray, np.ndarray] | None] | None = None
        self._row_tick_of: Callable[[CardArrays], int | None] | None = None
        # learning_in_bulk: how deep, and what the last rebuild point crossed inside would build from.
        self._bulk_depth = 0
        self._deferred: Any = None

    def track_rows(self, row_gen_of: Callable[[CardArrays], np.ndarray | None],
                   row_groups_of: Callable[[CardArrays], tuple[np.ndarray, np.ndarray] | None] | None = None,
                   row_tick_of: Callable[[CardArrays], int | None] | None = None) -> None:
        """Let the index learn which rows changed from the owner's per-row change counters
        (``ClusterModel.row_gen``) instead of comparing whole arrays on every call.
        ``row_gen_of(a)`` returns the counters of ``a``, or None for arrays it does not own;
        ``row_groups_of(a)`` optionally groups ``a``'s rows by equal content (``(reps,
        inverse)``, see ``FragIndex.sync``), so a full build computes each content once.
        ``row_tick_of(a)`` optionally gives the owner's latest change counter (or None), so a
        call with nothing changed since the last one skips even the per-row comparison."""
        self._row_gen_of = row_gen_of
        self._row_groups_of = row_groups_of
        self._row_tick_of = row_tick_of

    def prime(self, pairs: Iterable[tuple[GpuRequest, Sequence[str]]]) -> None:
        """Use a known workload (the trace's own pods, as the paper's FGD does)."""
        for req, models in pairs:
            self.workload.add(PodClass.of(req, models, host_memory=self.host_memory))
        self._rebuild()

    def _rebuild(self) -> None:
        """The table from the workload as it is now; within :meth:`learning_in_bulk`, what it
        would be built from is kept and the build waits for the end of the bulk."""
        if self._bulk_depth:
            self._deferred = self._learned_state(copy=True)
        else:
            self._build(self._learned_state(copy=False))

    def _learned_state(self, copy: bool) -> Any:
        """What a table is built from (:meth:`_build`); ``copy``: one that later learning leaves
        as it is (the learned classes' counts are a dict of up to MAX_CLASSES entries)."""
        return Workload(dict(self.workload.counts), self.workload.total) if copy else self.workload

    def _build(self, state: Any) -> None:
        self.table = FragTable(state.typical(self.coverage))
        self.index = None
        self.version += 1

    @contextmanager
    def learning_in_bulk(self) -> Iterator[None]:
        """Observe many pods at once (a restart's learned past, a what-if's replay): each rebuild
        point crossed inside keeps only what its table would be built from, and one table is
        built at the end, from the last point crossed. That is the table a replay one shape at a
        time ends with (each rebuild replaces the one before, and nothing scores in between),
        without building every table it throws away: 4,096 departed shapes of >= 128 pods each
        made 4,096 full builds, ~115 s before the extender served at all."""
        self._bulk_depth += 1
        try:
            yield
        finally:
            self._bulk_depth -= 1
            if not self._bulk_depth and self._deferred is not None:
                state, self._deferred = self._deferred, None
                self._build(state)

    def bind_models(self, models: Sequence[str]) -> None:
        self._models = models
        self.index = None
        self.version += 1

    def table_bound(self) -> str | None:
        """What the current table's cell budget merged (``FragTable.bound``), or None."""
        bound = self.table.bound if self.table is not None else None
        return bound.describe() if bound is not None else None

    def _index(self, a: CardArrays) -> FragIndex:
        if self.table is None:   # (never deferred: this table is needed now)
            self._build(self._learned_state(copy=False))
        if self.index is None:
            self.index = FragIndex(self.table, self._models)
        gen = self._row_gen_of(a) if self._row_gen_of is not None else None
        groups_of = self._row_groups_of
        tick = self._row_tick_of(a) if self._row_tick_of is not None and gen is not None else None
        self.index.sync(a, gen, None if groups_of is None or gen is None else (lambda: groups_of(a)), tick)
        return self.index

    def frag_after(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray,
                   pairs: tuple[np.ndarray, np.ndarray] | None = None):
        """(F before [n], F after [n] for whole/CPU pods, or per (node, card) pair for shares).

        ``pairs``: for a share, the (rows, cards) to evaluate instead of every usable card,
        no card identical to the one before it on its node (see ``FragIndex.after_share``)."""
        ix = self._index(a)
        before = ix.frag[idx]
        if req.is_shared:
            if pairs is not None:
                rows, kk = pairs
                return before, ix.after_share(a, idx[rows], kk, req, distinct=True), rows, kk
            sub = usable[idx]
            rows, kk = np.nonzero(sub)
            after = ix.after_share(a, idx[rows], kk, req)
            return before, after, rows, kk
        if req.is_whole:
            return before, ix.after_whole(a, idx, req, usable[idx]), None, None
        return before, ix.after_cpu(a, idx, req.cpu_milli, req.host_mem_mib), None, None
