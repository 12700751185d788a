"""A reservation left behind on another node (a failed bind whose clean-up failed too) never
blocks the pod forever, and a pod that really is bound is never moved."""
from __future__ import annotations

from extender.service import ExtenderService
from extender_harness import Server, gpus, model_from, simple_placers
from stowage.resources import GpuRequest

BODY = {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "node-b"}


def cluster():
    return model_from({"nodes": [{"name": "node-a", "gpus": gpus("NVIDIA A100-SXM4-80GB", 2, "80Gi")},
                                 {"name": "node-b", "gpus": gpus("NVIDIA A100-SXM4-80GB", 2, "80Gi")}]})


class Pods:
    """The pod source (the feeder in Kubernetes mode): p1 as the API server has it."""

    def __init__(self, node_name=None, fail=False):
        self.node_name, self.fail, self.calls = node_name, fail, 0

    def get_pod(self, namespace, name):
        self.calls += 1
        if self.fail:
            raise ConnectionError("API server unreachable")
        spec = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        if self.node_name:
            spec["nodeName"] = self.node_name
        return {"metadata": {"name": name, "namespace": namespace, "uid": "uid-p1"}, "spec": spec}


def stale(model):
    """What the feeder does when it reads a record left on an unbound pod: node-a card 0."""
    model.assign("uid-p1", "default/p1", "node-a", [0], GpuRequest(gpus=1), check=False)


def test_unbound_pod_with_stale_record_is_bound_elsewhere_and_old_cards_freed():
    model = cluster()
    stale(model)
    pods = Pods(node_name=None)
    with Server(ExtenderService(model, pod_source=pods, placer_factory=simple_placers)) as srv:
        assert srv.post("/bind", BODY).json() == {"Error": ""}
    assert model.allocations["uid-p1"].node == "node-b"
    a, ia = model.a, model.index["node-a"]
    assert a.pods[ia].sum() == 0 and pods.calls >= 1


def test_bound_pod_is_never_moved():
    model = cluster()
    stale(model)
    with Server(ExtenderService(model, pod_source=Pods(node_name="node-a"), placer_factory=simple_placers)) as srv:
        err = srv.post("/bind", BODY).json()["Error"]
    assert "already holds cards [0] on node node-a" in err and "bound to node-a" in err
    assert model.allocations["uid-p1"].node == "node-a"


def test_api_down_keeps_the_reservation_and_says_why():
    model = cluster()
    stale(model)
    with Server(ExtenderService(model, pod_source=Pods(fail=True), placer_factory=simple_placers)) as srv:
        err = srv.post("/bind", BODY).json()["Error"]
    assert "cannot check whether it is bound" in err and "API server unreachable" in err
    assert model.allocations["uid-p1"].node == "node-a"
