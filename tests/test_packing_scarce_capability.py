"""Capability pressure: pods that could go anywhere leave alone the few nodes that can host a
big class at all (issue 15, the multi-GPU-heavy variants).

Hand-made clusters where the right answer is known: two 8-card nodes of the same model, one
"big" (128 cores, 768 GiB) and one "small" (96 cores, 384 GiB), and a learned workload in
which 8-GPU pods asking for 120 cores and 720 GiB (only the big node can ever host them) are a
large share of the GPU demand. A 1-GPU pod, or a memory-hungry CPU-only pod, must go to the
small node whatever the tie order, so that the big 8-GPU pod that comes next still fits. The
stranding term alone pulls memory-hungry pods to the big node (more host memory per GPU), and
the fragmentation score does not see that the small node can never host the big class: the
same arrivals without the capability pressure fail.
"""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.binpack.replay import build_cluster
from benchmarks.binpack.trace import Nodes
from packing.model import ClusterModel
from packing.placer import attach_placer
from packing.registry import get_placer
from stowage.resources import GpuRequest

from tests.test_packing_scarce_models import ANY, place_all

BIG8 = GpuRequest(gpus=8, cpu_milli=120_000, host_mem_mib=737_280)
ONE = GpuRequest(gpus=1, cpu_milli=8_000, host_mem_mib=32_768)
SHARE = GpuRequest(mem_mib=500, core_milli=500, cpu_milli=4_000, host_mem_mib=16_384)
HUNGRY_CPU = GpuRequest(cpu_milli=8_000, host_mem_mib=153_600)   # CPU-only, 150 GiB
TIES = [np.array([0, 1]), np.array([1, 0])]
TIE_IDS = ["big-first", "small-first"]


def big_and_small() -> ClusterModel:
    return build_cluster(Nodes(names=("big", "small"), cpu_milli=np.array([128_000, 96_000]),
                               memory_mib=np.array([786_432, 393_216]), gpus=np.array([8, 8]),
                               model=("G3", "G3")))


def history(n: int = 12):
    """A third of the pods seen are big 8-GPU pods (8 of every 10 GPUs asked), the rest 1-GPU."""
    return [(BIG8 if k % 3 == 0 else ONE, ANY) for k in range(n)]


@pytest.mark.parametrize("name", ["stowage", "stowage-frag"])
@pytest.mark.parametrize("tie", TIES, ids=TIE_IDS)
@pytest.mark.parametrize("first", [ONE, SHARE, HUNGRY_CPU], ids=["one-gpu", "share", "hungry-cpu"])
def test_a_pod_that_fits_anywhere_leaves_the_only_node_a_big_class_fits(name, tie, first):
    got = place_all(name, big_and_small(), history(), [(first, ANY), (first, ANY), (BIG8, ANY)], tie)
    assert got == ["small", "small", "big"]


def test_capability_pressure_values_the_scarce_class_only():
    """Only the big class is protected: a 1-GPU class every node can host has no scarcity.
    Its value is r * 8000 with r = min(1, q * (K_all - K_S) / K_S): q = 32/40 of the GPU
    demand seen, K_all = 16 cards, K_S = 8 -> r = 0.8."""
    model = big_and_small()
    placer = attach_placer(get_placer("stowage"), model, seed=0)
    for req, models in history(15):   # 5 big (40 GPUs) and 10 one-GPU pods: q = 40/50
        placer.observe(req, models)
    placer._rebuild()   # the table (and what the pressure is computed from) as of all 15 pods
    placer._index(model.a)
    cap = placer.capability_pressure(model.a)
    need, cpu, mem, value = cap.need, cap.cpu, cap.mem, cap.value
    assert need.tolist() == [8] and cpu.tolist() == [120_000.0] and mem.tolist() == [737_280.0]
    assert value.tolist() == pytest.approx([0.8 * 8000])


def test_no_scarce_class_no_capability_pressure():
    """When every node could host every class seen, nothing is protected (the policy is
    what it was without the term)."""
    model = big_and_small()
    placer = attach_placer(get_placer("stowage"), model, seed=0)
    for k in range(12):
        placer.observe(ONE if k % 2 else GpuRequest(gpus=8, cpu_milli=64_000, host_mem_mib=262_144), ANY)
    placer._index(model.a)
    assert placer.capability_pressure(model.a) is None


def test_without_the_capability_pressure_the_big_class_is_lost(monkeypatch):
    """The memory-hungry CPU-only pods with the term switched off: the stranding term sends
    one to the big node (it has more host memory per GPU), under one of the two tie orders or
    both, and the big 8-GPU pod finds no room. (A 1-GPU pod is kept off the big node by the
    fragmentation score already, here where the big class is a third of the pods; on the
    openb variants it is a fraction of a percent of them.)"""
    first = HUNGRY_CPU
    import packing.strategies.stowage_frag as sf
    monkeypatch.setattr(sf.StowageFragPlacer, "capability_weight", 0.0)
    outcomes = [place_all("stowage", big_and_small(), history(), [(first, ANY), (first, ANY), (BIG8, ANY)], tie)
                for tie in TIES]
    assert any(o[-1] is None for o in outcomes), outcomes


MID8 = GpuRequest(gpus=8, cpu_milli=64_000, host_mem_mib=262_144)     # any 8-card node
HALF4 = GpuRequest(gpus=4, cpu_milli=40_000, host_mem_mib=409_600)    # 400 GiB: the big node only


def test_a_whole_gpu_pod_takes_all_its_cards_from_the_capability():
    """An 8-GPU pod on the big node leaves it no card: the node loses both protected classes,
    the 4-GPU one too although its CPU and memory would still fit (64 cores, 512 GiB left).
    (The cards taken were once counted with a boolean einsum, i.e. one card whatever the
    pod's size: the 4-GPU class seemed to survive, 7 >= 4 cards.)"""
    model = big_and_small()
    placer = attach_placer(get_placer("stowage"), model, seed=0)
    for req in [BIG8, HALF4, MID8, ONE, ONE, ONE] * 2:
        placer.observe(req, ANY)
    placer._rebuild()
    placer._index(model.a)
    cap = placer.capability_pressure(model.a)
    need, cpu, mem, value = cap.need, cap.cpu, cap.mem, cap.value
    assert sorted(need.tolist()) == [4, 8]
    usable = model.a.exists & model.a.healthy
    cost = placer.capability_cost(model.a, MID8, np.array([0, 1]), usable, None, None)
    assert cost.tolist() == pytest.approx([value.sum(), 0.0])   # big loses both, small had neither


def many_small_one_big_left():
    """Two big 8-card nodes (128 cores, 768 GiB) and six small ones (96 cores, 384 GiB); the
    first big node already ran out of host memory (a CPU-only pod holds 650 GiB of it)."""
    names = ("big0", "big1") + tuple(f"s{i}" for i in range(6))
    model = build_cluster(Nodes(names=names, cpu_milli=np.array([128_000] * 2 + [96_000] * 6),
                                memory_mib=np.array([786_432] * 2 + [393_216] * 6), gpus=np.full(8, 8),
                                model=("G3",) * 8))
    model.assign("x", "x", "big0", [], GpuRequest(cpu_milli=16_000, host_mem_mib=665_600))
    return model


RARE_HISTORY = [(BIG8, ANY)] + [(MID8, ANY)] * 6 + [(ONE, ANY)] * 104


def test_capability_value_rises_when_the_capable_nodes_run_out():
    """The big class is rare (q = 8,000 of 160,000 GPU-milli seen = 0.05), so its scarcity over
    the empty cluster is r = q * (64 - 16) / 16 = 0.15 (1,200 GPU-milli per node). But only one
    node can host it now, and the idle GPU (64 cards) at that mix means lam = q * 64,000 / 8,000
    = 0.4 such pods to come: the one place left is needed with P(X >= 1) = 1 - e^-0.4."""
    model = many_small_one_big_left()
    placer = attach_placer(get_placer("stowage"), model, seed=0)
    for req, models in RARE_HISTORY:
        placer.observe(req, models)
    placer._rebuild()
    placer._index(model.a)
    cap = placer.capability_pressure(model.a)
    need, cpu, mem, value = cap.need, cap.cpu, cap.mem, cap.value
    assert need.tolist() == [8]
    assert value.tolist() == pytest.approx([8000 * (1 - np.exp(-0.4))])


@pytest.mark.parametrize("tie", [np.arange(8), np.arange(8)[::-1]], ids=["big-first", "small-first"])
def test_the_last_node_a_rare_class_fits_is_kept(tie, monkeypatch):
    """A memory-hungry CPU-only pod, then the rare big 8-GPU pod: with the scarcity measured
    on the nodes as they are, the CPU pod goes to a small node and the big pod fits; with the
    scarcity over the empty cluster only (1,200 GPU-milli), the stranding pull wins, the CPU
    pod takes the last big node and the big pod fails."""
    got = place_all("stowage", many_small_one_big_left(), RARE_HISTORY, [(HUNGRY_CPU, ANY), (BIG8, ANY)], tie)
    assert got[0].startswith("s") and got[1] == "big1"
    import packing.strategies.stowage_frag as sf
    monkeypatch.setattr(sf.StowageFragPlacer, "scarcity_now", False)
    got = place_all("stowage", many_small_one_big_left(), RARE_HISTORY, [(HUNGRY_CPU, ANY), (BIG8, ANY)], tie)
    assert got == ["big1", None]


# --------------------------------------------------------------------------- shares limited to models
# The elastic scenario on spec33 lost P100-only shares (12 cores, 46 GiB of host memory each) to
# pods that could run anywhere: those took the host room of the few P100 nodes, and nothing
# valued a P100 node's ability to host such a share (the capability pressure protected
# whole-GPU classes only). A share limited to models is protected the same way now.
P100, G2 = ("P100",), ("G2",)
FLEX = GpuRequest(gpus=1, cpu_milli=11_300, host_mem_mib=49_152)            # may run anywhere
G2_ONE = GpuRequest(gpus=1, cpu_milli=4_000, host_mem_mib=24_576)           # G2 cards only
P100_SHARE = GpuRequest(mem_mib=650, core_milli=650, cpu_milli=12_000, host_mem_mib=47_104)  # P100 only


def p100_and_g2() -> ClusterModel:
    """A 2-card P100 node with 16 cores and 120 GiB (room for one P100 share, or one flexible
    pod, not both) and an 8-card G2 node."""
    return build_cluster(Nodes(names=("p100", "g2"), cpu_milli=np.array([16_000, 96_000]),
                               memory_mib=np.array([122_880, 393_216]), gpus=np.array([2, 8]),
                               model=("P100", "G2")))


def share_history(g2_pods: int):
    """15 pods seen (the learned table is rebuilt at the 16th, the first arrival): mostly
    G2-only 1-GPU pods (so the P100 cards look like idle GPU no typical pod can use, which the
    fragmentation score wants filled), two flexible pods, two P100-only shares."""
    return [(G2_ONE, G2)] * g2_pods + [(FLEX, ANY)] * (13 - g2_pods) + [(P100_SHARE, P100)] * 2


def test_a_shares_place_on_its_models_node_is_valued():
    """The P100 share class is protected: K_all = 10 cards, K_S = 2 (only the P100 node has the
    host room), q = 1,300 / 14,300 of the GPU demand seen (11 G2 pods, 2 flexible, 2 shares of
    650 milli) -> r = q * 8 / 2 = 0.36 over the empty cluster; but its one place now (one share's
    host room on the P100 node) and lam = q * 10,000 / 650 = 1.40 shares to come make it
    P(X >= 1) = 1 - e^-1.40: the place is worth that times 650 GPU-milli. A flexible pod on the
    P100 node takes it; on the G2 node it does not."""
    model = p100_and_g2()
    placer = attach_placer(get_placer("stowage"), model, seed=0)
    for req, models in share_history(11):
        placer.observe(req, models)
    placer._rebuild()
    placer._index(model.a)
    cap = placer.capability_pressure(model.a)
    share = cap.shares
    assert share.sum() == 1 and cap.share_mem[share].tolist() == [650] and cap.cpu[share].tolist() == [12_000.0]
    q = 1300 / 14300
    assert cap.value[share].tolist() == pytest.approx([650 * (1 - np.exp(-q * 10_000 / 650))])
    usable = model.a.exists & model.a.healthy & (model.a.pods == 0)
    cost = placer.capability_cost(model.a, FLEX, np.array([0, 1]), usable, None, None)
    lost_on_p100 = cost[0] - cost[1]
    assert lost_on_p100 == pytest.approx(cap.value[share][0])


@pytest.mark.parametrize("tie", TIES, ids=["p100-first", "g2-first"])
@pytest.mark.parametrize("g2_pods", [11, 12])
def test_a_pod_that_fits_anywhere_leaves_a_model_limited_share_its_host_room(tie, g2_pods, monkeypatch):
    """A flexible 1-GPU pod, then a P100-only share: both fit only if the flexible pod goes to
    the G2 node. Without the shares' protection (whole-GPU classes only, as before) the
    fragmentation score's pull to the P100 cards wins and the share finds no room."""
    arrivals = [(FLEX, ANY), (P100_SHARE, P100)]
    assert place_all("stowage", p100_and_g2(), share_history(g2_pods), arrivals, tie) == ["g2", "p100"]
    import packing.strategies.stowage_frag as sf
    monkeypatch.setattr(sf, "protectable", lambda cls: bool(cls.gpus))
    assert place_all("stowage", p100_and_g2(), share_history(g2_pods), arrivals, tie) == ["p100", None]
