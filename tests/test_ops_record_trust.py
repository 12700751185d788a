"""`stowage inspect` / `stowage plan` on a live cluster honour exactly the allocation records the
extender honours: only on pods of Stowage's schedulers (``--scheduler-name``, the extender's
default) and, where the cluster signs records (``--record-key-file``), only records signed for
their pod. Before, they read with the feeder's default trust: a record on ANY scheduler's pod and
an unsigned, forged record counted as holding cards the extender sees as free, so the picture
was not "what the extender would rebuild" (review finding f8)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from extender_harness import start_process
from fakekube import FakeKube, kubeconfig_file, make_node, make_pod

from stowage.allocation import (ALLOCATION_ANNOTATION, AllocationRecord, CardShare, RecordKey, encode_allocation)
from stowage.cli import main
from stowage.inventory import INVENTORY_ANNOTATION, Card, encode_inventory

GiB = 1024
KEY = RecordKey(b"k" * 32)


def record(node: str, cards: list[int], key: RecordKey | None = None, uid: str = "") -> dict[str, str]:
    rec = AllocationRecord(node, tuple(CardShare(k, f"GPU-{node}-{k}", 80 * GiB, 1000) for k in cards), True)
    return {ALLOCATION_ANNOTATION: encode_allocation(rec, key, uid)}


def ours(pod: dict) -> dict:
    pod["spec"]["schedulerName"] = "stowage-scheduler"
    return pod


@pytest.fixture
def signed(tmp_path):
    """n1: 4 x 80 GiB cards. On them: another scheduler's pod recording cards 0 and 1, a Stowage pod
    with an unsigned (forged) record of card 2, and a Stowage pod whose record of card 3 is signed
    for it with the cluster's key. (kubeconfig, key file, fake API server)"""
    key_file = tmp_path / "record.key"
    key_file.write_bytes(KEY.secret + b"\n")
    with FakeKube() as kube:
        cards = [Card(index=k, uuid=f"GPU-n1-{k}", model="NVIDIA A100-SXM4-80GB", memory_mib=80 * GiB)
                 for k in range(4)]
        kube.create_node(make_node("n1", gpus=4, annotations={INVENTORY_ANNOTATION: encode_inventory(cards)}))
        kube.create_pod(make_pod("foreign", gpus=2, node="n1", phase="Running", annotations=record("n1", [0, 1])))
        kube.create_pod(ours(make_pod("forged", gpus=1, node="n1", phase="Running", annotations=record("n1", [2]))))
        kube.create_pod(ours(make_pod("honest", gpus=1, node="n1", phase="Running", uid="uid-honest",
                                      annotations=record("n1", [3], KEY, "uid-honest"))))
        yield kubeconfig_file(tmp_path, kube.url), str(key_file), kube


def inspect_json(*args: str) -> dict:
    r = CliRunner().invoke(main, ["inspect", *args, "-o", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def holders(rep: dict, node: str = "n1") -> dict[int, list[str]]:
    n = next(n for n in rep["nodes"] if n["name"] == node)
    return {c["index"]: [p["pod"] for p in c["pods"]] for c in n["cards"] if c["pods"]}


def test_inspect_honours_only_the_records_the_extender_honours(signed):
    cfg, key_file, _ = signed
    # A signed cluster, the extender's options: only the signed record of a Stowage pod counts.
    rep = inspect_json("--kubeconfig", cfg, "--record-key-file", key_file)
    assert holders(rep) == {3: ["default/honest"]}
    assert rep["nodes"][0]["freeGpus"] == 3
    # An unsigned cluster (no key): the default --scheduler-name still leaves out another
    # scheduler's pod; the unsigned record of a Stowage pod counts there, as in that extender.
    rep = inspect_json("--kubeconfig", cfg)
    assert holders(rep) == {2: ["default/forged"], 3: ["default/honest"]}
    # --scheduler-name is the extender's: naming the default scheduler too honours its pod's record.
    rep = inspect_json("--kubeconfig", cfg, "--scheduler-name", "stowage-scheduler",
                       "--scheduler-name", "default-scheduler", "--record-key-file", key_file)
    assert holders(rep) == {3: ["default/honest"]}           # the foreign record is not signed
    rep = inspect_json("--kubeconfig", cfg, "--scheduler-name", "stowage-scheduler",
                       "--scheduler-name", "default-scheduler")
    assert holders(rep) == {0: ["default/foreign"], 1: ["default/foreign"], 2: ["default/forged"],
                            3: ["default/honest"]}


def test_the_key_file_comes_from_the_extenders_environment_variable_too(signed, monkeypatch):
    cfg, key_file, _ = signed
    monkeypatch.setenv("STOWAGE_RECORD_KEY_FILE", key_file)
    assert holders(inspect_json("--kubeconfig", cfg)) == {3: ["default/honest"]}


def test_plan_counts_only_the_cards_the_extender_counts(signed):
    """(Besides the cards, kube-scheduler admits by the node's allocatable nvidia.com/gpu less
    every bound pod's ask, records or not: 4 - 4 here, room for nothing, whatever the trust. So
    that the cards tell, n1 states 8.)"""
    cfg, key_file, kube = signed
    kube.patch_node("n1", {"status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    r = CliRunner().invoke(main, ["plan", "--kubeconfig", cfg, "--record-key-file", key_file, "--shape", "1",
                                  "--shape", "3", "-o", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [c["count"] for c in doc["capacity"]] == [3, 1]
    r = CliRunner().invoke(main, ["plan", "--kubeconfig", cfg, "--shape", "1", "-o", "json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["capacity"][0]["count"] == 2       # unsigned cluster: the forged record counts
    kube.patch_node("n1", {"status": {"allocatable": {"nvidia.com/gpu": "4"}}})
    r = CliRunner().invoke(main, ["plan", "--kubeconfig", cfg, "--record-key-file", key_file, "--shape", "1",
                                  "-o", "json"], catch_exceptions=False)
    assert json.loads(r.stdout)["capacity"][0]["count"] == 0       # 2 + 1 + 1 GPUs asked of 4


def test_the_extender_and_inspect_agree_on_which_cards_are_free(signed, tmp_path):
    """The real extender (gunicorn, kube mode, signing records) against inspect with the same
    options: the same free cards, node by node."""
    cfg, key_file, kube = signed
    kube.create_node(make_node("n2", gpus=2, annotations={INVENTORY_ANNOTATION: encode_inventory(
        [Card(index=k, uuid=f"GPU-n2-{k}", model="NVIDIA A100-SXM4-80GB", memory_mib=80 * GiB) for k in range(2)])}))
    kube.create_pod(ours(make_pod("n2-forged", gpus=1, node="n2", phase="Running", annotations=record("n2", [1]))))
    kube.create_pod(make_pod("n2-foreign", gpus=1, node="n2", phase="Running", annotations=record("n2", [0])))
    proc, http = start_process(None, str(tmp_path), "--kubeconfig", cfg, "--record-key-file", key_file)
    try:
        state = http.get(proc.url + "/state", timeout=30).json()
    finally:
        http.close()
        proc.stop()
    extender = {n["name"]: sorted(c["index"] for c in n["cards"] if c["healthy"] and c["pods"] == 0)
                for n in state["nodes"]}
    rep = inspect_json("--kubeconfig", cfg, "--record-key-file", key_file)
    inspect = {n["name"]: sorted(c["index"] for c in n["cards"] if c["healthy"] and not c["pods"])
               for n in rep["nodes"]}
    assert extender == inspect == {"n1": [0, 1, 2], "n2": [0, 1]}


@pytest.mark.parametrize("command", [["inspect"], ["plan", "--shape", "1"]])
def test_a_key_file_that_cannot_be_used_is_one_line_and_exit_2(signed, tmp_path, command):
    cfg, _, _ = signed
    short = tmp_path / "short.key"
    short.write_text("too short\n")
    for path, needle in ((tmp_path / "none.key", "cannot read the record key file"),
                         (short, "at least 32 are needed")):
        r = CliRunner().invoke(main, [*command, "--kubeconfig", cfg, "--record-key-file", str(path)])
        assert r.exit_code == 2, r.output
        assert "--record-key-file" in r.output and needle in r.output and "Traceback" not in r.output
        assert "reading nodes and pods" not in r.output                # refused before the cluster is read
        assert [line for line in r.output.splitlines() if line.startswith("Error")] == \
               [next(line for line in r.output.splitlines() if needle in line)]
