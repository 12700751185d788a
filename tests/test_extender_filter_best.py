"""Filter answers only the best nodes (``filter_keeps="best"``, the default and what the shipped
scheduler config expects: no prioritize call). It must be exactly prioritize's decision: the
nodes that prioritize scores 10 among those that fit, the same reasons for the nodes that do not
fit, the others that fit left out; and a node held for a nominated pod is never among them."""
from __future__ import annotations

import random

import orjson
import pytest
from click.testing import CliRunner

from benchmarks.latency import cluster as bench_cluster
from extender.service import ExtenderService
from extender.wire import encode, parse_binding_args, parse_extender_args
from packing.model import ClusterModel
from packing.registry import get_placer
from stowage.resources import GpuRequest

from planning_clusters import GiB, add_node
from test_extender_preempt import filter_names, nominate, preemptor
from test_latency_equivalence import POD_ANNOTATIONS, POD_LIMITS, churn, random_model


def filt(svc: ExtenderService, pod: dict, names: list[str]) -> dict:
    body = encode({"Pod": pod, "Nodes": None, "NodeNames": names})
    return orjson.loads(encode(svc.filter(parse_extender_args(body)).to_json()))


@pytest.mark.parametrize("policy", ["stowage", "stowage-frag", "bestfit", "most-allocated", "least-allocated"])
@pytest.mark.parametrize("seed", range(3))
def test_best_is_what_prioritize_scores_10_on_a_changing_cluster(policy, seed):
    rng = random.Random(seed)
    state = rng.getstate()
    m_best = random_model(rng, 60)
    rng.setstate(state)
    m_fit = random_model(rng, 60)
    best = ExtenderService(m_best, placer_factory=lambda _v: get_placer(policy))
    fitting = ExtenderService(m_fit, placer_factory=lambda _v: get_placer(policy), filter_keeps="fitting")
    live: list[str] = []
    narrowed = 0
    for step in range(150):
        pod = bench_cluster.pod_object(f"p{seed}-{step}", rng.choice(POD_LIMITS), rng.choice(POD_ANNOTATIONS))
        names = m_best.node_names()
        rng.shuffle(names)
        names = names[: rng.randint(1, len(names))] + rng.choice([[], ["ghost-node"]])
        got, every = filt(best, pod, names), filt(fitting, pod, names)
        # the nodes that cannot take the pod: the same reasons, word for word
        assert got["FailedAndUnresolvableNodes"] == every["FailedAndUnresolvableNodes"]
        assert got["FailedNodes"] == every["FailedNodes"]
        fits = every["NodeNames"]
        if len(fits) <= 1:
            assert got["NodeNames"] == fits
        else:
            body = encode({"Pod": pod, "Nodes": None, "NodeNames": fits})
            scores = {h["Host"]: h["Score"] for h in fitting.prioritize(parse_extender_args(body))}
            assert got["NodeNames"] == [n for n in fits if scores[n] == 10]
            narrowed += len(got["NodeNames"]) < len(fits)
        if got["NodeNames"] and rng.random() < 0.7:
            md = pod["metadata"]
            node = min(got["NodeNames"], key=m_best.index.__getitem__)  # the same choice in both
            bind = {"PodName": md["name"], "PodNamespace": md["namespace"], "PodUID": md["uid"], "Node": node}
            assert best.bind(parse_binding_args(bind)) == fitting.bind(parse_binding_args(bind))
            if md["uid"] in m_best.allocations:
                live.append(md["uid"])
        churn([m_best, m_fit], rng, live, step)
    assert narrowed > 20   # the test saw filter leave fitting nodes out, many times


def test_pack_answers_the_busy_node_alone_and_spread_the_empty_ones():
    m = ClusterModel()
    for n in ("a", "b", "c"):
        add_node(m, n, 4, 80, "A100")
    m.assign("x", "default/x", "b", [0], GpuRequest(mem_mib=20 * GiB))
    svc = ExtenderService(m)
    share = {"nvidia.com/gpu-memory": "10"}
    assert filt(svc, bench_cluster.pod_object("p", share, {}), ["a", "b", "c"])["NodeNames"] == ["b"]
    spread = bench_cluster.pod_object("s", share, {"stowage.io/node-policy": "spread"})
    got = filt(svc, spread, ["a", "b", "c"])
    assert got["NodeNames"] == ["a", "c"]          # equal to Stowage: kube-scheduler's scores choose
    assert got["FailedNodes"] == {} and got["FailedAndUnresolvableNodes"] == {}


def test_a_node_held_for_a_nominee_is_never_the_best_answer():
    """The best node's freed cards are held for a nominated pod of higher priority: filter answers
    the best of the other nodes, not nothing and not the held one."""
    m = ClusterModel()
    for n in ("held", "other", "empty"):
        add_node(m, n, 2, 24, "L4")
    for uid, node, card in (("h1", "held", 0), ("h2", "held", 0), ("h3", "held", 1), ("h4", "held", 1),
                            ("o1", "other", 0), ("o2", "other", 1), ("o3", "other", 1)):
        m.assign(uid, f"default/{uid}", node, [card], GpuRequest(mem_mib=12 * GiB))
    m.release("h3")
    m.release("h4")                                  # held's card 1 is free again: the nominee's
    svc = ExtenderService(m)
    nominate(svc, "hi", "held", 20, 1000)
    low = preemptor("low", gib=8, priority=10)
    fitting = ExtenderService(m, filter_keeps="fitting")
    nominate(fitting, "hi", "held", 20, 1000)
    every = filter_names(fitting, low, ["held", "other", "empty"])
    assert sorted(every.node_names) == ["empty", "other"] and "held" in every.failed
    got = filter_names(svc, low, ["held", "other", "empty"])
    assert "cards held for default/hi" in got.failed["held"]
    # The best of the other nodes: what the same policy, with the same pods seen, answers when the
    # held node is not a candidate at all (which of the two it prefers is the policy's business).
    ref = ExtenderService(m)
    nominate(ref, "hi", "held", 20, 1000)
    best_of_others = filter_names(ref, low, ["other", "empty"])
    assert len(best_of_others.node_names) == 1
    assert got.node_names == best_of_others.node_names


def test_an_unknown_setting_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="best, fitting"):
        ExtenderService(ClusterModel(), filter_keeps="all")
    from stowage.cli import main
    r = CliRunner().invoke(main, ["extender", "--simulated", "builtin", "--filter-keeps", "all"])
    assert r.exit_code == 2 and "'best'" in r.output and "'fitting'" in r.output
