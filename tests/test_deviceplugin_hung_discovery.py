"""An NVML call that never returns while the device plugin discovers the cards at start must not
keep it from serving the cards that answer.

Found by experiment (helper audit, session 13): discovery at start had no deadline. A card whose
read hung in NVML (or a hung ``nvmlInit`` / ``nvmlDeviceGetCount``) stopped ``DevicePlugin.start``
before anything was served or registered, and nothing was logged: the node's pods waited with no
word of why. Now each call of discovery is waited for at most ``nvml_deadline_s``: the plugin
serves what answered, says which call is stuck, and picks the rest up once the call returns,
never calling NVML about the same card (or count) again while it hangs.

The hang is faked at the pynvml layer with an Event the test releases. A failing run is bounded by
a long safety wait (``SAFETY_S``): a start that only returns once it passed means the plugin waited
for the hung call, which the test then reports (no assertion is about how long anything took).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import pynvml
import pytest

from dp_harness import rig

from stowage.resources import RESOURCE_GPU

SAFETY_S = 45.0


class Hang:
    """Make ``pynvml.<name>`` hang, while ``when(*args)`` holds, until :meth:`release`."""

    def __init__(self, name: str, when: Callable[..., bool] = lambda *a: True) -> None:
        self.name, self.when = name, when
        self.released = threading.Event()
        self.calls = 0       # calls that hung
        self.hanging = 0     # calls hanging now
        self.gave_up = False  # the safety wait ran out: whoever called waited for the hung call
        self.cond = threading.Condition()
        self.real: Any = None

    def install(self, monkeypatch: Any) -> None:
        self.real = getattr(pynvml, self.name)
        monkeypatch.setattr(pynvml, self.name, self)

    def __call__(self, *args: Any) -> Any:
        if not self.released.is_set() and self.when(*args):
            with self.cond:
                self.calls += 1
                self.hanging += 1
            if not self.released.wait(SAFETY_S):
                self.gave_up = True
            with self.cond:
                self.hanging -= 1
        return self.real(*args)

    def release(self) -> None:
        self.released.set()


def _advertised(r: Any) -> set[str]:
    return {i.split("::")[0] for i in r.kubelet.devices(RESOURCE_GPU)}


def _said(caplog: Any, *words: str) -> list[str]:
    return [x.getMessage() for x in caplog.records if x.levelno >= logging.WARNING
            and all(w in x.getMessage() for w in words)]


def test_a_card_whose_read_hangs_at_start_is_left_out_and_the_others_are_served(monkeypatch, caplog):
    from fakenvml import default_cards
    cards = default_cards()
    hang = Hang("nvmlDeviceGetMemoryInfo", lambda h, *a: getattr(h, "uuid", None) == cards[1].uuid)
    with rig(monkeypatch, cards=cards, nvml_deadline_s=0.5, rediscover_first_s=0.05, rediscover_max_s=0.1,
             before_start=lambda _: hang.install(monkeypatch)) as r:
        try:
            assert r.registered()
            assert hang.hanging == 1 and not hang.gave_up   # served while the read hangs, not after it
            assert _advertised(r) == {r.uuid(0), r.uuid(2), r.uuid(3)}
            said = _said(caplog, "GPU 1", "nvmlDeviceGetMemoryInfo", "did not return")
            assert said, [x.getMessage() for x in caplog.records]
            # the late-card reads go on in the background, but make no second call about the hung card
            late = r.plugin.health.late
            assert r.kube.wait_for(lambda: late._retry[1].failures >= 3) and hang.calls == 1
        finally:
            hang.release()
        # the read answers at last: the card is advertised
        assert r.kubelet.wait_for(lambda: _advertised(r) == {r.uuid(i) for i in range(4)})
        assert hang.calls == 1


@pytest.mark.parametrize("call", ["nvmlDeviceGetCount", "nvmlInit"])
def test_a_hung_count_or_init_at_start_serves_no_card_until_it_returns(monkeypatch, caplog, call):
    hang = Hang(call)
    with rig(monkeypatch, nvml_deadline_s=0.5, rediscover_first_s=0.05, rediscover_max_s=0.1,
             before_start=lambda _: hang.install(monkeypatch)) as r:
        try:
            assert r.registered()
            assert hang.hanging == 1 and not hang.gave_up   # served while the call hangs, not after it
            assert _advertised(r) == set()
            assert _said(caplog, call, "did not return"), [x.getMessage() for x in caplog.records]
            # NVML is counted again in the background, but the hung call is not made again meanwhile
            late = r.plugin.health.late
            assert r.kube.wait_for(lambda: late._count is not None and late._count.failures >= 3)
            assert hang.calls == 1
        finally:
            hang.release()
        assert r.kubelet.wait_for(lambda: _advertised(r) == {r.uuid(i) for i in range(4)})
        assert hang.calls == 1


def test_a_hung_init_that_then_fails_is_made_again_until_the_driver_answers(monkeypatch, caplog):
    """nvmlInit outlives its deadline at start, then returns an error (the driver was not loaded yet).
    Before, nothing called nvmlInit again: every later count failed as "Uninitialized" and no card was
    served until the plugin restarted. Now a later round initialises NVML again, and once the driver
    answers the cards are counted, read and served."""
    hang = Hang("nvmlInit")
    with rig(monkeypatch, driver_loaded=False, nvml_deadline_s=0.5, rediscover_first_s=0.05,
             rediscover_max_s=0.1, before_start=lambda _: hang.install(monkeypatch)) as r:
        try:
            assert r.registered()
            assert hang.hanging == 1 and _advertised(r) == set()
        finally:
            hang.release()   # ... and it fails: the driver is not loaded
        late = r.plugin.health.late
        assert r.kube.wait_for(lambda: hang.hanging == 0 and late._count is not None and late._count.failures >= 5)
        assert _advertised(r) == set()
        r.nvml.driver_loaded = True   # the driver is loaded now
        assert r.kubelet.wait_for(lambda: _advertised(r) == {r.uuid(i) for i in range(4)})
        assert r.kubelet.allocatable(RESOURCE_GPU) == 4
