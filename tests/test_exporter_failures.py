"""The exporter when NVML misbehaves: cards falling off the bus, process lists it cannot read, XID
event waits that fail, NVML sessions that end. Fake NVML below (pynvml functions), everything else
real: the exporter serving HTTP, the fake kubelet over gRPC, scrapes parsed as Prometheus text."""
from __future__ import annotations

import logging
import threading
import time

import pynvml
import pytest

from exporter_harness import NODE, GpuNode, MiB, Scrape, make_node
from fakenvml import default_cards
from gpunode.devices import card_key

U0, U1, U2, U3 = (c.uuid for c in default_cards())
A100 = "NVIDIA A100-SXM4-80GB"
UID_A = "0f6c3b1e-8d2a-4c5e-9b7f-1a2b3c4d5e01"
UID_B = "0f6c3b1e-8d2a-4c5e-9b7f-1a2b3c4d5e02"
GPU, MEM, CORE = "nvidia.com/gpu", "nvidia.com/gpu-memory", "nvidia.com/gpu-core"
TELEMETRY = ("stowage_gpu_utilization_ratio", "stowage_gpu_memory_used_bytes", "stowage_gpu_memory_total_bytes",
             "stowage_gpu_power_watts", "stowage_gpu_temperature_celsius")


def _healthy(s: Scrape) -> dict[str, float]:
    return {x.labels["gpu"]: x.value for x in s.samples("stowage_gpu_healthy")}


@pytest.fixture
def node(monkeypatch, tmp_path):
    yield from make_node(monkeypatch, tmp_path)


# ------------------------------------------------------------------- a card that falls off the bus


def test_a_card_that_falls_off_the_bus_is_reported_unhealthy_not_dropped(node: GpuNode, caplog):
    node.kubelet.add("ml", "train", UID_A, {"c": {GPU: [card_key(U1)]}})
    node.nvml.card(U1).used_mib, node.nvml.card(U1).gpu_util = 7000, 60
    s = node.scrape()
    assert s.value("stowage_gpu_healthy", gpu=U1) == 1
    node.nvml.xid(U1, 79)       # XID 79: the card has fallen off the bus; NVML cannot read it any more
    node.nvml.lose(U1)
    with caplog.at_level(logging.WARNING, logger="stowage.exporter.nvml"):
        s = node.scrape()
        again = node.scrape()
    for scrape in (s, again):
        assert scrape.value("stowage_gpu_healthy", node=NODE, gpu=U1, model=A100) == 0
        # nothing measured is made up: no telemetry, no per-pod shares, no attribution flag for it
        for fam in TELEMETRY:
            assert scrape.samples(fam, gpu=U1) == [], fam
        assert scrape.samples("stowage_pod_gpu_memory_used_bytes", gpu=U1) == []
        assert scrape.samples("stowage_pod_gpu_utilization_ratio", gpu=U1) == []
        assert scrape.samples("stowage_gpu_attribution_estimated", gpu=U1) == []
        assert {x.labels["gpu"] for x in scrape.samples("stowage_gpu_memory_total_bytes")} == {U0, U2, U3}
        assert scrape.up("nvml") == 1
    assert len([r for r in caplog.records if U1 in r.getMessage() and "cannot be read" in r.getMessage()]) == 1


def test_xid_79_on_a_card_that_fell_off_the_bus_marks_only_that_card(node: GpuNode, caplog):
    """Every query on a card off the bus fails, also reading its UUID from the XID event's device
    handle; the event still names the card (mapped when it registered), so the others stay 1."""
    assert set(_healthy(node.scrape()).values()) == {1}
    node.nvml.lose(U1)
    with caplog.at_level(logging.WARNING, logger="stowage.exporter.nvml"):
        node.nvml.xid(U1, 79)      # no scrape in between: only the event can mark a card so far
        _until(lambda: any("XID 79" in r.getMessage() for r in caplog.records), "XID 79 seen")
    assert _healthy(node.scrape()) == {U0: 1, U1: 0, U2: 1, U3: 1}
    assert [r.getMessage() for r in caplog.records if "XID 79" in r.getMessage()] == [
        f"card {U1} marked unhealthy: XID 79"]


def test_an_unreachable_card_recovers_after_the_quiet_period_once_it_answers(monkeypatch, tmp_path):
    for node in make_node(monkeypatch, tmp_path, exporter_config=dict(recovery_quiet_s=0.0)):
        node.scrape()
        node.nvml.lose(U2)
        assert node.scrape().value("stowage_gpu_healthy", gpu=U2) == 0
        node.nvml.restore(U2)
        s = node.scrape()
        assert s.value("stowage_gpu_healthy", gpu=U2) == 1
        assert {x.labels["gpu"] for x in s.samples("stowage_gpu_memory_total_bytes")} == {U0, U1, U2, U3}


def test_a_card_nvml_no_longer_enumerates_stays_unhealthy_until_restart(node: GpuNode):
    node.scrape()
    lost = node.nvml.cards.pop(1)      # after a driver reset the card is not even counted; indices shift
    s = node.scrape()
    assert s.value("stowage_gpu_healthy", gpu=lost.uuid) == 0
    assert {x.labels["gpu"] for x in s.samples("stowage_gpu_healthy")} == {U0, U1, U2, U3}
    assert s.value("stowage_gpu_healthy", gpu=U2) == 1 and s.value("stowage_gpu_memory_total_bytes", gpu=U3) > 0


# ------------------------------------------------------------ a process list NVML cannot read

PROCESS_QUERIES = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
                   "nvmlDeviceGetMPSComputeRunningProcesses")


def _refuse(code: int):
    def query(h):
        raise pynvml.NVMLError(code)
    return query


def _two_pods_share_the_a10(node: GpuNode) -> None:
    """a: 4 memory units, 30 core units; b: 12 memory units, 10 core units; 3000 + 2000 MiB, 80% busy."""
    node.kubelet.add("ns", "a", UID_A, {"c": {MEM: [f"{card_key(U2)}::{i}" for i in range(4)],
                                             CORE: [f"{card_key(U2)}::{i}" for i in range(30)]}})
    node.kubelet.add("ns", "b", UID_B, {"c": {MEM: [f"{card_key(U2)}::{i}" for i in range(4, 16)],
                                             CORE: [f"{card_key(U2)}::{i}" for i in range(30, 40)]}})
    node.write_pod_logs()
    node.pod_process(U2, 101, 3000, UID_A)
    node.pod_process(U2, 102, 2000, UID_B)
    node.nvml.card(U2).gpu_util = 80
    node.nvml.add_sample(U2, 101, 50)
    node.nvml.add_sample(U2, 102, 30)


def test_an_unreadable_process_list_splits_the_card_by_units_and_says_estimated(node: GpuNode, monkeypatch, caplog):
    _two_pods_share_the_a10(node)
    s = node.scrape()
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="a") == 3000 * MiB
    assert s.value("stowage_gpu_attribution_estimated", gpu=U2) == 0
    for fn in PROCESS_QUERIES:
        monkeypatch.setattr(pynvml, fn, _refuse(pynvml.NVML_ERROR_NO_PERMISSION))
    node.nvml.add_sample(U2, 101, 50)
    with caplog.at_level(logging.WARNING, logger="stowage.exporter.nvml"):
        s = node.scrape()
        node.scrape()
    # unknown, not "nobody": the card's own 5000 MiB and 80 % are divided by the units each pod holds
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="a") == pytest.approx(5000 * MiB * 4 / 16, abs=1)
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="b") == pytest.approx(5000 * MiB * 12 / 16, abs=1)
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="a") == pytest.approx(0.80 * 30 / 40)
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="b") == pytest.approx(0.80 * 10 / 40)
    assert s.value("stowage_gpu_attribution_estimated", gpu=U2) == 1
    assert len([r for r in caplog.records if U2 in r.getMessage() and "process" in r.getMessage()]) == 1


def test_one_unreadable_process_query_is_enough_to_make_the_list_unknown(node: GpuNode, monkeypatch):
    _two_pods_share_the_a10(node)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", _refuse(pynvml.NVML_ERROR_UNKNOWN))
    s = node.scrape()
    assert s.value("stowage_gpu_attribution_estimated", gpu=U2) == 1
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="b") == pytest.approx(5000 * MiB * 12 / 16, abs=1)


def test_a_process_query_the_card_does_not_support_is_not_an_unknown_list(node: GpuNode, monkeypatch):
    _two_pods_share_the_a10(node)      # e.g. no MPS on this driver: the compute list is complete
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMPSComputeRunningProcesses", _refuse(pynvml.NVML_ERROR_NOT_SUPPORTED))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetGraphicsRunningProcesses", _refuse(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND))
    s = node.scrape()
    assert s.value("stowage_gpu_attribution_estimated", gpu=U2) == 0
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="a") == 3000 * MiB
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="b") == pytest.approx(0.30)


# ------------------------------------------------------------------------ XID event waits failing


def _until(cond, what: str, limit_s: float = 30.0) -> None:
    """Wait for something the exporter's XID thread does; the limit only stops a broken test."""
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


class EventSets:
    """Wraps the fake's event-set calls: counts them, and makes chosen sets fail their waits
    (``dead``: sets of a finished NVML session; ``failing``: every wait fails with that code)."""

    def __init__(self, monkeypatch, fake) -> None:
        self.created: list[int] = []
        self.waits_failed = 0
        self.waits_ok = 0
        self.ok_on: dict[int, int] = {}         # set -> waits that worked (an event or a timeout)
        self.waits_on_dead = 0
        self.times: list[float] = []
        self.dead: set[int] = set()
        self.failing: int | None = None
        real_create, real_wait = fake.nvmlEventSetCreate, fake.nvmlEventSetWait

        def create() -> int:
            es = real_create()
            self.created.append(es)
            return es

        def wait(es: int, timeout_ms: int):
            if es in self.dead or self.failing is not None:
                self.times.append(time.monotonic())
                if es in self.dead:
                    self.waits_on_dead += 1
                self.waits_failed += 1
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED if es in self.dead else self.failing)
            try:
                return real_wait(es, timeout_ms)
            finally:
                self.waits_ok += 1
                self.ok_on[es] = self.ok_on.get(es, 0) + 1
        monkeypatch.setattr(pynvml, "nvmlEventSetCreate", create)
        monkeypatch.setattr(pynvml, "nvmlEventSetWait", wait)


def test_failing_event_waits_back_off_log_once_and_mark_cards_until_they_work(monkeypatch, tmp_path, caplog):
    for node in make_node(monkeypatch, tmp_path, xid_backoff_s=(0.05, 0.4), xid_recreate_after=3,
                          exporter_config=dict(recovery_quiet_s=0.0)):
        sets = EventSets(monkeypatch, node.nvml)
        assert node.scrape().value("stowage_gpu_healthy", gpu=U0) == 1
        # the back-off, re-creation and its log are gpunode.nvml.XidWatch's, shared with the device plugin
        with caplog.at_level(logging.DEBUG, logger="stowage.gpunode.nvml"):
            sets.failing = pynvml.NVML_ERROR_UNKNOWN
            _until(lambda: sets.waits_failed >= 7, "seven failed waits")
            # the device plugin's rule: blind to their XIDs, the cards registered for events are
            # unhealthy (probes pass and the quiet period is 0, yet they stay so while waits fail);
            # the T4, never registered for events, keeps what its probes say
            assert _healthy(node.scrape()) == {U0: 0, U1: 0, U2: 0, U3: 1}
            sets.waits_ok = 0
            sets.failing = None
            _until(lambda: sets.waits_ok >= 2, "waits working again")
        # events flow again: the quiet period (0 here) starts, and the next probes heal the cards
        assert _healthy(node.scrape()) == {U0: 1, U1: 1, U2: 1, U3: 1}
        gaps = [b - a for a, b in zip(sets.times, sets.times[1:])]
        # no spinning: each retry waits at least the backoff (0.05 s doubling, capped at 0.4 s)
        assert all(g >= min(0.05 * 2 ** i, 0.4) * 0.9 for i, g in enumerate(gaps[:6])), gaps
        said = [r for r in caplog.records if r.name == "stowage.gpunode.nvml"]
        failed = [r for r in said if "Unknown Error" in r.getMessage()]
        assert len([r for r in failed if r.levelno == logging.WARNING]) == 1 and len(failed) >= 7
        assert len([r for r in said if "watched again" in r.getMessage()]) == 1
        assert len(sets.created) >= 3      # the event set was re-created after repeated failures


def test_an_event_set_that_keeps_failing_is_recreated_and_xids_are_seen_again(monkeypatch, tmp_path, caplog):
    for node in make_node(monkeypatch, tmp_path, xid_backoff_s=(0.01, 0.05),
                           exporter_config=dict(recovery_quiet_s=0.0)):
        sets = EventSets(monkeypatch, node.nvml)
        node.scrape()
        sets.dead.update(node.nvml._sets)       # the set stops working; a new one would
        sets.ok_on.clear()
        _until(lambda: any(n >= 2 for es, n in sets.ok_on.items() if es not in sets.dead), "a new event set that works")
        s = node.scrape()                        # probes pass and the quiet period is 0: all healthy again
        assert {x.value for x in s.samples("stowage_gpu_healthy")} == {1.0}
        with caplog.at_level(logging.WARNING, logger="stowage.exporter.nvml"):
            node.nvml.xid(U0, 48)
            _until(lambda: any(U0 in r.getMessage() and "XID 48" in r.getMessage() for r in caplog.records),
                   "XID 48 seen on the new event set")


def test_nvml_reinit_stops_the_old_event_set_first_and_watches_with_a_new_one(node: GpuNode, monkeypatch):
    sets = EventSets(monkeypatch, node.nvml)
    fake = node.nvml
    real_shutdown, real_count = fake.nvmlShutdown, fake.nvmlDeviceGetCount
    hiccup = {"left": 1}

    def shutdown() -> None:                      # an event set does not outlive its NVML session
        sets.dead.update(fake._sets)
        real_shutdown()

    def count() -> int:
        if hiccup["left"]:
            hiccup["left"] -= 1
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return real_count()
    node.scrape()
    monkeypatch.setattr(pynvml, "nvmlShutdown", shutdown)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", count)
    assert node.scrape().up("nvml") == 0         # NVML stopped answering: shut down, re-initialised next time
    s = node.scrape()
    assert s.up("nvml") == 1 and {x.value for x in s.samples("stowage_gpu_healthy")} == {1.0}
    assert sets.waits_on_dead == 0               # the old watcher was stopped before its session ended
    fake.xid(U0, 48)                             # and a new one watches the new session
    _until(lambda: node.scrape().value("stowage_gpu_healthy", gpu=U0) == 0, "XID 48 seen after re-init")
    assert sets.waits_on_dead == 0


def test_an_event_set_nvml_cannot_make_at_first_is_retried_and_xids_are_seen_once_it_can(
        monkeypatch, tmp_path, caplog):
    for node in make_node(monkeypatch, tmp_path, xid_backoff_s=(0.01, 0.05)):
        sets = EventSets(monkeypatch, node.nvml)
        create = pynvml.nvmlEventSetCreate       # EventSets' counting wrapper
        refused: list[int] = []

        def refuse() -> int:
            refused.append(1)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        monkeypatch.setattr(pynvml, "nvmlEventSetCreate", refuse)
        with caplog.at_level(logging.WARNING):
            s = node.scrape()
            _until(lambda: len(refused) >= 3, "event set creation retried")
        # no event set, so no card was registered for events: nothing blinded, probes decide
        assert _healthy(s) == {U0: 1, U1: 1, U2: 1, U3: 1} and _healthy(node.scrape()) == _healthy(s)
        assert len([r for r in caplog.records if "creating the NVML event set failed" in r.getMessage()]) == 1
        monkeypatch.setattr(pynvml, "nvmlEventSetCreate", create)
        _until(lambda: sets.created, "the event set made at last")
        node.nvml.xid(U2, 48)
        _until(lambda: node.scrape().value("stowage_gpu_healthy", gpu=U2) == 0, "XID 48 seen")
        assert _healthy(node.scrape()) == {U0: 1, U1: 1, U2: 0, U3: 1}


def test_a_snapshot_after_close_starts_no_xid_watcher(node: GpuNode):
    node.scrape()
    assert node.nvml._sets                       # watched while open
    node.exporter.snapshotter.close()            # its watcher stopped, its event set freed
    assert node.nvml._sets == {}
    assert node.scrape().up("nvml") == 1         # a late scrape still reads the cards ...
    assert node.nvml._sets == {}                 # ... but starts no watcher that nothing would stop
    assert not [t for t in threading.enumerate() if t.name == "exporter-xid"]


# ------------------------------------------------------------- the device plugin's health options


def test_ignored_xids_replace_the_default_set_as_in_the_device_plugin(monkeypatch, tmp_path):
    for node in make_node(monkeypatch, tmp_path, exporter_config=dict(ignored_xids=frozenset({79}))):
        node.scrape()
        node.nvml.xid(U0, 79)        # ignored here
        node.nvml.xid(U1, 13)        # no longer ignored: the list replaces the default
        _until(lambda: node.scrape().value("stowage_gpu_healthy", gpu=U1) == 0, "XID 13 seen")
        assert node.scrape().value("stowage_gpu_healthy", gpu=U0) == 1   # 79 came first, one queue


def test_all_disables_xid_and_probe_health_but_not_unreachable(monkeypatch, tmp_path):
    for node in make_node(monkeypatch, tmp_path, exporter_config=dict(health_disabled=True)):
        node.nvml.card(U1).retired_pages_pending = True
        s = node.scrape()
        assert {x.value for x in s.samples("stowage_gpu_healthy")} == {1.0}
        assert node.nvml._sets == {}                  # no XID events watched at all
        node.nvml.lose(U2)                            # a card that cannot be read is still 0
        assert node.scrape().value("stowage_gpu_healthy", gpu=U2) == 0


def test_recovery_quiet_seconds_come_from_the_config(monkeypatch, tmp_path):
    for node in make_node(monkeypatch, tmp_path, exporter_config=dict(recovery_quiet_s=0.0)):
        node.nvml.card(U1).retired_pages_pending = True
        assert node.scrape().value("stowage_gpu_healthy", gpu=U1) == 0
        node.nvml.card(U1).retired_pages_pending = False
        assert node.scrape().value("stowage_gpu_healthy", gpu=U1) == 1
