"""The latency optimisations must not change a single answer.

The service is the plain reference path plus one seam for the speed-ups
(``ExtenderService(speedups=False)`` is the reference: every answer computed afresh from
``packing``, one node's reason at a time). Here the fast path is compared with it on seeded
random clusters and pods, with the model changing between calls (binds, releases,
re-inventoried and removed nodes) so that any stale cached state would show; and the pure
functions the hot path is made of (row counts, fit, vectorised reasons) with the slow, obvious
way of computing them.
"""
from __future__ import annotations

import random

import numpy as np
import orjson
import pytest

from extender.fastreasons import reasons
from packing.fit import Fit, card_mask, fit, reason, row_any, row_count
from packing.model import CardArrays, ClusterModel
from packing.pod_policy import PodPolicy
from extender.service import ExtenderService
from extender.wire import encode, parse_binding_args, parse_extender_args
from stowage.inventory import Card, Inventory
from stowage.resources import GpuRequest

from benchmarks.latency import cluster as bench_cluster

MODELS = ["NVIDIA H100-SXM5-80GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB", "NVIDIA L40S", "NVIDIA A10"]
MEM = {"NVIDIA H100-SXM5-80GB": 81920, "NVIDIA A100-SXM4-80GB": 81920, "NVIDIA A100-SXM4-40GB": 40960,
       "NVIDIA L40S": 49152, "NVIDIA A10": 24576}


# ------------------------------------------------------------------ the references (slow, obvious)
def ref_open(a: CardArrays, tolerates: int) -> np.ndarray:
    """Node by node: open, or closed only for reasons the pod tolerates."""
    return np.array([bool(a.node_ok[i]) or (int(a.closed[i]) != 0 and int(a.closed[i]) | tolerates == tolerates)
                     for i in range(a.shape[0])], bool)


def ref_fit(a: CardArrays, req: GpuRequest, allowed: np.ndarray, tolerates: int = 0) -> Fit:
    healthy = allowed & a.healthy
    node_ok = ref_open(a, tolerates)
    host_ok = node_ok & (a.cpu_free >= req.cpu_milli) & (a.hmem_free >= req.host_mem_mib)
    if req.is_whole:
        usable = healthy & (a.pods == 0)
        ok = host_ok & (usable.sum(axis=1) >= req.gpus)
        unresolvable = healthy.sum(axis=1) < req.gpus
    else:
        usable = healthy & (a.mem_free >= req.mem_mib) & (a.core_free >= req.core_milli)
        ok = host_ok & usable.any(axis=1)
        big_enough = healthy & (a.mem_total >= req.mem_mib)
        unresolvable = ~big_enough.any(axis=1)
    unresolvable &= ~ok
    return Fit(ok=ok, usable=usable, unresolvable=unresolvable | (~node_ok & ~ok))


# ------------------------------------------------------------------------------ random data
def random_arrays(rng: np.random.Generator, n: int, k: int) -> CardArrays:
    a = CardArrays.empty(n, k)
    a.exists[:] = rng.random((n, k)) < 0.85
    a.exists[rng.random(n) < 0.05] = False                      # nodes without cards
    a.healthy[:] = a.exists & (rng.random((n, k)) < 0.9)
    a.mem_total[:] = np.where(a.exists, rng.choice([24576, 40960, 81920], (n, k)), 0)
    a.mem_free[:] = np.where(rng.random((n, k)) < 0.5, a.mem_total, (a.mem_total * rng.random((n, k))).astype(int))
    a.mem_free[rng.random((n, k)) < 0.02] -= 100                 # over-committed after a rebuild
    a.core_free[:] = np.where(a.exists, rng.choice([0, 100, 250, 500, 700, 1000], (n, k)), 0)
    a.pods[:] = np.where(a.core_free < 1000, rng.integers(1, 4, (n, k)), 0)
    a.model[:] = rng.integers(0, 4, (n, k))
    a.node_ok[:] = rng.random(n) < 0.93
    a.closed[:] = np.where(a.node_ok, 0, rng.integers(1, 16, n))   # why (stowage.taints.NodeClosure bits)
    a.cpu_free[:] = np.where(rng.random(n) < 0.3, rng.choice([0.0, 500.0, 4000.5, 64000.0], n), np.inf)
    a.hmem_free[:] = np.where(rng.random(n) < 0.3, rng.choice([0.0, 512.0, 3000.0, 900000.0], n), np.inf)
    return a


def random_req(rng: random.Random) -> GpuRequest:
    cpu = rng.choice([0, 0, 1000, 8000])
    hmem = rng.choice([0, 0, 1024, 65536])
    if rng.random() < 0.5:
        return GpuRequest(gpus=rng.choice([1, 2, 4, 8]), min_card_mem_mib=rng.choice([0, 0, 40960]),
                          cpu_milli=cpu, host_mem_mib=hmem)
    return GpuRequest(mem_mib=rng.choice([1024, 8192, 20480, 50000]), core_milli=rng.choice([0, 100, 300, 900]),
                      cpu_milli=cpu, host_mem_mib=hmem)


# ------------------------------------------------------------------------------ pure functions
@pytest.mark.parametrize("k", [1, 3, 8, 9, 16])
def test_row_count_and_row_any_match_numpy(k):
    rng = np.random.default_rng(k)
    for density in (0.0, 0.1, 0.5, 1.0):
        b = rng.random((37, k)) < density
        for view in (b, b[::2], b[5:6], b[:0], np.asfortranarray(b)):
            assert row_count(view).tolist() == view.sum(axis=1).tolist()
            assert row_any(view).tolist() == view.any(axis=1).tolist()


@pytest.mark.parametrize("seed", range(6))
def test_fit_and_reasons_match_the_reference(seed):
    rng = np.random.default_rng(seed)
    prng = random.Random(seed)
    k = [8, 8, 4, 12, 8, 1][seed]
    a = random_arrays(rng, 300, k)
    models = ["UNKNOWN", "NVIDIA A10", "NVIDIA A100-SXM4-40GB", "NVIDIA H100-SXM5-80GB"]
    for _ in range(25):
        req = random_req(prng)
        policy = PodPolicy(models_include=prng.choice([(), ("H100",), ("A100-SXM4-40GB", "A10")]),
                           models_exclude=prng.choice([(), ("A10",)]), min_card_mem_mib=prng.choice([0, 81920]),
                           tolerates=prng.choice([0, 0, 1, 2, 3, 5, 7]))
        tol = policy.tolerates
        mask = card_mask(a, models, policy, req)
        got, want = fit(a, req, mask, tol), ref_fit(a, req, mask, tol)
        for field in ("ok", "usable", "unresolvable"):
            assert np.array_equal(getattr(got, field), getattr(want, field)), field
        rows = np.flatnonzero(~got.ok)
        rng.shuffle(rows)                                   # any order, repeats allowed
        rows = np.r_[rows, rows[:5]]
        assert reasons(a, rows, req, mask, tol) == [reason(a, int(i), req, mask, detail=False, tolerates=tol)
                                                    for i in rows]
    assert reasons(a, np.array([], np.int64), GpuRequest(gpus=1), a.exists) == []


# --------------------------------------------------------------------------- the whole service
def random_model(rng: random.Random, n: int) -> ClusterModel:
    model = ClusterModel()
    for j in range(n):
        upsert_random(model, rng, f"node-{j:03d}")
    return model


def upsert_random(model: ClusterModel, rng: random.Random, name: str) -> None:
    m = rng.choice(MODELS)
    count = rng.choice([0, 2, 4, 8, 8, 8])
    cards = tuple(Card(index=k, uuid=f"{name}-{k}", model=m, memory_mib=MEM[m], healthy=rng.random() < 0.93,
                       numa=k // 4, nvlink=tuple(x for x in range(count) if x != k and x // 4 == k // 4))
                  for k in range(count))
    # Allocatable CPU, memory and pods: stated by most nodes (the watch models them), not by all.
    host = {} if rng.random() < 0.3 else {"cpu_milli": float(rng.choice([4000, 16000, 64000])),
                                          "host_mem_mib": float(rng.choice([16384, 65536, 262144])),
                                          "max_pods": float(rng.choice([2, 4, 110]))}
    # Closed for a reason (stowage.taints.NodeClosure bits) now and then: cordoned, not Ready, ...
    closed = 0 if rng.random() < 0.8 else rng.choice([1, 2, 3, 4, 5, 8, 9])
    model.upsert_node(name, Inventory(cards=cards, source="simulated", whole_only=rng.random() < 0.1),
                      closed=closed, **host)


POD_LIMITS = [{"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "4"}, {"nvidia.com/gpu": "8"},
              {"nvidia.com/gpu-memory": "10", "nvidia.com/gpu-core": "30"}, {"nvidia.com/gpu-memory": "30"},
              {"nvidia.com/gpu-memory": "70"}, {"nvidia.com/gpu": "1", "nvidia.com/gpu-memory": "80"}, {},
              {"nvidia.com/gpu-core": "150"}, {"cpu": "6", "memory": "8Gi"}, {"cpu": "2", "nvidia.com/gpu": "1"},
              {"cpu": "500m", "memory": "100Gi", "nvidia.com/gpu-memory": "10"}]
POD_ANNOTATIONS = [{}, {}, {"stowage.io/node-policy": "spread"}, {"stowage.io/gpu-model": "H100,L40S"},
                   {"stowage.io/gpu-model-exclude": "A10"}, {"stowage.io/min-card-memory": "80Gi"},
                   {"stowage.io/card-policy": "spread"}]
# spec.tolerations: none, a DaemonSet's, a blanket one, one that opens nothing (NoExecute only).
POD_TOLERATIONS = [None, None, None,
                   [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
                    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
                   [{"operator": "Exists"}],
                   [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
                   [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
                    {"key": "node.kubernetes.io/unreachable", "operator": "Exists"}]]


def churn(models: list[ClusterModel], rng: random.Random, live: list[str], step: int) -> None:
    """The same random change applied to every model: bind, release, re-inventory or remove."""
    r = rng.random()
    names = models[0].node_names()
    if r < 0.25 and live:
        uid = live.pop(rng.randrange(len(live)))
        for m in models:
            m.release(uid)
    elif r < 0.35:
        name = rng.choice(names + [f"new-{step}"])
        state = rng.getstate()
        for m in models:
            rng.setstate(state)
            upsert_random(m, rng, name)
    elif r < 0.4 and len(names) > 5:
        name = rng.choice(names)
        for m in models:
            m.remove_node(name)


@pytest.mark.parametrize("seed", range(4))
def test_service_answers_match_the_reference_on_a_changing_cluster(seed):
    rng = random.Random(seed)
    state = rng.getstate()
    fast_model = random_model(rng, 60)
    rng.setstate(state)
    ref_model = random_model(rng, 60)
    fast, ref = ExtenderService(fast_model), ExtenderService(ref_model, speedups=False)
    live: list[str] = []
    for step in range(120):
        limits = rng.choice(POD_LIMITS)
        pod = bench_cluster.pod_object(f"p{seed}-{step}", limits, rng.choice(POD_ANNOTATIONS))
        tolerations = rng.choice(POD_TOLERATIONS)
        if tolerations is not None:
            pod["spec"]["tolerations"] = tolerations
        names = fast_model.node_names()
        rng.shuffle(names)
        names = names[: rng.randint(1, len(names))] + rng.choice([[], ["ghost-node"]])
        body = encode({"Pod": pod, "Nodes": None, "NodeNames": names})
        got_f, want_f = (encode(s.filter(parse_extender_args(body)).to_json()) for s in (fast, ref))
        assert got_f == want_f
        passing = orjson.loads(got_f)["NodeNames"]
        if not passing:
            continue
        body = encode({"Pod": pod, "Nodes": None, "NodeNames": passing + names[:3]})
        got_p, want_p = (encode(s.prioritize(parse_extender_args(body))) for s in (fast, ref))
        assert got_p == want_p
        if rng.random() < 0.7:
            md = pod["metadata"]
            bind = {"PodName": md["name"], "PodNamespace": md["namespace"], "PodUID": md["uid"],
                    "Node": rng.choice(passing)}
            assert fast.bind(parse_binding_args(bind)) == ref.bind(parse_binding_args(bind))
            if md["uid"] in fast_model.allocations:
                live.append(md["uid"])
        churn([fast_model, ref_model], rng, live, step)
        assert fast_model.allocations.keys() == ref_model.allocations.keys()
        assert all(fast_model.allocations[u].cards == ref_model.allocations[u].cards for u in live)


# ------------------------------------------------------------------------ the placers' index
def test_frag_index_incremental_state_matches_plain_sums_and_a_fresh_build():
    """FragIndex keeps per-node aggregates (popcount/einsum sums, changed-row detection): after
    random changes they must equal both the plain numpy sums and an index built from scratch."""
    from packing.frag import FragIndex, FragTable, PodClass, Workload

    rng = np.random.default_rng(5)
    prng = random.Random(5)
    a = random_arrays(rng, 200, 8)
    a.cpu_free[:] = np.where(np.isinf(a.cpu_free), 64000.0, a.cpu_free)
    a.hmem_free[:] = np.where(np.isinf(a.hmem_free), 512000.0, a.hmem_free)
    w = Workload()
    for _ in range(40):
        w.add(PodClass.of(random_req(prng), prng.choice([(), ("H100",)]), host_memory=True))
    table = FragTable(w.typical(0.95))
    models = ["UNKNOWN", "NVIDIA A10", "NVIDIA A100-SXM4-40GB", "NVIDIA H100-SXM5-80GB"]
    ix = FragIndex(table, models)
    for step in range(30):
        ix.sync(a)
        fresh = FragIndex(table, models)
        fresh.sync(CardArrays(**{f: getattr(a, f).copy() for f in a.__dataclass_fields__}))
        for name in ("left", "idle", "cnt", "big", "fits"):
            assert np.array_equal(getattr(ix, name), getattr(fresh, name)), (step, name)
        # F is a float dot product: summed over a subset of rows it may differ in the last bit.
        assert np.allclose(ix.frag, fresh.frag, rtol=1e-12, atol=1e-9)
        assert np.array_equal(ix.cnt, ix.fits.sum(axis=2))
        assert np.array_equal(ix.big, (ix.fits * ix.left[None]).sum(axis=2))
        assert np.array_equal(ix.idle, ix.left.sum(axis=1))
        for _ in range(prng.randint(0, 4)):   # change a few cards in place, as binds/releases do
            i, k = prng.randrange(200), prng.randrange(8)
            field = prng.choice(["core_free", "mem_free", "healthy", "exists", "model"])
            arr = getattr(a, field)
            arr[i, k] = (not arr[i, k]) if arr.dtype == bool else max(0, int(arr[i, k]) - prng.choice([0, 100, 1024]))
        if prng.random() < 0.3:
            a.cpu_free[prng.randrange(200)] -= 1000

        req = random_req(prng)
        ix.sync(a)
        if req.is_shared:   # runs of identical cards are computed once: same F as one pair at a time
            usable = a.exists & a.healthy & (a.mem_free >= req.mem_mib) & (a.core_free >= req.core_milli)
            ii, kk = np.nonzero(usable)
            together = ix.after_share(a, ii, kk, req)
            alone = np.array([ix.after_share(a, ii[q:q + 1], kk[q:q + 1], req)[0] for q in range(len(ii))])
            assert np.allclose(together, alone, rtol=1e-12, atol=1e-9)
