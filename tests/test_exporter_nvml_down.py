"""NVML as a whole stops answering (``nvmlDeviceGetCount`` fails, e.g. GPU_IS_LOST in a driver
fault) after the cards were read: no card can be read, and the contract says a card read once that
NVML can no longer read keeps its ``stowage_gpu_healthy`` series at 0. Before, every card's series
went, health included: the shipped alert StowageGpuUnhealthy (``stowage_gpu_healthy == 0``)
resolved at the moment every card died, and dashboards showed the cards gone, not down."""
from __future__ import annotations

import pynvml
import pytest

from exporter_harness import GpuNode, make_node
from gpunode.devices import card_key

GPU = "nvidia.com/gpu"


@pytest.fixture
def node(monkeypatch, tmp_path):
    yield from make_node(monkeypatch, tmp_path)


def test_cards_read_before_nvml_stops_answering_stay_as_unhealthy_and_nothing_else(node: GpuNode):
    uuids = [c.uuid for c in node.nvml.cards]
    node.kubelet.add("ns", "train", "0f6c3b1e-8d2a-4c5e-9b7f-000000000001", {"c": {GPU: [card_key(uuids[0])]}})
    s = node.scrape()
    assert {x.labels["gpu"] for x in s.samples("stowage_gpu_healthy") if x.value == 1} == set(uuids)
    node.nvml.count_error = pynvml.NVML_ERROR_GPU_IS_LOST
    s = node.scrape()
    assert s.up("nvml") == 0
    assert {x.labels["gpu"]: x.value for x in s.samples("stowage_gpu_healthy")} == {u: 0 for u in uuids}
    assert {x.labels["model"] for x in s.samples("stowage_gpu_healthy")} == {c.name for c in node.nvml.cards}
    # nothing can be measured: no made-up zeros for telemetry or the pod holding a card
    for fam in ("stowage_gpu_memory_used_bytes", "stowage_gpu_utilization_ratio", "stowage_pod_gpu_memory_used_bytes",
                "stowage_gpu_attribution_estimated"):
        assert s.samples(fam) == [], fam
    # while NVML stays down (re-initialising it fails too) the cards stay known, at 0
    s = node.scrape()
    assert len(s.samples("stowage_gpu_healthy")) == len(uuids)
    node.nvml.count_error = None
    s = node.scrape()
    assert s.up("nvml") == 1
    assert {x.labels["gpu"] for x in s.samples("stowage_gpu_memory_total_bytes")} == set(uuids)
    assert len(s.samples("stowage_pod_gpu_memory_used_bytes")) == 1


def test_a_node_whose_nvml_never_answered_has_no_card_series(monkeypatch, tmp_path):
    """No card was ever read: there is no UUID or model to label one with (unchanged)."""
    for node in make_node(monkeypatch, tmp_path, driver_loaded=False):
        s = node.scrape()
        assert s.up("nvml") == 0 and s.samples("stowage_gpu_healthy") == []
