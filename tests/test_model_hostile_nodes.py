"""What a node's owner (labels, status, our inventory annotation) or a forged record can put in
the model stays bounded and never double-books a card (found by the review of the Kubernetes
feed, 2026-12-04; each failed before)."""
from __future__ import annotations

import pytest

from packing.model import ClusterModel
from packing.pod_policy import PodPolicy
from stowage.allocation import AllocationError, decode_allocation
from stowage.inventory import (GFD_COUNT, GFD_MEMORY, INVENTORY_ANNOTATION, Card, Inventory, InventoryError,
                               decode_inventory, inventory_from_node)
from stowage.resources import GpuRequest

GiB = 1024
SHARE = GpuRequest(mem_mib=20 * GiB)


def node_with(memory_mib: int) -> Inventory:
    return Inventory(cards=(Card(index=0, uuid="GPU-0", model="A100", memory_mib=memory_mib),), source="annotation")



@pytest.mark.parametrize("recorded_mib,then_mib", [(0, 80 * GiB), (40 * GiB, 80 * GiB), (0, 0)],
                         ids=["unknown-then-known", "label-grew", "still-unknown"])
def test_a_card_held_whole_has_no_memory_free_whatever_its_record_says(recorded_mib, then_mib):
    m = ClusterModel()
    m.upsert_node("n1", node_with(recorded_mib))
    # the record replayed as written (check=False, as the watch does)
    m.assign("w", "ns/whole", "n1", [0], GpuRequest(gpus=1), check=False, mem_mib=[recorded_mib])
    m.upsert_node("n1", node_with(then_mib))
    i = m.index["n1"]
    assert m.a.mem_free[i, 0] == 0 and m.a.core_free[i, 0] == 0
    m.release("w")
    assert m.a.mem_free[i, 0] == then_mib and m.a.pods[i, 0] == 0


def test_a_forged_whole_record_booking_no_memory_still_holds_the_card():
    m = ClusterModel()
    m.upsert_node("n1", node_with(80 * GiB))
    m.assign("w", "ns/whole", "n1", [0], GpuRequest(gpus=1), check=False, mem_mib=[0])
    assert m.a.mem_free[m.index["n1"], 0] == 0


@pytest.mark.parametrize("labels,allocatable", [
    ({GFD_COUNT: "100000000"}, {}),
    ({GFD_COUNT: "1_000"}, {}),
    ({GFD_COUNT: "65"}, {}),
    ({GFD_COUNT: "2", GFD_MEMORY: "9" * 20}, {}),
    ({GFD_COUNT: "2", GFD_MEMORY: "1e5"}, {}),
    ({}, {"nvidia.com/gpu": "1k"}),
    ({}, {"nvidia.com/gpu": "65"}),
], ids=["count-huge", "count-underscore", "count-65", "memory-20-digits", "memory-exponent", "alloc-1k", "alloc-65"])
def test_a_node_claiming_absurd_cards_is_an_inventory_error(labels, allocatable):
    node = {"metadata": {"name": "n", "labels": labels}, "status": {"allocatable": allocatable}}
    with pytest.raises(InventoryError):
        inventory_from_node(node)


def test_one_card_at_index_1023_is_refused_not_a_1024_wide_model():
    with pytest.raises(InventoryError):
        decode_inventory('{"cards":[{"index":1023,"uuid":"x","memoryMiB":1}]}')
    with pytest.raises(AllocationError):
        decode_allocation('{"version":1,"node":"n","whole":true,"cards":[{"index":64,"uuid":"x","memoryMiB":1,'
                          '"coreMilli":1000}]}')


def test_sixty_four_cards_are_still_a_node():
    inv = inventory_from_node({"metadata": {"name": "n", "labels": {GFD_COUNT: "64", GFD_MEMORY: "81920"}},
                               "status": {"allocatable": {"nvidia.com/gpu": "64"}}})
    assert len(inv.cards) == 64 and inv.cards[0].memory_mib == 81920


def test_two_cards_under_one_uuid_are_an_inventory_error():
    """A record names cards by uuid, and a record naming one uuid twice is refused (the extender's
    feed and the device plugin alike): a node whose inventory gave two cards one uuid would have had
    its own 2-GPU pods' records refused after their bind. Its inventory is refused instead, saying
    why, as for a duplicate index (the device plugin never publishes such a list: it reads a uuid
    once)."""
    with pytest.raises(InventoryError, match="uuid of card 0"):
        decode_inventory('{"cards":[{"index":0,"uuid":"GPU-a","memoryMiB":1},{"index":1,"uuid":"GPU-a","memoryMiB":1}]}')
