"""An NVML event channel that fails now and then: the failures are logged paced, never lost.

Found by experiment (``nvmlEventSetWait`` failing every other wait, the others timing out
quietly, as an intermittent ``Unknown Error`` does): each failure ended the outage before it, so
"log the error once, repeats at debug" never applied -- every failure was a new warning, and every
wait that worked after it one more ("watched again"): ~270 warning lines in 150 s of such a
channel, ~2 a second for as long as it lasts. Now the first outage of a kind is said loudly with
its recovery, the further ones within ``log_every_s`` at debug, and the next loud line says how
many were kept quiet. The health rule is unchanged: the cards stay Unhealthy while it flaps.
"""
from __future__ import annotations

import itertools
import logging

import pynvml

from fakenvml import FakeNvml, default_cards
from test_deviceplugin_event_errors import Clock, Sleeper

from gpunode.health import HealthTracker
from gpunode.nvml import XidWatch


def _flaky_channel(monkeypatch, clock: Clock, fails: set[int] | None = None):
    """``nvmlEventSetWait`` failing every other call (or the calls in ``fails``), else a quiet timeout."""
    n = itertools.count()

    def wait(event_set, timeout_ms):
        i = next(n)
        if (i % 2 == 0) if fails is None else (i in fails):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        clock.now += timeout_ms / 1000
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
    monkeypatch.setattr(pynvml, "nvmlEventSetWait", wait)


def _watch(monkeypatch, clock: Clock) -> tuple[FakeNvml, XidWatch]:
    fake = FakeNvml(default_cards())
    fake.install(monkeypatch)
    fake.nvmlInit()
    return fake, XidWatch([c.uuid for c in fake.cards], Sleeper(clock), clock=clock)


def _loud(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_channel_that_fails_every_other_wait_is_logged_a_few_times_and_its_cards_stay_unhealthy(
        monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    clock = Clock()
    fake, watch = _watch(monkeypatch, clock)
    _flaky_channel(monkeypatch, clock)
    tracker = HealthTracker([c.uuid for c in fake.cards], quiet_s=120)
    start = clock.now
    for _ in range(400):
        ev = watch.wait(1000)
        tracker.on_wait(ev, watch.watched, watch.broken, clock.now)
    minutes = (clock.now - start) / 60
    loud = [m for m in _loud(caplog) if "does not report XID events" not in m]   # the T4's, once
    assert minutes > 2 and len(loud) <= 2 * (minutes + 1), (len(loud), minutes, loud[:6])
    assert any("kept quiet" in m or "more" in m for m in loud), loud   # the quiet ones are counted
    # the cards of the event set never got a quiet period: Unhealthy (the T4 registers for no events)
    assert [tracker.snapshot()[c.uuid] for c in fake.cards] == [False, False, False, True]


def test_each_loud_failure_is_followed_by_a_loud_recovery(monkeypatch, caplog):
    """Pacing must not leave a failure as the last word: a loud failure's end is said loudly too."""
    caplog.set_level(logging.DEBUG)
    clock = Clock()
    _, watch = _watch(monkeypatch, clock)
    _flaky_channel(monkeypatch, clock, fails={0, 2, 4, 200})
    for _ in range(300):
        watch.wait(1000)
    events = [m for m in _loud(caplog) if "NVML event" in m or "XID events are watched again" in m]
    failures = [i for i, m in enumerate(events) if "failed" in m and "watched again" not in m]
    recoveries = [i for i, m in enumerate(events) if "watched again" in m]
    assert len(failures) == 2 and len(recoveries) == 2, events   # calls 0 and 200 (150 s apart) are loud
    assert all(f < r for f, r in zip(failures, recoveries)) and events[-1].startswith("NVML XID events are watched")
    assert "2 more" in events[2], events   # the outages at calls 2 and 4 were kept quiet, and counted
