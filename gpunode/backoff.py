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
