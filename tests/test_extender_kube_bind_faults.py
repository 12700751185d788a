"""Bind in Kubernetes mode when the API server refuses, the pod changed under it, or the request
is a replay: the service, the real KubeBinder and the feed, wired as ``stowage extender`` wires
them (``extender.cli.connect_feed``), against the fake API server.

What each case must leave: the model exactly as the cluster is (no card held for a pod that does
not hold it, none lost), and the next pod able to take the cards.
"""
from __future__ import annotations

import itertools

import pytest
from extender_kube_helpers import FakeClock, FakeKube, inv_node, make_pod, new_feeder, row

from extender.cli import connect_feed
from extender.kube import KubeFeeder
from extender.kube_binder import KubeBinder
from extender.service import ExtenderService
from extender.wire import BindingArgs, ExtenderArgs
from extender_harness import simple_placers
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, encode_allocation

NODES = ["n1", "n2"]
GiB = 1024
BINDING = "/binding$"
_markers = itertools.count()


@pytest.fixture
def kube():
    with FakeKube(bookmark_interval=3600) as k:
        k.create_node(inv_node("n1", [80]))
        k.create_node(inv_node("n2", [80]))
        yield k


@pytest.fixture
def extender(kube):
    """(feeder, service): one card on each of n1 and n2; the service's clock is a FakeClock."""
    f = new_feeder(kube)
    svc = ExtenderService(f.model, binder=KubeBinder(kube.api_client(), readback_attempts=1, readback_delay_s=0),
                          pod_source=f, placer_factory=simple_placers, clock=FakeClock())
    connect_feed(f, svc)
    f.start()
    try:
        kube.wait_for(lambda: f.ready()[0])
        yield f, svc
    finally:
        f.stop()


def gpu_pod(kube: FakeKube, name: str, **kw) -> dict:
    pod = make_pod(name, gpus=1, **kw)
    pod["spec"]["schedulerName"] = "stowage-scheduler"
    return kube.create_pod(pod)


def caught_up(kube: FakeKube, f: KubeFeeder) -> None:
    """Every change made so far has reached the feed: a pod created now has (one watch, in order)."""
    name = f"marker-{next(_markers)}"
    kube.create_pod(make_pod(name))
    kube.wait_for(lambda: f.pending_uid(f"default/{name}") is not None)


def rec(node: str, k: int) -> str:
    """A whole-card record of card ``k`` of ``node`` (80 GiB)."""
    return encode_allocation(AllocationRecord(node=node, whole=True, cards=(
        CardShare(index=k, uuid=f"GPU-{node}-{k}", memory_mib=80 * GiB, core_milli=1000),)))


def filter_nodes(svc: ExtenderService, pod: dict) -> list[str]:
    return svc.filter(ExtenderArgs(pod=pod, node_names=NODES, nodes=None, names=NODES)).node_names or []


def bind(svc: ExtenderService, pod: dict, node: str) -> str:
    m = pod["metadata"]
    return svc.bind(BindingArgs(m["name"], m["namespace"], m["uid"], node))


def snapshot(svc: ExtenderService) -> tuple[dict, dict]:
    """Who holds what (GPU pods), and every node's card row."""
    model = svc.model
    with model.lock:
        held = {a.name: (a.node, a.cards, a.mem_mib, a.core_milli) for a in model.allocations.values() if a.cards}
        return held, {n: row(model, n) for n in NODES}


def bindings(kube: FakeKube) -> int:
    return sum(1 for method, path, _ in kube.requests if method == "POST" and path.endswith("/binding"))


def unknown_outcome(svc: ExtenderService) -> None:
    """Every Binding from now on loses its answer, and the pod cannot be read back."""
    binder = svc.binder

    def lost(*args, **kw):
        raise ConnectionResetError("connection reset by peer")

    def unreadable(*args, **kw):
        raise ConnectionRefusedError("API server unreachable")

    binder._binding, binder._read = lost, unreadable


# --------------------------------------------------------------------- the API server refuses
def refuse_429(kube, svc, pod):
    """Shed by priority and fairness before it is handled: nothing applied (a 5xx may be: below)."""
    kube.fail_next(1, status=429, path=BINDING, reason="TooManyRequests")
    return "injected failure (429)"


def deleted_unseen(kube, svc, pod):
    """Deleted after its filter, the deletion not yet seen by the feed: the Binding answers 404."""
    kube.delete_pod("default", pod["metadata"]["name"], emit=False)
    return "not found"


def recreated_unseen(kube, svc, pod):
    """Deleted and created again under the same name, the feed not told yet: 409 on the UID."""
    kube.delete_pod("default", pod["metadata"]["name"], emit=False)
    kube.create_pod(make_pod(pod["metadata"]["name"], gpus=1), emit=False)
    return "is not the pod with uid"


def bound_elsewhere_unseen(kube, svc, pod):
    """Bound by someone else meanwhile (another scheduler, by hand): 409, bound without our record."""
    kube.update("pods", "default", pod["metadata"]["name"], lambda o: o["spec"].update(nodeName="n2"), emit=False)
    return "already assigned"


@pytest.mark.parametrize("refusal", [refuse_429, deleted_unseen, recreated_unseen, bound_elsewhere_unseen])
def test_a_refused_binding_rolls_the_model_back_exactly(kube, extender, refusal):
    f, svc = extender
    pod = gpu_pod(kube, "p")
    caught_up(kube, f)
    assert filter_nodes(svc, pod) == NODES
    before = snapshot(svc)
    why = refusal(kube, svc, pod)
    err = bind(svc, pod, "n1")
    assert err.startswith("cannot bind default/p to n1: ") and why in err
    assert snapshot(svc) == before
    assert ALLOCATION_ANNOTATION not in (kube.get_pod("default", "p") or {"metadata": {}})["metadata"].get(
        "annotations", {})
    nxt = gpu_pod(kube, "next")
    caught_up(kube, f)
    vars(svc.binder).pop("_binding", None)              # Bindings reach the API server again
    assert bind(svc, nxt, "n1") == ""                   # the card is free for the next pod
    assert snapshot(svc)[0] == {"default/next": ("n1", (0,), (80 * 1024,), (1000,))}


# ------------------------------------------------------------------------------------ replays
def test_a_replayed_filter_and_bind_of_a_bound_pod_change_nothing(kube, extender):
    """kube-scheduler (or anything at the port) sends a bound pod again: filter counts its own
    cards as taken, a bind to its node succeeds without a new booking (the API server's 409 and
    the read-back find our record), a bind to another node is refused."""
    f, svc = extender
    pod = gpu_pod(kube, "p")
    caught_up(kube, f)
    assert bind(svc, pod, "n1") == ""
    caught_up(kube, f)
    before, sent = snapshot(svc), bindings(kube)
    assert filter_nodes(svc, pod) == ["n2"]
    assert bind(svc, pod, "n1") == ""
    assert bind(svc, pod, "n2") == "pod default/p already holds cards [0] on node n1; it is bound to n1"
    caught_up(kube, f)
    assert snapshot(svc) == before
    assert bindings(kube) == sent + 1                    # the repeat's Binding, answered 409
    assert kube.get_pod("default", "p")["spec"]["nodeName"] == "n1"


def test_a_bind_naming_another_pods_uid_is_refused(kube, extender):
    f, svc = extender
    a, b = gpu_pod(kube, "a"), gpu_pod(kube, "b")
    caught_up(kube, f)
    assert filter_nodes(svc, a) == NODES and filter_nodes(svc, b) == NODES
    before, sent = snapshot(svc), bindings(kube)
    err = svc.bind(BindingArgs("b", "default", a["metadata"]["uid"], "n1"))
    assert err == f"pod default/b has uid {b['metadata']['uid']}, bind asked for uid {a['metadata']['uid']} " \
                  "(pod was re-created)"
    assert snapshot(svc) == before and bindings(kube) == sent


# --------------------------------------------------------------------- a pod already deleted
def test_a_bind_of_a_pod_the_watch_saw_deleted_reserves_nothing(kube, extender):
    """The pod was deleted after its filter and the feed saw it go; then its bind comes (kube-
    scheduler's cycle was under way, or a replay), and the Binding's outcome is unknown (answer
    lost, pod unreadable). The reservation used to be kept "until the pod is deleted": that had
    happened already, so the card stayed held until the next full list (up to 10 minutes). Now
    such a bind is refused before anything is reserved or sent, even after a replayed filter."""
    f, svc = extender
    pod = gpu_pod(kube, "p")
    caught_up(kube, f)
    assert filter_nodes(svc, pod) == NODES
    kube.delete_pod("default", "p")
    caught_up(kube, f)
    before, sent = snapshot(svc), bindings(kube)
    unknown_outcome(svc)
    assert bind(svc, pod, "n1") == "pod default/p was deleted"
    assert filter_nodes(svc, pod) == NODES                # a replayed filter parses it again
    assert bind(svc, pod, "n1") == "pod default/p was deleted"
    assert snapshot(svc) == before and bindings(kube) == sent


# ------------------------------------------------------------- a filter body that lies about a pod
def lying_copy(pod: dict, rv: str) -> dict:
    """``pod`` as a body may claim it: the same uid and name, asking a 1 GiB share of a card."""
    forged = {"metadata": dict(pod["metadata"], resourceVersion=rv), "spec": dict(pod["spec"])}
    share = {"nvidia.com/gpu-memory": "1"}
    forged["spec"]["containers"] = [dict(pod["spec"]["containers"][0], resources={"limits": share,
                                                                                  "requests": share})]
    return forged


@pytest.mark.parametrize("when", ["after the real filter, another version", "before the real filter, same version"])
def test_a_filter_body_that_lies_about_a_pending_pod_does_not_decide_what_bind_books(kube, extender, when):
    """Bind booked what the last filter body said of the pod (the parse kept by uid, and by
    resourceVersion: the first body of a version was kept for it). A body naming a real pending
    pod of 1 whole GPU as a 1 GiB share made kube-scheduler's bind book a share of card 0 and
    record it: the feed then refused the record (it does not match the pod), the device plugin
    would too, and the model kept a 1 GiB share for a pod the cluster counts as holding nothing.
    Now in Kubernetes mode bind reads the pod from the watch's copy of it (the API server's)."""
    f, svc = extender
    pod = gpu_pod(kube, "p")
    caught_up(kube, f)
    rv = pod["metadata"]["resourceVersion"]
    if when.startswith("after"):
        assert filter_nodes(svc, pod) == NODES
        filter_nodes(svc, lying_copy(pod, str(int(rv) + 1000)))
    else:
        filter_nodes(svc, lying_copy(pod, rv))
        filter_nodes(svc, pod)
    assert bind(svc, pod, "n1") == ""
    caught_up(kube, f)
    assert snapshot(svc)[0] == {"default/p": ("n1", (0,), (80 * 1024,), (1000,))}   # the whole card
    assert f.health()["pod_errors"] == 0                  # the record on the pod is honoured


# ------------------------------------------------------- a pod under a uid another pod holds
@pytest.mark.parametrize("node", ["n1", "n2"], ids=["holders-node", "another-node"])
def test_a_bind_under_a_uid_another_pod_holds_neither_shares_nor_frees_its_cards(kube, extender, node):
    """A pending pod whose uid the model holds for another, running pod (a peer that lies: uids
    are unique on an API server; the feed ignores its events, tests/test_extender_feed_odd_peer.py).
    Bind keys the model by uid alone: to the holder's node it wrote the Binding again on the
    holder's cards, with the holder's record (two pods on one card); to another node it took the
    holder's cards for a stale reservation of this pod, released them while the holder ran, and
    the next pod was given them. It must be refused, and change nothing."""
    f, svc = extender
    kube.create_pod(make_pod("a", gpus=1, node="n1", phase="Running", uid="same-uid",
                             annotations={ALLOCATION_ANNOTATION: rec("n1", 0)}))
    b = gpu_pod(kube, "b", uid="same-uid")
    caught_up(kube, f)
    before, sent = snapshot(svc), bindings(kube)
    assert before[0] == {"default/a": ("n1", (0,), (80 * 1024,), (1000,))}
    err = bind(svc, b, node)
    assert err and "default/a" in err
    caught_up(kube, f)
    assert snapshot(svc) == before and bindings(kube) == sent
    assert not kube.get_pod("default", "b")["spec"].get("nodeName")


# ------------------------------------------- a Binding the API server applies after answering it failed
def holders(kube: FakeKube, node: str, k: int) -> list[str]:
    """The pods the cluster has bound to ``node`` with a record naming its card ``k``."""
    out = []
    for pod in kube.objects("pods"):
        value = (pod["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION)
        if pod["spec"].get("nodeName") == node and value and f'"index":{k}' in value.replace(" ", ""):
            out.append(pod["metadata"]["name"])
    return sorted(out)


def answered_504(kube, svc):
    kube.hold_bindings(1, status=504, reason="Timeout")
    return "504"


def answered_500(kube, svc):
    kube.hold_bindings(1, status=500, reason="InternalError")   # etcd's "request timed out"
    return "500"


def answer_lost(kube, svc):
    """The Binding reaches the API server, its answer does not reach the extender (read timeout)."""
    real = svc.binder._binding

    def timed_out(*args, **kw):
        kube.hold_bindings(1)
        try:
            real(*args, **kw)
        except Exception:
            pass
        raise TimeoutError("read timed out")

    svc.binder._binding = timed_out
    return "read timed out"


LATE = [answered_504, answered_500, answer_lost]


@pytest.mark.parametrize("late", LATE)
def test_a_binding_applied_after_its_failure_never_gives_its_card_to_another_pod(kube, extender, late):
    """The reviewer's race: a Binding answered 5xx (or whose answer was lost) that the API server
    applies only AFTER the binder's read-back found the pod unbound. The reservation was released
    at once; the next pod was given the card; then the late Binding landed, with a record naming
    the same card: two pods bound to one whole card (the device plugin refuses the second one's
    devices, so that pod fails to start), and the model booking both. Now the reservation stays
    (its outcome is unknown) and the next pod goes elsewhere."""
    f, svc = extender
    a, b = gpu_pod(kube, "a"), gpu_pod(kube, "b")
    caught_up(kube, f)
    assert filter_nodes(svc, a) == NODES
    why = late(kube, svc)
    err = bind(svc, a, "n1")
    assert err.startswith("cannot bind default/a to n1: ") and why in err   # kube-scheduler retries it
    vars(svc.binder).pop("_binding", None)
    assert not kube.get_pod("default", "a")["spec"].get("nodeName")      # not applied (yet)
    assert svc.state()["allocations"][a["metadata"]["uid"]]["bindOutcomeUnknown"] is True

    fits = filter_nodes(svc, b)                                        # the next pod, meanwhile
    node = "n1" if "n1" in fits else fits[0]
    assert bind(svc, b, node) == ""
    assert kube.apply_held()[0]["status"] == "Success"                  # the late Binding lands
    caught_up(kube, f)

    assert kube.get_pod("default", "a")["spec"]["nodeName"] == "n1"
    assert holders(kube, "n1", 0) == ["a"]                              # one pod on the card, not two
    held, rows = snapshot(svc)
    assert held == {"default/a": ("n1", (0,), (80 * GiB,), (1000,)), "default/b": ("n2", (0,), (80 * GiB,), (1000,))}
    assert rows["n1"]["pods"] == [1] and rows["n2"]["pods"] == [1]
    assert f.health()["pod_errors"] == 0
    # The watch showed it bound: confirmed, held as any bound pod, whatever the time.
    assert "bindOutcomeUnknown" not in svc.state()["allocations"][a["metadata"]["uid"]]
    svc._clock.t += 10 * svc.unknown_outcome_hold_s
    c = gpu_pod(kube, "c")
    caught_up(kube, f)
    assert filter_nodes(svc, c) == []
    assert snapshot(svc) == (held, rows)


def never_applied(late):
    def cause(kube, svc):
        why = late(kube, svc)
        real = svc.binder._binding

        def and_dropped(*args, **kw):
            try:
                return real(*args, **kw)
            finally:
                kube.held.clear()      # the API server gave up on it: it is never applied
        svc.binder._binding = and_dropped
        return why
    return cause


@pytest.mark.parametrize("late", LATE)
def test_a_binding_of_unknown_outcome_never_applied_frees_its_card_once_it_cannot_land(kube, extender, late):
    """The same failures, and the Binding is never applied. The card stays reserved for the pod
    (no other pod is given it, the pod is not bound elsewhere: a Binding to another node could
    meet the late one) until the hold's time is up; then the pod's next filter, the watch showing
    it still unbound, releases it, and the pod and the others are placed as usual."""
    f, svc = extender
    a, b = gpu_pod(kube, "a"), gpu_pod(kube, "b")
    caught_up(kube, f)
    assert filter_nodes(svc, a) == NODES
    held_before = snapshot(svc)
    never_applied(late)(kube, svc)
    assert bind(svc, a, "n1").startswith("cannot bind default/a to n1: ")
    vars(svc.binder).pop("_binding", None)
    reserved = snapshot(svc)
    assert reserved[0] == {"default/a": ("n1", (0,), (80 * GiB,), (1000,))}

    assert filter_nodes(svc, b) == ["n2"]                               # the others go elsewhere
    assert filter_nodes(svc, a) == ["n2"]                               # kube-scheduler retries it
    err = bind(svc, a, "n2")
    assert "may still be applied" in err and "default/a" in err
    svc._clock.t += svc.unknown_outcome_hold_s - 1
    assert filter_nodes(svc, a) == ["n2"] and "may still be applied" in bind(svc, a, "n2")
    caught_up(kube, f)
    assert snapshot(svc) == reserved and not kube.get_pod("default", "a")["spec"].get("nodeName")

    svc._clock.t += 2                                                   # it can no longer land
    assert filter_nodes(svc, a) == NODES                                # its next filter released it
    assert snapshot(svc) == held_before
    assert bind(svc, b, "n1") == "" and bind(svc, a, "n2") == ""
    caught_up(kube, f)
    assert snapshot(svc)[0] == {"default/b": ("n1", (0,), (80 * GiB,), (1000,)),
                                "default/a": ("n2", (0,), (80 * GiB,), (1000,))}


def test_a_hold_whose_time_is_up_is_released_by_a_bind_elsewhere_too(kube, extender):
    """No filter in between (a bind sent again): the bind elsewhere finds the hold lapsed, sees the
    pod unbound (the watch's copy) and releases it, as it does a stale reservation."""
    f, svc = extender
    a = gpu_pod(kube, "a")
    caught_up(kube, f)
    never_applied(answered_504)(kube, svc)
    assert "504" in bind(svc, a, "n1")
    vars(svc.binder).pop("_binding", None)
    assert "may still be applied" in bind(svc, a, "n2")
    svc._clock.t += svc.unknown_outcome_hold_s
    assert bind(svc, a, "n2") == ""
    caught_up(kube, f)
    assert snapshot(svc)[0] == {"default/a": ("n2", (0,), (80 * GiB,), (1000,))}
    assert kube.get_pod("default", "a")["spec"]["nodeName"] == "n2"


@pytest.mark.parametrize("then", ["bound again to the same node", "deleted"])
def test_a_hold_of_unknown_outcome_ends_with_the_pod(kube, extender, then):
    """Before its time is up: kube-scheduler's retry to the same node writes the Binding again on
    the same cards (the late one then meets a bound pod: 409), and a deletion releases the cards."""
    f, svc = extender
    a = gpu_pod(kube, "a")
    caught_up(kube, f)
    kube.hold_bindings(1, status=504)
    assert "504" in bind(svc, a, "n1")
    if then == "deleted":
        kube.delete_pod("default", "a")
        caught_up(kube, f)
        assert snapshot(svc)[0] == {}
        assert kube.apply_held()[0]["code"] == 404
        return
    assert bind(svc, a, "n1") == ""
    assert kube.apply_held()[0]["code"] == 409
    caught_up(kube, f)
    assert snapshot(svc)[0] == {"default/a": ("n1", (0,), (80 * GiB,), (1000,))}
    assert "bindOutcomeUnknown" not in svc.state()["allocations"][a["metadata"]["uid"]]


# ------------------------------------------------- records that book one card past what it has
def share_rec(node: str, k: int, gib: int) -> str:
    return encode_allocation(AllocationRecord(node=node, whole=False, cards=(
        CardShare(index=k, uuid=f"GPU-{node}-{k}", memory_mib=gib * GiB, core_milli=0),)))


WHOLE = ({"gpus": 1}, rec("n1", 0))


def share(gib: int) -> tuple[dict, str]:
    return {"gpu_memory": gib}, share_rec("n1", 0, gib)


@pytest.mark.parametrize("pods", [(WHOLE, WHOLE), (share(60), share(60)), (WHOLE, share(8)), (share(8), WHOLE)],
                         ids=["whole-whole", "shares-past-its-memory", "whole-then-share", "share-then-whole"])
def test_records_that_book_a_card_past_what_it_has_are_counted_and_said(kube, extender, pods):
    """Two bound pods whose records name one card past what it has (the race above, from an
    extender before the fix, or records written by hand): the feed booked both without a word.
    Both are still counted (a pod bound there may run there: counting one only would give the
    card to a third), and the second one applied is a pod error, logged and counted in
    ``pod_errors`` (stowage_extender_feed_pod_errors), until it or the other holder goes."""
    f, svc = extender
    (kx, rx), (ky, ry) = pods
    kube.create_pod(make_pod("x", node="n1", phase="Running", annotations={ALLOCATION_ANNOTATION: rx}, **kx))
    caught_up(kube, f)
    assert f.health()["pod_errors"] == 0
    y = kube.create_pod(make_pod("y", node="n1", phase="Running", annotations={ALLOCATION_ANNOTATION: ry}, **ky))
    caught_up(kube, f)
    held, rows = snapshot(svc)
    assert set(held) == {"default/x", "default/y"} and rows["n1"]["pods"] == [2]
    assert f.health()["pod_errors"] == 1
    why = f.status()["pod_errors"][y["metadata"]["uid"]]
    assert "card 0 of node n1" in why and "default/x" in why
    kube.update("pods", "default", "y", lambda o: o["metadata"].setdefault("labels", {}).update(seen="again"))
    caught_up(kube, f)
    assert f.health()["pod_errors"] == 1                       # said until one of them goes
    kube.delete_pod("default", "x")
    kube.update("pods", "default", "y", lambda o: o["metadata"]["labels"].update(seen="once more"))
    caught_up(kube, f)
    assert f.health()["pod_errors"] == 0 and set(snapshot(svc)[0]) == {"default/y"}
    kube.delete_pod("default", "y")
    caught_up(kube, f)
    assert f.health()["pod_errors"] == 0 and snapshot(svc)[0] == {}


def test_shares_that_fit_on_one_card_are_no_error(kube, extender):
    f, svc = extender
    for name in ("x", "y"):
        kube.create_pod(make_pod(name, node="n1", phase="Running", gpu_memory=40,
                                 annotations={ALLOCATION_ANNOTATION: share_rec("n1", 0, 40)}))
    caught_up(kube, f)
    assert snapshot(svc)[1]["n1"]["mem_free"] == [0] and f.health()["pod_errors"] == 0
