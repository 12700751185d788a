"""Shared bits of the extender-kube tests: a cluster of nodes on the fake API server, a feeder factory."""
from __future__ import annotations

import random

import numpy as np
import pytest

from fakekube import FakeKube, make_node, make_pod  # noqa: F401  (re-exported for the tests)

from extender.kube import KubeFeeder
from packing.model import ClusterModel
from stowage.inventory import GFD_COUNT, GFD_MEMORY, GFD_PRODUCT, INVENTORY_ANNOTATION, Card, encode_inventory


class FakeClock:
    """A clock the test moves by hand, so readiness staleness needs no sleeping."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def inv_node(name: str, mems_gib: list[int], model: str = "NVIDIA A100-SXM4-80GB", **kw) -> dict:
    cards = [Card(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=m * 1024) for i, m in enumerate(mems_gib)]
    return make_node(name, gpus=len(cards), annotations={INVENTORY_ANNOTATION: encode_inventory(cards)}, **kw)


def gfd_node(name: str, count: int, product: str = "NVIDIA-A10", mem_mib: int = 24576, **kw) -> dict:
    return make_node(name, gpus=count, labels={GFD_COUNT: str(count), GFD_PRODUCT: product, GFD_MEMORY: str(mem_mib)},
                     **kw)


def new_feeder(kube: FakeKube, model: ClusterModel | None = None, **kw) -> KubeFeeder:
    opts = dict(watch_timeout_s=60, stale_after_s=30.0, backoff_base_s=0.01, backoff_max_s=0.05,
                request_timeout_s=10.0, rng=random.Random(7))
    opts.update(kw)
    return KubeFeeder(model if model is not None else ClusterModel(), kube.api_client(), **opts)


def started(kube: FakeKube, feeders: list, **kw) -> KubeFeeder:
    """A feeder on ``kube`` (``new_feeder(**kw)``), started, stopped by the ``feeders`` fixture,
    once ready (both first lists applied)."""
    f = new_feeder(kube, **kw)
    feeders.append(f)
    f.start()
    kube.wait_for(lambda: f.ready()[0])
    return f


def row(model: ClusterModel, node: str) -> dict:
    """One node's card state by name (slot numbers differ between models)."""
    with model.lock:
        i = model.index[node]
        a = model.a
        k = np.flatnonzero(a.exists[i])
        return {"cards": k.tolist(), "healthy": a.healthy[i, k].tolist(),
                "mem_total": a.mem_total[i, k].tolist(), "mem_free": a.mem_free[i, k].tolist(),
                "core_free": a.core_free[i, k].tolist(), "pods": a.pods[i, k].tolist(),
                "node_ok": bool(a.node_ok[i])}


@pytest.fixture
def kube():
    """A fake API server for one test (import this fixture into the test module)."""
    with FakeKube(bookmark_interval=3600) as k:
        yield k


@pytest.fixture
def feeders():
    """Feeders a test starts; stopped afterwards, and their threads must be gone."""
    made = []
    yield made
    for f in made:
        f.stop()
    for f in made:
        for t in f._threads.values():
            assert not t.is_alive(), "feeder thread still running after stop()"
