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
- the 0..10 normalisation (:func:`packing.decide.to_extender_scores`) is done by the caller over the
  requested nodes, every time.

Rows with the same CONTENT are computed once: a new pod shape (or a placer's new version)
needs every node's fit and score, but a 5,000-node cluster has only a few hundred distinct
node states (the empty nodes of one type are all alike; partly used nodes repeat the same few
pods). Each row's content — every :class:`CardArrays` field of the row plus the node's
whole-only flag, which is all fit, reasons and a cacheable placer's score may read — is kept
as a small integer id (:meth:`RowCache.signatures`, refreshed for rows whose ``row_gen``
moved), and work on many rows is done on one representative per id and copied out.

Pure: no I/O, no locks. The service calls it under ``model.lock``.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np

from stowage.resources import GpuRequest

from packing.fit import card_mask, fit
from packing.placer import Placer
from packing.model import CardArrays, ClusterModel
from packing.pod_policy import PodPolicy

DEFAULT_MAX_SHAPES = 128
DEDUP_MIN_ROWS = 16  # below this many rows, finding representatives costs more than it saves
# The fit (a few vector passes) is cheaper than finding representatives up to a few hundred
# rows (measured at 5,000 nodes: 24 us direct vs 38 us deduplicated for 32 rows, even at 256).
FIT_DEDUP_MIN_ROWS = 256


def shape_key(req: GpuRequest, policy: PodPolicy) -> tuple:
    """Everything a node's cached results depend on besides the node itself: the request, the
    policy fields the card mask reads, the node closures its tolerations open (the fit reads
    them), and the node-level policy (which placer scores)."""
    return (req, policy.models_include, policy.models_exclude, policy.min_card_mem_mib, policy.tolerates,
            policy.node)


def sorted_unique(rows: np.ndarray, n: int) -> np.ndarray:
    """``np.unique(rows)`` for row numbers below ``n``, through a mask (no sort; rows repeat
    little and n is the cluster size)."""
    if len(rows) < 64:
        return np.unique(rows)
    seen = np.zeros(n, bool)
    seen[rows] = True
    return np.flatnonzero(seen)


_FIELDS = tuple(f.name for f in dataclasses.fields(CardArrays))


def take_rows(a: CardArrays, rows: np.ndarray) -> CardArrays:
    """Rows of ``a`` as a small :class:`CardArrays` (copies): fit/mask of a few changed nodes."""
    return CardArrays(**{name: getattr(a, name)[rows] for name in _FIELDS})


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
    tick: int = -1         # model.row_tick when every row's results were last made current
    # Placers with a request-time global term (see RowCache.score_values): each distinct row
    # content's row-local (node, card) pair scores, by content id ([ids, K]; -inf: no pair).
    pair_local: np.ndarray | None = None
    pair_known: np.ndarray | None = None
    pair_keys: np.ndarray | None = None   # [ids, K, ...] the placer's pair_keys, if it has them
    pair_epoch: int = -1

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
        self.rows_evaluated = 0    # distinct row contents actually evaluated (fit + scores)
        # Row content ids (see the module docstring), for one CardArrays object.
        self._sig_src: CardArrays | None = None
        self._sig_gen = np.zeros(0, np.int64)
        self._sig = np.zeros(0, np.int64)
        self._sig_ids: dict[bytes, int] = {}
        self._sig_epoch = 0  # bumped whenever content ids are renumbered
        self._sig_tick = -1  # model.row_tick when every row's id was last made current

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._sig_src = None

    # ------------------------------------------------------------------ row contents
    @staticmethod
    def _row_bytes(model: ClusterModel, rows: np.ndarray) -> list[bytes]:
        """Each row's content as bytes: every CardArrays field of the row and the whole-only flag."""
        a = model.a
        n = len(rows)
        parts = [np.ascontiguousarray(getattr(a, f.name)[rows]).reshape(n, -1).view(np.uint8)
                 for f in dataclasses.fields(CardArrays)]
        meta, names = model.meta, model.names
        flags = np.array([bool((m := meta.get(names[i] or "")) is not None and m.whole_only)
                          for i in rows.tolist()], np.uint8).reshape(n, 1)
        buf = np.concatenate(parts + [flags], axis=1)
        return [r.tobytes() for r in buf]

    def signatures(self, model: ClusterModel) -> np.ndarray:
        """[N] content id of every row of ``model.a``: equal ids, equal row contents.

        Ids are only compared within one call's result (never stored in entries), so the id
        table may be renumbered whenever it has grown with contents no row holds any more."""
        a, gen = model.a, model.row_gen
        n = len(gen)
        tick = model.row_tick
        if self._sig_src is a and self._sig_tick == tick and len(self._sig) == n:
            return self._sig  # no row changed since
        if self._sig_src is not a or len(self._sig) != n or len(self._sig_ids) > 4 * n + 1024:
            self._sig_src = a
            self._sig_ids = {}
            self._sig_epoch += 1
            self._sig = np.zeros(n, np.int64)
            self._sig_gen = np.full(n, -1, np.int64)
        stale = np.flatnonzero(self._sig_gen != gen)
        if stale.size:
            ids = self._sig_ids
            self._sig[stale] = [ids.setdefault(b, len(ids)) for b in self._row_bytes(model, stale)]
            self._sig_gen[stale] = gen[stale]
        self._sig_tick = tick
        return self._sig

    def representatives(self, model: ClusterModel, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(reps, inverse): one row per distinct content among ``rows`` with
        ``rows``' content == ``reps[inverse]``'s; ``(rows, None)`` when deduplicating would not pay."""
        if len(rows) < DEDUP_MIN_ROWS:
            return rows, None
        # Ids are small integers: tables indexed by id instead of np.unique's sort.
        sig = self.signatures(model)[rows]
        present = np.zeros(len(self._sig_ids), bool)
        present[sig] = True
        ids = np.flatnonzero(present)
        if len(ids) == len(rows):
            return rows, None
        first = np.empty(len(present), np.int64)
        first[sig[::-1]] = np.arange(len(rows) - 1, -1, -1)  # the last write wins: first occurrence
        slot = np.cumsum(present) - 1                          # id -> position among ids
        return rows[first[ids]], slot[sig]

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
        tick = model.row_tick
        if e.tick == tick:
            return e  # no row changed since this shape's rows were last made current
        stale = np.flatnonzero(e.gen != gen)
        if stale.size:
            self.rows_recomputed += int(stale.size)
            # Deduplicate a new shape's (or a big change's) rows; a few rows changed by binds
            # since the shape's last pod are cheaper to fit as they are.
            dedup = len(stale) >= min(FIT_DEDUP_MIN_ROWS, len(gen) // 2)
            reps, inv = self.representatives(model, stale) if dedup else (stale, None)
            self.rows_evaluated += int(reps.size)
            sub = take_rows(a, reps)
            mask = card_mask(sub, model.models, policy, req)
            f = fit(sub, req, mask, policy.tolerates)
            usable, ok, unres = f.usable, f.ok, f.unresolvable
            if inv is not None:
                mask, usable, ok, unres = mask[inv], usable[inv], ok[inv], unres[inv]
            e.mask[stale], e.usable[stale] = mask, usable
            e.ok[stale], e.unres[stale] = ok, unres
            e.reason[stale] = None
            e.raw_ok[stale] = False
            e.gen[stale] = gen[stale]
        e.tick = tick
        return e

    def score_values(self, e: RowEntry, placer: Placer, model: ClusterModel, req: GpuRequest,
                     rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(values, inverse): the placer's raw scores of the feasible ``rows`` are
        ``values[inverse]`` (``values`` itself when ``inverse`` is None). For a placer with a
        global term, ``values`` has one score per distinct row content among ``rows``: the
        caller ranks those few instead of every node (ranks depend on the values alone).

        A placer whose share-pod score has a cluster-wide part (``global_pairs``, e.g. a term
        over the histogram of every card's gap) goes through :meth:`_pair_values`.

        Rows are scored only when missing, one row per distinct content (a cacheable placer's
        score of a row depends on the row's content and its learned state only); the placer's
        version is read before and after scoring, because a placer may rebuild its learned
        state inside ``score`` (first use)."""
        a = model.a
        if req.is_shared and placer.split_pairs and len(rows):
            return self._pair_values(e, placer, model, req, rows)
        for _ in range(3):
            version = placer.version  # type: ignore[attr-defined]
            if e.placer_version != version:
                e.raw_ok[:] = False
                e.placer_version = version
            need = rows[~e.raw_ok[rows]]
            if need.size:
                need = sorted_unique(need, len(e.raw_ok))
                self.scores_recomputed += int(need.size)
                reps, inv = self.representatives(model, need)
                self.rows_evaluated += int(reps.size)
                raw = np.asarray(placer.score(a, req, reps, e.usable), float)
                e.raw[need] = raw if inv is None else raw[inv]
                e.raw_ok[need] = True
            if placer.version == version:  # type: ignore[attr-defined]
                return e.raw[rows], None
        # The placer changes its state on every call: do not trust the cache for it.
        return np.asarray(placer.score(a, req, rows, e.usable), float), None

    def _pair_values(self, e: RowEntry, placer: Any, model: ClusterModel, req: GpuRequest,
                     rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Raw scores of a placer whose share score is max over a node's usable cards of
        ``local_pairs`` (a function of the row's content and the placer's learned state: cached
        here per content id) + ``global_pairs`` (cluster-wide, e.g. the gap histogram: computed
        now, once per distinct content). Equal to ``placer.score`` by construction.

        A placer that also has ``pair_keys`` (row-local per-pair inputs of its global term,
        cached here with the local scores) and ``global_of_keys`` (the term from those keys) is
        asked only for the latter per request: no per-request gathering of each pair's inputs
        from the arrays. Returns (one score per content id among ``rows``, ``rows``' position
        in it)."""
        a = model.a
        k = a.shape[1]
        sig = self.signatures(model)
        s = sig[rows]
        nids = len(self._sig_ids)
        present = np.zeros(nids, bool)
        present[s] = True
        ids = np.flatnonzero(present)
        slot = np.empty(nids, np.int64)
        slot[ids] = np.arange(len(ids))
        keyed = placer.keyed_pairs
        at: np.ndarray | None = None  # a row holding each content id (made when needed)
        for _ in range(3):
            version = placer.version  # type: ignore[attr-defined]
            if e.placer_version != version or e.pair_epoch != self._sig_epoch or e.pair_local is None:
                e.placer_version = version
                e.pair_epoch = self._sig_epoch
                e.pair_local = np.full((max(64, 2 * nids), k), -np.inf)
                e.pair_known = np.zeros(len(e.pair_local), bool)
                e.pair_keys = None
            if len(e.pair_known) < nids:  # new contents since: grow
                grow = 2 * nids - len(e.pair_known)
                e.pair_local = np.vstack([e.pair_local, np.full((grow, k), -np.inf)])
                e.pair_known = np.concatenate([e.pair_known, np.zeros(grow, bool)])
                if e.pair_keys is not None:
                    e.pair_keys = np.concatenate(
                        [e.pair_keys, np.zeros((grow,) + e.pair_keys.shape[1:], e.pair_keys.dtype)])
            missing = ~e.pair_known[ids]
            if missing.any():
                if at is None:
                    at = np.empty(nids, np.int64)
                    at[s[::-1]] = rows[::-1]  # the last write wins: the first row of each id
                new_ids = ids[missing]
                new_rows = at[new_ids]
                self.scores_recomputed += int(len(new_rows))
                self.rows_evaluated += int(len(new_rows))
                sc, prow, kk = placer.local_pairs(a, req, new_rows, e.usable)
                local = np.full((len(new_rows), k), -np.inf)
                local[prow, kk] = sc
                e.pair_local[new_ids] = local
                if keyed:
                    keys = np.asarray(placer.pair_keys(a, req, new_rows[prow], kk))
                    if e.pair_keys is None:
                        e.pair_keys = np.zeros((len(e.pair_local), k) + keys.shape[1:], keys.dtype)
                    block = np.zeros((len(new_rows), k) + keys.shape[1:], keys.dtype)
                    block[prow, kk] = keys
                    e.pair_keys[new_ids] = block
                e.pair_known[new_ids] = True
            if placer.version == version:  # type: ignore[attr-defined]
                break
        else:  # the placer changes its state on every call: do not trust the cache for it
            return np.asarray(placer.score(a, req, rows, e.usable), float), None
        loc = e.pair_local[ids]                               # [R, K]; -inf: no pair
        if keyed and e.pair_keys is not None:
            # Every slot of the [R, K] block at once (slots without a pair hold zero keys, and
            # -inf + a finite term stays -inf), then the per-content max.
            keys = e.pair_keys[ids]
            glob = np.asarray(placer.global_of_keys(a, req, keys.reshape((-1,) + keys.shape[2:])), float)
            best = (loc + glob.reshape(loc.shape)).max(axis=1)
        else:
            if at is None:
                at = np.empty(nids, np.int64)
                at[s[::-1]] = rows[::-1]
            reps = at[ids]
            r, kk = np.nonzero(loc > -np.inf)                 # pairs, grouped by content (row-major)
            best = np.full(len(ids), -np.inf)
            if len(r):
                tot = loc[r, kk] + placer.global_pairs(a, req, reps[r], kk)
                starts = np.flatnonzero(np.concatenate(([True], r[1:] != r[:-1])))
                best[r[starts]] = np.maximum.reduceat(tot, starts)
        return best, slot[s]


def cacheable(placer: Placer) -> bool:
    """A placer whose scores may be cached per row (its ``version`` is not None)."""
    return placer.version is not None
