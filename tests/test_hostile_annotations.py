"""What a pod author (or a node's owner) writes into Stowage's annotations and the kubelet's
checkpoint stays the problem of that one object, in every reader: the device plugin, the
extender's watch, the node inventory and the exporter's checkpoint reader.

Found by review: a record ``{"cards":[{"index":1e999,...}]}`` (``int(inf)`` raises
OverflowError) or ``"[" * 100000`` (RecursionError) on ANY running pod of a node made every
GetPreferredAllocation on that node fail, so the kubelet refused every GPU pod there, signed
clusters included (the record is read before its signature is checked).
"""
from __future__ import annotations

import pytest

from dp_harness import NODE, bind_pod, container, record, rig
from fakekube import make_pod

from exporter import checkpoint as ckpt
from extender.kube_objects import pod_view
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, RecordKey, encode_allocation
from stowage.inventory import INVENTORY_ANNOTATION, InventoryError, decode_inventory, inventory_from_node
from stowage.resources import RESOURCE_GPU

OVERFLOW = ('{"version":1,"node":"gpu-node-1","whole":true,'
            '"cards":[{"index":1e999,"uuid":"x","memoryMiB":1,"coreMilli":1}]}')
DEEP = "[" * 100_000
KEY = RecordKey(b"h" * 32)


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
@pytest.mark.parametrize("hostile", [OVERFLOW, DEEP], ids=["overflow", "deep"])
def test_a_hostile_record_on_a_bystander_pod_does_not_block_the_nodes_gpu_pods(monkeypatch, hostile, signed):
    key = KEY if signed else None
    with rig(monkeypatch, record_key=key) as r:
        assert r.registered()
        bystander = make_pod("bystander", namespace="tenant-b", node=NODE, phase="Running",
                             annotations={ALLOCATION_ANNOTATION: hostile})
        bystander["status"]["startTime"] = "2024-01-01T00:00:00Z"
        r.kube.create_pod(bystander)
        if signed:
            pod = bind_pod(r, "victim", [container("main", gpus=1)], None, "2024-01-01T00:00:01Z")
            rec = AllocationRecord(NODE, (CardShare(2, r.uuid(2), 23028, 1000),), True)
            r.kube.patch_pod("default", "victim", {"metadata": {"annotations": {
                ALLOCATION_ANNOTATION: encode_allocation(rec, key, pod["metadata"]["uid"])}}})
            pod = r.kube.get_pod("default", "victim")
        else:
            pod = bind_pod(r, "victim", [container("main", gpus=1)],
                           record([(2, r.uuid(2))], whole=True, mem_mib=23028, core_milli=1000),
                           "2024-01-01T00:00:01Z")
        got = r.kubelet.admit(pod)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"]
        assert got == r.uuid(2)
        r.plugin.reconciler.run_once()   # raised on every round before


@pytest.mark.parametrize("hostile", [OVERFLOW, DEEP], ids=["overflow", "deep"])
def test_the_extender_reads_a_hostile_record_as_that_pods_error(hostile):
    """The watch's reader: the pod holds no cards, says why, and still counts on its node (before,
    the exception skipped the whole pod, so its CPU and memory went uncounted)."""
    pod = {"metadata": {"name": "p", "namespace": "d", "uid": "u", "annotations": {ALLOCATION_ANNOTATION: hostile}},
           "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
           "status": {}}
    v = pod_view(pod)
    assert v.record is None and ALLOCATION_ANNOTATION in v.error and v.node == "n1" and v.cpu_milli == 2000


@pytest.mark.parametrize("value", [
    '{"cards":[{"index":1e999,"uuid":"x","memoryMiB":1}]}',
    '{"cards":[{"index":0,"uuid":"x","memoryMiB":Infinity}]}',
    '{"cards":[{"index":0,"uuid":"x","memoryMiB":1,"numa":-Infinity}]}',
    '{"cards":[{"index":0,"uuid":"x","memoryMiB":1,"nvlink":[1e999]}]}',
    '{"cards":[{"index":0,"uuid":"x","memoryMiB":1}],"memoryUnitMiB":1e999}',
    '{"cards":[{"index":0,"uuid":"x","memoryMiB":1}],"memoryUnitMiB":-4}',
    '{"cards":[7]}',
    '{"cards":[{"index":' + "9" * 300 + ',"uuid":"x","memoryMiB":1}]}',
    DEEP,
], ids=["index-inf", "memory-inf", "numa-inf", "nvlink-inf", "unit-inf", "unit-negative", "card-not-object",
        "index-huge", "deep"])
def test_a_hostile_inventory_is_an_inventory_error(value):
    with pytest.raises(InventoryError, match=INVENTORY_ANNOTATION):
        decode_inventory(value)
    with pytest.raises(InventoryError):
        inventory_from_node({"metadata": {"name": "n", "annotations": {INVENTORY_ANNOTATION: value}}})


def test_a_deeply_nested_checkpoint_is_a_checkpoint_error():
    with pytest.raises(ckpt.CheckpointError):
        ckpt.parse(DEEP)
