"""Every reason the extender gives for a node reads right inside kube-scheduler's event.

kube-scheduler (1.28, seen in tests/integration/test_real_scheduler.py) writes a pod's
FailedScheduling message as ``0/N nodes are available: <count> <reason>, <count> <reason>.``:
each distinct reason prefixed by how many nodes gave it, joined with ", ". A reason that starts
with a number reads as one with the count ("16 0 free cards, ..."), and a reason with ", " inside
cannot be told apart from the next one. So no reason may do either; this checks all the kinds of
reasons filter produces, on a small cluster built to produce each of them. (The host CPU and
memory reasons are the benchmark's only: the server never sets a pod's host request, kube-scheduler
checks those itself.)
"""
from __future__ import annotations

import re

import pytest

from extender.service import ExtenderService
from extender.wire import parse_extender_args
from extender_harness import gpus, model_from, take_shared, take_whole

GIB = 1024


def service() -> ExtenderService:
    model = model_from({"nodes": [
        {"name": "a100", "cpu": 8, "memory": "64Gi", "gpus": gpus("NVIDIA A100-SXM4-80GB", 4, "80Gi", unhealthy=[3])},
        {"name": "t4", "gpus": gpus("Tesla T4", 4, "16Gi")},
        {"name": "cpu-only"},
    ]})
    take_whole(model, "a100", [0], "w")
    take_shared(model, "a100", 1, 70 * GIB, "s", core_milli=900)
    take_shared(model, "a100", 2, 10 * GIB, "s2", core_milli=600)
    return ExtenderService(model)


def pod(limits: dict[str, str], annotations: dict[str, str] | None = None) -> dict:
    return {"metadata": {"name": "p", "namespace": "t", "uid": "uid-p", "annotations": annotations or {}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


CASES = [  # (limits, annotations)
    ({"nvidia.com/gpu": "2"}, {}),                                        # too few free cards (a100)
    ({"nvidia.com/gpu": "8"}, {}),                                        # never enough cards
    ({"nvidia.com/gpu": "1"}, {"stowage.io/gpu-model": "B200"}),          # excluded by model
    ({"nvidia.com/gpu": "1"}, {"stowage.io/min-card-memory": "40"}),      # excluded by size
    ({"nvidia.com/gpu-memory": "90"}, {}),                                # no card that big
    ({"nvidia.com/gpu-memory": "10", "nvidia.com/gpu-core": "50"},        # compute
     {"stowage.io/gpu-model": "A100"}),
    ({"nvidia.com/gpu-memory": "10"}, {"stowage.io/gpu-model": "V100"}),  # no usable card
    ({"nvidia.com/gpu": "1"}, {"stowage.io/node-policy": "tight"}),       # bad annotation value
    ({"nvidia.com/gpu": "1"}, {"stowage.io/gpu-modle": "A100"}),          # unknown annotation
    ({"nvidia.com/gpu": "-1"}, {}),                                       # bad quantities
    ({"nvidia.com/gpu": "1.5"}, {}),
    ({"nvidia.com/gpu-memory": "8", "nvidia.com/gpu-core": "150"}, {}),
]


@pytest.mark.parametrize("limits,annotations", CASES)
def test_reasons_survive_kube_schedulers_count_prefix_and_comma_join(limits, annotations) -> None:
    svc = service()
    res = svc.filter(parse_extender_args({"Pod": pod(limits, annotations),
                                          "NodeNames": ["a100", "t4", "cpu-only", "ghost"]}))
    reasons = {**res.failed, **res.unresolvable}
    assert set(reasons) | set(res.node_names) == {"a100", "t4", "cpu-only", "ghost"} and "a100" in reasons
    for node, why in reasons.items():
        assert not re.match(r"\d", why), f"{node}: {why!r} starts with a number"
        assert ", " not in why, f"{node}: {why!r} has ', ' inside"


def test_the_cases_reach_every_kind_of_reason() -> None:
    """The cases above are not all the same reason: each kind the filter knows shows up."""
    seen = set()
    for limits, annotations in CASES:
        res = service().filter(parse_extender_args({"Pod": pod(limits, annotations),
                                                    "NodeNames": ["a100", "t4", "cpu-only", "ghost"]}))
        seen.update({**res.failed, **res.unresolvable}.values())
    text = "\n".join(sorted(seen))
    for fragment in ("free card", "excluded by model/size policy", "unhealthy", "GPU memory free",
                     "% compute free", "no usable card", "node has no GPUs",
                     "unknown to Stowage", "Stowage cannot schedule this pod", "unknown annotation"):
        assert fragment in text, f"no case gives a reason with {fragment!r}:\n{text}"
