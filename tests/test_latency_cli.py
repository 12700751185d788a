"""`python -m benchmarks.latency --quick`: the benchmark runs end to end (real gunicorn servers,
real HTTP clients) and writes a consistent table, CSV and JSON. No timing is asserted."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.latency import cluster
from benchmarks.latency.client import Workload
from extender.simcluster import parse_cluster
from extender.wire import parse_extender_args

REPO = Path(__file__).resolve().parents[1]


def test_cluster_file_and_bodies_match_what_the_extender_loads():
    doc = cluster.cluster_doc(37)
    sim = parse_cluster(doc, "t")
    assert [n.name for n in sim.nodes] == cluster.node_names(37)
    assert sim.card_count == 37 * 8 and len({c.model for n in sim.nodes for c in n.cards}) == 5
    plan = cluster.prefill_plan(37, seed=1)
    assert len({node for node, _ in plan}) == 37 // 2
    items = cluster.node_items(5)
    w = Workload("127.0.0.1", 1, cluster.pods(2, seed=3), cluster.node_names(5), items)
    full = parse_extender_args(w.args_body(0, None))
    assert full.node_names is None and full.names == cluster.node_names(5)
    assert full.nodes[0]["metadata"]["annotations"]["stowage.io/gpu-inventory"]
    names = parse_extender_args(Workload("h", 1, w.pods, w.names).args_body(1, ["a10-00001"]))
    assert names.nodes is None and names.names == ["a10-00001"] and names.pod == w.pods[1]


def test_quick_run_writes_table_csv_and_json(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.latency", "--quick", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "filter p50/p99 ms" in proc.stdout and "Model memory for" in proc.stdout
    doc = json.loads((out / "latency.json").read_text())
    rows = {(r["variant"], r["mode"], r["workers"]): r for r in doc["results"]}
    # Both serving layouts: one process (1 worker) and split (2 HTTP workers + decision process).
    assert set(rows) == {(v, m, w) for w in (1, 2) for v, m in (
        ("floor", "names"), ("floor", "full-nodes"), ("stowage", "names"), ("stowage", "full-nodes"),
        ("stowage+churn300", "names"))}
    pods = doc["meta"]["args"]["pods"]
    for (variant, mode, workers), r in rows.items():
        assert r["errors"] == []
        assert r["nodes"] == 200 and r["placed"] > 0 and r["filter_n"] >= r["placed"]
        assert r["peak_mib"] > 0 and r["server_cpu_s"] >= 0
        if variant == "floor":  # the floor says yes to everything
            assert r["placed"] == (pods if mode == "names" else doc["meta"]["args"]["full_pods"])
        else:
            assert r["filter_p99_ms_x_floor"] > 0 and "pods_per_s_x_floor" in r
        # CPU is read from every serving process: the split layout's decision process too.
        assert len(r["cpu_ms_per_pod_by_process"]) == (workers + 1 if workers > 1 and variant != "floor" else workers)
    for w in (1, 2):
        assert rows[("stowage+churn300", "names", w)]["churn_events_per_s"] > 0
        # the same pods, the same decisions, whichever layout served them
        assert rows[("stowage", "names", w)]["placed"] == rows[("stowage", "names", 1)]["placed"]
    with (out / "latency.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == len(rows)
    assert doc["meta"]["model_memory"]["cards"] == doc["meta"]["model_memory"]["nodes"] * 8


def test_in_process_benchmark_places_every_pod_the_same_way_in_each_mode(tmp_path):
    """benchmarks.latency.inproc replays the client's sequence without HTTP: every mode
    (service calls, wire parse/encode, the Flask app as WSGI) sees the same requests, places
    the same pods, and the profile file is written."""
    from benchmarks.latency import inproc

    results = [inproc.run(60, 12, 3, mode, str(tmp_path / "p.prof") if mode == "wsgi" else None)
               for mode in ("service", "wire", "wsgi")]
    for r in results:
        assert r["filter"] is not None and r["bind"] is not None
        assert r["ms_per_pod_total"] >= r["ms_per_pod_decisions"] > 0
    assert (tmp_path / "p.prof").stat().st_size > 0
    assert len(results[0]["placed"]) >= 10
    assert results[0]["placed"] == results[1]["placed"] == results[2]["placed"]


# ------------------------------------------------------------------ the command line
import argparse  # noqa: E402

import pytest  # noqa: E402

from benchmarks.latency.cli import build_parser, settle_quick  # noqa: E402
from cli_checks import assert_refused_by_name  # noqa: E402


@pytest.mark.parametrize("flag, value", [("--sizes", "abc"), ("--sizes", "0,1000"), ("--sizes", ""),
                                         ("--pods", "0"), ("--clients", "0"), ("--threads", "0"),
                                         ("--full-pods", "-1"), ("--memory-nodes", "x")])
def test_a_value_that_cannot_make_a_run_is_refused_by_name(flag, value, capsys):
    assert_refused_by_name(build_parser(), flag, value, capsys)


def test_quick_fills_in_only_what_the_user_did_not_say():
    quick = settle_quick(build_parser().parse_args(["--quick"]))
    assert (quick.sizes, quick.pods, quick.clients, quick.memory_nodes) == ([200], 40, 2, 1000)
    mine = settle_quick(build_parser().parse_args(["--quick", "--sizes", "500,700", "--pods", "10",
                                                   "--memory-nodes", "0"]))
    assert (mine.sizes, mine.pods, mine.clients, mine.memory_nodes) == ([500, 700], 10, 2, 0)
    full = settle_quick(build_parser().parse_args([]))
    assert (full.sizes, full.pods, full.clients, full.full_max) == ([1000, 5000, 10000], 600, 4, 5000)
    assert isinstance(full, argparse.Namespace)


@pytest.mark.parametrize("module", ["benchmarks.binpack.cli", "benchmarks.binpack.real", "benchmarks.binpack.anatomy",
                                    "benchmarks.binpack.bound", "benchmarks.elastic.cli", "benchmarks.latency.cli",
                                    "benchmarks.latency.inproc", "benchmarks.latency.floor",
                                    "benchmarks.latency.churn"])
def test_every_benchmark_help_says_what_the_command_does(module, capsys):
    """``python -m benchmarks.latency.churn --help`` listed its options and nothing else: not that
    it runs ``stowage extender`` with pod churn inside its worker (found by experiment)."""
    import importlib

    with pytest.raises(SystemExit) as exc:
        importlib.import_module(module).main(["--help"])
    assert exc.value.code == 0
    blocks = capsys.readouterr().out.split("\n\n")
    assert blocks[0].startswith("usage:") and len(blocks) > 2
    assert not blocks[1].lstrip().startswith(("positional arguments:", "options:")), blocks[1]
