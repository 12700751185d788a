"""Thin wrapper over NVML (the ``pynvml`` module of nvidia-ml-py): discovery, XID events, probes.

Only this module talks to NVML, so the rest of the plugin deals in plain dataclasses and the
tests can replace NVML at its lowest layer (the ``pynvml`` module functions) while every line
here still runs. Every NVML call may raise :class:`pynvml.NVMLError`; the wrapper turns the
expected ones (no driver, not supported, GPU lost) into values and log lines, never crashes.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import pynvml

log = logging.getLogger("stowage.gpunode.nvml")

# NVML reports a lost or vanished card with these codes; the card's devices go Unhealthy.
LOST_ERRORS = frozenset({pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_NOT_FOUND,
                         getattr(pynvml, "NVML_ERROR_GPU_NOT_FOUND", 28), pynvml.NVML_ERROR_RESET_REQUIRED,
                         pynvml.NVML_ERROR_UNINITIALIZED})


@dataclass(frozen=True)
class GpuInfo:
    """What the plugin needs to know about one physical card."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    minor: int = -1          # /dev/nvidia<minor>; -1 when NVML does not say
    numa: int = -1           # -1: unknown
    pci_bus_id: str = ""
    nvlink: tuple[int, ...] = ()  # indices of cards this one has an active NVLink to


@dataclass(frozen=True)
class XidEvent:
    """One critical event from NVML: ``uuid`` None means NVML could not say which card."""

    uuid: str | None
    xid: int | None
    detail: str = ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _bus_key(bus_id: Any) -> tuple[int, int, int, int] | None:
    """'00000000:3B:00.0' and '0000:3b:00.0' name the same PCI function; compare as integers."""
    m = re.fullmatch(r"\s*([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])\s*", _text(bus_id))
    if not m:
        return None
    return tuple(int(g, 16) for g in m.groups())  # type: ignore[return-value]


def _optional(fn: Any, *args: Any, default: Any = None) -> Any:
    """Call an NVML query that some cards/drivers do not support."""
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return default


class NvmlUnavailable(RuntimeError):
    """No usable NVML: no driver, no library, or no permission. The message says which."""


class Nvml:
    """An initialised NVML session."""

    def __init__(self) -> None:
        self._ok = False

    def init(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML is not available on this node ({exc}); is the NVIDIA driver installed "
                                  "and the container started with the NVIDIA runtime or /dev/nvidia* mounted?") from exc
        except OSError as exc:  # a broken libnvidia-ml.so
            raise NvmlUnavailable(f"NVML library could not be loaded: {exc}") from exc
        self._ok = True

    def shutdown(self) -> None:
        if self._ok:
            _optional(pynvml.nvmlShutdown)
            self._ok = False

    def discover(self) -> list[GpuInfo]:
        """All cards NVML reports, with NVLink peers resolved to card indices by PCI bus id."""
        count = pynvml.nvmlDeviceGetCount()
        raw: list[dict[str, Any]] = []
        for i in range(count):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(pynvml.nvmlDeviceGetUUID(h))
                name = _text(pynvml.nvmlDeviceGetName(h))
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            except pynvml.NVMLError as exc:
                log.error("GPU %d could not be read (%s); it is not advertised", i, exc)
                continue
            pci = _optional(pynvml.nvmlDeviceGetPciInfo, h)
            bus = _text(getattr(pci, "busId", "")) if pci is not None else ""
            numa = _optional(pynvml.nvmlDeviceGetNumaNodeId, h, default=-1)
            peers = self._nvlink_peers(h)
            raw.append(dict(index=i, uuid=uuid, name=name, memory_mib=int(mem.total) // (1024 * 1024),
                            minor=_optional(pynvml.nvmlDeviceGetMinorNumber, h, default=-1),
                            numa=numa if isinstance(numa, int) and numa >= 0 else -1,
                            pci_bus_id=bus, peers=peers))
        by_bus = {_bus_key(r["pci_bus_id"]): r["index"] for r in raw if _bus_key(r["pci_bus_id"])}
        cards = []
        for r in raw:
            peers = sorted({by_bus[k] for k in r.pop("peers") if k in by_bus and by_bus[k] != r["index"]})
            cards.append(GpuInfo(nvlink=tuple(peers), **r))
        return cards

    @staticmethod
    def _nvlink_peers(handle: Any) -> list[tuple[int, int, int, int]]:
        peers = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            except pynvml.NVMLError as exc:
                if getattr(exc, "value", None) in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                    break  # no NVLink on this card, or no more links
                continue
            key = _bus_key(getattr(remote, "busId", ""))
            if key:
                peers.append(key)
        return peers

    def probe(self, uuid: str) -> str | None:
        """Why this card is not fit for work, or None when it is.

        A card is healthy when NVML still finds it, its memory info reads, and it has no pending
        retired pages / remapped rows and no volatile uncorrectable ECC errors (those need a reset).
        Checks a card does not support are skipped.
        """
        try:
            h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            pynvml.nvmlDeviceGetMemoryInfo(h)
        except pynvml.NVMLError as exc:
            return f"NVML cannot reach the card: {exc}"
        pending = _optional(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
        if pending:
            return "retired pages are pending (the card needs a reset)"
        rows = _optional(pynvml.nvmlDeviceGetRemappedRows, h)
        if rows is not None and len(rows) >= 4 and (rows[2] or rows[3]):
            return "row remapping is pending or has failed (the card needs a reset)"
        ecc = _optional(pynvml.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                        pynvml.NVML_VOLATILE_ECC)
        if ecc:
            return f"{ecc} uncorrectable ECC errors since the driver loaded"
        return None


class XidEvents:
    """The NVML event set for critical XID errors of the given cards."""

    def __init__(self, uuids: list[str]) -> None:
        self._set = pynvml.nvmlEventSetCreate()
        self.watched: list[str] = []
        for uuid in uuids:
            try:
                h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._set)
                self.watched.append(uuid)
            except pynvml.NVMLError as exc:
                log.warning("card %s does not report XID events (%s); only periodic probes watch it", uuid, exc)

    def wait(self, timeout_ms: int) -> XidEvent | None:
        """The next event, or None when ``timeout_ms`` passed quietly."""
        try:
            data = pynvml.nvmlEventSetWait(self._set, timeout_ms)
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            return XidEvent(uuid=None, xid=None, detail=f"waiting for NVML events failed: {exc}")
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return None
        try:
            uuid: str | None = _text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError:
            uuid = None
        return XidEvent(uuid=uuid, xid=int(data.eventData))

    def close(self) -> None:
        _optional(pynvml.nvmlEventSetFree, self._set)
