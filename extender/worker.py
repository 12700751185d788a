"""A daemon thread that runs until stopped and can be woken: what the extender's background
workers (the requeue: extender/requeue.py; the bind hold timer: extender/hold_timer.py) share, so
that starting, waking and stopping them is written once."""
from __future__ import annotations

import abc
import threading
from typing import TypeVar

W = TypeVar("W", bound="Worker")


class Worker(abc.ABC):
    """Runs :meth:`_run` on a daemon thread named :attr:`thread_name` between :meth:`start` and
    :meth:`stop`; :meth:`_run` waits on ``self._wake`` and returns once ``self._stop`` is set."""

    thread_name = "stowage-worker"

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self: W) -> W:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)

    @abc.abstractmethod
    def _run(self) -> None:
        """The thread's loop (each worker's own)."""
