"""Thin wrapper over NVML (the ``pynvml`` module of nvidia-ml-py): discovery, XID events, probes.

Only this module talks to NVML, so the rest of the plugin deals in plain dataclasses and the
tests can replace NVML at its lowest layer (the ``pynvml`` module functions) while every line
here still runs. Every NVML call may raise :class:`pynvml.NVMLError`; the wrapper turns the
expected ones (no driver, not supported, GPU lost) into values and log lines, never crashes.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable

import pynvml

from stowage.inventory import MAX_CARDS_PER_NODE, MAX_NUMA_NODE
from stowage.resources import MAX_CARD_MEMORY_MIB

from .backoff import Backoff
from .deadline import DeadlineCalls, Stuck

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
    """One critical event from NVML: ``uuid`` None means NVML could not say which card.

    ``wait_failed``: not an event at all but a failed ``nvmlEventSetWait`` (``detail`` says why):
    no card is named and no XID was seen, so a reader can tell "the channel is broken" from "NVML
    reported an XID it could not attribute".
    """

    uuid: str | None
    xid: int | None
    detail: str = ""
    wait_failed: bool = False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


# pynvml reads a card's UUID and name into buffers of 96 bytes (NVML_DEVICE_UUID_V2_BUFFER_SIZE,
# NVML_DEVICE_NAME_V2_BUFFER_SIZE), NUL included: anything longer did not come from NVML.
NVML_TEXT_MAX = 95
# What a UUID must look like to be advertised: printable ASCII, no space and no comma. It becomes a
# device ID (the kubelet's), a value of NVIDIA_VISIBLE_DEVICES (a comma-separated list: a UUID with a
# comma would name two cards) and a key of the inventory the extender places pods by.
_UUID_RE = re.compile(r"[!-+\--~]{1,%d}" % NVML_TEXT_MAX)


def _nvml_text(value: Any, what: str) -> str:
    """A UUID or name as NVML gives it (text, or bytes from older pynvml); TypeError/ValueError for
    anything else (``None`` used to become the text "None", for every card alike)."""
    if not isinstance(value, (str, bytes, bytearray)):
        raise TypeError(f"the {what} is {type(value).__name__}, not text")
    text = _text(value)
    if len(text) > NVML_TEXT_MAX:
        raise ValueError(f"the {what} is {len(text)} characters long, more than NVML gives ({NVML_TEXT_MAX})")
    return text


def _card_uuid(value: Any) -> str:
    uuid = _nvml_text(value, "UUID")
    if not _UUID_RE.fullmatch(uuid):
        raise ValueError(f"the UUID {uuid[:NVML_TEXT_MAX]!r} is empty, or holds a space, a comma or a character "
                         "that is not printable ASCII")
    return uuid


def _bus_key(bus_id: Any) -> tuple[int, int, int, int] | None:
    """'00000000:3B:00.0' and '0000:3b:00.0' name the same PCI function; compare as integers.
    None for anything that is not such a bus id (bytes that are not UTF-8 included)."""
    try:
        text = _text(bus_id)
    except (UnicodeError, TypeError, ValueError):
        return None
    m = re.fullmatch(r"\s*([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])\s*", text)
    if not m:
        return None
    return tuple(int(g, 16) for g in m.groups())  # type: ignore[return-value]


def unreadable_answer(exc: BaseException) -> str:
    """Why a card cannot be read when NVML answered but pynvml could not make sense of it (a name
    or UUID that is not UTF-8 raises UnicodeDecodeError, a value of the wrong kind): said alike by
    the device plugin's discovery and the exporter's readings."""
    return f"unreadable answer: {type(exc).__name__}: {exc}"


def _optional(fn: Any, *args: Any, default: Any = None) -> Any:
    """Call an NVML query that some cards/drivers do not support."""
    try:
        return fn(*args)
    except pynvml.NVMLError:
        return default


def _extra(fn: Any, *args: Any, default: Any = None, valid: Callable[[Any], bool] = lambda v: True) -> Any:
    """Read something discovery can do without (NUMA node, minor, PCI info): ``default`` when NVML does
    not say, raises anything at all, or answers what ``valid`` refuses. One odd extra must not keep the
    card, or the node's other cards, from being advertised."""
    try:
        value = fn(*args)
    except Exception:
        return default
    return value if valid(value) else default


def _int_within(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _handle_key(handle: Any) -> Hashable:
    """What names one device handle across NVML calls.

    pynvml's handles are ctypes pointers (``c_nvmlDevice_t``): NVML hands out one address per card,
    but every read of ``c_nvmlEventData_t.device`` makes a new pointer object, and ctypes pointers
    compare and hash as objects, so the address is the key (None for a NULL device). Any other
    handle (a test's fake) is its own key.
    """
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle


class NvmlUnavailable(RuntimeError):
    """No usable NVML: no driver, no library, or no permission. The message says which."""


# The keys of the start-up calls that are not about one card (a card's read is keyed by its index).
INIT, COUNT = "init", "count"


class Nvml:
    """An initialised NVML session.

    The start-up calls (:meth:`init`, the count, each card's read) may be made on a worker thread
    that outlives its deadline (:meth:`start_within`); so each of them is made by one thread at a
    time: while one hangs, the same call asked again (by :class:`LateCards`, on another thread)
    answers that it is still running, without calling NVML, so a card that hangs NVML holds one
    thread however often it is retried.
    """

    def __init__(self) -> None:
        self._ok = False
        self._read: dict[int, dict[str, Any]] = {}   # index -> what was read of the card, NVLink peers by bus id
        self.unreadable: dict[int, str] = {}         # index -> why it could not be read, last try
        self.uncounted: str | None = None            # why nvmlDeviceGetCount failed, last try (None: counted)
        self._lock = threading.Lock()
        self._running: dict[Hashable, str] = {}      # INIT, COUNT or an index -> the NVML function it is in now
        self._abandoned: set[int] = set()            # indices whose running read passed its deadline

    def _enter(self, key: Hashable, first: str) -> str | None:
        """Mark ``key``'s call as running (in NVML function ``first``); why not when it runs already."""
        with self._lock:
            if key in self._running:
                return f"the call made earlier has not returned yet (it is in {self._running[key]})"
            self._running[key] = first
            return None

    def _note(self, key: Hashable, what: str) -> None:
        """Note ``what`` ``key``'s call is in now (named when it hangs)."""
        with self._lock:
            self._running[key] = what

    def _nv(self, key: Hashable, name: str) -> Any:
        """``pynvml.<name>``, noted as the function ``key``'s call is in."""
        self._note(key, name)
        return getattr(pynvml, name)

    def _read_by_another(self, field: str, value: Any, index: int) -> int | None:
        """The card read before whose ``field`` (its UUID, its minor) is ``value`` too, other than
        ``index``: a value two cards cannot share (None when no other card has it)."""
        return next((i for i, r in self._read.items() if r[field] == value and i != index), None)

    def _leave(self, key: Hashable) -> None:
        with self._lock:
            self._running.pop(key, None)
            self._abandoned.discard(key)

    def running_in(self, key: Hashable) -> str | None:
        """The NVML function ``key``'s call is in now (INIT, COUNT or a card index); None when none runs."""
        with self._lock:
            return self._running.get(key)

    def init(self) -> None:
        why = self._enter(INIT, "nvmlInit")
        if why is not None:
            raise NvmlUnavailable(f"nvmlInit: {why}")
        try:
            self._init()
        finally:
            self._leave(INIT)

    def _init(self) -> None:
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

    def start_within(self, deadline_s: float) -> list[GpuInfo]:
        """:meth:`init` and :meth:`discover`, each NVML call waited for at most ``deadline_s``:
        the cards read now (NVML is initialised, or may be later: what is not read now is
        :class:`LateCards`' to read).

        NVML may never answer a call (a card fallen off the bus can hang the driver), and no Python
        code can interrupt it: made inline, one such call kept the device plugin from ever serving.
        Here a call past its deadline is said (which call, and for which card) and left to finish on
        its worker (one thread per call): a hung ``nvmlInit`` or count leaves no card read now and
        ``uncounted`` saying why, a hung card read leaves that card in ``unreadable``; either is what
        :class:`LateCards` reads again once it answers.

        An ``nvmlInit`` that fails (no driver loaded yet, no library) is a count that failed too, with
        its error in ``uncounted``: :class:`LateCards` counts again with back-off, initialising NVML
        first (:meth:`_count`). Raised, it left the plugin advertising nothing until restarted by hand,
        though a driver container commonly loads the driver after the device plugin started.
        """
        calls = DeadlineCalls(deadline_s, name="nvml-start")
        try:
            done = calls.run({INIT: self.init})[INIT]
        except NvmlUnavailable as exc:
            self.uncounted = str(exc)
            log.error("%s -- no GPU is advertised until NVML can be initialised; tried again in the background "
                      "with back-off", exc)
            return []
        if isinstance(done, Stuck):
            self.uncounted = f"nvmlInit did not return within {deadline_s:g} s"
            log.error("%s (NVML or the driver is hung?); no GPU is advertised until it returns, then they are "
                      "counted and read in the background", self.uncounted)
            return []
        return self.discover(calls)

    def discover(self, calls: DeadlineCalls | None = None) -> list[GpuInfo]:
        """All cards NVML reports, with NVLink peers resolved to card indices by PCI bus id.

        A card that cannot be read now (its handle, UUID, name or memory; off the bus, a transient
        NVML error) is left out and named in ``unreadable`` with the error: its device IDs are made
        from the UUID, so it cannot even be advertised Unhealthy. When NVML cannot even say how many
        cards there are (``nvmlDeviceGetCount`` fails), there is no card and ``uncounted`` says why.
        :class:`LateCards` tries both again. ``calls``: make each NVML call on a worker, waited for at
        most its deadline (:meth:`start_within`); a call past it is one that failed.
        """
        error = self.count_and_read(calls)
        if error is not None:
            log.error("NVML cannot count this node's GPUs (%s); none is advertised until it can, and they are "
                      "counted again in the background with back-off", error)
        return self.cards()

    def count_and_read(self, calls: DeadlineCalls | None = None) -> str | None:
        """Ask NVML how many cards there are and read each; None when counted (``uncounted`` cleared,
        each card read or named in ``unreadable``, the error logged), else why not (``uncounted``).
        ``calls``: each call waited for at most its deadline (:meth:`start_within`)."""
        if calls is None:
            count: int | str = self._count()
        else:
            got = calls.run({COUNT: self._count})[COUNT]
            count = got if not isinstance(got, Stuck) else \
                f"{self.running_in(COUNT) or 'nvmlDeviceGetCount'} did not return within {calls.deadline_s:g} s"
        if isinstance(count, str):
            self.uncounted = count
            return count
        self.uncounted = None
        for i in range(count):
            if calls is None:
                error = self.read_index(i)
            else:
                got = calls.run({i: functools.partial(self.read_index, i)})[i]
                error = got if not isinstance(got, Stuck) else self._stuck_read(i, calls.deadline_s)
            if error is not None:
                log.error("GPU %d could not be read (%s); it is not advertised until it can be, and is read "
                          "again in the background with back-off", i, error)
        return None

    def _stuck_read(self, index: int, deadline_s: float) -> str | None:
        """Why card ``index`` is not read: its read is past its deadline (named in ``unreadable``).

        The read is abandoned: should it return, what it read is dropped and :class:`LateCards`
        reads the card afresh (it had been named unreadable, so it is one LateCards waits for;
        taken in meanwhile, it would be advertised by neither). None when it was read just now.
        """
        with self._lock:
            if index in self._read:
                return None
            self._abandoned.add(index)
            why = (f"NVML did not return from {self._running.get(index, 'reading it')} within {deadline_s:g} s "
                   "(the card may have fallen off the bus)")
            self.unreadable[index] = why
            return why

    def _count(self) -> int | str:
        """How many cards NVML counts, or why it cannot say (an error, or a count still running)."""
        if self.running_in(INIT) is not None:   # counting before nvmlInit returned: NVML is not initialised
            return "nvmlInit: the call made at start has not returned yet"
        if not self._ok:
            # The nvmlInit made at start passed its deadline and then failed (no one waits for its
            # answer any more): NVML is not initialised, and every count would fail "Uninitialized"
            # until the process restarted. Initialise it again; its error is why nothing is counted.
            try:
                self.init()
            except NvmlUnavailable as exc:
                return str(exc)
            except Exception as exc:   # a broken library: a count that failed, tried again with back-off
                return f"nvmlInit: {unreadable_answer(exc)}"
            log.warning("NVML is initialised now (nvmlInit had not succeeded at start)")
        why = self._enter(COUNT, "nvmlDeviceGetCount")
        if why is not None:
            return f"nvmlDeviceGetCount: {why}"
        try:
            count = pynvml.nvmlDeviceGetCount()
            if not _int_within(0, MAX_CARDS_PER_NODE)(count):
                # not a number, or more cards than a node may have (the inventory refuses more): an
                # answer to count again later, not one to read 2**32 indices by
                raise ValueError(f"NVML counts {str(count)[:40]!r} GPUs, not a number of 0 to {MAX_CARDS_PER_NODE}")
        except pynvml.NVMLError as exc:
            return str(exc)
        except Exception as exc:   # an answer of the wrong kind, a broken call: counted again, as above
            return unreadable_answer(exc)
        finally:
            self._leave(COUNT)
        return count

    def read_index(self, index: int) -> str | None:
        """Read card ``index`` into this session's cards; None when read, else why it could not be
        (also when an earlier read of it is still running: NVML is not asked twice about a hung card)."""
        why = self._enter(index, "nvmlDeviceGetHandleByIndex")
        if why is not None:
            self.unreadable[index] = why
            return why
        try:
            return self._read_index(index)
        finally:
            self._leave(index)

    def _read_index(self, index: int) -> str | None:
        nv = functools.partial(self._nv, index)
        try:
            h = nv("nvmlDeviceGetHandleByIndex")(index)
            uuid = _card_uuid(nv("nvmlDeviceGetUUID")(h))
            name = _nvml_text(nv("nvmlDeviceGetName")(h), "name")
            mem = nv("nvmlDeviceGetMemoryInfo")(h)
            total_mib = int(mem.total) // (1024 * 1024)
            if not 0 <= total_mib <= MAX_CARD_MEMORY_MIB:   # what the inventory (the extender) accepts
                raise ValueError(f"its memory, {total_mib} MiB, is outside 0..{MAX_CARD_MEMORY_MIB}")
        except pynvml.NVMLError as exc:
            self.unreadable[index] = str(exc)
            return str(exc)
        except Exception as exc:
            # An answer that cannot be decoded (a name or UUID that is not UTF-8), of the wrong kind
            # or out of bounds, or a call that broke below pynvml: this card cannot be read, but it
            # must not stop discovery of the others (it raised out of the device plugin's start
            # before), nor spoil the inventory the extender reads for all of them (one card's
            # memory out of its bounds made it refuse the node's). The exporter treats it alike.
            why = unreadable_answer(exc)
            self.unreadable[index] = why
            return why
        holder = self._read_by_another("uuid", uuid, index)
        if holder is not None:
            # Two cards of one UUID cannot both be advertised: their device IDs would be the same, and
            # the extender would place two pods on "one" card. The first keeps it (NVML's own lookups
            # by UUID, the container runtime's included, find one card); this one is read again.
            why = f"it reads as {uuid}, the UUID of GPU {holder}"
            self.unreadable[index] = why
            return why
        pci = _extra(nv("nvmlDeviceGetPciInfo"), h)
        bus = _extra(getattr, pci, "busId", "")
        minor = _extra(nv("nvmlDeviceGetMinorNumber"), h, default=-1, valid=_int_within(0, 2 ** 31 - 1))
        owner = self._read_by_another("minor", minor, index) if minor >= 0 else None
        if owner is not None:
            # /dev/nvidia<minor> is one card's node: given to this card's containers too, it handed them
            # the other card's node (and not their own). The first card keeps it, as with a UUID.
            log.warning("GPU %d reads minor number %d, the minor of GPU %d; its device node is not known", index,
                        minor, owner)
            minor = -1
        numa = _extra(nv("nvmlDeviceGetNumaNodeId"), h, default=-1, valid=_int_within(0, MAX_NUMA_NODE))
        self._note(index, "its NVLink queries")
        read = dict(index=index, uuid=uuid, name=name, memory_mib=total_mib, minor=minor, numa=numa,
                    pci_bus_id=_text(bus) if _bus_key(bus) is not None else "",
                    peers=tuple(self._nvlink_peers(h)))
        with self._lock:
            if index in self._abandoned:   # its caller has given up on it and left the card to LateCards
                return "its read returned after its deadline"
            self._read[index] = read
            self.unreadable.pop(index, None)
        return None

    def cards_read(self) -> list[int]:
        """The indices of the cards read so far."""
        return sorted(self._read)

    def cards(self, only: Iterable[int] | None = None) -> list[GpuInfo]:
        """The cards read so far (``only``: of these indices), by index, NVLink peers resolved among them.

        Resolved anew on every call, so a card read late appears as the peer of cards read before it.
        """
        keep = set(self._read) if only is None else set(only) & set(self._read)
        raw = [self._read[i] for i in sorted(keep)]
        by_bus = {_bus_key(r["pci_bus_id"]): r["index"] for r in raw if _bus_key(r["pci_bus_id"])}
        cards = []
        for r in raw:
            fields = {k: v for k, v in r.items() if k != "peers"}
            peers = sorted({by_bus[k] for k in r["peers"] if k in by_bus and by_bus[k] != r["index"]})
            cards.append(GpuInfo(nvlink=tuple(peers), **fields))
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
            except Exception:   # a broken call: this link is not known (an NVLink is an extra)
                continue
            key = _bus_key(_extra(getattr, remote, "busId", ""))
            if key:
                peers.append(key)
        return peers

    def probe(self, uuid: str, health_checks: bool = True) -> str | None:
        """Why this card is not fit for work, or None when it is.

        A card is healthy when NVML still finds it, its memory info reads, and it has no pending
        retired pages / remapped rows and no volatile uncorrectable ECC errors (those need a reset).
        A card in MIG mode (the mode in force; one pending until the next reset does not count) is
        not fit for Stowage's work either: a container given the whole card's UUID, as Stowage's
        records name it, sees no CUDA device it can use, and a share of it means nothing. The
        device plugin and the exporter both read this, so ``stowage_gpu_healthy`` keeps saying
        what the plugin advertises. Checks a card does not support are skipped.

        ``health_checks=False`` (``--ignored-xids all``) skips the health checks and reads MIG mode
        alone: that is how the card is set up, not its health, and turning health checks off must
        not hand a card out that no container can use. A card NVML cannot reach is then not judged.
        """
        try:
            h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            if health_checks:
                pynvml.nvmlDeviceGetMemoryInfo(h)
        except Exception as exc:   # NVMLError, or a call that broke below pynvml (ctypes' OSError)
            return f"NVML cannot reach the card: {exc}" if health_checks else None
        try:
            return (self._health_problem(h) if health_checks else None) or self._mig_problem(h)
        except Exception as exc:
            # A check answered what pynvml never gives (remapped rows that are no tuple, a MIG mode
            # that is no pair) or broke below pynvml: the card cannot be judged fit, so it is not.
            # This raised out of the device plugin's health thread before, which then died: no XID,
            # probe or late card was seen again. The card comes back once the check answers.
            return f"NVML gave a health check an {unreadable_answer(exc)}"

    @staticmethod
    def _health_problem(h: Any) -> str | None:
        """What of the card's own state needs a reset: pending retired pages or row remaps, volatile
        uncorrectable ECC errors; None when nothing does."""
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

    @staticmethod
    def _mig_problem(h: Any) -> str | None:
        """Why a card in MIG mode (the mode in force) cannot be handed out, and what to do; None otherwise."""
        mig = _optional(pynvml.nvmlDeviceGetMigMode, h)   # [current, pending]; NOT_SUPPORTED before Ampere
        if not (mig and mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE):
            return None
        index = _optional(pynvml.nvmlDeviceGetIndex, h, default="<index>")
        return (f"MIG mode is enabled: Stowage hands out whole cards and shares of them, not MIG instances, and "
                f"a container given this card could not use it; disable MIG (nvidia-smi -i {index} -mig 0, "
                f"then reset the card) or leave this node to a device plugin with a MIG strategy")


class LateCards:
    """What discovery could not read, read again with back-off until it answers: the card count, and
    the card indices.

    A card NVML cannot read when an agent starts (off the bus, a transient NVML error) may answer
    later; each index is re-read after ``first_s``, doubling up to ``max_s`` (the shared
    :class:`~gpunode.backoff.Backoff`), for as long as it does not. Discovery logged the first error;
    a different error is logged once more as a warning, repeats at debug, so a card that never comes
    back costs a few NVML calls a minute and no log lines. NVML's indices are fixed for the life of
    the session (``nvmlDeviceGetCount`` says how many there are), so only the indices that were not
    read are tried.

    When ``nvmlDeviceGetCount`` itself failed at discovery (``nvml.uncounted``), the count is tried
    again the same way (same back-off, same logging); once it answers, every index is read: the
    cards that answer are returned by that :meth:`poll`, and the others are re-read as above.
    """

    def __init__(self, nvml: Nvml, first_s: float = 1.0, max_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nvml, self.first_s, self.max_s, self.clock = nvml, first_s, max_s, clock
        # the count, while NVML cannot say it; discovery has logged why
        self._count = self._failed_once(nvml.uncounted) if nvml.uncounted is not None else None
        self._retry = {index: self._failed_once(error) for index, error in nvml.unreadable.items()}

    def _failed_once(self, error: str) -> Backoff:
        """A back-off that has seen ``error`` (already logged by whoever met it first)."""
        b = Backoff(self.first_s, self.max_s, self.clock)
        b.failed(error)
        return b

    @property
    def pending(self) -> list[int]:
        """The indices left to read (none while the cards are not counted yet)."""
        return sorted(self._retry)

    @property
    def waiting(self) -> bool:
        """Whether anything is left to read: the count, or some index."""
        return self._count is not None or bool(self._retry)

    def wait_left(self) -> float:
        """Seconds until the count or some index is due (0: now; infinite when nothing is left)."""
        backoffs = [*self._retry.values(), *([self._count] if self._count is not None else [])]
        return min((b.wait_left() for b in backoffs), default=float("inf"))

    def poll(self) -> dict[int, int]:
        """Count the cards again if that is due, and re-read every index that is due; returns
        ``{index: failed tries before}`` of the cards read now (they are in ``nvml.cards()`` from now
        on, and are not tried again)."""
        read = self._poll_count()
        for index, b in sorted(self._retry.items()):
            if b.wait_left() > 0:
                continue
            error = self.nvml.read_index(index)
            if error is None:
                read[index] = b.failures
                del self._retry[index]
                continue
            delay, new = b.failed(error)
            if new:
                log.warning("GPU %d still cannot be read, now: %s; reading it again with back-off up to %g s "
                            "(repeats logged at debug)", index, error, b.max_s)
            else:
                log.debug("GPU %d still cannot be read (%s; %d tries; next in %.1f s)", index, error, b.failures, delay)
        return read

    def _poll_count(self) -> dict[int, int]:
        """Count the cards if that is due; once NVML can, read them all: ``{index: failed counts
        before}`` of those read, the others left to the per-index retries."""
        b = self._count
        if b is None or b.wait_left() > 0:
            return {}
        before = set(self.nvml.cards_read())
        error = self.nvml.count_and_read()   # logs each index it cannot read, once
        if error is not None:
            delay, new = b.failed(error)
            if new:
                log.warning("NVML still cannot count this node's GPUs, now: %s; counting again with back-off up "
                            "to %g s (repeats logged at debug)", error, b.max_s)
            else:
                log.debug("NVML still cannot count the GPUs (%s; %d tries; next in %.1f s)", error, b.failures,
                          delay)
            return {}
        self._count = None
        found = sorted(set(self.nvml.cards_read()) - before)
        log.warning("NVML counts this node's GPUs now, after %d failed tries: %d can be read%s", b.failures,
                    len(found), f", {len(self.nvml.unreadable)} cannot yet" if self.nvml.unreadable else "")
        for index, error in self.nvml.unreadable.items():
            self._retry.setdefault(index, self._failed_once(error))
        return {index: b.failures for index in found}


class XidEvents:
    """The NVML event set for critical XID errors of the given cards.

    An event names its card by device handle, and the card an XID is about may be past answering
    any query (XID 79: fallen off the bus), reading its UUID from the handle included; so each
    card's handle is mapped to its UUID when it registers, while it answers, and an event is
    matched to its card without asking NVML anything.
    """

    def __init__(self, uuids: list[str], quiet: bool = False) -> None:
        """``quiet``: say at debug level which cards do not register (a re-creation said it before)."""
        self._set = pynvml.nvmlEventSetCreate()
        self.watched: list[str] = []
        self._uuid_of: dict[Hashable, str] = {}   # _handle_key(device handle) -> UUID, of watched cards
        for uuid in uuids:
            self.register(uuid, quiet)

    def register(self, uuid: str, quiet: bool = False) -> bool:
        """Watch one more card's XIDs in this set; whether it registered (a card that does not is
        left to probes, said once: at debug when ``quiet``)."""
        try:
            h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            key = _handle_key(h)   # first: a handle no event could be matched to is not registered
            pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._set)
        except Exception as exc:   # NVMLError, or a call that broke below pynvml
            log.log(logging.DEBUG if quiet else logging.WARNING,
                    "card %s does not report XID events (%s); only periodic probes watch it", uuid, exc)
            return False
        self.watched.append(uuid)
        self._uuid_of[key] = uuid
        return True

    def wait(self, timeout_ms: int) -> XidEvent | None:
        """The next event, or None when ``timeout_ms`` passed quietly. An event whose device is not
        one of the watched cards' handles names no card (``uuid`` None)."""
        try:
            data = pynvml.nvmlEventSetWait(self._set, timeout_ms)
            if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
                return None
        except pynvml.NVMLError as exc:
            if getattr(exc, "value", None) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            return XidEvent(uuid=None, xid=None, detail=f"waiting for NVML events failed: {exc}", wait_failed=True)
        except Exception as exc:   # broke below pynvml, or an answer that is no event: the channel is broken
            return XidEvent(uuid=None, xid=None, detail=f"waiting for NVML events failed: {unreadable_answer(exc)}",
                            wait_failed=True)
        try:
            uuid = self._uuid_of.get(_handle_key(data.device))
        except Exception:   # a device that is no handle: the event may be about any card (as unattributed)
            uuid = None
        try:
            return XidEvent(uuid=uuid, xid=int(data.eventData))
        except Exception as exc:
            # An XID event without a readable XID: critical for its card (no ignored XID can be told)
            return XidEvent(uuid=uuid, xid=None, detail=f"an XID event NVML gave no readable XID for "
                                                          f"({unreadable_answer(exc)})")

    def close(self) -> None:
        """Free the set. Its freeing may fail any way (it is closed because it broke): the set is
        dropped all the same, and the failure said at debug."""
        try:
            pynvml.nvmlEventSetFree(self._set)
        except Exception as exc:   # NVMLError, or a call that broke below pynvml
            log.debug("freeing an NVML event set failed (%s); dropped all the same", unreadable_answer(exc))


class XidWatch:
    """XID events of some cards that survive a broken event channel.

    ``nvmlEventSetWait`` can fail with something other than a timeout and keep failing (a driver
    fault, ``GPU is lost``, an event set the driver dropped); it then returns at once, so a loop
    that simply waits again spins a core and logs without end. This wrapper backs off after each
    failed wait (``first_retry_s``, doubling up to ``max_retry_s``; while backing off, ``wait``
    sleeps on ``stop`` and returns None, never longer than its timeout, so the caller's other
    periodic work keeps its pace), re-creates the event set after every ``recreate_after`` failures
    in a row (re-registering the cards; a card that cannot register is left to probes), logs an
    error once (repeats at debug) and once more when waits work again. ``broken`` is true from a
    failed wait until the next wait that works (an event or a quiet timeout); ``watched`` names the
    cards of the last event set that was made, i.e. the cards whose XIDs go unseen while broken.

    An event set that cannot be made at all (``nvmlEventSetCreate`` failing, at start or on a
    re-creation) is a failure like a failed wait: retried with the same back-off, so a driver that
    gets its event support back later is watched again without a restart of either agent.

    One thread only: a watch is made, waited on, extended and closed by one thread (it may be made
    on another and handed over before its first wait: ``Thread.start`` orders that). Nothing here
    takes a lock. Its users keep to this: the device plugin's health thread makes and uses its
    watch alone; the exporter makes its watch on the reading thread, hands it to its XID watcher
    thread before that starts, and reads what the readings need (``watched``, ``broken``) from
    copies the watcher thread takes under the exporter's health lock, never from the watch.
    """

    def __init__(self, uuids: list[str], stop: threading.Event | None = None, first_retry_s: float = 0.1,
                 max_retry_s: float = 5.0, recreate_after: int = 5,
                 clock: Callable[[], float] = time.monotonic, log_every_s: float = 60.0) -> None:
        self.uuids = list(uuids)
        self.max_retry_s = max_retry_s
        self.recreate_after = max(1, recreate_after)
        # Outages said loudly: the first of its error, then at most one per ``log_every_s`` (see _failed)
        self.log_every_s, self._clock = log_every_s, clock
        self._loud_at: float | None = None   # when an outage was last said loudly
        self._loud_error = ""                # ... and its error
        self._outage_loud = False            # the outage now (or last) was said loudly: so is its end
        self._quiet_outages = 0              # outages kept at debug since the last loud one
        self._stop = stop if stop is not None else threading.Event()
        self._backoff = Backoff(first_retry_s, max_retry_s, clock)
        self._events: XidEvents | None = None
        self._made = False       # an event set was made once: a later one is a re-creation
        self.watched: list[str] = []
        try:   # made here, before the first wait, so an XID right after construction is not missed
            self._open(quiet=False)
        except Exception as exc:   # NVMLError, or a call that broke below pynvml
            self._failed(self._not_made(exc))

    @property
    def broken(self) -> bool:
        return self._backoff.failing

    @property
    def failures(self) -> int:
        return self._backoff.failures

    @property
    def remaking(self) -> bool:
        """Whether the next :meth:`wait` that is not a back-off sleep makes the event set (anew) first."""
        return self._events is None

    def wait(self, timeout_ms: int) -> XidEvent | None:
        """The next XID event, None after a quiet wait (or a back-off sleep while ``broken``), or an
        ``XidEvent(wait_failed=True)`` for each wait (or re-creation) that failed."""
        left = self._backoff.wait_left()
        if left > 0:
            self._stop.wait(min(left, timeout_ms / 1000))
            return None
        events = self._events
        if events is None:
            try:
                events = self._open(quiet=True)
            except Exception as exc:   # NVMLError, or a call that broke below pynvml
                return self._failed(self._not_made(exc))
            log.debug("NVML event set re-created (%d of %d cards registered)", len(self.watched), len(self.uuids))
        ev = events.wait(timeout_ms)
        if ev is not None and ev.wait_failed:
            return self._failed(ev.detail)
        ended = self._backoff.succeeded()
        if ended:
            log.log(logging.WARNING if self._outage_loud else logging.DEBUG,
                    "NVML XID events are watched again, after %d failed waits", ended)
        return ev

    def add(self, uuid: str) -> None:
        """Watch a card found after the watch was made (read late by :class:`LateCards`): registered in
        the current event set at once, and in every set made from now on."""
        if uuid in self.uuids:
            return
        self.uuids.append(uuid)
        if self._events is not None and self._events.register(uuid):
            self.watched = list(self._events.watched)

    def _open(self, quiet: bool) -> XidEvents:
        """Make the event set; ``watched`` follows it. Raises NVMLError when NVML cannot make one."""
        self._events = XidEvents(self.uuids, quiet=quiet)
        self.watched, self._made = list(self._events.watched), True
        return self._events

    def _not_made(self, exc: Exception) -> str:
        """The same words for every try of one outage, so it is logged once."""
        return f"{'re-' if self._made else ''}creating the NVML event set failed: {exc}"

    def _loud_outage(self, detail: str) -> tuple[bool, int]:
        """Whether a new outage failing with ``detail`` is said loudly, and how many outages were kept
        quiet before it. A wait that works ends an outage, so a channel failing every other wait (an
        intermittent ``Unknown Error``) made each failure a new one: a warning for it and one for its
        end, about two a second for as long as it flapped. The first outage of an error is loud, then
        at most one per ``log_every_s``; the loud line counts the quiet ones."""
        now = self._clock()
        loud = (detail != self._loud_error or self._loud_at is None or now - self._loud_at >= self.log_every_s)
        if not loud:
            self._quiet_outages += 1
            return False, 0
        quiet, self._quiet_outages = self._quiet_outages, 0
        self._loud_at, self._loud_error = now, detail
        return True, quiet

    def _failed(self, detail: str) -> XidEvent:
        delay, new = self._backoff.failed(detail)
        quiet = 0
        if self.failures == 1:   # a new outage: paced across outages
            new, quiet = self._loud_outage(detail)
            self._outage_loud = new
        elif new:                # another error within one outage is said, and so is the outage's end
            self._outage_loud = True
        if new:
            more = (f"; {quiet} more outages of the event channel, each ended, since the last one logged "
                    "(at debug)" if quiet else "")
            log.warning("%s; XIDs of %s go unseen; retrying with back-off up to %g s (repeats logged at debug)%s",
                        detail, ", ".join(self.watched or self.uuids) or "no card", self.max_retry_s, more)
        else:
            log.debug("%s (failure %d in a row; next try in %.2f s)", detail, self.failures, delay)
        if self.failures % self.recreate_after == 0 and self._events is not None:
            log.log(logging.INFO if self.failures == self.recreate_after else logging.DEBUG,
                    "re-creating the NVML event set after %d failed waits in a row", self.failures)
            self._events.close()   # never raises: a set whose freeing fails is dropped all the same
            self._events = None
        return XidEvent(uuid=None, xid=None, detail=detail, wait_failed=True)

    def close(self) -> None:
        if self._events is not None:
            self._events.close()   # never raises (see XidEvents.close)
            self._events = None
