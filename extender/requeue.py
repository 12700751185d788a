"""Requeue the pods the extender refused everywhere on a model that its watch has since given room.

Why (seen against the real kube-scheduler 1.28, ``tests/integration/test_real_scheduler.py``):
a pod that fits nowhere waits in kube-scheduler's unschedulable queue, and kube-scheduler
retries it on cluster events it sees itself, e.g. the deletion of a pod that held cards. It may
then call ``filter`` before the extender's own watch has delivered that same deletion: the
extender still counts the cards as held, refuses again, and the pod waits for the next cluster
event, up to 5 minutes in a quiet cluster. The extender knows when its model gains room;
kube-scheduler does not know that moment. So the extender tells it, the one way kube-scheduler
listens: an update of a pending pod's metadata moves it out of the unschedulable queue
(``isPodUpdated`` in kube-scheduler's queue), so the pod is tried again against the new model.

Only the pods that can have been refused on a stale view are touched: refused on every candidate
node by a model older than the one that gained room (model generations), within the last
``window_s`` seconds (a refusal older than that was not a retry racing this change), and still
pending (the feeder's cache), with the pod's uid as a precondition; at most ``max_per_round``
pods per round, one round per burst of changes. A refusal made on the new model is kept for the
next change. The annotation carries the time, for people reading the pod.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, NamedTuple

from .kube_post import whole_request
from .worker import Worker

log = logging.getLogger("stowage.extender.requeue")

REQUEUE_ANNOTATION = "stowage.io/requeued-at"


class Refusal(NamedTuple):
    namespace: str
    name: str
    generation: int  # the model's generation the filter answered from
    at: float        # monotonic time of the answer


class Requeuer(Worker):
    """Remembers refused pods; after the model gained room, patches those refused before it.

    ``patch(namespace, name, body)`` is the API call (CoreV1Api.patch_namespaced_pod);
    ``pending(key)`` returns the pending pod's uid, or None once it is bound or gone. Each call
    gets ``patch_timeout_s`` whole (:func:`extender.kube_post.whole_request`; the client of a
    ``KubeBinder`` is bounded so, and the extender's requeuer shares it): the client's own timeout
    is per socket read, and a peer answering a byte at a time held the requeuer, and with it every
    later round, for as long as it liked.
    """

    def __init__(self, patch: Callable[[str, str, dict], Any], pending: Callable[[str], str | None],
                 debounce_s: float = 0.1, window_s: float = 10.0, max_per_round: int = 200,
                 max_tracked: int = 10_000, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], float] = time.time, patch_timeout_s: float = 10.0) -> None:
        super().__init__()
        self.patch_timeout_s = patch_timeout_s
        self._patch = patch
        self._pending = pending
        self.debounce_s = debounce_s
        self.window_s = window_s
        self.max_per_round = max_per_round
        self.max_tracked = max_tracked
        self._clock = clock
        self._now = now
        self._refused: OrderedDict[str, Refusal] = OrderedDict()  # uid -> last refusal, oldest first
        self._freed_generation = -1  # the newest model generation that gained room
        self._lock = threading.Lock()
        self.requeued = 0  # pods patched so far (for tests and logs)

    # --- called by the service and the feeder (cheap: on the scheduler's request path) ---------
    def refused(self, uid: str, namespace: str, name: str, generation: int) -> None:
        """The filter found no node for this pod, answering from the model at ``generation``."""
        if not uid:
            return
        with self._lock:
            self._refused[uid] = Refusal(namespace, name, generation, self._clock())
            self._refused.move_to_end(uid)
            while len(self._refused) > self.max_tracked:
                self._refused.popitem(last=False)

    def cards_freed(self, generation: int) -> None:
        """The model gained room (a pod left, a node came or changed) at ``generation``."""
        with self._lock:
            self._freed_generation = max(self._freed_generation, generation)
        self._wake.set()

    # --- the worker (start, stop: extender/worker.py) ---------------------------------------------
    thread_name = "stowage-requeue"

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            if self._stop.is_set():
                return
            # a burst of departures (a job's pods, a drained node) is one round of patches
            self._stop.wait(self.debounce_s)
            self._wake.clear()
            self.requeue_now()

    def due(self) -> list[tuple[str, Refusal]]:
        """Take the refusals to requeue now (made on a model older than the last room gained,
        within the window, newest first, at most ``max_per_round``); drop expired ones."""
        oldest = self._clock() - self.window_s
        with self._lock:
            freed = self._freed_generation
            for uid in [u for u, r in self._refused.items() if r.at < oldest]:
                del self._refused[uid]
            stale = [(u, r) for u, r in self._refused.items() if r.generation < freed]
            stale.reverse()
            take = stale[: self.max_per_round]
            for uid, _ in take:
                del self._refused[uid]
            if len(stale) > len(take):
                self._wake.set()  # the rest in the next round
        return take

    def requeue_now(self) -> int:
        """Patch the due refused pods that are still pending; returns how many were patched."""
        done = 0
        stamp = f"{self._now():.3f}"
        for uid, r in self.due():
            if self._pending(f"{r.namespace}/{r.name}") != uid:
                continue  # bound, deleted, or re-created meanwhile
            body = {"metadata": {"uid": uid, "annotations": {REQUEUE_ANNOTATION: stamp}}}
            try:
                with whole_request(self.patch_timeout_s):
                    self._patch(r.namespace, r.name, body)
                done += 1
            except Exception as exc:  # noqa: BLE001 - gone (404), re-created (409), API trouble: not again
                log.info("could not requeue pod %s/%s: %s", r.namespace, r.name, getattr(exc, "reason", exc))
        if done:
            log.info("requeued %d pod(s) refused on a model that has gained room since", done)
        self.requeued += done
        return done
