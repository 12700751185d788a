"""Bind's reads of a pod through the pod source (the feeder's GET in Kubernetes mode) answering
something that is not a pod: a JSON list or text, or metadata of another type (a proxy's answer, a
peer that lies). Found by experiment: ExtenderService.bind raised AttributeError (an internal
error with a traceback, not an answer about the pod) for a pod not seen at filter, and for a pod
holding cards on another node. Now each is a clear refusal of that bind, the model unchanged; and
the hold timer takes such an answer for an unreadable pod (tried again), not a release."""
from __future__ import annotations

import pytest

from extender.service import HOLD_RECHECK_S, ExtenderService
from extender.wire import BindingArgs
from extender_harness import gpus, model_from, simple_placers
from extender_kube_helpers import FakeClock
from stowage.resources import GpuRequest

HOSTILE = [[], "pod", 7, {"metadata": "m", "spec": {}}, {"metadata": ["uid-p1"]},
           {"metadata": {"uid": "uid-p1", "name": "p1", "namespace": "default"}, "spec": ["node-a"]}]
IDS = ["list", "text", "number", "meta-text", "meta-list", "spec-list"]


class Answers:
    """The pod source: every read answers ``pod``."""

    def __init__(self, pod) -> None:
        self.pod = pod
        self.calls = 0

    def get_pod(self, namespace: str, name: str):
        self.calls += 1
        return self.pod


def cluster():
    return model_from({"nodes": [{"name": "node-a", "gpus": gpus("NVIDIA A100-SXM4-80GB", 1, "80Gi")},
                                 {"name": "node-b", "gpus": gpus("NVIDIA A100-SXM4-80GB", 1, "80Gi")}]})


def held(model) -> dict:
    with model.lock:
        return {u: (a.node, a.cards) for u, a in model.allocations.items()}


@pytest.mark.parametrize("pod", HOSTILE, ids=IDS)
def test_a_pod_not_seen_at_filter_read_as_no_pod_is_a_refusal(pod):
    model = cluster()
    src = Answers(pod)
    svc = ExtenderService(model, pod_source=src, placer_factory=simple_placers)
    err = svc.bind(BindingArgs("p1", "default", "uid-p1", "node-a"))
    assert "default/p1" in err and "not a pod" in err and src.calls == 1
    assert held(model) == {}


@pytest.mark.parametrize("pod", HOSTILE, ids=IDS)
def test_a_stale_reservation_is_kept_when_the_pod_reads_as_no_pod(pod):
    model = cluster()
    model.assign("uid-p1", "default/p1", "node-a", [0], GpuRequest(gpus=1), check=False)
    svc = ExtenderService(model, pod_source=Answers(pod), placer_factory=simple_placers)
    err = svc.bind(BindingArgs("p1", "default", "uid-p1", "node-b"))
    assert "already holds cards [0] on node node-a" in err and "not a pod" in err
    assert held(model) == {"uid-p1": ("node-a", (0,))}


@pytest.mark.parametrize("pod", HOSTILE, ids=IDS)
def test_a_lapsed_hold_whose_pod_reads_as_no_pod_is_kept_and_tried_again(pod):
    model = cluster()
    model.assign("uid-p1", "default/p1", "node-a", [0], GpuRequest(gpus=1), check=False)
    svc = ExtenderService(model, pod_source=Answers(pod), placer_factory=simple_placers, clock=FakeClock())
    with model.lock:
        svc._hold_unknown("uid-p1")
    svc._clock.t += svc.unknown_outcome_hold_s
    assert svc.end_lapsed_holds() == HOLD_RECHECK_S
    assert held(model) == {"uid-p1": ("node-a", (0,))}
    assert svc.state()["allocations"]["uid-p1"]["bindOutcomeUnknown"] is True
