"""Placers with a cluster-wide term in their share-pod score (``local_pairs`` + ``global_pairs``,
declared by ``split_pairs``; extender/rowcache.py ``RowCache._pair_values``): the row-local part is cached per row content,
the global part is computed per request; answers equal computing everything afresh."""
from __future__ import annotations

import random

import numpy as np
import orjson
import pytest

from packing.placer import PlacerBase
from packing.registry import get_placer
from packing.model import CardArrays, ClusterModel
from packing.pod_policy import PACK, SPREAD
from extender.service import ExtenderService
from extender.wire import encode, parse_binding_args, parse_extender_args
from stowage.resources import GpuRequest

from benchmarks.latency import cluster as bench_cluster

from test_latency_equivalence import POD_ANNOTATIONS, POD_LIMITS, random_model

class GapCrowdPlacer(PlacerBase):
    """Toy placer: a share goes where the card's free memory afterwards is smallest (row-local),
    minus how many cards of the whole cluster already have exactly that free memory (global)."""

    name = "gap-crowd"
    split_pairs = True

    def local_pairs(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray):
        rows, kk = np.nonzero(usable[idx])
        after = a.mem_free[idx[rows], kk] - req.mem_mib
        return -after / 1024.0 + 0.001 * kk, rows, kk

    def global_pairs(self, a: CardArrays, req: GpuRequest, ii: np.ndarray, kk: np.ndarray) -> np.ndarray:
        after = a.mem_free[ii, kk] - req.mem_mib
        live = a.exists & (a.pods > 0)
        values, counts = np.unique(a.mem_free[live], return_counts=True)
        pos = np.clip(np.searchsorted(values, after), 0, max(len(values) - 1, 0))
        hit = (values[pos] == after) if len(values) else np.zeros(len(after), bool)
        return -np.where(hit, counts[pos] if len(values) else 0, 0).astype(float)

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        if not req.is_shared:
            return -a.pods[idx].sum(axis=1).astype(float)
        s, rows, kk = self.local_pairs(a, req, idx, usable)
        tot = s + self.global_pairs(a, req, idx[rows], kk)
        out = np.full(len(idx), -np.inf)
        np.maximum.at(out, rows, tot)
        return out


def services(model: ClusterModel) -> tuple[ExtenderService, ExtenderService]:
    make = (lambda v: GapCrowdPlacer() if v == PACK else get_placer("least-allocated"))
    return (ExtenderService(model, placer_factory=make, speedups=True),
            ExtenderService(model, placer_factory=make, speedups=False))


@pytest.mark.parametrize("seed", range(3))
def test_cached_pair_scores_equal_fresh_ones_while_the_cluster_changes(seed):
    rng = random.Random(seed)
    model = random_model(rng, 40)
    cached, fresh = services(model)
    names = model.node_names()
    live: list[str] = []
    checked = 0
    for step in range(150):
        limits = rng.choice(POD_LIMITS[4:7] + POD_LIMITS[:2])
        pod = bench_cluster.pod_object(f"g{seed}-{step}", limits, rng.choice(POD_ANNOTATIONS[:2] + POD_ANNOTATIONS[3:5]))
        body = encode({"Pod": pod, "Nodes": None, "NodeNames": names})
        got = cached.filter(parse_extender_args(body)).to_json()
        assert got == fresh.filter(parse_extender_args(body)).to_json()
        passing = got["NodeNames"] or []
        if len(passing) > 1:
            body = encode({"Pod": pod, "Nodes": None, "NodeNames": passing})
            a, b = cached.prioritize(parse_extender_args(body), as_json=True), fresh.prioritize(parse_extender_args(body), as_json=True)
            assert a == b, step
            checked += "gpu-memory" in str(limits)
        md = pod["metadata"]
        if passing and rng.random() < 0.6:
            best = max(orjson.loads(a), key=lambda s: s["Score"])["Host"] if len(passing) > 1 else passing[0]
            bind = {"PodName": md["name"], "PodNamespace": md["namespace"], "PodUID": md["uid"], "Node": best}
            if cached.bind(parse_binding_args(bind)) == "":
                live.append(md["uid"])
        elif live and rng.random() < 0.3:
            model.release(live.pop(rng.randrange(len(live))))
    assert checked > 20
    rc = cached.path.row_cache
    assert rc is not None and rc.rows_evaluated < rc.scores_recomputed + 150 * len(names)


def test_pair_scores_are_cached_per_content_and_the_global_part_is_not():
    """After a bind elsewhere, the local pair scores are not recomputed, yet the answer follows
    the new global histogram."""
    model = ClusterModel()
    from test_binpack_stowage_churn import eight_gpu_node
    for n in ("a", "b", "c"):
        eight_gpu_node(model, n)
    svc = ExtenderService(model, placer_factory=lambda v: GapCrowdPlacer() if v == PACK else
                          get_placer("least-allocated"), filter_keeps="fitting")
    pod = bench_cluster.pod_object("p", {"nvidia.com/gpu-memory": "10"})
    body = encode({"Pod": pod, "Nodes": None, "NodeNames": ["a", "b", "c"]})
    svc.filter(parse_extender_args(body))
    rc = svc.path.row_cache
    before = rc.scores_recomputed
    first = orjson.loads(svc.prioritize(parse_extender_args(body), as_json=True))
    # three identical empty nodes: one content, its pairs evaluated once
    assert rc.scores_recomputed == before + 1 and len({s["Score"] for s in first}) == 1
    # a share on node c changes c's content (new local pairs) and the global histogram
    model.assign("x", "default/x", "c", [0], GpuRequest(mem_mib=10 * 1024), check=True)
    svc.filter(parse_extender_args(body))
    again = orjson.loads(svc.prioritize(parse_extender_args(body), as_json=True))
    assert rc.scores_recomputed == before + 2  # only c's new content
    fresh = ExtenderService(model, placer_factory=lambda v: GapCrowdPlacer() if v == PACK else
                            get_placer("least-allocated"), speedups=False)
    assert again == orjson.loads(fresh.prioritize(parse_extender_args(body), as_json=True))
