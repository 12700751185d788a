"""Argparse types the benchmark commands share: a value that cannot make a run is refused by
name while the command line is read, before any cluster, process or replay starts (a ``--jobs 0``
or ``--node-stride 0`` used to start one that could not work)."""
from __future__ import annotations

import argparse
import math
from typing import Callable


def whole_number(minimum: int) -> Callable[[str], int]:
    """A whole number of at least ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least {minimum}, not {text!r}")
        return value
    parse.__name__ = f"whole number >= {minimum}"
    return parse


def positive_number(text: str) -> float:
    """A finite number above 0 (seconds, percentages)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number above 0, not {text!r}")
    return value


def number_list(minimum: int) -> Callable[[str], list[int]]:
    """Comma-separated whole numbers, each at least ``minimum`` ("1000,5000")."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(s) for s in text.split(",") if s.strip()]
        except ValueError:
            values = []
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(
                f"must be comma-separated whole numbers of at least {minimum} (e.g. 1000,5000), not {text!r}")
        return values
    parse.__name__ = "number list"
    return parse


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` for the benchmark commands: descriptions and epilogs as written, and every option
    with a default says it (``(default: 600)``) unless its help already names one; flags (off by
    default) and options whose default is "none given" say nothing."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        nothing = default is None or default is False or default == argparse.SUPPRESS or (
            isinstance(default, (str, list, tuple)) and not default)
        if not action.option_strings or nothing or "default" in text or isinstance(action, argparse._StoreConstAction):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, (tuple, list)) else "%(default)s"
        return f"{text} (default: {shown})"
