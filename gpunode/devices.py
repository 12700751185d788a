"""Device IDs and device lists for the three resources: pure functions over the discovered cards.

Scheme (documented in docs/deviceplugin.md):
- ``nvidia.com/gpu``: one device per card, ID = the card key.
- ``nvidia.com/gpu-memory``: one device per memory unit, ID = ``<card key>::<n>``.
- ``nvidia.com/gpu-core``: 100 devices per card (percent), ID = ``<card key>::<n>``.

The card key is the card's UUID when the longest ID stays within the kubelet's 63-character
limit, else ``gpu-<first 32 hex digits of sha256(uuid)>``: deterministic, so IDs survive plugin
restarts (the kubelet's checkpoint refers to them), and the plugin maps it back to the card.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable

from stowage.resources import GPU_RESOURCES, RESOURCE_GPU, RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY
from stowage.digits import whole_number

from .nvml import GpuInfo

MAX_ID_LEN = 63
SEP = "::"
CORE_UNITS_PER_CARD = 100
_MAX_UNIT_DIGITS = 7  # room for up to 9,999,999 units per card (1 MiB units on a 9 TiB card)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


class UnknownDevice(KeyError):
    """A device ID this plugin never advertised."""


def card_key(uuid: str) -> str:
    if len(uuid) + len(SEP) + _MAX_UNIT_DIGITS <= MAX_ID_LEN and SEP not in uuid:
        return uuid
    return "gpu-" + hashlib.sha256(uuid.encode()).hexdigest()[:32]


def units_per_card(resource: str, card: GpuInfo, memory_unit_mib: int) -> int:
    """How many devices of ``resource`` one card offers (0 for ``nvidia.com/gpu`` means 'one, whole')."""
    if resource == RESOURCE_GPU_MEMORY:
        return card.memory_mib // memory_unit_mib
    if resource == RESOURCE_GPU_CORE:
        return CORE_UNITS_PER_CARD
    return 1


def device_ids(resource: str, card: GpuInfo, memory_unit_mib: int) -> list[str]:
    key = card_key(card.uuid)
    if resource == RESOURCE_GPU:
        return [key]
    return [f"{key}{SEP}{n}" for n in range(units_per_card(resource, card, memory_unit_mib))]


def id_lengths(resource: str, card: GpuInfo, memory_unit_mib: int) -> dict[int, int]:
    """How many of the card's device IDs have each length, without building them.

    Lets the plugin size its ListAndWatch message for any memory unit in microseconds, where
    building the list at a 1 MiB unit takes over a million objects.
    """
    key = card_key(card.uuid)
    if resource == RESOURCE_GPU:
        return {len(key): 1}
    count, out, digits = units_per_card(resource, card, memory_unit_mib), {}, 1
    while count > (0 if digits == 1 else 10 ** (digits - 1)):
        lo = 0 if digits == 1 else 10 ** (digits - 1)
        out[len(key) + len(SEP) + digits] = min(count, 10 ** digits) - lo
        digits += 1
    return out


@dataclass(frozen=True)
class DeviceEntry:
    id: str
    uuid: str
    health: str
    numa: int


class DeviceTable:
    """The cards of this node and the device IDs of each resource, with ID -> card lookup."""

    def __init__(self, cards: Iterable[GpuInfo], memory_unit_mib: int) -> None:
        if memory_unit_mib <= 0:
            raise ValueError("memory unit must be a positive number of MiB")
        self.cards: tuple[GpuInfo, ...] = tuple(sorted(cards, key=lambda c: c.index))
        self.memory_unit_mib = memory_unit_mib
        self._by_key = {card_key(c.uuid): c for c in self.cards}
        self.by_uuid = {c.uuid: c for c in self.cards}

    def devices(self, resource: str, health: dict[str, bool]) -> list[DeviceEntry]:
        out = []
        for c in self.cards:
            h = HEALTHY if health.get(c.uuid, True) else UNHEALTHY
            out.extend(DeviceEntry(i, c.uuid, h, c.numa) for i in device_ids(resource, c, self.memory_unit_mib))
        return out

    def card_of(self, resource: str, device_id: str) -> GpuInfo:
        """The card a device ID belongs to; :class:`UnknownDevice` for IDs never advertised."""
        if resource not in GPU_RESOURCES:
            raise UnknownDevice(device_id)
        if resource == RESOURCE_GPU:
            card = self._by_key.get(device_id)
            if card is None:
                raise UnknownDevice(device_id)
            return card
        key, sep, n = device_id.rpartition(SEP)
        card = self._by_key.get(key) if sep else None
        unit = _unit(n)
        if card is None or unit is None or unit >= units_per_card(resource, card, self.memory_unit_mib):
            raise UnknownDevice(device_id)
        return card

    @staticmethod
    def unit_number(device_id: str) -> int:
        """The ``<n>`` of a unit ID (0 for whole-card IDs); used only for a stable order."""
        _, sep, n = device_id.rpartition(SEP)
        return (_unit(n) or 0) if sep else 0


def _unit(text: str) -> int | None:
    """The unit number of ``text`` written exactly as the plugin writes it (``str(n)``), else None.

    Only that spelling was advertised: ``01`` would otherwise be a second device beside ``1``, and
    ``str.isdigit`` accepts digits such as ``²`` that ``int`` then refuses (:mod:`stowage.digits`).
    """
    if len(text) > 1 and text[0] == "0":
        return None
    number = whole_number(text, 10**_MAX_UNIT_DIGITS)   # more digits than we write is no unit of ours
    return number if number is not None and number < 10**_MAX_UNIT_DIGITS else None
