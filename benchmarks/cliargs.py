"""Argparse types the benchmark commands share: a value that cannot make a run is refused by
name while the command line is read, before any cluster, process or replay starts (a ``--jobs 0``
or ``--node-stride 0`` used to start one that could not work).

Every check of the command line alone is made by the parser (a type, or :class:`CheckedParser`
for a check of several options together), none after it: tests/test_doc_commands.py checks each
command line the docs quote with the parser alone, so a check made later in ``main`` would let a
documented line that the command refuses pass."""
from __future__ import annotations

import argparse
from typing import Callable, Iterable, Sequence

from stowage.bounded import quoted
from stowage.finite import finite_number

# The most worker processes (--jobs) a benchmark starts: each is a process (binpack.real's, a
# control plane); ``--jobs 10**30`` made a pool of that many and never started.
MAX_JOBS = 256
MAX_NODES = 100_000        # a simulated cluster's most nodes (extender.simcluster.MAX_NODES)
MAX_PODS = 10_000_000      # pods a run schedules or replays


def _whole(text: str, maximum: int) -> int | None:
    """``text`` as an int, or None: a text longer than ``maximum``'s digits (and a sign) is not
    converted (``int()`` refuses more than 4,300 digits; a huge number is out of range anyway)."""
    if len(text.strip()) > len(str(maximum)) + 8:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def whole_number(minimum: int, maximum: int) -> Callable[[str], int]:
    """A whole number from ``minimum`` to ``maximum`` (both ends: a count of any size went on to
    make a pool, a cluster or a replay of that size)."""
    def parse(text: str) -> int:
        value = _whole(text, maximum)
        if value is None or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be a whole number from {minimum} to {maximum}, not {quoted(text)}")
        return value
    parse.__name__ = f"whole number {minimum}..{maximum}"
    parse.whole_numbers = True   # type: ignore[attr-defined]  # tests/test_cli_whole_numbers.py walks these
    return parse


def positive_number(text: str) -> float:
    """A finite number above 0 (seconds, percentages)."""
    try:
        value = finite_number(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number above 0, not {text!r}")
    return value


def number_at_least(minimum: float) -> Callable[[str], float]:
    """A finite number of at least ``minimum`` (a tolerance, a window in seconds, a rate where 0
    means off): ``nan`` passed ``type=float`` and made every comparison with it false."""
    def parse(text: str) -> float:
        try:
            value = finite_number(text)
        except ValueError:
            value = minimum - 1
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"must be a finite number of at least {minimum:g}, not {text!r}")
        return value
    parse.__name__ = f"number >= {minimum:g}"
    return parse


def number_list(minimum: int, maximum: int, example: str = "1000,5000") -> Callable[[str], list[int]]:
    """Comma-separated whole numbers, each from ``minimum`` to ``maximum`` ("1000,5000")."""
    def parse(text: str) -> list[int]:
        values = [_whole(s, maximum) for s in text.split(",") if s.strip()]
        if not values or any(v is None or not minimum <= v <= maximum for v in values):
            raise argparse.ArgumentTypeError(f"must be comma-separated whole numbers from {minimum} to {maximum} "
                                             f"(e.g. {example}), not {quoted(text)}")
        return values  # type: ignore[return-value]  # none is None (checked above)
    parse.__name__ = "number list"
    parse.whole_numbers = True   # type: ignore[attr-defined]
    return parse


def name_list(known: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """Comma-separated names, each one of ``known`` ("stowage,fgd"): a misspelt one is refused by
    name while parsing, not after the traces are loaded or a control plane started."""
    names = tuple(known)

    def parse(text: str) -> list[str]:
        given = [s.strip() for s in text.split(",") if s.strip()]
        unknown = [g for g in given if g not in names]
        if unknown or not given:
            said = ", ".join(map(repr, unknown or [text]))
            raise argparse.ArgumentTypeError(f"unknown {what} {said} (known: {', '.join(sorted(names))})")
        return given
    parse.__name__ = f"{what} list"
    return parse


def one_name(known: Iterable[str], what: str) -> Callable[[str], str]:
    """One of ``known``; refused by name as :func:`name_list` refuses one of a list."""
    names = name_list(known, what)

    def parse(text: str) -> str:
        if "," in text:
            raise argparse.ArgumentTypeError(f"one {what}, not a list: {text!r}")
        return names(text)[0]
    parse.__name__ = what
    return parse


FIRST_SEED = 42   # a count of seeds starts here; a number from here up is one seed


def parse_seeds(text: str) -> tuple[int, ...]:
    """"10" = the first ten seeds from 42; "42" (any number from 42 up) = that one seed, in
    every benchmark command (binpack, binpack.real, binpack.bound, elastic); "42,43" or "42-45" = those seeds."""
    text = text.strip()
    try:
        if "," in text:
            seeds = tuple(int(x) for x in text.split(",") if x.strip())
        elif "-" in text[1:]:
            lo, hi = (int(x) for x in text.split("-", 1))
            seeds = tuple(range(lo, hi + 1))
        else:
            n = int(text)
            seeds = (n,) if n >= FIRST_SEED else tuple(range(FIRST_SEED, FIRST_SEED + n))
    except ValueError:
        seeds = ()
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"bad --seeds {text!r} (e.g. 10, 42, 42,43 or 42-51)")
    return seeds


Check = Callable[[argparse.Namespace], "str | None"]


class CheckedParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that also makes the checks no single option's type can make (one
    option needs another: ``--no-replay`` needs a burst), while parsing: each of ``checks`` takes
    the parsed arguments and returns why they cannot make a run, or None. A refusal is argparse's
    own (usage, the message, exit 2), as for a bad value."""

    def __init__(self, *args: object, checks: Sequence[Check] = (), **kwargs: object) -> None:
        super().__init__(*args, **kwargs)   # type: ignore[arg-type]
        self.checks = tuple(checks)

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, rest = super().parse_known_args(args, namespace)
        for check in self.checks:
            why = check(parsed)
            if why:
                self.error(why)
        return parsed, rest


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
