"""The health thread's own NVML calls that have no deadline (the event wait, the event set's making,
a late card's registration for XID events) must not leave the cards advertised as they were, for
ever, without a word, when one of them never returns.

Found by experiment (helper audit, session 13): an ``nvmlEventSetWait`` that did not return stopped
the health thread; every card stayed Healthy (no XID, no probe seen again) and nothing was logged.
These calls are not moved onto workers (a worker per wait, every second, for a call that returns
in all but a driver fault); a watchdog notices that the thread has made no progress for
``health_stall_s``, says in which call it is, and advertises every card Unhealthy until it goes on.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from dp_harness import rig
from fakenvml import default_cards
from test_deviceplugin_hung_discovery import Hang

from stowage.resources import RESOURCE_GPU


def _health(r: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, h in r.kubelet.devices(RESOURCE_GPU).items():
        out[i.split("::")[0]] = h
    return out


def _errors(caplog: Any, *words: str) -> list[str]:
    return [x.getMessage() for x in caplog.records if x.levelno >= logging.ERROR
            and all(w in x.getMessage() for w in words)]


def test_a_hung_event_wait_makes_every_card_unhealthy_until_the_health_thread_goes_on(monkeypatch, caplog):
    with rig(monkeypatch, health_stall_s=2.0, recovery_quiet_s=0.3) as r:
        assert r.registered()
        every = {r.uuid(i) for i in range(4)}
        assert r.kubelet.wait_for(lambda: set(_health(r)) == every and set(_health(r).values()) == {"Healthy"})
        hang = Hang("nvmlEventSetWait")
        hang.install(monkeypatch)
        try:
            assert r.kube.wait_for(lambda: hang.hanging == 1)
            assert r.kubelet.wait_for(lambda: set(_health(r).values()) == {"Unhealthy"})
            assert r.kube.wait_for(lambda: _errors(caplog, "health thread", "nvmlEventSetWait"))
            assert not hang.gave_up
            assert all(not c.healthy for c in r.plugin.state.cards())   # the inventory says so too
        finally:
            hang.release()
        # the wait returns: the thread's own view of the cards is advertised again
        assert r.kubelet.wait_for(lambda: set(_health(r).values()) == {"Healthy"})
        assert r.kube.wait_for(lambda: any("health thread goes on" in x.getMessage() for x in caplog.records))


def test_a_hung_xid_registration_of_a_late_card_is_noticed(monkeypatch, caplog):
    cards = default_cards()
    cards[1].lost = True            # index 1 cannot be read at start, and is read again in the background
    with rig(monkeypatch, cards=cards, health_stall_s=2.0, rediscover_first_s=0.05, rediscover_max_s=0.1) as r:
        assert r.registered()
        u1 = r.uuid(1)
        hang = Hang("nvmlDeviceRegisterEvents", lambda h, *a: getattr(h, "uuid", None) == u1)
        hang.install(monkeypatch)
        try:
            r.nvml.restore(u1)
            assert r.kube.wait_for(lambda: hang.hanging == 1)
            assert r.kubelet.wait_for(lambda: set(_health(r).values()) == {"Unhealthy"})
            assert r.kube.wait_for(lambda: _errors(caplog, "health thread", u1))
            assert not hang.gave_up
        finally:
            hang.release()
        assert r.kubelet.wait_for(lambda: u1 in _health(r) and set(_health(r).values()) == {"Healthy"})


def test_the_inventory_ends_with_what_is_advertised_when_the_watchdog_and_the_health_thread_publish_at_once(
        monkeypatch):
    """Found by reading who publishes the inventory: the watchdog (every card Unhealthy) and the
    health thread (its own view) each computed the annotation and then handed it to the publisher,
    without a lock. A watchdog held up between the two (here: 1.5 s, as a preempted thread) handed
    its stale "every card Unhealthy" over after the health thread had published the cards Healthy
    again: the node's annotation kept saying Unhealthy (the extender placed nothing there) while
    the kubelet had them Healthy, until the next change of health."""
    from deviceplugin.kube import InventoryPublisher
    from stowage.inventory import decode_inventory

    real_publish = InventoryPublisher.publish

    def held_up_when_all_unhealthy(self: Any, value: str) -> None:
        if not any(c.healthy for c in decode_inventory(value).cards):
            threading.Event().wait(1.5)
        real_publish(self, value)
    with rig(monkeypatch, health_stall_s=1.0, recovery_quiet_s=0.3) as r:
        assert r.registered()
        monkeypatch.setattr(InventoryPublisher, "publish", held_up_when_all_unhealthy)
        hang = Hang("nvmlEventSetWait")
        hang.install(monkeypatch)
        try:
            assert r.kubelet.wait_for(lambda: set(_health(r).values()) == {"Unhealthy"})
        finally:
            hang.release()   # while the watchdog's publish is held up
        assert r.kubelet.wait_for(lambda: set(_health(r).values()) == {"Healthy"})
        threading.Event().wait(2.5)   # the held-up publish has landed, and the publisher has patched
        assert all(c.healthy for c in r.plugin.state.cards())
        assert r.kube.wait_for(lambda: r.plugin.publisher.published is not None and all(
            c.healthy for c in decode_inventory(r.plugin.publisher.published).cards), timeout=3)


def test_the_watchdog_goes_on_after_a_round_of_its_own_that_raised(monkeypatch, caplog):
    """The watchdog's loop had no guard: anything raising in one of its rounds (a publisher, a
    state update, a bug) ended the thread without a word, and a hung health thread was never
    noticed again (every card stayed advertised Healthy). Noticed by the NVML helper (session 15).
    Here its first look at the heartbeat raises; a hang after that must still be noticed."""
    from gpunode.backoff import Heartbeat
    real = Heartbeat.stalled
    calls = {"n": 0}

    def stalled_once_broken(self: Heartbeat, consequence: str = "") -> bool:
        if self.what == "health thread":
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("a round of the watchdog that raised")
        return real(self, consequence)

    monkeypatch.setattr(Heartbeat, "stalled", stalled_once_broken)
    with rig(monkeypatch, health_stall_s=2.0, recovery_quiet_s=0.3) as r:
        assert r.registered()
        assert r.kube.wait_for(lambda: calls["n"] >= 1)
        hang = Hang("nvmlEventSetWait")
        hang.install(monkeypatch)
        try:
            assert r.kube.wait_for(lambda: hang.hanging == 1)
            assert r.kubelet.wait_for(lambda: set(_health(r).values()) == {"Unhealthy"})
        finally:
            hang.release()
        assert r.kubelet.wait_for(lambda: set(_health(r).values()) == {"Healthy"})
    assert _errors(caplog, "watchdog", "a round of the watchdog that raised")
