"""Stowage's churn mode: once GPU pods have left the cluster, fill nodes that already run a GPU pod
first (an empty node is one the cluster autoscaler can remove). Checked on real ClusterModels and
a real ExtenderService: the switch (after a release, never before), the version bump the row cache
relies on, the ranking before and after, row-locality in churn mode, cached answers equal to fresh
ones on a churning cluster, and the static replay (no pod ever leaves) unchanged."""
from __future__ import annotations

import random

import numpy as np
import pytest

from benchmarks.binpack.replay import replay
from benchmarks.latency import cluster as bench_cluster
from packing.fit import card_mask, fit
from packing.registry import get_placer
from packing.model import ClusterModel
from packing.strategies.stowage_frag import CHURN_COST, StowageFragPlacer
from packing.pod_policy import PACK, SPREAD, PodPolicy
from extender.service import ExtenderService
from extender.wire import encode, parse_binding_args, parse_extender_args
from stowage.inventory import Card, Inventory
from stowage.resources import GpuRequest

from shared_paths import SHARED
from test_extender_rowcache import partly_used_model, row_local_scores
from test_latency_equivalence import POD_LIMITS, random_model

get_placer("most-allocated")  # registers the policy modules
MODEL = "NVIDIA A100-SXM4-80GB"


def eight_gpu_node(model: ClusterModel, name: str) -> None:
    cards = tuple(Card(index=k, uuid=f"{name}-{k}", model=MODEL, memory_mib=81920) for k in range(8))
    model.upsert_node(name, Inventory(cards=cards, source="simulated"))


def two_nodes() -> ClusterModel:
    """'used' runs a 4-GPU pod (4 cards free), 'empty' runs nothing."""
    model = ClusterModel()
    eight_gpu_node(model, "used")
    eight_gpu_node(model, "empty")
    model.assign("big", "default/big", "used", [0, 1, 2, 3], GpuRequest(gpus=4))
    return model


def four_gpu_workload(model: ClusterModel) -> StowageFragPlacer:
    """A placer that has learned a workload of 4-GPU pods: a 1-GPU pod on 'used' leaves 3 free
    cards no typical pod fits (fragmentation), on 'empty' 7 that still take one."""
    placer = StowageFragPlacer()
    placer.bind_models(model.models)
    placer.watch_releases(lambda: model.gpu_releases)
    for _ in range(40):
        placer.observe(GpuRequest(gpus=4))
    return placer


def scores(placer: StowageFragPlacer, model: ClusterModel, req: GpuRequest) -> dict[str, float]:
    a = model.a
    f = fit(a, req, card_mask(a, model.models, PodPolicy(), req))
    idx = np.flatnonzero(f.ok)
    return {model.names[i]: float(s) for i, s in zip(idx, placer.score(a, req, idx, f.usable))}


def test_fresh_placer_prefers_the_fragmentation_best_node_even_if_empty():
    model = two_nodes()
    placer = four_gpu_workload(model)
    s = scores(placer, model, GpuRequest(gpus=1))
    assert s["empty"] > s["used"]
    assert not placer.churn


def test_a_release_switches_churn_mode_once_and_bumps_the_version():
    model = two_nodes()
    placer = four_gpu_workload(model)
    model.assign("cpu", "default/cpu", "empty", (), GpuRequest(cpu_milli=500), check=False)
    model.release("cpu")                          # a CPU-only pod leaving is not GPU churn
    v0 = placer.version
    assert not placer.churn and placer.version == v0
    model.assign("x", "default/x", "empty", [7], GpuRequest(gpus=1))
    assert placer.version == v0                   # binds do not switch it
    model.release("x")
    v1 = placer.version                           # read before any score: the row cache sees it first
    assert placer.churn and v1 != v0
    model.assign("y", "default/y", "empty", [7], GpuRequest(gpus=1))
    model.release("y")
    assert placer.version == v1                   # switched once, for good


def test_churned_placer_fills_a_used_node_before_an_empty_one():
    model = two_nodes()
    placer = four_gpu_workload(model)
    model.assign("x", "default/x", "empty", [0], GpuRequest(gpus=1))
    model.release("x")
    s = scores(placer, model, GpuRequest(gpus=1))
    assert placer.churn and s["used"] > s["empty"]
    fresh = four_gpu_workload(model)              # same learned state, no release seen since
    f = scores(fresh, model, GpuRequest(gpus=1))
    assert s["used"] == pytest.approx(f["used"]) and s["empty"] == pytest.approx(f["empty"] - CHURN_COST)
    cpu = scores(placer, model, GpuRequest(cpu_milli=1000))   # CPU-only pods pay no churn cost
    assert cpu == pytest.approx(scores(fresh, model, GpuRequest(cpu_milli=1000)))


def test_the_extender_service_switches_its_pack_placer_on_a_release():
    model = two_nodes()
    service = ExtenderService(model)
    placer = service.placers[PACK]
    assert isinstance(placer, StowageFragPlacer) and not placer.churn
    model.release("big")                          # e.g. the pod watch saw the pod deleted
    assert placer.churn


def random_req(rng: random.Random) -> GpuRequest:
    if rng.random() < 0.5:
        return GpuRequest(mem_mib=rng.choice([4096, 10240, 30720]), core_milli=rng.choice([0, 250, 500]))
    return GpuRequest(gpus=rng.choice([1, 1, 2, 4, 8]))


@pytest.mark.parametrize("seed", range(3))
def test_churn_mode_scores_stay_row_local(seed):
    """score(subset) == score(all)[subset]: what lets the extender cache scores per row."""
    rng = random.Random(seed)
    model = partly_used_model(rng)
    placer = get_placer("stowage")
    placer.watch_releases(lambda: model.gpu_releases)
    for _ in range(40):
        placer.observe(random_req(rng))
    model.release(next(iter(model.allocations)))  # a GPU pod leaves
    assert placer.churn
    checked = 0
    for _req, idx, whole in row_local_scores(placer, model, rng, random_req):
        used = (model.a.pods[idx] > 0).any(axis=1)
        if used.any() and (~used).any():      # the churn cost is in the scores: used nodes rank first
            assert whole[used].min() > whole[~used].max()
            checked += 1
    assert checked


@pytest.mark.parametrize("seed", range(2))
def test_cached_answers_equal_fresh_ones_while_pods_come_and_go(seed):
    """Two services over one model, one with the row cache: byte-identical prioritize answers
    through binds and releases, including across the switch."""
    rng = random.Random(100 + seed)
    model = random_model(rng, 40)
    make = (lambda v: get_placer({PACK: "stowage", SPREAD: "least-allocated"}[v]))
    cached = ExtenderService(model, placer_factory=make, speedups=True)
    fresh = ExtenderService(model, placer_factory=make, speedups=False)
    names = model.node_names()
    live: list[str] = []
    for step in range(120):
        pod = bench_cluster.pod_object(f"c{seed}-{step}", rng.choice(POD_LIMITS[:7]))
        body = encode({"Pod": pod, "Nodes": None, "NodeNames": names})
        got = cached.filter(parse_extender_args(body)).to_json()
        fresh.filter(parse_extender_args(body))
        passing = got["NodeNames"] or []
        if not passing:
            continue
        sub = rng.sample(passing, rng.randint(1, len(passing)))   # a subset of rows, as kube-scheduler may ask
        body = encode({"Pod": pod, "Nodes": None, "NodeNames": sub})
        assert cached.prioritize(parse_extender_args(body), as_json=True) == \
            fresh.prioritize(parse_extender_args(body), as_json=True), step
        md = pod["metadata"]
        if rng.random() < 0.6:
            bind = {"PodName": md["name"], "PodNamespace": md["namespace"], "PodUID": md["uid"], "Node": rng.choice(sub)}
            if cached.bind(parse_binding_args(bind)) == "" and md["uid"] in model.allocations:
                live.append(md["uid"])
        elif live and rng.random() < 0.5:
            model.release(live.pop(rng.randrange(len(live))))
    assert cached.placers[PACK].churn and fresh.placers[PACK].churn


@pytest.mark.skipif(not (SHARED / "openb" / "openb_pod_list_default.csv").exists(), reason="needs ../shared/openb")
def test_static_replay_is_unchanged_because_no_pod_leaves(monkeypatch):
    """The trace replay never releases a pod, so churn mode never switches on and the replay
    places every pod where a placer without churn mode does; forcing it on does move pods
    (the check can fail)."""
    from benchmarks.binpack import replay as replay_mod
    from benchmarks.binpack.cli import load_replay

    Default = type(get_placer("stowage"))  # the pack default (Stowage + SS share packing)

    class NoChurn(Default):  # type: ignore[valid-type, misc]
        def churn_cost(self, a, req, idx):
            return 0.0

    class AlwaysChurn(Default):  # type: ignore[valid-type, misc]
        def __init__(self) -> None:
            super().__init__()
            self.note_release()

    nodes, pods = load_replay(str(SHARED / "openb"), "default", 1)
    made: list[StowageFragPlacer] = []
    real_get = replay_mod.get_placer

    def spy(name):
        placer = real_get(name)
        made.append(placer)
        return placer

    def placements(policy: str) -> list:
        got: list = []
        replay(nodes, pods, policy, 42, limit=1500, placements=got)   # (node, cards) per pod
        return got

    monkeypatch.setattr(replay_mod, "get_placer", spy)
    base = placements("stowage")
    assert not made[-1].churn
    monkeypatch.setattr(replay_mod, "get_placer", lambda name: {"no": NoChurn, "yes": AlwaysChurn}[name]())
    assert placements("no") == base
    assert placements("yes") != base


class _FailingBinder:
    def bind(self, namespace, name, uid, node, record):
        from extender.errors import BindError
        raise BindError("the API server said no")


def test_a_failed_bind_is_not_a_pod_leaving():
    """A reservation taken back after a failed Binding (or replaced by a new record) gives the
    cards back without switching churn mode; a pod that really leaves switches it."""
    model = two_nodes()
    svc = ExtenderService(model, binder=_FailingBinder())
    placer = svc.placers[PACK]
    pod = bench_cluster.pod_object("p1", {"nvidia.com/gpu": "1"})
    names = model.node_names()
    svc.filter(parse_extender_args({"Pod": pod, "NodeNames": names}))
    m = pod["metadata"]
    err = svc.bind(parse_binding_args({"PodName": m["name"], "PodNamespace": m["namespace"],
                                       "PodUID": m["uid"], "Node": "used"}))
    assert "the API server said no" in err and m["uid"] not in model.allocations
    # a record replaced by a different one (the feeder re-reading an annotation) is not a leave either
    model.assign("r", "default/r", "empty", [0], GpuRequest(gpus=1), check=False)
    model.assign("r", "default/r", "empty", [1], GpuRequest(gpus=1), check=False)
    assert model.gpu_releases == 0 and not placer.churn
    model.release("big")  # the 4-GPU pod finished
    assert model.gpu_releases == 1 and placer.churn
