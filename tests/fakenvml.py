"""A fake NVML at the lowest layer: replaces the ``pynvml`` module functions themselves.

Everything above (``gpunode.nvml``, the exporter's NVML reader) runs unchanged. Errors are
raised as real ``pynvml.NVMLError`` values (which map to the ``NVMLError_GpuIsLost`` etc.
subclasses), timeouts as ``NVML_ERROR_TIMEOUT``, just as the C library reports them.

Usage::

    fake = FakeNvml(default_cards())
    fake.install(monkeypatch)           # or: undo = fake.install() in a subprocess
    fake.xid(fake.cards[0].uuid, 79)    # a critical XID event
    fake.lose(fake.cards[1].uuid)       # the card falls off the bus

``FakeNvml(ctypes_handles=True)`` hands out pynvml's own device handles (``c_nvmlDevice_t``, one
address per card) and event data (``c_nvmlEventData_t``) instead of :class:`Handle` values: like
the real library's, two reads of one card's handle are different objects that neither compare
equal nor hash, so code that must match handles (e.g. an event's device to a card) is tested as
it runs against NVML.

Extending (e.g. for the exporter): add fields to :class:`FakeCard` and a method named like the
pynvml function to :class:`FakeNvml`; :meth:`FakeNvml.install` patches every public
``nvml*`` method of the class onto ``pynvml``.
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import pynvml

MiB = 1024 * 1024


def _used(mib: int | None) -> int | None:
    """A process's usedGpuMemory as pynvml gives it: bytes, or None when NVML cannot say."""
    return None if mib is None else mib * MiB


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@dataclass
class FakeCard:
    uuid: str
    name: str
    memory_mib: int
    minor: int
    pci_bus_id: str
    numa: int | None = None                 # None: NVML says NOT_SUPPORTED
    nvlinks: list[str] = field(default_factory=list)   # remote PCI bus id per active link
    events_supported: bool = True
    # health state
    lost: bool = False
    retired_pages_pending: bool = False
    # MIG mode (current, pending) as nvmlDeviceGetMigMode answers; None: NOT_SUPPORTED (pre-Ampere)
    mig_mode: tuple[int, int] | None = None
    ecc_uncorrected_volatile: int = 0
    # telemetry (for the exporter)
    used_mib: int = 0
    gpu_util: int = 0
    mem_util: int = 0
    power_mw: int = 50_000
    temperature_c: int = 40
    # (pid, used MiB); None: NVML_VALUE_NOT_AVAILABLE, which pynvml gives as usedGpuMemory None
    # (per-process memory not available to the caller, e.g. in some containers and under WDDM)
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    graphics_processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used MiB)
    process_samples: list["ProcSample"] = field(default_factory=list)  # see FakeNvml.add_sample
    process_util_supported: bool = True


@dataclass(frozen=True)
class ProcSample:
    """One per-process utilisation sample, shaped like pynvml's ``c_nvmlProcessUtilizationSample_t``."""

    pid: int
    smUtil: int
    timeStamp: int
    memUtil: int = 0
    encUtil: int = 0
    decUtil: int = 0


@dataclass(frozen=True)
class Handle:
    """What the fake hands out as an ``nvmlDevice_t``."""

    uuid: str


def default_cards() -> list[FakeCard]:
    """Four cards of three models: two NVLinked A100-80GB on NUMA 0, an A10 on NUMA 1, a T4 (no NUMA info)."""
    return [
        FakeCard("GPU-a0000000-1111-2222-3333-000000000000", "NVIDIA A100-SXM4-80GB", 81920, 0,
                 "00000000:07:00.0", numa=0, nvlinks=["00000000:0F:00.0", "00000000:0F:00.0"]),
        FakeCard("GPU-a0000000-1111-2222-3333-000000000001", "NVIDIA A100-SXM4-80GB", 81920, 1,
                 "00000000:0F:00.0", numa=0, nvlinks=["00000000:07:00.0", "00000000:07:00.0"]),
        FakeCard("GPU-a1000000-1111-2222-3333-000000000002", "NVIDIA A10", 23028, 2,
                 "00000000:87:00.0", numa=1),
        FakeCard("GPU-74000000-1111-2222-3333-000000000003", "Tesla T4", 15360, 3,
                 "00000000:AF:00.0", numa=None, events_supported=False),
    ]


class FakeNvml:
    def __init__(self, cards: list[FakeCard] | None = None, driver_loaded: bool = True,
                 ctypes_handles: bool = False) -> None:
        self.cards = list(cards if cards is not None else default_cards())
        self.driver_loaded = driver_loaded
        self.ctypes_handles = ctypes_handles
        self.count_error: int | None = None    # nvmlDeviceGetCount fails with this NVML error code while set
        self._devices: dict[str, Any] = {}     # uuid -> the struct its ctypes handles point at
        self.initialised = 0
        self.calls: dict[str, int] = {}
        self._cond = threading.Condition()
        self._sets: dict[int, dict[str, Any]] = {}
        self._lock = threading.RLock()

    # ---- test controls -------------------------------------------------------------------
    def card(self, uuid: str) -> FakeCard:
        for c in self.cards:
            if c.uuid == uuid:
                return c
        raise KeyError(uuid)

    def xid(self, uuid: str | None, xid: int) -> None:
        """Deliver a critical XID event (uuid None: an event NVML cannot attribute to a card)."""
        with self._cond:
            for s in self._sets.values():
                if uuid is None or uuid in s["uuids"]:
                    s["queue"].append((uuid, xid))
            self._cond.notify_all()

    def lose(self, uuid: str) -> None:
        self.card(uuid).lost = True

    def restore(self, uuid: str) -> None:
        self.card(uuid).lost = False

    # ---- installation --------------------------------------------------------------------
    def install(self, monkeypatch: Any = None) -> Callable[[], None]:
        """Patch every ``nvml*`` method onto the pynvml module; returns an undo function."""
        saved: dict[str, Any] = {}
        for name in dir(type(self)):
            if not name.startswith("nvml"):
                continue
            fn = getattr(self, name)
            if monkeypatch is not None:
                monkeypatch.setattr(pynvml, name, fn)
            else:
                saved[name] = getattr(pynvml, name, None)
                setattr(pynvml, name, fn)

        def undo() -> None:
            for n, v in saved.items():
                setattr(pynvml, n, v)
        return undo

    # ---- helpers ---------------------------------------------------------------------------
    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    def _handle(self, uuid: str) -> Any:
        """The handle NVML gives out for a card: a :class:`Handle`, or a new ctypes pointer to the
        card's one device struct (``ctypes_handles``)."""
        if not self.ctypes_handles:
            return Handle(uuid)
        return ctypes.pointer(self._devices.setdefault(uuid, pynvml.struct_c_nvmlDevice_t()))

    def _uuid_of(self, handle: Any) -> str | None:
        if isinstance(handle, Handle):
            return handle.uuid
        if self.ctypes_handles and isinstance(handle, pynvml.c_nvmlDevice_t):
            address = ctypes.cast(handle, ctypes.c_void_p).value
            return next((u for u, d in self._devices.items() if ctypes.addressof(d) == address), None)
        return None

    def _live(self, handle: Any) -> FakeCard:
        if not self.initialised:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        uuid = self._uuid_of(handle)
        if uuid is None:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        c = self.card(uuid)
        if c.lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return c

    # ---- pynvml API --------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if not self.driver_loaded:
            raise _err(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        if not self.initialised:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._count("nvmlDeviceGetCount")
        if not self.initialised:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        if self.count_error is not None:
            raise _err(self.count_error)
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._count("nvmlDeviceGetHandleByIndex")
        if not self.initialised:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        if not 0 <= index < len(self.cards):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        c = self.cards[index]
        if c.lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self._handle(c.uuid)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Handle:
        if not self.initialised:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        try:
            c = self.card(uuid.decode() if isinstance(uuid, bytes) else uuid)
        except KeyError:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND) from None
        if c.lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self._handle(c.uuid)

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._live(h).uuid

    def nvmlDeviceGetName(self, h: Any) -> str:
        return self._live(h).name

    def nvmlDeviceGetMinorNumber(self, h: Any) -> int:
        return self._live(h).minor

    def nvmlDeviceGetIndex(self, h: Any) -> int:
        return self.cards.index(self._live(h))

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: Any = None) -> Any:
        c = self._live(h)
        return SimpleNamespace(total=c.memory_mib * MiB, used=c.used_mib * MiB, free=(c.memory_mib - c.used_mib) * MiB)

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        return SimpleNamespace(busId=self._live(h).pci_bus_id.encode())

    def nvmlDeviceGetNumaNodeId(self, h: Any) -> int:
        c = self._live(h)
        if c.numa is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return c.numa

    def nvmlDeviceGetNvLinkState(self, h: Any, link: int) -> int:
        c = self._live(h)
        if not c.nvlinks:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(c.nvlinks):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Any, link: int) -> Any:
        c = self._live(h)
        if link >= len(c.nvlinks):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return SimpleNamespace(busId=c.nvlinks[link].encode())

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Any) -> int:
        return int(self._live(h).retired_pages_pending)

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        mode = self._live(h).mig_mode
        if mode is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(mode)

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        self._live(h)
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter_type: int) -> int:
        c = self._live(h)
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED and counter_type == pynvml.NVML_VOLATILE_ECC:
            return c.ecc_uncorrected_volatile
        return 0

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        c = self._live(h)
        return SimpleNamespace(gpu=c.gpu_util, memory=c.mem_util)

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._live(h).power_mw

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        return self._live(h).temperature_c

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=_used(m)) for p, m in self._live(h).processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: Any) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=_used(m)) for p, m in self._live(h).graphics_processes]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, h: Any) -> list[Any]:
        self._live(h)
        return []

    def nvmlDeviceGetProcessUtilization(self, h: Any, timeStamp: int) -> list[Any]:
        """Samples newer than ``timeStamp``; NOT_FOUND when there are none, as the driver answers."""
        c = self._live(h)
        if not c.process_util_supported:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        out = [s for s in c.process_samples if s.timeStamp > timeStamp]
        if not out:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return out

    def set_clock_us(self, now_us: int) -> None:
        """Set the host's wall clock as NVML stamps its samples with it (µs since the epoch): the next
        :meth:`add_sample` is stamped just after ``now_us``. Setting it back is a clock stepped back."""
        with self._lock:
            self._clock_us = now_us

    def add_sample(self, uuid: str, pid: int, sm_util: int) -> None:
        """NVML took a utilisation sample of ``pid`` on card ``uuid`` (timestamps strictly increase, in µs)."""
        with self._lock:
            self._clock_us = getattr(self, "_clock_us", 1_700_000_000_000_000) + 1000
            self.card(uuid).process_samples.append(ProcSample(pid=pid, smUtil=sm_util, timeStamp=self._clock_us))

    # events
    def nvmlEventSetCreate(self) -> int:
        with self._cond:
            # never reuse the id of a freed set (as len()+1 would): a stale id must not name a new set
            self._last_set_id = sid = getattr(self, "_last_set_id", 0) + 1
            self._sets[sid] = {"uuids": set(), "queue": []}
            return sid

    def nvmlDeviceRegisterEvents(self, h: Any, event_types: int, event_set: int) -> None:
        c = self._live(h)
        if not c.events_supported:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        with self._cond:
            self._sets[event_set]["uuids"].add(c.uuid)

    def nvmlEventSetWait(self, event_set: int, timeout_ms: int) -> Any:
        self._count("nvmlEventSetWait")
        with self._cond:
            s = self._sets.get(event_set)
            if s is None:
                raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._cond.wait_for(lambda: bool(s["queue"]), timeout=timeout_ms / 1000)
            if not s["queue"]:
                raise _err(pynvml.NVML_ERROR_TIMEOUT)
            uuid, xid = s["queue"].pop(0)
        if self.ctypes_handles:   # the real struct: a NULL device when NVML cannot say which card
            data = pynvml.c_nvmlEventData_t(eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid,
                                            gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
            if uuid:
                data.device = self._handle(uuid)
            return data
        return SimpleNamespace(device=Handle(uuid) if uuid else None, eventType=pynvml.nvmlEventTypeXidCriticalError,
                               eventData=xid, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)

    def nvmlEventSetFree(self, event_set: int) -> None:
        with self._cond:
            self._sets.pop(event_set, None)
