"""Lost Allocate answers and the kubelet's retries: what the plugin keeps and what it answers.

Found by experiment with the rig (fake kubelet over real gRPC, fake NVML, fake API server), each
test failing before its fix:

- every lost answer of a regular container (one the kubelet never took up: another caller's, or one
  cut off by a kubelet restart) was appended to the plugin's ledger, for as long as the pod lived:
  50 lost answers, 50 entries. A container's answer replaces what was booked for it and after it.
- a pod whose init container's answer was lost, asked again by a restarted kubelet, had that request
  taken for its main container when both ask for the same number of devices: refused in the fallback
  (no PodResources), and never movable off a card that went Unhealthy meanwhile. The kubelet's
  GetPreferredAllocation tells the two apart: the main container's carries the init container's
  devices in ``must_include`` (it reuses them), a retry of the first container carries none.
- a refusal for a pod whose recorded card is Unhealthy did not say so.
"""
from __future__ import annotations

import grpc
import pytest

from dp_harness import bind_pod, container, record, rig
from fakekubelet import AdmissionError

from deviceplugin.v1beta1 import api_pb2 as pb
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_MEMORY


def _allocate(r, resource, ids):
    """An Allocate whose answer the kubelet never records (another caller, or one cut off)."""
    req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
    return r.kubelet.call_raw(resource, "Allocate", req).container_responses[0]


def _entries(r) -> int:
    return sum(len(v) for v in r.plugin.allocs.ledger.given.values())


@pytest.mark.parametrize("init", [False, True])
def test_repeated_lost_answers_do_not_grow_the_ledger(monkeypatch, init):
    with rig(monkeypatch) as r:
        assert r.registered()
        u0 = r.uuid(0)
        pod = bind_pod(r, "w", [container("main", gpus=1)], record([(0, u0)], whole=True), "2024-01-01T00:00:01Z",
                       init=[container("setup", gpus=1)] if init else None)
        r.kubelet.take_up(pod)
        for _ in range(40):
            _allocate(r, RESOURCE_GPU, [u0])
        assert _entries(r) <= 1 + init     # one per container at most, not one per answer
        got = r.kubelet.admit(pod)          # ... and the pod's real admission is still served
        assert got["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u0
        assert _entries(r) <= 1 + init


def _lost_init_answer(r, card: int, restart: bool = True):
    """Pod i (init container and main container of 1 card each, recorded on ``card``) taken up; its
    init container's answer lost; then the kubelet restarts."""
    u = r.uuid(card)
    pod = bind_pod(r, "i", [container("main", gpus=1)], record([(card, u)], whole=True), "2024-01-01T00:00:01Z",
                   init=[container("setup", gpus=1)])
    r.kubelet.take_up(pod)
    _allocate(r, RESOURCE_GPU, [u])
    return pod, u


def _restart(r):
    r.kubelet.restart()
    assert r.registered()


@pytest.mark.parametrize("podresources", [True, False])
def test_a_lost_init_answer_of_the_main_containers_size_is_served_again(monkeypatch, podresources):
    """Init and main of 1 card each; the init answer lost; the restarted kubelet asks for the init
    container again (GetPreferredAllocation, no must_include), then for main reusing its device."""
    with rig(monkeypatch, podresources=podresources) as r:
        assert r.registered()
        pod, u0 = _lost_init_answer(r, 0)
        _restart(r)
        got = r.kubelet.admit(pod)
        assert got["setup"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u0
        assert got["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u0
        # the plugin's count is right again: the pod is served, a replay is refused
        with pytest.raises(grpc.RpcError) as err:
            _allocate(r, RESOURCE_GPU, [u0])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_the_main_container_after_a_kept_init_answer_is_still_served(monkeypatch):
    """The other reading, without PodResources: the init answer was taken up and the main container's
    lost; the restarted kubelet asks for main alone, reusing the init device (Allocate only)."""
    with rig(monkeypatch, podresources=False) as r:
        assert r.registered()
        pod, u0 = _lost_init_answer(r, 0)
        _restart(r)
        assert _allocate(r, RESOURCE_GPU, [u0]).envs["NVIDIA_VISIBLE_DEVICES"] == u0


def _unhealthy(r, u):
    r.nvml.xid(u, 79)
    assert r.kubelet.wait_for(lambda: r.kubelet.devices(RESOURCE_GPU).get(u) == "Unhealthy")


def test_a_retried_pod_whose_card_went_unhealthy_moves_to_an_equal_card(monkeypatch):
    """A regular container's answer lost, the card then Unhealthy, the kubelet restarts: the kubelet
    offers no device of the card, the pod got nothing, so it moves to the equal healthy card."""
    with rig(monkeypatch) as r:
        assert r.registered()
        u0, u1 = r.uuid(0), r.uuid(1)
        pod = bind_pod(r, "w", [container("main", gpus=1)], record([(0, u0)], whole=True), "2024-01-01T00:00:01Z")
        r.kubelet.take_up(pod)
        _allocate(r, RESOURCE_GPU, [u0])
        _unhealthy(r, u0)
        _restart(r)
        assert r.kubelet.admit(pod)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u1


def test_a_retried_init_container_whose_card_went_unhealthy_moves_to_an_equal_card(monkeypatch):
    """The same for an init container asked again: nothing of the pod is on the card for the kubelet,
    so the pod moves whole (init and main) to the equal healthy card; before, refused as
    'no pod waiting matches' without a word about the card."""
    with rig(monkeypatch) as r:
        assert r.registered()
        pod, u0 = _lost_init_answer(r, 0)
        _unhealthy(r, u0)
        _restart(r)
        got = r.kubelet.admit(pod)
        u1 = r.uuid(1)
        assert got["setup"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u1
        assert got["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u1


@pytest.mark.parametrize("podresources", [True, False])
def test_a_retried_pod_with_no_equal_healthy_card_is_refused_saying_why(monkeypatch, podresources):
    """Card 3 (the only T4) goes Unhealthy after the pod's init answer was lost: nowhere to move it
    (or, without PodResources, no move at all), so the retry is refused, and the refusal the kubelet
    writes into the pod's status names the card and says it is Unhealthy."""
    with rig(monkeypatch, podresources=podresources) as r:
        assert r.registered()
        pod, u3 = _lost_init_answer(r, 3)
        r.nvml.lose(u3)   # the T4 reports no XID events: its probe finds it gone
        assert r.kubelet.wait_for(lambda: r.kubelet.devices(RESOURCE_GPU).get(u3) == "Unhealthy")
        _restart(r)
        with pytest.raises(AdmissionError) as err:
            r.kubelet.admit(pod)
        assert f"{u3} is Unhealthy" in str(err.value)
        assert "default/i" in str(err.value)
