"""The feed lists nodes and pods in pages (``limit`` + ``continue``), as client-go's reflector does.

Why: one unpaged list of a big cluster is parsed whole, and its peak memory grows with the
cluster: 30,000 pods of ~8 KB took the feeder's RSS up by ~2 GiB at start and after every 410,
over the extender's 1 GiB limit (docs/kube.md). Paged, the peak is a page's; the model, the
resourceVersion the watch resumes from, and what the placers learn (in creation order) stay
exactly what one list gives.
"""
from __future__ import annotations

import logging

import pytest
from extender_kube_helpers import FakeKube, feeders, inv_node, kube, make_pod, new_feeder  # noqa: F401
from kubernetes.client.exceptions import ApiException

from extender.kube import LIST_PAGE_SIZE, NODES, PODS, creation_order
from extender.kube_objects import pod_for_learn
from extender.service import ExtenderService
from packing.model import ClusterModel
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, encode_allocation

SCHED = "stowage-scheduler"


def record(node: str, card: int) -> str:
    return encode_allocation(AllocationRecord(node=node, whole=True, cards=(
        CardShare(index=card, uuid=f"GPU-{node}-{card}", memory_mib=80 * 1024, core_milli=1000),)))


def cluster(kube: FakeKube, pods: int, nodes: int = 4) -> list[dict]:
    """``nodes`` 8-card nodes and ``pods`` pods of Stowage's scheduler: most bound with a record,
    every fifth pending. Names and creation times are in different orders (the API server pages
    by name, the placers learn by creation time)."""
    for k in range(nodes):
        kube.create_node(inv_node(f"n{k}", [80] * 8), emit=False)
    made = []
    for i in range(pods):
        name = f"p{(i * 37) % 1000:03d}-{i}"
        if i % 5 == 4:
            p = make_pod(name, gpus=1, namespace=f"ns{i % 3}")
        else:
            node = f"n{i % nodes}"
            p = make_pod(name, gpus=1, namespace=f"ns{i % 3}", node=node, phase="Running",
                         annotations={ALLOCATION_ANNOTATION: record(node, (i // nodes) % 8)})
        p["spec"]["schedulerName"] = SCHED
        p["metadata"]["creationTimestamp"] = f"2024-05-01T10:{(i * 13) % 60:02d}:{i % 60:02d}Z"
        made.append(kube.create_pod(p, emit=False))
    return made


def bound(pods: list[dict]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods if p["spec"].get("nodeName")}


def shown_by(f) -> list[str]:
    """Record the uids the feeder shows to on_pod_seen, in order."""
    shown: list[str] = []
    f.on_pod_seen = lambda pod: shown.append(pod["metadata"]["uid"])
    return shown


def test_a_big_list_is_read_in_pages_of_500_from_one_snapshot(kube):
    pods = cluster(kube, 1203)
    f = new_feeder(kube)
    shown = shown_by(f)
    f.sync_once()
    got = kube.list_requests(PODS)
    assert [q.get("limit") for q in got] == [str(LIST_PAGE_SIZE)] * 3 == ["500"] * 3
    assert "continue" not in got[0] and all(q.get("continue") for q in got[1:])
    assert "resourceVersion" not in got[1]       # a continued page must not name one
    assert [q.get("limit") for q in kube.list_requests(NODES)] == ["500"]
    assert set(f.model.allocations) == bound(pods)
    assert f.streams[PODS].rv == str(kube.resource_version) and f.streams[PODS].synced
    assert shown == [p["metadata"]["uid"] for p in sorted(pods, key=creation_order)]


def test_pods_are_learned_in_creation_order_across_pages_as_from_one_list(kube):
    """A restarted extender shows its placers the pods in the order the running one saw them
    arrive, whatever the pages: the same uids in the same order, and the same learned state, as
    one unpaged list (which sorted the whole list)."""
    pods = cluster(kube, 23)
    assert [p["metadata"]["name"] for p in sorted(pods, key=creation_order)] != sorted(
        p["metadata"]["name"] for p in pods)        # the fixture: name order is not creation order
    runs = {}
    for page_size in (1000, 4):
        f = new_feeder(kube, page_size=page_size)
        svc = ExtenderService(f.model)
        shown = shown_by(f)
        learn = f.on_pod_seen
        f.on_pod_seen = lambda pod, learn=learn, svc=svc: (learn(pod), svc.learn_pod(pod))
        f.sync_once()
        runs[page_size] = (shown, svc.learned_summary(), set(f.model.allocations), dict(f._pending.items()))
    assert len(kube.list_requests(PODS)) == 1 + 6
    assert runs[4] == runs[1000]
    assert runs[4][0] == [p["metadata"]["uid"] for p in sorted(pods, key=creation_order)]
    assert runs[4][1]["pods"] == 23


def test_a_list_shows_the_placers_only_what_learning_reads():
    """Until the last page, only the learn copy of each pod is kept: what on_pod_seen gets from a
    list is that copy, and a service learns from it what it learns from the pod."""
    with FakeKube(bookmark_interval=3600) as kube:
        pods = cluster(kube, 6)
        for p in pods:
            kube.patch_pod(p["metadata"]["namespace"], p["metadata"]["name"], {"metadata": {
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]}}, emit=False)
        f = new_feeder(kube, page_size=2)
        got: list[dict] = []
        f.on_pod_seen = got.append
        f.sync_once()
        listed = sorted(kube.objects(PODS), key=creation_order)
    assert got == [pod_for_learn(p) for p in listed]
    assert all("managedFields" not in g["metadata"] and "status" not in g for g in got)
    whole, slim = ExtenderService(f.model), ExtenderService(f.model)
    for p, g in zip(listed, got):
        whole.learn_pod(p)
        slim.learn_pod(g)
    assert slim.learned_summary() == whole.learned_summary()


def test_watch_resumes_from_the_snapshot_of_the_pages(kube, feeders):
    """Every page comes from the first page's snapshot; a pod deleted while the list is under way
    is still on a later page, and the watch, resumed from the snapshot's resourceVersion,
    removes it."""
    pods = cluster(kube, 12)
    last = max(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
    assert last["spec"].get("nodeName")
    deleted = []

    def between(kind: str, page: int) -> None:
        if kind == PODS and page == 0 and not deleted:
            deleted.append(kube.delete_pod(last["metadata"]["namespace"], last["metadata"]["name"]))

    kube.on_list_page = between
    f = new_feeder(kube, page_size=5)
    feeders.append(f)
    f.start()
    kube.wait_for(lambda: f.ready()[0])
    uid = last["metadata"]["uid"]
    kube.wait_for(lambda: uid not in f.model.allocations)
    assert set(f.model.allocations) == bound(pods) - {uid}
    assert len(kube.list_requests(PODS)) == 3     # no relist: the watch caught up


def test_an_expired_continue_starts_the_list_again_in_pages(kube, caplog):
    """The list's snapshot is compacted before its second page: 410 Expired. The list starts
    again from its first page, in pages (client-go's pager lists everything in one request, a
    response the size of the cluster: what the pages bound), and the model ends exactly as that
    new list says (a pod of the first page deleted since is gone, one created since is there)."""
    pods = cluster(kube, 14)
    first = min(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
    assert first["spec"].get("nodeName")

    def between(kind: str, page: int) -> None:
        if kind == PODS and page == 0 and kube.on_list_page is not None:
            kube.on_list_page = None      # once: not on the new list's pages
            kube.delete_pod(first["metadata"]["namespace"], first["metadata"]["name"], emit=False)
            kube.create_pod(make_pod("late", gpus=1, node="n0", phase="Running",
                                     annotations={ALLOCATION_ANNOTATION: record("n0", 7)}), emit=False)
            kube.expire_lists()

    kube.on_list_page = between
    f = new_feeder(kube, page_size=5)
    shown = shown_by(f)
    with caplog.at_level(logging.WARNING, logger="stowage.kube"):
        f.sync_once()
    got = kube.list_requests(PODS)
    assert [(q.get("limit"), bool(q.get("continue"))) for q in got] == [
        ("5", False), ("5", True), ("5", False), ("5", True), ("5", True)]   # 14 pods: 5 + 5 + 4
    now = kube.objects(PODS)
    assert set(f.model.allocations) == bound(now) and first["metadata"]["uid"] not in f.model.allocations
    assert f.streams[PODS].rv == str(kube.resource_version)
    assert shown == [p["metadata"]["uid"] for p in sorted(now, key=creation_order)]
    assert f._shown == set(shown)
    assert any("listing all pods again from the first page" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)
    assert not any("one request" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("reason", ["Gone", "Injected"])
def test_a_410_to_a_continued_page_that_is_not_expired_fails_the_list(kube, reason):
    """client-go's pager lists everything again only when a continued page answers "resource
    expired" (``errors.IsResourceExpired``: the Status's reason ``Expired``); any other error,
    a 410 of another reason included (a proxy's, or ``Gone``), fails the list, which the feed
    backs off from and lists again. Before, any 410 to a continued page was taken for Expired."""
    pods = cluster(kube, 15)
    f = new_feeder(kube, page_size=5)
    kube.on_list_page = lambda kind, page: (kind == PODS and page == 0
                                            and kube.fail_next(1, status=410, path="/api/v1/pods$", reason=reason))
    with pytest.raises(ApiException) as exc:
        f.sync_once()
    assert exc.value.status == 410
    got = kube.list_requests(PODS)
    assert [(q.get("limit"), bool(q.get("continue"))) for q in got] == [("5", False), ("5", True)]   # no full list
    st = f.streams[PODS]
    assert not st.synced and st.rv == ""
    assert set(f.model.allocations) == bound(first_page(pods, 5))   # the first page's bound pods: real, kept
    kube.on_list_page = None
    f.sync_once()                                                    # the next list: complete
    assert set(f.model.allocations) == bound(pods) and f.streams[PODS].synced


def test_a_list_failing_part_way_removes_nothing_and_sets_no_resource_version(kube):
    """A list that fails on its third page has applied two pages: those objects are real and
    current, but what is absent from the list is only removed, and the watch's resourceVersion
    set, once the list is complete."""
    pods = cluster(kube, 15)
    f = new_feeder(kube, page_size=5)
    shown = shown_by(f)
    f.sync_once()
    rv, lists = f.streams[PODS].rv, f.streams[PODS].lists
    pending = [p for p in pods if not p["spec"].get("nodeName")]
    gone = [pods[0], pending[-1]]                   # a bound pod and a pending one, deleted unseen
    for p in gone:
        kube.delete_pod(p["metadata"]["namespace"], p["metadata"]["name"], emit=False)
    kube.on_list_page = lambda kind, page: page == 1 and kube.fail_next(1, status=500, path="/api/v1/pods$")
    shown.clear()
    with pytest.raises(ApiException):
        f._relist(f.streams[PODS])
    assert [bool(q.get("continue")) for q in kube.list_requests(PODS)[-3:]] == [False, True, True]
    assert set(f.model.allocations) == bound(pods)                  # nothing removed
    assert f.pending_uid("{}/{}".format(pending[-1]["metadata"]["namespace"], pending[-1]["metadata"]["name"]))
    assert (f.streams[PODS].rv, f.streams[PODS].lists) == (rv, lists) and shown == []
    assert f._shown == {p["metadata"]["uid"] for p in pods}
    kube.on_list_page = None
    f._relist(f.streams[PODS])                                      # the retry: now it matches
    assert set(f.model.allocations) == bound(pods) - {pods[0]["metadata"]["uid"]}
    assert f._shown == {p["metadata"]["uid"] for p in pods} - {p["metadata"]["uid"] for p in gone}
    assert f.pending_uid("{}/{}".format(pending[-1]["metadata"]["namespace"], pending[-1]["metadata"]["name"])) is None
    assert f.streams[PODS].rv == str(kube.resource_version) != rv


def first_page(pods: list[dict], n: int) -> list[dict]:
    return sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))[:n]


def test_a_first_list_failing_part_way_leaves_the_feed_unsynced(kube):
    pods = cluster(kube, 15)
    f = new_feeder(kube, page_size=5)
    shown = shown_by(f)
    kube.on_list_page = lambda kind, page: kind == PODS and page == 0 and kube.fail_next(1, status=503)
    with pytest.raises(ApiException):
        f.sync_once()
    st = f.streams[PODS]
    assert not st.synced and st.rv == "" and not f.ready()[0]
    assert set(f.model.allocations) == bound(first_page(pods, 5))   # the first page's bound pods: real, kept
    assert shown == [] and f._shown == set()


def test_a_pod_the_placers_fail_on_does_not_fail_the_list(kube, caplog):
    """The pods are shown after the last page: one the placers cannot take is logged, as when it
    was shown while applied, and the others are shown and the list completes."""
    pods = cluster(kube, 9)
    bad = sorted(pods, key=creation_order)[3]["metadata"]["uid"]
    f = new_feeder(kube, page_size=4)
    shown: list[str] = []

    def seen(pod: dict) -> None:
        if pod["metadata"]["uid"] == bad:
            raise ValueError("odd pod")
        shown.append(pod["metadata"]["uid"])

    f.on_pod_seen = seen
    with caplog.at_level(logging.ERROR, logger="stowage.kube"):
        f.sync_once()
    assert shown == [p["metadata"]["uid"] for p in sorted(pods, key=creation_order) if p["metadata"]["uid"] != bad]
    assert f.streams[PODS].synced and set(f.model.allocations) == bound(pods)
    assert any("could not be shown to the placers" in r.getMessage() for r in caplog.records)


def test_a_lists_pods_are_learned_with_one_table_build_and_end_as_one_at_a_time(kube, monkeypatch):
    """The pods of a list are shown to the placers at once, after its last page: the learned
    table used to be rebuilt every 128 of them (a 30,000-pod first list: 234 full builds, ~3 s
    of the extender's start); inside ``learning_in_bulk`` (wired as the extender wires it) it is
    built once, and is the table a service learning the same pods one at a time ends with."""
    from test_extender_learned_past import count_table_builds, same_table

    pods = cluster(kube, 700)
    for i, p in enumerate(pods):         # shapes enough for a table that changes as it learns
        kube.patch_pod(p["metadata"]["namespace"], p["metadata"]["name"], {"spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(1 + i % 2), "cpu": f"{1 + i % 7}",
                                                   "memory": f"{1 + i % 5}Gi"}}}]}}, emit=False)
    builds = count_table_builds(monkeypatch)
    f = new_feeder(kube)
    svc = ExtenderService(f.model)
    f.on_pod_seen, f.learning_in_bulk = svc.learn_pod, svc.learning_in_bulk     # as extender/cli.py does
    f.sync_once()
    assert len(builds) == 1
    one = ExtenderService(ClusterModel())
    for p in sorted(kube.objects(PODS), key=creation_order):
        one.learn_pod(p)
    assert svc.learned_summary() == one.learned_summary() and svc.learned_summary()["pods"] == 700
    got, ref = svc.placers["pack"], one.placers["pack"]
    assert same_table(got.table, ref.table) and got._cap_basis == ref._cap_basis


def test_an_expired_continue_leaves_nothing_of_the_first_pages_that_is_gone_since(kube):
    """What the pages before a 410 Expired applied, and the full list no longer has (deleted in
    between, no watch to tell), is removed as anything absent from a list is: a node, and a pod
    bound without a record (it holds CPU, memory and a pod slot), both new since the list began."""
    cluster(kube, 14, nodes=6)
    ghost_node = kube.create_node(inv_node("a-ghost", [80] * 8), emit=False)
    ghost_pod = kube.create_pod(make_pod("cpu-only", namespace="a", node="n0", phase="Running"), emit=False)

    done: set[str] = set()

    def between(kind: str, page: int) -> None:
        if page == 0 and kind not in done:     # once per kind: not on the new list's first page
            done.add(kind)
            if kind == NODES:
                kube.delete_node("a-ghost", emit=False)
            else:
                kube.delete_pod("a", "cpu-only", emit=False)
            kube.expire_lists()

    kube.on_list_page = between
    f = new_feeder(kube, page_size=5)
    f.sync_once()
    assert [bool(q.get("continue")) for q in kube.list_requests(NODES)] == [False, True, False, True]
    assert [bool(q.get("continue")) for q in kube.list_requests(PODS)] == [False, True, False, True, True]
    assert ghost_node["metadata"]["name"] not in f.model.node_names()
    assert ghost_pod["metadata"]["uid"] not in f.model.allocations


class _Page:
    """An unread list response, as ``_list_call`` returns one."""

    def __init__(self, doc: dict) -> None:
        import io
        import json
        self.data = json.dumps(doc).encode()
        self._body = io.BytesIO(self.data)
        self.read = self._body.read

    def close(self) -> None:
        self._body.close()

    def release_conn(self) -> None:
        pass


def _bounded(f, calls: int = 40):
    """Wrap ``f._list_call`` so that a list looping forever fails the test instead of hanging it."""
    orig, n = f._list_call, [0]

    def call(kind: str, limit: int = 0, cont: str = ""):
        n[0] += 1
        assert n[0] <= calls, f"{kind} list still going after {calls} requests"
        return orig(kind, limit, cont)

    f._list_call = call
    return call


def test_a_list_whose_pages_come_again_fails_instead_of_looping(kube):
    """A proxy that drops the ``continue`` parameter answers every request with the first page
    and a continue token: the list would go on for ever, keeping a learn copy of each pod of
    every page. The feed tells the same object listed twice and fails the list (back-off, then
    a new list) with a clear error."""
    cluster(kube, 12)
    f = new_feeder(kube, page_size=5)
    shown = shown_by(f)
    orig = f._list_call
    f._list_call = lambda kind, limit=0, cont="": orig(kind, limit)      # continue dropped on the way
    _bounded(f)
    with pytest.raises(RuntimeError, match="twice"):
        f.sync_once()
    assert not f.streams[NODES].synced or not f.streams[PODS].synced
    assert shown == []


def test_a_continue_token_given_back_unchanged_fails_the_list(kube):
    """A server answering a continued page with the very token it was sent (and no objects)
    would be asked for that page for ever: the list fails instead."""
    cluster(kube, 3)
    f = new_feeder(kube, page_size=5)
    real = f._list_call

    def call(kind: str, limit: int = 0, cont: str = ""):
        if kind == PODS:
            return _Page({"metadata": {"resourceVersion": "7", "continue": "same"}, "items": []})
        return real(kind, limit, cont)

    f._list_call = call
    _bounded(f)
    with pytest.raises(RuntimeError, match="continue"):
        f.sync_once()
    assert not f.streams[PODS].synced


def _fatten(kube: FakeKube, pod: dict, kib: int) -> None:
    """Make a stored pod ~``kib`` KiB of JSON bigger (an annotation a pod author wrote; a real API
    server stores such a pod as well: ~3 MiB of JSON for 20,000 minimal containers)."""
    m = pod["metadata"]
    kube.patch_pod(m["namespace"], m["name"], {"metadata": {"annotations": {"example.com/blob": "x" * (kib << 10)}}},
                   emit=False)


def _parsed_sizes(monkeypatch) -> list[int]:
    """The byte size of every list body the feed parses."""
    import stowage.kubelist as kubelist
    sizes: list[int] = []
    real = kubelist.loads

    def loads(data):
        sizes.append(len(data))
        return real(data)

    monkeypatch.setattr(kubelist, "loads", loads)
    return sizes


def test_a_page_past_its_bytes_is_asked_again_smaller_from_the_same_point(kube, monkeypatch, caplog):
    """A pod author decides how big a pod is, so a page of ``limit`` pods is bounded only in
    count. A page whose JSON passes ``page_bytes`` is abandoned unread (its connection closed)
    and asked for again from the same continue token with an eighth of the objects, down to
    one; ordinary pages after it grow back to the page size. No body past the bound is parsed
    unless it holds one object, and the list ends exactly as an unbounded one: every pod once,
    the same model, the same order shown to the placers."""
    pods = cluster(kube, 40)
    ordered = sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
    fat = {p["metadata"]["uid"] for p in ordered[12:15]}          # the 2nd page holds them
    for p in ordered[12:15]:
        _fatten(kube, p, 48)
    ref = new_feeder(kube, page_size=10, page_bytes=1 << 30)
    ref_shown = shown_by(ref)
    ref.sync_once()
    before = len(kube.list_requests(PODS))

    sizes = _parsed_sizes(monkeypatch)
    f = new_feeder(kube, page_size=10, page_bytes=40 << 10)
    shown = shown_by(f)
    _bounded(f)
    with caplog.at_level(logging.WARNING, logger="stowage.kube"):
        f.sync_once()
    got = [(int(q["limit"]), bool(q.get("continue"))) for q in kube.list_requests(PODS)[before:]]
    assert got[0] == (10, False) and got[1] == (10, True)          # the 2nd page passes 40 KiB ...
    assert got[2] == (1, True)                                      # ... asked again: 10 // 8 = 1
    assert max(limit for limit, _ in got[3:]) == 10                 # ordinary pages grow back
    assert shown == ref_shown and set(f.model.allocations) == set(ref.model.allocations)
    assert len(shown) == 40 and fat <= set(shown)
    assert f.streams[PODS].synced and f.streams[PODS].rv == ref.streams[PODS].rv
    one_pod = 48 << 10
    assert all(size <= 40 << 10 or size < one_pod + (8 << 10) for size in sizes)   # past it: one pod alone
    assert any("a page of 10 objects passed 40 KiB of JSON" in r.getMessage() and "asking for 1 from the same point"
               in r.getMessage() for r in caplog.records)


def test_a_single_object_past_the_page_bound_is_read_whole(kube):
    """One object is what etcd bounds (~1.5 MiB stored): a page of one is read up to the bound of
    one object (16 MiB of JSON), whatever the page bound, so a list of what an API server stores
    always ends."""
    pods = cluster(kube, 3)
    _fatten(kube, pods[1], 64)
    f = new_feeder(kube, page_size=4, page_bytes=16 << 10)
    shown = shown_by(f)
    _bounded(f)
    f.sync_once()
    assert sorted(shown) == sorted(p["metadata"]["uid"] for p in pods)
    # 3 pods, the middle one fat: all 3 too big -> 1 (small: grows) -> 2 (fat + 1: too big) -> 1, 1
    assert [int(q["limit"]) for q in kube.list_requests(PODS)] == [4, 1, 2, 1, 1]


def test_a_single_object_past_the_object_bound_fails_the_list_unread_and_the_feed_backs_off(kube, feeders,
                                                                                           monkeypatch):
    """A page of one object was read whole, whatever its size ("one object is what etcd bounds"),
    but the peer need not be a real API server (a proxy, one that lies): a one-object page of
    2 GiB was read into memory. Now it is read up to 16 MiB (the bound of one object, as of one
    watch event), then abandoned unread: the list fails with an error that says so, and the feed
    backs off and lists again like after any failed list, until the object is gone."""
    pods = cluster(kube, 3)
    _fatten(kube, pods[1], 17 << 10)                # 17 MiB of JSON in one pod: no API server serves that
    sizes = _parsed_sizes(monkeypatch)
    f = new_feeder(kube, page_size=4, page_bytes=16 << 10)
    _bounded(f)
    with pytest.raises(Exception, match="a page of 1 object passed 16 MiB of JSON") as exc:
        f.sync_once()
    assert "the bound of one object" in str(exc.value)
    assert all(size < 16 << 20 for size in sizes)                  # nothing past the bound was parsed
    assert not f.streams[PODS].synced and f.streams[PODS].rv == ""

    f = new_feeder(kube, page_size=4, page_bytes=16 << 10)
    feeders.append(f)
    f.start()
    st = f.streams[PODS]
    kube.wait_for(lambda: st.errors >= 2)                           # failed, backed off, listed again
    ok, why = f.ready()
    assert not ok and "a page of 1 object passed 16 MiB" in why
    m = pods[1]["metadata"]
    kube.delete_pod(m["namespace"], m["name"], emit=False)
    kube.wait_for(lambda: f.ready()[0])
    assert st.synced and st.lists >= 1


def test_a_list_whose_snapshot_keeps_expiring_fails_after_three_new_starts(kube):
    """Each new start of a list whose snapshot expired (410 Expired) is a new list from the first
    page; a server whose lists keep expiring gets three, then the list fails (the feed backs off
    and lists again) instead of asking for ever."""
    cluster(kube, 12)
    kube.on_list_page = lambda kind, page: kind == PODS and page == 0 and kube.expire_lists()
    f = new_feeder(kube, page_size=5)
    _bounded(f)
    with pytest.raises(ApiException) as exc:
        f.sync_once()
    assert exc.value.status == 410
    assert [bool(q.get("continue")) for q in kube.list_requests(PODS)] == [False, True] * 4
    assert not f.streams[PODS].synced and f.streams[PODS].rv == ""


@pytest.mark.parametrize("page_size,page_bytes", [(0, 1 << 20), (-3, 1 << 20), (5, 0)])
def test_a_page_size_or_bound_below_one_is_refused_at_start(kube, page_size, page_bytes):
    with pytest.raises(ValueError, match="at least 1"):
        new_feeder(kube, page_size=page_size, page_bytes=page_bytes)
