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
