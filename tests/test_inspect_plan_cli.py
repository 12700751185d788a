"""`stowage inspect` and `stowage plan` through click, on simulated clusters (built-in and
small YAML files whose answers are known)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from extender.simcluster import load_cluster
from stowage.cli import main

SMALL = """\
nodes:
  - name: "big-{i}"
    count: 2
    gpus: {model: NVIDIA A100-SXM4-80GB, count: 4, memory: 80Gi}
  - name: small
    gpus: {model: NVIDIA A10, count: 2, memory: 24Gi, unhealthy: [1]}
"""


@pytest.fixture
def small(tmp_path):
    p = tmp_path / "cluster.yaml"
    p.write_text(SMALL)
    return str(p)


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_inspect_small_cluster_json(small):
    r = run("inspect", "--simulated", small, "-o", "json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    s = rep["summary"]
    assert (s["nodes"], s["gpus"], s["healthyGpus"], s["freeGpus"], s["pods"]) == (3, 10, 9, 9, 0)
    small_node = next(n for n in rep["nodes"] if n["name"] == "small")
    assert [c["healthy"] for c in small_node["cards"]] == [True, False]
    assert small_node["memoryFreeMiB"] == 24 * 1024  # the unhealthy card's memory is not free
    assert s["allocatedPct"] == 0.0 and s["strandedPct"] == 0.0


def test_inspect_filled_cluster_is_consistent():
    r = run("inspect", "--simulated", "--fill", "50", "--seed", "3", "-o", "json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["summary"]["gpus"] == load_cluster(None).card_count
    uids = set()
    for n in rep["nodes"]:
        for c in n["cards"]:
            held = sum(p["memoryMiB"] for p in c["pods"])
            assert c["memoryFreeMiB"] == max(c["memoryMiB"] - held, 0)
            assert c["coreFreePct"] == pytest.approx(max(100 - sum(p["corePct"] for p in c["pods"]), 0))
            assert 0 <= c["strandedMilli"] <= c["freeMilli"] <= 1000
            if any(p["whole"] for p in c["pods"]):
                assert len(c["pods"]) == 1 and c["freeMilli"] == 0
            uids |= {p["uid"] for p in c["pods"]}
    assert len(uids) == rep["summary"]["pods"] > 0
    assert "filled with" in rep["source"]


def test_inspect_table_lists_nodes_cards_and_pods():
    r = run("inspect", "--simulated", "--fill", "20")
    assert r.exit_code == 0, r.output
    assert "NODE" in r.output and "STRANDED" in r.output and "CORE FREE" in r.output
    assert "fill/pod-00000" in r.output
    r2 = run("inspect", "--simulated", "--no-cards")
    assert "CORE FREE" not in r2.output


def test_inspect_unknown_node_and_bad_typical(small):
    r = CliRunner().invoke(main, ["inspect", "--simulated", small, "--node", "nope"])
    assert r.exit_code == 1 and "no such node(s): nope" in r.output
    r = CliRunner().invoke(main, ["inspect", "--simulated", small, "--typical", "10Gi,abc"])
    assert r.exit_code == 2 and "percentage" in r.output


def test_plan_shapes_on_small_cluster(small):
    r = run("plan", "--simulated", small, "--shape", "1x80Gi", "--shape", "4", "--shape", "12Gi,50%",
            "--shape", "1@A10", "-o", "json")
    assert r.exit_code == 0, r.output
    caps = {c["shape"]: c for c in json.loads(r.stdout)["capacity"]}
    assert caps["1x80Gi"]["count"] == 8 and set(caps["1x80Gi"]["perNode"]) == {"big-1", "big-2"}
    assert caps["4"]["count"] == 2
    # 12 GiB + 50 %: two per A100 card (8 cards), two on the A10's one healthy 24 GiB card
    assert caps["12Gi,50%"]["count"] == 8 * 2 + 2
    assert caps["1@A10"]["count"] == 1 and caps["1@A10"]["perNode"] == {"small": 1}


def test_plan_drain_on_filled_builtin_cluster():
    r = run("plan", "--simulated", "--fill", "40", "--drain", "-o", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["drain"]
    assert d["nodesFreed"] == len(d["drained"]) > 0
    assert d["podsToMove"] == sum(len(x["moves"]) for x in d["drained"])
    drained = {x["node"] for x in d["drained"]}
    for x in d["drained"]:
        for mv in x["moves"]:
            assert mv["from"] == x["node"] and mv["to"] not in drained
    table = run("plan", "--simulated", "--fill", "40", "--drain").output
    nodes = len(load_cluster(None).nodes)
    assert f"{d['nodesFreed']} of {nodes} GPU node(s) can be emptied" in table


@pytest.mark.parametrize("args,code,needle", [
    (["plan", "--simulated"], 2, "nothing to plan"),
    (["plan", "--simulated", "--shape", "1x"], 2, "after 'x'"),
    (["plan", "--simulated", "--shape", "1", "--placer", "nope"], 2, "unknown placement policy"),
    (["plan", "--fill", "3", "--shape", "1"], 2, "--fill only applies"),
    (["plan", "--simulated", "/nonexistent/cluster.yaml", "--shape", "1"], 1, "cannot read cluster file"),
    (["inspect", "--simulated", "--kubeconfig", "x"], 2, "cannot be combined"),
])
def test_errors_are_one_clear_line(args, code, needle):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == code, r.output
    assert needle in r.output
    assert "Traceback" not in r.output


def test_bad_cluster_file_is_reported(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("nodes: [{name: x, gpus: {model: T4, count: 2}}]\n")
    r = CliRunner().invoke(main, ["inspect", "--simulated", str(p)])
    assert r.exit_code == 1 and "memory" in r.output


def test_help_documents_the_shape_grammar():
    r = run("plan", "--help")
    assert "NxMEM" in r.output and "10Gi,30%" in r.output and "--drain" in r.output
