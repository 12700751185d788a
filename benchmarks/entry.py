"""How a benchmark command starts and stops: Ctrl-C ends it with one line, not tracebacks.

A benchmark runs for minutes to hours, and Ctrl-C is how people stop one. Python's default turns
it into a KeyboardInterrupt traceback in the parent and, since a terminal sends SIGINT to the
whole process group, one more in every pool worker ("Process ForkPoolWorker-1: ..."). The pool's
``with`` block already terminates the workers when the parent leaves it, so the workers ignore
SIGINT (:func:`worker_pool`) and the parent says in one line that it stopped (:func:`run_command`).
Subprocesses a benchmark starts (gunicorn, a control plane) get the same SIGINT and stop on their
own; the commands' ``finally`` blocks still run, as before.
"""
from __future__ import annotations

import multiprocessing as mp
import multiprocessing.pool
import signal
import sys
from typing import Any, Callable, NoReturn

INTERRUPTED_STATUS = 130   # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C


NOT_WRITTEN = "no results written (they are written at the end)"


def run_command(main: Callable[[], "int | None"], prog: str, note: str = "") -> NoReturn:
    """``sys.exit(main())``, with Ctrl-C reported as one line and exit status 130.

    ``note`` says what an interrupted run leaves (:data:`NOT_WRITTEN` for the commands that
    write their results at the end; nothing for those that print as they go)."""
    try:
        status = main()
    except KeyboardInterrupt as exc:
        how, status = interruption(exc)
        print(f"\n{prog}: interrupted ({how}){'; ' + note if note else ''}", file=sys.stderr, flush=True)
        sys.exit(status)
    sys.exit(status)


def interruption(exc: KeyboardInterrupt) -> tuple[str, int]:
    """(what stopped the command, its exit status): Ctrl-C and 130, or the signal a command
    turned into a KeyboardInterrupt (``KeyboardInterrupt(signal.SIGTERM)``: each run's clean-up
    unwinds the same way) by name and 128 + its number, as a shell reports it."""
    sig = exc.args[0] if exc.args else None
    if isinstance(sig, signal.Signals):
        return sig.name, 128 + sig.value
    return "Ctrl-C", INTERRUPTED_STATUS


def ignore_sigint(initializer: Callable[..., Any] | None = None, initargs: tuple = ()) -> None:
    """Pool initializer: a worker leaves Ctrl-C to the parent, which stops the pool; then the
    pool's own ``initializer(*initargs)``, if it has one."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)


def worker_pool(processes: int, method: str = "fork", initializer: Callable[..., Any] | None = None,
                initargs: tuple = (), **kwargs: Any) -> multiprocessing.pool.Pool:
    """A process pool whose workers ignore Ctrl-C (:func:`ignore_sigint`), then run
    ``initializer(*initargs)`` if given: a pool with set-up of its own leaves Ctrl-C to the parent
    too (binpack.real's, passed to ``Pool`` itself, once replaced this one). Use it in a ``with``."""
    return mp.get_context(method).Pool(processes, initializer=ignore_sigint, initargs=(initializer, initargs),
                                       **kwargs)
