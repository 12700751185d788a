"""Per-card NVML telemetry: one pass over the cards per snapshot, plus XID health in the background.

NVML session, XID watch and health probe come from the device plugin's wrapper (``gpunode.nvml``)
and its health state machine (``gpunode.health``), so a card is "healthy" in the exporter exactly
when the device plugin would advertise it Healthy. A metric a card does not support (power on some
boards, per-process utilisation on others), or one answered with something that is no reading, is
left out; such an answer never decides the card's health.

A card read before that NVML can no longer read (fallen off the bus, XID 79; not even enumerated
after a driver reset) stays in every snapshot as an *unreachable* sample: healthy False, no
telemetry (nothing measured is made up). It is kept until it answers again or the exporter
restarts, because "gone" is exactly what ``stowage_gpu_healthy == 0`` alerts must see; a card
that never answered since the start has no known UUID and cannot be reported (it is logged).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import pynvml

from gpunode.backoff import Heartbeat, RoundGuard
from gpunode.health import DEFAULT_IGNORED_XIDS, CardHealth, HealthTracker
from gpunode.nvml import (LOST_ERRORS, Nvml, NvmlUnavailable, XidWatch, _card_uuid, _int_within, _nvml_text,
                          unreadable_answer)
from stowage.inventory import MAX_CARDS_PER_NODE

log = logging.getLogger("stowage.exporter.nvml")


@dataclass(frozen=True)
class ProcUsage:
    """One process on a card: host PID, card memory it holds, its SM utilisation (percent) if known."""

    pid: int
    memory_bytes: int
    sm_util: float | None = None


@dataclass(frozen=True)
class CardSample:
    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization: float | None          # 0..1
    power_watts: float | None
    temperature_c: float | None
    healthy: bool
    processes: tuple[ProcUsage, ...] = ()
    process_util_known: bool = False   # per-process SM utilisation was read (an empty sample counts)
    # False: NVML could not list the card's processes (e.g. NO_PERMISSION). ``processes`` is then
    # unknown, not "none", and a shared card is split by units held (estimated).
    processes_known: bool = True
    # False: nothing of the card is measured: a card seen before that NVML cannot read now (healthy
    # False), or one whose memory query answered something that is no reading (healthy as its probe
    # says). Only index/uuid/model and healthy mean anything; the telemetry fields are placeholders
    # never to be served.
    reachable: bool = True
    # False: NVML listed the processes but not the memory of some (NVML_VALUE_NOT_AVAILABLE:
    # pynvml's usedGpuMemory is None). Their memory_bytes is 0, which means "unknown": a shared
    # card's memory is then split by units held (estimated), not read as zeros.
    process_memory_known: bool = True


class CardGone(Exception):
    """The card vanished while being read."""


def _lost(exc: pynvml.NVMLError) -> bool:
    return getattr(exc, "value", None) in LOST_ERRORS


# A query this card or driver does not offer: its answer is "none", not "unknown".
_UNSUPPORTED = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})


class OddAnswer(ValueError):
    """NVML answered a query with something that is no reading of it (pynvml never gives it for a
    working card; a call that broke below pynvml looks alike)."""


def _finite(value: Any) -> float:
    """A number NVML measured; :class:`OddAnswer` for anything else (text, None, NaN, infinity)."""
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise OddAnswer(f"{type(value).__name__} {str(value)[:40]!r} is no number") from exc
    if not math.isfinite(number):
        raise OddAnswer(f"{number} is no measurement")
    return number


def _count(value: Any) -> int:
    """A count NVML gave (bytes, a PID): :class:`OddAnswer` for anything that is not a whole number."""
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)                    # exact, however large (a float would round it)
    number = _finite(value)
    if not number.is_integer():
        raise OddAnswer(f"{number} is no whole number")
    return int(number)


def _utilisation(rates: Any) -> float:
    return min(max(_finite(rates.gpu) / 100.0, 0.0), 1.0)


def _memory(info: Any) -> tuple[int, int]:
    return _count(info.total), _count(info.used)


# A timestamp more than this after now was taken before the clock was stepped back (the slack
# covers the time between reading the clock and NVML's answer).
_CLOCK_SLACK_US = 5 * 10**6


def _wall_clock_us() -> int:
    """The host's wall clock as NVML stamps its samples with it (µs since the epoch)."""
    return int(time.time() * 1e6)


def _unread(last: CardSample) -> CardSample:
    """A card read before that cannot be read now: its identity, unhealthy, nothing measured."""
    return CardSample(index=last.index, uuid=last.uuid, model=last.model, memory_total_bytes=0,
                      memory_used_bytes=0, utilization=None, power_watts=None, temperature_c=None,
                      healthy=False, reachable=False)


@dataclass
class _ProcUtilState:
    last_ts: dict[str, int] = field(default_factory=dict)  # uuid -> newest sample timestamp seen (µs)


class NvmlReader:
    """Reads every card; retries NVML initialisation (a driver installed after start) at most every ``retry_s``."""

    def __init__(self, retry_s: float = 30.0, xid_events: bool = True, recovery_quiet_s: float = 120.0,
                 ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS, health_disabled: bool = False,
                 xid_backoff_s: tuple[float, float] | None = None, xid_recreate_after: int | None = None,
                 xid_stall_s: float = 60.0) -> None:
        """``ignored_xids``, ``health_disabled`` and ``recovery_quiet_s`` are the device plugin's health
        options (``gpunode.health.parse_ignored_xids`` reads the flag), so both agents judge alike.
        ``xid_backoff_s`` (first, cap) and ``xid_recreate_after`` pace the :class:`gpunode.nvml.XidWatch`
        on a broken event channel; unset, it paces as in the device plugin (no flag sets them).
        ``xid_stall_s``: the XID watcher finishing no round this long is stuck in NVML (the device
        plugin's ``health_stall_s``; no flag sets it)."""
        self.nvml = Nvml()
        self.ok = False
        self.error = ""
        self.retry_s = retry_s
        self._next_try = 0.0
        self._xid_enabled = xid_events and not health_disabled   # disabled: no events, as in the plugin
        # every card read is added on its first read (so later cards follow the same rules)
        self._health = HealthTracker([], ignored_xids, health_disabled, recovery_quiet_s)
        self._health_lock = threading.Lock()
        self._xid_thread: threading.Thread | None = None
        self._xid_stop = threading.Event()        # the running watcher's own stop flag
        self._xid_stall_s = xid_stall_s
        self._xid_beat: Heartbeat | None = None   # the running watcher's rounds
        # what the running watcher last saw (under _health_lock): the cards its event set watches,
        # and whether its waits fail; read by the readings, never XidWatch itself (one thread's)
        self._xid_watched: list[str] = []
        self._xid_broken = False
        # cards first read after the running watcher started: it registers them (XidWatch.add) on its
        # thread, as the device plugin's health thread does its late cards (under _health_lock)
        self._xid_late: list[str] = []
        # on the last reading: whether XID events were watched (``stowage_exporter_up{source="xid"}``):
        # False while the watcher's waits fail or it is stuck in NVML; None while no watcher runs
        # (health checks disabled, no card read yet, NVML down)
        self.xid_watched: bool | None = None
        self._xid_pace: dict[str, Any] = {}      # XidWatch arguments; none: its own defaults
        if xid_backoff_s is not None:
            self._xid_pace.update(first_retry_s=xid_backoff_s[0], max_retry_s=xid_backoff_s[1])
        if xid_recreate_after is not None:
            self._xid_pace.update(recreate_after=xid_recreate_after)
        self._stop = threading.Event()           # closed: no new watcher
        # Held by close() and by a reading from its "not closed" check to the watcher's start, so
        # that a close cannot fall between them (and leave a watcher started after it running).
        self._lifecycle = threading.Lock()
        self._proc = _ProcUtilState()
        self._missing: set[str] = set()
        self._known: dict[str, CardSample] = {}   # uuid -> last sample read of every card ever read
        self._procs_unknown: set[str] = set()      # cards whose process list NVML refused (logged once)
        self._odd: set[tuple[str, str]] = set()    # (uuid, query) answered oddly on the last reading (logged once)

    # ---- lifecycle ---------------------------------------------------------------------------
    def _ensure(self) -> bool:
        if self.ok:
            return True
        now = time.monotonic()
        if now < self._next_try:
            return False
        self._next_try = now + self.retry_s
        try:
            self.nvml.init()
        except NvmlUnavailable as exc:
            self.error = f"{exc} (retrying every {self.retry_s:.0f} s)"   # logged once by the snapshotter
            return False
        self.ok, self.error = True, ""
        log.info("NVML initialised")
        return True

    def close(self) -> None:
        with self._lifecycle:
            self._stop.set()
            self._stop_xids()
        self.nvml.shutdown()
        self.ok = False

    # ---- XID events --------------------------------------------------------------------------
    def _start_xids(self) -> None:
        """Watch XID events of the tracked cards in a new thread (NVML is initialised).

        The event set is made here, before returning, so an XID right after the first snapshot is not
        missed; a failing channel (the set cannot be made, waits fail) is backed off, re-created and
        logged by :class:`gpunode.nvml.XidWatch`, as in the device plugin.
        """
        stop = threading.Event()
        with self._health_lock:
            uuids = list(self._health.cards)
            self._xid_late = []                   # every card tracked so far is in this watch
        watch = XidWatch(uuids, stop, **self._xid_pace)
        with self._health_lock:
            self._xid_watched, self._xid_broken = list(watch.watched), watch.broken
        self._xid_stop = stop
        self._xid_beat = beat = Heartbeat("XID watcher", self._xid_stall_s, log)
        self._xid_thread = threading.Thread(target=self._watch_xids, args=(watch, stop, beat),
                                            name="exporter-xid", daemon=True)
        self._xid_thread.start()

    def _xid_blind(self, cards: list[CardSample]) -> list[CardSample]:
        """``cards`` as served while the XID watcher is stuck in an NVML call: those its event set
        watches unhealthy (their XIDs go unseen, as while waits fail), said once; the watcher's own
        view again once it goes on. The tracker is not touched (the watcher's and probes' alone).
        Sets :attr:`xid_watched`."""
        beat = self._xid_beat
        if beat is None or self._xid_thread is None:
            self.xid_watched = None
            return cards
        with self._health_lock:
            watched, broken = set(self._xid_watched), self._xid_broken
        stalled = beat.stalled(f"The cards it watches are reported unhealthy until it goes on: "
                               f"{', '.join(sorted(watched)) or 'no card'}")
        self.xid_watched = not stalled and not broken
        if not stalled:
            return cards
        return [replace(c, healthy=False) if c.uuid in watched else c for c in cards]

    def _stop_xids(self) -> None:
        """Stop the watcher and let it free its event set: before NVML shuts down, since an event set
        does not outlive its session (waiting on it would fail forever, and miss every XID)."""
        self._xid_stop.set()
        if self._xid_thread is not None:
            self._xid_thread.join(timeout=5)
            self._xid_thread = None

    def _watch_xids(self, watch: XidWatch, stop: threading.Event, beat: Heartbeat) -> None:
        """Feed the watch's events to the health tracker until ``stop``, by the device plugin's rule
        (:meth:`gpunode.health.HealthTracker.on_wait`): while waits fail, the cards registered for
        events are unhealthy (their XIDs go unseen); once waits work again they heal under the usual
        quiet rule. Cards that never registered for events keep what their probes say.

        A round that raises (a call that broke below pynvml where nothing above expected it, as
        freeing an event set did before the watch dropped the set whatever its free raised; or a
        bug) is logged once with its traceback (repeats at debug) and the next one follows after a
        back-off, as in the device plugin's health thread (:class:`gpunode.backoff.RoundGuard`).
        Before, it ended this thread: its traceback went to stderr past the log, no XID was seen
        until a scrape started a new watcher, and a fault that came back ended each one.

        A round that never returns (the event wait or the event set's making, which have no
        deadline, in a driver fault) is noticed by the readings through ``beat`` (:meth:`_xid_blind`).
        """
        rounds = RoundGuard("XID watcher", log)
        try:
            while not stop.is_set():
                try:
                    self._xid_round(watch, beat)
                except Exception as exc:
                    stop.wait(rounds.failed(exc))
                    beat.beat()
                    continue
                beat.beat()
                rounds.succeeded()
        finally:
            watch.close()   # never raises: a set whose freeing fails is dropped all the same

    def _xid_round(self, watch: XidWatch, beat: Heartbeat) -> None:
        """Registers the cards read since the last round, then one event wait, applied to the health
        tracker; logs the cards it marks."""
        late: list[str] = []
        with self._health_lock:
            if beat is self._xid_beat:   # a watcher given up on leaves them to the one watching
                late, self._xid_late = self._xid_late, []
        for uuid in late:
            beat.doing = f"registering {uuid} for XID events (nvmlDeviceRegisterEvents)"
            watch.add(uuid)
        beat.doing = ("re-making the NVML event set (nvmlEventSetCreate, nvmlDeviceRegisterEvents of each card)"
                      if watch.remaking else "the NVML event wait (nvmlEventSetWait)")
        ev = watch.wait(200)
        if beat is not self._xid_beat:
            return   # a watcher given up while stuck in NVML (NVML re-initialised since): not the one watching
        with self._health_lock:
            changed = self._health.on_wait(ev, watch.watched, watch.broken, time.monotonic())
            reasons = {u: self._health.cards[u].reason for u in changed}
            self._xid_watched, self._xid_broken = list(watch.watched), watch.broken
        for u in sorted(changed):
            log.warning("card %s marked unhealthy: %s", u, reasons[u])

    # ---- reading -----------------------------------------------------------------------------
    def read(self) -> list[CardSample] | None:
        """Every card read before or now (unreachable ones as such); None when NVML is unavailable."""
        self.xid_watched = None
        if not self._ensure():
            return None
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            log.error("NVML stopped answering (%s); re-initialising on the next scrape", exc)
            self._stop_xids()
            self.nvml.shutdown()
            self.ok, self.error, self._next_try = False, f"NVML stopped answering: {exc}", 0.0
            return None
        if not _int_within(0, MAX_CARDS_PER_NODE)(count):
            # The device plugin's rule (gpunode.nvml.Nvml._count): an answer to count again on the
            # next reading, not one to read by. Before, text or None raised out of the reading (every
            # series lost, a traceback per scrape) and 2**32 read four billion indices: no end.
            self.error = f"NVML counts {str(count)[:40]!r} GPUs, not a number of 0 to {MAX_CARDS_PER_NODE}"
            return None   # logged once by the snapshotter; the session and the XID watcher are kept
        self.error = ""
        cards: list[CardSample] = []
        present: dict[str, int] = {}          # uuid -> the index it was read at
        why: dict[str, str] = {}              # uuid -> why it could not be read
        failed_at: dict[int, str] = {}        # index -> why, for cards whose UUID could not be read
        for i in range(count):
            uuid = None
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                # read as the device plugin reads it: a UUID it would not advertise (no text, empty,
                # too long, a space or a comma) names no series here either; "None" became one
                uuid = _card_uuid(pynvml.nvmlDeviceGetUUID(h))
                if uuid in present:
                    # Two cards of one UUID: every series of both would be given twice under one set
                    # of labels. The first keeps it, as in the device plugin (gpunode.nvml.Nvml).
                    failed_at[i] = f"it reads as {uuid}, the UUID of GPU {present[uuid]}"
                    continue
                cards.append(self._read_card(i, uuid, h))
                present[uuid] = i
                continue
            except (pynvml.NVMLError, CardGone) as exc:
                reason = str(exc)
            except Exception as exc:
                # An answer pynvml cannot even decode (a name or UUID that is not UTF-8 raises
                # UnicodeDecodeError) or a value of the wrong kind: this card cannot be read, but
                # it must not cost the others their series (raising here lost the whole snapshot).
                reason = unreadable_answer(exc)
            if uuid is None:
                failed_at[i] = reason
            else:
                why[uuid] = reason
        for c in cards:
            self._known[c.uuid] = c
        labels_now: set[str] = set()
        for gone in sorted(self._known.keys() - present, key=lambda u: self._known[u].index):
            last = self._known[gone]
            reason = why.get(gone) or failed_at.pop(last.index, None) or "no longer listed by NVML"
            self._log_missing(gone, reason, labels_now)
            cards.append(self._unreachable(last, reason))
        # Never read whole since the start: no model (maybe no UUID) to label a series with.
        never = [(u, r) for u, r in why.items() if u not in self._known]
        never += [(f"index {i}", r) for i, r in failed_at.items()]
        for label, reason in never:
            self._log_missing(label, f"{reason}; never read since the exporter started, so it has no series",
                              labels_now)
        for back in sorted(self._missing - labels_now):
            log.info("GPU %s answers again", back)
        self._missing = labels_now
        with self._lifecycle:
            watching = self._xid_thread is not None and self._xid_thread.is_alive()
            if self._xid_enabled and self._health.cards and not watching and not self._stop.is_set():
                self._start_xids()                # first read, after an NVML re-init, or the watcher died
        return self._xid_blind(cards)

    def known_unreachable(self) -> list[CardSample]:
        """Every card read before, as unreachable: what a reading serves while NVML as a whole does
        not answer (:meth:`read` gave None). No card can be read then, and a card read once that
        NVML cannot read keeps its health series at 0 (docs/metrics-contract.md); before, every
        card's series went, health included, so an alert on ``stowage_gpu_healthy == 0`` resolved
        at the moment every card died. Cards never read have no UUID or model: none here. A count
        that is no number keeps the session (:meth:`read`: counted again on the next reading) and
        judges no card: nothing then, as before. Nor is the outage a failed probe of each card (the
        device plugin probes its cards by their own handles): once NVML answers, each card is served
        as its own probe and XIDs say, without a recovery period for the outage."""
        if self.ok:
            return []
        return [_unread(c) for c in sorted(self._known.values(), key=lambda c: c.index)]

    def _log_missing(self, label: str, reason: str, labels_now: set[str]) -> None:
        """Log a card that cannot be read once when it goes, not on every snapshot."""
        if label not in self._missing:
            log.warning("GPU %s vanished or cannot be read (%s); reported unhealthy until it answers again",
                        label, reason)
        labels_now.add(label)

    def _unreachable(self, last: CardSample, why: str) -> CardSample:
        """A card read before that NVML cannot read now: its identity, unhealthy, nothing measured.

        The failed reach is also fed to the health tracker as a failed probe, so once the card
        answers again it turns healthy under the same quiet-period rule as the device plugin.
        """
        self._healthy(last.uuid, f"NVML cannot reach the card: {why}")   # even with health checks disabled: 0
        return _unread(last)

    def _read_card(self, index: int, uuid: str, h: Any) -> CardSample:
        """One card's telemetry and health. Its name is its identity (an odd one makes the card
        unreadable, raised to :meth:`read`); an odd answer to a telemetry query costs only what that
        query measures. Health is the probe's alone, as in the device plugin: an odd reading used to
        raise out of here, and the card was served as unreachable (unhealthy, and for the quiet
        period after) while the plugin advertised it Healthy."""
        model = _nvml_text(pynvml.nvmlDeviceGetName(h), "name")
        mem = self._reading(uuid, "memory", _memory, pynvml.nvmlDeviceGetMemoryInfo, h, required=True)
        util = self._reading(uuid, "utilisation", _utilisation, pynvml.nvmlDeviceGetUtilizationRates, h)
        power = self._reading(uuid, "power", _finite, pynvml.nvmlDeviceGetPowerUsage, h)
        temp = self._reading(uuid, "temperature", _finite, pynvml.nvmlDeviceGetTemperature, h,
                             pynvml.NVML_TEMPERATURE_GPU)
        procs, util_known, procs_known, mem_known = self._processes(uuid, h)
        problem = self.nvml.probe(uuid, health_checks=not self._health.disabled)
        healthy = self._healthy(uuid, problem)
        if mem is None:   # no memory reading: nothing to split between its pods, nothing measured
            return CardSample(index=index, uuid=uuid, model=model, memory_total_bytes=0, memory_used_bytes=0,
                              utilization=None, power_watts=None, temperature_c=None, healthy=healthy,
                              reachable=False)
        return CardSample(index=index, uuid=uuid, model=model, memory_total_bytes=mem[0], memory_used_bytes=mem[1],
                          utilization=util, power_watts=None if power is None else power / 1000.0,
                          temperature_c=temp, healthy=healthy, processes=procs, process_util_known=util_known,
                          processes_known=procs_known, process_memory_known=mem_known)

    def _reading(self, uuid: str, what: str, convert: Callable[[Any], Any], fn: Callable[..., Any], *args: Any,
                 required: bool = False) -> Any:
        """One telemetry query, ``convert``-ed: None when the card does not support it (an NVMLError;
        ``required``: raised), :class:`CardGone` when the card is gone, and None when the answer is
        no reading (:meth:`_odd_answer`)."""
        try:
            raw = fn(*args)
        except pynvml.NVMLError as exc:
            if _lost(exc):
                raise CardGone(str(exc)) from exc
            if required:
                raise
            return None
        except Exception as exc:   # broke below pynvml (ctypes' OSError): no reading, like an odd one
            return self._odd_answer(uuid, what, exc)
        try:
            value = convert(raw)
        except Exception as exc:
            return self._odd_answer(uuid, what, exc)
        self._answered(uuid, what)
        return value

    def _odd_answer(self, uuid: str, what: str, exc: BaseException) -> None:
        """Leave one reading out for an answer that is no reading; logged once until it answers again."""
        if (uuid, what) not in self._odd:
            log.warning("GPU %s: NVML answered its %s query with no reading (%s); that series is left out until "
                        "it answers again", uuid, what, unreadable_answer(exc))
            self._odd.add((uuid, what))
        return None

    def _answered(self, uuid: str, what: str) -> None:
        if (uuid, what) in self._odd:
            self._odd.discard((uuid, what))
            log.info("GPU %s: NVML answers its %s query again", uuid, what)

    def _healthy(self, uuid: str, problem: str | None) -> bool:
        """Apply one probe result to the card's health (tracking a card on its first read)."""
        with self._health_lock:
            tracker = self._health
            if uuid not in tracker.cards:
                tracker.cards[uuid] = CardHealth()
                if self._xid_thread is not None:
                    self._xid_late.append(uuid)   # read after the watcher started: it registers the card
            if tracker.on_probe(uuid, problem, time.monotonic()):
                log.warning("card %s is %s", uuid, f"unhealthy: {problem}" if problem else "healthy again")
            return tracker.cards[uuid].healthy

    def _processes(self, uuid: str, h: Any) -> tuple[tuple[ProcUsage, ...], bool, bool, bool]:
        """Compute, graphics and MPS client processes (merged by PID), whether their SM utilisation
        was read, whether the list is complete, and whether NVML gave every listed process's memory.

        A query the card does not support adds nothing; any other error (NO_PERMISSION, UNKNOWN…)
        makes the list unknown: reading it as "no processes" would report every holder of a
        shared card as idle while the card is busy, and an HPA would scale down on false zeros.
        """
        mem: dict[int, int] = {}
        mem_known = True
        refused: list[str] = []
        for fn_name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
                        "nvmlDeviceGetMPSComputeRunningProcesses"):
            fn = getattr(pynvml, fn_name, None)
            if fn is None:
                continue
            try:
                listed = fn(h)
                # An entry that is no process (a PID or memory that is no number) spoils the list
                # as a refusal does: before, it raised out of the card's reading (see _read_card).
                entries = [(_count(p.pid), getattr(p, "usedGpuMemory", None)) for p in listed or ()]
                entries = [(pid, None if used is None else _count(used)) for pid, used in entries]
            except pynvml.NVMLError as exc:
                if _lost(exc):
                    raise CardGone(str(exc)) from exc
                if getattr(exc, "value", None) not in _UNSUPPORTED:
                    refused.append(f"{fn_name}: {exc}")
                continue
            except Exception as exc:
                refused.append(f"{fn_name}: {unreadable_answer(exc)}")
                continue
            for pid, used in entries:
                mem_known = mem_known and used is not None
                mem[pid] = max(mem.get(pid, 0), used if used is not None else 0)
        if refused:
            if uuid not in self._procs_unknown:
                log.warning("GPU %s: NVML cannot list its processes (%s); if shared, its pods' shares are estimated "
                            "from the units they hold", uuid, "; ".join(refused))
            self._procs_unknown.add(uuid)
            return (), False, False, False
        if uuid in self._procs_unknown:
            log.info("GPU %s: its processes can be listed again", uuid)
            self._procs_unknown.discard(uuid)
        util, known = self._process_util(uuid, h)
        procs = tuple(ProcUsage(pid, m, util.get(pid, 0.0) if known else None) for pid, m in sorted(mem.items()))
        return procs, known, True, mem_known

    def _process_util(self, uuid: str, h: Any) -> tuple[dict[int, float], bool]:
        """Mean SM utilisation per PID over the samples NVML took since the previous snapshot.

        NVML stamps samples with the host's wall clock and answers those newer than the timestamp
        asked with. If the clock was stepped back, the newest sample seen lies in the future: asked
        with it, NVML would answer nothing until the clock caught up (every pod 0 % busy, maybe for
        hours). So a newest timestamp later than now is forgotten (NVML then answers every sample
        it keeps), and a sample stamped later than now was taken before the step and counted then."""
        future = _wall_clock_us() + _CLOCK_SLACK_US   # a timestamp past this predates a step back
        since = self._proc.last_ts.get(uuid, 0)
        if since > future:
            since = 0
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(h, since)
            read = [(_count(s.pid), _finite(s.smUtil), _count(s.timeStamp)) for s in samples]
        except pynvml.NVMLError as exc:
            # NOT_FOUND here means "no samples since timeStamp" (nothing ran), not a lost card
            if getattr(exc, "value", None) in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_SUCCESS):
                return {}, True
            if _lost(exc):
                raise CardGone(str(exc)) from exc
            return {}, False
        except Exception as exc:
            # A sample that is no sample: per-process utilisation is unknown for this reading (the
            # card's is split like its process memory), not a card that cannot be read.
            self._odd_answer(uuid, "per-process utilisation", exc)
            return {}, False
        self._answered(uuid, "per-process utilisation")
        sums: dict[int, list[float]] = {}
        newest = since
        for pid, sm_util, stamp in read:
            if stamp > future:
                continue   # stamped before the clock was stepped back
            acc = sums.setdefault(pid, [0.0, 0])
            acc[0] += sm_util
            acc[1] += 1
            newest = max(newest, stamp)
        self._proc.last_ts[uuid] = newest
        return {pid: total / n for pid, (total, n) in sums.items()}, True
