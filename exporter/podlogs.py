"""Pod UID -> namespace/name from the kubelet's pod log directories.

The kubelet (CRI) keeps every pod's container logs under ``/var/log/pods/<namespace>_<name>_<uid>/
<container>/``. Namespaces and pod names are DNS labels/subdomains (no ``_``), so the directory name
splits unambiguously. Listing it needs no API access and no kubelet socket; the exporter reads no
log file, only the directory names. This names every pod on the node (GPU or not), which is what
tells a holder's process from another pod's.
"""
from __future__ import annotations

import os
import re

from .checkpoint import PodKey

DEFAULT_POD_LOGS = "/var/log/pods"
_UID = re.compile(r"^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$")


class PodLogsError(OSError):
    """The pod log directory cannot be listed."""


def parse_dir_name(name: str) -> tuple[str, PodKey] | None:
    """``<namespace>_<name>_<uid>`` -> (uid, pod), or None for anything else."""
    parts = name.split("_")
    if len(parts) != 3 or not parts[0] or not parts[1] or not _UID.match(parts[2].lower()):
        return None
    return parts[2].lower(), PodKey(parts[0], parts[1])


def read(root: str = DEFAULT_POD_LOGS) -> dict[str, PodKey]:
    try:
        names = os.listdir(root)
    except OSError as exc:
        raise PodLogsError(f"cannot list {root}: {exc.strerror or exc}") from exc
    out = {}
    for n in names:
        parsed = parse_dir_name(n)
        if parsed:
            out[parsed[0]] = parsed[1]
    return out
