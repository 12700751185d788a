"""A number on the command line that is a number: finite, never ``nan`` or ``inf``.

Python's ``float()`` reads ``nan``, ``inf``, ``-infinity`` and ``1e999`` (inf), and click's
``FloatRange`` lets ``nan`` through every bound (``nan < 1`` and ``nan > 3600`` are both false)
and ``inf`` through a range with no upper end. Every comparison with ``nan`` is false, so a
``nan`` number of seconds is a timeout that never fires, a staleness never seen, a reading cached
for ever; ``inf`` seconds crash the first ``Event.wait`` with an OverflowError (the device
plugin's reconciler thread died of ``--reconcile-interval-seconds inf``). Each command line
refused them on its own, or not at all (found by experiment, session 14).

:func:`finite_number` is the one reading of such a text; :class:`FiniteRange` is the click type
every float option of ours uses (tests/test_cli_finite_numbers.py walks every command's float
options and refuses any other), and ``benchmarks/cliargs.py`` builds its argparse types on
:func:`finite_number`.
"""
from __future__ import annotations

import math
from typing import Any

import click

NOT_FINITE = "is not a finite number (nan and inf are refused)"


def finite_number(text: Any) -> float:
    """``text`` (a string or a number) as a finite float; ValueError, with a message naming it,
    for anything else (``nan``, ``inf``, ``1e999``, ``abc``)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} {NOT_FINITE}")
    return value


class FiniteRange(click.FloatRange):
    """click's ``FloatRange`` that refuses ``nan``, ``inf`` and ``-inf`` (and ``1e999``) with
    one clear line naming the option, whatever the bounds (an env-var default goes through it
    too: click converts those with the option's type)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = finite_number(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return super().convert(number, param, ctx)


def seconds(minimum: float = 0.0, maximum: float | None = None, *, min_open: bool = False) -> FiniteRange:
    """The type of an option that is a number of seconds: finite, ``minimum`` (0) or more,
    at most ``maximum`` when given."""
    return FiniteRange(min=minimum, max=maximum, min_open=min_open)
