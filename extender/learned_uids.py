"""The pods the placers learned from, by uid: bounded in entries and in estimated bytes.

:class:`~extender.service.ExtenderService` shows the placers each pod once per uid (filter,
prioritize, a second scheduling cycle after its bind, the watch) and, when the pod is deleted,
counts its shape (request and allowed GPU models) in the departed pods' past
(:mod:`extender.learned_past`). So it keeps, for every pod learned and not yet deleted, its uid
and its shape. A pod author writes the shape's model list (``stowage.io/gpu-model``: up to 64
names of 128 characters): kept per pod, as before this module, pods written to have distinct long
lists kept ~12 KB each (tracemalloc: 20,000 such pods 233 MiB; ~1.1 GiB at the 100,000 entries
that bounded it, where the extender's container has 1 GiB).

So:

- **Shapes are interned**: a uid keeps a reference to one shared record per distinct shape, and
  a shape to one shared tuple per distinct model list (sorted, without repeats: the form
  :meth:`DepartedPods.add` counts, so what a deletion adds there is exactly what it was). Pods of
  one shape (most of a real workload) cost their uid and a slot each: ~0.2 KB, against ~0.4-0.6 KB
  when each pod kept its own request and list. The reference is as compact as an id of the
  shape would be, and needs no lookup back: a deletion hands the exact shape to ``departed``.
- **Bytes are bounded too** (:data:`LEARNED_BYTES`, 64 MiB), by an estimate that counts each
  uid's slot, and each distinct shape and each distinct list once (what is really held: their
  records go when their last uid goes). 100,000 ordinary pods stay far below it (~20 MiB for a
  few thousand shapes; ~61 MiB even if each had a request of its own and no list), so only the
  entry bound (100,000) governs them, as before.
- **What goes first**: past the entry bound, the least recently used uid (learned, or seen again,
  longest ago). Past the bytes, the least recently used uid whose shape has a *long* list (its
  strings over :data:`LONG_LIST_BYTES`, far beyond the few names real pods write): those are what
  makes the bytes grow, and forgetting them frees their lists, where forgetting ordinary uids would
  free ~0.2 KB each. Only when none is left do ordinary uids go for bytes. The newest uid always
  stays.

What forgetting a uid costs (the entry bound had the same consequence): the pod is no longer
known as learned, so if it is seen again (a filter, the watch's next list) the placers learn it a
second time (its class counts one pod more than exist), and when it is deleted its shape is not
counted in the departed pods' past (a restarted extender learns one pod fewer). Placement stays
correct either way; only how well the learned workload matches the cluster suffers, and only for
clusters past 100,000 live pods of Stowage's schedulers or pods written with long model lists.

Not thread-safe: :class:`ExtenderService` holds its pods lock around every call.
"""
from __future__ import annotations

import logging
import sys
from collections import OrderedDict
from typing import Iterator

from packing.frag import model_list
from stowage.resources import GpuRequest

from .bounds import BoundUse
from .learned_past import Shape

log = logging.getLogger("stowage.extender")

LEARNED_ENTRIES = 100_000
LEARNED_BYTES = 64 << 20
# A model list whose strings take more than this (~25 names of typical length) is *long*: first
# forgotten under the bytes bound. Real pods name a few models (~0.1-0.3 KB).
LONG_LIST_BYTES = 2048
# Estimates of what is held besides the texts, from tracemalloc (rounded up: the estimate errs high).
_UID_BYTES = 100      # a uid's slot: its OrderedDict entry and node (tracemalloc ~90; its text is added)
_SHAPE_BYTES = 450    # a distinct shape: its record, tuple, GpuRequest and its __dict__, slot (~405)
_LIST_BYTES = 120     # a distinct list: its record and slot (~90; the tuple and strings are added)


class _List:
    """One distinct model list, held once for every shape naming it."""

    __slots__ = ("models", "refs", "nbytes", "long")

    def __init__(self, models: tuple[str, ...]) -> None:
        self.models = models
        self.refs = 0
        strings = sum(sys.getsizeof(m) for m in models)
        self.nbytes = _LIST_BYTES + sys.getsizeof(models) + strings
        self.long = strings > LONG_LIST_BYTES


class _Shape:
    """One distinct learned shape, held once for every uid of it."""

    __slots__ = ("shape", "refs", "lst")

    def __init__(self, req: GpuRequest, lst: _List) -> None:
        self.shape: Shape = (req, lst.models)
        self.refs = 0
        self.lst = lst


class LearnedUids:
    """uid -> learned shape, interned and bounded (see the module doc)."""

    def __init__(self, max_entries: int = LEARNED_ENTRIES, max_bytes: int = LEARNED_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._uids: OrderedDict[str, _Shape] = OrderedDict()   # least recently used first
        self._long: OrderedDict[str, None] = OrderedDict()     # the uids with a long list, in that order
        self._shapes: dict[Shape, _Shape] = {}
        self._lists: dict[tuple[str, ...], _List] = {}
        self.bytes_used = 0     # the estimate for all of the above
        self.forgotten = 0      # uids forgotten by either bound (not deleted)
        self._warned = False

    def __len__(self) -> int:
        return len(self._uids)

    def use(self) -> BoundUse:
        """What is kept now against the bounds (bytes: the estimate), and the uids forgotten for them."""
        return BoundUse(entries=len(self._uids), max_entries=self.max_entries, bytes=self.bytes_used,
                        max_bytes=self.max_bytes, dropped=self.forgotten)

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids

    def __iter__(self) -> Iterator[str]:
        """The uids, least recently used first."""
        return iter(self._uids)

    def get(self, uid: str) -> Shape | None:
        rec = self._uids.get(uid)
        return rec.shape if rec is not None else None

    def touch(self, uid: str) -> bool:
        """Whether ``uid`` is known; if so it is now the most recently used."""
        if uid not in self._uids:
            return False
        self._uids.move_to_end(uid)
        if uid in self._long:
            self._long.move_to_end(uid)
        return True

    def add(self, uid: str, req: GpuRequest, models: tuple[str, ...] | list[str] = ()) -> bool:
        """Remember ``uid`` as learned with this shape; False (and only a touch) if it was already.
        Then forget the least recently used uids past the bounds (never this one)."""
        if self.touch(uid):
            return False
        rec = self._intern(req, model_list(models))
        rec.refs += 1
        self._uids[uid] = rec
        if rec.lst.long:
            self._long[uid] = None
        self.bytes_used += _UID_BYTES + sys.getsizeof(uid)
        while len(self._uids) > self.max_entries:
            self._drop(next(iter(self._uids)), "entries")
        while self.bytes_used > self.max_bytes and len(self._uids) > 1:
            oldest_long = next(iter(self._long), uid)
            self._drop(oldest_long if oldest_long != uid else next(iter(self._uids)), "bytes")
        return True

    def pop(self, uid: str) -> Shape | None:
        """Forget ``uid`` (the pod is deleted); its shape, or None if it was not known."""
        rec = self._uids.get(uid)
        if rec is None:
            return None
        self._remove(uid)
        return rec.shape

    # ------------------------------------------------------------------------------ inner
    def _intern(self, req: GpuRequest, models: tuple[str, ...]) -> _Shape:
        rec = self._shapes.get((req, models))
        if rec is not None:
            return rec
        lst = self._lists.get(models)
        if lst is None:
            lst = self._lists[models] = _List(models)
            self.bytes_used += lst.nbytes
        lst.refs += 1
        rec = self._shapes[(req, lst.models)] = _Shape(req, lst)
        self.bytes_used += _SHAPE_BYTES
        return rec

    def _remove(self, uid: str) -> None:
        rec = self._uids.pop(uid)
        self._long.pop(uid, None)
        self.bytes_used -= _UID_BYTES + sys.getsizeof(uid)
        rec.refs -= 1
        if rec.refs:
            return
        del self._shapes[rec.shape]
        self.bytes_used -= _SHAPE_BYTES
        lst = rec.lst
        lst.refs -= 1
        if not lst.refs:
            del self._lists[lst.models]
            self.bytes_used -= lst.nbytes

    def _drop(self, uid: str, bound: str) -> None:
        """Forget ``uid`` for a bound (see the module doc for what that costs); said once."""
        self._remove(uid)
        self.forgotten += 1
        if not self._warned:
            self._warned = True
            what = (f"{self.max_entries} pods" if bound == "entries"
                    else f"{self.max_bytes >> 20} MiB (estimated; pods with long GPU model lists go first)")
            log.warning("learned pods: past the bound of %s; the least recently used are forgotten: one "
                        "seen again is learned twice, and its deletion is not counted in the departed "
                        "pods' past (logged once)", what)
