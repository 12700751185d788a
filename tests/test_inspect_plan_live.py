"""`stowage inspect` / `stowage plan` against a live cluster: the fake Kubernetes API server
(tests/fakekube.py) behind a real kubeconfig, read by the extender's own feeder."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fakekube import FakeKube, make_node, make_pod, kubeconfig_file as kubeconfig

from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, encode_allocation
from stowage.cli import main
from stowage.inventory import INVENTORY_ANNOTATION, Card, encode_inventory

GiB = 1024


def alloc(node: str, cards: list[tuple[int, int, int]], whole: bool) -> dict[str, str]:
    rec = AllocationRecord(node=node, whole=whole,
                           cards=tuple(CardShare(index=k, uuid=f"GPU-{node}-{k}", memory_mib=m, core_milli=c)
                                       for k, m, c in cards))
    return {ALLOCATION_ANNOTATION: encode_allocation(rec)}


def stowage_pod(name: str, **kw) -> dict:
    """A pod of Stowage's profile (the default --scheduler-name): the extender, and so inspect and
    plan, honour allocation records only on such pods."""
    pod = make_pod(name, **kw)
    pod["spec"]["schedulerName"] = "stowage-scheduler"
    return pod


@pytest.fixture
def cluster(tmp_path):
    """gpu-a: 4 x A100 40 GiB (card 3 unhealthy): a whole-GPU pod on card 0, two 10 GiB / 30 %
    slices on card 1. gpu-b: 2 x A100 40 GiB, empty. A finished pod's old record holds nothing."""
    with FakeKube() as kube:
        cards = [Card(index=k, uuid=f"GPU-gpu-a-{k}", model="NVIDIA A100-SXM4-40GB", memory_mib=40 * GiB,
                      healthy=k != 3) for k in range(4)]
        kube.create_node(make_node("gpu-a", gpus=3, annotations={INVENTORY_ANNOTATION: encode_inventory(cards)}))
        cards_b = [Card(index=k, uuid=f"GPU-gpu-b-{k}", model="NVIDIA A100-SXM4-40GB", memory_mib=40 * GiB)
                   for k in range(2)]
        kube.create_node(make_node("gpu-b", gpus=2, annotations={INVENTORY_ANNOTATION: encode_inventory(cards_b)}))
        kube.create_node(make_node("cpu-only"))
        kube.create_pod(stowage_pod("train", namespace="ml", gpus=1, node="gpu-a", phase="Running",
                                 annotations=alloc("gpu-a", [(0, 40 * GiB, 1000)], True)))
        for n in ("infer-1", "infer-2"):
            kube.create_pod(stowage_pod(n, namespace="ml", gpu_memory=10, gpu_core=30, node="gpu-a", phase="Running",
                                     annotations=alloc("gpu-a", [(1, 10 * GiB, 300)], False)))
        kube.create_pod(stowage_pod("done", namespace="ml", gpus=1, node="gpu-b", phase="Succeeded",
                                 annotations=alloc("gpu-b", [(0, 40 * GiB, 1000)], True)))
        yield kubeconfig(tmp_path, kube.url)


def test_inspect_live_cluster(cluster):
    r = CliRunner().invoke(main, ["inspect", "--kubeconfig", cluster, "-o", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["source"].startswith("live cluster http://127.0.0.1:")
    nodes = {n["name"]: n for n in rep["nodes"]}
    a = nodes["gpu-a"]
    assert (a["gpus"], a["healthyGpus"], a["freeGpus"], a["pods"]) == (4, 3, 1, 3)
    c0, c1, c2, c3 = a["cards"]
    assert [p["pod"] for p in c0["pods"]] == ["ml/train"] and c0["memoryFreeMiB"] == 0
    assert sorted(p["pod"] for p in c1["pods"]) == ["ml/infer-1", "ml/infer-2"]
    assert c1["memoryFreeMiB"] == 20 * GiB and c1["coreFreePct"] == 40
    assert c2["pods"] == [] and c2["freeMilli"] == 1000
    assert c3["healthy"] is False and c3["freeMilli"] == 0
    # typical shapes now: 1 whole GPU and 10 GiB + 30 %; card 1 (20 GiB, 40 % left) still fits one
    assert c1["strandedMilli"] == 0
    assert nodes["gpu-b"]["pods"] == 0 and nodes["gpu-b"]["freeGpus"] == 2   # the finished pod holds nothing
    table = CliRunner().invoke(main, ["inspect", "--kubeconfig", cluster]).output
    assert "ml/infer-1 (10 GiB, 30%)" in table and "UNHEALTHY" in table


def test_plan_live_cluster(cluster):
    r = CliRunner().invoke(main, ["plan", "--kubeconfig", cluster, "--shape", "1", "--shape", "10Gi,30%",
                                  "--shape", "2", "--drain", "-o", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    caps = {c["shape"]: c for c in doc["capacity"]}
    assert caps["1"]["count"] == 3 and caps["1"]["perNode"] == {"gpu-a": 1, "gpu-b": 2}
    # 10 GiB + 30 %: 1 more on card 1 (40 % compute left), 3 on each of the 3 free cards
    assert caps["10Gi,30%"]["count"] == 1 + 3 * 3
    assert caps["2"]["count"] == 1 and caps["2"]["perNode"] == {"gpu-b": 1}
    drain = doc["drain"]
    # gpu-b is empty (free to remove); gpu-a's whole pod has no whole card elsewhere once gpu-b goes
    assert [d["node"] for d in drain["drained"]] == ["gpu-b"] and drain["podsToMove"] == 0
    assert "gpu-a" in drain["kept"]


def test_unreachable_api_server_is_one_clear_line(tmp_path):
    r = CliRunner().invoke(main, ["inspect", "--kubeconfig", kubeconfig(tmp_path, "http://127.0.0.1:9")])
    assert r.exit_code == 1
    assert "cannot read nodes and pods from the API server" in r.output and "Traceback" not in r.output


def test_missing_kubeconfig_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    r = CliRunner().invoke(main, ["plan", "--kubeconfig", str(tmp_path / "none"), "--shape", "1"])
    assert r.exit_code == 1
    assert "cannot load Kubernetes credentials" in r.output and "--simulated" in r.output


def bound(name: str, node: str, *, cpu: str = "1", gpus: int = 0, daemonset: bool = False,
          scheduler: str = "default-scheduler") -> dict:
    """A running pod bound to ``node`` without a Stowage record: CPU only, or (``gpus``) a GPU
    pod another scheduler placed; ``daemonset``: owned by a DaemonSet, as the device plugin's."""
    pod = make_pod(name, namespace="sys", gpus=gpus, node=node, phase="Running")
    res = pod["spec"]["containers"][0]["resources"]
    res["requests"]["cpu"] = cpu
    pod["spec"]["schedulerName"] = scheduler
    if daemonset:
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds",
                                               "uid": "ds-uid", "controller": True}]
    return pod


def test_plan_drain_moves_cpu_pods_leaves_daemonset_pods_and_names_unknown_gpu_pods(tmp_path):
    """Found by review: `plan --drain` crashed on any GPU node running a pod without cards (a
    DaemonSet pod, a CPU-only pod, another scheduler's GPU pod), which is nearly every cluster."""
    with FakeKube() as kube:
        for node, n in (("gpu-a", 4), ("gpu-b", 2), ("gpu-c", 2)):
            cards = [Card(index=k, uuid=f"GPU-{node}-{k}", model="NVIDIA A100-SXM4-40GB", memory_mib=40 * GiB)
                     for k in range(n)]
            kube.create_node(make_node(node, gpus=n, annotations={INVENTORY_ANNOTATION: encode_inventory(cards)}))
            kube.create_pod(bound(f"plugin-{node}", node, cpu="100m", daemonset=True))
        kube.create_pod(stowage_pod("train", namespace="ml", gpus=1, node="gpu-a", phase="Running",
                                 annotations=alloc("gpu-a", [(0, 40 * GiB, 1000)], True)))
        kube.create_pod(bound("web", "gpu-b"))
        kube.create_pod(bound("other-train", "gpu-c", gpus=1))
        cfg = kubeconfig(tmp_path, kube.url)
        r = CliRunner().invoke(main, ["plan", "--kubeconfig", cfg, "--drain", "-o", "json"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        drained = {d["node"]: d for d in doc["drain"]["drained"]}
        # gpu-b: its CPU pod moves (to gpu-a, the only node that stays and is not gpu-c), its DaemonSet pod stays
        assert [m["pod"] for m in drained["gpu-b"]["moves"]] == ["sys/web"]
        assert not any(m["pod"].startswith("sys/plugin-") for d in drained.values() for m in d["moves"])
        # gpu-c runs a GPU pod Stowage does not know the cards of: never emptied, and said so
        assert "gpu-c" not in drained and "without Stowage's record" in doc["drain"]["kept"]["gpu-c"]
        # named as podErrors are (a uid alone sent the operator to look the pod up)
        [unrecorded] = doc["unrecordedGpuPods"]
        assert (unrecorded["pod"], unrecorded["node"]) == ("sys/other-train", "gpu-c") and unrecorded["uid"]
        table = CliRunner().invoke(main, ["plan", "--kubeconfig", cfg, "--drain"]).output
        assert "WARNING: 1 GPU pod(s) on 1 node(s) were bound without Stowage's record" in table
        assert "sys/other-train on gpu-c" in table
        assert "1 GPU pods, 5 other pods bound" in table
        insp = CliRunner().invoke(main, ["inspect", "--kubeconfig", cfg]).output
        assert "WARNING: 1 GPU pod(s)" in insp


def test_names_no_api_server_takes_are_cut_and_escaped_in_every_text_output(tmp_path):
    """Names come from the cluster: a fake or hostile source served a 5,000-character node name and
    pod name ending in terminal escapes, and inspect and plan printed them whole (lines of 10,000
    characters). They are cut past 317 characters, the longest pod key (namespace/name) the API can make, with control
    characters shown as '?'."""
    node, pod = "n" * 5000 + "\x1b[2J\x1b]0;owned\x07", "p" * 5000 + "\x1b[31m"
    with FakeKube() as kube:
        for name in (node, "gpu-b"):
            cards = [Card(index=k, uuid=f"GPU-{name[:5]}-{k}", model="NVIDIA A100-SXM4-40GB", memory_mib=40 * GiB)
                     for k in range(2)]
            kube.create_node(make_node(name, gpus=2, annotations={INVENTORY_ANNOTATION: encode_inventory(cards)}))
        kube.create_pod(stowage_pod(pod, namespace="ml", gpus=1, node=node, phase="Running",
                                    annotations=alloc(node, [(0, 40 * GiB, 1000)], True)))
        cfg = kubeconfig(tmp_path, kube.url)
        for args in (["inspect"], ["plan", "--shape", "1", "--drain"], ["plan", "--preempt", "2", "--priority", "10"]):
            r = CliRunner().invoke(main, [*args, "--kubeconfig", cfg])
            assert r.exit_code == 0, r.output[:2000]
            assert "\x1b" not in r.output and "\x07" not in r.output
            assert max(map(len, r.output.splitlines())) < 1000, args
            assert "n" * 314 + "... (5014 characters)" in r.output or args[0] == "plan" and "--preempt" in args
