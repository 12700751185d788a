"""Replaying a trace against one placement policy, the way the FGD paper's experiments do.

Per seed: shuffle the pods, inflate to 130 % of the cluster's GPU capacity by resampling,
then let pods arrive one at a time; each goes where the policy says or is skipped when it fits
nowhere, and never leaves. After every pod we record the GPU-milli arrived (failed pods
included) and allocated.

The replay only simulates the cluster (a real :class:`packing.model.ClusterModel`) and the pod
source: each pod is placed by :func:`packing.decide.decide`, the code behind the extender's
verbs, so a figure here is a figure for what the extender would do. Ties between equal node
scores go to a fixed random node order per seed (as the paper describes).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from packing.decide import decide
from packing.model import ClusterModel
from packing.placer import attach_placer
from packing.pod_policy import SPREAD, PodPolicy
from packing.registry import get_placer
from stowage.inventory import Card, Inventory

from .trace import Nodes, Pods

INFLATE = 1.3
SEEDS = tuple(range(42, 52))
CARD_MEMORY = 1000  # trace cards are 1000 units of memory and 1000 milli of compute

# The card policy each placer is served with (the extender's pod policy default is pack).
CARD_POLICY = {"least-allocated": PodPolicy(node=SPREAD, card=SPREAD)}


@dataclass
class SeedRun:
    """One policy, one seed: the per-pod record and a few counters."""

    policy: str
    seed: int
    arrived: np.ndarray    # [E] cumulative GPU-milli requested after each pod
    allocated: np.ndarray  # [E] GPU-milli allocated after each pod
    failed: int
    failed_milli: int
    seconds: float


def arrival_order(pods: Pods, capacity_milli: int, seed: int, inflate: float = INFLATE) -> np.ndarray:
    """Row indices in arrival order: a shuffle of all rows, then rows drawn uniformly with
    replacement while the next draw's per-GPU share still keeps the total at most
    ``inflate`` x capacity (the simulator's tune-up rule)."""
    rng = np.random.default_rng(seed)
    order = list(rng.permutation(len(pods)))
    total = int(pods.milli.sum())
    target = inflate * capacity_milli
    if total < target:
        draws = rng.integers(len(pods), size=4 * len(pods) + 16)
        d = 0
        while True:
            if d == len(draws):
                draws, d = rng.integers(len(pods), size=len(draws)), 0
            j = int(draws[d])
            d += 1
            if total + int(pods.gpu_milli[j]) > target:
                break
            total += int(pods.milli[j])
            order.append(j)
    return np.array(order, np.int64)


def node_rank(n: int, seed: int) -> np.ndarray:
    """The fixed random order that breaks score ties for this seed (lower rank wins)."""
    rank = np.empty(n, np.int64)
    rank[np.random.default_rng([seed, 7]).permutation(n)] = np.arange(n)
    return rank


def build_cluster(nodes: Nodes) -> ClusterModel:
    """An empty cluster: every node with its cards (1000 memory units, 1000 milli each), CPU, memory."""
    model = ClusterModel(max_cards=max(int(nodes.gpus.max(initial=1)), 1), capacity=len(nodes.names))
    for i, name in enumerate(nodes.names):
        cards = tuple(Card(index=k, uuid=f"{name}/gpu{k}", model=nodes.model[i], memory_mib=CARD_MEMORY)
                      for k in range(int(nodes.gpus[i])))
        model.upsert_node(name, Inventory(cards=cards, source="simulated"),
                          cpu_milli=float(nodes.cpu_milli[i]), host_mem_mib=float(nodes.memory_mib[i]))
    return model


@lru_cache(maxsize=64)
def _pod_policy(models: tuple[str, ...], base: PodPolicy) -> PodPolicy:
    return PodPolicy(node=base.node, card=base.card, models_include=models, topology=base.topology)


def replay(nodes: Nodes, pods: Pods, policy: str, seed: int, *, limit: int | None = None,
           inflate: float = INFLATE) -> SeedRun:
    """Run one seed of one policy; ``limit`` caps the number of arriving pods (smoke runs)."""
    t0 = time.perf_counter()
    model = build_cluster(nodes)
    capacity = nodes.total_gpu_milli
    order = arrival_order(pods, capacity, seed, inflate)
    if limit is not None:
        order = order[:limit]
    rank = node_rank(len(nodes.names), seed)
    placer = attach_placer(get_placer(policy), model, seed=seed,
                           workload=((pods.request(j), pods.models(j)) for j in range(len(pods))))
    base = CARD_POLICY.get(policy, PodPolicy())
    requests = {}
    names = model.names
    arrived = np.zeros(len(order), np.int64)
    allocated = np.zeros(len(order), np.int64)
    got = done = failed = failed_milli = 0
    for e, j in enumerate(order):
        j = int(j)
        req = requests.get(j)
        if req is None:
            req = requests[j] = pods.request(j)
        milli = int(pods.milli[j])
        done += milli
        pol = _pod_policy(pods.models(j), base)
        placer.observe(req, pol.models_include)
        got_pod = decide(model.a, model.models, req, pol, placer, tie=rank)
        if got_pod is not None:
            i, cards = got_pod
            uid = f"{pods.name}-{seed}-{e}"
            if req.is_gpu:
                model.assign(uid, uid, names[i], cards, req)
            else:
                model.assign(uid, uid, names[i], (), req, check=False)  # CPU-only: no card to hold
            got += milli
        else:
            failed += 1
            failed_milli += milli
        arrived[e] = done
        allocated[e] = got
    return SeedRun(policy, seed, arrived, allocated, failed, failed_milli, time.perf_counter() - t0)


def binned(run: SeedRun, capacity_milli: int, max_bin: int = 130) -> np.ndarray:
    """[max_bin+1] mean allocation % per arrived-% bin (round(100*arrived/capacity)); NaN where empty."""
    b = np.rint(100.0 * run.arrived / capacity_milli).astype(np.int64)
    keep = b <= max_bin
    b = b[keep]
    alloc = 100.0 * run.allocated[keep] / capacity_milli
    n = np.bincount(b, minlength=max_bin + 1).astype(float)
    s = np.bincount(b, weights=alloc, minlength=max_bin + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, s / np.maximum(n, 1), np.nan)
