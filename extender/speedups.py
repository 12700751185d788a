"""The speed-ups of the extender's filter and prioritize, behind the service's one seam.

:class:`extender.service.ExtenderService` is written as the plain reference path
(:class:`extender.service.ReferencePath`: every answer computed afresh with :mod:`packing`,
one node's reason at a time). :class:`FastPath` answers the same questions, the same way the
reference does by construction and by test (``tests/test_latency_equivalence.py``,
``tests/test_extender_rowcache*.py`` run both and compare every answer byte for byte), only faster
on thousands of nodes; ``ExtenderService(speedups=False)`` switches all of them off:

- wire memo (:class:`extender.wirememo.NodeNamesMemo`): a NodeNames array seen before is
  recognised by its bytes instead of decoded;
- name memo (:class:`NamesMemo`): a NodeNames list seen before maps to its model rows (and its
  prioritize answer pieces) without 5,000 dict lookups;
- row cache (:class:`extender.rowcache.RowCache`): per pod shape, each node's fit, reason and raw
  score, recomputed only for rows that changed, once per distinct row content;
- fast reasons (:func:`extender.fastreasons.reasons`): the failure texts of many nodes at once;
- row tracking (``Placer.track_rows``): a placer's incremental index learns which rows changed
  from the model's change counters instead of comparing arrays.

Every method is called under ``model.lock``.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat

import numpy as np

from packing.model import CardArrays, ClusterModel
from packing.placer import Placer
from packing.pod_policy import PodPolicy
from stowage.resources import GpuRequest

from .fastreasons import reasons, whole_only_override
from .rowcache import DEFAULT_MAX_SHAPES, RowCache, RowEntry, cacheable, sorted_unique
from .wire import object_array, priority_heads
from .wirememo import MAX_ARRAY_BYTES, MAX_NAMES, NodeNamesMemo


@dataclass
class NamesEntry:
    """A NodeNames list seen recently, its model rows, and (made on first use) its prioritize
    answer pieces (:func:`extender.wire.priority_heads`). The service reads ``rows`` and
    :meth:`take` of it, as of the reference path's :class:`extender.service.NodeRows`."""

    names: list[str]
    index_gen: int
    rows: np.ndarray
    heads: list[bytes] | None = None
    # A filter's passing list: the request's list it was taken from, and which positions, so
    # its heads are a selection of the (kept) heads of the full list.
    parent: "NamesEntry | None" = None
    sel: np.ndarray | None = None
    _arr: np.ndarray | None = None        # names as an object array (made on first take)
    _heads_arr: np.ndarray | None = None  # answer_heads() as an object array (made on first use)

    def take(self, sel: np.ndarray) -> list[str]:
        """``names[sel]`` as a list; the object array behind it is made once per list."""
        if self._arr is None:
            self._arr = object_array(self.names)
        return self._arr[sel].tolist()

    def answer_heads(self) -> list[bytes]:
        """:func:`extender.wire.priority_heads` of ``names``, made once."""
        heads = self.heads
        if heads is None:  # two threads may both make them: same result, no lock needed
            parent, sel = self.parent, self.sel
            if parent is not None and sel is not None:
                heads = parent.take_heads(sel)
            else:
                heads = priority_heads(self.names)
            self.heads = heads
            self.parent = None  # not needed any more
        return heads

    def take_heads(self, sel: np.ndarray) -> list[bytes]:
        """``answer_heads()[sel]`` (a passing list's heads from its full list's)."""
        if self._heads_arr is None:
            self._heads_arr = object_array(self.answer_heads())
        return self._heads_arr[sel].tolist()


class NamesMemo:
    """The last few NodeNames lists -> model rows (valid while ``model.index_gen`` is unchanged).

    kube-scheduler sends the same lists again and again: the full node list to every filter,
    and to prioritize the list the filter just passed. With several pods in flight these
    interleave, so a handful are kept; finding one is a C-level list comparison (cheaper than
    5,000 hash lookups), tried only on lists of the same length and ends."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.entries: list[NamesEntry] = []  # newest first

    def get(self, names: list[str], index_gen: int) -> NamesEntry | None:
        n = len(names)
        for j, e in enumerate(self.entries):
            m = e.names
            if (e.index_gen == index_gen and len(m) == n and (not n or (m[0] == names[0] and m[-1] == names[-1]))
                    and m == names):
                if j:
                    self.entries.insert(0, self.entries.pop(j))
                return e
        return None

    def put(self, names: list[str], index_gen: int, rows: np.ndarray, parent: NamesEntry | None = None,
            sel: np.ndarray | None = None) -> NamesEntry:
        """Remember ``names``; ``parent``/``sel``: names == parent.names[sel] (a filter's passing list)."""
        rows.flags.writeable = False  # shared between requests
        if parent is not None and parent.parent is not None:
            parent = None  # one level only: no chains of lists kept alive
        # Not copied: request lists are fresh per request or shared read-only (wirememo).
        e = NamesEntry(names, index_gen, rows, parent=parent, sel=None if parent is None else sel)
        if len(names) > MAX_NAMES or sum(map(len, names)) > MAX_ARRAY_BYTES:
            return e  # made-up lists are not kept: the memo stays bounded in bytes
        self.entries.insert(0, e)
        del self.entries[self.size:]
        return e


class FastPath:
    """The speed-ups, as the methods of :class:`extender.service.ReferencePath` (same
    arguments, same answers)."""

    def __init__(self, max_shapes: int = DEFAULT_MAX_SHAPES) -> None:
        self.row_cache = RowCache(max_shapes)
        self.names = NamesMemo()

    def wire_parser(self) -> NodeNamesMemo:
        return NodeNamesMemo()

    def attach(self, placer: Placer, model: ClusterModel) -> None:
        """Let the placer's incremental index (if it has one) follow the model's per-row change
        counters, and group equal rows for a full build."""
        def row_gen_of(a: CardArrays) -> np.ndarray | None:
            return model.row_gen if a is model.a else None

        def row_tick_of(a: CardArrays) -> int | None:
            return model.row_tick if a is model.a else None

        def row_groups_of(a: CardArrays) -> tuple[np.ndarray, np.ndarray] | None:
            if a is not model.a:
                return None
            reps, inverse = self.row_cache.representatives(model, np.arange(a.shape[0]))
            return None if inverse is None else (reps, inverse)

        placer.track_rows(row_gen_of, row_groups_of, row_tick_of)

    def lookup(self, model: ClusterModel, names: list[str]) -> NamesEntry:
        index_gen = model.index_gen
        e = self.names.get(names, index_gen)
        if e is not None:
            return e
        # map() over dict.get runs in C: a third of the cost of a generator on 5,000 names.
        idx = np.fromiter(map(model.index.get, names, repeat(-1)), dtype=np.int64, count=len(names))
        return self.names.put(names, index_gen, idx)

    def remember_passing(self, model: ClusterModel, entry: NamesEntry, passing: list[str], rows: np.ndarray,
                         sel: np.ndarray) -> None:
        """A filter's passing list: what the next prioritize of this pod will send."""
        if passing:
            self.names.put(passing, model.index_gen, rows, parent=entry, sel=sel)

    def feasible(self, model: ClusterModel, req: GpuRequest, policy: PodPolicy) -> RowEntry:
        return self.row_cache.fit(model, req, policy)

    def reasons(self, model: ClusterModel, feas: RowEntry, rows: np.ndarray, req: GpuRequest,
                tolerates: int = 0) -> list[str]:
        """Failure texts of ``rows`` from the row cache, computing (once) those not known yet."""
        got = feas.reason[rows]
        missing = np.flatnonzero(np.equal(got, None))
        if missing.size:
            new = sorted_unique(rows[missing], len(feas.reason))
            # One row per distinct content: the text depends on the row's content only.
            reps, inv = self.row_cache.representatives(model, new)
            texts = reasons(model.a, reps, req, feas.mask, tolerates)
            if req.is_shared:
                texts = whole_only_override(model, reps, texts)
            filled = object_array(texts)
            feas.reason[new] = filled if inv is None else filled[inv]
            got = feas.reason[rows]
        return got.tolist()

    def scores(self, model: ClusterModel, feas: RowEntry, placer: Placer, req: GpuRequest,
               rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Raw scores of the feasible ``rows`` as (values, inverse): ranks depend on the raw
        values alone, so the caller ranks one value per distinct row content where the cache
        has them that way, then spreads them with ``inverse``."""
        if cacheable(placer):
            return self.row_cache.score_values(feas, placer, model, req, rows)
        return np.asarray(placer.score(model.a, req, rows, feas.usable), float), None

    def answer_heads(self, entry: NamesEntry) -> list[bytes]:
        return entry.answer_heads()
