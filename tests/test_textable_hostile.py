"""Operator tables print what node owners and pod authors wrote (model names, pod names): a
100 KB model name once padded every row of its column to 100 KB (90 MB of output for 101
nodes), and terminal escape sequences reached the operator's terminal (review, 2026-12-04)."""
from __future__ import annotations

from stowage.textable import printable, render


def test_one_huge_cell_does_not_widen_every_row():
    rows = [["n%d" % i, "A100", 8] for i in range(100)] + [["evil", "X" * 100_000, 8]]
    out = render(["NODE", "MODEL", "CARDS"], rows)
    assert len(out) < 100 * 200
    assert "X" * 250 + "... (100000 characters)" in out   # cut where no name the API takes is as long


def test_control_characters_are_not_sent_to_the_terminal():
    out = render(["NODE", "MODEL"], [["n1", "A100\x1b[2J\x1b]0;owned\x07\r\n"]])
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert out.count("\n") == 1 and "A100" in out


def test_ordinary_tables_are_unchanged():
    out = render(["A", "BB"], [["x", 1], ["yyy", 22]])
    assert out.splitlines() == ["A    BB", "x     1", "yyy  22"]


def test_a_name_longer_than_any_the_api_takes_is_cut_wherever_it_stands():
    """A Kubernetes name is at most 253 characters, a pod's key (namespace/name) at most 317; a
    longer run came from a hostile or fake source (a 5,000-character node name printed whole,
    10,000-character lines in `stowage plan`). Each run without white space is cut at 317, saying
    how long it was; shorter text is untouched, the longest key the API can make included."""
    name = "n" * 5000
    line = printable(f"fits now on 2 node(s) (gpu-b, {name})")
    assert line == f"fits now on 2 node(s) (gpu-b, {'n' * 314}... (5001 characters)"
    key = f"{'s' * 63}/{'p' * 253}"
    assert printable(key) == key and printable(f"pod {key} x") == f"pod {key} x"
    assert printable("x" * 253) == "x" * 253 and printable(line) == line and printable("a b\x1bc") == "a b?c"
