"""Replaying a trace against one placement policy, the way the FGD paper's experiments do.

Per seed: shuffle the pods, inflate to 130 % of the cluster's GPU capacity by resampling,
then let pods arrive one at a time; each goes where the policy says or is skipped when it fits
nowhere, and never leaves. After every pod we record the GPU-milli arrived (failed pods
included) and allocated.

One placement path: the replay only simulates the API server. Each node is a Node object and
each pod a Pod object, as the API server would return them (:func:`node_object`,
:func:`pod_object`); nodes reach the model through the watch's own code
(:func:`extender.kube_objects.node_view`, :func:`extender.kube_objects.node_into_model`), and
each pod is decided by the extender's own service calls, in kube-scheduler's order
(:func:`extender.placing.schedule`, shared with the elastic simulation and ``stowage plan``):
``filter`` over every node, ``prioritize`` over those that pass (when more than one does), the
best-scored node (:func:`packing.decide.best_node`, the one choice rule), ``bind``. So the replay can never know more, or less,
than the live extender (``tests/test_binpack_one_path.py`` checks it against the three steps of
:mod:`packing.decide` called directly).

Ties. kube-scheduler adds its own plugins' scores to the extender's and picks at random among
the nodes that share the best total. Here the extender's score alone counts, and its best-scored
nodes (equal raw scores, to the 1e-9 that prioritize ranks by) are ordered by a fixed random node
order per seed (:func:`node_rank`, as the paper's simulator does): the seeded stand-in for that
random pick, reproducible run to run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from extender.kube_objects import node_into_model, node_view
from extender.placing import schedule, serve
from extender.service import ExtenderService
from packing.model import ClusterModel
from packing.placer import Placer, attach_placer
from packing.pod_policy import GPU_MODEL, SPREAD, PodPolicy
from packing.registry import get_placer
from stowage.inventory import INVENTORY_ANNOTATION, Card, encode_inventory

from .trace import Nodes, Pods

INFLATE = 1.3
SEEDS = tuple(range(42, 52))
CARD_MEMORY = 1000  # trace cards are 1000 units of memory and 1000 milli of compute
MEMORY_UNIT_MIB = 1  # nvidia.com/gpu-memory: 1 unit = 1 "MiB" of a 1000-unit trace card
NAMESPACE = "default"

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


# ------------------------------------------------------------------------------- API objects
def node_object(name: str, cpu_milli: int, memory_mib: int, gpus: int, model: str) -> dict[str, Any]:
    """A trace node as the API server returns it: Ready, its cards in Stowage's inventory
    annotation (1000 memory units each), allocatable CPU and memory. No pod limit (the trace
    has none)."""
    cards = [Card(index=k, uuid=f"{name}/gpu{k}", model=model, memory_mib=CARD_MEMORY) for k in range(gpus)]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {INVENTORY_ANNOTATION: encode_inventory(cards, MEMORY_UNIT_MIB)}},
            "spec": {},
            "status": {"allocatable": {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi",
                                       "nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod_limits(pods: Pods, j: int) -> dict[str, str]:
    """Row j's container limits, the request :meth:`Pods.request` describes: a share of one card
    asks ``gpu_milli`` memory units (of 1000) and the same in compute (percent, x10)."""
    g, m = int(pods.num_gpu[j]), int(pods.gpu_milli[j])
    limits = {"cpu": f"{int(pods.cpu_milli[j])}m", "memory": f"{int(pods.memory_mib[j])}Mi"}
    if g == 0 or m == 0:
        return limits
    if g == 1 and m < 1000:
        limits["nvidia.com/gpu-memory"] = str(m)
        limits["nvidia.com/gpu-core"] = str(-(-m // 10))
    else:
        limits["nvidia.com/gpu"] = str(g)
    return limits


def pod_object(pods: Pods, j: int, name: str) -> dict[str, Any]:
    """Trace row j as a pending Pod of the stowage-scheduler profile (uid = name)."""
    models = pods.models(j)
    ann = {GPU_MODEL: ",".join(models)} if models else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": name, "resourceVersion": "1",
                         "annotations": ann},
            "spec": {"schedulerName": "stowage-scheduler",
                     "containers": [{"name": "main", "resources": {"limits": pod_limits(pods, j)}}]},
            "status": {"phase": "Pending"}}


def build_cluster(nodes: Nodes) -> ClusterModel:
    """An empty cluster: every node as a Node object, through the watch's object-to-model code."""
    model = ClusterModel(max_cards=max(int(nodes.gpus.max(initial=1)), 1), capacity=len(nodes.names))
    for i, name in enumerate(nodes.names):
        node_into_model(model, node_view(node_object(name, int(nodes.cpu_milli[i]), int(nodes.memory_mib[i]),
                                                     int(nodes.gpus[i]), nodes.model[i])))
    return model


# ------------------------------------------------------------------------------- deciding
def replay_service(model: ClusterModel, placer: Placer, base: PodPolicy) -> ExtenderService:
    """The extender's service over the replay's model, serving every pod with ``placer``."""
    return serve(model, placer, default_policy=base, memory_unit_mib=MEMORY_UNIT_MIB)


def replay(nodes: Nodes, pods: Pods, policy: str, seed: int, *, limit: int | None = None,
           inflate: float = INFLATE, placements: list | None = None, model: ClusterModel | None = None) -> SeedRun:
    """Run one seed of one policy; ``limit`` caps the number of arriving pods (smoke runs).
    ``placements`` (a list) gets each pod's (node, card slots), or None when it failed.
    ``model``: the empty cluster to replay into (``build_cluster(nodes)`` when None), for a
    caller that looks at the cluster afterwards (:mod:`.anatomy`)."""
    t0 = time.perf_counter()
    model = build_cluster(nodes) if model is None else model
    capacity = nodes.total_gpu_milli
    order = arrival_order(pods, capacity, seed, inflate)
    if limit is not None:
        order = order[:limit]
    # Slot i holds node i (a fresh model fills slots in order), so the rank is per slot too.
    rank = node_rank(len(nodes.names), seed)
    placer = attach_placer(get_placer(policy), model, seed=seed,
                           workload=((pods.request(j), pods.models(j)) for j in range(len(pods))))
    service = replay_service(model, placer, CARD_POLICY.get(policy, PodPolicy()))
    names = list(nodes.names)
    arrived = np.zeros(len(order), np.int64)
    allocated = np.zeros(len(order), np.int64)
    got = done = failed = failed_milli = 0
    for e, j in enumerate(order.tolist()):
        milli = int(pods.milli[j])
        done += milli
        uid = f"{pods.name}-{seed}-{e}"
        node = schedule(service, pod_object(pods, j, uid), names, rank)   # extender.placing
        if placements is not None:
            placements.append(None if node is None else (node, model.allocations[uid].cards))
        if node is not None:
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
