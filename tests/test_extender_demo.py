"""`stowage demo` end to end: starts the extender under gunicorn and schedules a workload."""
from __future__ import annotations

import re
import tempfile

import pytest
from click.testing import CliRunner

from extender.demo import make_workload
from stowage.cli import main


@pytest.fixture(autouse=True)
def _logs_in_tmp(tmp_path, monkeypatch):
    """The demo keeps the extender's log in the temp dir: make that the test's own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_demo_runs_and_reports():
    res = CliRunner().invoke(main, ["demo", "--pods", "40", "--seed", "3"])
    assert res.exit_code == 0, res.output
    out = res.output
    lines = [ln for ln in out.splitlines() if ln.startswith("demo/")]
    assert len(lines) == 40
    placed = [ln for ln in lines if " -> " in ln]
    m = re.search(r"pods placed\s+(\d+)/40", out)
    assert m and int(m.group(1)) == len(placed) and len(placed) > 30
    # The typo'd pod (the middle one) is refused with the clear per-pod message.
    assert any("not scheduled" in ln and "unknown value 'tightest'" in ln for ln in lines)
    for ln in placed:  # "-> node cards 0,1": the card count matches what the pod asked for
        wanted = re.search(r"(\d+) whole GPU", ln)
        cards = re.search(r"-> \S+ cards? ([\d,]+)", ln).group(1).split(",")
        assert len(cards) == (int(wanted.group(1)) if wanted else 1)
    table = [ln for ln in out.splitlines() if re.match(r"^(h100|a100|a10|l4|t4|v100)-", ln)]
    assert len(table) == 36
    assert "Extender stopped (exit code 0)" in out


def test_demo_full_nodes_mode_quiet():
    res = CliRunner().invoke(main, ["demo", "--pods", "20", "--full-nodes", "--quiet"])
    assert res.exit_code == 0, res.output
    assert "full Node objects" in res.output and re.search(r"pods placed\s+\d+/20", res.output)
    assert not any(ln.startswith("demo/") for ln in res.output.splitlines())


def test_demo_bad_cluster_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("nodes: 3\n")
    res = CliRunner().invoke(main, ["demo", "--cluster", str(p)])
    assert res.exit_code != 0 and "'nodes' must be a non-empty list" in res.output


def test_workload_is_deterministic_and_mixed():
    a, b = make_workload(100, 7), make_workload(100, 7)
    assert [p.obj for p in a] == [p.obj for p in b]
    limits = [p.obj["spec"]["containers"][0]["resources"]["limits"] for p in a]
    assert any("nvidia.com/gpu" in lim for lim in limits) and any("nvidia.com/gpu-memory" in lim for lim in limits)
    assert any("nvidia.com/gpu-core" in lim for lim in limits)
    assert len({p.uid for p in a}) == 100
