"""Scarce-model protection: pods that may run anywhere leave the cards of a model that other
pods are limited to (issue 15).

Hand-made clusters where the right answer is known: a node of the scarce model and a node of a
common one, a learned workload in which some pods may only use the scarce model. An
unconstrained pod must go to the common model's node, whatever the tie-break order; a
sequence of arrivals that fits completely only that way must fit completely. A placer that
does not learn which classes are tied to which models (the old ``observe(req)``) cannot tell the
two nodes apart, which the last test shows fails the sequence under one of the two orders.
"""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.binpack.replay import build_cluster
from benchmarks.binpack.trace import Nodes
from packing.decide import decide
from packing.model import ClusterModel
from packing.placer import attach_placer
from packing.pod_policy import PodPolicy
from packing.registry import get_placer
from stowage.resources import GpuRequest

ANY = ()
T4 = ("T4",)
WHOLE = GpuRequest(gpus=1, cpu_milli=4000, host_mem_mib=16000)
SHARE = GpuRequest(mem_mib=500, core_milli=500, cpu_milli=2000, host_mem_mib=8000)


def two_nodes() -> ClusterModel:
    """A T4 node and a G2 node, 2 cards each, plenty of host CPU and memory."""
    return build_cluster(Nodes(names=("t4", "g2"), cpu_milli=np.array([64000, 64000]),
                               memory_mib=np.array([512000, 512000]), gpus=np.array([2, 2]),
                               model=("T4", "G2")))


def place_all(placer_name: str, model: ClusterModel, history, arrivals, tie: np.ndarray,
              learn_models: bool = True) -> list[str | None]:
    """Let the placer observe ``history`` (pods seen before, not placed here), then replay
    ``arrivals`` ((request, models) in order) as the benchmark does; the node each got."""
    placer = attach_placer(get_placer(placer_name), model, seed=0)
    for req, models in history:
        placer.observe(req, models if learn_models else ())
    out: list[str | None] = []
    for e, (req, models) in enumerate(arrivals):
        pol = PodPolicy(models_include=models)
        placer.observe(req, models if learn_models else ())
        got = decide(model.a, model.models, req, pol, placer, tie=tie)
        if got is None:
            out.append(None)
            continue
        i, cards = got
        model.assign(f"p{e}", f"p{e}", model.names[i], cards, req)
        out.append(model.names[i])
    return out


def warm_up(n: int = 6):
    """A history in which half the whole-GPU pods may only use T4 cards (observed only: the
    placer learns the mix from them, the test cluster starts empty)."""
    return [(WHOLE, T4 if k % 2 else ANY) for k in range(n)]


@pytest.mark.parametrize("name", ["stowage", "stowage-frag"])
@pytest.mark.parametrize("tie", [np.array([0, 1]), np.array([1, 0])], ids=["t4-first", "g2-first"])
def test_an_unconstrained_pod_leaves_the_scarce_model_alone(name, tie):
    """Two unconstrained 1-GPU pods, then two that may only run on T4: all four fit only if the
    first two take the G2 cards. The learned workload (half the pods T4-only) says so."""
    got = place_all(name, two_nodes(), warm_up(), [(WHOLE, ANY), (WHOLE, ANY), (WHOLE, T4), (WHOLE, T4)], tie)
    assert got == ["g2", "g2", "t4", "t4"]


@pytest.mark.parametrize("tie", [np.array([0, 1]), np.array([1, 0])], ids=["t4-first", "g2-first"])
def test_shares_of_unconstrained_pods_go_to_the_common_model(tie):
    """Share pods that may run anywhere, in a workload where T4-only whole-GPU pods are
    common, open the G2 node's cards, not the T4 node's: the T4-only pods arriving next all fit."""
    got = place_all("stowage", two_nodes(), warm_up(), [(SHARE, ANY), (SHARE, ANY), (WHOLE, T4), (WHOLE, T4)], tie)
    assert got == ["g2", "g2", "t4", "t4"]


def test_without_the_models_the_placer_cannot_protect_the_scarce_cards():
    """The same arrivals with the models withheld from ``observe`` (what the placer learned
    before issue 15): the two nodes look alike to it, and under one of the two tie orders an
    unconstrained pod takes a T4 card and a T4-only pod finds no room. Shows the tests above
    depend on the learning, not on the tie order or on luck."""
    outcomes = []
    for tie in (np.array([0, 1]), np.array([1, 0])):
        outcomes.append(place_all("stowage", two_nodes(), warm_up(),
                                  [(WHOLE, ANY), (WHOLE, ANY), (WHOLE, T4), (WHOLE, T4)], tie, learn_models=False))
    assert any(None in o for o in outcomes), outcomes


def test_model_pressure_is_the_reserved_share_of_each_models_cards():
    """q_S * all cards / S's cards per model list S, summed per model, at most 1: with 2 T4 and
    6 G2 cards and 1 in 8 GPU pods T4-only, a T4 card is half wanted by them (1/8 * 8/2); with
    1 in 4, fully (capped); pods that may run anywhere put no pressure on any model."""
    n = Nodes(names=("t4", "g2"), cpu_milli=np.array([64000, 64000]), memory_mib=np.array([512000, 512000]),
              gpus=np.array([2, 6]), model=("T4", "G2"))
    for t4_only, want in ((1, 0.5), (2, 1.0), (0, 0.0)):
        model = build_cluster(n)
        placer = attach_placer(get_placer("stowage"), model, seed=0)
        for k in range(8):
            placer.observe(WHOLE, T4 if k < t4_only else ANY)
        rho = placer.model_pressure(model.a)
        t4, g2 = model.models.index("T4"), model.models.index("G2")
        assert rho[t4] == pytest.approx(want) and rho[g2] == 0.0


@pytest.mark.parametrize("tie", [np.array([0, 1]), np.array([1, 0])], ids=["t4-first", "g2-first"])
@pytest.mark.parametrize("weight", [1.0, 0.0], ids=["pressure", "no-pressure"])
def test_pressure_outweighs_the_memory_pull_of_the_scarce_model(monkeypatch, tie, weight):
    """The case of the constrained openb variants: the scarce model's node is rich in host
    memory (T4: 1,000 GB for 4 cards), the common model's poor (G2: 200 GB for 4 cards, the
    learned mean per GPU), and the unconstrained pods are memory-hungry (60 GB). The stranding
    term alone sends them to the T4 node, where the T4-only pods that come next (a quarter of
    the GPU pods seen) then find no card. The model pressure (half of every T4 card is wanted:
    1/4 of the pods * 8 cards / 4 T4 cards) keeps them on G2 and all six pods fit."""
    import packing.strategies.stowage_frag as sf
    monkeypatch.setattr(sf.StowageFragPlacer, "pressure_weight", weight)
    n = Nodes(names=("t4", "g2"), cpu_milli=np.array([64000, 64000]), memory_mib=np.array([1_000_000, 200_000]),
              gpus=np.array([4, 4]), model=("T4", "G2"))
    hungry = GpuRequest(gpus=1, cpu_milli=2000, host_mem_mib=60_000)
    small = GpuRequest(gpus=1, cpu_milli=2000, host_mem_mib=20_000)
    history = [(small, T4) if k % 4 == 0 else (hungry, ANY) for k in range(8)]
    got = place_all("stowage", build_cluster(n), history, [(hungry, ANY)] * 2 + [(small, T4)] * 4, tie)
    if weight:
        assert got == ["g2"] * 2 + ["t4"] * 4
    else:
        assert got[:2] == ["t4"] * 2 and None in got[2:]


@pytest.mark.parametrize("tie", [np.array([0, 1]), np.array([1, 0])], ids=["t4-first", "g2-first"])
def test_pressure_keeps_unconstrained_pods_off_the_wanted_model_when_fragmentation_cannot_tell(tie):
    """4 T4 and 4 G2 cards, a quarter of the GPU pods T4-only and every pod a whole GPU: both
    nodes still fit every class after one more pod, so the fragmentation score is the same
    on both; only the pressure (the T4 cards are wanted) says where the unconstrained pods go.
    Four unconstrained pods then four T4-only ones: all fit only if the first four take G2."""
    n = Nodes(names=("t4", "g2"), cpu_milli=np.array([64000, 64000]), memory_mib=np.array([512000, 512000]),
              gpus=np.array([4, 4]), model=("T4", "G2"))
    history = [(WHOLE, T4 if k % 4 == 0 else ANY) for k in range(8)]
    arrivals = [(WHOLE, ANY)] * 4 + [(WHOLE, T4)] * 4
    assert place_all("stowage", build_cluster(n), history, arrivals, tie) == ["g2"] * 4 + ["t4"] * 4


def test_the_first_model_limited_pod_invalidates_cached_scores():
    """The model pressure is 0 until a pod limited to GPU models is seen; that pod switches it on,
    which moves scores without a table rebuild. A host that caches scores by the placer's
    version (the extender's row cache) would serve the pressure-free scores until the next
    rebuild unless the version moves: the row cache then disagreed with the reference path."""
    from stowage.resources import GpuRequest
    placer = get_placer("stowage")
    for _ in range(5):
        placer.observe(GpuRequest(gpus=1))
    v = placer.version
    placer.observe(GpuRequest(gpus=1), ("H100",))
    assert placer.version != v
    v = placer.version
    placer.observe(GpuRequest(gpus=1), ("A100",))  # a rebuild may bump it; the 7th pod does not rebuild
    assert placer.version == v


def saturating_history(n: int = 8):
    """Half the whole-GPU pods seen may only use T4: on a cluster with 2 T4 cards of 10 they want
    every T4 card (rho = 1/2 * 10 / 2, capped at 1)."""
    return [(WHOLE, T4 if k % 2 else ANY) for k in range(n)]


@pytest.mark.parametrize("tie", [np.array([0, 1]), np.array([1, 0])], ids=["t4-first", "g2-first"])
def test_in_churn_mode_a_saturated_models_card_costs_more_than_opening_a_node(tie):
    """Churn mode (pods have left the cluster) prefers nodes that already run a GPU pod: opening
    an empty node costs CHURN_COST, far above the model pressure (at most a GPU-milli per
    GPU-milli). So a pod that may run anywhere took the last T4 card of a T4 node in use rather
    than open the empty G2 node, and the T4-only pod after it found no card (the elastic
    scenario on spec33: the T4-only shares were never placed). Where the pods limited to a model
    want all of its cards, a card of it is the last thing a pod with a choice takes."""
    n = Nodes(names=("t4", "g2"), cpu_milli=np.array([64000, 64000]), memory_mib=np.array([512000, 512000]),
              gpus=np.array([2, 8]), model=("T4", "G2"))
    model = build_cluster(n)
    placer = attach_placer(get_placer("stowage"), model, seed=0)
    placer.note_release()
    assert placer.churn
    for req, models in saturating_history():
        placer.observe(req, models)
    got = []
    for e, (req, models) in enumerate([(WHOLE, T4), (WHOLE, ANY), (WHOLE, T4)]):
        placer.observe(req, models)
        d = decide(model.a, model.models, req, PodPolicy(models_include=models), placer, tie=tie)
        got.append(None if d is None else model.names[d[0]])
        if d is not None:
            model.assign(f"p{e}", f"p{e}", model.names[d[0]], d[1], req)
    assert got == ["t4", "g2", "t4"]


@pytest.mark.parametrize("tie", [np.array([0, 1]), np.array([1, 0])], ids=["t4-first", "g2-first"])
def test_a_saturated_models_card_costs_more_than_breaking_a_big_nodes_capability(tie):
    """The elastic scenario's first step on spec33: 1-GPU pods that may run anywhere, 8-GPU pods
    (their capability pressure protects the 8-card nodes), and T4-only pods that want every T4
    card. Breaking the empty 8-card node cost more (the 8-GPU class's capability) than a T4
    card (its pressure, up to 1,000 GPU-milli, less the fragmentation gain of filling a card
    the 8-GPU pods cannot use), so the flexible pods took the T4 cards and the T4-only pods found
    none. A saturated model's card is now the last choice: the flexible pods break the 8-card
    node and the T4-only pods fit."""
    n = Nodes(names=("t4", "g2"), cpu_milli=np.array([64000, 96000]), memory_mib=np.array([512000, 393216]),
              gpus=np.array([2, 8]), model=("T4", "G2"))
    eight = GpuRequest(gpus=8, cpu_milli=32000, host_mem_mib=128000)
    history = [(eight, ANY)] + [(WHOLE, T4), (WHOLE, ANY)] * 4
    arrivals = [(WHOLE, ANY), (WHOLE, ANY), (WHOLE, T4), (WHOLE, T4)]
    assert place_all("stowage", build_cluster(n), history, arrivals, tie) == ["g2", "g2", "t4", "t4"]
