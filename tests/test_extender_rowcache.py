"""The per-node row cache (extender/rowcache.py) must never change an answer.

Cached filter/prioritize answers are compared byte for byte with the same service computing
everything afresh (``speedups=False``), on seeded random clusters, for every registered
placer, with binds, releases, re-inventoried nodes (including a wider one that resizes the
arrays), removed and added nodes and the placers' learning (observe, table rebuilds) between
calls. The placers' own contract — a node's score depends on its row only — is checked
directly, and so is the point of the cache: after a bind only the bound node is recomputed.
"""
from __future__ import annotations

import random

import numpy as np
import orjson
import pytest

from packing.decide import RAW_DECIMALS
from packing.fit import card_mask, fit
from packing.placer import Placer
from packing.registry import PLACERS, get_placer
from packing.model import ClusterModel
from packing.pod_policy import PACK, SPREAD, PodPolicy
from extender.rowcache import RowCache, cacheable
from extender.service import ExtenderService
from extender.wire import encode, parse_binding_args, parse_extender_args
from stowage.inventory import Card, Inventory
from stowage.resources import GpuRequest

from benchmarks.latency import cluster as bench_cluster

from test_latency_equivalence import MEM, MODELS, POD_ANNOTATIONS, POD_LIMITS, random_model, upsert_random

get_placer("most-allocated")  # registers the policy modules
ALL_PLACERS = sorted(PLACERS)
CACHED = [p for p in ALL_PLACERS if p != "random"]


def two_services(model: ClusterModel, pack: str, spread: str,
                 filter_keeps: str = "fitting") -> tuple[ExtenderService, ExtenderService]:
    """The fast and the reference path over one model. Filter answers every node that fits by
    default here, so that prioritize (what most of these tests look at) gets them all."""
    factory = {PACK: pack, SPREAD: spread}
    make = (lambda v: get_placer(factory[v]))
    return (ExtenderService(model, placer_factory=make, speedups=True, filter_keeps=filter_keeps),
            ExtenderService(model, placer_factory=make, speedups=False, filter_keeps=filter_keeps))


def wide_node(model: ClusterModel, name: str) -> None:
    """A node with 10 cards: more slots than the model has, so the arrays are replaced."""
    cards = tuple(Card(index=k, uuid=f"{name}-{k}", model=MODELS[0], memory_mib=MEM[MODELS[0]]) for k in range(10))
    model.upsert_node(name, Inventory(cards=cards, source="simulated"))


def answer(service: ExtenderService, verb: str, body: bytes) -> bytes:
    args = parse_extender_args(body)
    if verb == "filter":
        return encode(service.filter(args).to_json())
    return service.prioritize(args, as_json=True)


@pytest.mark.parametrize("pack,spread", [("stowage", "least-allocated"), ("fgd", "most-allocated"),
                                         ("bestfit", "gpushare-binpack"), ("hami-binpack", "random")])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("filter_keeps", ["fitting", "best"])
def test_cached_answers_equal_fresh_ones_on_a_changing_cluster(pack, spread, seed, filter_keeps):
    rng = random.Random(seed)
    model = random_model(rng, 50)
    cached, fresh = two_services(model, pack, spread, filter_keeps)
    live: list[str] = []
    pods: list[tuple[dict, dict]] = []
    all_names_list = model.node_names()
    for step in range(160):
        # Reuse earlier pods' shapes often (that is what the cache serves), new ones too.
        # A new pod each step (both services observe it once), often of an earlier pod's shape.
        shape = rng.choice(pods) if pods and rng.random() < 0.5 else (rng.choice(POD_LIMITS),
                                                                     rng.choice(POD_ANNOTATIONS))
        pods.append(shape)
        pod = bench_cluster.pod_object(f"p{seed}-{step}", *shape)
        if rng.random() < 0.5:  # the same NodeNames list again (kube-scheduler's usual case)
            names = all_names_list
        else:
            names = model.node_names()
            rng.shuffle(names)
            names = names[: rng.randint(1, len(names))] + rng.choice([[], ["ghost-node"]])
            names = names + rng.choice([[], names[:2]])  # repeated names too
        body = encode({"Pod": pod, "Nodes": None, "NodeNames": names})
        for placer in (*cached.placers.values(), *fresh.placers.values()):
            placer.reseed(10_000 + step)  # random: filter "best" draws scores too
        got, want = answer(cached, "filter", body), answer(fresh, "filter", body)
        assert got == want, step
        passing = orjson.loads(got)["NodeNames"]
        if passing:
            body = encode({"Pod": pod, "Nodes": None, "NodeNames": passing + names[:3]})
            for placer in (*cached.placers.values(), *fresh.placers.values()):
                placer.reseed(step)  # random: binds (one service only) draw from it too
            got, want = answer(cached, "prioritize", body), answer(fresh, "prioritize", body)
            assert got == want, step
        r = rng.random()
        md = pod["metadata"]
        if passing and r < 0.5 and md["uid"] not in model.allocations:
            bind = {"PodName": md["name"], "PodNamespace": md["namespace"], "PodUID": md["uid"],
                    "Node": rng.choice(passing)}
            assert cached.bind(parse_binding_args(bind)) == ""
            if md["uid"] in model.allocations:
                live.append(md["uid"])
        elif r < 0.65 and live:
            model.release(live.pop(rng.randrange(len(live))))
        elif r < 0.75:
            upsert_random(model, rng, rng.choice(model.node_names() + [f"new-{step}"]))
        elif r < 0.8 and len(model.node_names()) > 5:
            model.remove_node(rng.choice(model.node_names()))
        elif r < 0.82:
            wide_node(model, rng.choice(model.node_names() + [f"wide-{step}"]))
        elif r < 0.86:
            all_names_list = model.node_names()
    assert cached.path.row_cache is not None and len(cached.path.row_cache) > 0


def learned(name: str, n_pods: int, rng: random.Random) -> Placer:
    placer = get_placer(name)
    for _ in range(n_pods):
        placer.observe(random_req(rng))
    return placer


def random_req(rng: random.Random) -> GpuRequest:
    r = rng.random()
    if r < 0.5:
        return GpuRequest(mem_mib=rng.choice([2048, 4096, 8192, 10240, 16384, 30720]),
                          core_milli=rng.choice([0, 100, 200, 250, 300, 500]))
    return GpuRequest(gpus=rng.choice([1, 1, 2, 4, 8]))


def partly_used_model(rng: random.Random, nodes: int = 80, pods: int = 60) -> ClusterModel:
    """A random model with one-card pods on random nodes (partly used nodes)."""
    model = random_model(rng, nodes)
    for j in range(pods):
        node = rng.choice(model.node_names())
        free = np.flatnonzero(model.a.free_whole()[model.index[node]])
        if free.size:
            model.assign(f"u{j}", f"default/p{j}", node, [int(free[0])], GpuRequest(gpus=1), check=False)
    return model


def row_local_scores(placer: Placer, model: ClusterModel, rng: random.Random, req_fn=random_req,
                     rounds: int = 12):
    """Check score(subset) == score(all)[subset], and for one row, at the precision scores are
    compared at (RAW_DECIMALS: the fragmentation sums differ in the last bit with the
    batch shape), for ``rounds`` random requests; yields (request, nodes, rounded scores) of
    every request with at least 4 feasible nodes."""
    a = model.a
    rounded = lambda x: np.round(np.asarray(x, float), RAW_DECIMALS)  # noqa: E731
    for _ in range(rounds):
        req = req_fn(rng)
        f = fit(a, req, card_mask(a, model.models, PodPolicy(), req))
        idx = np.flatnonzero(f.ok)
        if idx.size < 4:
            continue
        whole = rounded(placer.score(a, req, idx, f.usable))
        sub = np.array(sorted(rng.sample(range(idx.size), idx.size // 3)))
        part = rounded(placer.score(a, req, idx[sub], f.usable))
        assert np.array_equal(part, whole[sub], equal_nan=True), req
        one = rounded(placer.score(a, req, idx[sub[:1]], f.usable))
        assert np.array_equal(one, whole[sub[:1]], equal_nan=True), req
        yield req, idx, whole


@pytest.mark.parametrize("name", CACHED)
@pytest.mark.parametrize("n_pods", [0, 1, 40, 200])
def test_a_cacheable_placers_score_of_a_node_depends_on_its_row_only(name, n_pods):
    """score(subset) == score(all)[subset]: what makes caching per row exact."""
    rng = random.Random(hash((name, n_pods)) & 0xFFFF)
    model = partly_used_model(rng)
    placer = learned(name, n_pods, rng)
    assert cacheable(placer)
    assert sum(1 for _ in row_local_scores(placer, model, rng))


def test_random_placer_is_never_cached():
    assert not cacheable(get_placer("random"))
    assert all(cacheable(get_placer(n)) for n in CACHED)


def test_stowage_version_moves_with_its_learned_state_only():
    placer = get_placer("stowage")
    versions = []
    for _ in range(9):
        placer.observe(GpuRequest(gpus=1))  # extender pods: no host CPU/memory
        versions.append(placer.version)
    # Rebuilds at 1, 2, 4, 8 pods; the stranded ratios are fixed once GPU-milli is known.
    changes = [j + 1 for j in range(1, 9) if versions[j] != versions[j - 1]]
    assert changes == [2, 4, 8]
    v = placer.version
    placer.observe(GpuRequest(gpus=1, cpu_milli=4000))  # host CPU per GPU moves: scores change
    assert placer.version != v


def test_after_a_bind_only_the_bound_node_is_recomputed():
    rng = random.Random(7)
    model = random_model(rng, 40)
    service = ExtenderService(model, placer_factory=lambda v: get_placer("bestfit"))
    cache = service.path.row_cache
    assert cache is not None
    names = model.node_names()
    pods = [bench_cluster.pod_object(f"q{j}", {"nvidia.com/gpu": "1"}, {}) for j in range(3)]
    body = encode({"Pod": pods[0], "Nodes": None, "NodeNames": names})
    passing = orjson.loads(answer(service, "filter", body))["NodeNames"]
    answer(service, "prioritize", encode({"Pod": pods[0], "Nodes": None, "NodeNames": passing}))
    rows0, scores0 = cache.rows_recomputed, cache.scores_recomputed
    md = pods[0]["metadata"]
    assert service.bind(parse_binding_args({"PodName": md["name"], "PodNamespace": md["namespace"],
                                            "PodUID": md["uid"], "Node": passing[0]})) == ""
    body = encode({"Pod": pods[1], "Nodes": None, "NodeNames": names})  # same shape, next pod
    passing = orjson.loads(answer(service, "filter", body))["NodeNames"]
    answer(service, "prioritize", encode({"Pod": pods[1], "Nodes": None, "NodeNames": passing}))
    assert cache.rows_recomputed - rows0 == 1
    assert cache.scores_recomputed - scores0 <= 1


def test_lru_keeps_at_most_max_shapes():
    rng = random.Random(3)
    model = random_model(rng, 10)
    cache = RowCache(max_shapes=2)
    for gpus in (1, 2, 4, 1):
        cache.fit(model, GpuRequest(gpus=gpus), PodPolicy())
    assert len(cache) == 2
    with pytest.raises(ValueError):
        RowCache(0)


def bench_model(n: int) -> ClusterModel:
    """The latency benchmark's cluster: many nodes with identical contents (what dedup serves)."""
    from extender.simcluster import parse_cluster
    model = ClusterModel()
    parse_cluster(bench_cluster.cluster_doc(n), "<test>").populate(model)
    return model


@pytest.mark.parametrize("pack", ["stowage", "fgd", "bestfit", "most-allocated"])
def test_identical_nodes_are_evaluated_once_and_answers_are_unchanged(pack):
    """Rows with equal contents share one evaluation; the answers are still those of computing
    every node afresh (and flipping a node's whole-only flag alone separates it from its twins)."""
    rng = random.Random(11)
    model = bench_model(120)
    cached, fresh = two_services(model, pack, "least-allocated")
    names = model.node_names()
    whole_only = set(rng.sample(names, 6))
    for name in whole_only:  # same cards, only the flag differs from their twins
        i = model.index[name]
        inv = Inventory(cards=tuple(model.cards_of(name)), source="simulated", whole_only=True)
        model.upsert_node(name, inv)
        assert model.meta[name].whole_only and model.index[name] == i
    for step, pod in enumerate(bench_cluster.pods(70, seed=5, prefix="dedup")):
        body = encode({"Pod": pod, "Nodes": None, "NodeNames": names})
        got = answer(cached, "filter", body)
        assert got == answer(fresh, "filter", body), step
        passing = orjson.loads(got)["NodeNames"]
        if len(passing) > 1:
            body = encode({"Pod": pod, "Nodes": None, "NodeNames": passing})
            got_p = answer(cached, "prioritize", body)
            assert got_p == answer(fresh, "prioritize", body), step
            best = max(orjson.loads(got_p), key=lambda s: s["Score"])["Host"]
        elif passing:
            best = passing[0]
        else:
            continue
        md = pod["metadata"]
        cached.bind(parse_binding_args({"PodName": md["name"], "PodNamespace": md["namespace"],
                                        "PodUID": md["uid"], "Node": best}))
    cache = cached.path.row_cache
    assert cache is not None
    assert 0 < cache.rows_evaluated < cache.rows_recomputed // 3


def test_row_signatures_equal_exactly_for_equal_row_contents():
    model = bench_model(40)
    cache = RowCache()
    names = model.node_names()
    sig = cache.signatures(model).copy()
    i, j = model.index[names[0]], model.index[names[1]]  # two empty nodes of the same type
    assert sig[i] == sig[j]
    model.assign("u1", "default/p1", names[0], [0], GpuRequest(gpus=1), check=True)
    sig = cache.signatures(model).copy()
    assert sig[i] != sig[j]
    model.assign("u2", "default/p2", names[1], [0], GpuRequest(gpus=1), check=True)
    assert cache.signatures(model)[i] == cache.signatures(model)[j]
    inv = Inventory(cards=tuple(model.cards_of(names[1])), source="simulated", whole_only=True)
    model.upsert_node(names[1], inv)  # same cards and pods, whole-only now
    assert cache.signatures(model)[i] != cache.signatures(model)[j]
    reps, inverse = cache.representatives(model, np.arange(len(names)))
    assert inverse is not None and len(reps) < len(names)
    sig = cache.signatures(model)
    assert np.array_equal(sig[reps][inverse], sig[np.arange(len(names))])


def test_passing_list_memo_is_not_reused_after_nodes_change():
    """filter remembers its passing list's rows for the next prioritize; a node removed and
    another added in between (its row reused) must not be scored from the old rows."""
    model = bench_model(40)
    cached, fresh = two_services(model, "bestfit", "least-allocated")
    pod = bench_cluster.pod_object("memo", {"nvidia.com/gpu": "1"}, {})
    names = model.node_names()
    passing = orjson.loads(answer(cached, "filter", encode({"Pod": pod, "Nodes": None, "NodeNames": names})))[
        "NodeNames"]
    gone = passing[3]
    cards = tuple(model.cards_of(gone))
    model.remove_node(gone)
    model.upsert_node("newcomer", Inventory(cards=cards, source="simulated"))
    model.assign("u9", "default/p9", "newcomer", [0, 1, 2], GpuRequest(gpus=3), check=True)
    body = encode({"Pod": pod, "Nodes": None, "NodeNames": passing})
    got = answer(cached, "prioritize", body)
    assert got == answer(fresh, "prioritize", body)
    assert {s["Host"]: s["Score"] for s in orjson.loads(got)}[gone] == 0


@pytest.mark.parametrize("name", ["stowage", "fgd"])
@pytest.mark.parametrize("kind", ["random", "bench"])
def test_frag_index_synced_from_row_gen_equals_array_comparison(name, kind):
    """The fragmentation placers learn the changed rows from ClusterModel.row_gen (one [N]
    comparison) instead of diffing the card arrays, and build the index once per distinct row
    content (RowCache groups): same index state and scores as a placer that diffs and builds
    every row, through binds, releases, re-inventory, removals, array resizes and rebuilds."""
    rng = random.Random(21)
    model = random_model(rng, 60) if kind == "random" else bench_model(80)
    tracked, diffing = learned(name, 50, random.Random(1)), learned(name, 50, random.Random(1))
    ungrouped = learned(name, 50, random.Random(1))   # row_gen, every row built
    ungrouped.track_rows(lambda a: model.row_gen if a is model.a else None)
    cache = RowCache()
    groups_used = []

    def groups(a):
        reps, inv = cache.representatives(model, np.arange(a.shape[0]))
        groups_used.append(inv is not None)
        return None if inv is None else (reps, inv)

    tracked.track_rows(lambda a: model.row_gen if a is model.a else None, groups)
    live: list[str] = []
    for step in range(80):
        if step % 10 == 5:  # new learned state: the index is built afresh
            for placer in (tracked, diffing, ungrouped):
                placer.prime([(random_req(random.Random(step)), ())])
        req = random_req(rng)
        a = model.a
        f = fit(a, req, card_mask(a, model.models, PodPolicy(), req))
        idx = np.flatnonzero(f.ok)
        if idx.size:
            got = np.asarray(tracked.score(a, req, idx, f.usable), float)
            # Grouped build: bit for bit the plain build (F included: FGD quantises it).
            assert np.array_equal(got, np.asarray(ungrouped.score(a, req, idx, f.usable), float),
                                  equal_nan=True), step
            assert np.array_equal(tracked.index.frag, ungrouped.index.frag), step
            # row_gen vs diffing the arrays: the same rows' state (F to float precision: rows
            # are recomputed in other batches; the integer state is exact).
            diffing.score(a, req, idx, f.usable)
            for arr in ("left", "idle", "cnt", "big", "fits"):
                assert np.array_equal(getattr(tracked.index, arr), getattr(diffing.index, arr)), (step, arr)
            assert np.allclose(tracked.index.frag, diffing.index.frag, rtol=1e-12, atol=1e-9)
            if name == "stowage":  # exact scores compared at RAW_DECIMALS, as the extender does
                want = np.asarray(diffing.score(a, req, idx, f.usable), float)
                assert np.array_equal(np.round(got, RAW_DECIMALS), np.round(want, RAW_DECIMALS),
                                      equal_nan=True), step
            assert tracked.index._snap is None  # no array snapshot kept: row_gen was used
            i = int(idx[rng.randrange(idx.size)])
            cards = tracked.choose_cards(a, i, req, f.usable[i], PodPolicy())
            ungrouped.choose_cards(a, i, req, f.usable[i], PodPolicy())
            uid = f"u{step}"
            model.assign(uid, f"default/{uid}", model.names[i], cards, req, check=True)
            live.append(uid)
        r = rng.random()
        if r < 0.3 and live:
            model.release(live.pop(rng.randrange(len(live))))
        elif r < 0.45:
            upsert_random(model, rng, rng.choice(model.node_names() + [f"new-{step}"]))
        elif r < 0.5 and len(model.node_names()) > 5:
            model.remove_node(rng.choice(model.node_names()))
        elif r < 0.52:
            wide_node(model, f"wide-{step}")
    assert any(groups_used)


def test_interleaved_pods_reuse_their_passing_lists_and_answer_as_fresh():
    """Several pods in flight (filter A, filter B, prioritize A, prioritize B): each prioritize
    finds its own filter's passing list in the memo, and the answers are those computed afresh."""
    model = bench_model(60)
    cached, fresh = two_services(model, "stowage", "least-allocated")
    names = model.node_names()
    pods = [bench_cluster.pod_object("ia", {"nvidia.com/gpu": "4"}, {}),
            bench_cluster.pod_object("ib", {"nvidia.com/gpu-memory": "10", "nvidia.com/gpu-core": "30"},
                                     {"stowage.io/gpu-model": "H100"}),
            bench_cluster.pod_object("ic", {"nvidia.com/gpu": "1"}, {"stowage.io/gpu-model-exclude": "A10"})]
    passing = []
    for pod in pods:
        body = encode({"Pod": pod, "Nodes": None, "NodeNames": names})
        got = answer(cached, "filter", body)
        assert got == answer(fresh, "filter", body)
        passing.append(orjson.loads(got)["NodeNames"])
    assert len({len(p) for p in passing}) == 3  # three different lists
    memo = cached.path.names
    for pod, ok in zip(pods, passing):
        body = encode({"Pod": pod, "Nodes": None, "NodeNames": ok})
        assert answer(cached, "prioritize", body) == answer(fresh, "prioritize", body)
        assert len(memo.entries) == 4  # found, not added: full list + three passing lists
        assert memo.entries[0].names == ok and memo.entries[0].heads is not None
