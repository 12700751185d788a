"""`--seeds` means one thing in every benchmark command (first-hour review): binpack and
binpack.real read `42` as the seed 42 and `3` as three seeds from 42, but binpack.bound read any
number as a count (`--seeds 42`: 42 seeds, ~25 s each with --lp) and elastic only took a list
(`--seeds 3`: the seed 3, where binpack runs three)."""
from __future__ import annotations

import pytest

from benchmarks.binpack import bound
from benchmarks.elastic import cli as elastic_cli


@pytest.mark.parametrize("build", [bound.build_parser, elastic_cli.build_parser], ids=["bound", "elastic"])
@pytest.mark.parametrize("text, seeds", [("42", (42,)), ("3", (42, 43, 44)), ("42-44", (42, 43, 44)),
                                         ("42,45", (42, 45))])
def test_seeds_read_as_binpack_reads_them(build, text, seeds):
    assert tuple(build().parse_args(["--seeds", text]).seeds) == seeds


@pytest.mark.parametrize("build", [bound.build_parser, elastic_cli.build_parser], ids=["bound", "elastic"])
def test_a_bad_seeds_value_is_refused_while_parsing(build, capsys):
    with pytest.raises(SystemExit) as exc:
        build().parse_args(["--seeds", "0"])
    assert exc.value.code == 2 and "--seeds" in capsys.readouterr().err
