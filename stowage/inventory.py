"""The node's card inventory: the one format the device plugin writes and the extender reads.

The device plugin publishes it on its Node as the annotation :data:`INVENTORY_ANNOTATION`, a
JSON object::

    {"version": 1,
     "memoryUnitMiB": 1024,
     "cards": [{"index": 0, "uuid": "GPU-3f2a...", "model": "NVIDIA A100-SXM4-80GB",
                "memoryMiB": 81920, "healthy": true, "numa": 0, "nvlink": [1, 2, 3]}, ...]}

``numa`` (-1 or absent: unknown) and ``nvlink`` (indices of cards with an NVLink to this one)
are optional. Where the annotation is absent (a cluster running NVIDIA's own device plugin),
:func:`inventory_from_node` falls back to NVIDIA GPU Feature Discovery labels, then to
``status.allocatable["nvidia.com/gpu"]`` alone, so whole-GPU packing still works there.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from .digits import whole_number
from .resources import DEFAULT_MEMORY_UNIT_MIB, MAX_CARD_MEMORY_MIB, RESOURCE_GPU, RequestError, quantity_to_int

INVENTORY_ANNOTATION = "stowage.io/gpu-inventory"
INVENTORY_VERSION = 1

GFD_COUNT = "nvidia.com/gpu.count"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"  # MiB per card

UNKNOWN_MODEL = "unknown"


class InventoryError(ValueError):
    """An inventory annotation that cannot be read; the message names what is wrong."""


@dataclass(frozen=True)
class Card:
    """One physical GPU as the scheduler needs to know it."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool = True
    numa: int = -1
    nvlink: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {"index": d["index"], "uuid": d["uuid"], "model": d["model"], "memoryMiB": d["memory_mib"],
                "healthy": d["healthy"], "numa": d["numa"], "nvlink": list(d["nvlink"])}


@dataclass(frozen=True)
class Inventory:
    """All cards of one node, and where the information came from (for `inspect` and logs)."""

    cards: tuple[Card, ...]
    source: str = "annotation"  # annotation | gfd-labels | allocatable | simulated
    memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB
    whole_only: bool = False  # True when per-card memory is unknown: only whole-GPU pods fit


def encode_inventory(cards: list[Card] | tuple[Card, ...], memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB) -> str:
    """The annotation value for these cards (compact JSON, stable key order)."""
    return json.dumps({"version": INVENTORY_VERSION, "memoryUnitMiB": memory_unit_mib,
                       "cards": [c.to_json() for c in sorted(cards, key=lambda c: c.index)]},
                      separators=(",", ":"), sort_keys=True)


# Cards one node may have (indices 0..63): real nodes have at most 16. Why bounded this tightly:
# the model's card axis is as wide as the widest node, for every node (and its NVLink table is
# that squared), so one node claiming card 1023 cost every filter's arrays 64 times their size.
MAX_CARDS_PER_NODE = 64
MAX_NUMA_NODE = 4095
MAX_MEMORY_UNIT_MIB = 1 << 20


# Characters of a card's uuid or model name: the allocation record names cards by uuid and
# holds it to this (stowage.allocation.MAX_RECORD_TEXT), so a longer one could be chosen at
# bind and then never honoured; NVML's names are ~40 characters.
MAX_CARD_TEXT = 256


def _bounded(v: Any, lo: int, hi: int, what: str) -> int:
    """``v`` if it is a JSON integer within [lo, hi]; ValueError otherwise. Not ``int(v)``: it
    took 1.9 as card 1, true as 1 and "81_920" as 81920 (inf and NaN are floats: refused too)."""
    if type(v) is not int:
        raise ValueError(f"{what} must be a whole number, not {str(v)[:40]!r}")
    if not lo <= v <= hi:
        raise ValueError(f"{what} {str(v)[:40]} is outside {lo}..{hi}")
    return v


def _text(v: Any, what: str) -> str:
    """``v`` if it is a text of 1 to MAX_CARD_TEXT characters (``str()`` made a list a uuid)."""
    if not isinstance(v, str) or not 1 <= len(v) <= MAX_CARD_TEXT:
        raise ValueError(f"{what} must be a text of 1 to {MAX_CARD_TEXT} characters")
    return v


def decode_inventory(value: str) -> Inventory:
    """Parse the annotation value; raises :class:`InventoryError` with a precise message (and
    nothing else, whatever the text: a node's annotation is not trusted to be well formed)."""
    try:
        doc = json.loads(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InventoryError(f"{INVENTORY_ANNOTATION} is not JSON: {str(exc)[:120]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cards"), list):
        raise InventoryError(f"{INVENTORY_ANNOTATION} must be an object with a 'cards' list")
    if doc.get("version", INVENTORY_VERSION) != INVENTORY_VERSION:
        raise InventoryError(f"{INVENTORY_ANNOTATION} version {str(doc.get('version'))[:40]!r} is not supported "
                             f"(want {INVENTORY_VERSION})")
    if len(doc["cards"]) > MAX_CARDS_PER_NODE:
        raise InventoryError(f"{INVENTORY_ANNOTATION} lists {len(doc['cards'])} cards, at most {MAX_CARDS_PER_NODE}")
    cards = []
    seen: set[int] = set()
    uuids: dict[str, int] = {}   # uuid -> the index of the card that has it
    top = MAX_CARDS_PER_NODE - 1
    for i, c in enumerate(doc["cards"]):
        try:
            if not isinstance(c, dict):
                raise TypeError("not an object")
            links = c.get("nvlink") or ()
            if not isinstance(links, (list, tuple)) or len(links) > MAX_CARDS_PER_NODE:
                raise TypeError("nvlink must be a list of card indices")
            numa = c.get("numa")
            healthy = c.get("healthy", True)
            if not isinstance(healthy, bool):   # bool("false") was True: a sick card handed out
                raise ValueError("healthy must be true or false")
            card = Card(index=_bounded(c["index"], 0, top, "index"), uuid=_text(c["uuid"], "uuid"),
                        model=_text(c.get("model") or UNKNOWN_MODEL, "model"),
                        memory_mib=_bounded(c["memoryMiB"], 0, MAX_CARD_MEMORY_MIB, "memoryMiB"),
                        healthy=healthy,
                        numa=-1 if numa is None else _bounded(numa, -1, MAX_NUMA_NODE, "numa"),
                        nvlink=tuple(_bounded(x, 0, top, "nvlink index") for x in links))
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise InventoryError(f"{INVENTORY_ANNOTATION}: card #{i} is malformed ({str(exc)[:120]})") from None
        if card.index in seen:
            raise InventoryError(f"{INVENTORY_ANNOTATION}: card #{i} has a duplicate index {card.index}")
        if card.uuid in uuids:
            # records name cards by uuid: one uuid for two cards could never be recorded (refused)
            raise InventoryError(f"{INVENTORY_ANNOTATION}: card #{i} has the uuid of card {uuids[card.uuid]} "
                                 f"({card.uuid[:64]!r})")
        seen.add(card.index)
        uuids[card.uuid] = card.index
        cards.append(card)
    try:
        unit = _bounded(doc.get("memoryUnitMiB", DEFAULT_MEMORY_UNIT_MIB), 1, MAX_MEMORY_UNIT_MIB, "memoryUnitMiB")
    except (TypeError, ValueError, OverflowError) as exc:
        raise InventoryError(f"{INVENTORY_ANNOTATION}: {str(exc)[:120]}") from None
    return Inventory(cards=tuple(sorted(cards, key=lambda c: c.index)), source="annotation", memory_unit_mib=unit)


def inventory_from_node(node: Mapping[str, Any]) -> Inventory:
    """A node's cards from, in order of preference: our annotation, GFD labels, allocatable.

    A malformed annotation raises :class:`InventoryError` (the caller logs it and treats the node
    as having no schedulable cards rather than guessing).
    """
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    name = meta.get("name", "?")
    if INVENTORY_ANNOTATION in annotations:
        return decode_inventory(annotations[INVENTORY_ANNOTATION])
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or {}
    try:
        alloc_gpus = quantity_to_int(allocatable.get(RESOURCE_GPU, 0), f"{name} allocatable {RESOURCE_GPU}")
    except RequestError as exc:
        raise InventoryError(str(exc)) from exc
    if alloc_gpus > MAX_CARDS_PER_NODE:
        raise InventoryError(f"node {name}: allocatable {RESOURCE_GPU} {alloc_gpus} is more than the "
                             f"{MAX_CARDS_PER_NODE} cards a node may have")
    if GFD_COUNT in labels:
        count = _label_int(labels, GFD_COUNT, MAX_CARDS_PER_NODE, name)
        mem = _label_int(labels, GFD_MEMORY, MAX_CARD_MEMORY_MIB, name) if labels.get(GFD_MEMORY) else 0
        model = labels.get(GFD_PRODUCT) or UNKNOWN_MODEL
        # Allocatable below the label count means the device plugin reports unhealthy cards.
        healthy_n = min(count, alloc_gpus) if RESOURCE_GPU in allocatable else count
        cards = tuple(Card(index=i, uuid=f"{name}/gpu{i}", model=model, memory_mib=mem, healthy=i < healthy_n)
                      for i in range(count))
        return Inventory(cards=cards, source="gfd-labels", whole_only=mem <= 0)
    cards = tuple(Card(index=i, uuid=f"{name}/gpu{i}", model=UNKNOWN_MODEL, memory_mib=0) for i in range(alloc_gpus))
    return Inventory(cards=cards, source="allocatable", whole_only=True)


def _label_int(labels: Mapping[str, Any], key: str, hi: int, node: str) -> int:
    """A GPU Feature Discovery label as a whole number in [0, hi] (plain ASCII digits: ``int()``
    would also take ``1_000`` and 20-digit values that overflow the model's arrays)."""
    v = str(labels.get(key, ""))
    number = whole_number(v, hi + 1)
    if number is None or number > hi:
        raise InventoryError(f"node {node}: GPU Feature Discovery label {key}={v[:40]!r} is not a whole number "
                             f"from 0 to {hi}")
    return number


_PREFIXES = ("nvidia-", "tesla-", "geforce-", "quadro-")


def normalize_model(name: str) -> str:
    """Canonical model name: upper case, '-' separated, vendor/brand prefixes dropped.

    'NVIDIA A100-SXM4-80GB' (NVML) and 'NVIDIA-A100-SXM4-80GB' (GFD label) both become
    'A100-SXM4-80GB'; 'Tesla T4' becomes 'T4'.
    """
    s = re.sub(r"[\s_]+", "-", name.strip()).lower()
    changed = True
    while changed:
        changed = False
        for p in _PREFIXES:
            if s.startswith(p):
                s, changed = s[len(p):], True
    return s.upper()


def model_matches(pattern: str, model: str) -> bool:
    """Exact model matching on whole '-' separated tokens: the pattern's tokens must be a prefix.

    'A100' matches 'A100-SXM4-80GB' and 'A100-PCIE-40GB' but never 'A10' or 'A100X'; 'A10'
    matches 'A10' and 'A10-24GB' but never 'A100' or 'A10G'.
    """
    p = normalize_model(pattern).split("-")
    m = normalize_model(model).split("-")
    return len(p) <= len(m) and m[: len(p)] == p
