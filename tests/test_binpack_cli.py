"""The CLI end to end: a --quick smoke run, and a clear non-zero exit when the trace is absent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("STOWAGE_OPENB", ROOT.parent / "shared" / "openb"))


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "benchmarks.binpack", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=110, env={**os.environ, **(env or {})})


def test_missing_trace_exits_nonzero_with_a_pointer(tmp_path):
    r = run("--data-dir", str(tmp_path), "--trace", "default", "--out", str(tmp_path / "o"))
    assert r.returncode != 0
    assert "cluster-trace-gpu-v2023" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.skipif(not (DATA / "openb_pod_list_default.csv").is_file(), reason="openb trace not present")
def test_quick_smoke_run_writes_results(tmp_path):
    out = tmp_path / "o"
    r = run("--quick", "--trace", "default", "--policies", "stowage,fgd,bestfit,random", "--jobs", "1",
            "--out", str(out), "--data-dir", str(DATA))
    assert r.returncode == 0, r.stderr
    assert "stowage" in r.stdout and "runtime per policy" in r.stdout
    doc = json.loads((out / "binpack_results.json").read_text())
    got = {(row["policy"], row["arrived_pct"]): row["alloc_pct"] for row in doc["rows"]}
    assert set(p for p, _ in got) == {"stowage", "fgd", "bestfit", "random"}
    assert all(0 < got[(p, 100)] <= 100 for p in ("stowage", "fgd", "bestfit", "random"))
    assert (out / "binpack_unallocated.png").stat().st_size > 1000
    assert (out / "binpack_results.csv").read_text().startswith("trace,policy,arrived_pct")
