"""Under the default `pack` policy (Stowage's placer) the card choice still honours NVLink/NUMA
locality for multi-GPU pods and `stowage.io/card-policy: spread` for shared pods."""
from __future__ import annotations

from extender.service import ExtenderService
from extender.wire import parse_binding_args, parse_extender_args
from extender_harness import gpus, model_from, take_shared, take_whole

GIB = 1024


def service():
    model = model_from({"nodes": [
        {"name": "h", "gpus": gpus("NVIDIA H100-SXM5-80GB", 8, "80Gi", numa=[0, 0, 0, 0, 1, 1, 1, 1],
                                   nvlink=[[0, 1, 2, 3], [4, 5, 6, 7]])}]})
    svc = ExtenderService(model)
    assert type(svc.placers["pack"]).__name__ == "StowagePlacer"  # the default placer
    return model, svc


def place(svc, name: str, limits: dict, annotations: dict | None = None) -> list[int]:
    pod = {"metadata": {"name": name, "namespace": "t", "uid": f"uid-{name}", "annotations": annotations or {}},
           "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}
    res = svc.filter(parse_extender_args({"Pod": pod, "NodeNames": ["h"]}))
    assert res.node_names == ["h"], res.failed
    err = svc.bind(parse_binding_args({"PodName": name, "PodNamespace": "t", "PodUID": f"uid-{name}", "Node": "h"}))
    assert err == ""
    return list(svc.model.allocations[f"uid-{name}"].cards)


def test_multi_gpu_pod_stays_in_one_nvlink_group():
    model, svc = service()
    take_whole(model, "h", [0], "other")
    # the lowest free cards would be 1,2,3,4 (two NVLink groups); one group is free: 4-7
    assert place(svc, "four", {"nvidia.com/gpu": "4"}) == [4, 5, 6, 7]


def test_shared_pod_with_card_policy_spread_takes_the_emptiest_card():
    model, svc = service()
    take_shared(model, "h", 0, 60 * GIB * 1024 // 1024, "s0")
    take_whole(model, "h", [1, 2, 3, 4, 5, 6], "w")
    # cards 0 (60 GiB used) and 7 (empty) can take 10 GiB; spread asks for the emptiest
    assert place(svc, "sp", {"nvidia.com/gpu-memory": "10"}, {"stowage.io/card-policy": "spread"}) == [7]
