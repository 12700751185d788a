"""Each placer's choice in simple cases, through the extender's own fit/score/choose_cards."""
from __future__ import annotations

import numpy as np

from benchmarks.binpack.replay import build_cluster
from benchmarks.binpack.trace import Nodes
from packing.pod_policy import PodPolicy
from packing.fit import card_mask, fit
from packing.registry import POLICY_PLACER, get_placer, placer_for
from stowage.resources import GpuRequest


def cluster(*rows):
    n = Nodes(names=tuple(f"n{i}" for i in range(len(rows))), cpu_milli=np.array([r[0] for r in rows]),
              memory_mib=np.array([r[1] for r in rows]), gpus=np.array([r[2] for r in rows]),
              model=tuple("G2" for _ in rows))
    return build_cluster(n)


def place(model, placer, req, uid):
    a = model.a
    f = fit(a, req, card_mask(a, model.models, PodPolicy(), req))
    idx = np.flatnonzero(f.ok)
    s = np.asarray(placer.score(a, req, idx, f.usable), float)
    i = int(idx[np.flatnonzero(s == s.max())[0]])
    cards = placer.choose_cards(a, i, req, f.usable[i], PodPolicy())
    model.assign(uid, uid, model.names[i], cards, req)
    return model.names[i], cards


def share(m, cpu=1000, mem=1000):
    return GpuRequest(mem_mib=m, core_milli=m, cpu_milli=cpu, host_mem_mib=mem)


def test_stowage_is_the_pack_default():
    assert placer_for("pack").name == "stowage"     # loads the policy package lazily
    assert POLICY_PLACER["pack"] == "stowage"


def test_bestfit_and_gpushare_fill_the_fullest_card():
    for name in ("bestfit", "gpushare-binpack", "hami-binpack"):
        m = cluster((64000, 64000, 2), (64000, 64000, 2))
        p = get_placer(name)
        first = place(m, p, share(500), "a")
        assert place(m, p, share(300), "b") == first, name   # same node, same card


def test_fgd_keeps_whole_cards_whole():
    m = cluster((64000, 64000, 2))
    p = get_placer("fgd")
    p.bind_models(m.models)
    p.prime([(share(500), ()), (GpuRequest(gpus=1, cpu_milli=1000, host_mem_mib=1000), ())])
    _, c1 = place(m, p, share(500), "a")
    _, c2 = place(m, p, share(500), "b")
    assert c1 == c2        # the second half goes on the half-used card, the other stays whole


def test_random_spreads_over_feasible_nodes():
    m = cluster(*[(64000, 64000, 1)] * 8)
    p = get_placer("random")
    p.reseed(1)
    a = m.a
    req = GpuRequest(gpus=1)
    f = fit(a, req, card_mask(a, m.models, PodPolicy(), req))
    idx = np.flatnonzero(f.ok)
    picks = {int(idx[np.argmax(p.score(a, req, idx, f.usable))]) for _ in range(50)}
    assert len(picks) > 3


def test_stowage_learns_and_avoids_stranding_gpus():
    # n0: 2 GPUs but little memory; n1: 2 GPUs and plenty. A memory-hungry CPU-only pod must not
    # take n0's memory: that would strand both of n0's GPUs for the GPU pods seen so far.
    m = cluster((64000, 20000, 2), (64000, 400000, 2))
    p = get_placer("stowage")
    p.bind_models(m.models)
    for _ in range(20):
        p.observe(GpuRequest(gpus=1, cpu_milli=4000, host_mem_mib=8000))
    cpu_pod = GpuRequest(cpu_milli=1000, host_mem_mib=16000)
    p.observe(cpu_pod)
    a = m.a
    f = fit(a, cpu_pod, card_mask(a, m.models, PodPolicy(), cpu_pod))
    idx = np.flatnonzero(f.ok)
    s = p.score(a, cpu_pod, idx, f.usable)
    assert int(idx[int(np.argmax(s))]) == 1


def test_stowage_scores_without_any_observation():
    m = cluster((64000, 64000, 2))
    name, cards = place(m, get_placer("stowage"), share(300), "a")
    assert name == "n0" and len(cards) == 1
