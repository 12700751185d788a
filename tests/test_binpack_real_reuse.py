"""``benchmarks.binpack.real --reuse``: runs measured by earlier invocations (other modes, other
seeds) come into one table, each once, never in place of a run made now, never from another
cluster."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.binpack.real import MODE_LABEL, load_reused
from benchmarks.binpack.trace import TraceError

NODES = SimpleNamespace(names=["n1", "n2"], gpus=np.array([8, 4]))


def _doc(path: Path, runs: list[tuple[str, int, float]], trace: str = "default", code: str = "abc123") -> Path:
    rows = [{"seed": s, "mode": MODE_LABEL[m], "alloc_at_100": v, "seconds": 1.0, "failed": 0} for m, s, v in runs]
    doc = {"meta": {"trace": trace, "nodes": 2, "gpus": 12, "date": "2026-12-01 10:00 UTC", "code": code},
           "rows": rows, "runs": [{"mode": m, "seed": s, "curve": [v, None]} for m, s, v in runs]}
    path.write_text(json.dumps(doc))
    return path


def test_first_file_wins_and_runs_made_now_are_never_replaced(tmp_path):
    a = _doc(tmp_path / "a.json", [("stowage", 42, 96.0), ("plain", 42, 80.5)], code="aaa")
    b = _doc(tmp_path / "b.json", [("plain", 42, 11.0), ("plain", 43, 80.1), ("stowage", 43, 1.0)], code="bbb")
    out, meta = load_reused([a, b], {("stowage", 43), ("stowage", 44)}, "default", NODES)
    got = {(r.mode, r.seed): (float(r.curve[0]), r.row["code"]) for r in out}
    assert got == {("stowage", 42): (96.0, "aaa"), ("plain", 42): (80.5, "aaa"), ("plain", 43): (80.1, "bbb")}
    assert np.isnan(out[0].curve[1])
    assert [f["runs"] for f in meta["files"]] == [["plain 42", "stowage 42"], ["plain 43"]]
    assert meta["modes"] == ["plain", "stowage"]


def test_a_file_of_another_trace_or_cluster_is_refused(tmp_path):
    other = _doc(tmp_path / "x.json", [("plain", 42, 80.0)], trace="gpushare40")
    with pytest.raises(TraceError, match="gpushare40"):
        load_reused([other], set(), "default", NODES)
