"""The pod's allocation record: which card(s) the extender chose, written on the pod at bind time.

The extender writes it (before creating the Binding) as the annotation
:data:`ALLOCATION_ANNOTATION`; the device plugin reads it to hand the container exactly those
cards; a restarted extender rebuilds its model from it. JSON::

    {"version": 1, "node": "gpu-node-3",
     "cards": [{"index": 2, "uuid": "GPU-...", "memoryMiB": 20480, "coreMilli": 300}],
     "whole": false}

For whole-GPU pods ``whole`` is true and each card's memoryMiB/coreMilli is the card's total.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

ALLOCATION_ANNOTATION = "stowage.io/allocation"
ALLOCATION_VERSION = 1


class AllocationError(ValueError):
    """An allocation annotation that cannot be read."""


@dataclass(frozen=True)
class CardShare:
    index: int
    uuid: str
    memory_mib: int
    core_milli: int


@dataclass(frozen=True)
class AllocationRecord:
    node: str
    cards: tuple[CardShare, ...]
    whole: bool

    @property
    def uuids(self) -> list[str]:
        return [c.uuid for c in self.cards]


def encode_allocation(rec: AllocationRecord) -> str:
    return json.dumps({"version": ALLOCATION_VERSION, "node": rec.node, "whole": rec.whole,
                       "cards": [{"index": c.index, "uuid": c.uuid, "memoryMiB": c.memory_mib,
                                  "coreMilli": c.core_milli} for c in rec.cards]},
                      separators=(",", ":"), sort_keys=True)


def decode_allocation(value: str) -> AllocationRecord:
    try:
        doc = json.loads(value)
        if doc.get("version", ALLOCATION_VERSION) != ALLOCATION_VERSION:
            raise AllocationError(f"unsupported {ALLOCATION_ANNOTATION} version {doc.get('version')!r}")
        cards = tuple(CardShare(index=int(c["index"]), uuid=str(c["uuid"]), memory_mib=int(c["memoryMiB"]),
                                core_milli=int(c["coreMilli"])) for c in doc["cards"])
        return AllocationRecord(node=str(doc["node"]), cards=cards, whole=bool(doc["whole"]))
    except AllocationError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise AllocationError(f"{ALLOCATION_ANNOTATION} is malformed: {exc!r}") from exc


def allocation_of_pod(pod: Mapping[str, Any]) -> AllocationRecord | None:
    """The record on a pod object, or None when it has none. Malformed records raise."""
    ann = ((pod.get("metadata") or {}).get("annotations") or {})
    value = ann.get(ALLOCATION_ANNOTATION)
    return decode_allocation(value) if value else None
