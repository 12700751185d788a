"""Per-node (row-level) caching of filter and prioritize work between requests.

Why: between two pods only the node a pod was bound to changes (one row of the model), yet a
filter and a prioritize evaluated the pod's fit and the placer's score on every node of the
cluster — at 5,000 nodes the pack placer's fragmentation what-ifs alone were ~8 ms per pod.
Pods come in a few dozen shapes, so the fit, the failure reason and the placer's raw score of
a node for a shape are kept here and only rows whose :attr:`ClusterModel.row_gen` moved since
(and rows never seen) are recomputed. The answers are the same as computing everything afresh:

- fit, card mask and reasons of node i depend only on row i, the pod's request, the policy
  fields in :func:`shape_key` and the node's whole-only flag (all covered by ``row_gen``);
- a placer's raw score for node i must depend only on row i and its learned state. Placers
  say so with a ``version`` attribute that changes whenever that learned state changes
  scores; a placer without one (``random``: a stream of draws) is never cached;
- the 0..10 normalisation (:func:`scoring.to_extender_scores`) is done by the caller over the
  requested nodes, every time.

Pure: no I/O, no locks. The service calls it under ``model.lock``.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np

from stowage.resources import GpuRequest

from . import scoring
from .model import CardArrays, ClusterModel
from .policy import PodPolicy

DEFAULT_MAX_SHAPES = 128


def shape_key(req: GpuRequest, policy: PodPolicy) -> tuple:
    """Everything a node's cached results depend on besides the node itself: the request, the
    policy fields the card mask reads, and the node-level policy (which placer scores)."""
    return (req, policy.models_include, policy.models_exclude, policy.min_card_mem_mib, policy.node)


def take_rows(a: CardArrays, rows: np.ndarray) -> CardArrays:
    """Rows of ``a`` as a small :class:`CardArrays` (copies): fit/mask of a few changed nodes."""
    return CardArrays(**{f.name: getattr(a, f.name)[rows] for f in dataclasses.fields(CardArrays)})


@dataclass
class RowEntry:
    """One pod shape's per-node results over one :class:`CardArrays` object.

    ``gen[i]`` is the ``row_gen`` the row's results were computed at (-1: never). Reasons are
    filled lazily (only failing nodes a filter asked about); raw scores only for feasible nodes
    a prioritize asked about, valid while ``raw_ok[i]`` and the placer's version is
    ``placer_version``.
    """

    a: CardArrays
    gen: np.ndarray        # [N] int64
    ok: np.ndarray         # [N] bool: fit now
    unres: np.ndarray      # [N] bool: no preemption could help
    mask: np.ndarray       # [N, K] bool: card_mask
    usable: np.ndarray     # [N, K] bool: the fit's usable cards
    reason: np.ndarray     # [N] object: failure text or None (not computed)
    raw: np.ndarray        # [N] float: placer's raw score
    raw_ok: np.ndarray     # [N] bool
    placer_version: Any = None

    @classmethod
    def new(cls, a: CardArrays) -> "RowEntry":
        n, k = a.shape
        return cls(a=a, gen=np.full(n, -1, np.int64), ok=np.zeros(n, bool), unres=np.zeros(n, bool),
                   mask=np.zeros((n, k), bool), usable=np.zeros((n, k), bool),
                   reason=np.full(n, None, dtype=object), raw=np.zeros(n), raw_ok=np.zeros(n, bool))


class RowCache:
    """Bounded LRU of :class:`RowEntry` by pod shape, refreshed row by row from ``row_gen``."""

    def __init__(self, max_shapes: int = DEFAULT_MAX_SHAPES) -> None:
        if max_shapes < 1:
            raise ValueError("the row cache needs room for at least one pod shape")
        self.max_shapes = max_shapes
        self._entries: OrderedDict[Hashable, RowEntry] = OrderedDict()
        self.rows_recomputed = 0   # counters for tests and the benchmark's curiosity
        self.scores_recomputed = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def fit(self, model: ClusterModel, req: GpuRequest, policy: PodPolicy) -> RowEntry:
        """The shape's entry with fit, mask and usable cards current for every row of ``model.a``."""
        a = model.a
        key = shape_key(req, policy)
        e = self._entries.get(key)
        if e is None or e.a is not a:   # new shape, or the arrays were replaced (resized)
            e = RowEntry.new(a)
            self._entries[key] = e
            while len(self._entries) > self.max_shapes:
                self._entries.popitem(last=False)
        self._entries.move_to_end(key)
        gen = model.row_gen
        stale = np.flatnonzero(e.gen != gen)
        if stale.size:
            self.rows_recomputed += int(stale.size)
            if stale.size == len(gen):
                mask = scoring.card_mask(a, model.models, policy, req)
                f = scoring.fit(a, req, mask)
                e.mask, e.usable, e.ok, e.unres = mask, f.usable, f.ok, f.unresolvable
                e.reason[:] = None
                e.raw_ok[:] = False
            else:
                sub = take_rows(a, stale)
                mask = scoring.card_mask(sub, model.models, policy, req)
                f = scoring.fit(sub, req, mask)
                e.mask[stale], e.usable[stale] = mask, f.usable
                e.ok[stale], e.unres[stale] = f.ok, f.unresolvable
                e.reason[stale] = None
                e.raw_ok[stale] = False
            e.gen[stale] = gen[stale]
        return e

    def scores(self, e: RowEntry, placer: scoring.Placer, a: CardArrays, req: GpuRequest,
               rows: np.ndarray) -> np.ndarray:
        """The placer's raw scores of the feasible ``rows`` (any order, repeats allowed).

        Rows are scored only when missing; the placer's version is read before and after
        scoring, because a placer may rebuild its learned state inside ``score`` (first use)."""
        for _ in range(3):
            version = placer.version  # type: ignore[attr-defined]
            if e.placer_version != version:
                e.raw_ok[:] = False
                e.placer_version = version
            need = rows[~e.raw_ok[rows]]
            if need.size:
                need = np.unique(need)
                self.scores_recomputed += int(need.size)
                e.raw[need] = placer.score(a, req, need, e.usable)
                e.raw_ok[need] = True
            if placer.version == version:  # type: ignore[attr-defined]
                return e.raw[rows]
        # The placer changes its state on every call: do not trust the cache for it.
        return np.asarray(placer.score(a, req, rows, e.usable), float)


def cacheable(placer: Any) -> bool:
    """A placer whose scores may be cached per row (it declares a ``version``)."""
    return getattr(placer, "version", None) is not None
