"""packing.preempt: which of kube-scheduler's proposed victims must go, worked out by hand on
small nodes (the what-if runs on a copy of the node's row; the model is never changed)."""
from __future__ import annotations

import numpy as np
import pytest

from packing.model import ClusterModel
from packing.pod_policy import PodPolicy
from packing.preempt import (Counts, Holder, Nominee, choose_victims, judge_node, pdb_violations, row_copy,
                             scheduler_free)
from stowage.resources import GpuRequest

from planning_clusters import GiB, add_node

P = PodPolicy()
SLICE20 = GpuRequest(mem_mib=20 * GiB)


def two_by_24(prios: dict[str, int] | None = None) -> ClusterModel:
    """Node n: 2 x 24 GiB cards; card 0 holds a (12 GiB) and b (12 GiB), card 1 holds c and d."""
    m = ClusterModel()
    add_node(m, "n", 2, 24, "L4")
    for uid, card in (("a", 0), ("b", 0), ("c", 1), ("d", 1)):
        m.assign(uid, f"ns/{uid}", "n", [card], GpuRequest(mem_mib=12 * GiB))
    return m


def snapshot(m: ClusterModel) -> tuple:
    return (m.a.mem_free.copy(), m.a.core_free.copy(), m.a.pods.copy(), dict(m.allocations))


def test_victims_on_one_card_free_it_and_are_kept():
    m = two_by_24()
    before = snapshot(m)
    v = judge_node(m, "n", SLICE20, P, ["a", "b"], {"a": 1, "b": 1})
    assert v.victims == ("a", "b")
    after = snapshot(m)
    assert all(np.array_equal(x, y) for x, y in zip(before[:3], after[:3])) and before[3] == after[3]


def test_victims_spread_over_cards_free_no_card_and_the_node_is_dropped():
    m = two_by_24()
    v = judge_node(m, "n", SLICE20, P, ["a", "c"], {})
    assert v.victims is None and "would not free" in v.why


def test_smallest_subset_lowest_priority_first():
    # A 40 GiB card holds a (10) b (10) c (20); the pod needs 20: evicting c alone or a+b does.
    m = ClusterModel()
    add_node(m, "n", 1, 40, "A100")
    m.assign("a", "ns/a", "n", [0], GpuRequest(mem_mib=10 * GiB))
    m.assign("b", "ns/b", "n", [0], GpuRequest(mem_mib=10 * GiB))
    m.assign("c", "ns/c", "n", [0], GpuRequest(mem_mib=20 * GiB))
    assert judge_node(m, "n", SLICE20, P, ["a", "b", "c"], {"a": 1, "b": 1, "c": 5}).victims == ("c",)
    # 10 GiB: one pod does; the lowest priority one
    v = judge_node(m, "n", GpuRequest(mem_mib=10 * GiB), P, ["a", "b", "c"], {"a": 3, "b": 2, "c": 5})
    assert v.victims == ("b",)


def test_subset_must_still_free_the_schedulers_count():
    # Card 0 holds x (8 GiB), card 1 y (24 GiB); the pod needs 20 GiB on one card.
    m = ClusterModel()
    add_node(m, "n", 2, 24, "L4")
    m.assign("x", "ns/x", "n", [0], GpuRequest(mem_mib=8 * GiB))
    m.assign("y", "ns/y", "n", [1], GpuRequest(mem_mib=24 * GiB))
    # scheduler count: 48 - 32 = 16 free, needs 4 more; freeing x (8) makes card 0 free (24)
    assert judge_node(m, "n", SLICE20, P, ["x", "y"], {}).victims == ("x",)
    # a scheduler count that needs 28 GiB freed (e.g. pods Stowage does not know hold 8 GiB):
    # neither victim alone frees that, so both go although one card would do
    row = row_copy(m.a, m.index["n"])
    hx = Holder("x", cards=(0,), mem_mib=(8 * GiB,), core_milli=(0,))
    hy = Holder("y", cards=(1,), mem_mib=(24 * GiB,), core_milli=(0,))
    v = choose_victims(row, m.models, SLICE20, P, [hx, hy], Counts(mem_mib=-8 * GiB))
    assert v.victims == ("x", "y")


def test_wrong_model_node_is_dropped():
    m = two_by_24()
    v = judge_node(m, "n", SLICE20, PodPolicy(models_include=("H100",)), ["a", "b", "c", "d"], {})
    assert v.victims is None


def test_victims_without_cards_are_always_kept_and_unknown_node_dropped():
    m = two_by_24()
    v = judge_node(m, "n", SLICE20, P, ["cpu-only", "a", "b"], {})
    assert v.victims == ("cpu-only", "a", "b")
    assert judge_node(m, "gone", SLICE20, P, ["a"], {}).victims is None


def test_cards_need_nothing_gone_keeps_the_schedulers_set():
    m = two_by_24()
    m.release("c")
    m.release("d")
    # card 1 is empty: the cards need no eviction, the scheduler proposed a for other reasons
    assert judge_node(m, "n", SLICE20, P, ["a"], {}).victims == ("a",)


def test_whole_gpu_preemptor():
    m = ClusterModel()
    add_node(m, "n", 2, 80, "A100")
    m.assign("s1", "ns/s1", "n", [0], GpuRequest(mem_mib=10 * GiB))
    m.assign("s2", "ns/s2", "n", [1], GpuRequest(mem_mib=10 * GiB))
    m.assign("s3", "ns/s3", "n", [1], GpuRequest(mem_mib=10 * GiB))
    assert judge_node(m, "n", GpuRequest(gpus=1), P, ["s1", "s2", "s3"], {"s1": 3, "s2": 1, "s3": 1}).victims == ("s1",)
    assert judge_node(m, "n", GpuRequest(gpus=1), P, ["s1", "s2", "s3"], {"s1": 1, "s2": 3, "s3": 3}).victims == ("s1",)
    assert judge_node(m, "n", GpuRequest(gpus=2), P, ["s1", "s2"], {}).victims is None


def test_nominated_higher_priority_pod_keeps_its_card():
    m = two_by_24()
    nom = Nominee("big", "ns/big", 100, GpuRequest(mem_mib=20 * GiB), P)
    # after a+b go, card 0 is free, but the nominee takes it: evicting a+b no longer helps
    assert judge_node(m, "n", SLICE20, P, ["a", "b"], {}, [nom]).victims is None
    assert judge_node(m, "n", SLICE20, P, ["a", "b", "c", "d"], {}, [nom]).victims == ("a", "b", "c", "d")


def test_budget_falls_back_to_greedy_and_stays_a_subset():
    m = ClusterModel()
    add_node(m, "n", 1, 80, "A100")
    uids = [f"p{j}" for j in range(16)]
    for u in uids:
        m.assign(u, f"ns/{u}", "n", [0], GpuRequest(mem_mib=5 * GiB))
    prio = {u: j for j, u in enumerate(uids)}
    v = judge_node(m, "n", GpuRequest(mem_mib=30 * GiB), P, uids, prio, budget=20)
    assert v.victims is not None and set(v.victims) <= set(uids)
    assert len(v.victims) == 6 and set(v.victims) == set(uids[:6])  # the six lowest priorities
    exact = judge_node(m, "n", GpuRequest(mem_mib=30 * GiB), P, uids, prio)
    assert set(exact.victims) == set(uids[:6])


def test_scheduler_free_counts_healthy_cards_and_holders():
    m = two_by_24()
    m.assign("w", "ns/w", "n", [1], GpuRequest(gpus=1), check=False)
    i = m.index["n"]
    free = scheduler_free(m.a, i, [Holder("w", cards=(1,), whole=True)])
    assert free == Counts(gpus=1, mem_mib=48 * GiB, core_milli=2000)


@pytest.mark.parametrize("reported,kept,expected", [(0, 3, 0), (2, 3, 2), (5, 2, 2), (-1, 2, 0)])
def test_pdb_violations_bound(reported, kept, expected):
    assert pdb_violations(reported, kept) == expected
