"""`stowage inspect` / `stowage plan` reading a live cluster where pod authors (and whoever may
write a node's annotations) wrote hostile values: malformed or forged allocation records, records
that double-book a card or name a card the node does not have, annotations and resources of the
wrong JSON type, absurd quantities, names carrying terminal escape sequences, nodes with absurd
allocatable or a malformed inventory.

What must hold (the house rule for hostile input): no traceback, nothing raw reaches the operator's
terminal, each bad pod or node is named with its error, and the figures of the nodes it is not on
are the figures of the same cluster without it.

The API server is tests/fakekube.py, which stores what it is given: a real one refuses some of
these objects (a name with an escape sequence, ``containers`` that is not a list), but the
commands must not depend on that.
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner
from fakekube import FakeKube, kubeconfig_file, make_node, make_pod
from test_inspect_plan_live import alloc, stowage_pod

from shared_paths import ROOT
from stowage.allocation import ALLOCATION_ANNOTATION
from stowage.cli import main
from stowage.inventory import INVENTORY_ANNOTATION, Card, encode_inventory

GiB = 1024
ESC = "\x1b[31m\x1b]0;owned\x07"     # colour, and a window title set by an OSC sequence


def inventory(node: str, n: int) -> dict[str, str]:
    cards = [Card(index=k, uuid=f"GPU-{node}-{k}", model="NVIDIA A100-SXM4-40GB", memory_mib=40 * GiB)
             for k in range(n)]
    return {INVENTORY_ANNOTATION: encode_inventory(cards)}


def running(name: str, node: str, *, record: str | dict[str, str] | None = None, **request: int) -> dict:
    """A running pod of Stowage's scheduler on ``node``: ``record`` is its allocation annotation
    (a value, or alloc()'s mapping)."""
    annotations = record if isinstance(record, dict) else {ALLOCATION_ANNOTATION: record} if record else {}
    return stowage_pod(name, namespace="ml", node=node, phase="Running", annotations=annotations, **request)


def whole(node: str, card: int) -> dict[str, str]:
    return alloc(node, [(card, 40 * GiB, 1000)], True)


# Each hostile pod: name -> (pod, what the operator must be told of it, or None when it is honoured).
def hostile_pods() -> list[dict]:
    pods = [
        running("forged-1", "bad", record=whole("bad", 0), gpus=1),       # two records booking card 0 whole
        running("forged-2", "bad", record=whole("bad", 0), gpus=1),
        running("no-such-card", "bad", record=whole("bad", 9), gpus=1),   # bad has cards 0-3
        running("not-json", "bad", record="{not json", gpus=1),
        running("nan", "bad", gpu_memory=10, record=json.dumps(
            {"version": 1, "node": "bad", "whole": False,
             "cards": [{"index": 1, "uuid": "GPU-bad-1", "memoryMiB": float("nan"), "coreMilli": 1e308}]})),
        running("huge", "bad", record="[" * 300_000, gpus=1),
        running("other-node", "bad", record=whole("good", 1), gpus=1),     # bound to bad, record says good
        running("esc" + ESC, "bad", record="{", gpus=1),                   # its error names it
        running("holder" + ESC, "bad", record=whole("bad", 2), gpus=1),    # honoured: shown in the tables
    ]
    # five 10 GiB slices booked on card 3 (40 GiB)
    pods += [running(f"slice-{j}", "bad", record=alloc("bad", [(3, 10 * GiB, 100)], False), gpu_memory=10,
                     gpu_core=10) for j in range(5)]
    # pending: what the placers learn (inspect --learned, plan's placer) carries what they wrote
    pods.append(stowage_pod("pending" + ESC, namespace="ml", gpus=1, annotations={"stowage.io/gpu-model": "A100|" + ESC}))
    pods.append(stowage_pod("pending-huge", namespace="ml", gpus=1, annotations={"stowage.io/node-policy": "x" * 100_000}))
    absurd = running("absurd-cpu", "bad")
    absurd["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "NaN", "memory": "1e308"},
                                                   "limits": {"nvidia.com/gpu": 1e308}}
    pods.append(absurd)
    return pods


# Mutations a real API server would refuse, applied after creation (fakekube fills in a dict spec).
WRONG_TYPES: dict[str, Any] = {
    "annotations-list": lambda p: p["metadata"].__setitem__("annotations", ["x"]),
    "containers-str": lambda p: p["spec"].__setitem__("containers", "nope"),
    "resources-list": lambda p: p["spec"]["containers"][0].__setitem__("resources", ["x"]),
    "record-int": lambda p: p["metadata"]["annotations"].__setitem__(ALLOCATION_ANNOTATION, 5),
    "spec-list": lambda p: p.__setitem__("spec", ["x"]),
    "node-name-int": lambda p: p["spec"].__setitem__("nodeName", 5),
}


def build(kube: FakeKube, hostile: bool) -> None:
    """``good`` (2 cards, one pod on card 0) and ``bad`` (4 cards); with ``hostile``, the pods
    above on ``bad`` and the hostile nodes."""
    kube.create_node(make_node("good", gpus=2, annotations=inventory("good", 2)))
    kube.create_node(make_node("bad", gpus=4, annotations=inventory("bad", 4)))
    kube.create_pod(running("ok", "good", record=whole("good", 0), gpus=1))
    if not hostile:
        return
    for pod in hostile_pods():
        kube.create_pod(pod)
    for name, mutate in WRONG_TYPES.items():
        kube.create_pod(running(name, "bad", record=whole("bad", 1), gpus=1))
        kube.update("pods", "ml", name, lambda p, m=mutate: (m(p), None)[1])
    kube.create_node(make_node("node" + ESC, gpus=2, annotations={INVENTORY_ANNOTATION: "garbage"}))
    kube.create_node(make_node("absurd", allocatable={"nvidia.com/gpu": "99999999", "cpu": "1e308", "pods": "NaN"}))
    wrong = make_node("wrong-types", gpus=2)
    wrong["status"]["allocatable"] = ["x"]
    kube.create_node(wrong)


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    """Kubeconfigs of the clean cluster and of the same one with the hostile pods and nodes."""
    with FakeKube() as clean, FakeKube() as hostile:
        build(clean, hostile=False)
        build(hostile, hostile=True)
        yield {"clean": kubeconfig_file(tmp_path_factory.mktemp("clean"), clean.url),
               "hostile": kubeconfig_file(tmp_path_factory.mktemp("hostile"), hostile.url)}


def run(cfg: str, *args: str):
    r = CliRunner().invoke(main, [*args, "--kubeconfig", cfg])
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    return r


COMMANDS = [("inspect",), ("inspect", "--learned"), ("plan", "--shape", "1", "--shape", "10Gi", "--drain"),
            ("plan", "--preempt", "2", "--priority", "5"), ("plan", "--shape", "1@H100")]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_nothing_a_pod_or_node_wrote_reaches_the_terminal_raw(clusters, args):
    """The command as the operator runs it, in its own process: what reaches the terminal is
    what it writes itself and what its logging writes (pytest's own log capture is not there)."""
    r = subprocess.run([sys.executable, "-m", "stowage.cli", *args, "--kubeconfig", clusters["hostile"]],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    for stream, text in (("stdout", r.stdout), ("stderr", r.stderr)):
        bad = sorted({f"U+{ord(ch):04X}" for ch in text if ord(ch) < 32 and ch != "\n" or 0x7F <= ord(ch) < 0xA0})
        assert not bad, f"{stream} carries control characters {bad}"
    assert "?[31m" in r.stdout + r.stderr      # the names are there, made printable


def node_json(rep: dict, name: str) -> dict:
    """A node of ``inspect -o json`` without the uids (generated per cluster)."""
    node = next(n for n in rep["nodes"] if n["name"] == name)
    for card in node["cards"]:
        for pod in card["pods"]:
            pod.pop("uid")
    return node


def test_the_good_node_reads_the_same_beside_hostile_pods_and_nodes(clusters):
    """Fragmentation counts for a fixed shape: by default the shapes running now are the typical
    ones, and a pod honoured on ``bad`` runs a shape like any other."""
    reps = {k: json.loads(run(cfg, "inspect", "--typical", "1", "-o", "json").stdout) for k, cfg in clusters.items()}
    assert node_json(reps["hostile"], "good") == node_json(reps["clean"], "good")
    plans = {k: json.loads(run(cfg, "plan", "--shape", "1", "-o", "json").stdout)["capacity"][0]["perNode"]
             for k, cfg in clusters.items()}
    assert plans["hostile"]["good"] == plans["clean"]["good"] == 1


def test_each_bad_pod_and_node_is_named_with_its_error(clusters):
    r = run(clusters["hostile"], "inspect", "-o", "json")
    rep = json.loads(r.stdout)
    pods = {e["pod"]: e["error"] for e in rep["podErrors"]}
    assert "is malformed: not JSON" in pods["ml/not-json"]
    assert "memoryMiB" in pods["ml/nan"]
    assert "names node 'good' but the pod is bound to 'bad'" in pods["ml/other-node"]
    assert "ml/huge" in pods and "ml/esc\x1b[31m\x1b]0;owned\x07" in pods     # JSON escapes it
    assert {"ml/annotations-list", "ml/record-int", "ml/node-name-int"} <= set(pods)
    nodes = {e["node"]: e["error"] for e in rep["nodeErrors"]}
    assert "99999999 is more than the 64 cards" in nodes["absurd"]
    assert "not JSON" in nodes["node" + ESC] and "wrong-types" in nodes
    assert "good" not in nodes and "bad" not in nodes
    # in the table's run, each is said once on stderr, with its name made printable
    err = run(clusters["hostile"], "inspect").stderr
    assert err.count("ml/not-json") == 1 and "ml/esc?[31m?]0;owned?" in err and "node node?[31m" in err


def test_a_card_booked_beyond_what_it_has_is_shown(clusters):
    """Records an unsigned cluster honours may book more than a card has (two whole records on
    one card, five 10 GiB slices on 40 GiB): the card shows 0 free either way, and says by how much
    it is overbooked, as the extender books it."""
    rep = json.loads(run(clusters["hostile"], "inspect", "-o", "json").stdout)
    bad = node_json(rep, "bad")
    c0, c3 = bad["cards"][0], bad["cards"][3]
    assert (c0["memoryFreeMiB"], c0["overbookedMiB"], c0["overbookedCorePct"]) == (0, 40 * GiB, 100)
    assert (c3["memoryFreeMiB"], c3["overbookedMiB"], c3["overbookedCorePct"]) == (0, 10 * GiB, 0)
    assert bad["cards"][1]["overbookedMiB"] == 0
    assert node_json(rep, "good")["cards"][0]["overbookedMiB"] == 0
    table = run(clusters["hostile"], "inspect").stdout
    row = next(line for line in table.splitlines() if line.startswith("bad ") and "ml/forged-1" in line)
    assert "OVERBOOKED by 40 GiB, 100%" in row
    node_row = next(line for line in table.splitlines() if line.startswith("bad "))
    assert "2 cards overbooked" in node_row


def test_a_record_naming_a_card_the_node_lacks_is_named(clusters):
    rep = json.loads(run(clusters["hostile"], "inspect", "-o", "json").stdout)
    bad = node_json(rep, "bad")
    assert [(p["pod"], p["cards"]) for p in bad["podsOnMissingCards"]] == [("ml/no-such-card", [9])]
    assert node_json(rep, "good")["podsOnMissingCards"] == []
    table = run(clusters["hostile"], "inspect").stdout
    assert "ml/no-such-card holds card(s) 9, which node bad does not have" in table
