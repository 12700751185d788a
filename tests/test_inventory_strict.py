"""The inventory annotation takes what encode_inventory writes and refuses the rest: each
field of its JSON type, texts bounded (found by feeding decode_inventory hand-written cards:
``"healthy": "false"`` was a healthy card)."""
from __future__ import annotations

import json

import pytest

from stowage.allocation import MAX_RECORD_TEXT
from stowage.inventory import Card, InventoryError, decode_inventory, encode_inventory


def _card(**fields) -> dict:
    return {"index": 0, "uuid": "GPU-a", "model": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920, **fields}


def _annotation(*cards: dict, **top) -> str:
    return json.dumps({"version": 1, "cards": list(cards), **top})


@pytest.mark.parametrize("fields,said", [
    ({"healthy": "false"}, "healthy must be true or false"),   # bool("false"): a healthy card
    ({"healthy": 0}, "healthy must be true or false"),
    ({"index": 1.9}, "index must be a whole number"),          # int(1.9): card 1
    ({"index": "3"}, "index must be a whole number"),
    ({"index": True}, "index must be a whole number"),          # int(True): card 1
    ({"memoryMiB": "81_920"}, "memoryMiB must be a whole number"),
    ({"numa": 1.5}, "numa must be a whole number"),
    ({"nvlink": ["1"]}, "nvlink index must be a whole number"),
    ({"uuid": ["GPU-a"]}, "uuid must be a text"),              # str(): the uuid "['GPU-a']"
    ({"uuid": "G" * (MAX_RECORD_TEXT + 1)}, f"uuid must be a text of 1 to {MAX_RECORD_TEXT} characters"),
    ({"model": {"name": "A100"}}, "model must be a text"),
    ({"model": "A" * 300}, f"model must be a text of 1 to {MAX_RECORD_TEXT} characters"),
])
def test_a_card_field_of_the_wrong_type_or_size_is_refused(fields, said):
    with pytest.raises(InventoryError, match=rf"card #0 is malformed \({said}"):
        decode_inventory(_annotation(_card(**fields)))


@pytest.mark.parametrize("unit", [0, False, 1.5, "1024"])
def test_a_memory_unit_not_a_whole_number_from_1_is_refused(unit):
    """``0`` and ``false`` fell back to 1024 with nothing said, 1.5 became 1."""
    with pytest.raises(InventoryError, match="memoryUnitMiB"):
        decode_inventory(_annotation(_card(), memoryUnitMiB=unit))


def test_what_encode_inventory_writes_still_decodes():
    cards = (Card(index=0, uuid="GPU-a", model="NVIDIA A100", memory_mib=81920, healthy=False, numa=1, nvlink=(1,)),
             Card(index=1, uuid="GPU-b", model="NVIDIA A100", memory_mib=81920, nvlink=(0,)))
    inv = decode_inventory(encode_inventory(cards, 512))
    assert inv.cards == cards and inv.memory_unit_mib == 512
    bare = decode_inventory(_annotation({"index": 0, "uuid": "GPU-a", "memoryMiB": 1}))   # optional fields left out
    assert bare.cards[0].model == "unknown" and bare.cards[0].healthy and bare.memory_unit_mib == 1024
