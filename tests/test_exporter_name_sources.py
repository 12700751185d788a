"""The two ways the exporter names the pod UIDs of shared cards' processes (the kubelet's pod log
directories, the kubelet's device-manager checkpoint) are alternatives: a deployment mounts one.
``stowage_exporter_up`` must not call the one it did not mount a missing source while the other
names every pod: the shipped alert ``StowageExporterSourceDown`` (``stowage_exporter_up == 0`` for
10 min) would fire for ever on every node with a shared card."""
from __future__ import annotations

import os

import pytest

from exporter_harness import GpuNode, MiB, Scrape, make_node
from fakenvml import default_cards
from gpunode.devices import card_key

U0 = default_cards()[0].uuid
MEM = "nvidia.com/gpu-memory"
UID_A = "0f6c3b1e-8d2a-4c5e-9b7f-1a2b3c4d5e01"
UID_B = "0f6c3b1e-8d2a-4c5e-9b7f-1a2b3c4d5e02"


@pytest.fixture
def node(monkeypatch, tmp_path):
    yield from make_node(monkeypatch, tmp_path)


def shared_card(node: GpuNode) -> None:
    """Two pods share U0, each with a process of its own."""
    node.kubelet.add("ml", "a", UID_A, {"c": {MEM: [f"{card_key(U0)}::{n}" for n in range(0, 10)]}})
    node.kubelet.add("ml", "b", UID_B, {"c": {MEM: [f"{card_key(U0)}::{n}" for n in range(10, 30)]}})
    node.pod_process(U0, 101, 1000, UID_A)
    node.pod_process(U0, 202, 3000, UID_B)


def sources_down(s: Scrape) -> set[str]:
    """What the shipped alert StowageExporterSourceDown fires on: ``stowage_exporter_up == 0``."""
    return {x.labels["source"] for x in s.samples("stowage_exporter_up") if x.value == 0}


def test_the_shipped_layout_pod_logs_without_checkpoint_reports_no_source_down(node: GpuNode):
    """scheduler-config/exporter.yaml mounts /var/log/pods and not the checkpoint's directory.
    Everything is measured, so nothing is down; before, ``{source="checkpoint"} 0`` was served."""
    shared_card(node)
    node.write_pod_logs()
    assert not os.path.exists(node.kubelet.checkpoint)
    s = node.scrape()
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 0
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="a") == 1000 * MiB
    assert s.up("podlogs") == 1 and s.up("checkpoint") is None
    assert sources_down(s) == set()


def test_the_checkpoint_alone_reports_no_pod_logs_source_down(node: GpuNode):
    """The other documented layout: the checkpoint's directory mounted, no /var/log/pods."""
    shared_card(node)
    node.kubelet.write_checkpoint()
    assert not os.path.exists(node.pod_logs)
    s = node.scrape()
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 0
    assert s.up("checkpoint") == 1 and s.up("podlogs") is None
    assert sources_down(s) == set()


def test_neither_name_source_is_both_down(node: GpuNode):
    """Neither mounted: the shares are estimated, and both are reported missing (the alert's cue)."""
    shared_card(node)
    s = node.scrape()
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 1
    assert sources_down(s) == {"podlogs", "checkpoint"}


def test_a_checkpoint_that_is_there_but_unreadable_is_down_even_with_pod_logs(node: GpuNode):
    """A source that is mounted and fails is missing, whatever the other does: only one that is not
    there at all is the deployment's choice."""
    shared_card(node)
    node.write_pod_logs()
    with open(node.kubelet.checkpoint, "w") as f:
        f.write("not json")
    s = node.scrape()
    assert s.up("podlogs") == 1 and s.up("checkpoint") == 0
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 0
