"""Issue 12, item 2: no decision from a half-loaded or stale model. Until the model reflects the
first lists of both nodes and pods, and whenever a watch has gone stale, filter fails every node
with a reason that says so and bind refuses, in both serving layouts."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from extender.demo import ExtenderProcess
from extender.service import ExtenderService
from extender.simcluster import node_objects, parse_cluster
from extender_harness import Server, gpus, model_from
from fakekube import FakeKube, kubeconfig_file, make_pod
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, encode_allocation

CLUSTER = {"nodes": [{"name": "gpu-1", "gpus": {"model": "NVIDIA A100-SXM4-80GB", "count": 4, "memory": "80Gi"}}]}
NOT_READY = "Stowage's model of the cluster is not complete and current"


def _holder(node_uuids: list[str]) -> dict:
    """A running pod that holds all four cards of gpu-1 (its record, as our bind wrote it)."""
    rec = AllocationRecord(node="gpu-1", whole=True, cards=tuple(
        CardShare(index=i, uuid=u, memory_mib=81920, core_milli=1000) for i, u in enumerate(node_uuids)))
    pod = make_pod("holder", gpus=4, node="gpu-1", phase="Running",
                   annotations={ALLOCATION_ANNOTATION: encode_allocation(rec)})
    pod["spec"]["schedulerName"] = "stowage-scheduler"  # records count only on Stowage's pods
    return pod


def _wait(pred, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "split"])
def test_no_placement_before_the_pods_are_listed(tmp_path, workers):
    """Right after a start the nodes are listed but the pods' list fails: a 4-GPU pod must not be
    placed on the node whose 4 cards another pod holds (the double booking of the issue)."""
    with FakeKube() as kube:
        node = dict(node_objects(parse_cluster(CLUSTER, "test"))[0], apiVersion="v1", kind="Node")
        kube.create_node(node)
        from stowage.inventory import inventory_from_node
        uuids = [c.uuid for c in inventory_from_node(node).cards]
        kube.create_pod(_holder(uuids))
        pod = kube.create_pod(make_pod("train", gpus=4))
        kube.fail_next(100_000, status=500, path="/api/v1/pods", method="GET")  # the pod list and watch fail
        proc = ExtenderProcess(None, extra_args=("--kubeconfig", kubeconfig_file(tmp_path, kube.url),
                                                 "--workers", str(workers)), log_dir=str(tmp_path))
        http = requests.Session()
        try:
            _wait(lambda: _get(http, proc.url + "/healthz") == 200 and "listed 1 nodes" in _log(proc),
                  "the extender to list the nodes")
            assert _get(http, proc.url + "/readyz") == 503
            m = pod["metadata"]
            ans = http.post(proc.url + "/filter", json={"Pod": pod, "NodeNames": ["gpu-1"]}, timeout=30).json()
            assert ans["NodeNames"] == [] or ans["NodeNames"] is None
            assert NOT_READY in ans["FailedNodes"]["gpu-1"] and "first list of pods" in ans["FailedNodes"]["gpu-1"]
            bind = {"PodName": "train", "PodNamespace": "default", "PodUID": m["uid"], "Node": "gpu-1"}
            r = http.post(proc.url + "/bind", json=bind, timeout=30).json()
            assert NOT_READY in r["Error"]
            assert "nodeName" not in kube.get_pod("default", "train")["spec"]
            assert ALLOCATION_ANNOTATION not in kube.get_pod("default", "train")["metadata"]["annotations"]
            prio = http.post(proc.url + "/prioritize", json={"Pod": pod, "NodeNames": ["gpu-1"]}, timeout=30).json()
            assert all(s["Score"] == 0 for s in prio)
            # The pod list comes through: the model is whole, and the node is full.
            kube.clear_faults()
            _wait(lambda: _get(http, proc.url + "/readyz") == 200, "the extender to become ready")
            ans = http.post(proc.url + "/filter", json={"Pod": pod, "NodeNames": ["gpu-1"]}, timeout=30).json()
            assert not ans["NodeNames"] and "0 free" in ans["FailedNodes"]["gpu-1"], ans
            assert "cannot bind default/train to gpu-1" in http.post(proc.url + "/bind", json=bind, timeout=30).json()["Error"]
            held = [u for u, a in http.get(proc.url + "/state", timeout=30).json()["allocations"].items()]
            assert held == [kube.get_pod("default", "holder")["metadata"]["uid"]]
        finally:
            http.close()
            proc.stop()


def _get(http: requests.Session, url: str) -> int:
    try:
        return http.get(url, timeout=5).status_code
    except requests.RequestException:
        return 0


def _log(proc: ExtenderProcess) -> str:
    return Path(proc.log.name).read_text(errors="replace")


def test_a_stale_model_refuses_and_a_raising_readiness_check_too():
    """The gate reads the same readiness as /readyz: stale -> refuse; cannot tell -> refuse."""
    state = {"ok": True, "raise": False}

    def ready():
        if state["raise"]:
            raise RuntimeError("feeder crashed")
        return state["ok"], "synced" if state["ok"] else "pods watch failing for 75s (9 attempts); the model may be stale"

    model = model_from({"nodes": [{"name": "node-a", "gpus": gpus("Tesla T4", 2, "16Gi")}]})
    pod = {"metadata": {"name": "p1", "namespace": "default", "uid": "uid-p1"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    bind = {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "node-a"}
    with Server(ExtenderService(model), ready=ready) as srv:
        for how in ("stale", "raise"):
            state.update({"ok": how != "stale", "raise": how == "raise"})
            ans = srv.post("/filter", {"Pod": pod, "NodeNames": ["node-a"]}).json()
            assert not ans["NodeNames"] and NOT_READY in ans["FailedNodes"]["node-a"]
            assert ("may be stale" if how == "stale" else "feeder crashed") in ans["FailedNodes"]["node-a"]
            assert NOT_READY in srv.post("/bind", bind).json()["Error"]
            assert model.allocations == {}
            # Bad requests are still told what is wrong with them.
            assert srv.post("/filter", data=b"[1]").status_code == 400
        state.update({"ok": True, "raise": False})
        assert srv.post("/filter", {"Pod": pod, "NodeNames": ["node-a"]}).json()["NodeNames"] == ["node-a"]
        assert srv.post("/bind", bind).json() == {"Error": ""}
        assert 'stowage_extender_requests_total{outcome="not_ready",verb="bind"} 2.0' in srv.get("/metrics").text


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "split"])
def test_a_standby_whose_watch_went_stale_refuses(tmp_path, workers):
    """A synced extender whose pod watch then keeps failing (the API server unreachable for it,
    say) decides nothing once the failure is older than --stale-after, and again once it recovers."""
    with FakeKube() as kube:
        kube.create_node(dict(node_objects(parse_cluster(CLUSTER, "test"))[0], apiVersion="v1", kind="Node"))
        pod = kube.create_pod(make_pod("train", gpus=1))
        proc = ExtenderProcess(None, extra_args=("--kubeconfig", kubeconfig_file(tmp_path, kube.url),
                                                 "--workers", str(workers), "--stale-after", "2"),
                               log_dir=str(tmp_path))
        http = requests.Session()
        body = {"Pod": pod, "NodeNames": ["gpu-1"]}
        try:
            _wait(lambda: _get(http, proc.url + "/readyz") == 200, "the extender to sync")
            assert http.post(proc.url + "/filter", json=body, timeout=30).json()["NodeNames"] == ["gpu-1"]
            kube.fail_next(100_000, status=503, path="^/api/v1/pods$", method="GET")
            kube.drop_watches()
            _wait(lambda: _get(http, proc.url + "/readyz") == 503, "the extender to call its model stale")
            ans = http.post(proc.url + "/filter", json=body, timeout=30).json()
            assert not ans["NodeNames"] and NOT_READY in ans["FailedNodes"]["gpu-1"]
            assert "may be stale" in ans["FailedNodes"]["gpu-1"]
            m = pod["metadata"]
            bind = {"PodName": "train", "PodNamespace": "default", "PodUID": m["uid"], "Node": "gpu-1"}
            assert "may be stale" in http.post(proc.url + "/bind", json=bind, timeout=30).json()["Error"]
            assert "nodeName" not in kube.get_pod("default", "train")["spec"]
            kube.clear_faults()
            _wait(lambda: _get(http, proc.url + "/readyz") == 200, "the watch to recover")
            assert http.post(proc.url + "/bind", json=bind, timeout=30).json() == {"Error": ""}
        finally:
            http.close()
            proc.stop()
