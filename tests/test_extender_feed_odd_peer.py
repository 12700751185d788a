"""The Kubernetes feed against a peer that is odd or lying (tests/fakekube.py's ``raw_watches``:
bytes a real API server never sends), and cluster events no other feed test covers.

What must hold: the model is built only from events the feeder understood; one it cannot apply as a
whole fails the stream (re-opened from the last resourceVersion it did apply, backed off, and
/readyz false if it goes on), rather than be skipped while the model reads complete; and no peer
makes the feeder spin."""
from __future__ import annotations

import json
import logging
import time

import pytest
from extender_kube_helpers import feeders, inv_node, kube, make_pod, new_feeder, row, started  # noqa: F401

from extender.kube import NODES, PODS
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, encode_allocation

GiB = 1024


def rec(node: str, k: int) -> str:
    return encode_allocation(AllocationRecord(node=node, whole=True, cards=(
        CardShare(index=k, uuid=f"GPU-{node}-{k}", memory_mib=80 * GiB, core_milli=1000),)))


def line(event: dict) -> bytes:
    return json.dumps(event).encode() + b"\n"



@pytest.mark.parametrize("event", [
    {"type": "RENAMED", "object": {"kind": "Pod", "metadata": {"name": "x", "resourceVersion": "999999"}}},
    {"type": "ADDED", "object": "a pod"},
    {"type": "MODIFIED"},
], ids=["unknown-type", "object-not-a-map", "no-object"])
def test_an_event_the_feeder_cannot_apply_fails_the_stream_and_its_resource_version_is_not_taken(kube, feeders,
                                                                                                   event, caplog):
    """An event of a type the feeder does not know was logged and skipped, but its
    resourceVersion was taken: the next watch resumed from it, and kube-apiserver (v1.28.7,
    checked) answers a watch from a resourceVersion ahead of its own with 200 and nothing more, so
    the model froze while /readyz said in sync. An event without an object was skipped too: the
    change it carried was lost while the model read complete. client-go's watch decoder refuses
    both (an error, the watch ends). Now the stream fails at such an event and is re-opened from
    the last resourceVersion applied."""
    kube.create_node(inv_node("n1", [80]))
    f = started(kube, feeders)
    st = f.streams[PODS]
    rv = st.rv
    with caplog.at_level(logging.WARNING, logger="stowage.kube"):
        kube.raw_watches("pods", [line(event)], end=False)
        kube.drop_watches("pods")
        kube.wait_for(lambda: st.errors >= 2)
    assert st.rv == rv and st.failures >= 2
    assert "cannot be applied" in st.last_error or "cannot be applied" in caplog.text
    kube.clear_faults()
    p = kube.create_pod(make_pod("after", gpus=1, node="n1", phase="Running",
                                 annotations={ALLOCATION_ANNOTATION: rec("n1", 0)}))
    kube.wait_for(lambda: p["metadata"]["uid"] in f.model.allocations)
    kube.wait_for(lambda: f.ready()[0] and st.failures == 0)


def test_watches_that_end_at_once_after_an_event_are_paced_not_reopened_in_a_loop(kube, feeders):
    """A watch the server ends cleanly at once *with* an event (one bookmark, then the end, every
    time: a proxy or a peer that is not an API server) was re-opened straight away, forever (~24
    watch requests a second against the fake API server, on the decision process's GIL), where
    one without an event is backed off as a failure. client-go's reflector is held to 5 requests a
    second by its client's rate limiter; the feeder has none. Now a watch that lasted under
    ``short_watch_s`` is not followed by the next one before ``short_watch_s`` since it opened:
    not a failure (it delivered), just not a loop."""
    kube.create_node(inv_node("n1", [80]))
    f = started(kube, feeders, short_watch_s=5.0)
    st = f.streams[NODES]
    bookmark = line({"type": "BOOKMARK", "object": {"kind": "Node",
                                                    "metadata": {"resourceVersion": str(kube.resource_version)}}})
    kube.raw_watches("nodes", [bookmark])
    kube.drop_watches("nodes")
    events = st.events
    kube.wait_for(lambda: st.events > events)          # the first such watch came and went
    before = kube.watch_count("nodes")
    time.sleep(1.0)
    assert kube.watch_count("nodes") - before <= 1     # at most one more in the second that follows
    assert st.failures == 0 and f.ready()[0]
    kube.clear_faults()


def test_a_terminating_pod_holds_its_card_until_it_is_gone(kube, feeders):
    """A pod being deleted (``deletionTimestamp`` set, its containers stopping) still holds its
    card, as kube-scheduler counts it, until the API server deletes it or it ends (Succeeded or
    Failed): freed earlier, the card went to a new pod while the old one still ran on it."""
    kube.create_node(inv_node("n1", [80, 80]))
    p = kube.create_pod(make_pod("p", gpus=1, node="n1", phase="Running",
                                 annotations={ALLOCATION_ANNOTATION: rec("n1", 0)}))
    f = started(kube, feeders)
    uid = p["metadata"]["uid"]
    kube.patch_pod("default", "p", {"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z",
                                                 "deletionGracePeriodSeconds": 30}})
    kube.create_pod(make_pod("marker"))     # events come in order: once its copy is kept, the patch was applied
    kube.wait_for(lambda: f.pending_pod("default", "marker") is not None)
    assert uid in f.model.allocations and row(f.model, "n1")["pods"] == [1, 0]
    kube.delete_pod("default", "p")
    kube.wait_for(lambda: uid not in f.model.allocations)
    assert row(f.model, "n1")["pods"] == [0, 0]


def test_a_node_deleted_under_its_pods_and_added_again_has_their_cards_still_held(kube, feeders):
    """A Node object deleted while its pods run (``kubectl delete node``; the kubelet registers it
    again within seconds, and the pods live on unless the pod garbage collector is quicker): the
    pods' records stay in the model, and the node that comes back has their cards held, not
    free for a second pod."""
    kube.create_node(inv_node("n1", [80, 80]))
    p = kube.create_pod(make_pod("p", gpus=1, node="n1", phase="Running",
                                 annotations={ALLOCATION_ANNOTATION: rec("n1", 1)}))
    f = started(kube, feeders)
    kube.delete_node("n1")
    kube.wait_for(lambda: "n1" not in f.model.index)
    assert p["metadata"]["uid"] in f.model.allocations
    kube.create_node(inv_node("n1", [80, 80]))
    kube.wait_for(lambda: "n1" in f.model.index)
    assert row(f.model, "n1")["pods"] == [0, 1] and row(f.model, "n1")["mem_free"] == [80 * GiB, 0]


def test_an_event_of_another_name_under_a_running_pods_uid_never_frees_its_cards(kube, feeders, caplog):
    """The feed keeps a pod's allocation by its uid, which is whatever the peer sends. An event of
    another pod under the uid of a running one (a peer that lies, or a bug; a real API server's
    uids are unique) took the running pod's record over, and its DELETED freed the running pod's
    cards in the model while it still ran: a second pod could be given them. Now an object whose
    uid the model holds under another namespace/name is that object's error only: logged once,
    counted in the pod errors while it exists, and the pod that holds the uid keeps its cards
    until it goes itself."""
    kube.create_node(inv_node("n1", [80, 80]))
    kube.create_pod(make_pod("a", gpus=1, node="n1", phase="Running", uid="same-uid",
                             annotations={ALLOCATION_ANNOTATION: rec("n1", 0)}))
    f = started(kube, feeders)
    assert f.model.allocations["same-uid"].name == "default/a"

    def applied(marker: str) -> None:      # events come in order: once its copy is kept, those before were applied
        kube.create_pod(make_pod(marker))
        kube.wait_for(lambda: f.pending_pod("default", marker) is not None)

    def a_holds_card_0() -> None:
        held = f.model.allocations.get("same-uid")
        assert held is not None and held.name == "default/a" and held.cards == (0,)
        assert row(f.model, "n1")["pods"] == [1, 0]

    with caplog.at_level(logging.ERROR, logger="stowage.kube"):
        kube.create_pod(make_pod("b", gpus=1, node="n1", phase="Running", uid="same-uid",
                                 annotations={ALLOCATION_ANNOTATION: rec("n1", 1)}))
        kube.patch_pod("default", "b", {"metadata": {"labels": {"again": "1"}}})
        applied("m1")
        a_holds_card_0()
        assert f.health()["pod_errors"] == 1 and "default/b" in f.status()["pod_errors"]["same-uid"]
        kube.delete_pod("default", "b")
        applied("m2")
    a_holds_card_0()
    assert f.health()["pod_errors"] == 0                          # b is gone: nothing of it left to count
    said = [r.getMessage() for r in caplog.records if "same-uid" in r.getMessage()]
    assert len(said) == 1 and "default/b" in said[0] and "default/a" in said[0]   # once, not per event
    kube.delete_pod("default", "a")            # the pod that holds the uid frees its cards when it goes
    kube.wait_for(lambda: "same-uid" not in f.model.allocations)
    assert row(f.model, "n1")["pods"] == [0, 0]


def test_a_list_with_another_name_under_a_held_uid_keeps_the_holder_while_it_is_listed(kube):
    """A list holds each uid once (a second object of one uid fails the list), so a list in which
    another name comes first under a held uid, and then the pod that holds it, was a failed list
    with the holder's cards freed on the way. Now the other object is that object's error and the
    holder keeps its cards; a list that no longer holds the holder frees them at its end (it is
    gone), and the next list applies the other pod as any."""
    kube.create_node(inv_node("n1", [80, 80]), emit=False)
    kube.create_pod(make_pod("a", gpus=1, node="n1", phase="Running", uid="same-uid",
                             annotations={ALLOCATION_ANNOTATION: rec("n1", 0)}), emit=False)
    f = new_feeder(kube)
    f.sync_once()
    kube.create_pod(make_pod("0-other", gpus=1, node="n1", phase="Running", uid="same-uid",
                             annotations={ALLOCATION_ANNOTATION: rec("n1", 1)}), emit=False)
    f.sync_once()                                # "default/0-other" is listed before "default/a"
    held = f.model.allocations["same-uid"]
    assert held.name == "default/a" and held.cards == (0,) and row(f.model, "n1")["pods"] == [1, 0]
    assert f.health()["pod_errors"] == 1
    kube.delete_pod("default", "a", emit=False)
    f.sync_once()                                # the holder is not listed: gone, its cards free
    assert "same-uid" not in f.model.allocations and row(f.model, "n1")["pods"] == [0, 0]
    assert f.health()["pod_errors"] == 0
    f.sync_once()
    held = f.model.allocations["same-uid"]
    assert held.name == "default/0-other" and held.cards == (1,) and row(f.model, "n1")["pods"] == [0, 1]


@pytest.mark.parametrize("other", ["0-other", "z-other"], ids=["listed-before-the-holder", "listed-after-the-holder"])
@pytest.mark.parametrize("holder_known", [True, False], ids=["holder-known", "first-list"])
def test_a_list_holding_two_names_under_one_uid_completes_and_one_of_them_holds_its_cards(kube, other, holder_known):
    """A list holding two objects of one uid under different names (a peer that lies) failed as
    a page served again ("listed twice") whenever the object applied first was the one that took
    the uid, i.e. in every order but one (the holder known and listed second): every list failed
    while both existed, so a starting extender never became ready, and a running one's pods
    stayed frozen at the last list. Now the list completes in every order: the pod holding the
    uid (the one the model held, else the first listed) keeps its cards, the other is that
    object's error, and no card is freed or booked twice, list after list."""
    kube.create_node(inv_node("n1", [80, 80]), emit=False)
    kube.create_pod(make_pod("a", gpus=1, node="n1", phase="Running", uid="same-uid",
                             annotations={ALLOCATION_ANNOTATION: rec("n1", 0)}), emit=False)
    f = new_feeder(kube)
    if holder_known:
        f.sync_once()
    kube.create_pod(make_pod(other, gpus=1, node="n1", phase="Running", uid="same-uid",
                             annotations={ALLOCATION_ANNOTATION: rec("n1", 1)}), emit=False)
    holder = "default/a" if holder_known or other > "a" else f"default/{other}"
    for _ in range(2):
        f.sync_once()
        held = f.model.allocations["same-uid"]
        assert held.name == holder
        assert row(f.model, "n1")["pods"] == ([1, 0] if holder == "default/a" else [0, 1])
        assert f.health()["pod_errors"] == 1 and f.streams[PODS].synced


def test_the_error_of_a_pending_pod_deleted_while_the_watch_was_away_goes_at_the_next_list(kube):
    """A pending pod with a malformed record is a pod error (health(), /metrics) until it goes.
    Deleted while the watch was away (no DELETED event), it was never dropped: the list's end
    dropped only what the model held (a pending pod holds nothing), so the count stayed up for
    good and grew with every such pod. Now a complete list keeps the errors of the pods it lists
    only."""
    kube.create_node(inv_node("n1", [80]), emit=False)
    for name, node in (("pending", None), ("bound", "n1")):
        kube.create_pod(make_pod(name, gpus=1, node=node, phase="Running" if node else "Pending",
                                 annotations={ALLOCATION_ANNOTATION: "{not json"}), emit=False)
    f = new_feeder(kube)
    f.sync_once()
    assert f.health()["pod_errors"] == 2
    kube.delete_pod("default", "pending", emit=False)
    kube.delete_pod("default", "bound", emit=False)
    f.sync_once()
    assert f.health()["pod_errors"] == 0 and f.status()["pod_errors"] == {}


@pytest.mark.parametrize("kind,type_", [(NODES, "MODIFIED"), (NODES, "DELETED"), (PODS, "DELETED")],
                         ids=["pod-modified-on-nodes", "pod-deleted-on-nodes", "node-deleted-on-pods"])
def test_an_event_for_an_object_of_another_kind_fails_the_stream_and_changes_nothing(kube, feeders, kind, type_):
    """Found by experiment (a raw watch event whose object is of the wrong kind): the feeder
    applied whatever object came on a stream as that stream's kind. A Pod named like a node,
    MODIFIED on the nodes watch, was read as that node with no inventory (its cards gone from the
    model); DELETED, it removed the node; a Node object DELETED on the pods watch, under a pod's
    name and uid, freed the pod's card while it ran. Its resourceVersion was taken too. client-go's
    reflector refuses an event whose object is not of the expected type; a real API server never
    sends one. Now such an event is one the feeder cannot apply: the stream fails there and is
    re-opened from the last resourceVersion applied, and the model keeps what it held."""
    kube.create_node(inv_node("n1", [80, 80]))
    p = kube.create_pod(make_pod("n1", gpus=1, node="n1", phase="Running",
                                 annotations={ALLOCATION_ANNOTATION: rec("n1", 0)}))
    f = started(kube, feeders)
    st = f.streams[kind]
    rv = st.rv
    uid = p["metadata"]["uid"]
    wrong = {"kind": "Pod" if kind == NODES else "Node", "apiVersion": "v1",
             "metadata": {"name": "n1", "uid": uid, "resourceVersion": str(kube.resource_version + 1000)},
             "spec": {}, "status": {}}
    kube.raw_watches(kind, [line({"type": type_, "object": wrong})], end=False)
    kube.drop_watches(kind)
    kube.wait_for(lambda: st.errors >= 2)
    assert st.rv == rv and "cannot be applied" in st.last_error and "Node" in st.last_error
    assert row(f.model, "n1")["cards"] == [0, 1] and row(f.model, "n1")["pods"] == [1, 0]
    assert uid in f.model.allocations
    kube.clear_faults()
    kube.wait_for(lambda: f.ready()[0] and st.failures == 0)


def test_a_watch_resource_version_ahead_of_the_api_servers_is_noticed_and_relisted(kube, feeders, caplog):
    """Found by experiment (the carried "RV ahead frozen until resync"): once the feed's
    resourceVersion is ahead of the API server's (etcd restored from a backup; a peer's lying
    bookmark, here), every watch from it is answered 200 and then nothing until its timeout
    (kube-apiserver v1.28.7 does so, docs/kube.md), so pods bound and deleted meanwhile never
    reached the model while /readyz said in sync, until the 10-minute resync. A watch that ends
    without an event cannot tell that from a quiet cluster, so now it asks the API server's
    current resourceVersion (a list of one object) and relists when its own is ahead of it."""
    kube.create_node(inv_node("n1", [80, 80]))
    f = started(kube, feeders, watch_timeout_s=2)
    st = f.streams[PODS]
    ahead = str(kube.resource_version + 1000)
    kube.raw_watches("pods", [line({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                                                   "metadata": {"resourceVersion": ahead}}})])
    kube.drop_watches("pods")
    kube.wait_for(lambda: st.rv == ahead)
    kube.clear_faults()
    lists = st.lists
    with caplog.at_level(logging.WARNING, logger="stowage.kube"):
        p = kube.create_pod(make_pod("p", gpus=1, node="n1", phase="Running",
                                     annotations={ALLOCATION_ANNOTATION: rec("n1", 1)}))
        kube.wait_for(lambda: p["metadata"]["uid"] in f.model.allocations, timeout=15)
    assert st.lists > lists and int(st.rv) <= kube.resource_version
    assert row(f.model, "n1")["pods"] == [0, 1]
    assert "ahead of the API server's" in caplog.text and f.ready()[0]


def test_a_list_page_of_another_kind_fails_the_list_and_changes_nothing(kube):
    """Found by experiment (the nodes list answered with the pods list, as a proxy routing it
    wrong would): the feeder applied each item of whatever list came as a node. Every real node
    was removed at the list's end (not listed) and each pod became a node without cards, the
    list read complete. Now a page whose ``kind`` is not the list's (NodeList, PodList) fails
    the list before anything of it is applied (back-off, then a new list)."""
    kube.create_node(inv_node("n1", [80, 80]), emit=False)
    kube.create_pod(make_pod("p", gpus=1, node="n1", phase="Running",
                             annotations={ALLOCATION_ANNOTATION: rec("n1", 0)}), emit=False)
    f = new_feeder(kube)
    f.sync_once()
    rv = f.streams[NODES].rv
    list_call = f._list_call
    f._list_call = lambda kind, limit=0, cont="": list_call(PODS, limit, cont)   # type: ignore[method-assign]
    with pytest.raises(Exception, match="PodList"):
        f.sync_once()
    assert set(f.model.index) == {"n1"} and row(f.model, "n1")["pods"] == [1, 0]
    assert f.streams[NODES].rv == rv
