"""What the kubelet really allocated versus the pods' allocation records: pure logic.

The kubelet's device plugin calls never name the pod, but its PodResources API does: for every
pod (namespace/name) and container it lists the device IDs given. From that list this module
derives:

- :class:`KubeletView`: our resources' device IDs per pod and container, and who owns each ID.
  The allocator uses it to count containers already served (this survives a plugin restart,
  unlike the in-memory ledger) and to recognise the pod the kubelet is admitting right now
  (admission is serial in the kubelet: a pod with some but not all devices is that pod).
- :func:`corrections`: records that disagree with what the kubelet gave. When two pods of the
  same shape were pending on different cards and the kubelet admitted them in another order than
  bound, the first one admitted took the other's card. Its record is corrected to the card it
  got, and the still pending partner whose card was taken is moved to the card that was left
  free: every card keeps exactly the load the extender planned, and every record ends up naming
  the card its pod runs on. Records that agree with the kubelet are never changed.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from stowage.allocation import AllocationError, AllocationRecord, CardShare, RecordTrust
from stowage.resources import GPU_RESOURCES

from gpunode.devices import DeviceTable, UnknownDevice

PodRef = tuple[str, str]  # (namespace, name): PodResources carries no pod UID

_TERMINAL = {"Succeeded", "Failed"}


@dataclass(frozen=True)
class KubeletView:
    """Our resources' device IDs as the kubelet lists them: pod -> container -> resource -> IDs."""

    pods: Mapping[PodRef, Mapping[str, Mapping[str, tuple[str, ...]]]]
    # every pod the kubelet lists, devices or not: it has taken the pod up (it lists a pod from before
    # its admission), so only these can be the pod it is admitting
    listed: frozenset[PodRef] = frozenset()

    def lists(self, ref: PodRef) -> bool:
        return ref in self.listed or ref in self.pods

    def containers(self, ref: PodRef, resource: str) -> frozenset[str]:
        """Names of the pod's containers that hold devices of ``resource``."""
        return frozenset(c for c, res in (self.pods.get(ref) or {}).items() if res.get(resource))

    def owners(self, resource: str) -> dict[str, PodRef]:
        return {i: ref for ref, conts in self.pods.items() for res in conts.values() for i in res.get(resource, ())}

    def cards(self, ref: PodRef, table: DeviceTable) -> list[str]:
        """Card UUIDs the pod's devices are on, in order of first appearance."""
        out: dict[str, None] = {}
        for res in (self.pods.get(ref) or {}).values():
            for resource, ids in res.items():
                for i in ids:
                    out[table.card_of(resource, i).uuid] = None
        return list(out)


def kubelet_view(rows: Iterable[Any], table: DeviceTable, listed: Iterable[PodRef] = ()) -> KubeletView:
    """Build the view from PodResources rows (``gpunode.podresources.client.ContainerDevices``) and
    the pods listed (``PodList.pods``; a pod with rows is listed anyway).

    Only our resources and IDs this plugin advertises count (a card that vanished since is
    ignored rather than guessed at).
    """
    pods: dict[PodRef, dict[str, dict[str, tuple[str, ...]]]] = {}
    for row in rows:
        if row.resource not in GPU_RESOURCES:
            continue
        ids = []
        for i in row.device_ids:
            try:
                table.card_of(row.resource, i)
            except UnknownDevice:
                continue
            ids.append(i)
        if ids:
            cont = pods.setdefault((row.namespace, row.pod), {}).setdefault(row.container, {})
            cont[row.resource] = tuple(cont.get(row.resource, ())) + tuple(ids)
    return KubeletView(pods, frozenset(listed))


@dataclass(frozen=True)
class Correction:
    """A record to rewrite: ``old`` disagrees with what the kubelet did (or, for a partner, must follow)."""

    uid: str
    namespace: str
    name: str
    old: AllocationRecord
    new: AllocationRecord
    why: str

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class _Pod:
    uid: str
    ref: PodRef
    record: AllocationRecord
    actual: list[str]
    order: tuple[str, ...]


def bind_order(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """Bind time, creation time, namespace, name: the order in which the kubelet admits pods."""
    meta = pod.get("metadata") or {}
    bound = ""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "PodScheduled":
            bound = str(cond.get("lastTransitionTime") or "")
    return (bound, str(meta.get("creationTimestamp") or ""), str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def share_on(table: DeviceTable, old: CardShare, uuid: str, whole: bool) -> CardShare:
    """``old`` moved to card ``uuid``: same amounts, except that a whole card's memory is that card's."""
    card = table.by_uuid[uuid]
    return CardShare(index=card.index, uuid=uuid, memory_mib=card.memory_mib if whole else old.memory_mib,
                     core_milli=old.core_milli)


def _pods_of_node(pods: Iterable[Mapping[str, Any]], node: str, view: KubeletView, table: DeviceTable,
                  trust: RecordTrust | None = None) -> list[_Pod]:
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("spec") or {}).get("nodeName") != node or meta.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") in _TERMINAL:
            continue
        try:
            rec = (trust or RecordTrust()).record_of(pod)
        except AllocationError:
            continue
        if rec is None or rec.node != node or not rec.cards or any(u not in table.by_uuid for u in rec.uuids):
            continue
        ref = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        out.append(_Pod(str(meta.get("uid") or ""), ref, rec, view.cards(ref, table), bind_order(pod)))
    return out


def corrections(pods: Iterable[Mapping[str, Any]], view: KubeletView, node: str,
                table: DeviceTable, trust: RecordTrust | None = None) -> tuple[list[Correction], list[str]]:
    """Records of this node's pods to correct (partners first), and notes on mismatches left alone.

    A pod's record is corrected only when the kubelet gave it devices on a card its record does
    not name; a pod still being admitted whose devices so far lie on recorded cards agrees.
    Pods of other nodes, terminal or deleted pods and pods with unreadable records are skipped.
    """
    mine = sorted(_pods_of_node(pods, node, view, table, trust), key=lambda p: p.order)
    fixes: list[Correction] = []
    partners: list[Correction] = []
    notes: list[str] = []
    taken: list[tuple[_Pod, str, CardShare]] = []   # (pod, card it took, its planned share it left free)
    for p in mine:
        extra = [u for u in p.actual if u not in p.record.uuids]
        if not extra:
            continue
        missing = [c for c in p.record.cards if c.uuid not in p.actual]
        ref = f"{p.ref[0]}/{p.ref[1]}"
        if len(extra) > len(missing):
            notes.append(f"{ref}: the kubelet gave it devices on card(s) {', '.join(p.actual)}, more cards than its "
                         f"record names ({', '.join(p.record.uuids)}); record left unchanged")
            continue
        cards, todo = [], list(extra)
        for c in p.record.cards:
            if c.uuid in p.actual or not todo:
                cards.append(c)
                continue
            new = todo.pop(0)
            cards.append(share_on(table, c, new, p.record.whole))
            taken.append((p, new, c))
        fixes.append(Correction(p.uid, p.ref[0], p.ref[1], p.record, replace(p.record, cards=tuple(cards)),
                                f"the kubelet gave it card(s) {', '.join(p.actual)}; its record named "
                                f"{', '.join(p.record.uuids)}"))
    moved: set[str] = {f.uid for f in fixes}
    for p, card, freed in taken:
        for q in mine:
            if q.uid in moved or q.actual or q.record.whole != p.record.whole or len(q.record.cards) != len(p.record.cards):
                continue
            share = next((c for c in q.record.cards if c.uuid == card), None)
            if share is None or freed.uuid in q.record.uuids:
                continue
            if not q.record.whole and (share.memory_mib, share.core_milli) != (freed.memory_mib, freed.core_milli):
                continue
            cards = tuple(share_on(table, c, freed.uuid, q.record.whole) if c.uuid == card else c for c in q.record.cards)
            partners.append(Correction(q.uid, q.ref[0], q.ref[1], q.record, replace(q.record, cards=cards),
                                       f"pod {p.ref[0]}/{p.ref[1]} was admitted first and took its card {card}; "
                                       f"moved to the card {freed.uuid} that pod left free, so each card keeps its "
                                       "planned load"))
            moved.add(q.uid)
            break
    return partners + fixes, notes
