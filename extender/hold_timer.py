"""The thread that ends "bind outcome unknown" holds whose time is up (``ExtenderService._hold_unknown``).

Why a thread: such a hold is released once its Binding can no longer land and the pod still reads
unbound. Filter checks the pod's own hold against the watch's copy of the pending pod, but that
copy is bounded (extender/pending_pods.py) and filter makes no API call; without it, only a bind
of the pod to another node read the pod, and in a cluster with no room elsewhere none comes: the
cards stayed booked for as long as the pod lived. The thread runs the service's sweep
(``ExtenderService.end_lapsed_holds``, which may read a pod with a GET) when the next hold's time
is up, and sleeps while there is none: the normal path never wakes it.
"""
from __future__ import annotations

import logging
from typing import Callable

from .worker import Worker

log = logging.getLogger("stowage.extender")

# After a sweep that failed (a bug: the sweep catches the API's errors itself), the next one.
RETRY_AFTER_ERROR_S = 5.0


class HoldTimer(Worker):
    """Runs ``sweep`` (returning the seconds until it is due again, None: when woken) on its own
    thread; :meth:`wake` when a hold was made, to learn when it is due."""

    thread_name = "stowage-bind-holds"

    def __init__(self, sweep: Callable[[], float | None]) -> None:
        super().__init__()
        self._sweep = sweep

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()   # before the sweep: a hold made during it wakes the wait below
            try:
                wait = self._sweep()
            except Exception:  # noqa: BLE001 - the thread must outlive one bad round
                log.exception("ending lapsed bind holds failed")
                wait = RETRY_AFTER_ERROR_S
            self._wake.wait(wait)
