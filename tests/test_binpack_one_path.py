"""Issue 13, one placement path: the bin-packing replay places through the extender's own code
(Node and Pod objects through the watch's object-to-model code, then the service's filter,
prioritize and bind), so its figures can never know more or less than the live extender. This
replays the first pods of the openb default trace both ways — the replay, and the three steps of
:mod:`packing.decide` on a model built straight from the trace's numbers, as the benchmark did
before — and compares every placement (node and cards) and every refusal."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.binpack import replay as rp
from benchmarks.binpack.trace import load_nodes, load_pods
from packing.decide import best_node, choose_cards, feasible, score
from packing.model import ClusterModel
from packing.placer import attach_placer
from packing.pod_policy import PodPolicy
from packing.registry import get_placer
from shared_paths import SHARED
from stowage.inventory import Card, Inventory

OPENB = SHARED / "openb"
pytestmark = pytest.mark.skipif(not (OPENB / "openb_pod_list_default.csv").exists(), reason="needs ../shared/openb")


def direct_cluster(nodes) -> ClusterModel:
    """The model from the trace's numbers, without API objects (the benchmark's old way)."""
    model = ClusterModel(max_cards=int(nodes.gpus.max()), capacity=len(nodes.names))
    for i, name in enumerate(nodes.names):
        cards = tuple(Card(index=k, uuid=f"{name}/gpu{k}", model=nodes.model[i], memory_mib=rp.CARD_MEMORY)
                      for k in range(int(nodes.gpus[i])))
        model.upsert_node(name, Inventory(cards=cards, source="simulated"),
                          cpu_milli=float(nodes.cpu_milli[i]), host_mem_mib=float(nodes.memory_mib[i]))
    return model


def direct(nodes, pods, policy: str, seed: int, order: np.ndarray) -> list:
    """Each pod decided by packing.decide's three steps on the arrays, ties to the node rank."""
    model = direct_cluster(nodes)
    rank = rp.node_rank(len(nodes.names), seed)
    placer = attach_placer(get_placer(policy), model, seed=seed,
                           workload=((pods.request(j), pods.models(j)) for j in range(len(pods))))
    base = rp.CARD_POLICY.get(policy, PodPolicy())
    out = []
    for e, j in enumerate(order.tolist()):
        req = pods.request(j)
        pol = PodPolicy(node=base.node, card=base.card, models_include=pods.models(j), topology=base.topology)
        placer.observe(req, pol.models_include)
        _, f = feasible(model.a, model.models, req, pol)
        rows = np.flatnonzero(f.ok)
        if not rows.size:
            out.append(None)
            continue
        raw = np.round(score(placer, model.a, req, rows, f), 9)   # prioritize ranks to 1e-9
        i = best_node(raw, rows, rank)
        cards = choose_cards(placer, model.a, i, req, f, pol) if req.is_gpu else []
        uid = f"d-{e}"
        model.assign(uid, uid, model.names[i], cards, req, check=True)
        out.append((model.names[i], tuple(cards)))
    return out


@pytest.mark.parametrize("policy", ["stowage", "fgd", "least-allocated"])
def test_the_replay_places_every_pod_as_the_three_steps_do(policy):
    nodes, pods = load_nodes(OPENB), load_pods("default", OPENB)
    seed, n = 42, 300
    order = rp.arrival_order(pods, nodes.total_gpu_milli, seed)[:n]
    placements: list = []
    run = rp.replay(nodes, pods, policy, seed, limit=n, placements=placements)
    expected = direct(nodes, pods, policy, seed, order)
    assert len(placements) == n and sum(p is None for p in expected) == run.failed
    assert sum(not pods.request(j).is_gpu for j in order.tolist()) > 10    # CPU-only pods are placed too
    diverged = [(e, got, want) for e, (got, want) in enumerate(zip(placements, expected)) if got != want]
    assert not diverged, diverged[:5]


def test_trace_rows_become_the_requests_the_trace_describes():
    """Pod objects parse (through the extender's own parser) to exactly Pods.request."""
    from stowage.resources import pod_request
    pods = load_pods("default", OPENB)
    for j in range(0, len(pods), 7):
        assert pod_request(rp.pod_object(pods, j, f"p{j}"), rp.MEMORY_UNIT_MIB) == pods.request(j), j
