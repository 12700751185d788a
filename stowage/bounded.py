"""A whole number on the command line that has both ends: a count, a size, a number of seconds.

click's ``IntRange(min=1)`` takes any whole number above its minimum, of any size, and hands it on
(found by experiment, session 15):

- ``stowage extender --timeout 1e400-as-digits`` ended gunicorn's master in an OverflowError
  traceback (it hands each worker ``timeout / 2.0``); ``--timeout 10**30`` let a stuck worker
  hold its requests for ever (gunicorn never found it late);
- ``stowage inspect --simulated --fill 10**30`` never ended (it tried to place every pod);
- ``--max-body-mib 10**30`` took any request body, however large, into memory;
- a text of more than 4,300 digits is refused by ``int()`` (CPython's guard), and click's
  refusal quoted all of it back, one line of 5,000 characters.

:class:`WholeRange` is the click type every int option of ours uses (tests/test_cli_whole_numbers.py
walks every command's int options and refuses an open upper end), as :mod:`stowage.finite` is
for floats: both ends given, and a text too long for any number in the range refused without
being converted, quoted shortened.
"""
from __future__ import annotations

from typing import Any

import click

MAX_QUOTED = 40   # characters of a refused text quoted back


def quoted(text: str) -> str:
    """``text`` as a refusal quotes it: repr, cut to :data:`MAX_QUOTED` characters."""
    return repr(text) if len(text) <= MAX_QUOTED else repr(text[:MAX_QUOTED]) + f"... ({len(text)} characters)"


class WholeRange(click.IntRange):
    """click's ``IntRange`` with both ends required; a text with more digits than either end has
    is out of range without being converted (it may be thousands of digits long)."""

    def __init__(self, minimum: int, maximum: int) -> None:
        super().__init__(min=minimum, max=maximum)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            # a few characters more than the widest end: signs, "_" separators, blanks
            widest = max(len(str(self.min)), len(str(self.max))) + 8
            if len(value.strip()) > widest:
                self.fail(f"{quoted(value)} is not a whole number from {self.min} to {self.max}", param, ctx)
        return super().convert(value, param, ctx)

