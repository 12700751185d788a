"""Placement semantics through ExtenderService: reasons, exact model matching, card size,
NVLink/NUMA locality, pack vs spread, configurable memory unit and default policy."""
from __future__ import annotations

import pytest

from packing.pod_policy import PodPolicy
from stowage.inventory import Inventory
from extender.service import ExtenderService
from extender.wire import BindingArgs, parse_extender_args
from extender_harness import gpus, model_from, simple_placers, take_shared, take_whole

GIB = 1024


def pod(uid, limits, annotations=None):
    return {"metadata": {"name": uid, "namespace": "default", "uid": uid, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


def run_filter(svc, p, names=None):
    names = names if names is not None else sorted(svc.model.index)
    return svc.filter(parse_extender_args({"Pod": p, "NodeNames": names}))


def scores(svc, p, names=None):
    names = names if names is not None else sorted(svc.model.index)
    return {h["Host"]: h["Score"] for h in svc.prioritize(parse_extender_args({"Pod": p, "NodeNames": names}))}


def bind(svc, p, node):
    """filter (as kube-scheduler always does first), then bind to ``node``."""
    run_filter(svc, p)
    m = p["metadata"]
    return svc.bind(BindingArgs(m["name"], m["namespace"], m["uid"], node))


def service(nodes, **kw):
    kw.setdefault("placer_factory", simple_placers)
    return ExtenderService(model_from({"nodes": nodes}), **kw)


# ------------------------------------------------------------------------------------- reasons
def test_reason_too_few_free_cards():
    svc = service([{"name": "n", "gpus": gpus("NVIDIA A100-SXM4-80GB", 4, "80Gi")}])
    take_whole(svc.model, "n", [0, 1], "x")
    res = run_filter(svc, pod("p", {"nvidia.com/gpu": "4"}))
    assert res.failed == {"n": "too few free cards for 4 GPUs: 2 free"} and res.unresolvable == {}


def test_reason_too_many_gpus_for_node_is_unresolvable():
    svc = service([{"name": "n", "gpus": gpus("Tesla T4", 2, "16Gi", unhealthy=[1])}])
    res = run_filter(svc, pod("p", {"nvidia.com/gpu": "2"}))
    assert res.unresolvable == {"n": "too few free cards for 2 GPUs: 1 free (1 unhealthy)"}


def test_reason_best_card_memory():
    """Filter says the cause; a bind refused on the one node says that node's best card too."""
    svc = service([{"name": "n", "gpus": gpus("NVIDIA A10", 4, "24Gi")}])
    for k, used in enumerate([20, 16, 24, 12]):
        take_shared(svc.model, "n", k, used * GIB, f"s{k}")
    p = pod("p", {"nvidia.com/gpu-memory": "20"})
    res = run_filter(svc, p)
    # Resolvable: the cards are big enough, only occupied (preemption could help).
    assert res.failed == {"n": "no card with 20 GiB GPU memory free"}
    assert bind(svc, p, "n") == ("cannot bind default/p to n now: no card with 20 GiB GPU memory free: "
                                 "best is 12 GiB on card 3")


def test_reason_compute():
    svc = service([{"name": "n", "gpus": gpus("NVIDIA L4", 2, "24Gi")}])
    take_shared(svc.model, "n", 0, 4 * GIB, "a", core_milli=700)
    take_shared(svc.model, "n", 1, 4 * GIB, "b", core_milli=900)
    p = pod("p", {"nvidia.com/gpu-memory": "4", "nvidia.com/gpu-core": "50"})
    res = run_filter(svc, p)
    assert res.failed == {"n": "no card with 50% compute free and 4 GiB memory"}
    assert bind(svc, p, "n").endswith("now: no card with 50% compute free and 4 GiB memory: best is 30% on card 0")


def test_filter_reasons_add_up_across_nodes_as_kube_scheduler_counts_them():
    """kube-scheduler's 'N reason' message counts nodes per distinct text. Each node's own numbers
    (free CPU, best card) in the text made every node its own entry: on the openb cluster a
    failing slice got 78 entries of '1 no card with ... best is 130 MiB on card 1' (5 KB in its
    PodScheduled condition). Nodes failing for the same cause must give the same text."""
    nodes = [{"name": f"n{i}", "gpus": gpus("NVIDIA A10", 4, "24Gi")} for i in range(6)]
    svc = service(nodes)
    for i, cpu in ((4, 1500.0), (5, 700.0)):  # two nodes short of CPU, by different amounts
        svc.model.upsert_node(f"n{i}", Inventory(cards=tuple(svc.model.cards_of(f"n{i}")), source="annotation"),
                              cpu_milli=cpu)
    for i in range(5):                  # every card of n0..n4 partly used, each node differently
        for k in range(4):
            take_shared(svc.model, f"n{i}", k, (10 + i + k) * GIB, f"s{i}{k}", core_milli=100 * (i + k + 1))
    four = [f"n{i}" for i in range(4)]
    res = run_filter(svc, pod("p", {"nvidia.com/gpu-memory": "20"}), four)
    assert res.failed == dict.fromkeys(four, "no card with 20 GiB GPU memory free")
    res = run_filter(svc, pod("q", {"nvidia.com/gpu-memory": "4", "nvidia.com/gpu-core": "95"}), four)
    assert res.failed == dict.fromkeys(four, "no card with 95% compute free and 4 GiB memory")
    res = run_filter(svc, pod("r", {"nvidia.com/gpu": "1", "cpu": "2"}), ["n4", "n5"])
    assert res.failed == dict.fromkeys(["n4", "n5"], "too little CPU free for the 2000m the pod needs")
    # one node at a time (a bind refused), its own numbers are said
    assert bind(svc, pod("r2", {"nvidia.com/gpu": "1", "cpu": "2"}), "n5").endswith(
        "now: too little CPU free: 700m of the 2000m the pod needs")


def test_reason_node_without_gpus():
    svc = service([{"name": "cpu"}, {"name": "g", "gpus": gpus("NVIDIA L4", 1, "24Gi")}])
    res = run_filter(svc, pod("p", {"nvidia.com/gpu": "1"}))
    assert res.node_names == ["g"] and res.unresolvable == {"cpu": "node has no GPUs"}


# ------------------------------------------------------------------------------ model matching
MIXED = [
    {"name": "a10", "gpus": gpus("NVIDIA A10", 4, "24Gi")},
    {"name": "a100", "gpus": gpus("NVIDIA A100-SXM4-80GB", 4, "80Gi")},
    {"name": "a100-40", "gpus": gpus("NVIDIA A100-PCIE-40GB", 4, "40Gi")},
    {"name": "t4", "gpus": gpus("Tesla T4", 4, "16Gi")},
]


@pytest.mark.parametrize("annotations,expect", [
    ({"stowage.io/gpu-model": "A10"}, ["a10"]),
    ({"stowage.io/gpu-model": "a100"}, ["a100", "a100-40"]),
    ({"stowage.io/gpu-model": "A100-SXM4"}, ["a100"]),
    ({"stowage.io/gpu-model": "T4, A10"}, ["a10", "t4"]),
    ({"stowage.io/gpu-model-exclude": "A100"}, ["a10", "t4"]),
    ({"stowage.io/gpu-model": "A1"}, []),
    ({"stowage.io/min-card-memory": "40Gi"}, ["a100", "a100-40"]),
    ({"stowage.io/min-card-memory": "80"}, ["a100"]),
    ({"stowage.io/gpu-model": "A100", "stowage.io/min-card-memory": "64Gi"}, ["a100"]),
])
def test_model_and_size_selection(annotations, expect):
    svc = service(MIXED)
    res = run_filter(svc, pod("p", {"nvidia.com/gpu": "1"}, annotations))
    assert sorted(res.node_names) == expect
    # Nodes whose cards are all excluded can never take the pod: unresolvable, with the count.
    assert set(res.unresolvable) == {n["name"] for n in MIXED} - set(expect)
    for node, why in res.unresolvable.items():
        assert why == "too few free cards for 1 GPU: 0 free (4 excluded by model/size policy)"


def test_a10_pod_never_lands_on_a100_even_when_only_a100_is_free():
    svc = service(MIXED)
    take_whole(svc.model, "a10", [0, 1, 2, 3], "full")
    p = pod("p", {"nvidia.com/gpu": "1"}, {"stowage.io/gpu-model": "A10"})
    res = run_filter(svc, p)
    assert res.node_names == [] and res.failed == {"a10": "too few free cards for 1 GPU: 0 free"}
    err = bind(svc, p, "a100")
    assert err.startswith("cannot bind default/p to a100 now: too few free cards for 1 GPU: 0 free (4 excluded")
    assert "p" not in svc.model.allocations


def test_gpu_memory_with_gpu_is_a_card_size_floor():
    svc = service(MIXED)
    p = pod("p", {"nvidia.com/gpu": "2", "nvidia.com/gpu-memory": "30"})
    assert sorted(run_filter(svc, p).node_names) == ["a100", "a100-40"]
    assert bind(svc, p, "a100-40") == ""
    al = svc.model.allocations["p"]
    assert al.whole and al.mem_mib == (40 * GIB, 40 * GIB)  # whole cards hold all their memory


def test_memory_unit_is_configurable():
    svc = service(MIXED, memory_unit_mib=512)
    p = pod("p", {"nvidia.com/gpu-memory": "40"})  # 40 x 512 MiB = 20 GiB
    assert "t4" in run_filter(svc, p).unresolvable
    assert bind(svc, p, "a10") == ""
    assert svc.model.allocations["p"].mem_mib == (20 * GIB,)


# ------------------------------------------------------------------------------ topology
TOPO = [{"name": "n", "gpus": gpus("NVIDIA A100-SXM4-80GB", 8, "80Gi", numa=[0, 0, 0, 0, 1, 1, 1, 1],
                                    nvlink=[[0, 1, 2, 3], [4, 5, 6, 7]])}]


def test_multi_gpu_pod_stays_in_one_nvlink_group():
    svc = service(TOPO)
    take_whole(svc.model, "n", [1], "x")
    p4 = pod("p4", {"nvidia.com/gpu": "4"})
    assert bind(svc, p4, "n") == ""
    assert svc.model.allocations["p4"].cards == (4, 5, 6, 7)  # the intact group, not 0,2,3,4
    p2 = pod("p2", {"nvidia.com/gpu": "2"})
    assert bind(svc, p2, "n") == ""
    cards = set(svc.model.allocations["p2"].cards)
    assert cards <= {0, 2, 3} and len(cards) == 2


def test_topology_any_takes_cards_in_index_order():
    svc = service(TOPO)
    take_whole(svc.model, "n", [1], "x")
    p4 = pod("p4", {"nvidia.com/gpu": "4"}, {"stowage.io/gpu-topology": "any"})
    assert bind(svc, p4, "n") == ""
    assert svc.model.allocations["p4"].cards == (0, 2, 3, 4)


def test_numa_preference_without_nvlink():
    svc = service([{"name": "n", "gpus": gpus("NVIDIA A10", 4, "24Gi", numa=[0, 0, 1, 1])}])
    take_whole(svc.model, "n", [0], "x")
    p = pod("p", {"nvidia.com/gpu": "2"})
    assert bind(svc, p, "n") == ""
    assert svc.model.allocations["p"].cards == (2, 3)  # same NUMA node, not 1 + 2


def test_single_gpu_pack_keeps_big_domains_whole():
    svc = service(TOPO)
    take_whole(svc.model, "n", [0, 1, 2], "x")
    p = pod("p", {"nvidia.com/gpu": "1"})
    assert bind(svc, p, "n") == ""
    assert svc.model.allocations["p"].cards == (3,)  # the last card of the broken domain


def test_shared_pods_pack_onto_shared_cards_or_spread():
    svc = service([{"name": "n", "gpus": gpus("NVIDIA L4", 4, "24Gi")}])
    take_shared(svc.model, "n", 2, 8 * GIB, "x")
    assert bind(svc, pod("a", {"nvidia.com/gpu-memory": "4"}), "n") == ""
    assert svc.model.allocations["a"].cards == (2,)
    b = pod("b", {"nvidia.com/gpu-memory": "4"}, {"stowage.io/card-policy": "spread"})
    assert bind(svc, b, "n") == ""
    assert svc.model.allocations["b"].cards[0] != 2


# ------------------------------------------------------------------------------- prioritize
def test_pack_and_spread_rank_opposite():
    nodes = [{"name": "busy", "gpus": gpus("NVIDIA L4", 4, "24Gi")},
             {"name": "idle", "gpus": gpus("NVIDIA L4", 4, "24Gi")},
             {"name": "full", "gpus": gpus("NVIDIA L4", 4, "24Gi")}]
    svc = service(nodes)
    take_whole(svc.model, "busy", [0, 1], "x")
    take_whole(svc.model, "full", [0, 1, 2, 3], "y")
    p = pod("p", {"nvidia.com/gpu": "1"})
    s = scores(svc, p)
    # By rank: the best feasible node 10, the next 9; a node that cannot take the pod 0.
    assert s == {"busy": 10, "idle": 9, "full": 0}
    s = scores(svc, pod("q", {"nvidia.com/gpu": "1"}, {"stowage.io/node-policy": "spread"}))
    assert s == {"busy": 9, "idle": 10, "full": 0}
    spread_default = service(nodes, default_policy=PodPolicy(node="spread"))
    take_whole(spread_default.model, "busy", [0, 1], "x")
    assert scores(spread_default, pod("r", {"nvidia.com/gpu": "1"}))["idle"] == 10


def test_prioritize_with_default_placer_scores_only_feasible_nodes():
    """Whatever placer serves 'pack' today, infeasible nodes score 0 and the best gets 10."""
    svc = ExtenderService(model_from({"nodes": MIXED}))
    take_whole(svc.model, "a100", [0, 1, 2], "x")
    s = scores(svc, pod("p", {"nvidia.com/gpu": "2"}), ["a10", "a100", "t4", "ghost"])
    assert s["a100"] == 0 and s["ghost"] == 0
    assert max(s.values()) == 10 and all(0 <= v <= 10 for v in s.values())


def test_placers_observe_each_new_pod_once():
    seen = []

    from packing.placer import PlacerBase

    class Watching(PlacerBase):
        name = "watching"

        def __init__(self, value):
            self.value = value
            self.inner = simple_placers(value)

        def score(self, *a):
            return self.inner.score(*a)

        def choose_cards(self, *a):
            return self.inner.choose_cards(*a)

        def observe(self, req, models=()):
            seen.append((self.value, req.gpus, req.mem_mib))

    svc = service(MIXED, placer_factory=Watching)
    p = pod("p", {"nvidia.com/gpu": "2"})
    run_filter(svc, p)
    run_filter(svc, p)
    scores(svc, p)
    assert bind(svc, p, "a100") == ""
    run_filter(svc, pod("q", {"nvidia.com/gpu-memory": "3"}))
    run_filter(svc, pod("r", {"cpu": "1"}))  # no GPU: part of the workload mix all the same (as in the benchmark)
    assert sorted(seen) == sorted([("pack", 2, 0), ("spread", 2, 0), ("pack", 0, 3 * GIB), ("spread", 0, 3 * GIB),
                                   ("pack", 0, 0), ("spread", 0, 0)])


def test_extender_scores_keep_the_placers_order_across_tiers():
    """A placer scoring in tiers (a 1e5 cost on opening an empty node beside tiny fragmentation
    deltas) still gets its best node strictly first: scores go by rank, not a linear stretch."""
    import numpy as np

    from packing.decide import to_extender_scores

    raw = np.array([-1e5 - 0.5, 0.003, 0.001, -1e5, 0.002, 0.003])
    assert to_extender_scores(raw).tolist() == [6, 10, 8, 7, 9, 10]
    many = np.arange(5000, dtype=float)
    s = to_extender_scores(many)
    assert s[-1] == 10 and s[-11] == 0 and (s[:-11] == 0).all() and s[-10] == 1
    assert to_extender_scores(np.array([3.0, 3.0])).tolist() == [10, 10]
    assert to_extender_scores(np.array([])).tolist() == []


def test_best_mask_is_exactly_the_nodes_ranked_10():
    """The keep-best filter takes ``best_mask`` instead of ranking every fitting node: it must be
    the very set prioritize scores 10, ties to 1e-9 (float noise), NaN (the worst) and -inf included."""
    import numpy as np

    from packing.decide import best_mask, to_extender_scores

    rng = np.random.default_rng(7)
    cases = [np.array([]), np.array([np.nan]), np.array([np.nan, np.nan]), np.array([-np.inf, np.nan]),
             np.array([1.0, 1.0 + 1e-12, 1.0 - 1e-12, 0.5]), np.array([-1e5 - 0.5, 0.003, 0.001, -1e5, 0.003])]
    for _ in range(300):
        n = int(rng.integers(1, 60))
        raw = rng.choice([0.0, 1.0, 2.5, -3.0, 1e5], n) + rng.choice([0.0, 1e-11, -1e-11, 0.1], n)
        raw[rng.random(n) < 0.1] = np.nan
        raw[rng.random(n) < 0.05] = -np.inf
        cases.append(raw)
    with np.errstate(over="ignore"):  # rounding -inf to 1e-9 says it overflowed; the value stays -inf
        for raw in cases:
            assert (best_mask(raw) == (to_extender_scores(raw) == 10)).all(), raw
