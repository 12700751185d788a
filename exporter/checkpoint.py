"""Pod UID -> pod name, from the kubelet's device-manager checkpoint joined with PodResources.

NVML names processes by PID, ``/proc/<pid>/cgroup`` names the pod by UID, but the PodResources
API names pods by namespace/name only. The kubelet's device manager keeps, in
``/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint``, the same allocations keyed by
pod UID and container name. A device ID is given to one container at a time, so joining the two
on (resource, device ID, container name) maps each UID to its namespace/name exactly, with no
API-server access (the exporter's RBAC allows none for pods).

The checkpoint is the kubelet's internal file: ``DeviceIDs`` is a list before Kubernetes 1.20 and
a ``{numa node: [ids]}`` map after; both are read. Anything unreadable yields no mapping (the
exporter then estimates shares by units held and says so), never an exception.
"""
from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass
from typing import Any, Iterable

from gpunode.podresources.client import ContainerDevices

log = logging.getLogger("stowage.exporter.checkpoint")

DEFAULT_CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
# Parsing costs several times the file's size (tests/test_exporter_hostile.py measures it against
# the DaemonSet's 256 MiB limit; 64 MiB took the exporter past it). The kubelet's checkpoint lists
# every registered and every allocated device ID: with our device lists at the kubelet's 4 MiB
# ListAndWatch limit (docs/deviceplugin.md) that is a few MiB, so a larger file is refused.
MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class CheckpointEntry:
    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class PodKey:
    namespace: str
    pod: str


class CheckpointError(ValueError):
    """The checkpoint file is missing or not in a format we understand."""


def _ids(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, list):
        return tuple(str(x) for x in raw)
    if isinstance(raw, dict):
        return tuple(str(x) for ids in raw.values() if isinstance(ids, list) for x in ids)
    return ()


def parse(text: str | bytes) -> list[CheckpointEntry]:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"not JSON: {str(exc)[:120]}") from None
    data = doc.get("Data") if isinstance(doc, dict) else None
    entries = data.get("PodDeviceEntries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise CheckpointError("no Data.PodDeviceEntries list")
    out = []
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("PodUID"), str):
            continue
        out.append(CheckpointEntry(e["PodUID"].lower(), str(e.get("ContainerName", "")),
                                   str(e.get("ResourceName", "")), _ids(e.get("DeviceIDs"))))
    return out


def read(path: str) -> list[CheckpointEntry]:
    """The checkpoint's entries; only a regular file of at most :data:`MAX_BYTES` is read: opening a
    FIFO waits for a writer for ever (the scrape, and every one queued behind it, would hang)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)   # no effect on a regular file's reads
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(f"{path} is not a regular file")
            # read(n) allocates n bytes up front: ask for what the file holds, not the bound
            raw = f.read(min(st.st_size, MAX_BYTES) + 1)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(raw) > MAX_BYTES:
        raise CheckpointError(f"{path} is larger than {MAX_BYTES} bytes")
    return parse(raw)


@dataclass(frozen=True)
class UidMap:
    """UID -> pod, plus every UID the checkpoint knows (a UID it does not know holds no devices)."""

    pods: dict[str, PodKey]
    known_uids: frozenset[str]


def join(assignments: Iterable[ContainerDevices], entries: Iterable[CheckpointEntry]) -> UidMap:
    """Map pod UIDs to namespace/name through shared (resource, device ID, container) triples.

    A UID is mapped only when every device of the pod that the checkpoint knows points at that
    one UID and no other pod claims it: stale entries of a deleted pod never mislabel a live one.
    """
    by_device: dict[tuple[str, str, str], set[str]] = {}
    known = set()
    for e in entries:
        known.add(e.pod_uid)
        for d in e.device_ids:
            by_device.setdefault((e.resource, d, e.container), set()).add(e.pod_uid)
    uids_of_pod: dict[PodKey, set[str]] = {}
    for a in assignments:
        key = PodKey(a.namespace, a.pod)
        for d in a.device_ids:
            uids_of_pod.setdefault(key, set()).update(by_device.get((a.resource, d, a.container), ()))
    pods: dict[str, PodKey] = {}
    claimed: dict[str, int] = {}
    for key, uids in uids_of_pod.items():
        for u in uids:
            claimed[u] = claimed.get(u, 0) + 1
    for key, uids in uids_of_pod.items():
        if len(uids) == 1:
            (uid,) = uids
            if claimed[uid] == 1:
                pods[uid] = key
        elif uids:
            log.debug("pod %s/%s matches several UIDs in the checkpoint (%s); not attributed by process",
                      key.namespace, key.pod, ", ".join(sorted(uids)))
    return UidMap(pods, frozenset(known))
