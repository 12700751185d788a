"""Card health as a pure state machine: XID events and probe results in, healthy/unhealthy out.

Kept free of NVML and threads so every transition is testable with an explicit clock. The rule
that every existing plugin lacks is recovery: a card marked unhealthy is probed again once it
has been quiet for ``quiet_s`` seconds, and goes back to Healthy when the probe finds nothing
wrong (NVML reaches it, memory info reads, no pending retired pages / remapped rows / volatile
uncorrectable ECC errors).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from stowage.digits import whole_number

from .nvml import XidEvent

# Application faults (the card itself is fine): NVIDIA's device plugin skips the same set.
# 13 graphics engine exception, 31 MMU fault, 43 channel stopped, 45 preemptive cleanup,
# 68 video processor exception, 109 context switch timeout.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
MAX_XID = 2**64 - 1   # NVML reports an XID in a 64-bit event field


def parse_ignored_xids(text: str | None) -> tuple[frozenset[int], bool]:
    """``(ignored XIDs, health checks disabled)`` from a flag/env value.

    None -> the default set. "all" -> health checks disabled. Otherwise a comma/space separated
    list of XIDs that REPLACES the default set ("" ignores none). Bad entries raise ValueError.
    """
    if text is None:
        return DEFAULT_IGNORED_XIDS, False
    t = text.strip().lower()
    if t == "all":
        return frozenset(), True
    out = set()
    for part in t.replace(",", " ").split():
        xid = whole_number(part, MAX_XID + 1)
        if xid is None or xid > MAX_XID:
            raise ValueError(f"ignored XIDs must be numbers or 'all', got {part[:40]!r}")
        out.add(xid)
    return frozenset(out), False


def ignored_xids_option(ctx: Any, param: Any, value: str | None) -> tuple[frozenset[int], bool]:
    """click callback of ``--ignored-xids`` (the device plugin's and the exporter's): the value as
    :func:`parse_ignored_xids` reads it, refused while the command line is parsed, so a bad value
    is refused wherever the line is parsed (the docs' check included), not once the agent runs."""
    import click   # the CLIs' business; this module stays importable without it

    try:
        return parse_ignored_xids(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


@dataclass
class CardHealth:
    healthy: bool = True
    reason: str = ""
    since: float = 0.0       # when the card last turned unhealthy, saw a critical event or failed a probe


@dataclass
class HealthTracker:
    uuids: list[str]
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    disabled: bool = False
    quiet_s: float = 120.0
    cards: dict[str, CardHealth] = field(default_factory=dict)
    # Cards whose XID events cannot be watched now (the NVML event channel is broken): kept
    # Unhealthy, because an XID on them would go unseen, and not healed by probes until it works.
    blind: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        for u in self.uuids:
            self.cards.setdefault(u, CardHealth())

    def add(self, uuid: str) -> None:
        """Track a card found after start (read late by :class:`gpunode.nvml.LateCards`); Healthy until
        an event or a probe says otherwise. A card already tracked keeps its state."""
        if uuid not in self.cards:
            self.uuids.append(uuid)
            self.cards[uuid] = CardHealth()

    def snapshot(self) -> dict[str, bool]:
        return {u: c.healthy for u, c in self.cards.items()}

    def _mark_bad(self, uuid: str, reason: str, now: float) -> bool:
        c = self.cards[uuid]
        changed = c.healthy
        c.healthy, c.reason, c.since = False, reason, now
        return changed

    def on_event(self, ev: XidEvent, now: float, among: list[str] | None = None) -> set[str]:
        """Apply one NVML event; returns the cards whose health changed.

        An event that names no known card counts for every card it may be about (conservative, as
        NVIDIA's plugin): ``among``, the cards registered for the events, or else every card.
        """
        if self.disabled:
            return set()
        if ev.xid is not None and ev.xid in self.ignored_xids:
            return set()
        reason = f"XID {ev.xid}" if ev.xid is not None else (ev.detail or "NVML event error")
        pool = self.cards if among is None else among
        targets = [ev.uuid] if ev.uuid in self.cards else [u for u in pool if u in self.cards]
        return {u for u in targets if self._mark_bad(u, reason, now)}

    def on_watch_failed(self, uuids: list[str], reason: str, now: float) -> set[str]:
        """Waiting for the XID events of ``uuids`` failed; returns the cards whose health changed.

        NVIDIA's device plugin marks every card unhealthy when it cannot wait for events; we keep
        that conservative stance, but only for the cards of the event set (a card that never
        registered for events is watched by probes alone, and still is), and without restarting a
        quiet period on each failure: :meth:`on_watch_restored` starts it once events flow again.
        A card already unhealthy keeps its first reason.
        """
        if self.disabled:
            return set()
        targets = [u for u in uuids if u in self.cards]
        self.blind.update(targets)
        return {u for u in targets if self.cards[u].healthy and
                self._mark_bad(u, f"NVML events cannot be watched ({reason})", now)}

    def on_watch_restored(self, now: float) -> None:
        """Events flow again: the blind cards' quiet period starts now (XIDs while blind were missed)."""
        for u in self.blind:
            self.cards[u].since = now
        self.blind.clear()

    def on_wait(self, ev: XidEvent | None, watched: list[str], broken: bool, now: float) -> set[str]:
        """Apply one result of :meth:`gpunode.nvml.XidWatch.wait`; returns the cards whose health changed.

        ``watched`` and ``broken`` are the watch's after that wait. This is the one rule both agents
        follow (the device plugin's health thread and the exporter's XID watcher call it alike): a
        failed wait blinds the cards of the event set (:meth:`on_watch_failed`), an event marks its
        card (an event naming no known card: every card of the event set, :meth:`on_event`), and the
        first wait that works again starts the blind cards' quiet period (:meth:`on_watch_restored`),
        after which probes heal them.
        """
        if ev is not None and ev.wait_failed:
            return self.on_watch_failed(watched, ev.detail, now)
        changed = self.on_event(ev, now, among=watched) if ev is not None else set()
        if not broken and self.blind:
            self.on_watch_restored(now)
        return changed

    def on_probe(self, uuid: str, problem: str | None, now: float) -> bool:
        """Apply a probe result; returns whether the card's health changed.

        A failing probe marks a healthy card bad (a card that vanished). A passing probe heals an
        unhealthy card only once it has been quiet for ``quiet_s`` and its XIDs can be watched. Quiet
        means no critical XID and no failing probe: a failing probe restarts the quiet period as an
        XID does. Before, a card that failed every other probe (an intermittent ``GPU is lost``)
        healed at a passing one once ``quiet_s`` had passed since it first went bad, and was handed
        out Healthy for a probe interval in every ``quiet_s``.

        With health checks disabled the probes still come, reading MIG mode alone (see
        :meth:`gpunode.nvml.Nvml.probe`): how a card is set up decides whether a container can use
        it, whatever health checks say. No events are watched then, so there is no quiet period to
        wait out: a passing probe heals at once.
        """
        if uuid not in self.cards:
            return False
        c = self.cards[uuid]
        if problem is not None:
            if c.healthy:
                return self._mark_bad(uuid, problem, now)
            c.reason, c.since = problem, now
            return False
        if not c.healthy and (self.disabled or (uuid not in self.blind and now - c.since >= self.quiet_s)):
            c.healthy, c.reason = True, ""
            return True
        return False


@dataclass
class XidLogPacer:
    """Which XID events to log loudly: the first of each (card, XID), then at most one per ``every_s``.

    A card in trouble, or an application that faults its card over and over (XIDs 13, 31, 43 come
    at whatever rate the pod's code makes them), can raise thousands of XID events a second; one
    warning line each flooded the agent's log. The events themselves are all applied; only their
    lines are paced: :meth:`loud` says whether this one is logged loudly and how many of its kind
    were kept quiet (logged at debug) since the last loud one, so the next loud line can say so.
    A storm that ends within its window has no next loud line: :meth:`summaries`, called by the
    caller's own loop (no timer thread per card), hands out each window's quiet count once the
    window is over. At most ``max_keys`` kinds are remembered (a storm of distinct XIDs keeps a
    bounded table).
    """

    every_s: float = 60.0
    max_keys: int = 256
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    _last: dict[tuple[Hashable, Any], list[float | int]] = field(default_factory=dict, repr=False)

    def loud(self, uuid: str | None, xid: int | None) -> tuple[bool, int]:
        """``(log loudly, events of this kind kept quiet since the last loud one)`` for one event."""
        now, key = self.clock(), (uuid, xid)
        entry = self._last.get(key)
        if entry is not None and now - entry[0] < self.every_s:
            entry[1] += 1
            return False, 0
        quiet = int(entry[1]) if entry is not None else 0
        self._last.pop(key, None)
        if len(self._last) >= self.max_keys:   # the oldest loud lines first: their kinds are logged anew
            for k in [k for k, (t, _) in self._last.items() if now - t >= self.every_s]:
                del self._last[k]
            while len(self._last) >= self.max_keys:
                del self._last[next(iter(self._last))]
        self._last[key] = [now, 0]
        return True, quiet

    def summaries(self) -> list[tuple[str | None, int | None, int]]:
        """``(uuid, xid, events kept quiet)`` of each kind whose window is over with events kept quiet
        in it, each handed out once; every kind whose window is over is forgotten (its next event is
        loud again, as a first one). Before, those counts waited for a next loud line of their kind,
        which never came once a storm had ended: the warnings showed one event of thousands."""
        now = self.clock()
        over = [k for k, (t, _) in self._last.items() if now - t >= self.every_s]
        out = [(k[0], k[1], int(self._last[k][1])) for k in over if self._last[k][1]]
        for k in over:
            del self._last[k]
        return out
