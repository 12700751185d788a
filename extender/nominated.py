"""Pod priorities and nominations, from the extender's pod watch, for the preempt verb and filter.

Why the extender needs them:

- ``preempt`` with ``nodeCacheCapable: true`` gets victims as UIDs only, and must prefer the
  lowest-priority ones: the priority (``spec.priority``) of every pod is kept here by UID.
- After kube-scheduler preempts for a pod it sets the pod's ``status.nominatedNodeName`` and the
  victims terminate. Its own filters then count the nominated pod on that node for every pod of
  lower priority (``RunFilterPluginsWithNominatedPods``); the extender's filter must do the same
  with the cards, or the cards the victims freed could go to a lower-priority pod first.

Bounded by the pods of the cluster (one entry per pod the watch delivered; a deleted pod's entry
goes with it, and a relist drops the rest). Thread-safe: the watch writes, the verbs read.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Iterable, Mapping

from packing.pod_policy import PodPolicy, PolicyError, pod_policy
from packing.preempt import Nominee
from stowage.resources import DEFAULT_MEMORY_UNIT_MIB, RequestError, pod_gpu_request

from .wire import pod_priority

log = logging.getLogger("stowage.extender")


class PodMarks:
    """Every pod's priority by UID, and the pending GPU pods nominated to a node."""

    def __init__(self, memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB,
                 default_policy: PodPolicy | None = None) -> None:
        self.memory_unit_mib = memory_unit_mib
        self.default_policy = default_policy or PodPolicy()
        self._lock = threading.Lock()
        self._priority: dict[str, int] = {}
        self._nominated: dict[str, tuple[str, Nominee]] = {}  # uid -> (node, nominee)

    def note(self, pod: Mapping[str, Any], gone: bool = False) -> None:
        """A pod as the watch delivered it (``gone``: deleted or finished)."""
        m = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
        uid = m.get("uid")
        if not isinstance(uid, str) or not uid:
            return
        if gone:
            with self._lock:
                self._priority.pop(uid, None)
                self._nominated.pop(uid, None)
            return
        prio = pod_priority(pod)
        spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
        status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
        node = status.get("nominatedNodeName")
        nominee = None
        if isinstance(node, str) and node and not spec.get("nodeName") and not m.get("deletionTimestamp"):
            nominee = self._nominee(pod, uid, prio, m)
        with self._lock:
            self._priority[uid] = prio
            if nominee is None:
                self._nominated.pop(uid, None)
            else:
                self._nominated[uid] = (str(node), nominee)

    def _nominee(self, pod: Mapping[str, Any], uid: str, prio: int, m: Mapping[str, Any]) -> Nominee | None:
        try:
            req = pod_gpu_request(pod, self.memory_unit_mib)
            ann = m.get("annotations")
            policy = pod_policy(pod, ann if isinstance(ann, Mapping) else None, self.default_policy)
        except (RequestError, PolicyError, TypeError, ValueError, AttributeError):
            return None  # a pod Stowage cannot place holds nothing
        if not req.is_gpu:
            return None
        return Nominee(uid=uid, name=f"{m.get('namespace') or 'default'}/{m.get('name') or '?'}",
                       priority=prio, req=req, policy=policy)

    def keep_only(self, uids: Iterable[str]) -> None:
        """After a relist: forget pods that are no longer there."""
        keep = set(uids)
        with self._lock:
            for d in (self._priority, self._nominated):
                for uid in [u for u in d if u not in keep]:
                    del d[uid]

    def priority(self, uid: str) -> int | None:
        with self._lock:
            return self._priority.get(uid)

    def priorities(self, uids: Iterable[str]) -> dict[str, int]:
        with self._lock:
            return {u: self._priority[u] for u in uids if u in self._priority}

    def all_priorities(self) -> dict[str, int]:
        with self._lock:
            return dict(self._priority)

    def any_nominated(self) -> bool:
        return bool(self._nominated)

    def nominees(self, node: str, min_priority: int, exclude_uid: str = "") -> list[Nominee]:
        """Pods nominated to ``node`` with priority >= ``min_priority`` (not ``exclude_uid``):
        those kube-scheduler counts on the node for a pod of that priority."""
        with self._lock:
            return [n for u, (nd, n) in self._nominated.items()
                    if nd == node and n.priority >= min_priority and u != exclude_uid]

    def nominated_nodes(self) -> set[str]:
        with self._lock:
            return {nd for nd, _ in self._nominated.values()}
