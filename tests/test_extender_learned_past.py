"""What the placers learned from deleted pods survives a restart (extender/learned_past.py,
extender/learned_store.py): the running extender counts each deleted pod's shape, keeps the
counts in a ConfigMap, and a restarted one learns them before its first list, so it holds the
same learned workload as the one that saw those pods, and answers as it does."""
from __future__ import annotations

import json
import logging
import random

import numpy as np
import pytest

from extender.kube import PODS, creation_order
from extender.learned_past import (FIELDS, FORMAT, MAX_DOCUMENT_BYTES, MAX_SHAPES, DepartedPods, PastError)
from extender.learned_store import DATA_KEY, PastKeeper, PastStore, parse_location
from extender.service import ExtenderService
from extender.wire import ExtenderArgs
from extender_kube_helpers import feeders, kube  # noqa: F401 (fixtures)
from packing.strategies.stowage_frag import StowageFragPlacer, next_rebuild
from stowage.resources import GpuRequest
from test_extender_learned_rebuild import NODES, cluster, pod, schedule

WHOLE = GpuRequest(gpus=1, cpu_milli=8000, host_mem_mib=32768)
SHARE = GpuRequest(mem_mib=10240, core_milli=300, cpu_milli=4000, host_mem_mib=16384.5)
CPU = GpuRequest(cpu_milli=2000, host_mem_mib=4096)


# ------------------------------------------------------------------ the document
def test_the_document_reads_back_what_was_written():
    past = DepartedPods()
    past.add(WHOLE, ("V100M32", "A100"), 3)
    past.add(SHARE)
    past.add(CPU, (), 5)
    past.add(WHOLE, ("A100", "V100M32", "A100"))   # the same list written another way: one shape
    back = DepartedPods.from_json(past.to_json())
    assert list(back.items()) == list(past.items()) == [
        (WHOLE, ("A100", "V100M32"), 4), (SHARE, (), 1), (CPU, (), 5)]
    assert back.pods == 10
    doc = json.loads(past.to_json())
    assert doc["format"] == FORMAT and doc["fields"] == list(FIELDS)


@pytest.mark.parametrize("edit, why", [
    (lambda d: d.update(format="other/v9"), "not a stowage.io/departed-pods/v1 document"),
    (lambda d: d.update(fields=["gpus"]), "fields must be"),
    (lambda d: d.update(shapes={}), "shapes must be a list"),
    (lambda d: d["shapes"][0].__setitem__(7, 0), "pods must be an integer from 1"),
    (lambda d: d["shapes"][0].__setitem__(7, True), "pods must be an integer"),
    (lambda d: d["shapes"][0].__setitem__(0, 1.5), "gpus must be an integer"),
    (lambda d: d["shapes"][0].__setitem__(0, 65), "gpus must be an integer from 0 to 64"),
    (lambda d: d["shapes"][0].__setitem__(2, 1001), "coreMilli must be an integer from 0 to 1000"),
    (lambda d: d["shapes"][0].__setitem__(1, 100), "a whole-GPU shape has no gpuMemoryMiB"),
    (lambda d: d["shapes"][1].__setitem__(3, 100), "minCardMemoryMiB belongs to whole-GPU shapes"),
    (lambda d: d["shapes"][0].__setitem__(5, -1), "memoryMiB must be a number"),
    (lambda d: d["shapes"][0].__setitem__(6, ["x"] * 65), "models must be a list of at most 64"),
    (lambda d: d["shapes"][0].__setitem__(6, ["x" * 129]), "models must be a list"),
    (lambda d: d["shapes"][0].__setitem__(6, [""]), "models must be a list"),
    (lambda d: d["shapes"][0].pop(), "must be a list of 8 values"),
    (lambda d: d["shapes"].append(list(d["shapes"][0])), "shape 2 is written twice"),
    (lambda d: d.update(shapes=[[0, 0, 0, 0, i, 0, [], 1] for i in range(MAX_SHAPES + 1)]), "shapes, at most"),
])
def test_a_document_that_is_not_ours_is_refused_as_a_whole(edit, why):
    past = DepartedPods()
    past.add(WHOLE, ("A100",), 2)
    past.add(SHARE)
    doc = json.loads(past.to_json())
    edit(doc)
    with pytest.raises(PastError, match=why):
        DepartedPods.from_json(json.dumps(doc))


@pytest.mark.parametrize("text", ["", "{", "[]", "null", "[" * 100_000, "x" * (4 * MAX_DOCUMENT_BYTES)])
def test_garbage_is_refused(text):
    with pytest.raises(PastError):
        DepartedPods.from_json(text)


def test_what_is_written_can_always_be_read_back_whatever_the_pods_asked():
    """Hostile pods (absurd CPU or memory, huge model lists, thousands of distinct shapes) must
    never make the stored document unreadable: a shape outside the bounds is left out, the
    rarest shapes go when there are too many, and the document stays under its size bound."""
    rng = random.Random(7)
    past = DepartedPods()
    kept = 0
    for i in range(MAX_SHAPES + 600):
        req = GpuRequest(gpus=rng.choice([0, 1, 8]), cpu_milli=rng.choice([i, 10 ** 20, 2 ** 63]),
                         host_mem_mib=rng.choice([1.5 * i, float("inf"), 1e300]))
        models = tuple(f"{'m' * 120}{i}-{k}" for k in range(rng.choice([0, 64])))
        kept += past.add(req, models, rng.randint(1, 3))
    assert 0 < kept < MAX_SHAPES + 600, "some shapes must have been out of bounds"
    assert len(past) <= MAX_SHAPES
    text = past.to_json()
    assert len(text.encode()) <= MAX_DOCUMENT_BYTES
    back = DepartedPods.from_json(text)
    assert 0 < len(back) <= len(past)
    assert all(past.counts[k] == n for k, n in back.counts.items())


def test_past_the_bound_the_rarest_oldest_shape_goes():
    past = DepartedPods(max_shapes=3)
    past.add(WHOLE, (), 5)
    past.add(SHARE, (), 1)
    past.add(CPU, (), 1)
    past.add(GpuRequest(gpus=2), (), 1)     # SHARE and CPU have one pod each: SHARE is older
    assert [r for r, _, _ in past.items()] == [WHOLE, CPU, GpuRequest(gpus=2)]


def test_merged_takes_the_larger_count_per_shape():
    a, b = DepartedPods(), DepartedPods()
    a.add(WHOLE, (), 5)
    a.add(SHARE, (), 2)
    b.add(SHARE, (), 3)
    b.add(CPU, (), 1)
    m = a.merged(b)
    assert list(m.items()) == [(WHOLE, (), 5), (SHARE, (), 3), (CPU, (), 1)]
    assert list(a.items()) == [(WHOLE, (), 5), (SHARE, (), 2)]   # the operands are unchanged


def test_two_replicas_writing_in_turn_never_count_a_pod_twice():
    """Replica B starts after A wrote, and both then see the same deletions: whichever writes,
    in whatever order, the stored counts are at most the true ones, and once both wrote after
    the last deletion, exactly the true ones but for the pods deleted between A's write and
    B's start (which B never saw and A wrote later)."""
    rng = random.Random(3)
    shapes = [WHOLE, SHARE, CPU, GpuRequest(gpus=4)]
    truth, a = DepartedPods(), DepartedPods()
    for _ in range(50):
        s = rng.choice(shapes)
        truth.add(s)
        a.add(s)
    stored = a.copy()                       # A wrote
    b = stored.copy()                       # B started: it learned what was stored
    for _ in range(40):
        s = rng.choice(shapes)
        truth.add(s)
        for r in (a, b):
            r.add(s)
        if rng.random() < 0.3:
            stored = stored.merged(rng.choice([a, b]))
            assert all(n <= truth.counts[k] for k, n in stored.counts.items())
    stored = stored.merged(b).merged(a)
    assert dict(stored.counts) == dict(truth.counts)


# ------------------------------------------------------------------ the placer's bulk learning
def test_next_rebuild_is_the_schedule_one_pod_at_a_time_followed():
    expected, nxt = [], 1
    for seen in range(1, 2000):
        if seen >= nxt:
            nxt = seen * 2 if seen < 256 else seen + 128    # the rule before bulk learning
        expected.append(nxt)
    assert [next_rebuild(seen) for seen in range(1, 2000)] == expected
    assert next_rebuild(0) == 1 and next_rebuild(300) == 384 and next_rebuild(384) == 512


def test_observing_n_pods_at_once_learns_what_n_single_observations_do():
    rng = random.Random(11)
    shapes = [(WHOLE, ()), (SHARE, ("A100",)), (CPU, ()), (GpuRequest(gpus=2, cpu_milli=16000), ("T4", "A100"))]
    runs = [(rng.choice(shapes), rng.randint(1, 90)) for _ in range(30)]
    one, bulk = StowageFragPlacer(), StowageFragPlacer()
    rebuilds_one, rebuilds_bulk = [], []
    for (req, models), n in runs:
        for _ in range(n):
            one.observe(req, models)
            rebuilds_one.append(one._next)
        bulk.observe(req, models, n)
        rebuilds_bulk.append(bulk._next)
    assert dict(one.workload.counts) == dict(bulk.workload.counts)
    assert (one.seen, one.whole_milli, one.gpu_cpu, one.gpu_mem, one.shares_seen, one.gpu_demand,
            one.model_demand) == (bulk.seen, bulk.whole_milli, bulk.gpu_cpu, bulk.gpu_mem, bulk.shares_seen,
                                  bulk.gpu_demand, bulk.model_demand)
    assert one.gpu_milli_on(81920.0) == pytest.approx(bulk.gpu_milli_on(81920.0), rel=1e-12)
    assert bulk._next == one._next == next_rebuild(one.seen)   # the same rebuild points from here on
    bulk.observe(CPU, (), 0)
    assert bulk.seen == one.seen                                # a count of 0 learns nothing


def same_table(t1, t2) -> bool:
    """Two learned tables hold the same values (every array and plain attribute)."""
    a, b = vars(t1), vars(t2)
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and np.array_equal(x, y)):
                return False
        elif x != y:
            return False
    return True


def count_table_builds(monkeypatch) -> list:
    """A list that grows by one at every learned-table build (packing.frag.FragTable)."""
    import packing.frag as frag

    builds: list = []

    class Counted(frag.FragTable):
        def __init__(self, *a, **kw):
            builds.append(1)
            super().__init__(*a, **kw)

    monkeypatch.setattr(frag, "FragTable", Counted)
    return builds


def big_past() -> list[tuple[GpuRequest, tuple[str, ...], int]]:
    """40 departed shapes of 130 pods (each crosses a rebuild point), then 3 new classes of 1
    pod after the last point crossed: the table must not hold them yet."""
    shapes = [(GpuRequest(mem_mib=1024 * (1 + s % 20), core_milli=10 * (1 + s), cpu_milli=1000 + 100 * s,
                          host_mem_mib=2048 + s), ("A100",) if s % 3 == 0 else (), 130) for s in range(40)]
    shapes += [(GpuRequest(gpus=1 + s, cpu_milli=500 + s), (), 1) for s in range(3)]
    return shapes


def test_a_restart_builds_the_learned_table_once_and_ends_as_one_shape_at_a_time(monkeypatch):
    """learn_departed used to build a full table at every rebuild point a shape crossed (4,096
    shapes of >= 128 pods: ~115 s before the extender answered /healthz); only the last one
    counts. Now one build per placer, and the same table, demand basis and answers as a
    replay one shape at a time."""
    import packing.frag as frag

    builds = count_table_builds(monkeypatch)
    one = ExtenderService(cluster(), filter_keeps="fitting")          # the reference: shape by shape
    for req, models, n in big_past():
        for p in one._distinct_placers():
            p.observe(req, models, n)
    one_builds, builds[:] = len(builds), []
    bulk = ExtenderService(cluster(), filter_keeps="fitting")
    assert bulk.learn_shapes(big_past()) == 40 * 130 + 3
    placers = [q for q in bulk._distinct_placers() if hasattr(q, "table")]    # the learning ones
    assert placers and one_builds >= 40 * len(placers) and len(builds) == len(placers)
    for p, q in zip([p for p in one._distinct_placers() if hasattr(p, "table")], placers):
        assert same_table(p.table, q.table)
        assert p._cap_basis == q._cap_basis
        # The table is the last point's, not the end's (the 3 last classes are not in it yet).
        assert not same_table(q.table, frag.FragTable(q.workload.typical(q.coverage)))
    assert learned(bulk) == learned(one)
    assert answers(bulk) == answers(one)


def test_learning_in_bulk_without_a_rebuild_point_builds_nothing_and_nests():
    p = StowageFragPlacer()
    p.observe(WHOLE, (), 1)                 # the first point (1 pod): built
    table = p.table
    with p.learning_in_bulk():
        with p.learning_in_bulk():
            p.observe(SHARE, (), 1)          # 2 pods: a point, deferred
        assert p.table is table              # the outer bulk is still open
        p.observe(CPU, (), 1)                # 3: no point
    assert p.table is not table              # built once, at the outer end
    ref = StowageFragPlacer()
    for req in (WHOLE, SHARE, CPU):
        ref.observe(req, (), 1)
    assert same_table(ref.table, p.table) and ref._cap_basis == p._cap_basis
    with p.learning_in_bulk():
        p.observe(CPU, (), 1)                # 4 pods: a point (1, 2, 4, ...)
        p.observe(CPU, (), 1)
    built = p.table
    with p.learning_in_bulk():
        p.observe(CPU, (), 1)                # 6, 7: no point
        p.observe(CPU, (), 1)
    assert p.table is built


# ------------------------------------------------------------------ the service
def learned(svc: ExtenderService) -> dict:
    """The pack placer's learned workload: class counts, host resources per GPU, the share sizes
    (per size, how many: a bulk-learned past holds them as weighted entries) and the demand per
    model list. Not its version, a cache counter that says nothing about what was learned."""
    p = svc.placers["pack"]
    shares: dict = {}
    for core, mem, w in zip(p._share_core, p._share_mem, p._share_w):
        shares[(core, mem)] = shares.get((core, mem), 0.0) + w
    return {"seen": p.seen, "next": p._next, "counts": dict(p.workload.counts), "whole": p.whole_milli,
            "cpu": p.gpu_cpu, "mem": p.gpu_mem, "shares": shares, "demand": p.gpu_demand,
            "models": p.model_demand, "churn": p.churn}


def run_and_delete(pods: list[dict], deleted: set[int]) -> ExtenderService:
    running = ExtenderService(cluster(), filter_keeps="fitting")   # prioritize answers Stowage's ranking
    for i, p in enumerate(pods):
        schedule(running, p)
    for i in sorted(deleted):
        uid = pods[i]["metadata"]["uid"]
        running.model.release(uid, departed=True)            # the watch shows it deleted: its cards free
        running.forget_learned(uid)
    return running


def restarted(running: ExtenderService, pods: list[dict], deleted: set[int], with_past: bool) -> ExtenderService:
    """A new service over the same model: the stored past first (through its document), then
    the pods that still exist, in creation order, as the feed's first list shows them."""
    svc = ExtenderService(running.model, filter_keeps="fitting")
    if with_past:
        svc.learn_departed(DepartedPods.from_json(running.departed_snapshot().to_json()))
    for p in sorted((p for i, p in enumerate(pods) if i not in deleted), key=creation_order):
        svc.learn_pod(p)
    return svc


def probes() -> list[dict]:
    return [pod(900 + i, limits) for i, limits in enumerate(
        [{"nvidia.com/gpu-memory": "5"}, {"nvidia.com/gpu-memory": "12"}, {"nvidia.com/gpu": "1"}, {"cpu": "1"},
         {"nvidia.com/gpu-memory": "40", "nvidia.com/gpu-core": "30"}])]


def answers(svc: ExtenderService) -> list:
    return [svc.prioritize(ExtenderArgs(pod=p, node_names=NODES, nodes=None, names=NODES)) for p in probes()]


def workload() -> list[dict]:
    rng = random.Random(5)
    shapes = [{"nvidia.com/gpu": "1", "cpu": "8"}, {"nvidia.com/gpu-memory": "10", "cpu": "2"},
              {"nvidia.com/gpu-memory": "3"}, {"nvidia.com/gpu-memory": "20", "nvidia.com/gpu-core": "50"},
              {"cpu": "2", "memory": "3Gi"}, {"nvidia.com/gpu": "2", "cpu": "30"}]
    return [pod(i, dict(rng.choice(shapes))) for i in range(64)]   # 64: a rebuild point


def test_a_restart_with_the_departed_pods_learns_what_the_running_one_had_and_answers_the_same():
    pods = workload()
    deleted = set(random.Random(9).sample(range(len(pods)), 40))
    running = run_and_delete(pods, deleted)
    assert running.departed.pods == 40
    back = restarted(running, pods, deleted, with_past=True)
    assert learned(back) == learned(running)
    assert back.learned_summary() == running.learned_summary()
    assert answers(back) == answers(running)
    blind = restarted(running, pods, deleted, with_past=False)     # as before the store existed
    assert learned(blind)["seen"] == 24 and learned(blind) != learned(running)
    assert blind.learned_summary()["workload"] != running.learned_summary()["workload"]
    assert answers(blind) != answers(running), "the workload must make the past matter, or this proves nothing"


def test_the_restarted_one_keeps_the_past_it_loaded_in_what_it_writes_next():
    pods = workload()
    running = run_and_delete(pods, set(range(10)))
    back = restarted(running, pods, set(range(10)), with_past=True)
    back.forget_learned(pods[10]["metadata"]["uid"])
    assert back.departed_snapshot().pods == 11
    back.forget_learned(pods[10]["metadata"]["uid"])   # a uid is counted once
    back.forget_learned("never-learned")
    assert back.departed_snapshot().pods == 11


# ------------------------------------------------------------------ the ConfigMap
def test_parse_location():
    assert parse_location("stowage-learned-past", "ns") == ("ns", "stowage-learned-past")
    assert parse_location("other/x.y", "ns") == ("other", "x.y")
    assert parse_location("off", "ns") is None and parse_location("", "ns") is None
    for bad in ("a/b/c", "UPPER", "ns/", "-x"):
        with pytest.raises(ValueError):
            parse_location(bad, "ns")


def store_of(kube) -> PastStore:  # noqa: F811
    import kubernetes
    return PastStore(kubernetes.client.CoreV1Api(kube.api_client()), "stowage-system", "past", sleep=lambda s: None)


def test_the_store_creates_merges_and_reads_back(kube):  # noqa: F811
    store = store_of(kube)
    assert store.load().pods == 0                             # first start: nothing stored
    a = DepartedPods()
    a.add(WHOLE, (), 2)
    assert store.save(a)
    cm = kube.get("configmaps", "stowage-system", "past")
    assert DepartedPods.from_json(cm["data"][DATA_KEY]).pods == 2
    b = DepartedPods()
    b.add(WHOLE, (), 1)
    b.add(SHARE, ("A100",), 4)
    assert store.save(b)                                      # the other replica's counts: merged
    assert list(store.load().items()) == [(WHOLE, (), 2), (SHARE, ("A100",), 4)]
    puts = [r for r in kube.requests if r[0] == "PUT"]
    assert len(puts) == 1
    assert store.save(b) and len([r for r in kube.requests if r[0] == "PUT"]) == 1   # nothing new: no write


def test_a_write_that_races_another_merges_again(kube):  # noqa: F811
    store = store_of(kube)
    first = DepartedPods()
    first.add(CPU, (), 1)
    store.save(first)
    other = DepartedPods()
    other.add(SHARE, (), 7)
    real_get = store._get

    def get_then_other_replica_writes():
        cm = real_get()
        if not getattr(get_then_other_replica_writes, "done", False):
            get_then_other_replica_writes.done = True
            kube.update("configmaps", "stowage-system", "past",
                        lambda o: o["data"].__setitem__(DATA_KEY, first.merged(other).to_json()))
        return cm
    store._get = get_then_other_replica_writes
    mine = DepartedPods()
    mine.add(WHOLE, (), 3)
    assert store.save(mine)
    assert list(store.load().items()) == [(CPU, (), 1), (SHARE, (), 7), (WHOLE, (), 3)]
    assert any(r[0] == "PUT" for r in kube.requests)


def test_an_unusable_document_is_logged_and_the_extender_starts_without_a_past(kube, caplog):  # noqa: F811
    kube.create("configmaps", {"metadata": {"name": "past", "namespace": "stowage-system"},
                               "data": {DATA_KEY: '{"format": "stowage.io/departed-pods/v1", "fields": []}'}})
    store = store_of(kube)
    with caplog.at_level(logging.ERROR, logger="stowage.extender.learned"):
        assert store.load().pods == 0
    assert "cannot be used: fields must be" in caplog.text
    mine = DepartedPods()
    mine.add(WHOLE)
    assert store.save(mine)                                   # the next write replaces it
    assert store.load().pods == 1


def test_a_store_the_extender_may_not_read_is_logged_with_what_to_grant(kube, caplog):  # noqa: F811
    kube.fail_next(5, status=403, path="configmaps")
    store = store_of(kube)
    with caplog.at_level(logging.ERROR, logger="stowage.extender.learned"):
        assert store.load().pods == 0
    assert "HTTP 403" in caplog.text and "rbac.yaml" in caplog.text
    assert len([r for r in kube.requests if "configmaps" in r[1]]) == 1      # not retried: RBAC will not change


def test_a_read_that_fails_is_retried(kube):  # noqa: F811
    past = DepartedPods()
    past.add(WHOLE, (), 4)
    store = store_of(kube)
    store.save(past)
    kube.fail_next(2, status=500, path="configmaps", method="GET")
    assert store.load().pods == 4


def test_the_keeper_writes_when_pods_departed_and_once_more_at_stop(kube, caplog):  # noqa: F811
    pods = workload()
    svc = run_and_delete(pods, set())
    keeper = PastKeeper(store_of(kube), svc.departed_snapshot, interval_s=3600)
    assert keeper.write_if_changed() and keeper.writes == 0     # nothing departed: nothing written
    svc.forget_learned(pods[0]["metadata"]["uid"])
    kube.fail_next(1, status=500, path="configmaps")
    with caplog.at_level(logging.WARNING, logger="stowage.extender.learned"):
        assert not keeper.write_if_changed()                     # logged, tried again next time
    assert "cannot write the ConfigMap stowage-system/past: HTTP 500" in caplog.text
    assert keeper.write_if_changed() and keeper.writes == 1
    assert keeper.write_if_changed() and keeper.writes == 1      # unchanged: not written again
    svc.forget_learned(pods[1]["metadata"]["uid"])
    keeper.start()
    keeper.stop()                                                # the last write at shutdown
    assert keeper.writes == 2 and store_of(kube).load().pods == 2


def test_metrics_say_what_is_learned_and_whether_the_past_is_written(kube):  # noqa: F811
    """/metrics: pods learned, departed pods kept, and the ConfigMap's writes by outcome with how
    long a change has waited unwritten (an alert's input: it grows only while writes fail)."""
    from extender_harness import Server

    pods = workload()
    svc = run_and_delete(pods, set(range(3)))
    keeper = PastKeeper(store_of(kube), svc.departed_snapshot, interval_s=3600)
    now = [100.0]
    keeper.clock = lambda: now[0]
    svc.past_keeper = keeper
    kube.fail_next(2, status=500, path="configmaps")
    assert not keeper.write_if_changed()
    now[0] += 90
    with Server(svc) as srv:
        text = srv.get("/metrics").text
        assert "stowage_extender_learned_pods 64.0" in text
        assert "stowage_extender_departed_pods_kept 3.0" in text
        assert 'stowage_extender_learned_past_writes_total{outcome="failed"} 1.0' in text
        assert 'stowage_extender_learned_past_writes_total{outcome="ok"} 0.0' in text
        assert "stowage_extender_learned_past_unwritten_seconds 90.0" in text
        assert not keeper.write_if_changed()      # still failing: the wait keeps its start
        now[0] += 30
        assert keeper.unwritten_s() == 120.0
        assert keeper.write_if_changed()
        text = srv.get("/metrics").text
        assert 'stowage_extender_learned_past_writes_total{outcome="ok"} 1.0' in text
        assert "stowage_extender_learned_past_unwritten_seconds 0.0" in text
    svc.past_keeper = None
    with Server(svc) as srv:                      # simulated mode: no ConfigMap, no writes metric
        text = srv.get("/metrics").text
        assert "stowage_extender_learned_pods 64.0" in text and "learned_past_writes" not in text


def test_pods_deleted_while_the_watch_was_gone_are_told_as_deleted_at_the_relist(feeders):  # noqa: F811
    """A watch that ends in 410 Gone is followed by a relist; the pods deleted meanwhile never
    had a DELETED event. The feed must still tell the service they are gone (pending ones and
    CPU-only ones too, which hold no cards), or what was learned from them would be lost from the
    past and their uids kept for ever."""
    from fakekube import FakeKube
    from extender_kube_helpers import inv_node, make_pod, new_feeder
    from stowage.allocation import RecordTrust

    with FakeKube(bookmark_interval=3600) as kube:
        kube.create_node(inv_node("n1", [80, 80]))
        mine = []
        for name, kw in (("pending", {"gpus": 1}), ("share", {"gpu_memory": 10}), ("stays", {"gpus": 1})):
            p = make_pod(name, **kw)
            p["spec"]["schedulerName"] = "stowage-scheduler"
            mine.append(kube.create_pod(p))
        svc = ExtenderService(cluster())
        f = new_feeder(kube, model=svc.model, trust=RecordTrust(scheduler_names=frozenset({"stowage-scheduler"})))
        f.on_pod_seen, f.on_pod_deleted = svc.learn_pod, svc.forget_learned
        feeders.append(f)
        f.start()
        kube.wait_for(lambda: f.ready()[0] and len(svc._learned) == 3)
        kube.delete_pod("default", "pending", emit=False)
        kube.delete_pod("default", "share", emit=False)
        kube.expire_watches()
        kube.wait_for(lambda: f.streams[PODS].lists == 2)
        assert list(svc._learned) == [mine[2]["metadata"]["uid"]]
        assert svc.departed_snapshot().pods == 2


def test_a_document_mutated_at_random_is_refused_or_reads_back_to_itself():
    """Anyone with write access to the ConfigMap can put anything there: 3,000 random mutations
    of a valid document (values swapped for other types, out-of-range numbers, huge strings,
    rows dropped or doubled, keys removed) either raise PastError or give a past that writes
    the same document again; never another exception."""
    rng = random.Random(13)
    past = DepartedPods()
    for i in range(40):
        past.add(GpuRequest(gpus=rng.choice([0, 1, 8]), cpu_milli=rng.randrange(0, 10 ** 6),
                            host_mem_mib=rng.choice([0.0, 512.5, 4096.0])),
                 tuple(rng.sample(["A100", "T4", "P100", "V100M32"], rng.randint(0, 2))), rng.randint(1, 99))
    base = json.loads(past.to_json())
    junk = [None, True, -1, 0, 1.5, 2 ** 70, float("nan"), "x", "", [], {}, ["A100"] * 70, "y" * 200,
            [0] * 8, {"a": 1}, 1e308]
    refused = accepted = 0
    for _ in range(3000):
        doc = json.loads(json.dumps(base))
        for _ in range(rng.randint(1, 3)):
            what = rng.random()
            rows = doc.get("shapes") if isinstance(doc, dict) else None
            if what < 0.5 and isinstance(rows, list) and rows and isinstance(rows[0], list):
                row = rng.choice(rows)
                if isinstance(row, list) and row:
                    row[rng.randrange(len(row))] = rng.choice(junk)
            elif what < 0.65 and isinstance(rows, list) and rows:
                rows.insert(rng.randrange(len(rows) + 1), rng.choice(rows))
            elif what < 0.75 and isinstance(rows, list) and rows:
                rows.pop(rng.randrange(len(rows)))
            elif what < 0.85 and isinstance(doc, dict):
                doc.pop(rng.choice(["format", "fields", "shapes"]), None)
            elif isinstance(doc, dict):
                doc[rng.choice(["format", "fields", "shapes"])] = rng.choice(junk)
        text = json.dumps(doc, allow_nan=True)
        try:
            got = DepartedPods.from_json(text)
        except PastError:
            refused += 1
            continue
        accepted += 1
        assert DepartedPods.from_json(got.to_json()).counts == got.counts
    assert refused > 1000 and accepted > 100, (refused, accepted)
