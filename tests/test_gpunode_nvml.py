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
from gpunode.nvml import Nvml, XidEvent, XidEvents


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


def test_a_card_unreadable_at_discovery_is_read_again_with_back_off(fake: FakeNvml):
    """Discovery leaves out a card it cannot read; :class:`LateCards` re-reads that index alone, paced by
    the shared back-off (1 s, 2 s, ...), and once it answers it joins ``cards()`` with its NVLink
    peer resolved on both sides."""
    from gpunode.nvml import LateCards, Nvml
    u1 = fake.cards[1].uuid
    fake.lose(u1)
    nvml = Nvml()
    assert [c.index for c in nvml.discover()] == [0, 2, 3] and nvml.cards()[0].nvlink == ()
    assert set(nvml.unreadable) == {1}
    now = [100.0]
    late = LateCards(nvml, first_s=1.0, max_s=4.0, clock=lambda: now[0])
    reads = fake.calls["nvmlDeviceGetHandleByIndex"]
    assert late.pending == [1] and late.wait_left() == 1.0
    assert late.poll() == {} and fake.calls["nvmlDeviceGetHandleByIndex"] == reads   # not due yet
    now[0] = 101.0
    assert late.poll() == {} and fake.calls["nvmlDeviceGetHandleByIndex"] == reads + 1   # due: read, still lost
    assert late.wait_left() == 2.0
    fake.restore(u1)
    now[0] = 102.0
    assert late.poll() == {}                                                          # backing off
    now[0] = 103.0
    assert late.poll() == {1: 2} and late.pending == [] and late.wait_left() == float("inf")
    cards = nvml.cards()
    assert [c.uuid for c in cards] == [c.uuid for c in fake.cards]
    assert cards[0].nvlink == (1,) and cards[1].nvlink == (0,)
    assert [c.index for c in nvml.cards(only={0, 2})] == [0, 2] and nvml.cards(only={0, 2})[0].nvlink == ()
    reads = fake.calls["nvmlDeviceGetHandleByIndex"]
    now[0] = 1000.0
    assert late.poll() == {} and fake.calls["nvmlDeviceGetHandleByIndex"] == reads    # nothing left to read


def test_a_count_that_fails_at_discovery_is_tried_again_with_back_off(fake: FakeNvml):
    """``nvmlDeviceGetCount`` failing at discovery leaves no card and no index to re-read: before,
    nothing was ever tried again. :class:`LateCards` now counts again with the same back-off; once
    NVML can count, the cards that answer come back from that poll and the others are re-read alone."""
    from gpunode.nvml import LateCards, Nvml
    u1 = fake.cards[1].uuid
    fake.count_error = pynvml.NVML_ERROR_UNKNOWN
    fake.lose(u1)
    nvml = Nvml()
    assert nvml.discover() == [] and nvml.uncounted and nvml.unreadable == {}
    now = [100.0]
    late = LateCards(nvml, first_s=1.0, max_s=4.0, clock=lambda: now[0])
    counts = fake.calls["nvmlDeviceGetCount"]
    assert late.waiting and late.pending == [] and late.wait_left() == 1.0
    assert late.poll() == {} and fake.calls["nvmlDeviceGetCount"] == counts            # not due yet
    now[0] = 101.0
    assert late.poll() == {} and fake.calls["nvmlDeviceGetCount"] == counts + 1        # due: counted, fails
    assert late.wait_left() == 2.0
    fake.count_error = None
    now[0] = 102.0
    assert late.poll() == {} and fake.calls["nvmlDeviceGetCount"] == counts + 1        # backing off
    now[0] = 103.0
    assert late.poll() == {0: 2, 2: 2, 3: 2} and nvml.uncounted is None
    assert [c.index for c in nvml.cards()] == [0, 2, 3] and late.pending == [1] and late.waiting
    assert late.wait_left() == 1.0                                  # card 1: its own back-off, from now
    fake.restore(u1)
    now[0] = 104.0
    assert late.poll() == {1: 1} and not late.waiting and late.wait_left() == float("inf")
    assert fake.calls["nvmlDeviceGetCount"] == counts + 2                              # counted once more only
    assert nvml.cards()[0].nvlink == (1,) and nvml.cards()[1].nvlink == (0,)


def test_a_card_added_to_a_watch_reports_its_xids(fake: FakeNvml):
    from gpunode.nvml import XidWatch
    u0, u2 = fake.cards[0].uuid, fake.cards[2].uuid
    watch = XidWatch([u0])
    watch.add(u2)
    watch.add(u2)                  # once only
    assert watch.watched == [u0, u2] and watch.uuids == [u0, u2]
    fake.xid(u2, 79)
    assert watch.wait(1000) == XidEvent(u2, 79)
    watch.close()


def test_a_card_whose_nvml_name_is_not_utf8_is_unreadable_and_spoils_no_other_card(monkeypatch):
    """pynvml decodes NVML's byte strings; a name or UUID that is not UTF-8 raised UnicodeDecodeError
    out of discovery, so the device plugin failed to start on a node whose other cards were fine.
    Such a card is unreadable (not advertised, read again with back-off, as any card NVML cannot
    read), like the exporter treats it (tests/test_exporter_hostile.py)."""
    cards = default_cards()
    cards[1].name = b"NVIDIA \xff\xfe broken"
    FakeNvml(cards).install(monkeypatch)
    n = Nvml()
    n.init()
    assert n.count_and_read() is None
    assert 1 in n.unreadable and "UnicodeDecodeError" in n.unreadable[1]
    assert [c.index for c in n.cards()] == [0, 2, 3]


def test_an_event_set_whose_free_raises_is_dropped_and_made_anew(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch):
    """``nvmlEventSetFree`` that raises something other than NVMLError (a call broken below
    pynvml) escaped ``XidEvents.close``, and ``XidWatch`` cleared its set only after the close: the
    broken set stayed, and was waited on (and failed) for good; no XID was seen again."""
    from gpunode.nvml import XidWatch
    u0 = fake.cards[0].uuid
    watch = XidWatch([u0], first_retry_s=0.0, max_retry_s=0.0, recreate_after=1)
    broken = watch._events._set   # the set the driver drops
    real_free = fake.nvmlEventSetFree

    def free(event_set: int) -> None:
        real_free(event_set)
        raise OSError("driver went away while freeing")
    monkeypatch.setattr(pynvml, "nvmlEventSetFree", free)
    fake.nvmlEventSetFree(broken)        # waits on it now fail (NVML_ERROR_INVALID_ARGUMENT)
    ev = watch.wait(10)
    assert ev is not None and ev.wait_failed   # the failed wait frees the set: that raises
    assert watch.wait(10) is None and not watch.broken   # the set is made anew, and waits work
    fake.xid(u0, 79)
    assert watch.wait(1000) == XidEvent(u0, 79)
    watch.close()                         # and closing raises nothing either


def test_a_card_whose_handle_cannot_be_keyed_is_left_to_probes_and_its_set_stays_usable(
        fake: FakeNvml, monkeypatch: pytest.MonkeyPatch):
    """``_handle_key`` of an odd handle raised outside register's guard: the set made in
    ``XidEvents.__init__`` was never freed, and the watch of every other card failed with it."""
    import gpunode.nvml as gn
    u0, u1 = fake.cards[0].uuid, fake.cards[1].uuid
    real_key = gn._handle_key
    odd = fake.nvmlDeviceGetHandleByUUID(u1)

    def key(handle: Any) -> Any:
        if handle is odd:
            raise TypeError("unhashable handle")
        return real_key(handle)
    monkeypatch.setattr(gn, "_handle_key", key)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", lambda uuid: odd if uuid == u1 else
                        fake.nvmlDeviceGetHandleByUUID(uuid))
    events = XidEvents([u0, u1])
    assert events.watched == [u0]
    fake.xid(u0, 48)
    assert events.wait(1000) == XidEvent(u0, 48)
    events.close()
