"""The pod's allocation record: which card(s) the extender chose, written on the pod at bind time.

The extender writes it (before creating the Binding) as the annotation
:data:`ALLOCATION_ANNOTATION`; the device plugin reads it to hand the container exactly those
cards; a restarted extender rebuilds its model from it. JSON::

    {"version": 1, "node": "gpu-node-3",
     "cards": [{"index": 2, "uuid": "GPU-...", "memoryMiB": 20480, "coreMilli": 300}],
     "whole": false}

For whole-GPU pods ``whole`` is true and each card's memoryMiB/coreMilli is the card's total.

Any pod author can write this annotation on their own pod, so a record is honoured only when it
could have come from the extender (docs/security.md):

- Signed: with a :class:`RecordKey` (a Secret only the extender and the device plugin can read,
  ``--record-key-file``) the record carries ``"sig"``, an HMAC-SHA256 over the record and the
  pod's uid. A record without it, with a wrong one, or copied from another pod is not honoured.
- Consistent: :func:`record_mismatch` compares the record with the pod's own request (how many
  whole cards, which slice), so even an unsigned cluster never books more than a pod asks for.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .inventory import MAX_CARD_TEXT, MAX_CARDS_PER_NODE
from .resources import (CORE_MILLI_PER_CARD, DEFAULT_MEMORY_UNIT_MIB, MAX_CARD_MEMORY_MIB, GpuRequest, RequestError,
                        pod_gpu_request)

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
    sig: str = ""   # HMAC of the record and its pod's uid, when the cluster signs records

    @property
    def uuids(self) -> list[str]:
        return [c.uuid for c in self.cards]


MIN_KEY_BYTES = 32


@dataclass(frozen=True)
class RecordKey:
    """The secret records are signed with: only the extender and the device plugin can read it."""

    secret: bytes

    @classmethod
    def load(cls, path: str | Path) -> "RecordKey":
        """Read the key file (a mounted Secret); at least 32 bytes, surrounding whitespace ignored."""
        try:
            secret = Path(path).read_bytes().strip()
        except OSError as exc:
            raise AllocationError(f"cannot read the record key file {path}: {exc.strerror or exc}") from exc
        if len(secret) < MIN_KEY_BYTES:
            raise AllocationError(f"the record key in {path} has {len(secret)} bytes; at least {MIN_KEY_BYTES} are "
                                  "needed (e.g. `openssl rand -hex 32`)")
        return cls(secret)

    def signature(self, rec: AllocationRecord, pod_uid: str) -> str:
        payload = _canonical(rec).encode() + b"\n" + pod_uid.encode()
        return hmac.new(self.secret, payload, hashlib.sha256).hexdigest()

    def signs(self, rec: AllocationRecord, pod_uid: str) -> bool:
        return bool(rec.sig) and hmac.compare_digest(rec.sig, self.signature(rec, pod_uid))


def _doc(rec: AllocationRecord) -> dict[str, Any]:
    """The record as JSON data, without its signature (what the signature covers)."""
    return {"version": ALLOCATION_VERSION, "node": rec.node, "whole": rec.whole,
            "cards": [{"index": c.index, "uuid": c.uuid, "memoryMiB": c.memory_mib, "coreMilli": c.core_milli}
                      for c in rec.cards]}


def _dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def _canonical(rec: AllocationRecord) -> str:
    return _dumps(_doc(rec))


def encode_allocation(rec: AllocationRecord, key: RecordKey | None = None, pod_uid: str = "") -> str:
    """The annotation value; signed for ``pod_uid`` when ``key`` is given."""
    doc = _doc(rec)
    if key is not None:
        doc["sig"] = key.signature(rec, pod_uid)
    return _dumps(doc)


MAX_RECORD_CARDS = 64            # the most cards one pod may ask for (MAX_GPUS_PER_POD)
MAX_CARD_INDEX = MAX_CARDS_PER_NODE - 1
MAX_RECORD_TEXT = MAX_CARD_TEXT  # characters of a node name or card uuid (an inventory's uuid fits)


def _int_field(card: Mapping[str, Any], name: str, hi: int) -> int:
    """An integer in [0, hi]: JSON numbers only (not text, not true/false, not 2.0), as the
    extender writes them."""
    v = card[name]
    if type(v) is not int or not 0 <= v <= hi:
        raise AllocationError(f"{ALLOCATION_ANNOTATION} is malformed: {name} must be an integer from 0 to {hi}, "
                              f"not {str(v)[:40]!r}")
    return v


def _text_field(doc: Mapping[str, Any], name: str) -> str:
    v = doc[name]
    if not isinstance(v, str) or len(v) > MAX_RECORD_TEXT:
        raise AllocationError(f"{ALLOCATION_ANNOTATION} is malformed: {name} must be a text of at most "
                              f"{MAX_RECORD_TEXT} characters")
    return v


def decode_allocation(value: str) -> AllocationRecord:
    """Parse a record; :class:`AllocationError` (and nothing else) for anything the extender could
    not have written: a pod author can write any text here, and the device plugin and the
    extender read the records of every pod of a node, so one pod's bad record must stay its own
    problem (an ``OverflowError`` or ``RecursionError`` escaping here once blocked every pod of
    its node)."""
    try:
        doc = json.loads(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise AllocationError(f"{ALLOCATION_ANNOTATION} is malformed: not JSON ({str(exc)[:120]})") from None
    try:
        if not isinstance(doc, dict):
            raise AllocationError(f"{ALLOCATION_ANNOTATION} is malformed: not a JSON object")
        if doc.get("version", ALLOCATION_VERSION) != ALLOCATION_VERSION:
            raise AllocationError(f"unsupported {ALLOCATION_ANNOTATION} version {str(doc.get('version'))[:40]!r}")
        raw_cards = doc["cards"]
        if not isinstance(raw_cards, list) or len(raw_cards) > MAX_RECORD_CARDS:
            raise AllocationError(f"{ALLOCATION_ANNOTATION} is malformed: cards must be a list of at most "
                                  f"{MAX_RECORD_CARDS}")
        if not all(isinstance(c, dict) for c in raw_cards):
            raise AllocationError(f"{ALLOCATION_ANNOTATION} is malformed: each card must be a JSON object")
        cards = tuple(CardShare(index=_int_field(c, "index", MAX_CARD_INDEX), uuid=_text_field(c, "uuid"),
                                memory_mib=_int_field(c, "memoryMiB", MAX_CARD_MEMORY_MIB),
                                core_milli=_int_field(c, "coreMilli", CORE_MILLI_PER_CARD)) for c in raw_cards)
        whole = doc["whole"]
        if not isinstance(whole, bool):
            raise AllocationError(f"{ALLOCATION_ANNOTATION} is malformed: whole must be true or false")
        sig = doc.get("sig", "")
        return AllocationRecord(node=_text_field(doc, "node"), cards=cards, whole=whole,
                                sig=sig if isinstance(sig, str) else "")
    except KeyError as exc:
        raise AllocationError(f"{ALLOCATION_ANNOTATION} is malformed: no {exc}") from None


def allocation_of_pod(pod: Mapping[str, Any], key: RecordKey | None = None) -> AllocationRecord | None:
    """The record on a pod object, or None when it has none.

    Malformed records raise :class:`AllocationError`; with ``key``, so do records that the
    extender did not sign for this very pod (unsigned, forged, or copied from another pod).
    """
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    value = ann.get(ALLOCATION_ANNOTATION)
    if not value:
        return None
    rec = decode_allocation(value)
    if key is not None:
        if not rec.sig:
            raise AllocationError(f"{ALLOCATION_ANNOTATION} is not signed, and this cluster signs every record the "
                                  "extender writes: not honoured")
        if not key.signs(rec, str(meta.get("uid") or "")):
            raise AllocationError(f"{ALLOCATION_ANNOTATION} carries a signature that does not match this pod "
                                  "(forged, altered, or copied from another pod): not honoured")
    return rec


def record_mismatch(rec: AllocationRecord, req: GpuRequest) -> str:
    """Why ``rec`` cannot be this pod's record, given the pod's own GPU request ('' when it can be).

    The extender writes N whole cards for a pod asking N GPUs, and one card with exactly the
    slice asked for otherwise; anything else was not written by it for this pod.
    """
    if not req.is_gpu:
        return f"{ALLOCATION_ANNOTATION} names card(s) but the pod asks for no GPU"
    if req.gpus > 0:
        if not rec.whole or len(rec.cards) != req.gpus:
            kind = "whole card(s)" if rec.whole else "card share(s)"
            return (f"{ALLOCATION_ANNOTATION} names {len(rec.cards)} {kind}; the pod asks for {req.gpus} whole "
                    f"GPU(s)")
        return _repeated_card(rec)
    if rec.whole or len(rec.cards) != 1:
        return f"{ALLOCATION_ANNOTATION} names {len(rec.cards)} card(s) {'whole' if rec.whole else ''}; the pod asks " \
               f"for a share of one card"
    c = rec.cards[0]
    if (c.memory_mib, c.core_milli) != (req.mem_mib, req.core_milli):
        return (f"{ALLOCATION_ANNOTATION} books {c.memory_mib} MiB and {c.core_milli / 10:g}% of a card; the pod asks "
                f"for {req.mem_mib} MiB and {req.core_milli / 10:g}%")
    return ""


def _repeated_card(rec: AllocationRecord) -> str:
    """Why ``rec`` names one card twice ('' when it does not). The extender writes N distinct
    cards; a record naming one uuid at two indices was replayed at both indices (a card of some
    other pod's lost to it) while the device plugin hands the pod that one uuid (N GPUs asked,
    fewer given, possibly another pod's card)."""
    for what, values in (("uuid", [c.uuid for c in rec.cards]), ("index", [c.index for c in rec.cards])):
        seen: set[object] = set()
        for v in values:
            if v in seen:
                return f"{ALLOCATION_ANNOTATION} names card {what} {str(v)[:80]!r} twice"
            seen.add(v)
    return ""


DEFAULT_SCHEDULER = "default-scheduler"
# The schedulerName of Stowage's profile as shipped: the ``--scheduler-name`` default of the
# extender, the device plugin and the operator commands, so that they honour the same records.
DEFAULT_SCHEDULER_NAMES: tuple[str, ...] = ("stowage-scheduler",)
# The environment variables every component that reads records takes ``--record-key-file`` (the
# mounted Secret) and ``--scheduler-name`` (space separated) from when the flag is not given
# (stowage/trust_options.py): one DaemonSet or Deployment env entry configures them alike.
RECORD_KEY_ENV = "STOWAGE_RECORD_KEY_FILE"
SCHEDULER_NAMES_ENV = "STOWAGE_SCHEDULER_NAMES"


def honoured_allocation_of_pod(pod: Mapping[str, Any], key: RecordKey | None = None,
                               memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB,
                               scheduler_names: frozenset[str] | None = None) -> AllocationRecord | None:
    """The pod's record if it could have been written by the extender for this pod, else raise.

    On top of :func:`allocation_of_pod` (well-formed; signed for this pod when ``key`` is set):
    the pod is one of Stowage's schedulers' (``scheduler_names``; None: any), it is bound to the
    node the record names (or not bound yet), and the record books exactly what the pod asks for.
    The extender replays only such records into its model and the device plugin hands out cards
    only by them, so a hand-written record can neither fill a node nor take another pod's card.
    """
    rec = allocation_of_pod(pod, key)
    if rec is None:
        return None
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    scheduler = str(spec.get("schedulerName") or DEFAULT_SCHEDULER)
    if scheduler_names is not None and scheduler not in scheduler_names:
        raise AllocationError(f"{ALLOCATION_ANNOTATION} on a pod of scheduler {scheduler!r}, which is not Stowage's "
                              f"({', '.join(sorted(scheduler_names))}): not honoured")
    node = spec.get("nodeName")
    if node and node != rec.node:
        raise AllocationError(f"{ALLOCATION_ANNOTATION} names node {rec.node!r} but the pod is bound to {node!r}: "
                              "not honoured")
    try:
        req = pod_gpu_request(pod, memory_unit_mib, max_containers=None)   # a record of any pod's size counts
    except RequestError as exc:
        raise AllocationError(f"{ALLOCATION_ANNOTATION} on a pod whose GPU request is invalid ({exc}): "
                              "not honoured") from exc
    problem = record_mismatch(rec, req)
    if problem:
        raise AllocationError(problem + ": not honoured")
    return rec


@dataclass(frozen=True)
class RecordTrust:
    """What a component needs to read records safely and write them so that others honour them."""

    key: RecordKey | None = None                 # None: records are not signed in this cluster
    memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB
    scheduler_names: frozenset[str] | None = None   # None: any scheduler's pods

    @classmethod
    def from_options(cls, record_key_file: str | Path | None, memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB,
                     scheduler_names: tuple[str, ...] | frozenset[str] = ()) -> "RecordTrust":
        """The trust of a component started with ``--record-key-file``, ``--memory-unit-mib`` and
        ``--scheduler-name`` (none: any scheduler's pods). The ONE place these options become a
        trust, so that the extender, the device plugin and the operator commands given the same
        options honour exactly the same records. An unreadable or too short key raises :class:`AllocationError`."""
        return cls(key=RecordKey.load(record_key_file) if record_key_file else None,
                   memory_unit_mib=memory_unit_mib, scheduler_names=frozenset(scheduler_names) or None)

    def record_of(self, pod: Mapping[str, Any]) -> AllocationRecord | None:
        """:func:`honoured_allocation_of_pod` with this component's settings."""
        return honoured_allocation_of_pod(pod, self.key, self.memory_unit_mib, self.scheduler_names)

    def encode(self, rec: AllocationRecord, pod_uid: str) -> str:
        return encode_allocation(rec, self.key, pod_uid)
