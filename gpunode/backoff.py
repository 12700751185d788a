"""Pacing and log-once bookkeeping for something that keeps failing (an NVML wait, a socket to serve).

A node agent retries forever: a failure that returns at once must not be retried at once (that
spins a core and floods the log), and an operator needs the error once, not once per try. Both
agents' loops share this so they back off and log the same way.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Backoff:
    """Exponential delay between tries (``first_s`` doubling up to ``max_s``), reset by a success."""

    first_s: float = 0.1
    max_s: float = 5.0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    failures: int = 0          # in a row, since the last success
    retry_at: float = 0.0      # clock() time before which the next try should not start
    last_error: str = ""       # the error last reported loudly

    @property
    def failing(self) -> bool:
        return self.failures > 0

    def failed(self, error: str) -> tuple[float, bool]:
        """Count a failure: ``(delay before the next try, whether error differs from the last one
        reported)`` -- a caller logs a new error as a warning and repeats at debug level."""
        self.failures += 1
        delay = min(self.max_s, self.first_s * 2 ** (self.failures - 1))
        self.retry_at = self.clock() + delay
        new, self.last_error = error != self.last_error, error
        return delay, new

    def wait_left(self) -> float:
        """Seconds until the next try is due (0 when not failing)."""
        return max(0.0, self.retry_at - self.clock()) if self.failures else 0.0

    def succeeded(self) -> int:
        """Reset after a success; returns how many failures in a row it ends (0: none, nothing to log)."""
        n, self.failures, self.retry_at, self.last_error = self.failures, 0, 0.0, ""
        return n


class RoundGuard:
    """The rounds of an agent's background loop, any of which may raise (a bug, or NVML failing
    in a way nothing above expected). Uncaught, such a raise ended the thread silently: the
    device plugin's health thread, the exporter's XID watcher. Each raise is logged, the first of
    its kind at error with its traceback and the same again at debug, and the loop goes on after
    :meth:`failed`'s delay; the first round that works again is said once."""

    def __init__(self, what: str, log: logging.Logger, backoff: Backoff | None = None) -> None:
        self.what, self.log = what, log
        self.backoff = backoff if backoff is not None else Backoff(0.1, 5.0)

    def failed(self, exc: BaseException) -> float:
        """Count and log a round that raised ``exc``; the seconds to wait before the next round."""
        delay, new = self.backoff.failed(f"{type(exc).__name__}: {exc}")
        self.log.log(logging.ERROR if new else logging.DEBUG, "a round of the %s failed (%d in a row); going on "
                     "in %.1f s (the same failure again is logged at debug)", self.what, self.backoff.failures,
                     delay, exc_info=exc)
        return delay

    def succeeded(self) -> None:
        """A round worked: said once after failures."""
        if self.backoff.succeeded():
            self.log.warning("the %s's rounds work again", self.what)


class Heartbeat:
    """Whether an agent's background loop still finishes rounds, for a loop whose calls have no
    deadline: the NVML event wait (``nvmlEventSetWait``) and the event set's making return at once
    or after the wait's timeout but in a driver fault, and a worker thread per wait (every second)
    would cost more than the fault it guards against. Such a call that never returns stops the
    loop silently; whoever serves what the loop watches asks :meth:`stalled` and says the truth
    (the device plugin's health thread: every card Unhealthy; the exporter's XID watcher: its cards
    blind) until the loop goes on.

    The loop says which call it is about to make (:attr:`doing`) and calls :meth:`beat` after each
    round; :meth:`stalled` is asked from another thread, and logs the stall once (an error naming
    the call) and its end once. The loop only writes two attributes, so neither side takes a lock.
    """

    def __init__(self, what: str, limit_s: float, log: logging.Logger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.limit_s, self.log, self.clock = what, limit_s, log, clock
        self.last = clock()           # when the loop last finished a round (or started)
        self.doing = "starting"       # the call it is in, said when it stalls
        self.stalled_in = ""          # what it was in when last seen stalled
        self._stalled_at: float | None = None   # ``last`` when the stall was seen; None: not stalled

    def beat(self) -> None:
        """The loop finished a round."""
        self.last = self.clock()

    def stalled(self, consequence: str = "") -> bool:
        """Whether the loop has finished no round for ``limit_s`` and none since; ``consequence``
        (what is served meanwhile) goes into the one error line that says so."""
        last = self.last
        if self._stalled_at is not None:
            if last <= self._stalled_at:
                return True
            self.log.warning("the %s goes on again, after %.0f s stalled in %s; what it watches is its own again",
                             self.what, last - self._stalled_at, self.stalled_in)
            self._stalled_at = None
        if self.clock() - last < self.limit_s:
            return False
        self._stalled_at, self.stalled_in = last, self.doing
        self.log.error("the %s has finished no round for %g s: it is stuck in %s (NVML does not return; a card may "
                       "have fallen off the bus).%s", self.what, self.limit_s, self.stalled_in,
                       f" {consequence}" if consequence else "")
        return True
