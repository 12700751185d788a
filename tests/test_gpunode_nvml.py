"""gpunode.nvml's XID events name their card by the device handle mapped when the card registered.

XID 79 means the card has fallen off the bus: every query on it fails from then on, also reading
its UUID from the event's device handle. An event set that asked NVML for the UUID after the event
arrived could not name the card, so the event counted for every card, in both agents. Run with the
fake's plain handles and with pynvml's own ctypes handles (each read of an event's ``device`` is a
new pointer object that neither compares equal nor hashes, as against the real library).
"""
from __future__ import annotations

from typing import Any, Iterator

import pynvml
import pytest

from fakenvml import FakeNvml, default_cards
from gpunode.nvml import XidEvent, XidEvents


@pytest.fixture(params=[False, True], ids=["fake-handles", "ctypes-handles"])
def fake(request: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    nv = FakeNvml(default_cards(), ctypes_handles=request.param)
    nv.install(monkeypatch)
    pynvml.nvmlInit()
    yield nv
    pynvml.nvmlShutdown()


def test_an_xid_names_a_card_that_no_longer_answers(fake: FakeNvml):
    events = XidEvents([c.uuid for c in fake.cards])
    u1 = fake.cards[1].uuid
    fake.lose(u1)                 # fallen off the bus: its UUID cannot be read any more
    fake.xid(u1, 79)
    assert events.wait(1000) == XidEvent(u1, 79)
    fake.xid(fake.cards[2].uuid, 48)
    assert events.wait(1000) == XidEvent(fake.cards[2].uuid, 48)
    events.close()


def test_an_event_whose_device_is_no_watched_card_names_no_card(fake: FakeNvml):
    events = XidEvents([c.uuid for c in fake.cards])
    fake.xid(None, 48)            # NVML cannot say which card
    assert events.wait(1000) == XidEvent(None, 48)
    events.close()
