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
from extender.kube_objects import assign_args
from packing.model import ClusterModel
from stowage.inventory import Card, Inventory
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


def model_row(model: ClusterModel, node: str) -> dict:
    """Every card slot of the node's row (existing or not), as plain lists."""
    with model.lock:
        i = model.index[node]
        a = model.a
        return {"mem_free": a.mem_free[i].tolist(), "core_free": a.core_free[i].tolist(), "pods": a.pods[i].tolist()}


def test_a_record_past_the_models_card_slots_is_given_back_as_it_was_booked():
    """A record may name card index 10 (indices go to 63) on a node of 4 cards in a model of 8 card
    slots: it is booked on no slot. When a node of 16 cards then widens the model, its
    release must not give back what was never booked (the slot's pod count went to -1, its
    compute to 2000 milli)."""
    model = ClusterModel(max_cards=8)
    model.upsert_node("n1", Inventory(tuple(Card(k, f"GPU-n1-{k}", "A100", 80 * GiB) for k in range(4))))
    before = model_row(model, "n1")
    model.assign("u-odd", "default/odd", **assign_args(rec("n1", [(10, "GPU-nowhere")]), 0, 0))
    model.upsert_node("n2", Inventory(tuple(Card(k, f"GPU-n2-{k}", "A100", 80 * GiB) for k in range(16))))
    model.release("u-odd")
    after = model_row(model, "n1")
    assert min(after["pods"]) == 0
    assert after == {k: v + [0] * 8 for k, v in before.items()}   # the new slots as empty as the old


def test_a_record_removed_from_a_bound_pod_keeps_its_cards_counted(kube, feeders):
    """A bound pod keeps the devices its containers started with whatever its annotations say
    later, so its record being removed (by hand: only the extender may, with the admission policy)
    must not free its card for another pod: the earlier record stays counted, as for a record
    turned invalid, and the pod gets an error. Before, the card read free: the next pod was bound
    onto the card the first still used."""
    kube.create_node(inv_node("n1", [80] * 2))
    kube.create_pod(ours(make_pod("runs", gpus=1, node="n1", phase="Running", annotations={
        ALLOCATION_ANNOTATION: encode_allocation(rec("n1", [(1, "GPU-n1-1")]))})))
    f = started(kube, feeders, trust=RecordTrust(scheduler_names=SCHED))
    held = row(f.model, "n1")
    assert held["pods"] == [0, 1]
    uid = next(iter(f.model.allocations))
    kube.patch_pod("default", "runs", {"metadata": {"annotations": {ALLOCATION_ANNOTATION: None}}})
    kube.wait_for(lambda: uid in f.status()["pod_errors"] or row(f.model, "n1") != held)
    assert row(f.model, "n1") == held
    assert "removed" in f.status()["pod_errors"][uid]
    kube.delete_pod("default", "runs")
    kube.wait_for(lambda: uid not in f.model.allocations)
    assert row(f.model, "n1")["pods"] == [0, 0] and uid not in f.status()["pod_errors"]
