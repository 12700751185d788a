"""Which pod (UID) and container a host PID belongs to, from ``/proc/<pid>/cgroup``.

Pure parsing plus one small read. Handles the kubelet's cgroup layouts under cgroup v1 and v2:
- cgroupfs driver: ``/kubepods/burstable/pod<uid>/<container id>`` (guaranteed: ``/kubepods/pod<uid>/…``)
- systemd driver: ``/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid with _>.slice/
  cri-containerd-<container id>.scope`` (also ``docker-``, ``crio-``)
- paths seen through a cgroup namespace (``/../../kubepods-…``) or nested (kind: ``/kubelet.slice/…``).
Static pods have a 32-hex-digit UID without dashes; both forms are recognised.

The FIRST ``pod<uid>`` level of a path is the pod: it is the kubelet's own level, and everything
below it (the container's scope and any child cgroup a container with a writable cgroupfs makes)
is the workload's doing. A container could name a child ``pod<uid of another pod>``; taking the
last match would credit its processes, and its GPU use, to that other pod.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_POD = re.compile(rf"(?:^|[/-])pod({_UUID})(?:\.slice)?(?=/|$)", re.IGNORECASE)
_CONTAINER = re.compile(r"^(?:[a-z-]*-)?([0-9a-f]{64})(?:\.scope)?$", re.IGNORECASE)


@dataclass(frozen=True)
class PodCgroup:
    pod_uid: str              # canonical: lower case, dashes
    container_id: str = ""    # 64 hex digits, "" for the pod's own cgroup


def parse_cgroup_path(path: str) -> PodCgroup | None:
    """The pod of one cgroup path, or None when the path is not a pod's cgroup."""
    m = _POD.search(path)             # the first: the kubelet's level (see the module docstring)
    if m is None:
        return None
    uid = m.group(1).lower().replace("_", "-")
    rest = path[m.end():].strip("/").split("/")
    cid = ""
    if rest and rest[0]:
        c = _CONTAINER.match(rest[0])
        cid = c.group(1).lower() if c else ""
    return PodCgroup(uid, cid)


def parse_proc_cgroup(text: str) -> PodCgroup | None:
    """``/proc/<pid>/cgroup`` content (``hierarchy:controllers:path`` lines) -> the pod, if any."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            found = parse_cgroup_path(parts[2].strip())
            if found:
                return found
    return None


class ProcessGone(LookupError):
    """The PID is not visible under the proc root (exited, or another PID namespace)."""


def pod_of_pid(pid: int, proc_root: str = "/proc") -> PodCgroup | None:
    """The pod of a host PID; None for processes outside any pod; :class:`ProcessGone` if unreadable."""
    try:
        with open(os.path.join(proc_root, str(int(pid)), "cgroup"), encoding="utf-8", errors="replace") as f:
            return parse_proc_cgroup(f.read(64 * 1024))
    except OSError as exc:
        raise ProcessGone(f"/proc/{pid}/cgroup: {exc.strerror or exc}") from exc
