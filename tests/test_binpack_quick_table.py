"""`python -m benchmarks.binpack --quick` replays every 6th node of the cluster: its figures are
not the paper's experiment, so the paper's published figures are not set beside them (first-hour
review: the table invited exactly that comparison)."""
from __future__ import annotations

import csv

import pytest

from benchmarks.binpack.cli import main
from tiny_trace import write_trace

PUBLISHED = 12.34   # a figure no replay of this cluster gives


@pytest.fixture
def data(tmp_path):
    """A 12-node trace (2 nodes under --quick) and a published figure for fgd at every point."""
    d = write_trace(tmp_path / "data", nodes=12, pods=60, gpu_milli=500)
    (d / "published_fgd_results.csv").write_text(
        "workload,policy,arrived_pct,alloc_median\n"
        + "".join(f"default,06-FGD,{pct},{PUBLISHED}\n" for pct in (90, 95, 100, 110, 120, 130)))
    return d


def run(data, out, capsys, *flags: str) -> str:
    assert main(["--data-dir", str(data), "--trace", "default", "--policies", "fgd", "--seeds", "42",
                 "--jobs", "1", "--out", str(out), *flags]) == 0
    return capsys.readouterr().out


def test_quick_leaves_the_published_figures_out_and_says_why(data, tmp_path, capsys):
    text = run(data, tmp_path / "q", capsys, "--quick")
    assert f"{PUBLISHED:6.2f}" not in text
    assert "[published]" not in text and "not comparable" in text and "every 6th node" in text
    with (tmp_path / "q" / "binpack_results.csv").open() as fh:
        assert {r["published_alloc_pct"] for r in csv.DictReader(fh)} == {""}


def test_a_full_run_shows_them(data, tmp_path, capsys):
    text = run(data, tmp_path / "f", capsys)
    assert "[published]" in text and f"[{PUBLISHED:6.2f}]" in text
