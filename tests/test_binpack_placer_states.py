"""Every registered placer gives usable answers in every learning state, for every pod shape.

An extender that just started has observed nothing; a benchmark whose first pod is CPU-only
has a learned workload without GPU classes; a cluster that has only seen share pods has no
whole-GPU class. None of these may crash a placer or give it NaN scores.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.binpack.replay import build_cluster
from benchmarks.binpack.trace import Nodes
from packing.model import ClusterModel
from packing.pod_policy import PodPolicy
from packing.fit import card_mask, fit
from packing.registry import PLACERS, get_placer, placer_for
from stowage.inventory import Card, Inventory
from stowage.resources import GpuRequest

get_placer("stowage")                # loads the policy package, which registers its placers
NAMES = sorted(PLACERS)

SHAPES = {
    "whole1": GpuRequest(gpus=1, cpu_milli=2000, host_mem_mib=4000),
    "whole2": GpuRequest(gpus=2, cpu_milli=2000, host_mem_mib=4000),
    "share": GpuRequest(mem_mib=300, core_milli=300, cpu_milli=1000, host_mem_mib=2000),
    "cpu": GpuRequest(cpu_milli=4000, host_mem_mib=1000),
}
HISTORIES = {"nothing": [], "cpu-only": ["cpu"], "share-only": ["share", "share"],
             "whole-only": ["whole1"], "mixed": ["cpu", "share", "whole2"]}


def trace_cluster() -> ClusterModel:
    """Trace units (1000-unit cards) with host CPU/memory modelled, one node half used."""
    n = Nodes(names=("n0", "n1", "n2"), cpu_milli=np.array([32000, 64000, 96000]),
              memory_mib=np.array([64000, 128000, 256000]), gpus=np.array([2, 4, 8]),
              model=("T4", "V100", "G2"))
    m = build_cluster(n)
    m.assign("old", "old", "n1", [1], SHAPES["share"])
    return m


def extender_cluster() -> ClusterModel:
    """Real units as the extender sees them: MiB cards, host CPU/memory not modelled (inf)."""
    m = ClusterModel()
    for name, count, mib in (("a", 4, 24576), ("b", 8, 81920)):
        cards = tuple(Card(index=k, uuid=f"{name}-{k}", model="M", memory_mib=mib) for k in range(count))
        m.upsert_node(name, Inventory(cards=cards, source="simulated"))
    m.assign("old", "old", "b", [3], GpuRequest(mem_mib=10240, core_milli=200))
    return m


def real_units(req: GpuRequest) -> GpuRequest:
    """The extender's version of a shape: no host resources, share memory in MiB."""
    if req.is_whole:
        return GpuRequest(gpus=req.gpus)
    if req.is_shared:
        return GpuRequest(mem_mib=8192, core_milli=req.core_milli)
    return GpuRequest()


def decide(model: ClusterModel, placer, req: GpuRequest):
    a = model.a
    pol = PodPolicy()
    f = fit(a, req, card_mask(a, model.models, pol, req))
    idx = np.flatnonzero(f.ok)
    assert len(idx), "test cluster must have room"
    s = np.asarray(placer.score(a, req, idx, f.usable), float)
    assert s.shape == (len(idx),)
    assert np.all(np.isfinite(s)), s
    i = int(idx[int(np.argmax(s))])
    cards = placer.choose_cards(a, i, req, f.usable[i], pol)
    return i, cards, f


@pytest.mark.parametrize("history", sorted(HISTORIES))
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("units", ["trace", "extender"])
def test_placer_answers_in_every_learning_state(name, history, units):
    model = trace_cluster() if units == "trace" else extender_cluster()
    conv = (lambda r: r) if units == "trace" else real_units
    for shape in SHAPES:
        req = conv(SHAPES[shape])
        if units == "extender" and not req.is_gpu:
            continue               # the extender only ever scores GPU pods
        placer = get_placer(name)
        placer.bind_models(model.models)
        for h in HISTORIES[history]:
            placer.observe(conv(SHAPES[h]))
        placer.observe(req)
        i, cards, f = decide(model, placer, req)
        if req.is_whole:
            assert len(cards) == req.gpus and all(f.usable[i, k] for k in cards), (shape, cards)
        elif req.is_shared:
            assert len(cards) == 1 and f.usable[i, cards[0]], (shape, cards)
        uid = f"{name}-{history}-{shape}"
        # The pick must be committable exactly as the replay/extender commits it.
        model.assign(uid, uid, model.names[i], cards if req.is_gpu else (), req, check=req.is_gpu)
        model.release(uid)


@pytest.mark.parametrize("name", ["stowage", "fgd"])
def test_whole_gpu_pod_after_only_cpu_pods(name):
    """The reported crash: a fresh placer that saw only a CPU-only pod scores a whole-GPU pod."""
    model = trace_cluster()
    p = get_placer(name)
    p.bind_models(model.models)
    p.observe(GpuRequest(cpu_milli=4000, host_mem_mib=1000))
    req = GpuRequest(gpus=1)
    i, cards, _ = decide(model, p, req)
    assert len(cards) == 1
    assert not math.isnan(float(np.max(p.score(model.a, req, np.array([i]), fit(
        model.a, req, card_mask(model.a, model.models, PodPolicy(), req)).usable))))


def test_pack_default_fresh_in_extender_units():
    p = placer_for("pack")
    model = extender_cluster()
    i, cards, _ = decide(model, p, GpuRequest(gpus=1))   # nothing observed at all
    assert len(cards) == 1
