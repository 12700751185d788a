"""Issue 13 (smaller things): each pod teaches the placers once, however many scheduling cycles
it goes through. kube-scheduler may send a pod again after the extender bound it (a bind answer
lost to a timeout, a second cycle): it used to be learned twice, skewing the workload mix."""
from __future__ import annotations

from extender.service import ExtenderService
from extender_harness import Server, gpus, model_from
from packing.registry import placer_for

NODES = ["node-a"]


def counting_placers(seen: list):
    def factory(policy_value: str):
        placer = placer_for(policy_value)
        observe = placer.observe

        def counted(req, *args):
            seen.append((policy_value, req))
            return observe(req, *args)
        placer.observe = counted
        return placer
    return factory


def test_a_pod_sent_again_after_its_bind_is_learned_once():
    seen: list = []
    model = model_from({"nodes": [{"name": "node-a", "gpus": gpus("NVIDIA A100-SXM4-80GB", 4, "80Gi")}]})
    with Server(ExtenderService(model, placer_factory=counting_placers(seen))) as srv:
        pod = {"metadata": {"name": "p", "namespace": "default", "uid": "uid-p", "resourceVersion": "7"},
               "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu-memory": "10"}}}]}}
        body = {"Pod": pod, "Nodes": None, "NodeNames": NODES}
        assert srv.post("/filter", body).json()["NodeNames"] == NODES
        assert srv.post("/bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p",
                                  "Node": "node-a"}).json() == {"Error": ""}
        learned = len(seen)
        assert learned == 2        # once per placer (pack and spread)
        # a second cycle of the same pod, a later version of it, and a prioritize: nothing new
        srv.post("/filter", body)
        pod["metadata"]["resourceVersion"] = "8"
        srv.post("/filter", body)
        srv.post("/prioritize", body)
        assert len(seen) == learned
