"""NVML answering oddly, at start or mid-run: values of the wrong kind or out of range, a card that
reads as another's UUID, errors that are not ``NVMLError``, an XID storm.

Found by experiment (helper audit, session 12) with the fake NVML at the pynvml layer:

- a probe answer of an unexpected kind (``nvmlDeviceGetRemappedRows`` answering ``7``, MIG mode
  answering a number) or any exception other than ``NVMLError`` raised out of the health thread:
  it died silently, and from then on no XID, probe or late card was ever seen (cards stayed
  Healthy whatever happened to them);
- a PCI bus id that is not UTF-8 on one card, or a card count that is not a number, made discovery
  raise: the plugin advertised no card at all and never looked again;
- UUIDs that are not text (``None`` -> ``"None"`` for every card) or the same UUID on two cards
  were advertised as they came: duplicate device IDs, and an inventory with two cards of one UUID
  for the extender to place two pods on;
- memory or NUMA node out of the inventory's bounds on one card made the extender refuse the
  node's whole inventory;
- every XID event was one warning line, thousands a second in a storm (a pod's application can
  raise XID 13 at will).
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pynvml
import pytest

from dp_harness import NODE, bind_pod, container, record, rig
from fakenvml import FakeNvml, default_cards

from deviceplugin.v1beta1 import api_pb2 as dpb
from gpunode.nvml import LateCards, Nvml, XidEvents
from stowage.allocation import allocation_of_pod
from stowage.inventory import INVENTORY_ANNOTATION, decode_inventory
from stowage.resources import GPU_RESOURCES, RESOURCE_GPU


def _unhealthy(r, resource: str = RESOURCE_GPU) -> set[str]:
    return {i.split("::")[0] for i, h in r.kubelet.devices(resource).items() if h == "Unhealthy"}


def _inventory(r):
    ann = (r.kube.get_node(NODE)["metadata"].get("annotations") or {}).get(INVENTORY_ANNOTATION)
    return decode_inventory(ann).cards if ann else None   # raises when the extender would refuse it


def _session(monkeypatch, cards=None) -> tuple[FakeNvml, Nvml]:
    fake = FakeNvml(cards if cards is not None else default_cards())
    fake.install(monkeypatch)
    nv = Nvml()
    nv.init()
    return fake, nv


# ---- probes mid-run -------------------------------------------------------------------------------

@pytest.mark.parametrize("patch", [
    ("nvmlDeviceGetRemappedRows", lambda h: 7),                        # not a tuple
    ("nvmlDeviceGetMigMode", lambda h: 1),                             # not [current, pending]
    ("nvmlDeviceGetTotalEccErrors", lambda h, t, c: (_ for _ in ()).throw(OSError("ctypes call failed"))),
])
def test_a_probe_answer_nvml_should_not_give_is_a_problem_not_a_crash(monkeypatch, patch):
    fake, nv = _session(monkeypatch)
    name, odd = patch
    monkeypatch.setattr(pynvml, name, odd)
    problem = nv.probe(fake.cards[0].uuid)
    assert problem is not None and "unreadable answer" in problem


def test_an_odd_probe_answer_marks_that_card_unhealthy_and_the_health_thread_goes_on(monkeypatch):
    with rig(monkeypatch, recovery_quiet_s=0.2) as r:
        assert r.registered()
        u0, u2 = r.uuid(0), r.uuid(2)
        real = FakeNvml.nvmlDeviceGetRemappedRows

        def rows(h):
            if r.nvml._uuid_of(h) == u0:
                return 7          # NVML answers something pynvml should never give
            return real(r.nvml, h)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetRemappedRows", rows)
        assert r.kubelet.wait_for(lambda: _unhealthy(r) == {u0})
        r.nvml.xid(u2, 79)        # the thread still watches events
        assert r.kubelet.wait_for(lambda: _unhealthy(r) == {u0, u2})
        monkeypatch.setattr(pynvml, "nvmlDeviceGetRemappedRows", lambda h: real(r.nvml, h))
        assert r.kubelet.wait_for(lambda: _unhealthy(r) == {u2} or _unhealthy(r) == set(), timeout=20)
        assert r.plugin.health._thread.is_alive()


def test_an_event_wait_that_raises_something_else_than_nvmlerror_is_a_failed_wait(monkeypatch):
    """ctypes raises ``ArgumentError``/``OSError`` past pynvml's error checks: the channel is broken."""
    with rig(monkeypatch, recovery_quiet_s=0.2, event_retry_first_s=0.01, event_retry_max_s=0.05) as r:
        assert r.registered()
        real = r.nvml.nvmlEventSetWait
        broken = [True]

        def wait(event_set, timeout_ms):
            if broken[0]:
                raise OSError("exception: access violation reading 0x0")
            return real(event_set, timeout_ms)
        monkeypatch.setattr(pynvml, "nvmlEventSetWait", wait)
        u = [r.uuid(i) for i in range(4)]
        assert r.kubelet.wait_for(lambda: _unhealthy(r) == set(u[:3]))   # the event set's cards
        broken[0] = False
        assert r.kubelet.wait_for(lambda: _unhealthy(r) == set(), timeout=20)
        r.nvml.xid(u[1], 79)
        assert r.kubelet.wait_for(lambda: _unhealthy(r) == {u[1]})


def test_an_event_without_a_readable_xid_counts_as_critical_for_its_card(monkeypatch):
    fake, nv = _session(monkeypatch)
    events = XidEvents([c.uuid for c in fake.cards])
    u1 = fake.cards[1].uuid
    monkeypatch.setattr(pynvml, "nvmlEventSetWait", lambda s, t: SimpleNamespace(
        device=fake._handle(u1), eventType=pynvml.nvmlEventTypeXidCriticalError, eventData="x"))
    ev = events.wait(10)
    assert ev.uuid == u1 and ev.xid is None and not ev.wait_failed and ev.detail


def test_the_health_thread_outlives_a_bug_in_a_round(monkeypatch, caplog):
    """Whatever a round raises (here a bug injected into the probe), the thread logs it and goes on."""
    with rig(monkeypatch, recovery_quiet_s=0.2) as r:
        assert r.registered()
        real, failed = Nvml.probe, []

        def probe(self, uuid, health_checks=True):
            if len(failed) < 3:
                failed.append(uuid)
                raise RuntimeError("a bug")
            return real(self, uuid, health_checks)
        monkeypatch.setattr(Nvml, "probe", probe)
        assert r.kube.wait_for(lambda: len(failed) == 3)
        r.nvml.xid(r.uuid(2), 79)
        assert r.kubelet.wait_for(lambda: _unhealthy(r) == {r.uuid(2)})
        assert r.plugin.health._thread.is_alive()
        loud = [x for x in caplog.records if x.levelno >= logging.ERROR and "health" in x.getMessage()]
        assert len(loud) == 1


# ---- discovery ------------------------------------------------------------------------------------

def test_a_uuid_that_is_not_text_or_not_a_plausible_uuid_makes_that_card_unreadable(monkeypatch):
    cards = default_cards()
    cards[1].uuid = ""
    cards[2].uuid = "GPU-a,GPU-b"          # NVIDIA_VISIBLE_DEVICES would name two cards
    cards[3].uuid = "GPU-" + "x" * 200     # more than pynvml's 96-byte buffer can hold
    fake, nv = _session(monkeypatch, cards)
    assert [c.index for c in nv.discover()] == [0]
    assert set(nv.unreadable) == {1, 2, 3} and all("unreadable answer" in e for e in nv.unreadable.values())

    fake, nv = _session(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda h: None)
    assert nv.discover() == [] and set(nv.unreadable) == {0, 1, 2, 3}


def test_a_card_reading_as_another_cards_uuid_is_not_advertised_twice(monkeypatch):
    cards = default_cards()
    cards[2].uuid = cards[0].uuid
    with rig(monkeypatch, cards=cards, rediscover_first_s=0.05, rediscover_max_s=0.1) as r:
        assert r.registered()
        for res in GPU_RESOURCES:
            ids = r.kubelet.plugins[res].ids
            assert len(ids) == len(set(ids)), res
        assert set(r.kubelet.devices(RESOURCE_GPU)) == {cards[i].uuid for i in (0, 1, 3)}
        assert r.kube.wait_for(lambda: [c.index for c in _inventory(r) or []] == [0, 1, 3])
        assert "GPU 0" in r.plugin.nvml.unreadable[2]
        # read again later (a driver that answered wrong once): advertised once it reads as itself
        cards[2].uuid = "GPU-a1000000-1111-2222-3333-000000000002"
        assert r.kube.wait_for(lambda: [c.index for c in _inventory(r) or []] == [0, 1, 2, 3], timeout=15)


def test_memory_or_numa_out_of_bounds_spoils_that_card_only(monkeypatch):
    cards = default_cards()
    cards[1].memory_mib = -5
    cards[2].numa = 10 ** 9
    with rig(monkeypatch, cards=cards) as r:
        assert r.registered()
        assert r.kube.wait_for(lambda: _inventory(r) is not None)
        inv = _inventory(r)   # the extender reads it (it refused the whole node's before)
        assert [(c.index, c.numa) for c in inv] == [(0, 0), (2, -1), (3, -1)]
        assert "unreadable answer" in r.plugin.nvml.unreadable[1]


def test_a_bus_id_that_is_not_text_spoils_nothing_but_that_cards_nvlinks(monkeypatch):
    real = FakeNvml.nvmlDeviceGetPciInfo

    def pci(self, h):
        if self._live(h).minor == 1:
            return SimpleNamespace(busId=b"\xff\xfe")
        return real(self, h)
    monkeypatch.setattr(FakeNvml, "nvmlDeviceGetPciInfo", pci)
    with rig(monkeypatch) as r:
        assert r.registered()
        assert len(r.kubelet.devices(RESOURCE_GPU)) == 4
        assert r.kube.wait_for(lambda: _inventory(r) is not None and len(_inventory(r)) == 4)
        assert [c.pci_bus_id for c in r.plugin.nvml.cards()][1] == ""


@pytest.mark.parametrize("count", [None, "4", -1, 65])
def test_a_card_count_nvml_should_not_give_is_a_failed_count(monkeypatch, count):
    fake, nv = _session(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: count)
    assert nv.discover() == [] and nv.uncounted and "unreadable answer" in nv.uncounted
    late = LateCards(nv, first_s=0.0, max_s=0.0)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", fake.nvmlDeviceGetCount)
    assert sorted(late.poll()) == [0, 1, 2, 3]


# ---- XID storms ------------------------------------------------------------------------------------

def test_an_xid_storm_is_logged_a_few_lines_not_a_line_per_event(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    with rig(monkeypatch, probe_interval_s=3600, recovery_quiet_s=3600, xid_log_every_s=3600) as r:
        assert r.registered()
        u0, u1 = r.uuid(0), r.uuid(1)
        for _ in range(1500):
            r.nvml.xid(u0, 48)    # critical: the card goes Unhealthy once
            r.nvml.xid(u1, 13)    # an application's fault, ignored, at the rate the application likes
        r.nvml.xid(u1, 79)        # a marker: once it is seen, the storm was read
        assert r.kubelet.wait_for(lambda: _unhealthy(r) == {u0, u1}, timeout=30)
        loud = [x.getMessage() for x in caplog.records if x.levelno >= logging.WARNING
                and x.getMessage().startswith("NVML event: XID")]
        assert len(loud) == 3, loud   # XID 48 on card 0, XID 13 on card 1, XID 79 on card 1
        quiet = [x for x in caplog.records if x.levelno == logging.DEBUG and x.getMessage().startswith("NVML event: XID")]
        assert len(quiet) >= 2998


def test_the_xid_log_pacer_says_how_many_it_kept_quiet_and_stays_bounded():
    from gpunode.health import XidLogPacer

    now = [0.0]
    p = XidLogPacer(every_s=60, max_keys=4, clock=lambda: now[0])
    assert p.loud("a", 13) == (True, 0)
    assert [p.loud("a", 13) for _ in range(5)] == [(False, 0)] * 5
    assert p.loud("b", 13) == (True, 0)
    now[0] = 61
    assert p.loud("a", 13) == (True, 5)     # its line says 5 more were seen since
    for x in range(100):                    # a storm of distinct XIDs keeps a bounded table
        p.loud("a", 1000 + x)
    assert len(p._last) <= 4


# ---- devices the kubelet last saw Unhealthy ----------------------------------------------------------

def test_an_allocate_naming_an_unhealthy_device_of_the_pods_record_is_answered(monkeypatch):
    """Decided, not changed: the kubelet sends an Unhealthy device only when a container reuses its
    init container's devices (no health check there) or health changed between its pick and the
    call; refusing would fail an admission whose init container already ran on that card. NVIDIA's
    plugin checks only that the device exists. The card's devices are Unhealthy for every new pick."""
    with rig(monkeypatch, probe_interval_s=3600, recovery_quiet_s=3600) as r:
        assert r.registered()
        u0 = r.uuid(0)
        p = bind_pod(r, "p", [container("main", gpus=1)], record([(0, u0)], whole=True), "2024-01-01T00:00:01Z")
        r.nvml.xid(u0, 79)
        assert r.kubelet.wait_for(lambda: _unhealthy(r) == {u0})
        r.kubelet.take_up(p)
        resp = r.kubelet.call_raw(RESOURCE_GPU, "Allocate", dpb.AllocateRequest(
            container_requests=[dpb.ContainerAllocateRequest(devices_ids=[u0])]))
        assert resp.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == u0


def test_a_pod_bound_to_a_card_gone_unhealthy_moves_to_an_equal_card_and_the_log_says_why(monkeypatch, caplog):
    """The kubelet offers no device of an Unhealthy card: the pod bound to it before it went bad is moved
    to an equal healthy free card, like one whose card the kubelet's checkpoint holds, and its record
    corrected. The warning said "its checkpoint still gives them to another pod" before."""
    caplog.set_level(logging.INFO)
    with rig(monkeypatch, probe_interval_s=3600, recovery_quiet_s=3600, reconcile_after_allocate_s=0.1) as r:
        assert r.registered()
        u0, u1 = r.uuid(0), r.uuid(1)
        p = bind_pod(r, "p", [container("main", gpus=1)], record([(0, u0)], whole=True), "2024-01-01T00:00:01Z")
        r.nvml.xid(u0, 79)
        assert r.kubelet.wait_for(lambda: _unhealthy(r) == {u0})
        got = r.kubelet.admit(p)
        assert got["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u1
        assert r.kube.wait_for(lambda: allocation_of_pod(r.kube.get_pod("default", "p")).uuids == [u1])
        said = [x.getMessage() for x in caplog.records if "steering it to the equal free card" in x.getMessage()]
        assert said and f"{u0} is Unhealthy" in said[0] and "checkpoint" not in said[0]


# ---- a card that answers every other probe ------------------------------------------------------------

def test_a_card_that_fails_every_other_probe_stays_unhealthy_until_a_whole_quiet_period_passes():
    """A flaky card (an intermittent ``GPU is lost``) healed at the first passing probe once the quiet
    period since its last XID or its first failed probe had passed, and went bad at the next: Healthy
    ~10 s in every ~130 s with the defaults (measured with the rig: 13 flips in 4 s at a 0.1 s probe
    and a 0.5 s quiet period), long enough for the kubelet to hand it out. A failing probe now
    restarts the quiet period, as an XID does."""
    from gpunode.health import HealthTracker
    t = HealthTracker(["a", "b"], quiet_s=10)
    assert t.on_probe("a", "NVML cannot reach the card: GPU is lost", now=0) is True
    for now in range(1, 60):
        t.on_probe("a", None if now % 2 else "NVML cannot reach the card: GPU is lost", now)
        assert t.snapshot()["a"] is False, now
    for now in range(60, 68):   # the last failing probe was at 58
        assert t.on_probe("a", None, now) is False
    assert t.on_probe("a", None, now=68) is True and t.snapshot() == {"a": True, "b": True}
