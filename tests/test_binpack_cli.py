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


@pytest.mark.skipif(not (DATA / "openb_pod_list_default.csv").is_file(), reason="openb trace not present")
def test_runs_store_resumes_and_replays_only_what_is_missing(tmp_path):
    """--runs keeps each seed; a second run reuses them (same figures, commit named) and replays
    only a policy whose stored runs were deleted."""
    runs = tmp_path / "runs"
    common = ("--quick", "--trace", "default", "--policies", "bestfit,random", "--jobs", "1",
              "--data-dir", str(DATA), "--runs", str(runs))
    first = run(*common, "--out", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr
    stored = sorted(p.relative_to(runs).as_posix() for p in runs.rglob("*.npz"))
    assert stored == ["default@stride6/bestfit/seed42.npz", "default@stride6/random/seed42.npz"]
    a = json.loads((tmp_path / "a" / "binpack_results.json").read_text())
    assert a["meta"]["reused_runs"] == {}

    for p in runs.glob("*/random"):
        for f in p.iterdir():
            f.unlink()
    second = run(*common, "--out", str(tmp_path / "b"))
    assert second.returncode == 0, second.stderr
    assert "reusing 1 stored runs" in second.stderr
    b = json.loads((tmp_path / "b" / "binpack_results.json").read_text())
    assert list(b["meta"]["reused_runs"]) == ["bestfit"]
    assert b["meta"]["reused_runs"]["bestfit"] == [a["meta"]["code"]]
    def figures(doc):  # everything but the replay's wall time
        return [{k: v for k, v in row.items() if k != "seconds"} for row in doc["rows"]]
    # the replayed policy reproduces itself; the reused one is the stored one, wall time included
    assert figures(b) == figures(a)
    assert [r["seconds"] for r in b["rows"] if r["policy"] == "bestfit"] == \
        [r["seconds"] for r in a["rows"] if r["policy"] == "bestfit"]
    assert (runs / "default@stride6" / "random" / "seed42.npz").is_file()


@pytest.mark.skipif(not (DATA / "openb_pod_list_default.csv").is_file(), reason="openb trace not present")
def test_quick_keeps_the_seeds_asked_for_and_logs_progress_as_lines(tmp_path):
    """--quick --seeds 43 replays seed 43 (it silently replayed 42); progress in a file is lines."""
    runs = tmp_path / "runs"
    r = run("--quick", "--seeds", "43", "--trace", "default", "--policies", "random", "--jobs", "1",
            "--data-dir", str(DATA), "--runs", str(runs), "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in runs.rglob("*.npz")) == ["seed43.npz"]
    assert "\r" not in r.stderr and "replays" in r.stderr
