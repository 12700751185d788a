"""`stowage extender --kubeconfig` under gunicorn against a fake Kubernetes API server (HTTP):
the whole server in kube mode, including a restart that rebuilds the model from pod annotations."""
from __future__ import annotations

import pytest

from extender_harness import start_process
from extender.simcluster import node_objects, parse_cluster
from fakekube import FakeKube, make_pod, kubeconfig_file as kubeconfig
from stowage.allocation import ALLOCATION_ANNOTATION, decode_allocation

CLUSTER = {"nodes": [
    {"name": "gpu-1", "gpus": {"model": "NVIDIA A100-SXM4-80GB", "count": 4, "memory": "80Gi",
                               "nvlink": [[0, 1], [2, 3]]}},
    {"name": "gpu-2", "gpus": {"model": "Tesla T4", "count": 2, "memory": "16Gi"}},
]}


@pytest.fixture
def kube():
    with FakeKube() as k:
        for node in node_objects(parse_cluster(CLUSTER, "test")):
            k.create_node(dict(node, apiVersion="v1", kind="Node"))
        yield k


def start(tmp_path, kube, workers=1):
    return start_process(None, str(tmp_path), "--kubeconfig", kubeconfig(tmp_path, kube.url), "--workers", str(workers))


def stowage_pod(pod: dict) -> dict:
    """A pod of Stowage's profile: the extender honours records only on its scheduler's pods."""
    pod["spec"]["schedulerName"] = "stowage-scheduler"
    return pod


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "split"])
def test_kube_mode_bind_and_restart_rebuild(tmp_path, kube, workers):
    pod = kube.create_pod(stowage_pod(make_pod("train", gpus=2)))
    other = kube.create_pod(stowage_pod(make_pod("late", gpu_memory=8)))
    proc, http = start(tmp_path, kube, workers)
    try:
        body = {"Pod": pod, "NodeNames": ["gpu-1", "gpu-2"]}
        ans = http.post(proc.url + "/filter", json=body, timeout=30).json()
        assert ans["NodeNames"] == ["gpu-1", "gpu-2"]
        m = pod["metadata"]
        res = http.post(proc.url + "/bind", json={"PodName": m["name"], "PodNamespace": m["namespace"],
                                                  "PodUID": m["uid"], "Node": "gpu-1"}, timeout=30).json()
        assert res == {"Error": ""}
        stored = kube.get_pod("default", "train")
        assert stored["spec"]["nodeName"] == "gpu-1"
        rec = decode_allocation(stored["metadata"]["annotations"][ALLOCATION_ANNOTATION])
        assert rec.node == "gpu-1" and sorted(c.index for c in rec.cards) in ([0, 1], [2, 3])
        # A pod bind never saw at filter is read from the feeder (kube-scheduler restarted, say).
        m2 = other["metadata"]
        res = http.post(proc.url + "/bind", json={"PodName": "late", "PodNamespace": "default",
                                                  "PodUID": m2["uid"], "Node": "gpu-2"}, timeout=30).json()
        assert res == {"Error": ""}
        assert kube.get_pod("default", "late")["spec"]["nodeName"] == "gpu-2"
        before = http.get(proc.url + "/state", timeout=30).json()["allocations"]
        assert set(before) == {m["uid"], m2["uid"]}
    finally:
        http.close()
        assert proc.stop() == 0
    # Restart: a new process rebuilds exactly the same holds from the pods' annotations.
    proc, http = start(tmp_path, kube, workers)
    try:
        after = kube.wait_for(lambda: (lambda s: s if len(s) == 2 else None)(
            http.get(proc.url + "/state", timeout=30).json()["allocations"]))
        assert {u: (a["node"], a["cards"], a["memoryMiB"]) for u, a in after.items()} == \
               {u: (a["node"], a["cards"], a["memoryMiB"]) for u, a in before.items()}
        # ...so the cards taken before the restart are not handed out again.
        big = kube.create_pod(make_pod("big", gpus=3))
        ans = http.post(proc.url + "/filter", json={"Pod": big, "NodeNames": ["gpu-1", "gpu-2"]}, timeout=30).json()
        assert ans["NodeNames"] == [] and ans["FailedNodes"]["gpu-1"] == "too few free cards for 3 GPUs: 2 free"
    finally:
        http.close()
        proc.stop()


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "split"])
def test_what_was_learned_from_deleted_pods_is_written_at_sigterm_and_learned_again(tmp_path, kube, workers):
    """The learned past end to end in both layouts (the ConfigMap written by the process that
    holds the model, at SIGTERM: the interval is an hour), against the fake API server."""
    import json

    from extender.learned_past import DepartedPods
    from extender.learned_store import DATA_KEY

    shapes = [{"gpus": 1}, {"gpu_memory": 8}, {"gpus": 2}, {"gpu_memory": 4}]
    for i, kw in enumerate(shapes * 2):
        kube.create_pod(stowage_pod(make_pod(f"p{i}", **kw)))
    args = ("--kubeconfig", kubeconfig(tmp_path, kube.url), "--workers", str(workers),
            "--learned-configmap", "ops/learned", "--learned-interval", "3600")
    proc, http = start_process(None, str(tmp_path), *args)
    try:
        learned = lambda: http.get(proc.url + "/state", timeout=30).json()["learned"]  # noqa: E731
        kube.wait_for(lambda: learned()["pods"] == 8)
        for i in range(5):
            kube.delete_pod("default", f"p{i}")
        kube.wait_for(lambda: learned()["departedPods"] == 5)
        before = learned()
        metrics = http.get(proc.url + "/metrics", timeout=30).text
        assert "stowage_extender_departed_pods_kept 5.0" in metrics
        # The feed's bounds reach /metrics from the process that holds the model (the 3 pending pods left).
        assert 'stowage_extender_bound_entries{bound="pending_pods"} 3.0' in metrics
    finally:
        http.close()
        assert proc.stop() == 0
    cm = kube.get("configmaps", "ops", "learned")
    assert cm is not None, "nothing was written at SIGTERM"
    assert DepartedPods.from_json(cm["data"][DATA_KEY]).pods == 5
    proc, http = start_process(None, str(tmp_path), *args)
    try:
        after = kube.wait_for(lambda: (lambda s: s if s["pods"] == 8 else None)(
            http.get(proc.url + "/state", timeout=30).json()["learned"]))
        assert after == before
        assert json.loads(cm["data"][DATA_KEY])["format"] == "stowage.io/departed-pods/v1"
    finally:
        http.close()
        assert proc.stop() == 0
