"""What a placer learns is bounded whatever pods arrive (the brief: no unbounded memory, no hang
from what a pod's author writes).

A learned class is keyed by the pod's requests and model names, all written by the pod's
author: a stream of pods that each ask for a slightly different CPU request, or name a new
model, once grew the class table, the model-demand table and the list of share sizes without
end, and every rebuild of the typical workload (every 128 pods) with them (40,000 such pods:
49 s to learn, then 5.5 s per capability-pressure pass on 5,000 nodes).
"""
from __future__ import annotations

import numpy as np
import pytest

import packing.strategies.stowage_frag as sf
from benchmarks.binpack.replay import build_cluster
from benchmarks.binpack.trace import Nodes
from packing.decide import decide
from packing.frag import MAX_CLASSES, MILLI, PodClass, Workload
from packing.placer import attach_placer
from packing.pod_policy import PodPolicy
from packing.registry import get_placer
from stowage.resources import GpuRequest


def one_gpu(cpu: int) -> PodClass:
    return PodClass(cpu_milli=cpu, gpus=1)


def test_a_full_workload_counts_a_new_class_in_the_nearest_kept_one():
    w = Workload(max_classes=4)
    share = PodClass(cpu_milli=1000, mem_mib=500, core_milli=500)
    for cls in (one_gpu(1000), one_gpu(2000), one_gpu(8000), share):
        w.add(cls)
    w.add(one_gpu(2100))                                       # nearest 1-GPU class: 2,000 milli
    w.add(PodClass(cpu_milli=1000, mem_mib=450, core_milli=450))   # a share: the share class
    w.add(PodClass(cpu_milli=2000, gpus=2))                    # no 2-GPU class: the closest requests
    assert len(w.counts) == 4 and w.total == 7
    assert w.counts[one_gpu(2000)] == 3 and w.counts[share] == 2
    assert sum(w.counts.values()) == 7


def test_below_the_bound_every_class_is_its_own():
    w = Workload()
    for k in range(MAX_CLASSES):
        w.add(one_gpu(1000 + k))
    assert len(w.counts) == MAX_CLASSES and set(w.counts.values()) == {1.0}
    w.add(one_gpu(1000 + MAX_CLASSES))                        # the first one past the bound is folded
    assert len(w.counts) == MAX_CLASSES and w.counts[one_gpu(1000 + MAX_CLASSES - 1)] == 2.0


def cluster(n: int = 4) -> object:
    return build_cluster(Nodes(names=tuple(f"n{i}" for i in range(n)), cpu_milli=np.full(n, 96_000),
                               memory_mib=np.full(n, 393_216), gpus=np.full(n, 8), model=("A100",) * n))


def test_pods_written_to_differ_leave_the_learned_state_bounded_and_the_placer_working():
    """3,000 GPU pods, each with its own CPU request and half of them naming a model that exists
    nowhere: the classes, the model lists and the share entries stay within their bounds, every
    pod is counted, and the placer still places the next pod."""
    model = cluster()
    placer = attach_placer(get_placer("stowage"), model, seed=0)
    for k in range(3000):
        req = (GpuRequest(gpus=1, cpu_milli=1000 + k, host_mem_mib=4096) if k % 2 else
               GpuRequest(mem_mib=100 + k, core_milli=100, cpu_milli=1000 + k, host_mem_mib=4096))
        placer.observe(req, (f"bogus-{k}",) if k % 4 == 0 else ())
    assert len(placer.workload.counts) <= MAX_CLASSES and placer.workload.total == 3000
    assert len(placer.model_demand) <= sf.MAX_MODEL_LISTS
    assert placer.seen == 3000 and placer.shares_seen == 1500
    got = decide(model.a, model.models, GpuRequest(gpus=1, cpu_milli=1000), PodPolicy(), placer,
                 tie=np.arange(model.a.shape[0]))
    assert got is not None


def shares_placer(monkeypatch, kept: int):
    monkeypatch.setattr(sf, "MAX_SHARES_KEPT", kept)
    return attach_placer(get_placer("stowage"), cluster(), seed=0)


def exact_milli(sizes, card: float) -> float:
    return float(sum(min(MILLI, max(c, m * MILLI / card)) for c, m in sizes))


def test_share_sizes_are_compacted_without_changing_what_they_add_up_to(monkeypatch):
    """Past MAX_SHARES_KEPT entries the shares seen are kept as (size, count): the milli-cards
    they take on a card size asked before (kept up to date) and on one asked only afterwards
    (from the counts) are what every pod kept one by one would give, and so are the SS term's
    live gaps."""
    sizes = [(100 * (k % 6 + 1), 150 * (k % 5 + 1)) for k in range(1000)]    # 30 distinct shapes
    compacted, plain = shares_placer(monkeypatch, 64), None
    compacted.gpu_milli_on(1000.0)
    compacted.live_gaps(1000.0)
    for c, m in sizes:
        compacted.observe(GpuRequest(mem_mib=m, core_milli=c, cpu_milli=1000))
    assert len(compacted._share_core) <= 64 and compacted.shares_seen == 1000
    monkeypatch.setattr(sf, "MAX_SHARES_KEPT", 1 << 18)
    plain = attach_placer(get_placer("stowage"), cluster(), seed=0)
    for c, m in sizes:
        plain.observe(GpuRequest(mem_mib=m, core_milli=c, cpu_milli=1000))
    for card in (1000.0, 2400.0):
        assert compacted.gpu_milli_on(card) == pytest.approx(exact_milli(sizes, card), rel=1e-12)
        assert plain.gpu_milli_on(card) == pytest.approx(exact_milli(sizes, card), rel=1e-12)
        assert (compacted.live_gaps(card) == plain.live_gaps(card)).all()


def test_share_sizes_written_to_differ_are_rounded_to_stay_bounded(monkeypatch):
    """Every share with its own memory size: compaction alone cannot shrink them, so the memory
    is rounded to coarser steps (the nearest step); the total stays within a few percent."""
    placer = shares_placer(monkeypatch, 64)
    sizes = [(100, 200 + k) for k in range(2000)]
    for c, m in sizes:
        placer.observe(GpuRequest(mem_mib=m, core_milli=c, cpu_milli=1000))
    assert len(placer._share_core) <= 64 and placer.shares_seen == 2000
    assert placer.gpu_milli_on(1000.0) == pytest.approx(exact_milli(sizes, 1000.0), rel=0.03)
