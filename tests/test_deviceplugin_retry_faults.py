"""Lost Allocate answers and the kubelet's retries: what the plugin keeps and what it answers.

Found by experiment with the rig (fake kubelet over real gRPC, fake NVML, fake API server), each
test failing before its fix:

- every lost answer of a regular container (one the kubelet never took up: another caller's, or one
  cut off by a kubelet restart) was appended to the plugin's ledger, for as long as the pod lived:
  50 lost answers, 50 entries. A container's answer replaces what was booked for it and after it.
"""
from __future__ import annotations

import pytest

from dp_harness import bind_pod, container, record, rig

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
