"""Issue 12, item 4: no quantity a pod author writes can poison the extender for the next pod.

Every quantity is parsed by Kubernetes' own grammar (no NaN, Infinity, ``80_000``) and bounded:
a request no card could ever hold is rejected for that pod alone, as unresolvable, before any
placer learns from it. Runs the default placers (the ones that learn the workload mix).
"""
from __future__ import annotations

import pytest

from extender.service import ExtenderService
from extender_harness import Server, gpus, model_from

NODES = ["node-a", "node-b"]


def cluster():
    return model_from({"nodes": [
        {"name": "node-a", "gpus": gpus("NVIDIA A100-SXM4-80GB", 4, "80Gi")},
        {"name": "node-b", "gpus": gpus("Tesla T4", 2, "16Gi")},
    ]})


def pod(name, limits, annotations=None):
    return {"metadata": {"name": name, "namespace": "default", "uid": "uid-" + name, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


@pytest.fixture
def srv():
    s = Server(ExtenderService(cluster()))
    yield s
    s.close()


def place(srv: Server, p: dict) -> str:
    """filter -> prioritize -> bind as kube-scheduler does; the node bound to."""
    f = srv.post("/filter", {"Pod": p, "Nodes": None, "NodeNames": NODES}).json()
    assert f["NodeNames"], f
    scores = srv.post("/prioritize", {"Pod": p, "Nodes": None, "NodeNames": f["NodeNames"]}).json()
    node = max(scores, key=lambda s: s["Score"])["Host"] if scores else f["NodeNames"][0]
    b = srv.post("/bind", {"PodName": p["metadata"]["name"], "PodNamespace": "default",
                           "PodUID": p["metadata"]["uid"], "Node": node}).json()
    assert not b.get("Error"), b
    return node


HOSTILE_MEMORY = ["1e400", "99999999999999999999999", "NaN", "Infinity", "-Infinity", "inf", "80_000", "1e18",
                  "0x10", " 4", "4 ", "+-4", "4Gi ", "1e3Ki", ".5", "5e-1"]


@pytest.mark.parametrize("value", HOSTILE_MEMORY)
def test_hostile_gpu_memory_is_refused_for_that_pod_only(srv: Server, value: str) -> None:
    r = srv.post("/filter", {"Pod": pod("bad", {"nvidia.com/gpu-memory": value}), "Nodes": None, "NodeNames": NODES})
    assert r.status_code == 200
    ans = r.json()
    assert ans["NodeNames"] == [] and not ans.get("Error")
    assert set(ans["FailedAndUnresolvableNodes"]) == set(NODES), ans
    reason = ans["FailedAndUnresolvableNodes"]["node-a"]
    assert "nvidia.com/gpu-memory" in reason and "internal error" not in reason, reason
    # the next pods, shared and whole, are placed as if the bad one had never been seen
    assert place(srv, pod("good-share", {"nvidia.com/gpu-memory": "10"})) in NODES
    assert place(srv, pod("good-share-2", {"nvidia.com/gpu-memory": "20", "nvidia.com/gpu-core": "30"})) in NODES
    assert place(srv, pod("good-whole", {"nvidia.com/gpu": "1"})) in NODES


@pytest.mark.parametrize("value,why", [
    ("NaN", "not a quantity"), ("Infinity", "not a quantity"), ("8e1x", "not a quantity"), ("80_000", "not a quantity"),
    ("1e400", "could ever hold"), ("-80", "negative"),
])
def test_hostile_min_card_memory_is_refused_with_a_reason(srv: Server, value: str, why: str) -> None:
    p = pod("bad-ann", {"nvidia.com/gpu": "1"}, {"stowage.io/min-card-memory": value})
    ans = srv.post("/filter", {"Pod": p, "Nodes": None, "NodeNames": NODES}).json()
    assert ans["NodeNames"] == []
    reason = ans["FailedAndUnresolvableNodes"]["node-a"]
    assert "stowage.io/min-card-memory" in reason and why in reason and "internal error" not in reason, reason


@pytest.mark.parametrize("value,fits", [("8e1", ["node-a"]), ("80", ["node-a"]), ("80Gi", ["node-a"]),
                                        ("16Gi", ["node-a", "node-b"]), ("17", ["node-a"])])
def test_min_card_memory_bare_numbers_are_gib_in_every_notation(srv: Server, value: str, fits: list[str]) -> None:
    """``8e1`` is 80 (GiB), not 80 bytes: a bare number, whatever its notation, is GiB."""
    p = pod("ann-" + value, {"nvidia.com/gpu": "1"}, {"stowage.io/min-card-memory": value})
    ans = srv.post("/filter", {"Pod": p, "Nodes": None, "NodeNames": NODES}).json()
    assert ans["NodeNames"] == fits, ans
