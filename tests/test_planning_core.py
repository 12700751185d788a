"""stowage_ops.planning on small hand-built clusters whose answers are worked out by hand."""
from __future__ import annotations

import numpy as np
import pytest

from packing.pod_policy import PodPolicy
from stowage_ops.planning import (ShapeError, capacity, drain_plan, fill_random, fragmentation, parse_shape,
                              typical_shapes, Shape)
from stowage.resources import GpuRequest

from planning_clusters import GiB, add_node, mixed_cluster, uniform_cluster
from packing.model import ClusterModel


# ----------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("text,req,models", [
    ("4", GpuRequest(gpus=4), ()),
    ("1x80Gi", GpuRequest(gpus=1, min_card_mem_mib=80 * GiB), ()),
    ("2 x 40GiB", GpuRequest(gpus=2, min_card_mem_mib=40 * GiB), ()),
    ("10Gi", GpuRequest(mem_mib=10 * GiB), ()),
    ("512Mi", GpuRequest(mem_mib=512), ()),
    ("10Gi,30%", GpuRequest(mem_mib=10 * GiB, core_milli=300), ()),
    ("10Gi, 100%@T4", GpuRequest(mem_mib=10 * GiB, core_milli=1000), ("T4",)),
    ("1@A100|H100", GpuRequest(gpus=1), ("A100", "H100")),
])
def test_parse_shape_grammar(text, req, models):
    s = parse_shape(text)
    assert s.req == req
    assert s.policy.models_include == models


@pytest.mark.parametrize("text,needle", [
    ("", "empty"),
    ("0", "at least 1"),
    ("10", None),  # a bare number is a GPU count, not an error
    ("10G,", "percentage"),
    ("10Gi,30", "percentage"),
    ("10Gi,0%", "1-100"),
    ("10Gi,150%", "1-100"),
    ("1x80", "unit"),
    ("1x", "after 'x'"),
    ("x80Gi", "count before"),
    ("ten", "not a memory quantity"),
    ("1@", "after '@'"),
])
def test_parse_shape_errors_are_clear(text, needle):
    if needle is None:
        assert parse_shape(text).req.gpus == 10
        return
    with pytest.raises(ShapeError) as exc:
        parse_shape(text)
    assert needle in str(exc.value)


# ----------------------------------------------------------------------------- capacity
@pytest.mark.parametrize("shape,count,per_node", [
    # whole cards: 3 free on a, 3 on b (card 0 is shared), 2 on c
    ("1", 8, {"a": 3, "b": 3, "c": 2}),
    ("1x80Gi", 3, {"a": 3}),
    ("1x40Gi", 6, {"a": 3, "b": 3}),
    ("4", 0, {}),
    ("2", 3, {"a": 1, "b": 1, "c": 1}),
    # 10 GiB slices: a 3 cards x 8; b card0 30 GiB left -> 3, plus 3 x 4; c 2 x 1
    ("10Gi", 41, {"a": 24, "b": 15, "c": 2}),
    # with 30 % compute each: 3 per empty card, 2 on b's card 0 (70 % left)
    ("10Gi,30%", 22, {"b": 11, "a": 9, "c": 2}),
    ("20Gi@T4", 0, {}),
    ("1@A100", 6, {"a": 3, "b": 3}),
])
def test_capacity_known_answers(shape, count, per_node):
    m = mixed_cluster()
    res = capacity(m, parse_shape(shape))
    assert res.count == count
    assert res.per_node == per_node
    assert not res.limited
    assert sum(res.per_node.values()) == len(res.placements)


def test_capacity_never_touches_the_live_model():
    m = mixed_cluster()
    gen, before = m.generation, m.a.mem_free.copy()
    capacity(m, parse_shape("10Gi"))
    drain_plan(m)
    fragmentation(m)
    assert m.generation == gen
    assert np.array_equal(m.a.mem_free, before)
    assert set(m.allocations) == {"u1", "u2"}


def test_capacity_limit_reports_at_least():
    res = capacity(mixed_cluster(), parse_shape("512Mi"), limit=5)
    assert res.count == 5 and res.limited and res.why_not == {}


def test_capacity_explains_why_nothing_more_fits():
    res = capacity(mixed_cluster(), parse_shape("4"))
    assert res.count == 0
    assert sum(res.why_not.values()) == 3
    assert any("too few free cards for 4 GPUs" in k for k in res.why_not)


def test_capacity_skips_unhealthy_cards():
    m = ClusterModel()
    add_node(m, "x", 4, 40, "L40S", healthy=(True, False, True, False))
    assert capacity(m, parse_shape("1")).count == 2
    assert capacity(m, parse_shape("2")).count == 1


def test_capacity_placements_follow_the_placer():
    # pack fills the most-allocated node first, spread the least-allocated one
    m = uniform_cluster({"n1": 1, "n2": 3})
    packed = capacity(m, parse_shape("1"), placer="most-allocated")
    spread = capacity(m, parse_shape("1"), placer="least-allocated")
    assert packed.count == spread.count == 4
    assert packed.placements[0][0] == "n2"
    assert spread.placements[0][0] == "n1"


# ----------------------------------------------------------------------------- drain
def test_drain_moves_the_single_pod_onto_the_fullest_node():
    plan = drain_plan(uniform_cluster({"n1": 1, "n2": 2, "n3": 3}), placer="most-allocated")
    assert [d.node for d in plan.drained] == ["n1"]
    assert [(mv.pod, mv.source, mv.target) for mv in plan.moves] == [("ns/n1-p0", "n1", "n3")]
    assert plan.gpus_freed == 4
    assert "no room" in plan.kept["n2"]


def test_drain_two_nodes_into_a_third():
    plan = drain_plan(uniform_cluster({"n1": 1, "n2": 1, "n3": 2}), placer="most-allocated")
    assert [d.node for d in plan.drained] == ["n1", "n2"]
    assert {mv.target for mv in plan.moves} == {"n3"}
    assert len(plan.moves) == 2 and plan.gpus_freed == 8
    js = plan.to_json()
    assert js["nodesFreed"] == 2 and js["podsToMove"] == 2


def test_drain_uses_the_placer_it_is_given():
    # spread sends n1's pod to n2 (least allocated), then n3's two pods also fit on n2
    plan = drain_plan(uniform_cluster({"n1": 1, "n2": 1, "n3": 2}), placer="least-allocated")
    assert [d.node for d in plan.drained] == ["n1", "n3"]
    assert len(plan.moves) == 3
    assert plan.kept["n2"].startswith("receives")


def test_drain_empty_nodes_first_and_free():
    plan = drain_plan(uniform_cluster({"e": 0, "full": 4}))
    assert [d.node for d in plan.drained] == ["e"]
    assert plan.drained[0].moves == []


def test_drain_respects_card_model_and_size():
    m = ClusterModel()
    add_node(m, "t4", 2, 16, "T4")
    add_node(m, "big", 4, 80, "A100-SXM4-80GB")
    add_node(m, "small", 4, 40, "A100-PCIE-40GB")
    m.assign("s", "ns/slice", "t4", [0], GpuRequest(mem_mib=8 * GiB, core_milli=200))
    m.assign("w", "ns/whole", "big", [0], GpuRequest(gpus=1))
    m.assign("f", "ns/filler", "small", [0], GpuRequest(gpus=1))
    strict = drain_plan(m)
    assert strict.drained == []  # no other T4, no other 80 GiB, no other 40 GiB card
    loose = drain_plan(m, keep_model=False)
    # t4 first (lightest), its slice goes to the fullest node with room; big then receives
    assert [d.node for d in loose.drained] == ["t4", "small"]
    assert {mv.pod: mv.target for mv in loose.moves} == {"ns/slice": "big", "ns/filler": "big"}


def test_drain_never_moves_a_whole_pod_to_a_smaller_card():
    m = ClusterModel()
    add_node(m, "big", 4, 80, "A100")
    add_node(m, "small", 4, 40, "A100")
    m.assign("w", "ns/whole", "big", [0], GpuRequest(gpus=1))
    for k in range(3):
        m.assign(f"f{k}", f"ns/f{k}", "small", [k], GpuRequest(gpus=1))
    plan = drain_plan(m, keep_model=False)
    assert "no room on the nodes that stay for ns/whole" in plan.kept["big"]
    assert [d.node for d in plan.drained] == ["small"]
    assert {mv.target for mv in plan.moves} == {"big"} and len(plan.moves) == 3


def test_drain_max_nodes():
    plan = drain_plan(uniform_cluster({"e1": 0, "e2": 0, "e3": 0}), max_nodes=2)
    assert len(plan.drained) == 2


# ----------------------------------------------------------------------------- fragmentation
def test_fragmentation_strands_a_share_no_typical_shape_can_use():
    m = ClusterModel()
    add_node(m, "n", 2, 40, "A100-PCIE-40GB")
    m.assign("p", "ns/p", "n", [0], GpuRequest(mem_mib=10 * GiB, core_milli=700))
    frag = fragmentation(m)  # typical: 1 whole GPU, 10 GiB + 70 %
    assert frag.free[0, 0] == 300 and frag.stranded[0, 0] == 300
    assert frag.free[0, 1] == 1000 and frag.stranded[0, 1] == 0
    assert frag.cluster_pct == pytest.approx(100 * 300 / 1300)
    small = Shape(text="10Gi,30%", req=GpuRequest(mem_mib=10 * GiB, core_milli=300))
    assert fragmentation(m, [small]).stranded[0, 0] == 0


def test_typical_shapes_follow_running_pods():
    shapes = typical_shapes(mixed_cluster())
    reqs = [s.req for s in shapes]
    assert GpuRequest(gpus=1) in reqs
    assert GpuRequest(mem_mib=10 * GiB, core_milli=300) in reqs


def test_fill_random_places_a_seeded_mix_consistently():
    def run():
        m = uniform_cluster({f"n{i}": 0 for i in range(6)}, ncards=8, mem_gib=80, model="H100")
        return m, fill_random(m, 40, seed=7)
    m1, placed1 = run()
    m2, placed2 = run()
    assert placed1 == placed2 > 0
    assert {u: (a.node, a.cards) for u, a in m1.allocations.items()} == \
           {u: (a.node, a.cards) for u, a in m2.allocations.items()}
    assert int(m1.a.pods.sum()) == sum(len(a.cards) for a in m1.allocations.values())
    assert (m1.a.mem_free >= 0).all() and (m1.a.core_free >= 0).all()


def with_cpu_pods(m: ClusterModel, pods: dict[str, str]) -> ClusterModel:
    """Add pods that hold no cards (uid -> node), 1 CPU and 2 GiB each, as the watch records a
    CPU-only pod, a DaemonSet pod or another scheduler's GPU pod."""
    for uid, node in pods.items():
        m.assign(uid, f"ns/{uid}", node, (), GpuRequest(cpu_milli=1000, host_mem_mib=2 * GiB), check=False)
    return m


def test_drain_moves_pods_without_cards_too():
    """Found by review: a node running a pod without cards made `plan --drain` crash
    (``max()`` of an empty sequence); such a pod must leave the node like the others."""
    m = with_cpu_pods(uniform_cluster({"n1": 1, "n2": 2, "n3": 3}), {"cpu1": "n1"})
    plan = drain_plan(m, placer="most-allocated")
    assert [d.node for d in plan.drained] == ["n1"]
    moved = {mv.pod: mv for mv in plan.moves}
    assert set(moved) == {"ns/n1-p0", "ns/cpu1"}
    assert moved["ns/cpu1"].target_cards == () and moved["ns/cpu1"].shape == "no GPU; 1 CPU, 2 GiB memory"
    assert moved["ns/cpu1"].target in ("n2", "n3")


def test_drain_leaves_daemonset_pods_with_their_node():
    m = with_cpu_pods(uniform_cluster({"e": 0, "n1": 1, "full": 4}), {"ds-e": "e", "ds-n1": "n1", "ds-full": "full"})
    plan = drain_plan(m, placer="most-allocated", stays={"ds-e", "ds-n1", "ds-full"})
    # e holds only its DaemonSet pod: empty, nothing to move (without ``stays`` it would move it)
    assert plan.drained[0].node == "e" and plan.drained[0].moves == []
    assert not any(mv.pod.startswith("ns/ds-") for mv in plan.moves)


def test_drain_never_empties_a_node_running_gpu_pods_it_does_not_know():
    m = with_cpu_pods(uniform_cluster({"n1": 0, "n2": 1, "n3": 1}), {"other": "n1"})
    plan = drain_plan(m, placer="most-allocated", unrecorded={"other": "n1"})
    assert "n1" not in [d.node for d in plan.drained]
    assert "without Stowage's record" in plan.kept["n1"]
    assert not any(mv.pod == "ns/other" for mv in plan.moves)


def test_typical_shapes_are_gpu_shapes_only():
    m = with_cpu_pods(mixed_cluster(), {"cpu1": "a", "cpu2": "b"})
    assert all(s.req.is_gpu for s in typical_shapes(m))


def test_a_model_no_card_has_is_named():
    from stowage_ops.planning import unmatched_models
    m = mixed_cluster()
    assert unmatched_models(m, ("Z9000", "A100", "T4", "A10")) == ["Z9000", "A10"]
