"""Odd or hostile ``stowage.io/allocation`` records on bound pods cost only their own pod.

Anyone who can edit a pod can write its record (docs/security.md). Through the real feed (the
fake API server, the real ``kubernetes`` client): a record the extender could not have written
for the pod is a pod error, the pod holds no card in the model, no other pod's card is lost or
booked twice, and after the pod goes every card is exactly as before.
"""
from __future__ import annotations

import pytest
from extender_kube_helpers import feeders, inv_node, kube, make_pod, row, started  # noqa: F401

from stowage.allocation import (ALLOCATION_ANNOTATION, AllocationRecord, CardShare, RecordTrust, encode_allocation,
                                record_mismatch)
from stowage.resources import GpuRequest

GiB = 1024
SCHED = frozenset({"stowage-scheduler"})


def ours(pod: dict) -> dict:
    pod["spec"]["schedulerName"] = "stowage-scheduler"
    return pod


def rec(node: str, cards: list[tuple[int, str]], whole: bool = True, mem: int = 80 * GiB,
        core: int = 1000) -> AllocationRecord:
    return AllocationRecord(node, tuple(CardShare(k, u, mem, core) for k, u in cards), whole)


def test_a_record_naming_one_uuid_twice_does_not_match_a_two_gpu_request():
    twice = rec("n1", [(0, "GPU-n1-0"), (1, "GPU-n1-0")])
    assert "GPU-n1-0" in record_mismatch(twice, GpuRequest(gpus=2))
    assert record_mismatch(rec("n1", [(0, "GPU-n1-0"), (1, "GPU-n1-1")]), GpuRequest(gpus=2)) == ""


def test_a_record_naming_one_index_twice_does_not_match_a_two_gpu_request():
    twice = rec("n1", [(3, "GPU-n1-3"), (3, "GPU-n1-4")])
    assert "3" in record_mismatch(twice, GpuRequest(gpus=2))


@pytest.mark.parametrize("cards", [
    [(0, "GPU-n1-0"), (1, "GPU-n1-0")],      # the same card by uuid, two indices
    [(2, "GPU-n1-0"), (3, "GPU-n1-0")],      # another pod's card by uuid, two free indices
    [(1, "GPU-n1-1"), (1, "GPU-n1-1")],      # the same card twice
    [(1, "GPU-n1-1"), (1, "GPU-n1-2")],      # one index, two uuids
])
def test_a_duplicated_card_costs_only_its_own_pod(kube, feeders, cards):
    kube.create_node(inv_node("n1", [80] * 4))
    honest = kube.create_pod(ours(make_pod("honest", gpus=1, node="n1", phase="Running", annotations={
        ALLOCATION_ANNOTATION: encode_allocation(rec("n1", [(0, "GPU-n1-0")]))})))
    f = started(kube, feeders, trust=RecordTrust(scheduler_names=SCHED))
    before = row(f.model, "n1")
    assert before["pods"] == [1, 0, 0, 0]
    bad = kube.create_pod(ours(make_pod("twice", gpus=2, node="n1", phase="Running", annotations={
        ALLOCATION_ANNOTATION: encode_allocation(rec("n1", cards))})))
    uid = bad["metadata"]["uid"]
    kube.wait_for(lambda: uid in f.status()["pod_errors"] or uid in f.model.allocations)
    assert uid in f.status()["pod_errors"], "the duplicated record is that pod's error"
    assert not (f.model.allocations.get(uid) and f.model.allocations[uid].cards)
    assert row(f.model, "n1")["pods"] == [1, 0, 0, 0]
    kube.delete_pod("default", "twice")
    kube.wait_for(lambda: uid not in f.status()["pod_errors"])
    assert row(f.model, "n1") == before
    assert set(f.model.allocations) == {honest["metadata"]["uid"]}


def share_pod(name: str, mem_gib: int, record: AllocationRecord) -> dict:
    pod = make_pod(name, node="n1", phase="Running", annotations={ALLOCATION_ANNOTATION: encode_allocation(record)})
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu-memory": str(mem_gib)}}
    return ours(pod)


@pytest.mark.parametrize("case", ["index past the cards", "unknown uuid past the cards", "share past the memory",
                                  "whole at an unknown index"])
def test_an_odd_record_leaves_the_cards_as_they_were_once_its_pod_goes(kube, feeders, case):
    kube.create_node(inv_node("n1", [80] * 4))
    kube.create_pod(ours(make_pod("honest", gpus=1, node="n1", phase="Running", annotations={
        ALLOCATION_ANNOTATION: encode_allocation(rec("n1", [(0, "GPU-n1-0")]))})))
    f = started(kube, feeders, trust=RecordTrust(scheduler_names=SCHED))
    before = row(f.model, "n1")
    if case == "index past the cards":
        pod = ours(make_pod("odd", gpus=1, node="n1", phase="Running", annotations={
            ALLOCATION_ANNOTATION: encode_allocation(rec("n1", [(6, "GPU-n1-1")]))}))
    elif case == "unknown uuid past the cards":
        pod = ours(make_pod("odd", gpus=1, node="n1", phase="Running", annotations={
            ALLOCATION_ANNOTATION: encode_allocation(rec("n1", [(200, "GPU-elsewhere")]))}))
    elif case == "whole at an unknown index":
        pod = ours(make_pod("odd", gpus=2, node="n1", phase="Running", annotations={
            ALLOCATION_ANNOTATION: encode_allocation(rec("n1", [(5, "GPU-x"), (6, "GPU-y")]))}))
    else:
        pod = share_pod("odd", 100, rec("n1", [(1, "GPU-n1-1")], whole=False, mem=100 * GiB, core=0))
    uid = kube.create_pod(pod)["metadata"]["uid"]
    kube.wait_for(lambda: uid in f.model.allocations or uid in f.status()["pod_errors"])
    print(case, f.status()["pod_errors"], f.model.allocations.get(uid), row(f.model, "n1"))
    kube.delete_pod("default", "odd")
    kube.wait_for(lambda: uid not in f.model.allocations and uid not in f.status()["pod_errors"])
    assert row(f.model, "n1") == before

