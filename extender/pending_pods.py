"""The pending pods the Kubernetes feed keeps for bind: packed, and bounded in entries and bytes.

:class:`~extender.kube.KubeFeeder` keeps a copy of each pending pod of Stowage's schedulers
(:func:`~extender.kube_objects.pod_for_bind`) until it is bound or deleted, for two readers:

- bind, for a pod it did not see at filter (``KubeFeeder.get_pod``): without the copy it reads
  the pod with a GET, as it does every other pod;
- the requeue (:mod:`extender.requeue`, ``KubeFeeder.pending_uid``): a pod whose copy is not
  kept is taken for bound or gone and is not requeued when the model gains room; it is retried
  when kube-scheduler retries it by itself (on a cluster event it sees, at the latest when its
  unschedulable queue's 5 minutes are up).

Each copy is bounded (the ``stowage.io/`` policy annotations up to ~20 KiB, at most 129
containers: :data:`~stowage.resources.MAX_CONTAINERS_PER_POD`), but their number is not: a pod
refused before it reaches the extender (a ``nodeSelector`` matching no node) stays pending for
ever, and a pod author can make tens of thousands of them. So:

- **Copies are kept packed** (:func:`pack`: the copy's JSON as bytes, decoded again when read),
  measured with tracemalloc: ~0.6 KiB for an ordinary pod where the parsed copy held ~2.2 KiB,
  ~20 KiB for one with the biggest annotations (about what it held parsed), ~80 KiB with 128
  containers of the longest names and quantities as well (~210 KiB parsed); and the count of
  bytes is what the entries hold, not an estimate. Packing costs ~0.3 us a copy (orjson), less
  than counting a parsed copy's objects would; reading one back ~1 us, on bind's path only.
- **Copies are bounded together** (:data:`PENDING_ENTRIES`, :data:`PENDING_BYTES`). Past either,
  the copy written longest ago goes (a watch event of the pod writes it again, as newest). The
  newest copy always stays, even alone over the bytes. A dropped copy costs only the GET and the
  requeue above. 64 MiB hold ~100,000 small pending pods (one container, one policy annotation:
  ~0.63 KiB each), tens of thousands of bigger ordinary ones, far more than a cluster keeps
  waiting at once; or ~3,300 written with the biggest annotations, ~800 of the biggest copies.

Not thread-safe: :class:`~extender.kube.KubeFeeder` holds its lock around every call.
"""
from __future__ import annotations

import logging
import sys
from collections import OrderedDict
from typing import Any, Iterable, Iterator

import orjson

from .bounds import BoundUse


def _dumps(obj: Any) -> bytes:
    # Copied to bytes of its own length: orjson's answer keeps the buffer it wrote into (4 KiB at
    # least, measured with tracemalloc: ~4.1 KiB kept for an ordinary pod's 0.3 KiB).
    return memoryview(orjson.dumps(obj)).tobytes()


log = logging.getLogger("stowage.extender")

PENDING_ENTRIES = 100_000
PENDING_BYTES = 64 << 20
# What an entry holds besides its bytes, key and uid: its OrderedDict slot and (uid, bytes) tuple
# (tracemalloc ~110 B; rounded up).
_ENTRY_BYTES = 160


def pack(copy: dict) -> bytes | None:
    """``copy`` as compact JSON bytes, which :func:`unpack` reads back equal (same keys in the
    same order, same types: it was decoded from JSON); None if it cannot be (a value JSON has
    no form for, which only a hand-made object holds)."""
    try:
        return _dumps(copy)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return None


def unpack(data: bytes) -> dict:
    return orjson.loads(data)


class PendingPods:
    """namespace/name -> (uid, packed pending pod copy), the one written longest ago first out
    past the bounds (see the module doc)."""

    def __init__(self, max_entries: int = PENDING_ENTRIES, max_bytes: int = PENDING_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._pods: OrderedDict[str, tuple[Any, bytes]] = OrderedDict()   # written longest ago first
        self.bytes_used = 0   # what the entries hold, by sys.getsizeof of their parts
        self.evicted = 0      # copies dropped for a bound (not bound, deleted or unlisted)
        self._warned = False

    def __len__(self) -> int:
        return len(self._pods)

    def use(self) -> BoundUse:
        """What is kept now against the bounds, and the copies dropped for them since start."""
        return BoundUse(entries=len(self._pods), max_entries=self.max_entries, bytes=self.bytes_used,
                        max_bytes=self.max_bytes, dropped=self.evicted)

    def __iter__(self) -> Iterator[str]:
        """The keys, written longest ago first."""
        return iter(self._pods)

    def items(self) -> Iterator[tuple[str, dict]]:
        """(key, copy), written longest ago first."""
        return ((k, unpack(v[1])) for k, v in self._pods.items())

    def get(self, key: str) -> dict | None:
        """The copy kept of ``key`` (a new object each time), or None."""
        got = self._pods.get(key)
        return unpack(got[1]) if got is not None else None

    def packed(self, key: str) -> bytes | None:
        """The packed copy kept of ``key`` (to :func:`unpack` outside the caller's lock), or None."""
        got = self._pods.get(key)
        return got[1] if got is not None else None

    def uid(self, key: str) -> Any:
        """``metadata.uid`` of the copy kept of ``key`` (as the copy holds it), or None."""
        got = self._pods.get(key)
        return got[0] if got is not None else None

    def put(self, key: str, uid: Any, data: bytes) -> None:
        """Keep ``data`` (:func:`pack` of the copy, whose uid is ``uid``) as the newest copy,
        replacing any older one of ``key``; then drop the oldest past the bounds (never this one)."""
        self.pop(key)
        self._pods[key] = (uid, data)
        self.bytes_used += _entry_bytes(key, uid, data)
        while len(self._pods) > 1 and (len(self._pods) > self.max_entries or self.bytes_used > self.max_bytes):
            old_key, (old_uid, old_data) = self._pods.popitem(last=False)
            self.bytes_used -= _entry_bytes(old_key, old_uid, old_data)
            self.evicted += 1
            self._warn()

    def pop(self, key: str) -> None:
        """Forget ``key`` (bound, deleted, or no longer listed)."""
        got = self._pods.pop(key, None)
        if got is not None:
            self.bytes_used -= _entry_bytes(key, *got)

    def keep_only(self, keys: Iterable[str]) -> None:
        """Forget every key not in ``keys`` (a complete list did not write it)."""
        keep = keys if isinstance(keys, (set, frozenset)) else set(keys)
        for key in [k for k in self._pods if k not in keep]:
            self.pop(key)

    def _warn(self) -> None:
        if self._warned:
            return
        self._warned = True
        log.warning("pending pods: past the bound of %d pods or %d MiB kept for bind; the copies written longest "
                    "ago are dropped: such a pod is read with a GET at bind, and is not requeued when the model "
                    "gains room (logged once)", self.max_entries, self.max_bytes >> 20)


def _entry_bytes(key: str, uid: Any, data: bytes) -> int:
    return _ENTRY_BYTES + sys.getsizeof(key) + sys.getsizeof(uid) + sys.getsizeof(data)
