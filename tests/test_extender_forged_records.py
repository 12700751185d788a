"""Issue 12, item 1: a record a pod author wrote by hand never reaches the extender's model.

Through the real feed (list+watch of the fake API server, the real ``kubernetes`` client) and the
real binder: only records that book exactly the pod's own request, on its node, for a pod of
Stowage's scheduler count; where the cluster signs records, only those signed for that pod.
"""
from __future__ import annotations

from extender_kube_helpers import feeders, inv_node, kube, make_pod, new_feeder, row  # noqa: F401

from extender.kube_binder import KubeBinder
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, RecordKey, RecordTrust, encode_allocation

GiB = 1024
KEY = RecordKey(b"s" * 32)
SCHED = frozenset({"stowage-scheduler"})


def feed(kube, feeders, trust):
    f = new_feeder(kube, trust=trust)
    feeders.append(f)
    f.start()
    kube.wait_for(lambda: f.ready()[0])
    return f


def whole(node, cards):
    return AllocationRecord(node, tuple(CardShare(k, f"GPU-{node}-{k}", 80 * GiB, 1000) for k in cards), True)


def ours(pod):
    pod["spec"]["schedulerName"] = "stowage-scheduler"
    return pod


def settle(kube, f, trust, node, card):
    """Wait until the feed has seen everything created so far: a pod bound last through the real
    binder shows up in the model only after every earlier event (a watch is ordered)."""
    marker = kube.create_pod(ours(make_pod("zz-marker", gpus=1)))
    KubeBinder(kube.api_client(), trust=trust).bind("default", "zz-marker", marker["metadata"]["uid"], node,
                                                    whole(node, [card]))
    kube.wait_for(lambda: marker["metadata"]["uid"] in f.model.allocations)
    return marker["metadata"]["uid"]


def test_hand_written_records_do_not_fill_a_node(kube, feeders):
    kube.create_node(inv_node("n1", [80] * 8))
    # no GPU request, a record naming all 8 cards
    kube.create_pod(ours(make_pod("no-gpu", node="n1", phase="Running",
                                  annotations={ALLOCATION_ANNOTATION: encode_allocation(whole("n1", range(8)))})))
    # asks for 1 GPU, records 8
    kube.create_pod(ours(make_pod("greedy", gpus=1, node="n1", phase="Running",
                                  annotations={ALLOCATION_ANNOTATION: encode_allocation(whole("n1", range(8)))})))
    # another scheduler's pod
    kube.create_pod(make_pod("foreign", gpus=1, node="n1", phase="Running",
                             annotations={ALLOCATION_ANNOTATION: encode_allocation(whole("n1", [0]))}))
    # bound to n1, record says n2
    kube.create_pod(ours(make_pod("elsewhere", gpus=1, node="n1", phase="Running",
                                  annotations={ALLOCATION_ANNOTATION: encode_allocation(whole("n2", [0]))})))
    # the one honest record
    honest = kube.create_pod(ours(make_pod("honest", gpus=1, node="n1", phase="Running",
                                           annotations={ALLOCATION_ANNOTATION: encode_allocation(whole("n1", [3]))})))
    f = feed(kube, feeders, RecordTrust(scheduler_names=SCHED))
    assert holders(f.model) == {honest["metadata"]["uid"]}
    assert row(f.model, "n1")["pods"] == [0, 0, 0, 1, 0, 0, 0, 0]


def holders(model):
    """uids of the pods holding cards in the model."""
    return {u for u, a in model.allocations.items() if a.cards}


def hosts_only(model):
    """uids of the bound pods holding host room only (no card counted)."""
    return {u for u, a in model.allocations.items() if not a.cards}


def test_signed_cluster_honours_only_records_the_binder_signed_for_that_pod(kube, feeders):
    kube.create_node(inv_node("n1", [80] * 4))
    trust = RecordTrust(key=KEY, scheduler_names=SCHED)
    signed = kube.create_pod(ours(make_pod("signed", gpus=1)))
    forged = kube.create_pod(ours(make_pod("forged", gpus=1, node="n1", phase="Running",
                                           annotations={ALLOCATION_ANNOTATION: encode_allocation(whole("n1", [1]))})))
    f = feed(kube, feeders, trust)
    KubeBinder(kube.api_client(), trust=trust).bind("default", "signed", signed["metadata"]["uid"], "n1",
                                                    whole("n1", [0]))
    kube.wait_for(lambda: signed["metadata"]["uid"] in f.model.allocations)
    # a signed record copied onto another pod is not honoured there
    value = kube.get_pod("default", "signed")["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    copy = kube.create_pod(ours(make_pod("copy", gpus=1, node="n1", phase="Running",
                                         annotations={ALLOCATION_ANNOTATION: value})))
    marker = settle(kube, f, trust, "n1", 2)
    assert holders(f.model) == {signed["metadata"]["uid"], marker}
    assert forged["metadata"]["uid"] not in holders(f.model) and copy["metadata"]["uid"] not in holders(f.model)
    # they run on n1 all the same: their CPU, memory and pod slots count (host room, no cards)
    assert {forged["metadata"]["uid"], copy["metadata"]["uid"]} <= hosts_only(f.model)
    assert row(f.model, "n1")["pods"] == [1, 0, 1, 0]
