"""The preempt verb's count of what kube-scheduler sees free on a node: the Node's
``status.allocatable`` nvidia.com/gpu, gpu-memory and gpu-core less the requests of every pod
bound there (NodeResourcesFit: ``allocatable < request + requested`` is "Insufficient"), not the
healthy cards' totals less the pods holding cards in the model.

Each node and pod goes through the feed's own path (``KubeFeeder._apply_node``/``_apply_pod``,
i.e. ``extender.kube_objects.node_view``/``pod_view``) into the model that ``judge_node`` reads.
Found by reading ``packing.preempt.scheduler_free`` against kube-scheduler v1.28's
``noderesources.fitsRequest``: where the two counts differ, the verb kept too few victims
(kube-scheduler evicted them and then still refused the preemptor) or too many."""
from __future__ import annotations

import pytest
from extender_kube_helpers import new_feeder
from fakekube import FakeKube, make_node, make_pod
from test_inspect_plan_live import alloc, stowage_pod

from packing.model import ClusterModel
from packing.pod_policy import PodPolicy
from packing.preempt import Counts, holder, judge_node, scheduler_free
from stowage.inventory import INVENTORY_ANNOTATION, Card, encode_inventory
from stowage.resources import GpuRequest

GiB = 1024
P = PodPolicy()


def node(name: str, ncards: int, mem_gib: int, unit_mib: int = 1024, healthy: int | None = None,
         **allocatable: str) -> dict:
    """A node with Stowage's inventory annotation (``healthy``: the first that many cards are
    healthy; all by default) and the given GPU allocatable (keys: gpu, gpu_memory, gpu_core)."""
    cards = [Card(index=k, uuid=f"GPU-{name}-{k}", model="NVIDIA L4", memory_mib=mem_gib * GiB,
                  healthy=healthy is None or k < healthy) for k in range(ncards)]
    stated = {f"nvidia.com/{k.replace('_', '-')}": v for k, v in allocatable.items()}
    return make_node(name, annotations={INVENTORY_ANNOTATION: encode_inventory(cards, unit_mib)}, allocatable=stated)


def whole(name: str, node_name: str, card: int, mem_gib: int) -> dict:
    return stowage_pod(name, uid=f"uid-{name}", gpus=1, node=node_name, phase="Running",
                       annotations=alloc(node_name, [(card, mem_gib * GiB, 1000)], True))


def share(name: str, node_name: str, card: int, gib: int, unit_mib: int = 1024) -> dict:
    return stowage_pod(name, uid=f"uid-{name}", gpu_memory=gib * GiB // unit_mib, node=node_name, phase="Running",
                       annotations=alloc(node_name, [(card, gib * GiB, 0)], False))


@pytest.fixture(scope="module")
def kube():
    with FakeKube() as k:
        yield k


def fed(kube: FakeKube, nodes: list[dict], pods: list[dict], unit_mib: int = 1024) -> ClusterModel:
    f = new_feeder(kube, ClusterModel(), memory_unit_mib=unit_mib)
    for n in nodes:
        f._apply_node(n)
    for p in pods:
        f._apply_pod(p)
    return f.model


def test_allocatable_gpus_below_the_healthy_cards_keep_the_victims_kube_scheduler_needs(kube):
    """4 healthy cards but allocatable nvidia.com/gpu 3 (the device plugin advertises fewer),
    a, b, c on cards 0-2. A 2-GPU preemptor: kube-scheduler's count has 3 - 3 = 0 free, so it
    proposes a and b. Counted from the healthy cards (4 - 3 = 1 free) the verb kept a alone,
    which the cards allow (cards 0 and 3); kube-scheduler then evicted a and still refused the
    preemptor (3 - 2 = 1 < 2)."""
    m = fed(kube, [node("n", 4, 24, gpu="3")], [whole(x, "n", k, 24) for k, x in enumerate("abc")])
    with m.lock:
        v = judge_node(m, "n", GpuRequest(gpus=2), P, ["uid-a", "uid-b"], {})
    assert v.victims == ("uid-a", "uid-b"), v


def test_allocatable_gpu_memory_above_the_healthy_cards_does_not_drop_the_node(kube):
    """Card 2 just went unhealthy; allocatable gpu-memory still says 72 GiB (3 x 24), and e, f
    (12 GiB each) still hold it. kube-scheduler counts 72 - 72 = 0 free and proposes a and b
    (card 0, 24 GiB) for a 20 GiB slice: enough by its count and by the cards. Counted from the
    healthy cards (48 - 72 = -24 free) the verb wanted 44 GiB freed and dropped the node."""
    pods = [share("a", "n", 0, 12), share("b", "n", 0, 12), share("c", "n", 1, 12), share("d", "n", 1, 12),
            share("e", "n", 2, 12), share("f", "n", 2, 12)]
    m = fed(kube, [node("n", 3, 24, healthy=2, gpu_memory="72", gpu_core="300")], pods)
    with m.lock:
        v = judge_node(m, "n", GpuRequest(mem_mib=20 * GiB), P, ["uid-a", "uid-b"], {})
    assert v.victims == ("uid-a", "uid-b"), v


@pytest.mark.parametrize("unit_mib", [1024, 512])
def test_allocatable_gpu_memory_below_the_cards_memory_counts_in_the_feeds_unit(kube, unit_mib):
    """2 x 24 GiB cards, allocatable gpu-memory 40 GiB (in the device plugin's unit, the feed's
    --memory-unit). a, b (12 GiB) on card 0, c (12 GiB) on card 1: kube-scheduler has 40 - 36 =
    4 GiB free, so a 20 GiB slice needs 16 GiB freed: c alone (12) is not enough. Counted from the
    cards' memory (48 - 36 = 12 free) the verb kept c alone."""
    n = node("n", 2, 24, unit_mib, gpu_memory=str(40 * GiB // unit_mib), gpu_core="200")
    m = fed(kube, [n], [share("a", "n", 0, 12, unit_mib), share("b", "n", 0, 12, unit_mib),
                        share("c", "n", 1, 12, unit_mib)], unit_mib)
    with m.lock:
        i = m.index["n"]
        on = [a for a in m.allocations.values() if a.node == "n"]
        # (nvidia.com/gpu not stated: its 2 healthy cards)
        assert scheduler_free(m.a, i, [holder(a) for a in on], m.meta["n"].gpu_allocatable) == Counts(
            gpus=2, mem_mib=4 * GiB, core_milli=2000)
        v = judge_node(m, "n", GpuRequest(mem_mib=20 * GiB), P, ["uid-a", "uid-c"], {})
    assert v.victims == ("uid-a", "uid-c"), v


def test_pods_without_a_record_count_what_they_ask(kube):
    """3 cards, allocatable 3. theirs (another scheduler's 1-GPU pod, no record: Stowage sees
    its card free) is not a victim (higher priority). a, b on cards 0, 1. kube-scheduler's count
    has 3 - 3 = 0 free; for a 2-GPU preemptor it proposes a and b. Counting only the pods that
    hold cards in the model (3 - 2 = 1 free) the verb kept a alone."""
    theirs = make_pod("theirs", uid="uid-theirs", gpus=1, node="n", phase="Running")
    m = fed(kube, [node("n", 3, 24, gpu="3")], [theirs, whole("a", "n", 0, 24), whole("b", "n", 1, 24)])
    with m.lock:
        v = judge_node(m, "n", GpuRequest(gpus=2), P, ["uid-a", "uid-b"], {})
    assert v.victims == ("uid-a", "uid-b"), v
    assert m.allocations["uid-theirs"].kube_request == Counts(gpus=1)


def test_a_victim_without_cards_frees_its_request_in_kube_schedulers_count(kube):
    """A proposed victim that holds no card in the model (theirs, no record) is always kept; what
    it asks is freed in kube-scheduler's count by its eviction, so with it gone a alone is enough
    for a 2-GPU preemptor (3 - 3 + 1 + 1 = 2), and b is spared."""
    theirs = make_pod("theirs", uid="uid-theirs", gpus=1, node="n", phase="Running")
    m = fed(kube, [node("n", 3, 24, gpu="3")], [theirs, whole("a", "n", 0, 24), whole("b", "n", 1, 24)])
    with m.lock:
        v = judge_node(m, "n", GpuRequest(gpus=2), P, ["uid-theirs", "uid-a", "uid-b"], {})
    assert v.victims == ("uid-theirs", "uid-a"), v


def test_a_node_that_states_no_gpu_allocatable_falls_back_to_its_healthy_cards(kube):
    """No GPU key in status.allocatable (a hand-made node): the count is the healthy cards'."""
    m = fed(kube, [node("n", 4, 24)], [whole(x, "n", k, 24) for k, x in enumerate("abc")])
    with m.lock:
        assert m.meta["n"].gpu_allocatable.gpus is None
        v = judge_node(m, "n", GpuRequest(gpus=2), P, ["uid-a", "uid-b"], {})
    assert v.victims == ("uid-a",), v


@pytest.mark.parametrize("value", ["-1", "1e400", "NaN", "two", "", "1.5", {"x": 1}, None])
def test_a_hostile_allocatable_is_that_nodes_fallback_only(kube, value):
    """An unreadable or impossible allocatable is not stated (the healthy cards count); a
    fraction is rounded up as kube-scheduler's Quantity.Value() reads it. Nothing raises."""
    n = node("n", 2, 24)
    n["status"]["allocatable"]["nvidia.com/gpu"] = value
    m = fed(kube, [n, node("ok", 2, 24, gpu="1")], [])
    got = m.meta["n"].gpu_allocatable.gpus
    assert got == (2 if value == "1.5" else None)
    assert m.meta["ok"].gpu_allocatable.gpus == 1


def test_a_change_of_allocatable_alone_reaches_the_model(kube):
    """The kubelet lowers allocatable nvidia.com/gpu (an XID) before anything else of the Node
    changes: the feed skips a node event whose view is unchanged (heartbeats), so the allocatable
    must be part of that view or the model keeps the old count."""
    f = new_feeder(kube, ClusterModel())
    f._apply_node(node("n", 4, 24, gpu="4", gpu_memory="96"))
    f._apply_node(node("n", 4, 24, gpu="3", gpu_memory="72"))
    assert f.model.meta["n"].gpu_allocatable.gpus == 3
    assert f.model.meta["n"].gpu_allocatable.mem_mib == 72 * GiB


def test_renumbered_cards_keep_what_kube_scheduler_counts_the_pod_asking(kube):
    """A whole-GPU pod that also states nvidia.com/gpu-memory (a per-card minimum) counts that
    memory against the node's allocatable in kube-scheduler's count. When the node's cards are
    renumbered the feed puts the pod back on its cards by uuid; it once re-booked it from its
    record alone, and the memory the pod asks dropped out of the preempt verb's count."""
    f = new_feeder(kube, ClusterModel())
    f._apply_node(node("n", 2, 24, gpu="2", gpu_memory="48"))
    pod = whole("a", "n", 1, 24)
    pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu-memory"] = "20"
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu-memory"] = "20"
    f._apply_pod(pod)
    asked = Counts(gpus=1, mem_mib=20 * GiB)
    assert f.model.allocations["uid-a"].kube_request == asked
    renumbered = node("n", 2, 24, gpu="2", gpu_memory="48")
    inv = [Card(index=1 - k, uuid=f"GPU-n-{k}", model="NVIDIA L4", memory_mib=24 * GiB) for k in range(2)]
    renumbered["metadata"]["annotations"][INVENTORY_ANNOTATION] = encode_inventory(inv, 1024)
    f._apply_node(renumbered)
    al = f.model.allocations["uid-a"]
    assert al.cards == (0,), al   # card GPU-n-1 is index 0 now
    assert al.kube_request == asked
