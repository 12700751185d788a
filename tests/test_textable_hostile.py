"""Operator tables print what node owners and pod authors wrote (model names, pod names): a
100 KB model name once padded every row of its column to 100 KB (90 MB of output for 101
nodes), and terminal escape sequences reached the operator's terminal (review, 2026-12-04)."""
from __future__ import annotations

from stowage.textable import render


def test_one_huge_cell_does_not_widen_every_row():
    rows = [["n%d" % i, "A100", 8] for i in range(100)] + [["evil", "X" * 100_000, 8]]
    out = render(["NODE", "MODEL", "CARDS"], rows)
    assert len(out) < 100_000 + 100 * 200
    assert "X" * 100_000 in out          # nothing is cut: the long cell overflows its own line


def test_control_characters_are_not_sent_to_the_terminal():
    out = render(["NODE", "MODEL"], [["n1", "A100\x1b[2J\x1b]0;owned\x07\r\n"]])
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert out.count("\n") == 1 and "A100" in out


def test_ordinary_tables_are_unchanged():
    out = render(["A", "BB"], [["x", 1], ["yyy", 22]])
    assert out.splitlines() == ["A    BB", "x     1", "yyy  22"]
