"""Issue 13, one placement path: ``stowage plan`` and the elastic simulation place through the
extender's own service (:mod:`extender.placing`), so they can never know more, or less, than
the live extender. Each test here replays what one of them did against the live extender as
kube-scheduler drives it — the real app's ``/filter``, ``/prioritize`` and ``/bind`` over its
HTTP bodies, a model built from Node objects through the watch's object-to-model code, the
pods it has seen taught through the watch's ``learn_pod`` — with the test's own pick of the
best-scored node, and fails on the first placement (node or cards) that differs.

And the one choice rule (:func:`packing.decide.best_node`): two nodes whose raw scores differ
by less than 1e-9 are a tie for the benchmark, for ``stowage plan`` and for prioritize alike.
"""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.binpack import replay as rp
from extender.app import create_app
from extender.kube_objects import node_into_model, node_view
from extender.placing import request_pod, schedule, serve
from extender.service import ExtenderService
from extender.simcluster import load_cluster, node_objects
from packing.decide import best_node, decide
from packing.model import ClusterModel
from packing.placer import PlacerBase
from packing.pod_policy import PodPolicy
from packing.registry import placer_for
from shared_paths import SHARED
from stowage.resources import GpuRequest, pod_request
from stowage_ops.planning import capacity, fill_random, parse_shape, shape_of_allocation

OPENB = SHARED / "openb"


# ------------------------------------------------------------------ the live extender, over HTTP
class LiveExtender:
    """The extender's app as kube-scheduler talks to it, over a model fed like the watch feeds it."""

    def __init__(self, model: ClusterModel, service: ExtenderService | None = None) -> None:
        self.model = model
        self.service = service or ExtenderService(model)   # the live defaults: pack = Stowage's placer
        self.http = create_app(self.service).test_client()
        self.unit = self.service.memory_unit_mib    # pods state GPU memory in the extender's unit

    def post(self, verb: str, body: dict) -> object:
        r = self.http.post(f"/{verb}", json=body)
        assert r.status_code == 200, r.data
        return r.get_json()

    def place(self, pod: dict, names: list[str], rank: np.ndarray | None = None) -> tuple[str, tuple[int, ...]] | None:
        """One scheduling cycle: filter, prioritize when more than one node passes, the best
        score (ties: lowest ``rank``, else lowest model slot: written out here, not borrowed), bind."""
        passing = self.post("filter", {"Pod": pod, "NodeNames": names})["NodeNames"] or []
        if not passing:
            return None
        node = passing[0]
        if len(passing) > 1:
            scores = {h["Host"]: h["Score"] for h in self.post("prioritize", {"Pod": pod, "NodeNames": passing})}
            top = max(scores.values())
            slot = self.model.index
            node = min((n for n in passing if scores[n] == top),
                       key=lambda n: (rank[slot[n]] if rank is not None else slot[n]))
        m = pod["metadata"]
        err = self.post("bind", {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"],
                                 "Node": node})
        assert err.get("Error", "") == "", err
        return node, self.model.allocations[m["uid"]].cards


def watched_cluster() -> ClusterModel:
    """The built-in simulated cluster as Node objects through the watch's object-to-model code."""
    model = ClusterModel()
    for obj in node_objects(load_cluster()):
        node_into_model(model, node_view(obj))
    return model


# ------------------------------------------------------------------ stowage plan
@pytest.mark.parametrize("shape", ["1", "2", "10Gi,30%", "20Gi@A100", "1x80Gi"])
def test_plan_capacity_places_every_pod_where_the_live_extender_does(shape):
    model = watched_cluster()
    assert fill_random(model, 70, seed=3) > 50            # a used cluster (placed through the service too)
    live = LiveExtender(model.copy())
    for al in model.allocations.values():                  # the watch teaches it the pods that run
        ns, _, name = al.name.partition("/")
        live.service.learn_pod(request_pod(name, shape_of_allocation(al), namespace=ns, uid=al.uid,
                                               memory_unit_mib=live.unit))
    gen = model.generation
    res = capacity(model, parse_shape(shape), placer="pack", limit=40)
    assert model.generation == gen                         # a what-if: the model is untouched
    s = parse_shape(shape)
    names = [n for n in model.names if n is not None]
    got = []
    for n in range(res.count + (not res.limited)):   # and then nothing more, unless it stopped at the limit
        placed = live.place(request_pod(f"live-{n}", s.req, s.policy, uid=f"live-{n}", memory_unit_mib=live.unit),
                            names)
        if placed is None:
            break
        got.append(placed)
    assert res.count >= 3
    assert [(node, tuple(cards)) for node, cards in res.placements] == got


def test_plan_fill_places_every_pod_where_the_live_extender_does():
    model = watched_cluster()
    live = LiveExtender(watched_cluster())
    fill_random(model, 60, seed=11)
    names = [n for n in model.names if n is not None]
    import random

    from stowage_ops.planning import FILL_MIX
    rng = random.Random(11)
    for p in range(60):
        req = rng.choices([r for _, r in FILL_MIX], [w for w, _ in FILL_MIX])[0]
        uid = f"fill-uid-{p:05d}"
        placed = live.place(request_pod(f"pod-{p:05d}", req, namespace="fill", uid=uid, memory_unit_mib=live.unit),
                            names)
        al = model.allocations.get(uid)
        assert placed == (None if al is None else (al.node, al.cards)), p


# ------------------------------------------------------------------ the elastic simulation
@pytest.mark.skipif(not (OPENB / "openb_pod_list_default.csv").exists(), reason="needs ../shared/openb")
def test_the_elastic_simulation_places_every_pod_where_the_live_extender_does(monkeypatch):
    """Record every call the simulation makes on the extender (a scheduling attempt, a pod
    learned without a filter, a pod leaving), then replay the log against the live extender."""
    from benchmarks.elastic import sim
    from benchmarks.elastic.cli import _scenario

    log: list[tuple] = []
    real_schedule, real_serve, real_build = sim.schedule, sim.serve, sim.build_cluster

    def recording_schedule(service, pod, names, tie=None, refusals=None):
        node = real_schedule(service, pod, names, tie)
        uid = pod["metadata"]["uid"]
        log.append(("schedule", pod, list(names), None if node is None else (node, service.model.allocations[uid].cards)))
        return node

    def recording_serve(model, placer, **kw):
        service = real_serve(model, placer, **kw)
        learn = service.learn_pod
        service.learn_pod = lambda pod: (log.append(("learn", pod)), learn(pod))[1]
        return service

    def recording_build(nodes):
        model = real_build(nodes)
        release = model.release
        model.release = lambda uid, **kw: (log.append(("release", uid)), release(uid, **kw))[1]
        return model

    monkeypatch.setattr(sim, "schedule", recording_schedule)
    monkeypatch.setattr(sim, "serve", recording_serve)
    monkeypatch.setattr(sim, "build_cluster", recording_build)
    seed = 42
    nodes, sc = _scenario(str(OPENB), "default", 20, 0.1, 60, 8, 1.0, seed)
    res = sim.run(sc, nodes, "stowage", seed)     # the registered pack default, as the extender runs it
    kinds = {k for k, *_ in log}
    assert {"schedule", "learn", "release"} <= kinds and res.jobs_placed > 20

    model = rp.build_cluster(nodes)
    live = LiveExtender(model, ExtenderService(model, memory_unit_mib=rp.MEMORY_UNIT_MIB,
                                               placer_factory=placer_for))   # pack -> Stowage, as served
    rank = rp.node_rank(len(nodes.names), seed)
    for e, (kind, *rest) in enumerate(log):
        if kind == "learn":
            live.service.learn_pod(rest[0])        # the watch shows a pending pod
        elif kind == "release":
            model.release(rest[0])                 # the watch sees it deleted
        else:
            pod, names, want = rest
            assert live.place(pod, names, rank) == want, (e, pod["metadata"]["name"])


# ------------------------------------------------------------------ one choice rule
class NearTie(PlacerBase):
    """Scores every node 1.0, except node ``high`` 1.0 + 1e-12: float noise, not a preference."""

    name = "near-tie"

    def __init__(self, high: int) -> None:
        super().__init__()
        self.high = high

    def score(self, a, req, idx, usable):
        return np.where(np.asarray(idx) == self.high, 1.0 + 1e-12, 1.0)


def two_nodes() -> ClusterModel:
    model = ClusterModel()
    for n in ("n0", "n1"):
        obj = rp.node_object(n, 64000, 262144, 4, "V100M16")
        node_into_model(model, node_view(obj))
    return model


@pytest.mark.parametrize("high", [0, 1])
def test_a_near_tie_is_a_tie_for_the_benchmark_plan_and_the_service(high):
    req = GpuRequest(gpus=1)
    rank = np.array([1, 0])                                # with a tie order, n1 wins a tie
    model = two_nodes()
    # the service's prioritize: both nodes get the top score
    service = serve(model, NearTie(high))
    pod = request_pod("p", req, uid="p")
    from extender.wire import ExtenderArgs
    _, scores = service.prioritize_scores(ExtenderArgs(pod=pod, node_names=["n0", "n1"], nodes=None,
                                                       names=["n0", "n1"]))
    assert scores.tolist() == [10, 10]
    # the benchmark's schedule (with its tie order), decide() and plan (lowest slot) agree with it
    assert schedule(serve(two_nodes(), NearTie(high)), request_pod("p", req, uid="p"), ["n0", "n1"], rank) == "n1"
    assert decide(model.a, model.models, req, PodPolicy(), NearTie(high), tie=rank)[0] == 1
    assert decide(model.a, model.models, req, PodPolicy(), NearTie(high))[0] == 0
    assert best_node(np.array([1.0, 1.0 + 1e-12]), np.array([0, 1])) == 0
    assert capacity(two_nodes(), parse_shape("1"), placer=NearTie(high), limit=1).placements[0][0] == "n0"


def test_a_what_if_pod_is_the_request_it_stands_for():
    """request_pod is read back by the service's own parser to exactly the request."""
    for req, pol in [(GpuRequest(gpus=2), PodPolicy()), (GpuRequest(gpus=1, min_card_mem_mib=40960), PodPolicy()),
                     (GpuRequest(mem_mib=10240, core_milli=300, cpu_milli=250, host_mem_mib=512.5), PodPolicy()),
                     (GpuRequest(mem_mib=512), PodPolicy(models_include=("A100", "H100"))),
                     (GpuRequest(cpu_milli=1500, host_mem_mib=1024), PodPolicy())]:
        pod = request_pod("p", req, pol)
        assert pod_request(pod, 1) == req
        service = serve(two_nodes(), NearTie(0))
        info = service.pod_info(pod)
        assert info.req == req and info.policy.models_include == pol.models_include


# ------------------------------------------------------------------ the live extender's placers
def test_the_live_extenders_placers_know_the_gpu_model_names_the_benchmark_gives_them():
    """The benchmarks and plan attach their placers to the model (attach_placer: GPU model names,
    release count); the live extender must too, or on model-limited workloads the benchmark
    knows more than the product (the fragmentation placers would see every card as an unknown
    model)."""
    model = watched_cluster()
    service = ExtenderService(model)  # the placers the extender serves by default (pack: stowage)
    models = [p._models for p in service.placers.values() if hasattr(p, "_models")]
    assert models and all(list(m) == list(model.models) for m in models)
