"""The exporter when its attribution step breaks where nothing expected it: the PodResources listing
raising something other than :class:`PodResourcesError`, or matching processes to pods or splitting
a card raising on odd data (a bug). The per-card series were read from NVML before attribution
starts: such a failure must cost the per-pod series it concerns, not the scrape. Fake NVML (pynvml
functions) and a fake kubelet over real gRPC; the real exporter serving HTTP; scrapes parsed as
Prometheus text."""
from __future__ import annotations

import logging

import pytest

import exporter.collector as collector
from exporter_harness import GpuNode, MiB, Scrape, make_node
from fakenvml import default_cards
from gpunode.devices import card_key

U0, U1, U2, U3 = (c.uuid for c in default_cards())
GPU, MEM = "nvidia.com/gpu", "nvidia.com/gpu-memory"
UID_W, UID_A, UID_B = (f"0f6c3b1e-8d2a-4c5e-9b7f-{n:012x}" for n in (1, 2, 3))
CARD_SERIES = ("stowage_gpu_healthy", "stowage_gpu_memory_total_bytes", "stowage_gpu_memory_used_bytes",
               "stowage_gpu_utilization_ratio", "stowage_gpu_power_watts", "stowage_gpu_temperature_celsius")


@pytest.fixture
def node(monkeypatch, tmp_path):
    for n in make_node(monkeypatch, tmp_path):
        # a whole card (U0) held by one pod; the A10 (U2) shared by two pods, each with a process on it
        n.kubelet.add("ml", "whole", UID_W, {"c": {GPU: [card_key(U0)]}})
        n.kubelet.add("ml", "a", UID_A, {"c": {MEM: [f"{card_key(U2)}::{i}" for i in range(4)]}})
        n.kubelet.add("ml", "b", UID_B, {"c": {MEM: [f"{card_key(U2)}::{i}" for i in range(4, 8)]}})
        n.write_pod_logs()
        n.nvml.card(U0).used_mib = 7000
        n.pod_process(U2, 101, 3000, UID_A)
        n.pod_process(U2, 102, 1000, UID_B)
        yield n


def _cards(s: Scrape) -> dict[str, set[str]]:
    return {fam: {x.labels["gpu"] for x in s.samples(fam)} for fam in CARD_SERIES}


def _pods(s: Scrape) -> set[tuple[str, str]]:
    return {(x.labels["pod"], x.labels["gpu"]) for x in s.samples("stowage_pod_gpu_memory_used_bytes")}


def _said(caplog, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


def test_the_node_reads_whole_when_nothing_breaks(node: GpuNode):
    """The baseline the cases below break: every card, every holder, every source up."""
    s = node.scrape()
    assert _cards(s) == {fam: {U0, U1, U2, U3} for fam in CARD_SERIES}
    assert _pods(s) == {("whole", U0), ("a", U2), ("b", U2)}
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="a") == 3000 * MiB
    assert s.up("podresources") == 1 and s.up("attribution") == 1


def test_a_listing_that_raises_something_unexpected_keeps_the_card_series(node: GpuNode, monkeypatch, caplog):
    """Before, the exception left Snapshotter.take: the scrape lost every series, the card series
    NVML had just answered included (every source said down), and the traceback was logged anew on
    every scrape."""
    def broken_listing(socket_path: str, timeout_s: float) -> list:
        raise ValueError("a listing that broke below the client")
    monkeypatch.setattr(node.exporter.snapshotter, "_list", broken_listing)
    with caplog.at_level(logging.WARNING, logger="stowage.exporter"):
        scrapes = [node.scrape() for _ in range(3)]
    for s in scrapes:
        assert _cards(s) == {fam: {U0, U1, U2, U3} for fam in CARD_SERIES}
        assert s.value("stowage_gpu_memory_used_bytes", gpu=U0) == 7000 * MiB
        assert s.up("nvml") == 1 and s.up("podresources") == 0
        assert _pods(s) == set()
    said = _said(caplog, "a listing that broke below the client")
    assert len(said) == 1 and said[0].startswith("podresources:"), said


def test_matching_processes_to_pods_that_raises_costs_the_shared_cards_split_only(node: GpuNode, monkeypatch,
                                                                                  caplog):
    snapshotter = node.exporter.snapshotter
    real_owners = snapshotter._owners
    breaking = [True]

    def broken_owners(*args, **kwargs):
        if breaking[0]:
            raise KeyError("odd data")
        return real_owners(*args, **kwargs)
    monkeypatch.setattr(snapshotter, "_owners", broken_owners)
    with caplog.at_level(logging.WARNING, logger="stowage.exporter"):
        scrapes = [node.scrape() for _ in range(3)]
    for s in scrapes:
        assert _cards(s) == {fam: {U0, U1, U2, U3} for fam in CARD_SERIES}
        assert s.up("nvml") == 1 and s.up("podresources") == 1 and s.up("attribution") == 0
        # the whole card needs no process matching: its holder keeps its series
        assert _pods(s) == {("whole", U0)}
        assert s.value("stowage_pod_gpu_memory_used_bytes", pod="whole") == 7000 * MiB
        assert s.samples("stowage_gpu_attribution_estimated", gpu=U2) == []
    said = _said(caplog, "attribution:")
    assert len(said) == 1 and "KeyError" in said[0], said
    assert [r.exc_info for r in caplog.records if "attribution:" in r.getMessage()][0] is not None   # the traceback
    breaking[0] = False   # the odd data gone: attribution whole again, said once
    with caplog.at_level(logging.INFO, logger="stowage.exporter"):
        s = node.scrape()
    assert s.up("attribution") == 1 and _pods(s) == {("whole", U0), ("a", U2), ("b", U2)}
    assert _said(caplog, "attribution: available again")


def test_splitting_one_card_that_raises_costs_that_cards_pod_series_only(node: GpuNode, monkeypatch, caplog):
    real_split = collector.split_card

    def split_breaking_on_the_a10(card, holders, owners):
        if card.uuid == U2:
            raise ZeroDivisionError("odd units")
        return real_split(card, holders, owners)
    monkeypatch.setattr(collector, "split_card", split_breaking_on_the_a10)
    with caplog.at_level(logging.WARNING, logger="stowage.exporter"):
        scrapes = [node.scrape() for _ in range(2)]
    for s in scrapes:
        assert _cards(s) == {fam: {U0, U1, U2, U3} for fam in CARD_SERIES}
        assert _pods(s) == {("whole", U0)} and s.up("attribution") == 0
        assert s.samples("stowage_gpu_attribution_estimated", gpu=U2) == []
    said = _said(caplog, "attribution:")
    assert len(said) == 1 and U2 in said[0] and "ZeroDivisionError" in said[0], said


def test_holders_that_cannot_be_decoded_cost_the_pod_series_not_the_card_series(node: GpuNode, monkeypatch):
    def broken_holders(assignments, uuids):
        raise TypeError("a device ID that is no text")
    monkeypatch.setattr(collector, "holders_by_card", broken_holders)
    s = node.scrape()
    assert _cards(s) == {fam: {U0, U1, U2, U3} for fam in CARD_SERIES}
    assert _pods(s) == set() and s.up("podresources") == 1 and s.up("attribution") == 0
