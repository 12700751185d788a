"""Pacing and log-once bookkeeping for something that keeps failing (an NVML wait, a socket to serve).

A node agent retries forever: a failure that returns at once must not be retried at once (that
spins a core and floods the log), and an operator needs the error once, not once per try. Both
agents' loops share this so they back off and log the same way.
"""
from __future__ import annotations

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
