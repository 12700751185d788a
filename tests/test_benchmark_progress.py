"""Benchmark progress bars written to a file are plain lines, not one line of carriage returns."""
from __future__ import annotations

import io

from benchmarks import progress
from benchmarks.progress import progress_bar


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_file_each_redraw_is_a_line_of_its_own(monkeypatch):
    monkeypatch.setattr(progress, "FILE_INTERVAL_S", 0.0)
    out = io.StringIO()
    for _ in progress_bar(range(5), out=out, desc="replays", unit="seed", mininterval=0, position=3):
        pass
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert len(lines) >= 2 and all(line.startswith("replays") for line in lines)
    assert "5/5" in lines[-1]


def test_bar_left_behind_by_leave_false_writes_no_blank_lines():
    out = io.StringIO()
    with progress_bar(total=3, out=out, desc="nodes", leave=False) as bar:
        bar.update(3)
    assert all(line.strip() for line in out.getvalue().splitlines())


def test_on_a_terminal_the_bar_redraws_in_place():
    out = Tty()
    for _ in progress_bar(range(3), out=out, desc="replays", mininterval=0):
        pass
    assert "\r" in out.getvalue()


def test_every_benchmark_help_names_its_defaults():
    """Each option with a default says it in --help (most did not: --jobs, --out, --policies...)."""
    import argparse

    from benchmarks.binpack.cli import build_parser as binpack
    from benchmarks.binpack.real import build_parser as real
    from benchmarks.elastic.cli import build_parser as elastic
    from benchmarks.latency.cli import build_parser as latency

    for build in (binpack, real, elastic, latency):
        parser = build()
        text = parser.format_help()
        for action in parser._actions:
            default = action.default
            if (not action.option_strings or default in (None, False, argparse.SUPPRESS)
                    or isinstance(default, (list, tuple, str)) and not default):
                continue
            helptext = parser._get_formatter()._expand_help(action) if action.help else ""
            assert "default" in helptext, f"{parser.prog} {action.option_strings[0]}: {helptext!r}"
        assert "(default: )" not in text and "(default: None)" not in text
