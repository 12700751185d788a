"""Records name each card by index and uuid; the device plugin numbers cards in NVML order, so
when it restarts with a card missing (fallen off the bus) the later cards' indices shift down.
Found by review: the watch replayed records by index only, so a running pod was counted on the
card after its own, and its own card was offered (and bound) to a new pod. Records are now
placed by uuid whenever the node's inventory names that uuid, at replay and when the node's
inventory changes under existing pods."""
from __future__ import annotations

from extender_kube_helpers import FakeKube, inv_node, kube, make_pod, new_feeder  # noqa: F401
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, encode_allocation
from stowage.inventory import INVENTORY_ANNOTATION, Card, encode_inventory

GiB = 1024


def whole(node: str, k: int) -> dict[str, str]:
    return {ALLOCATION_ANNOTATION: encode_allocation(AllocationRecord(
        node=node, whole=True, cards=(CardShare(index=k, uuid=f"GPU-{node}-{k}", memory_mib=80 * GiB,
                                                 core_milli=1000),)))}


def inventory(uuids: list[str]) -> str:
    return encode_inventory([Card(index=i, uuid=u, model="NVIDIA A100-SXM4-80GB", memory_mib=80 * GiB)
                             for i, u in enumerate(uuids)])


def held(f, node: str) -> dict[str, str]:
    """uuid -> pod, as the model counts them."""
    m = f.model
    return {m.card_uuid(node, k): al.name for al in m.allocations.values() if al.node == node for k in al.cards}


def test_a_card_shift_under_running_pods_keeps_each_pod_on_its_own_card(kube):
    kube.create_node(inv_node("n1", [80, 80, 80, 80]))
    for k in (2, 3):
        kube.create_pod(make_pod(f"run{k}", gpus=1, node="n1", phase="Running", annotations=whole("n1", k)))
    f = new_feeder(kube)
    try:
        f.start()
        kube.wait_for(lambda: f.ready()[0] and len(f.model.allocations) == 2)
        assert held(f, "n1") == {"GPU-n1-2": "default/run2", "GPU-n1-3": "default/run3"}
        # GPU-n1-1 falls off the bus; the device plugin restarts and numbers the rest 0, 1, 2
        kube.patch_node("n1", {"metadata": {"annotations": {
            INVENTORY_ANNOTATION: inventory(["GPU-n1-0", "GPU-n1-2", "GPU-n1-3"])}}})
        kube.wait_for(lambda: int(f.model.a.exists[f.model.index["n1"]].sum()) == 3)
        kube.wait_for(lambda: held(f, "n1") == {"GPU-n1-2": "default/run2", "GPU-n1-3": "default/run3"})
        i = f.model.index["n1"]
        assert f.model.a.pods[i, :3].tolist() == [0, 1, 1]   # only GPU-n1-0 is free
    finally:
        f.stop()


def test_a_restarted_extender_places_records_by_uuid_on_a_shifted_node(kube):
    kube.create_node(inv_node("n1", [80, 80, 80]))
    kube.patch_node("n1", {"metadata": {"annotations": {
        INVENTORY_ANNOTATION: inventory(["GPU-n1-0", "GPU-n1-2", "GPU-n1-3"])}}})
    kube.create_pod(make_pod("run3", gpus=1, node="n1", phase="Running", annotations=whole("n1", 3)))
    f = new_feeder(kube)
    try:
        f.start()
        kube.wait_for(lambda: f.ready()[0] and len(f.model.allocations) == 1)
        assert held(f, "n1") == {"GPU-n1-3": "default/run3"}    # index 3 no longer exists: uuid says 2
    finally:
        f.stop()
