"""Who uses which card, and how much: pure functions from device assignments and processes.

1. :func:`holders_by_card` decodes the device IDs the kubelet reports (PodResources) into cards:
   Stowage's IDs (``<card key>``, ``<card key>::<n>``, the card key being the UUID or its hashed
   short form, see ``deviceplugin/devices.py``) and NVIDIA's plugin's plain UUIDs (and its
   time-slicing ``<uuid>::<n>``), whatever the resource name.
2. :func:`split_card` divides one card between the containers holding it:
   - one container: it gets the card's own memory used and utilisation;
   - several: each process on the card (NVML) is owned by a pod (cgroup -> UID -> name), so a pod
     gets its processes' memory and SM utilisation. Processes whose pod cannot be told (no
     ``/proc`` access, no UID mapping) are split between the holders that got nothing measured, in
     proportion to the units each holds; processes of pods not holding the card (or of the host)
     are nobody's. Any such guess marks the card ``estimated``.
   - several, and NVML could not list the card's processes at all: the card's own memory used and
     utilisation are split in proportion to the units each holds (``estimated``): unknown is not
     "idle", and false zeros would make an HPA scale down.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Iterable, Mapping

from gpunode.devices import SEP, card_key
from stowage.resources import RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY

from .checkpoint import PodKey
from .nvmlreader import CardSample
from gpunode.podresources.client import ContainerDevices


@dataclass(frozen=True, order=True)
class ContainerRef:
    namespace: str
    pod: str
    container: str

    @property
    def pod_key(self) -> PodKey:
        return PodKey(self.namespace, self.pod)


@dataclass
class Holding:
    """What one container holds of one card: counts of memory units, core units, other devices."""

    memory_units: int = 0
    core_units: int = 0
    other: int = 0


# The longest name a Kubernetes object can have (a DNS subdomain: pod names; namespaces and
# container names are DNS labels, 63). The kubelet's names become label values as they are.
MAX_NAME = 253


def nameable(a: ContainerDevices) -> bool:
    """Whether a row's namespace, pod and container could name a Kubernetes object: none empty, none
    longer than :data:`MAX_NAME`. Other rows cannot be a real pod's (the API server refuses such
    names) and would make unbounded label values: a megabyte pod name in every scrape, or a scrape
    Prometheus fails whole for one over its label length limit."""
    return all(0 < len(n) <= MAX_NAME for n in (a.namespace, a.pod, a.container))


def key_index(uuids: Iterable[str]) -> dict[str, str]:
    """Every key a device ID may carry for a card -> its UUID (our card key and the plain UUID)."""
    out: dict[str, str] = {}
    for u in uuids:
        out[u] = u
        out[card_key(u)] = u
    return out


def card_of_device(device_id: str, keys: Mapping[str, str]) -> str | None:
    """The UUID a device ID refers to, or None for devices that are not cards on this node."""
    if device_id in keys:
        return keys[device_id]
    head, sep, n = device_id.rpartition(SEP)
    if sep and n.isdigit():
        return keys.get(head)
    return None


def holders_by_card(assignments: Iterable[ContainerDevices], uuids: Iterable[str]) -> dict[str, dict[ContainerRef, Holding]]:
    """Card UUID -> the containers holding any of its devices, with what each holds.

    A device ID counts once per container and resource however often it is listed: the kubelet
    lists a device once per NUMA node it reports, and a device on two nodes is not two units.
    """
    keys = key_index(uuids)
    out: dict[str, dict[ContainerRef, Holding]] = {}
    seen: set[tuple[ContainerRef, str, str]] = set()
    for a in assignments:
        ref = ContainerRef(a.namespace, a.pod, a.container)
        for d in a.device_ids:
            uuid = card_of_device(d, keys)
            if uuid is None or (ref, a.resource, d) in seen:
                continue
            seen.add((ref, a.resource, d))
            h = out.setdefault(uuid, {}).setdefault(ref, Holding())
            if a.resource == RESOURCE_GPU_MEMORY:
                h.memory_units += 1
            elif a.resource == RESOURCE_GPU_CORE:
                h.core_units += 1
            else:
                h.other += 1
    return out


class Owner(Enum):
    """Process owners that are not a known pod."""

    UNKNOWN = "unknown"   # could not tell (no /proc entry, UID not mappable)
    FOREIGN = "foreign"   # known not to be a holder of any device (host process, pod without devices)


@dataclass
class Share:
    memory_bytes: float = 0.0
    utilization: float | None = 0.0   # None: the card reports no utilisation at all


@dataclass
class CardSplit:
    shares: dict[ContainerRef, Share] = field(default_factory=dict)
    estimated: bool = False


def _weights(holders: Mapping[ContainerRef, Holding], refs: list[ContainerRef], kind: str) -> dict[ContainerRef, float]:
    """Relative weight of each ref for splitting memory ("memory") or utilisation ("core")."""
    by_core = kind == "core" and any(holders[r].core_units for r in refs)

    def w(h: Holding) -> float:
        if h.other:
            return float("inf")          # a whole-card device outweighs any units
        return float(h.core_units if by_core else h.memory_units)
    raw = {r: w(holders[r]) for r in refs}
    if any(v == float("inf") for v in raw.values()):
        raw = {r: (1.0 if v == float("inf") else 0.0) for r, v in raw.items()}
    total = sum(raw.values())
    if total <= 0:
        return {r: 1.0 / len(refs) for r in refs} if refs else {}
    return {r: v / total for r, v in raw.items()}


def split_card(card: CardSample, holders: Mapping[ContainerRef, Holding],
               owners: Mapping[int, PodKey | Owner]) -> CardSplit:
    """Divide one card's memory used and utilisation between the containers holding it."""
    refs = sorted(holders)
    if not refs:
        return CardSplit()
    card_util = card.utilization or 0.0
    if len(refs) == 1:
        return CardSplit({refs[0]: Share(float(card.memory_used_bytes), card.utilization)})

    if not card.processes_known:
        mem_w, util_w = _weights(holders, refs, "memory"), _weights(holders, refs, "core")
        util = card.utilization
        return CardSplit({r: Share(card.memory_used_bytes * mem_w[r],
                                   None if util is None else min(max(util * util_w[r], 0.0), 1.0))
                          for r in refs}, estimated=True)

    split = CardSplit({r: Share() for r in refs})
    by_pod: dict[PodKey, list[ContainerRef]] = {}
    for r in refs:
        by_pod.setdefault(r.pod_key, []).append(r)
    measured: dict[PodKey, Share] = {}
    unknown = Share()
    for p in card.processes:
        owner = owners.get(p.pid, Owner.UNKNOWN)
        util = (p.sm_util or 0.0) / 100.0
        if isinstance(owner, PodKey):
            if owner not in by_pod:
                continue                       # a pod that does not hold this card
            s = measured.setdefault(owner, Share())
        elif owner is Owner.UNKNOWN:
            s = unknown
        else:
            continue
        s.memory_bytes += p.memory_bytes
        s.utilization += util

    def give(share: Share, to: list[ContainerRef], mem_w: dict[ContainerRef, float], util_w: dict[ContainerRef, float]) -> None:
        for r in to:
            split.shares[r].memory_bytes += share.memory_bytes * mem_w[r]
            split.shares[r].utilization = (split.shares[r].utilization or 0.0) + share.utilization * util_w[r]

    for pod, share in measured.items():
        cs = by_pod[pod]
        if len(cs) > 1:
            split.estimated = True             # containers of one pod share a UID: split by units
        give(share, cs, _weights(holders, cs, "memory"), _weights(holders, cs, "core"))
    if any(owners.get(p.pid, Owner.UNKNOWN) is Owner.UNKNOWN for p in card.processes):
        # A process whose owner cannot be told may be a holder's: the split is an estimate either
        # way (its measure goes to the holders that got nothing measured, or, with none, to nobody).
        split.estimated = True
        idle = [r for r in refs if r.pod_key not in measured]
        if idle:
            give(unknown, idle, _weights(holders, idle, "memory"), _weights(holders, idle, "core"))

    if not card.process_memory_known:
        # Processes listed without their memory: what was measured of it is incomplete (0 for
        # those), so divide the card's used memory by the memory units held instead.
        split.estimated = True
        mem_w = _weights(holders, refs, "memory")
        for r in refs:
            split.shares[r].memory_bytes = card.memory_used_bytes * mem_w[r]
    if not card.process_util_known and card.processes:
        # No per-process utilisation: divide the card's utilisation like its process memory.
        split.estimated = True
        mem_total = sum(s.memory_bytes for s in split.shares.values())
        weights = ({r: s.memory_bytes / mem_total for r, s in split.shares.items()} if mem_total > 0
                   else _weights(holders, refs, "core"))
        for r in refs:
            split.shares[r].utilization = card_util * weights[r]
    for s in split.shares.values():
        if not card.process_util_known and card.utilization is None:
            s.utilization = None             # nothing to divide: leave the series out
        elif s.utilization is not None:
            s.utilization = min(max(s.utilization, 0.0), 1.0)
    return split
