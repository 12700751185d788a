"""Progress bars for the benchmark commands, readable wherever standard error goes.

On a terminal this is tqdm's bar, redrawn in place. In a file or a pipe (a CI log, ``2> run.log``)
tqdm's redraws are carriage returns: the whole run's progress ends up as one line thousands of
characters long that ``less`` shows as ``^M`` soup. There the same bar is written as a plain line
at most every ``FILE_INTERVAL_S`` seconds (and once at the end), so a log says how far a long run
got and when.
"""
from __future__ import annotations

import sys
from typing import Any, Iterable, TextIO

from tqdm import tqdm

FILE_INTERVAL_S = 30.0   # a line in a log file at most this often


class LineWriter:
    """A file for tqdm that turns each redraw into one line of its own (blank redraws dropped)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:
            self.out.write(line + "\n")

    def flush(self) -> None:
        self.out.flush()


def progress_bar(iterable: Iterable[Any] | None = None, *, out: TextIO | None = None, **kwargs: Any) -> tqdm:
    """``tqdm(iterable, **kwargs)`` on a terminal; plain lines every ``FILE_INTERVAL_S`` elsewhere."""
    out = out if out is not None else sys.stderr
    if getattr(out, "isatty", lambda: False)():
        return tqdm(iterable, file=out, **kwargs)
    kwargs.pop("position", None)      # cursor movement between lines means nothing in a file
    kwargs.setdefault("mininterval", FILE_INTERVAL_S)
    return tqdm(iterable, file=LineWriter(out), ascii=True, ncols=100, **kwargs)
