"""Pure reconciliation logic: which records disagree with the kubelet, and how they are corrected."""
from __future__ import annotations

from gpunode.podresources.client import ContainerDevices

from deviceplugin.allocator import Ledger
from gpunode.devices import DeviceTable
from gpunode.nvml import GpuInfo
from deviceplugin.corrections import corrections, kubelet_view
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, encode_allocation
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_MEMORY

NODE = "n1"
UUIDS = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(4)]


def _table() -> DeviceTable:
    return DeviceTable([GpuInfo(index=i, uuid=u, name="NVIDIA A100", memory_mib=40960 + 1024 * i, numa=-1, minor=i,
                                pci_bus_id=f"0000:0{i}:00.0") for i, u in enumerate(UUIDS)], 1024)


def _pod(name: str, cards: list[int], whole: bool = False, node: str = NODE, rec_node: str = NODE,
         bound: str = "2024-01-01T00:00:01Z", **extra) -> dict:
    rec = AllocationRecord(node=rec_node, whole=whole, cards=tuple(
        CardShare(i, UUIDS[i], 40960 + 1024 * i if whole else 4096, 1000 if whole else 100) for i in cards))
    pod = {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                        "annotations": {ALLOCATION_ANNOTATION: encode_allocation(rec)}},
           "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"limits": (
               {RESOURCE_GPU: str(len(cards))} if whole else {RESOURCE_GPU_MEMORY: "4", "nvidia.com/gpu-core": "10"})}}]},
           "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "lastTransitionTime": bound}]}}
    pod.update(extra)
    return pod


def _mem(pod: str, card: int, n: int = 4, container: str = "main") -> ContainerDevices:
    return ContainerDevices("ns", pod, container, RESOURCE_GPU_MEMORY, tuple(f"{UUIDS[card]}::{k}" for k in range(n)))


def test_view_ignores_foreign_resources_and_unknown_ids():
    t = _table()
    rows = [_mem("a", 1), ContainerDevices("ns", "a", "main", "example.com/foo", ("x",)),
            ContainerDevices("ns", "a", "main", RESOURCE_GPU, ("GPU-gone",))]
    view = kubelet_view(rows, t)
    assert view.cards(("ns", "a"), t) == [UUIDS[1]]
    assert view.containers(("ns", "a"), RESOURCE_GPU) == frozenset()


def test_consistent_and_partial_allocations_need_nothing():
    t = _table()
    pods = [_pod("a", [1]), _pod("w", [2, 3], whole=True), _pod("pending", [0])]
    rows = [_mem("a", 1), ContainerDevices("ns", "w", "main", RESOURCE_GPU, (UUIDS[3],))]  # w: 1 of 2 cards so far
    assert corrections(pods, kubelet_view(rows, t), NODE, t) == ([], [])


def test_swap_corrects_the_admitted_pod_and_moves_its_pending_partner():
    t = _table()
    pods = [_pod("a", [2], bound="2024-01-01T00:00:01Z"), _pod("b", [0], bound="2024-01-01T00:00:02Z")]
    fixes, notes = corrections(pods, kubelet_view([_mem("b", 2)], t), NODE, t)
    assert notes == []
    assert [(f.name, f.old.uuids, f.new.uuids) for f in fixes] == [("a", [UUIDS[2]], [UUIDS[0]]),   # partner first
                                                                   ("b", [UUIDS[0]], [UUIDS[2]])]
    assert fixes[1].new.cards[0] == CardShare(2, UUIDS[2], 4096, 100)


def test_partner_needs_the_same_share():
    t = _table()
    big = _pod("a", [2])
    big_rec = AllocationRecord(node=NODE, whole=False, cards=(CardShare(2, UUIDS[2], 8192, 100),))
    big["metadata"]["annotations"][ALLOCATION_ANNOTATION] = encode_allocation(big_rec)
    fixes, _ = corrections([big, _pod("b", [0])], kubelet_view([_mem("b", 2)], t), NODE, t)
    assert [f.name for f in fixes] == ["b"]  # a's share differs: it is not b's interchangeable partner


def test_whole_card_memory_follows_the_card():
    t = _table()
    pods = [_pod("w", [1, 2], whole=True)]
    rows = [ContainerDevices("ns", "w", "main", RESOURCE_GPU, (UUIDS[1], UUIDS[3]))]
    (fix,), _ = corrections(pods, kubelet_view(rows, t), NODE, t)
    assert fix.new.cards == (CardShare(1, UUIDS[1], 40960 + 1024, 1000), CardShare(3, UUIDS[3], 40960 + 3072, 1000))


def test_other_nodes_terminal_deleted_and_uncorrectable_pods_are_left_alone():
    t = _table()
    pods = [_pod("other", [0], node="n2"), _pod("elsewhere", [0], rec_node="n2"),
            _pod("done", [0], status={"phase": "Succeeded"}),
            _pod("gone", [0], metadata={"name": "gone", "namespace": "ns", "uid": "u", "deletionTimestamp": "x",
                                        "annotations": {ALLOCATION_ANNOTATION: encode_allocation(
                                            AllocationRecord(NODE, (CardShare(0, UUIDS[0], 4096, 100),), False))}}),
            _pod("spread", [0])]
    rows = [_mem(n, 1) for n in ("other", "elsewhere", "done", "gone")] + [_mem("spread", 1), _mem("spread", 2, container="b")]
    fixes, notes = corrections(pods, kubelet_view(rows, t), NODE, t)
    assert fixes == []
    assert len(notes) == 1 and notes[0].startswith("ns/spread:") and "more cards than its record" in notes[0]


def test_ledger_reattributes_answers_the_kubelet_lists_under_another_pod():
    led = Ledger()
    led.add("uid-a", RESOURCE_GPU_MEMORY, ["m0", "m1"])   # answered as a's, but the kubelet gave them to b
    led.add("uid-c", RESOURCE_GPU_MEMORY, ["m5"])         # init container: not listed, stays
    owners = {"m0": "uid-b", "m1": "uid-b"}
    led.reattribute(lambda r, i: owners.get(i))
    assert led.count("uid-a", RESOURCE_GPU_MEMORY) == 0
    assert led.count("uid-b", RESOURCE_GPU_MEMORY) == 1 and led.count("uid-c", RESOURCE_GPU_MEMORY) == 1
