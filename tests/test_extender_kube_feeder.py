"""KubeFeeder against the fake API server over real HTTP, with the real `kubernetes` client."""
from __future__ import annotations

import logging
import time

import pytest
from extender_kube_helpers import (FakeClock, FakeKube, feeders, gfd_node, inv_node, kube, make_node,  # noqa: F401
                                   make_pod, new_feeder, row, started)

from extender.kube import NODES, PODS, JitteredBackoff
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, encode_allocation
from stowage.inventory import INVENTORY_ANNOTATION

GiB = 1024


def rec(node: str, shares: list[tuple[int, int, int]], whole: bool = False) -> str:
    return encode_allocation(AllocationRecord(node=node, whole=whole, cards=tuple(
        CardShare(index=k, uuid=f"GPU-{node}-{k}", memory_mib=m, core_milli=c) for k, m, c in shares)))





def test_initial_list_builds_model_from_annotation_gfd_and_allocatable(kube, feeders, caplog):
    kube.create_node(inv_node("a100", [80, 80, 40]))
    kube.create_node(gfd_node("a10", 2))
    kube.create_node(make_node("plain", gpus=3))
    kube.create_node(make_node("notready", gpus=1, ready=False))
    kube.create_node(make_node("cordoned", gpus=1, unschedulable=True))
    kube.create_node(make_node("broken", gpus=2, annotations={INVENTORY_ANNOTATION: "{not json"}))
    shared = kube.create_pod(make_pod("shared", gpu_memory=20, gpu_core=30, node="a100", phase="Running",
                                      annotations={ALLOCATION_ANNOTATION: rec("a100", [(2, 20 * GiB, 300)])}))
    whole = kube.create_pod(make_pod("whole", gpus=2, node="a100", phase="Running",
                                     annotations={ALLOCATION_ANNOTATION: rec("a100", [(0, 80 * GiB, 1000), (1, 80 * GiB, 1000)], whole=True)}))
    kube.create_pod(make_pod("done", gpus=1, node="a10", phase="Succeeded",
                             annotations={ALLOCATION_ANNOTATION: rec("a10", [(0, 24576, 1000)], whole=True)}))
    kube.create_pod(make_pod("garbage", gpus=1, node="a10", phase="Running",
                             annotations={ALLOCATION_ANNOTATION: '{"version": 1, "node": "a10"'}))
    kube.create_pod(make_pod("negative", gpus=1, node="a10", phase="Running",
                             annotations={ALLOCATION_ANNOTATION: rec("a10", [(-1, 0, 1000)], whole=True)}))
    with caplog.at_level(logging.ERROR, logger="stowage.kube"):
        f = new_feeder(kube)
        feeders.append(f)
        assert f.ready() == (False, "waiting for the first list of nodes from the API server")
        f.start()
        kube.wait_for(lambda: f.ready()[0])
    m = f.model
    assert sorted(m.node_names()) == ["a10", "a100", "broken", "cordoned", "notready", "plain"]
    assert row(m, "a100") == {"cards": [0, 1, 2], "healthy": [True] * 3, "mem_total": [80 * GiB, 80 * GiB, 40 * GiB],
                              "mem_free": [0, 0, 20 * GiB], "core_free": [0, 0, 700], "pods": [1, 1, 1], "node_ok": True}
    assert m.meta["a100"].uuids[2] == "GPU-a100-2"
    assert row(m, "a10")["mem_total"] == [24576, 24576] and m.meta["a10"].source == "gfd-labels"
    assert row(m, "a10")["pods"] == [0, 0]  # the finished pod and the two unreadable records hold nothing
    assert row(m, "plain")["cards"] == [0, 1, 2] and m.meta["plain"].whole_only
    assert not row(m, "notready")["node_ok"] and not row(m, "cordoned")["node_ok"]
    assert row(m, "broken")["cards"] == [] and "not JSON" in f.node_errors["broken"]
    assert {u for u, al in m.allocations.items() if al.cards} == {shared["metadata"]["uid"], whole["metadata"]["uid"]}
    # The two bound pods with unreadable records hold no card, but their host room and pod slot count.
    assert {al.name for al in m.allocations.values() if not al.cards} == {"default/garbage", "default/negative"}
    a = m.allocations[shared["metadata"]["uid"]]
    assert (a.node, a.cards, a.mem_mib, a.core_milli, a.whole) == ("a100", (2,), (20 * GiB,), (300,), False)
    logged = caplog.text
    assert "broken" in logged and "default/garbage" in logged and "default/negative" in logged
    assert set(f.status()["pod_errors"]) == {p["metadata"]["uid"] for p in kube.objects("pods")
                                             if p["metadata"]["name"] in ("garbage", "negative")}


def test_watch_applies_node_and_pod_changes(kube, feeders):
    kube.create_node(inv_node("n1", [24, 24]))
    f = started(kube, feeders)
    m = f.model
    kube.create_node(gfd_node("n2", 4))
    kube.wait_for(lambda: "n2" in m.index)
    assert row(m, "n2")["cards"] == [0, 1, 2, 3]
    # The device plugin publishes a new inventory: card 1 turned unhealthy.
    from stowage.inventory import Card, encode_inventory
    cards = [Card(0, "GPU-n1-0", "A10", 24 * GiB), Card(1, "GPU-n1-1", "A10", 24 * GiB, healthy=False)]
    kube.patch_node("n1", {"metadata": {"annotations": {INVENTORY_ANNOTATION: encode_inventory(cards)}}})
    kube.wait_for(lambda: row(m, "n1")["healthy"] == [True, False])
    kube.patch_node("n1", {"spec": {"unschedulable": True}})
    kube.wait_for(lambda: not row(m, "n1")["node_ok"])
    # A pending pod, then its allocation record, then it finishes.
    p = kube.create_pod(make_pod("p", gpu_memory=10))
    uid = p["metadata"]["uid"]
    kube.wait_for(lambda: f.get_pod("default", "p") is not None)
    kube.patch_pod("default", "p", {"metadata": {"annotations": {ALLOCATION_ANNOTATION: rec("n2", [(3, 10 * GiB, 0)])}},
                                    "spec": {"nodeName": "n2"}})
    kube.wait_for(lambda: uid in m.allocations)
    assert row(m, "n2")["mem_free"] == [24576, 24576, 24576, 24576 - 10 * GiB]
    kube.patch_pod("default", "p", {"status": {"phase": "Succeeded"}})
    kube.wait_for(lambda: uid not in m.allocations)
    assert row(m, "n2")["mem_free"] == [24576] * 4
    # A running pod deleted.
    q = kube.create_pod(make_pod("q", gpus=1, node="n2", phase="Running",
                                 annotations={ALLOCATION_ANNOTATION: rec("n2", [(1, 24576, 1000)], whole=True)}))
    kube.wait_for(lambda: q["metadata"]["uid"] in m.allocations)
    assert row(m, "n2")["pods"] == [0, 1, 0, 0]
    kube.delete_pod("default", "q")
    kube.wait_for(lambda: q["metadata"]["uid"] not in m.allocations)
    assert row(m, "n2")["pods"] == [0, 0, 0, 0]
    kube.delete_node("n2")
    kube.wait_for(lambda: "n2" not in m.index)
    assert f.streams[PODS].lists == 1 and f.streams[NODES].lists == 1


def test_record_of_a_pod_not_bound_holds_no_cards_and_a_bound_one_does(kube, feeders):
    """A record is replayed only once the pod is bound: a bind in flight is booked in memory by the
    extender that makes it, and a record left by an extender that died before the Binding (issue 12
    item 6) must not count against the pod itself when it is scheduled again."""
    kube.create_node(inv_node("n1", [40]))
    p = kube.create_pod(make_pod("p", gpu_memory=10))
    f = started(kube, feeders)
    kube.patch_pod("default", "p", {"metadata": {"annotations": {ALLOCATION_ANNOTATION: rec("n1", [(0, 10 * GiB, 0)])}}})
    kube.create_pod(make_pod("marker"))
    kube.wait_for(lambda: f.pending_pod("default", "marker") is not None)    # the record's event came before
    assert p["metadata"]["uid"] not in f.model.allocations
    assert row(f.model, "n1")["mem_free"] == [40 * GiB]
    # a fresh extender (restart, failover) does not count it either
    g = started(kube, feeders)
    assert p["metadata"]["uid"] not in g.model.allocations and row(g.model, "n1")["mem_free"] == [40 * GiB]
    kube.patch_pod("default", "p", {"spec": {"nodeName": "n1"}})           # the Binding
    kube.wait_for(lambda: p["metadata"]["uid"] in f.model.allocations)
    assert row(f.model, "n1")["mem_free"] == [30 * GiB]
    assert f.model.gpu_releases == 0
    kube.delete_pod("default", "p")
    kube.wait_for(lambda: p["metadata"]["uid"] not in f.model.allocations)
    assert f.model.gpu_releases == 1


def test_unannotated_allocation_made_by_bind_is_not_dropped_by_the_feed(kube, feeders):
    """A reservation bind made in the model (record not yet visible) survives unrelated pod events."""
    kube.create_node(inv_node("n1", [40]))
    p = kube.create_pod(make_pod("p", gpu_memory=10))
    f = started(kube, feeders)
    from stowage.resources import GpuRequest
    f.model.assign(p["metadata"]["uid"], "default/p", "n1", [0], GpuRequest(mem_mib=10 * GiB), check=True)
    kube.patch_pod("default", "p", {"metadata": {"labels": {"x": "y"}}})
    kube.create_pod(make_pod("marker"))
    kube.wait_for(lambda: f.pending_pod("default", "marker") is not None)
    assert p["metadata"]["uid"] in f.model.allocations


def test_resume_from_last_resource_version_without_relist_or_duplicates(kube, feeders):
    kube.create_node(inv_node("n1", [80, 80]))
    f = started(kube, feeders)
    st = f.streams[PODS]
    events_before = st.events
    for i in range(3):
        kube.create_pod(make_pod(f"p{i}"))
    kube.wait_for(lambda: st.events == events_before + 3)
    last_rv = kube.get_pod("default", "p2")["metadata"]["resourceVersion"]
    watches = kube.watch_count("pods")
    kube.drop_watches()
    kube.create_pod(make_pod("during", gpus=1, node="n1", phase="Running",
                             annotations={ALLOCATION_ANNOTATION: rec("n1", [(1, 80 * GiB, 1000)], whole=True)}))
    kube.wait_for(lambda: kube.watch_count("pods") > watches and st.events == events_before + 4)
    resumed = [q for m_, p_, q in kube.requests if p_ == "/api/v1/pods" and q.get("watch") == "true"][watches]
    assert resumed["resourceVersion"] == last_rv
    assert st.lists == 1  # resumed, not relisted
    assert row(f.model, "n1")["pods"] == [0, 1]
    # No event was applied twice: exactly one per change since the list.
    kube.create_pod(make_pod("after"))
    # The pod cache is updated before the event is counted (KubeFeeder._event): wait for both,
    # or the count is read in between (this test's rare flake under load). Events arrive in
    # order on one stream, so once "after" is counted any duplicate before it was counted too.
    kube.wait_for(lambda: f.pending_pod("default", "after") is not None and st.events >= events_before + 5)
    assert st.events == events_before + 5


@pytest.mark.parametrize("gone_mode", ["event", "status"])
def test_relist_on_410_gone_catches_up_with_missed_changes(gone_mode, feeders):
    with FakeKube(bookmark_interval=3600, gone_mode=gone_mode) as kube:
        kube.create_node(inv_node("n1", [80, 80]))
        kube.create_node(inv_node("old", [16]))
        p = kube.create_pod(make_pod("p", gpus=1, node="n1", phase="Running",
                                     annotations={ALLOCATION_ANNOTATION: rec("n1", [(0, 80 * GiB, 1000)], whole=True)}))
        f = started(kube, feeders)
        assert p["metadata"]["uid"] in f.model.allocations
        if gone_mode == "status":
            kube.drop_watches()  # the resumed watch request itself is answered 410
        # Changes the feeder never hears about (history compacted away), then the 410.
        kube.delete_pod("default", "p", emit=False)
        kube.delete_node("old", emit=False)
        kube.create_node(inv_node("new", [24]), emit=False)
        q = kube.create_pod(make_pod("q", gpu_memory=4, node="n1", phase="Running",
                                     annotations={ALLOCATION_ANNOTATION: rec("n1", [(1, 4 * GiB, 0)])}), emit=False)
        kube.expire_watches()
        kube.wait_for(lambda: f.streams[PODS].lists == 2 and f.streams[NODES].lists == 2)
        m = f.model
        assert sorted(m.node_names()) == ["n1", "new"]
        assert set(m.allocations) == {q["metadata"]["uid"]}
        assert row(m, "n1")["pods"] == [0, 1] and row(m, "n1")["mem_free"] == [80 * GiB, 76 * GiB]
        kube.wait_for(lambda: f.ready()[0])
        f.stop()


def test_backoff_on_500s_then_recovery(kube, feeders):
    kube.create_node(inv_node("n1", [80]))
    kube.fail_next(3, status=500, path="^/api/v1/pods$", method="GET")
    f = new_feeder(kube)
    feeders.append(f)
    f.start()
    kube.wait_for(lambda: f.ready()[0])
    pod_lists = [q for m_, p_, q in kube.requests if p_ == "/api/v1/pods" and "watch" not in q]
    assert len(pod_lists) == 4  # three failures, one success
    st = f.streams[PODS]
    assert st.errors == 3 and st.failures == 0 and st.failing_since is None


def test_backoff_delays_grow_exponentially_with_jitter_and_cap():
    import random
    b = JitteredBackoff(base_s=0.5, max_s=8.0, rng=random.Random(1))
    for n, nominal in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (9, 8.0)]:
        d = [b.delay(n) for _ in range(50)]
        assert all(nominal * 0.5 <= x < nominal for x in d)
        assert len(set(d)) > 1  # jittered


def test_readiness_turns_false_while_watch_fails_and_back_when_it_recovers(kube, feeders):
    clock = FakeClock()
    kube.create_node(inv_node("n1", [80]))
    f = started(kube, feeders, clock=clock, stale_after_s=30.0)
    assert f.ready()[0]
    kube.fail_next(10**6, status=500, path="^/api/v1/nodes$")
    # Only the nodes watch: a pods watch cut too could reopen after the clock moved (a loaded
    # machine did so at random), and then nothing but a pod event would end its streak.
    kube.drop_watches("nodes")
    st = f.streams[NODES]
    kube.wait_for(lambda: st.failures >= 2)
    assert f.ready()[0]  # failing, but not for long yet
    clock.t += 31
    ok, why = f.ready()
    assert not ok and "nodes watch failing" in why and "injected failure (500)" in why
    kube.clear_faults()
    # The reopened watch proves itself by an event (or by staying open for open_grace_s), and the
    # model keeps following the cluster.
    kube.wait_for(lambda: st.open_since is not None)
    assert not f.ready()[0]
    kube.create_node(inv_node("n2", [24]))
    kube.wait_for(lambda: "n2" in f.model.index)
    kube.wait_for(lambda: f.ready()[0])   # (the event is counted just after it is applied)


def test_not_ready_until_first_list_succeeds(kube, feeders):
    kube.fail_next(10**6, status=503, path="^/api/v1/nodes$")
    f = new_feeder(kube)
    feeders.append(f)
    f.start()
    kube.wait_for(lambda: f.streams[NODES].errors >= 2)
    ok, why = f.ready()
    assert not ok and "first list of nodes" in why and "503" in why
    kube.clear_faults()
    kube.wait_for(lambda: f.ready()[0])


def test_stopped_feeder_is_not_ready(kube, feeders):
    f = started(kube, feeders)
    f.stop()
    assert f.ready() == (False, "the Kubernetes feed is stopped")


def test_malformed_objects_in_the_watch_do_not_stop_the_feed(kube, feeders, caplog):
    kube.create_node(inv_node("n1", [80]))
    f = started(kube, feeders)
    p = kube.create_pod(make_pod("p", gpus=1, node="n1", phase="Running",
                                 annotations={ALLOCATION_ANNOTATION: rec("n1", [(0, 80 * GiB, 1000)], whole=True)}))
    kube.wait_for(lambda: p["metadata"]["uid"] in f.model.allocations)
    with caplog.at_level(logging.ERROR, logger="stowage.kube"):
        kube.patch_pod("default", "p", {"metadata": {"annotations": {ALLOCATION_ANNOTATION: "[]"}}})
        kube.patch_node("n1", {"metadata": {"annotations": {INVENTORY_ANNOTATION: '{"cards": [{"index": "x"}]}'}}})
        kube.create_node(make_node("n2", gpus=2, labels={"nvidia.com/gpu.count": "two"}))
        kube.create_node(inv_node("n3", [24]))
        kube.wait_for(lambda: "n3" in f.model.index)
    assert "default/p" in caplog.text and "n1" in caplog.text and "n2" in caplog.text
    assert p["metadata"]["uid"] in f.model.allocations  # a broken record never loses the earlier valid one
    assert row(f.model, "n1")["cards"] == [] and row(f.model, "n2")["cards"] == []
    assert f.ready()[0]


def test_get_pod_from_cache_or_api(kube, feeders):
    kube.create_pod(make_pod("pending", gpus=1))
    kube.create_pod(make_pod("bound", gpus=1, node="n1", phase="Running"))
    f = started(kube, feeders)
    gets = lambda: [r for r in kube.requests if r[0] == "GET" and r[1].startswith("/api/v1/namespaces/")]  # noqa: E731
    pod = f.get_pod("default", "pending")
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert gets() == []  # served from the watch cache
    assert f.get_pod("default", "bound")["spec"]["nodeName"] == "n1"
    assert len(gets()) == 1
    assert f.get_pod("default", "missing") is None


def test_sync_once_lists_without_threads(kube):
    kube.create_node(inv_node("n1", [80, 80]))
    p = kube.create_pod(make_pod("p", gpus=1, node="n1", phase="Running",
                                 annotations={ALLOCATION_ANNOTATION: rec("n1", [(1, 80 * GiB, 1000)], whole=True)}))
    f = new_feeder(kube)
    f.sync_once()
    assert f.model.allocations[p["metadata"]["uid"]].cards == (1,)
    assert f.ready()[0] and not f._threads
    assert kube.watch_count() == 0


def test_watches_that_open_then_error_count_as_failing_and_back_off(kube, feeders):
    """A watch the API server accepts (HTTP 200) and then ends at once with a non-410 ERROR (an
    object it cannot decode: resuming from the same resourceVersion hits it again) delivers nothing.
    Opening it once cleared the failure streak, so /readyz stayed 200 on a frozen model (a deleted
    pod's cards stayed booked) until the 10-minute resync, and the back-off never grew."""
    clock = FakeClock()
    kube.create_node(inv_node("n1", [80]))
    holder = kube.create_pod(make_pod("holder", gpus=1, node="n1", phase="Running",
                                      annotations={ALLOCATION_ANNOTATION: rec("n1", [(0, 80 * GiB, 1000)], whole=True)}))
    uid = holder["metadata"]["uid"]
    f = started(kube, feeders, clock=clock, stale_after_s=30.0)
    assert uid in f.model.allocations
    st = f.streams[PODS]
    kube.error_watches("pods", 500, "InternalError", 'Internal error occurred: unable to transform key "/registry/pods/x"')
    kube.drop_watches("pods")
    kube.delete_pod("default", "holder")       # the feeder cannot hear of it while every watch errors
    kube.wait_for(lambda: st.errors >= 3)
    assert st.failures >= 3                     # one streak: the back-off grows
    assert f.ready()[0]                         # failing, but not for long yet
    clock.t += 31
    errors = st.errors
    kube.wait_for(lambda: st.errors >= errors + 3)   # more watches opened and failed since
    ok, why = f.ready()
    assert not ok and "pods watch failing" in why and "unable to transform key" in why, why
    assert uid in f.model.allocations           # the frozen model, which the extender now refuses to use
    kube.clear_faults()
    kube.wait_for(lambda: uid not in f.model.allocations)   # the resumed watch delivers the deletion
    kube.wait_for(lambda: f.ready()[0])   # (the event is counted just after it is applied)
    assert st.failures == 0 and st.lists == 1


def test_watches_that_end_at_once_without_an_event_back_off_and_read_failing(kube, feeders, caplog):
    """A misbehaving API server (or a proxy before it) that accepts every watch and ends it cleanly
    at once, with no event: each clean end re-opened the watch straight away, so the feeder spun
    (watch requests as fast as the server answered) and, each clean end counting as proof of a
    working stream, /readyz stayed 200 on a frozen model. As client-go's reflector does ("very short
    watch"), a watch that lasted under a second without an event is a failure: backed off, counted,
    and said once per failure streak."""
    clock = FakeClock()
    kube.create_node(inv_node("n1", [80]))
    f = started(kube, feeders, clock=clock, stale_after_s=30.0, backoff_base_s=0.1, backoff_max_s=0.4)
    st = f.streams[NODES]
    with caplog.at_level(logging.DEBUG, logger="stowage.kube"):
        kube.end_watches("nodes")
        kube.drop_watches("nodes")
        kube.wait_for(lambda: st.failures >= 4)    # the back-off has grown to its cap (0.2-0.4 s)
        before = kube.watch_count("nodes")
        time.sleep(1.2)
        spaced = kube.watch_count("nodes") - before
        assert 1 <= spaced <= 7, spaced            # unbounded (hundreds) before
        assert f.ready()[0]                        # failing, but not for long yet
        clock.t += 31
        ok, why = f.ready()
        assert not ok and "nodes watch failing" in why and "without an event" in why, why
        said = [r for r in caplog.records if r.levelno >= logging.WARNING and r.getMessage().startswith("nodes watch ended at once")]
        assert len(said) == 1, [r.getMessage() for r in said]   # once per streak, not per watch
        assert st.failures >= 5 and st.errors >= 5
        kube.clear_faults()
        kube.create_node(inv_node("n2", [24]))     # the next watch works: its event ends the streak
        kube.wait_for(lambda: "n2" in f.model.index)
        kube.wait_for(lambda: f.ready()[0])
    assert st.failures == 0 and st.failing_since is None
    assert any("nodes stream recovered" in r.getMessage() for r in caplog.records)


def test_a_watch_that_ends_after_its_timeout_without_events_stays_healthy(kube, feeders):
    """A quiet cluster's watch ends at its timeout with no event: a clean end, not a short watch."""
    kube.create_node(inv_node("n1", [80]))
    f = started(kube, feeders, watch_timeout_s=1)   # (randomised up to 2x: int(1 * [1, 2)) = 1 s)
    st = f.streams[NODES]
    watches = kube.watch_count("nodes")
    kube.wait_for(lambda: kube.watch_count("nodes") >= watches + 2)   # two watches ran out their timeout
    assert st.errors == 0 and st.failures == 0 and st.events == 0
    assert f.ready()[0]


def test_idle_watch_reads_ready_once_open_for_a_while_after_an_outage(kube, feeders):
    """A healthy watch on a quiet cluster sends nothing for minutes: after an outage, the reopened
    stream proves itself by staying open without error (``open_grace_s``), with no event needed."""
    clock = FakeClock()
    kube.create_node(inv_node("n1", [80]))
    f = started(kube, feeders, clock=clock, stale_after_s=30.0)
    st = f.streams[NODES]
    kube.fail_next(10**6, status=500, path="^/api/v1/nodes$")
    kube.drop_watches("nodes")
    kube.wait_for(lambda: st.failures >= 2)
    clock.t += 31
    assert not f.ready()[0]
    watches, events = kube.watch_count("nodes"), st.events
    kube.clear_faults()
    kube.wait_for(lambda: kube.watch_count("nodes") > watches and st.open_since is not None)
    ok, why = f.ready()
    assert not ok and "nodes watch failing" in why   # open, but not yet for long: no proof yet
    clock.t += f.open_grace_s
    assert f.ready()[0]
    assert st.failures == 0 and st.failing_since is None and st.last_error == ""
    assert st.events == events                  # no event was needed
    clock.t += 120                              # idle for two minutes (within the watch timeout): still ready
    assert f.ready()[0]


def test_pending_pods_are_kept_slim_and_only_for_stowages_schedulers(kube, feeders):
    """The feed keeps each pending pod until it is bound, for bind (a pod not seen at filter) and
    the requeue: it once kept the whole parsed object of every scheduler's pending pods, and a pod
    author can keep pods pending forever with 256 KiB of annotations each (~5 MiB apiece parsed, as
    many small keys). Now only pods of Stowage's schedulers are kept, and of each only what bind
    reads: identity, requests, Stowage's annotations."""
    from extender.kube_objects import pod_for_bind
    from extender.kube_binder import KubeBinder
    from extender.service import ExtenderService
    from extender.wire import BindingArgs
    from packing.pod_policy import GPU_MODEL
    from stowage.allocation import RecordTrust, decode_allocation
    kube.create_node(inv_node("a100", [80], model="NVIDIA A100-SXM4-80GB"))
    kube.create_node(inv_node("h100", [80], model="NVIDIA H100-SXM5-80GB"))
    junk = {f"x.example.com/k{i}": "" for i in range(2000)}
    ours = make_pod("ours", gpus=1, annotations={**junk, GPU_MODEL: "H100"})
    ours["spec"]["schedulerName"] = "stowage-scheduler"
    ours["spec"]["containers"][0]["env"] = [{"name": f"E{i}", "value": "v" * 100} for i in range(100)]
    ours["spec"]["containers"][0]["resources"]["limits"]["example.com/widget"] = "3"
    ours["spec"]["initContainers"] = [{"name": "side", "image": "busybox", "restartPolicy": "Always",
                                       "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}}]
    ours["spec"]["overhead"] = {"cpu": "100m"}
    theirs = make_pod("theirs", gpus=1, annotations=junk)
    theirs["spec"]["schedulerName"] = "volcano"
    ours, theirs = kube.create_pod(ours), kube.create_pod(theirs)
    trust = RecordTrust(scheduler_names=frozenset({"stowage-scheduler"}))
    f = started(kube, feeders, trust=trust)
    kept = f._pending.get("default/ours")
    assert kept == pod_for_bind(ours)
    assert kept["metadata"]["annotations"] == {GPU_MODEL: "H100"}
    assert [sorted(c) for c in kept["spec"]["containers"]] == [["name", "resources"]]
    assert kept["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert kept["spec"]["initContainers"][0]["restartPolicy"] == "Always" and "status" not in kept
    assert "default/theirs" not in f._pending and f.pending_uid("default/theirs") is None
    assert f.pending_uid("default/ours") == ours["metadata"]["uid"]
    assert f.get_pod("default", "theirs")["metadata"]["annotations"] == junk   # read from the API server
    # What bind makes of the kept copy is what it makes of the pod itself.
    svc = ExtenderService(f.model, binder=KubeBinder(kube.api_client(), trust=trust), pod_source=f)
    assert svc.pod_info(kept) == svc.pod_info(ours)
    gets = len([r for r in kube.requests if r[0] == "GET" and r[1].startswith("/api/v1/namespaces/")])
    uid = ours["metadata"]["uid"]
    assert svc.bind(BindingArgs("ours", "default", uid, "a100")) != ""   # its gpu-model policy: not an A100
    assert svc.bind(BindingArgs("ours", "default", uid, "h100")) == ""
    assert len([r for r in kube.requests if r[0] == "GET" and r[1].startswith("/api/v1/namespaces/")]) == gets
    stored = kube.get_pod("default", "ours")
    assert stored["spec"]["nodeName"] == "h100"
    assert decode_allocation(stored["metadata"]["annotations"][ALLOCATION_ANNOTATION]).node == "h100"
    alloc = f.model.allocations[uid]
    assert (alloc.cpu_milli, alloc.host_mem_mib) == (350, 64.0)   # sidecar and overhead counted
    kube.wait_for(lambda: "default/ours" not in f._pending)       # bound: no longer kept


def _odd_pods() -> list[dict]:
    """Pods whose parse fails or depends on details: what bind makes of each must not change."""
    from packing.pod_policy import GPU_MODEL, NODE_POLICY
    base = lambda **kw: make_pod("p", uid="u1", **kw)  # noqa: E731
    pods = [base(gpus=2, annotations={GPU_MODEL: "A100", "other.io/x": "y"}),
            base(gpu_memory=8, gpu_core=30, annotations={NODE_POLICY: "spread", "stowage.io/allocation": "{}"}),
            base(gpus=1, annotations={NODE_POLICY: "spread", "stowage.io/nope": "1", "stowage.io/later": "2"}),
            base(gpus=1, annotations={"x.io/a": "1", NODE_POLICY: "sideways"}),
            base(gpus=1, annotations={GPU_MODEL: ",".join(["m"] * 65)}),
            base(gpu_memory=8, gpu_core=300),
            base(gpus=1)]
    limits_only = base(gpu_memory=8)
    limits_only["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu-memory": "8", "cpu": "2"},
                                                         "requests": {"cpu": "1", "example.com/x": "1"}}
    bad_qty = base(gpus=1)
    bad_qty["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    init = base(gpus=1)
    init["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]
    init["spec"]["overhead"] = {"nvidia.com/gpu": "1", "memory": "1Gi", "example.com/y": "1"}
    odd_ann = base(gpus=1)
    odd_ann["metadata"]["annotations"] = ["not", "a", "map"]
    odd_spec = base(gpus=1)
    odd_spec["spec"]["containers"] = {"not": "a list"}
    odd_res = base(gpus=1)
    odd_res["spec"]["containers"].append("not a container")
    odd_res["spec"]["containers"][0]["resources"]["limits"] = [["nvidia.com/gpu", "1"]]
    no_spec = base()
    no_spec["spec"] = "nothing"
    return pods + [limits_only, bad_qty, init, odd_ann, odd_spec, odd_res, no_spec] + _crafted_pods() + _many_containers()


def _many_containers() -> list[dict]:
    """Pods at, just past and far past the containers Stowage schedules (MAX_CONTAINERS_PER_POD,
    init containers included), with GPU requests, sidecars, and bad quantities past the limit,
    up to the most a real API server took (25,774: etcd's 1.5 MiB request limit ends it)."""
    from stowage.resources import MAX_CONTAINERS_PER_POD as N

    def many(n: int, prefix: str = "c", **extra) -> list[dict]:
        return [{"name": f"{prefix}{i}", "resources": {"requests": {"cpu": "10m", "memory": "1Mi"}}, **extra}
                for i in range(n)]

    def pod(app: list, init: list | None = None) -> dict:
        p = make_pod("p", uid="u1", gpus=1)
        p["spec"]["containers"] += app
        if init is not None:
            p["spec"]["initContainers"] = init
        return p

    bad = {"name": "late", "resources": {"limits": {"nvidia.com/gpu": "-1", "cpu": "lots"}}}
    return [pod(many(N - 1)),                                          # N in all: scheduled
            pod(many(N // 2), many(N // 2 - 1, "s", restartPolicy="Always")),
            pod(many(N - 3), many(2, "i")),
            pod(many(N)),                                              # N + 1: refused, by count
            pod([], many(N, "i")),
            pod(many(N - 1), many(1, "s", restartPolicy="Always")),
            pod(many(N) + [bad]),                                      # the bad one is past the copy
            pod(many(2), many(N, "i") + [bad]),
            pod(many(N - 1) + ["not a container"] * 50),               # not objects: not counted
            pod(many(5_000), many(5_000, "i")),
            pod(many(25_773))]


CRAFTED = 40 * 1024   # characters: each of a crafted pod's Stowage annotations (256 KiB in all at most)


def _crafted_pods() -> list[dict]:
    """Pods whose Stowage annotations are written to be big: each policy key and an unknown
    ``stowage.io/`` key with ~40 KiB values (all of them on one pod, and each alone, so that
    each key's own error is compared), a key 5,000 characters long (an API server allows 317),
    values that are not text (only the port can send them), annotations that are a long list,
    and the longest valid model lists, padded with separators up to the limit."""
    from packing.pod_policy import (GPU_MODEL, GPU_MODEL_EXCLUDE, MAX_MODEL_LIST_CHARS, MAX_MODEL_NAME,
                                    MAX_MODELS_PER_LIST, POLICY_KEYS)
    base = lambda **kw: make_pod("p", uid="u1", gpus=1, **kw)  # noqa: E731
    big = {k: k[-1] * CRAFTED for k in sorted(POLICY_KEYS)}
    unknown = {"stowage.io/zzz": "z" * CRAFTED}
    pods = [base(annotations={**big, **unknown}), base(annotations={**unknown, **big})]
    pods += [base(annotations={k: v}) for k, v in big.items()]
    pods.append(base(annotations={GPU_MODEL: "A100", "stowage.io/" + "k" * 5000: "v" * CRAFTED}))
    pods.append(base(annotations={GPU_MODEL: "A100", "stowage.io/" + "k" * 306: "v"}))   # 317: kept whole
    pods.append(base(annotations={GPU_MODEL: ["m" * 100] * 2000}))
    pods.append(base(annotations={GPU_MODEL: {f"k{i}": "v" * 100 for i in range(2000)}}))
    pods.append(base(annotations={GPU_MODEL: 10 ** 4000}))
    pods.append(base(annotations={GPU_MODEL: None}))
    listed = base()
    listed["metadata"]["annotations"] = ["x" * 100] * 1000
    pods.append(listed)
    longest = ", ".join(f"{i:03d}" + "m" * (MAX_MODEL_NAME - 3) for i in range(MAX_MODELS_PER_LIST))
    padded = (longest + " ," * MAX_MODEL_LIST_CHARS)[:MAX_MODEL_LIST_CHARS]
    for value in (longest, padded, padded + ","):
        pods.append(base(annotations={GPU_MODEL: value, GPU_MODEL_EXCLUDE: value[::-1]}))
    return pods


@pytest.mark.parametrize("i", range(len(_crafted_pods())))
def test_the_kept_copy_is_bounded_whatever_the_annotations_hold(i):
    """The feed keeps a pending pod's copy until it is bound, and a pod refused at filter stays
    pending for ever: the copy once kept Stowage's annotation values as they were, ~256 KiB for
    a pod written to be big (~1.4 KiB for an ordinary one), so a user who kept thousands of such
    pods pending grew the extender past its memory limit. Now each value is kept only as far as
    ``parse_policy`` reads it (one character past its limit, ``MAX_VALUE_CHARS``; the unknown key's value not
    at all), and bind still makes of the copy what it makes of the pod (the tests above). The
    bound: both longest model lists, four short settings and a key, with room for the rest."""
    import json
    from extender.kube_objects import pod_for_bind, pod_for_learn
    from packing.pod_policy import MAX_KEY_CHARS, MAX_MODEL_LIST_CHARS, MAX_SETTING_CHARS, MAX_VALUE_CHARS
    pod = _crafted_pods()[i]
    bound = 2 * MAX_MODEL_LIST_CHARS + 4 * MAX_SETTING_CHARS + MAX_KEY_CHARS + 1024
    for copy in (pod_for_bind(pod), pod_for_learn(pod)):
        assert len(json.dumps(copy, default=str)) < bound
        ann = copy["metadata"]["annotations"]
        for key, value in (ann.items() if isinstance(ann, dict) else [("", ann)]):
            assert len(key) <= MAX_KEY_CHARS + 1
            limit = MAX_VALUE_CHARS.get(key, 0)
            assert len(json.dumps(value, default=str)) <= limit + 3   # text: one past the limit, quoted
    # The copy of an ordinary pod is not bigger than it was.
    plain = make_pod("p", uid="u1", gpus=1, annotations={"stowage.io/gpu-model": "A100,H100"})
    assert len(json.dumps(pod_for_bind(plain))) < 400


def test_a_placed_pod_counts_whatever_its_containers(kube, feeders):
    """The container limit is on what Stowage schedules: a pod bound already (by another
    scheduler, or by an extender before the limit) holds its CPU, memory and recorded cards
    on its node whatever its number of containers."""
    kube.create_node(inv_node("n1", [80, 80]))
    big = make_pod("big", node="n1", phase="Running")
    big["spec"]["containers"] += [{"name": f"c{k}", "resources": {"requests": {"cpu": "10m"}}} for k in range(300)]
    recorded = make_pod("recorded", gpus=1, node="n1", phase="Running", annotations={
        ALLOCATION_ANNOTATION: encode_allocation(AllocationRecord(node="n1", whole=True, cards=(
            CardShare(index=1, uuid="GPU-n1-1", memory_mib=80 * 1024, core_milli=1000),)))})
    recorded["spec"]["containers"] += [{"name": f"c{k}"} for k in range(300)]
    big, recorded = kube.create_pod(big), kube.create_pod(recorded)
    f = started(kube, feeders)
    assert f.model.allocations[big["metadata"]["uid"]].cpu_milli == 3000
    assert f.model.allocations[recorded["metadata"]["uid"]].cards == (1,)
    assert not f.status()["pod_errors"]


@pytest.mark.parametrize("i", range(len(_many_containers())))
def test_the_kept_copy_is_bounded_whatever_the_containers(i):
    """A pod's copy kept every container's name and requests: a pod of ~18,000 containers (within
    etcd's 1.5 MiB) kept ~11.5 MiB until bound, for ever if refused, and 100 of them put the
    extender past its 1 GiB. Now a copy keeps at most one container past the limit (a pod with
    more is refused by their count alone, so the copy is too), and bind and learning still make
    of the copy what they make of the pod (the tests below)."""
    import json
    from extender.kube_objects import pod_for_bind, pod_for_learn
    from stowage.resources import MAX_CONTAINERS_PER_POD as N
    pod = _many_containers()[i]
    within = sum(isinstance(c, dict) for k in ("containers", "initContainers")
                 for c in pod["spec"].get(k, [])) <= N
    for copy in (pod_for_bind(pod), pod_for_learn(pod)):
        kept = [c for k in ("containers", "initContainers") for c in copy["spec"].get(k, [])]
        assert len(kept) <= N + 1
        assert len(json.dumps(copy)) < 100 * (N + 1)
        if within:   # kept whole
            assert len(kept) == sum(isinstance(c, dict) for k in ("containers", "initContainers")
                                    for c in pod["spec"].get(k, []))


@pytest.mark.parametrize("i", range(len(_odd_pods())))
def test_bind_makes_of_the_kept_copy_what_it_makes_of_the_pod(i):
    from extender.kube_objects import pod_for_bind
    from extender.service import ExtenderService
    from packing.model import ClusterModel
    pod = _odd_pods()[i]
    kept = pod_for_bind(pod)
    # two services: pod_info caches by uid and resourceVersion
    assert ExtenderService(ClusterModel()).pod_info(kept) == ExtenderService(ClusterModel()).pod_info(pod)


@pytest.mark.parametrize("i", range(len(_odd_pods())))
def test_learning_makes_of_the_learn_copy_what_it_makes_of_the_pod(i):
    """A paged list keeps only a learn copy of each pod until its last page, then shows the
    copies to the placers in creation order: the copy must sort where the pod sorts and teach
    what the pod teaches, with and without a creation time, whatever the memory unit and the
    cluster's default policy."""
    from extender.kube import creation_order
    from extender.kube_objects import pod_for_learn
    from extender.service import ExtenderService, pod_shape
    from packing.model import ClusterModel
    from packing.pod_policy import PodPolicy
    for stamp in ("2024-05-01T10:00:00Z", None):
        pod = _odd_pods()[i]
        if stamp:
            pod["metadata"]["creationTimestamp"] = stamp
        slim = pod_for_learn(pod)
        assert creation_order(slim) == creation_order(pod)
        for unit in (1, 1024):
            for default in (None, PodPolicy(models_include=("A100",))):
                assert pod_shape(slim, unit, default) == pod_shape(pod, unit, default)
        whole, copied = ExtenderService(ClusterModel()), ExtenderService(ClusterModel())
        whole.learn_pod(pod)
        copied.learn_pod(slim)
        assert copied.learned_summary() == whole.learned_summary()
        whole.forget_learned("u1")                     # the shape each remembered for the uid
        copied.forget_learned("u1")
        assert list(copied.departed_snapshot().items()) == list(whole.departed_snapshot().items())


def _retry_delays(caplog: pytest.LogCaptureFixture, kind: str) -> list[float]:
    """The delays the feeder said it would wait after each failed request of ``kind``."""
    import re
    return [float(m.group(1)) for r in caplog.records
            if r.getMessage().startswith(f"{kind} ") and (m := re.search(r"retrying in ([0-9.]+)s", r.getMessage()))]


@pytest.mark.parametrize("retry_after, waits", [
    ("2", 2.0),          # the API server's priority and fairness shed the request: wait as it asks
    ("100000", 3.0),     # a peer asking for a day: held to the back-off's ceiling (backoff_max_s)
    ("soon", None),      # not a number of seconds: the usual back-off
    ("\u00b2", None),   # a digit to str.isdigit() ("²"), not to int(): it killed the feed's thread
])
def test_a_429_is_retried_no_sooner_than_its_retry_after_says(kube, feeders, caplog, retry_after, waits):
    """kube-apiserver sheds load with 429 and ``Retry-After`` (API priority and fairness), and
    client-go waits that long before it asks again; a feeder that came back after its own few
    milliseconds only added to the load it was asked to take away."""
    kube.create_node(inv_node("n1", [80]))
    kube.fail_next(1, status=429, path="^/api/v1/nodes$", method="GET", reason="TooManyRequests",
                   headers={"Retry-After": retry_after})
    f = new_feeder(kube, backoff_max_s=3.0)
    feeders.append(f)
    with caplog.at_level(logging.WARNING, logger="stowage.kube"):
        f.start()
        kube.wait_for(lambda: _retry_delays(caplog, "nodes"))
    [delay] = _retry_delays(caplog, "nodes")
    if waits is None:
        assert delay < 0.01   # backoff_base_s (0.01), jittered
    else:
        assert delay == waits
    assert "429" in caplog.text
    kube.wait_for(lambda: f.ready()[0])


def test_a_watch_kept_open_past_its_timeout_by_bytes_that_are_no_event_is_cut_and_reopened(kube, feeders):
    """A peer that keeps a watch alive with a byte now and then, never a whole event, passes every
    read timeout: before, the watch thread waited on it for as long as it went on, the model
    froze, and /readyz said so after the silence limit, but nothing re-opened the watch. A
    watch is asked to end after ``timeoutSeconds``; one still open ``watch_overrun_s`` later is
    cut, counted as a failure, and re-opened from the last resourceVersion."""
    kube.create_node(inv_node("n1", [80]))
    f = started(kube, feeders, watch_timeout_s=1)
    f.watch_overrun_s = 0.5          # set after construction: the test means the behaviour, not the parameter
    kube.trickle_watches("nodes", every_s=0.05)
    kube.drop_watches("nodes")       # the open watch ends; the next ones trickle
    st = f.streams[NODES]
    kube.wait_for(lambda: st.errors >= 2, timeout=30)
    assert "timeoutSeconds" in st.last_error
    kube.clear_faults()
    kube.create_node(inv_node("n2", [24]))
    kube.wait_for(lambda: "n2" in f.model.index, timeout=30)
    kube.wait_for(lambda: f.ready()[0])


def test_a_fault_in_the_feeders_own_error_handling_does_not_end_its_stream(kube, feeders, caplog, monkeypatch):
    """The stream's thread ran every failure through ``_failed``; an exception raised there (as
    the ``Retry-After: ²`` one did) escaped the loop and ended the thread: that kind's model froze
    for good, with /readyz false and nothing to restart it. Whatever goes wrong in the loop's own
    handling now is logged with its traceback, and the stream relists after the back-off's
    ceiling."""
    import extender.kube as kube_mod
    kube.create_node(inv_node("n1", [80]))
    real = kube_mod.api_message
    broken = {"left": 1}

    def api_message_with_a_bug(exc: BaseException) -> str:
        if broken["left"]:
            broken["left"] -= 1
            raise ValueError("a bug in the error handler")
        return real(exc)

    monkeypatch.setattr(kube_mod, "api_message", api_message_with_a_bug)
    kube.fail_next(1, status=500, path="^/api/v1/nodes$", method="GET")
    f = new_feeder(kube, backoff_max_s=0.2)
    feeders.append(f)
    with caplog.at_level(logging.ERROR, logger="stowage.kube"):
        f.start()
        kube.wait_for(lambda: "a bug in the error handler" in caplog.text)
        kube.wait_for(lambda: f.ready()[0])
    assert "Traceback" in caplog.text or any(r.exc_info for r in caplog.records)
    kube.create_node(inv_node("n2", [24]))
    kube.wait_for(lambda: "n2" in f.model.index)


def test_node_closed_is_asked_of_every_node_and_closes_those_it_names(kube, feeders, caplog):
    """The public node hook (``KubeFeeder.node_closed``; ``stowage inspect``/``plan`` wrapped the
    feeder's private ``_apply_node`` instead): asked of every node applied, listed or watched,
    cordoned ones too; a node it names is applied as cordoned, and one it fails on (it raises) is
    applied as it is, logged, the feed going on."""
    asked: list[str] = []

    def closed(node):
        name = node["metadata"]["name"]
        asked.append(name)
        if name == "odd":
            raise ValueError("a reader's bug")
        return name.startswith("closed")

    kube.create_node(inv_node("open", [80]), emit=False)
    kube.create_node(inv_node("closed-1", [80]), emit=False)
    kube.create_node(inv_node("cordoned", [80], unschedulable=True), emit=False)
    f = new_feeder(kube)
    f.node_closed = closed
    feeders.append(f)
    f.start()
    kube.wait_for(lambda: f.ready()[0])
    assert sorted(asked) == ["closed-1", "cordoned", "open"]
    with caplog.at_level(logging.ERROR, logger="stowage.kube"):
        kube.create_node(inv_node("odd", [80]))
        kube.create_node(inv_node("closed-2", [80]))
        kube.wait_for(lambda: "closed-2" in f.model.index)
    assert {n: row(f.model, n)["node_ok"] for n in ("open", "closed-1", "cordoned", "odd", "closed-2")} == {
        "open": True, "closed-1": False, "cordoned": False, "odd": True, "closed-2": False}
    assert "node odd: node_closed failed" in caplog.text


def test_a_node_with_only_a_deletion_timestamp_takes_pods_as_kube_scheduler_has_it(kube, feeders):
    """kube-scheduler v1.28.7 still places pods on a node being deleted (a finalizer holds it; no
    taint): tests/integration/test_real_node_deleting.py. The extender's feed offers it too."""
    node = inv_node("going", [80])
    node["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    node["metadata"]["finalizers"] = ["example.com/hold"]
    kube.create_node(node)
    f = started(kube, feeders)
    assert row(f.model, "going")["node_ok"]
