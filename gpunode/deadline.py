"""NVML calls that may never return, run with a deadline and at most one stuck worker per key.

NVML is a C library: a call about a card that fell off the bus can block in the driver for
minutes or for ever, and no Python code can interrupt it. Made on an agent's health thread, such a
call stopped the thread for good: no further XID was read, no other card could be marked
Unhealthy, and nothing was logged. :class:`DeadlineCalls` makes each call on a worker thread and
waits for it at most ``deadline_s``; a call past its deadline is answered :class:`Stuck` and left
to finish on its own (ctypes releases the GIL while the C call blocks, so it costs one idle
thread). While it is stuck, no second worker is started for its key: the caller gets
``Stuck`` at once, so a call that never returns costs one thread per key, never one per round.
Once it does return, the next :meth:`DeadlineCalls.run` for the key hands back that late answer
(a read that took long is still a read, and e.g. a late card read must not be lost) and the
following one calls afresh.

Kept free of NVML so it is testable with plain callables.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Hashable, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Stuck:
    """A call that did not return within its deadline, and has not returned since.

    ``new``: this run is the one that saw it pass its deadline (so the caller says so once).
    ``waited_s``: how long it has been running.
    """

    new: bool
    waited_s: float


@dataclass
class _Call(Generic[T]):
    started: float
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None

    def answer(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class DeadlineCalls:
    """Run calls on worker threads, each waited for at most ``deadline_s``; at most one per key at a time.

    Not thread-safe: one caller (an agent's health thread) makes all the runs.
    """

    def __init__(self, deadline_s: float, name: str = "nvml-call",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.deadline_s, self.name, self.clock = deadline_s, name, clock
        self._stuck: dict[Hashable, _Call[Any]] = {}   # key -> its call past the deadline (maybe returned since)

    def busy(self, key: Hashable) -> bool:
        """Whether ``key``'s call is still running past its deadline (what it touches is still in use)."""
        c = self._stuck.get(key)
        return c is not None and not c.done.is_set()

    def answered(self, key: Hashable) -> bool:
        """Whether ``key``'s call that passed its deadline has returned since: the next run hands its answer back."""
        c = self._stuck.get(key)
        return c is not None and c.done.is_set()

    def stuck(self) -> list[Hashable]:
        """The keys whose calls are running past their deadline now."""
        return [k for k in self._stuck if self.busy(k)]

    def run(self, calls: dict[Hashable, Callable[[], T]]) -> dict[Hashable, T | Stuck]:
        """Make every call (concurrently); ``{key: its answer, or Stuck}`` within one deadline for all.

        A key whose earlier call is still stuck is answered ``Stuck`` without a new call; one whose
        stuck call has returned since is answered what it returned. A call that raised re-raises here,
        after every call was waited for (the first such error; the others' answers are lost with it,
        as they were when the calls were made one after another).
        """
        now = self.clock()
        out: dict[Hashable, T | Stuck] = {}
        started: dict[Hashable, _Call[T]] = {}
        error: BaseException | None = None
        for key, fn in calls.items():
            old = self._stuck.get(key)
            if old is not None:
                if not old.done.is_set():
                    out[key] = Stuck(new=False, waited_s=now - old.started)
                    continue
                del self._stuck[key]
                try:
                    out[key] = old.answer()
                except BaseException as exc:   # noqa: BLE001 -- raised below, as a call made now would
                    error = error or exc
                continue
            started[key] = self._start(key, fn, now)
        deadline = now + self.deadline_s
        for key, c in started.items():
            if not c.done.wait(max(0.0, deadline - self.clock())):
                self._stuck[key] = c
                out[key] = Stuck(new=True, waited_s=self.clock() - c.started)
                continue
            try:
                out[key] = c.answer()
            except BaseException as exc:   # noqa: BLE001
                error = error or exc
        if error is not None:
            raise error
        return out

    def _start(self, key: Hashable, fn: Callable[[], T], now: float) -> _Call[T]:
        c: _Call[T] = _Call(started=now)

        def work() -> None:
            try:
                c.value = fn()
            except BaseException as exc:   # noqa: BLE001 -- handed to the caller
                c.error = exc
            finally:
                c.done.set()
        threading.Thread(target=work, name=f"{self.name}-{key}", daemon=True).start()
        return c
