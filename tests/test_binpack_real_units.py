"""The pack default (Stowage's policy) on a cluster in real units: MiB cards of several sizes,
host CPU/memory left to kube-scheduler, the workload learned online from extender requests."""
from __future__ import annotations

import numpy as np
import pytest

from packing.model import ClusterModel
from packing.pod_policy import PodPolicy
from packing.fit import card_mask, fit
from packing.registry import placer_for
from extender.simcluster import load_cluster
from stowage.inventory import Card, Inventory
from stowage.resources import GpuRequest

GIB = 1024


def place(model: ClusterModel, p, req: GpuRequest, uid: str) -> tuple[str, list[int]]:
    a = model.a
    pol = PodPolicy()
    f = fit(a, req, card_mask(a, model.models, pol, req))
    idx = np.flatnonzero(f.ok)
    s = np.asarray(p.score(a, req, idx, f.usable), float)
    assert np.all(np.isfinite(s))
    i = int(idx[int(np.argmax(s))])
    cards = p.choose_cards(a, i, req, f.usable[i], pol)
    model.assign(uid, uid, model.names[i], cards, req)
    return model.names[i], cards


@pytest.fixture
def builtin():
    model = ClusterModel()
    load_cluster().populate(model)           # 36 nodes: H100/A100 80 GiB, A100 40 GiB, A10/L4 24 GiB, T4 16 GiB
    return model


def test_shares_fill_a_started_card_before_opening_another(builtin):
    p = placer_for("pack")
    small = GpuRequest(mem_mib=5 * GIB, core_milli=100)
    for r in [small] * 8 + [GpuRequest(gpus=1)] * 6 + [GpuRequest(gpus=8)] * 2:
        p.observe(r)                         # 16 pods: the learned table is rebuilt at powers of two
    used: dict[tuple[str, int], int] = {}
    for n in range(9):
        node, cards = place(builtin, p, small, f"s{n}")
        used[(node, cards[0])] = used.get((node, cards[0]), 0) + 1
        room = {key: builtin.a.mem_total[builtin.index[key[0]], key[1]] // small.mem_mib for key in used}
        # At most one card has room for another slice: no card is opened while one has room.
        assert sum(used[key] < room[key] for key in used) <= 1, used
    assert len({node for node, _ in used}) <= 2


def test_whole_pods_pack_nodes_and_keep_big_nodes_whole(builtin):
    p = placer_for("pack")
    for r in [GpuRequest(gpus=1)] * 12 + [GpuRequest(gpus=8)] * 4:
        p.observe(r)
    nodes = [place(builtin, p, GpuRequest(gpus=1), f"w{n}")[0] for n in range(10)]
    per_node = {n: nodes.count(n) for n in nodes}
    a = builtin.a
    cap = {n: int((a.exists & a.healthy)[builtin.index[n]].sum()) for n in per_node}
    # Filled node by node: all nodes but one are full.
    assert sum(per_node[n] < cap[n] for n in per_node) <= 1, per_node
    # No 8-card node was broken by the 1-GPU pods, so every 8-GPU pod still finds one.
    assert all(int(a.exists[builtin.index[n]].sum()) < 8 for n in per_node), per_node
    eight = [place(builtin, p, GpuRequest(gpus=8), f"e{n}") for n in range(16)]
    assert all(len(c) == 8 for _, c in eight)


def test_a_20gib_slice_joins_a_started_80gib_card():
    """20 GiB slices fit four to an 80 GiB card and one to a 24 GiB card: with one slice already on
    an 80 GiB card, the next goes there rather than using up a fresh card of either size."""
    m = ClusterModel()
    for name, count, mib in (("small", 4, 24 * GIB), ("big", 8, 80 * GIB)):
        cards = tuple(Card(index=k, uuid=f"{name}-{k}", model="M", memory_mib=mib) for k in range(count))
        m.upsert_node(name, Inventory(cards=cards, source="simulated"))
    p = placer_for("pack")
    slice20 = GpuRequest(mem_mib=20 * GIB)
    for r in [slice20] * 4 + [GpuRequest(gpus=1)] * 4:
        p.observe(r)                         # 8 pods: the learned table is rebuilt at powers of two
    m.assign("first", "first", "big", [5], slice20)
    assert place(m, p, slice20, "second") == ("big", [5])


def test_share_milli_is_counted_on_the_card_it_would_use():
    p = placer_for("pack")
    p.observe(GpuRequest(mem_mib=20 * GIB, cpu_milli=4000, host_mem_mib=32 * GIB))
    p.observe(GpuRequest(gpus=1, cpu_milli=8000, host_mem_mib=64 * GIB))
    assert p.gpu_milli_on(80 * GIB) == pytest.approx(1000 + 250)
    assert p.gpu_milli_on(24 * GIB) == pytest.approx(1000 + 1000 * 20 / 24)
    assert p.gpu_milli_on(16 * GIB) == pytest.approx(2000)          # at most one card
    # Trace units (1000 memory units per card): the share is the pod's gpu_milli.
    t = placer_for("pack")
    t.observe(GpuRequest(mem_mib=470, core_milli=470, cpu_milli=1000, host_mem_mib=1000))
    assert t.gpu_milli_on(1000) == 470


def test_stranding_uses_each_nodes_card_size():
    """Same idle share, same CPU left: a node of small cards, where the workload's shares are
    worth more milli-cards, needs more CPU per milli-card, so more of its idle GPU is stranded."""
    p = placer_for("pack")
    for _ in range(4):
        p.observe(GpuRequest(mem_mib=12 * GIB, cpu_milli=6000, host_mem_mib=0))
    idle = np.array([1000.0, 1000.0])
    cpu = np.array([6000.0, 6000.0])
    hmem = np.array([np.inf, np.inf])
    st = p.stranded(idle, cpu, hmem, np.array([24 * GIB, 80 * GIB], float))
    # 24 GiB card: 12 GiB = 500 milli per 6 CPUs -> 6 CPUs feed 500 of 1000 idle;
    # 80 GiB card: 150 milli per 6 CPUs -> 6 CPUs feed 150.
    assert st == pytest.approx([500.0, 850.0])

