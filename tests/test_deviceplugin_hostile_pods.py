"""A pod on the node whose containers or resources are not what the API server stores (not a list,
not objects) is that pod's problem only: the device plugin still serves every other pod of the node.

No kube-apiserver stores such a pod, but the plugin reads what its API connection answers, and
anything bound to the node is read at every Allocate: the survey reads every pod of the node, so
one unreadable pod must not fail the kubelet's calls for all of them (as a hostile record once did,
tests/test_hostile_annotations.py). Before: ``resources.limits: [...]`` raised AttributeError and
``containers: 5`` TypeError inside ``allocator.survey``, and the kubelet got UNKNOWN for every GPU
pod of the node.
"""
from __future__ import annotations

import pytest

from dp_harness import NODE, bind_pod, container, record, rig
from fakekube import make_pod

from deviceplugin import allocator
from deviceplugin.kube import pod_for_plugin
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY

HOSTILE_SPECS = {
    "resources-a-list": {"containers": [{"name": "c", "resources": ["nvidia.com/gpu"]}]},
    "resources-a-string": {"containers": [{"name": "c", "resources": "x"}]},
    "limits-a-list": {"containers": [{"name": "c", "resources": {"limits": [{"nvidia.com/gpu": "1"}]}}]},
    "requests-a-number": {"containers": [{"name": "c", "resources": {"requests": 7}}]},
    "containers-a-number": {"containers": 5},
    "containers-an-object": {"containers": {"name": "c"}},
    "init-containers-a-string": {"containers": [], "initContainers": "x"},
}


def hostile_pod(shape: str) -> dict:
    pod = make_pod("bystander", namespace="tenant-b", node=NODE)
    pod["spec"].update(HOSTILE_SPECS[shape])
    return pod


@pytest.mark.parametrize("slim", [False, True], ids=["as-listed", "slim"])
@pytest.mark.parametrize("shape", sorted(HOSTILE_SPECS))
def test_the_survey_notes_an_unreadable_pod_and_goes_on(shape, slim):
    pod = hostile_pod(shape)
    if slim:
        pod = pod_for_plugin(pod)
    for resource in (RESOURCE_GPU, RESOURCE_GPU_MEMORY, RESOURCE_GPU_CORE):
        found = allocator.survey([pod], NODE, resource, allocator.Ledger())
        assert found.candidates == []
        # said only where it could be asking for devices: a shape that hides every request says so
        assert all("tenant-b/bystander" in n for n in found.notes)


@pytest.mark.parametrize("shape", sorted(HOSTILE_SPECS))
def test_an_unreadable_bystander_pod_does_not_block_the_nodes_gpu_pods(monkeypatch, shape):
    with rig(monkeypatch) as r:
        assert r.registered()
        r.kube.create_pod(hostile_pod(shape))
        pod = bind_pod(r, "victim", [container("main", gpus=1)],
                       record([(2, r.uuid(2))], whole=True, mem_mib=23028, core_milli=1000),
                       "2024-01-01T00:00:01Z")
        got = r.kubelet.admit(pod)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"]
        assert got == r.uuid(2)
        r.plugin.reconciler.run_once()
