"""The kubelet's PodResources API as the plugin sees it: what has already been allocated, or None.

The plugin asks on every kubelet call and on every reconciliation round (one unix-socket
``List``, milliseconds). When the socket is missing (directory not mounted, older kubelet) or the
call fails, the plugin falls back to its in-memory count of answered Allocate calls; that is
logged once per change of state, never per call.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from gpunode.podresources.client import DEFAULT_SOCKET, PodList, PodResourcesError, list_pods

log = logging.getLogger("stowage.deviceplugin.podres")


class KubeletAllocations:
    """``listing()``: PodResources rows and the pods listed, or None when unavailable (then: in-memory
    fallback); ``rows()``: the rows alone."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 2.0) -> None:
        self.socket_path, self.timeout_s = socket_path, timeout_s
        self.available: bool | None = None   # None until the first answer
        self._lock = threading.Lock()

    def _set(self, ok: bool, why: str = "") -> None:
        with self._lock:
            was, self.available = self.available, ok
        if ok and was is not True:
            log.info("reading the kubelet's allocations from its PodResources API at %s", self.socket_path)
        elif not ok and was is not False:
            log.warning("%s -- falling back to this process's in-memory count of answered Allocate calls: a "
                        "plugin restart forgets which pods were already given devices, and records of pods "
                        "admitted in another order than bound are not corrected", why)

    def listing(self) -> PodList | None:
        if not self.socket_path:
            self._set(False, "the kubelet's PodResources API is disabled (empty --pod-resources-socket)")
            return None
        try:
            listed = list_pods(self.socket_path, self.timeout_s)
        except PodResourcesError as exc:
            self._set(False, str(exc))
            return None
        self._set(True)
        return listed

    def rows(self) -> list[Any] | None:
        listed = self.listing()
        return None if listed is None else listed.rows
