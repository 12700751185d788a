"""Small hand-built clusters with known answers, shared by the planning/inspect/plan tests."""
from __future__ import annotations

from packing.model import ClusterModel
from stowage.inventory import Card, Inventory
from stowage.resources import GpuRequest

GiB = 1024


def add_node(m: ClusterModel, name: str, ncards: int, mem_gib: int, model: str, *, healthy: tuple[bool, ...] = ()) -> None:
    cards = tuple(Card(index=k, uuid=f"GPU-{name}-{k}", model=model, memory_mib=mem_gib * GiB,
                       healthy=healthy[k] if k < len(healthy) else True) for k in range(ncards))
    m.upsert_node(name, Inventory(cards=cards, source="simulated"))


def mixed_cluster() -> ClusterModel:
    """a: 4 x A100 80 GiB, one card whole-used; b: 4 x A100 40 GiB, card 0 holds a 10 GiB/30 %
    slice; c: 2 x T4 16 GiB, empty."""
    m = ClusterModel()
    add_node(m, "a", 4, 80, "A100-SXM4-80GB")
    add_node(m, "b", 4, 40, "A100-PCIE-40GB")
    add_node(m, "c", 2, 16, "T4")
    m.assign("u1", "ns/whole-1", "a", [0], GpuRequest(gpus=1))
    m.assign("u2", "ns/slice-1", "b", [0], GpuRequest(mem_mib=10 * GiB, core_milli=300))
    return m


def uniform_cluster(pods_per_node: dict[str, int], ncards: int = 4, mem_gib: int = 40,
                    model: str = "A100-PCIE-40GB") -> ClusterModel:
    """Identical nodes; node n holds pods_per_node[n] one-GPU pods on its first cards."""
    m = ClusterModel()
    for name, npods in pods_per_node.items():
        add_node(m, name, ncards, mem_gib, model)
        for k in range(npods):
            m.assign(f"{name}-u{k}", f"ns/{name}-p{k}", name, [k], GpuRequest(gpus=1))
    return m
