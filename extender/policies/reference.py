"""The published reference policies of the FGD paper, from their definitions.

Implemented from Weng et al., "Beware of Fragmentation" (USENIX ATC '23) and the score plugins
of its simulator (hkust-adsl/kubernetes-scheduler-simulator), including their integer score
quantisation — which decides ties, and ties decide a lot on a 1213-node cluster. They exist to
calibrate the benchmark: if these three land on the paper's published figures, the harness
replays the experiment faithfully and the other policies' figures can be trusted.

- ``random``: one uniformly random feasible node; a share pod goes on a random card that fits.
- ``bestfit``: score ``int(100 * (1 - (0.5*(cpu_free-cpu)/128000 + 0.5*(gpu_free-gpu)/8000)))``
  (least left over wins); a share pod goes on the card with least idle share that fits.
- ``fgd``: score ``int(100 * sigmoid((F_before - F_after)/1000))`` with F the fragmentation
  measure of :mod:`.frag` over the typical workload; a share pod goes on the card of the node
  with the best such score (first card on ties). Whole-GPU pods take the first free cards.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np

from extender.model import CardArrays
from extender.policy import PodPolicy
from extender.scoring import choose_whole_cards
from stowage.resources import GpuRequest

from .frag import MILLI, FragIndex, FragTable, PodClass, Workload, card_left

MAX_SPEC_CPU = 128000.0   # the simulator's normalisers (largest node: 128 CPUs, 8 GPUs)
MAX_SPEC_GPU = 8000.0
POPULARITY = 0.95         # typical pods cover 95 % of the trace's pods


def first_free_cards(a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray) -> list[int]:
    """Whole-GPU pods in the simulator take the lowest-index free cards."""
    return [int(k) for k in np.flatnonzero(usable_row)[: req.gpus]]


class RandomPlacer:
    """Uniformly random feasible node; random card for a share pod.

    Has no ``version``: its scores are draws from a stream, not a function of the node, so the
    extender never caches them (see extender/rowcache.py)."""

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        return self.rng.random(len(idx))

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        if req.is_whole:
            return first_free_cards(a, i, req, usable_row)
        cand = np.flatnonzero(usable_row)
        return [int(cand[self.rng.integers(len(cand))])] if len(cand) else []

    def observe(self, req: GpuRequest) -> None:
        return None


def _pod_milli(req: GpuRequest) -> float:
    if req.is_whole:
        return float(req.gpus * MILLI)
    return float(max(req.core_milli, req.mem_mib)) if req.is_shared else 0.0


def best_fit_card(a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray) -> list[int]:
    """The usable card with the least idle share (lowest index on ties)."""
    if req.is_whole:
        return first_free_cards(a, i, req, usable_row)
    cand = np.flatnonzero(usable_row)
    if not len(cand):
        return []
    left = card_left(a, np.array([i]))[0, cand]
    return [int(cand[int(np.argmin(left))])]


class BestFitPlacer:
    """The paper's BestFit: least weighted CPU+GPU left over after placing, integer score."""

    name = "bestfit"
    version = 0  # no learned state: scores depend on the node's row only (cacheable per row)

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        gpu_free = card_left(a, idx).sum(axis=1).astype(float)
        cpu_free = a.cpu_free[idx].astype(float)
        # Host CPU not modelled (the extender: inf): no CPU term, rank on the GPU alone.
        cpu_free = np.where(np.isfinite(cpu_free), cpu_free, float(req.cpu_milli))
        s = (cpu_free - req.cpu_milli) / MAX_SPEC_CPU * 0.5 + (gpu_free - _pod_milli(req)) / MAX_SPEC_GPU * 0.5
        return np.trunc((1.0 - s) * 100.0)

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        return best_fit_card(a, i, req, usable_row)

    def observe(self, req: GpuRequest) -> None:
        return None


class FragPlacerBase:
    """Shared plumbing of the fragmentation-aware placers: a workload, its table and index."""

    coverage = POPULARITY
    host_memory = False     # count host memory in "does a class fit" (the paper's FGD does not)

    def __init__(self) -> None:
        self.workload = Workload()
        self.table: FragTable | None = None
        self.index: FragIndex | None = None
        self._models: Sequence[str] = ()
        # Changes whenever the learned state changes scores (table rebuilt, model table bound):
        # the extender caches each node's score per version (extender/rowcache.py).
        self.version = 0
        # The owner's per-row change counters of an arrays object, or None (see track_rows).
        self._row_gen_of: Callable[[CardArrays], np.ndarray | None] | None = None
        self._row_groups_of: Callable[[CardArrays], tuple[np.ndarray, np.ndarray] | None] | None = None
        self._row_tick_of: Callable[[CardArrays], int | None] | None = None

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
        self.table = FragTable(self.workload.typical(self.coverage))
        self.index = None
        self.version += 1

    def models_for(self, a: CardArrays) -> Sequence[str]:
        """The model table of the cluster model the arrays belong to (set by :meth:`bind_models`)."""
        return self._models

    def bind_models(self, models: Sequence[str]) -> None:
        self._models = models
        self.index = None
        self.version += 1

    def _index(self, a: CardArrays) -> FragIndex:
        if self.table is None:
            self._rebuild()
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


def segment_max(values: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """[n] max of values per row id (rows sorted ascending, every row present)."""
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    out = np.full(n, -np.inf)
    out[rows[starts]] = np.maximum.reduceat(values, starts)
    return out


class FgdPlacer(FragPlacerBase):
    """Fragmentation gradient descent, as published (integer sigmoid score)."""

    name = "fgd"
    knows_workload = True   # the paper's FGD is given the trace's own pod mix up front

    @staticmethod
    def _quantise(delta: np.ndarray) -> np.ndarray:
        return np.trunc(100.0 / (1.0 + np.exp(-delta / 1000.0)))

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        before, after, rows, kk = self.frag_after(a, req, idx, usable)
        if rows is None:
            return self._quantise(before - after)
        return segment_max(self._quantise(before[rows] - after), rows, len(idx))

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        if not req.is_shared:
            return first_free_cards(a, i, req, usable_row)
        idx = np.array([i])
        u = np.zeros((a.shape[0], a.shape[1]), bool)
        u[i] = usable_row
        before, after, rows, kk = self.frag_after(a, req, idx, u)
        q = self._quantise(before[rows] - after)
        return [int(kk[int(np.argmax(q))])]

    def observe(self, req: GpuRequest) -> None:
        return None
