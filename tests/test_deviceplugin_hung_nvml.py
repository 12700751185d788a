"""An NVML call that never returns (a card fallen off the bus can hang the driver's answer) must not
stop the device plugin's health thread.

Found by experiment (helper audit, session 13): a probe call that hung blocked the health thread
for ever: no XID was read and no other card could be marked Unhealthy again, nothing was logged,
and the hung card itself stayed advertised Healthy.

The hang is faked at the pynvml layer with an Event the test releases at the end, so the stuck
call returns and the plugin stops cleanly.
"""
from __future__ import annotations

import logging
import threading

import pynvml

from dp_harness import rig
from fakenvml import default_cards

from stowage.resources import RESOURCE_GPU


def _unhealthy(r, resource: str = RESOURCE_GPU) -> set[str]:
    return {i.split("::")[0] for i, h in r.kubelet.devices(resource).items() if h == "Unhealthy"}


class Hang:
    """Make ``pynvml.<name>`` hang for one card's handles until :meth:`release`; counts the calls."""

    def __init__(self, monkeypatch, r, name: str, uuid: str) -> None:
        self.real, self.uuid = getattr(pynvml, name), uuid
        self.released = threading.Event()
        self.hung = 0        # calls that hung on the card
        self.others = 0      # calls on the other cards (the probe rounds go on)
        self.cond = threading.Condition()
        monkeypatch.setattr(pynvml, name, self)

    def __call__(self, h, *args):
        hangs = getattr(h, "uuid", None) == self.uuid and not self.released.is_set()
        with self.cond:
            if hangs:
                self.hung += 1
            else:
                self.others += 1
            self.cond.notify_all()
        if hangs:
            self.released.wait()
        return self.real(h, *args)

    def wait_for(self, predicate, timeout: float = 10.0) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout=timeout)

    def release(self) -> None:
        self.released.set()


def test_a_hung_probe_marks_its_card_unhealthy_and_the_health_thread_goes_on(monkeypatch, caplog):
    with rig(monkeypatch, nvml_deadline_s=1.0, recovery_quiet_s=0.3) as r:
        assert r.registered()
        u1, u2 = r.uuid(1), r.uuid(2)
        hang = Hang(monkeypatch, r, "nvmlDeviceGetMemoryInfo", u1)
        try:
            assert hang.wait_for(lambda: hang.hung == 1)
            # the hung card goes Unhealthy once its probe is past the deadline
            assert r.kubelet.wait_for(lambda: _unhealthy(r) == {u1})
            # the thread goes on: an XID on another card is seen
            r.nvml.xid(u2, 79)
            assert r.kubelet.wait_for(lambda: _unhealthy(r) == {u1, u2})
            # more probe rounds pass, and the stuck card gets no second worker while the first hangs
            seen = hang.others
            assert hang.wait_for(lambda: hang.others >= seen + 3 * 3)
            assert hang.hung == 1
            assert r.plugin.health._thread.is_alive()
            said = [x.getMessage() for x in caplog.records if x.levelno >= logging.WARNING and u1 in x.getMessage()]
            assert len(said) == 1 and "did not answer" in said[0], said
        finally:
            hang.release()
        # the call answers at last: the card is probed afresh and heals after its quiet period
        assert r.kubelet.wait_for(lambda: u1 not in _unhealthy(r))


def test_a_hung_read_of_a_late_card_does_not_stop_the_health_thread(monkeypatch, caplog):
    cards = default_cards()
    cards[1].lost = True            # index 1 cannot be read at start, and is read again in the background
    with rig(monkeypatch, cards=cards, nvml_deadline_s=1.0, rediscover_first_s=0.05, rediscover_max_s=0.1) as r:
        assert r.registered()
        u1, u2 = r.uuid(1), r.uuid(2)
        real, released, hung = pynvml.nvmlDeviceGetHandleByIndex, threading.Event(), []

        def by_index(index):
            if index == 1 and not released.is_set():
                hung.append(index)
                released.wait()
            return real(index)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", by_index)
        r.nvml.restore(u1)
        try:
            assert r.kube.wait_for(lambda: len(hung) == 1)
            r.nvml.xid(u2, 79)      # the health thread goes on while the read hangs
            assert r.kubelet.wait_for(lambda: _unhealthy(r) == {u2})
            assert r.kube.wait_for(lambda: any("did not return" in x.getMessage() for x in caplog.records))
            assert len(hung) == 1   # no second read of it while the first hangs
        finally:
            released.set()
        # the read that hung answers at last: the card is advertised, not lost with the late answer
        assert r.kubelet.wait_for(lambda: u1 in {i.split("::")[0] for i in r.kubelet.devices(RESOURCE_GPU)})
