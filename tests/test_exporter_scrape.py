"""The exporter end to end: fake NVML below, fake kubelet PodResources over real gRPC on a unix
socket, a /proc tree in tmp, and real HTTP scrapes of /metrics parsed as Prometheus text."""
from __future__ import annotations

import logging
import time

import pynvml
import pytest

from exporter import nvmlreader
from exporter_harness import GiB, MiB, NODE, GpuNode, make_node
from fakenvml import FakeCard, default_cards
from fakepodresources import cgroup_v1_cgroupfs
from gpunode.devices import card_key

U0, U1, U2, U3 = (c.uuid for c in default_cards())
A100, A10, T4 = "NVIDIA A100-SXM4-80GB", "NVIDIA A10", "Tesla T4"
UID_A = "0f6c3b1e-8d2a-4c5e-9b7f-1a2b3c4d5e01"
UID_B = "0f6c3b1e-8d2a-4c5e-9b7f-1a2b3c4d5e02"
UID_C = "0f6c3b1e-8d2a-4c5e-9b7f-1a2b3c4d5e03"
MEM, CORE, GPU = "nvidia.com/gpu-memory", "nvidia.com/gpu-core", "nvidia.com/gpu"


def units(uuid: str, lo: int, hi: int) -> list[str]:
    return [f"{card_key(uuid)}::{n}" for n in range(lo, hi)]


@pytest.fixture
def node(monkeypatch, tmp_path):
    yield from make_node(monkeypatch, tmp_path)


def pod_labels(uuid: str, model: str, pod: str, namespace: str, container: str) -> dict[str, str]:
    return dict(node=NODE, gpu=uuid, model=model, pod=pod, namespace=namespace, container=container)


# ------------------------------------------------------------------------------------ per card


def test_every_card_is_measured_with_contract_names_labels_and_units(node: GpuNode):
    c = node.nvml.card(U2)
    c.used_mib, c.gpu_util, c.power_mw, c.temperature_c = 5000, 37, 123_456, 61
    s = node.scrape()
    for fam in ("stowage_gpu_utilization_ratio", "stowage_gpu_memory_used_bytes", "stowage_gpu_memory_total_bytes",
                "stowage_gpu_power_watts", "stowage_gpu_temperature_celsius", "stowage_gpu_healthy"):
        assert s.families[fam].type == "gauge"
        assert {x.labels["gpu"] for x in s.samples(fam)} == {U0, U1, U2, U3}
        assert all(set(x.labels) == {"node", "gpu", "model"} and x.labels["node"] == NODE for x in s.samples(fam))
    lab = dict(gpu=U2, model=A10, node=NODE)
    assert s.value("stowage_gpu_utilization_ratio", **lab) == pytest.approx(0.37)
    assert s.value("stowage_gpu_memory_used_bytes", **lab) == 5000 * MiB
    assert s.value("stowage_gpu_memory_total_bytes", **lab) == 23028 * MiB
    assert s.value("stowage_gpu_power_watts", **lab) == pytest.approx(123.456)
    assert s.value("stowage_gpu_temperature_celsius", **lab) == 61
    assert s.value("stowage_gpu_healthy", **lab) == 1
    assert s.value("stowage_gpu_memory_total_bytes", gpu=U3, model=T4) == 15360 * MiB
    assert s.up("nvml") == 1 and s.up("podresources") == 1
    # nobody holds a card: no per-pod series, and no stale sources reported
    assert s.samples("stowage_pod_gpu_utilization_ratio") == [] and s.up("checkpoint") is None


def test_health_follows_probes_and_xid_events(node: GpuNode):
    node.nvml.card(U1).retired_pages_pending = True
    s = node.scrape()
    assert s.value("stowage_gpu_healthy", gpu=U1) == 0 and s.value("stowage_gpu_healthy", gpu=U0) == 1
    node.nvml.xid(U0, 79)  # fallen off the bus: a critical XID, seen by the exporter's event thread
    for _ in range(200):
        if node.scrape().value("stowage_gpu_healthy", gpu=U0) == 0:
            break
        node.exporter.snapshotter.nvml._stop.wait(0.05)
    s = node.scrape()
    assert s.value("stowage_gpu_healthy", gpu=U0) == 0
    assert s.value("stowage_gpu_healthy", gpu=U2) == 1


def test_a_card_that_vanishes_mid_scrape_is_skipped_and_comes_back(node: GpuNode, monkeypatch, caplog):
    real_power = pynvml.nvmlDeviceGetPowerUsage

    def power(h):  # the card falls off the bus after its name and memory were read
        if h.uuid == U1 and not node.nvml.card(U1).lost:
            node.nvml.lose(U1)
        return real_power(h)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", power)
    with caplog.at_level(logging.WARNING, logger="stowage.exporter.nvml"):
        s = node.scrape()
    assert {x.labels["gpu"] for x in s.samples("stowage_gpu_memory_total_bytes")} == {U0, U2, U3}
    assert s.samples("stowage_gpu_healthy", gpu=U1) == []
    assert any(U1 in r.getMessage() and "vanished" in r.getMessage() for r in caplog.records)
    s = node.scrape()  # still lost (now before its UUID is even read): still skipped, logged once
    assert {x.labels["gpu"] for x in s.samples("stowage_gpu_memory_total_bytes")} == {U0, U2, U3}
    node.nvml.restore(U1)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", real_power)
    s = node.scrape()
    assert {x.labels["gpu"] for x in s.samples("stowage_gpu_memory_total_bytes")} == {U0, U1, U2, U3}
    assert s.up("nvml") == 1


# ------------------------------------------------------------------------------- whole cards


def test_whole_cards_go_to_their_single_container(node: GpuNode):
    node.kubelet.add("ml", "train-0", UID_A, {"trainer": {GPU: [card_key(U0), card_key(U1)]}, "sidecar": {}})
    node.kubelet.add("web", "infer-0", UID_B, {"server": {MEM: units(U2, 0, 22)}})  # all of the A10's units
    for u, used, util in ((U0, 70000, 91), (U1, 65000, 88), (U2, 9000, 40)):
        c = node.nvml.card(u)
        c.used_mib, c.gpu_util = used, util
    s = node.scrape()
    assert s.value("stowage_pod_gpu_utilization_ratio", **pod_labels(U0, A100, "train-0", "ml", "trainer")) == \
        pytest.approx(0.91)
    assert s.value("stowage_pod_gpu_memory_used_bytes", **pod_labels(U0, A100, "train-0", "ml", "trainer")) == \
        70000 * MiB
    assert s.value("stowage_pod_gpu_utilization_ratio", **pod_labels(U1, A100, "train-0", "ml", "trainer")) == \
        pytest.approx(0.88)
    assert s.value("stowage_pod_gpu_memory_used_bytes", **pod_labels(U2, A10, "infer-0", "web", "server")) == 9000 * MiB
    # one series per (container, card); containers without devices and unheld cards have none
    assert len(s.samples("stowage_pod_gpu_utilization_ratio")) == 3
    assert s.samples("stowage_pod_gpu_memory_used_bytes", container="sidecar") == []
    assert s.samples("stowage_pod_gpu_memory_used_bytes", gpu=U3) == []
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 0
    assert s.up("checkpoint") is None  # not needed: no shared card


def test_nvidia_plugin_plain_uuids_and_time_slicing_ids_are_attributed(node: GpuNode):
    node.kubelet.add("ml", "job-4gpu", UID_A, {"worker": {GPU: [U0, U1, U2, U3]}})  # NVIDIA's device plugin
    for c in node.nvml.cards:
        c.used_mib, c.gpu_util = 1000, 10
    s = node.scrape()
    assert {x.labels["gpu"] for x in s.samples("stowage_pod_gpu_utilization_ratio", pod="job-4gpu")} == {U0, U1, U2, U3}
    assert s.value("stowage_pod_gpu_memory_used_bytes", gpu=U3, pod="job-4gpu", container="worker") == 1000 * MiB


def test_long_uuids_use_the_hashed_key_for_ours_and_the_plain_uuid_for_nvidias(monkeypatch, tmp_path):
    long_a = "GPU-" + "a" * 8 + "-ffff-ffff-ffff-" + "1" * 12 + "-extended-identifier-xyz"
    long_b = long_a[:-1] + "w"
    assert card_key(long_a) != long_a and card_key(long_a).startswith("gpu-")
    cards = [FakeCard(long_a, "NVIDIA H100 80GB HBM3", 81559, 0, "00000000:1A:00.0", used_mib=3000, gpu_util=25),
             FakeCard(long_b, "NVIDIA H100 80GB HBM3", 81559, 1, "00000000:1B:00.0", used_mib=4000, gpu_util=50)]
    for node in make_node(monkeypatch, tmp_path, cards=cards):
        node.kubelet.add("a", "ours", UID_A, {"c": {MEM: [f"{card_key(long_a)}::{n}" for n in range(10)]}})
        node.kubelet.add("b", "theirs", UID_B, {"c": {"nvidia.com/gpu": [long_b]}})
        node.kubelet.add("c", "unknown", UID_C, {"c": {"nvidia.com/gpu": ["GPU-not-on-this-node", "MIG-xyz"]}})
        s = node.scrape()
        assert s.value("stowage_pod_gpu_memory_used_bytes", pod="ours", gpu=long_a) == 3000 * MiB
        assert s.value("stowage_pod_gpu_utilization_ratio", pod="theirs", gpu=long_b) == pytest.approx(0.5)
        assert s.samples("stowage_pod_gpu_utilization_ratio", pod="unknown") == []


# ------------------------------------------------------------------------------ shared cards


def shared_a100(node: GpuNode) -> None:
    """serve-a (20 GiB units, 30% core) and serve-b (40 GiB units, 50% core) share card U0; a host
    process (e.g. nvidia-persistenced) and a pod without GPU devices also run on it."""
    node.kubelet.add("ml", "serve-a", UID_A, {"model": {MEM: units(U0, 0, 20), CORE: units(U0, 0, 30)}})
    node.kubelet.add("ml", "serve-b", UID_B, {"model": {MEM: units(U0, 20, 60), CORE: units(U0, 30, 80)}})
    node.kubelet.add("tools", "debug", UID_C, {"shell": {}})
    node.pod_process(U0, 1101, 10240, UID_A)
    node.process(U0, 2202, 30000, cgroup_v1_cgroupfs(UID_B, "b" * 64))   # cgroup v1 layout
    node.pod_process(U0, 2203, 2000, UID_B)                               # a second process of serve-b
    node.process(U0, 3303, 500, "0::/system.slice/nvidia-persistenced.service\n")
    node.pod_process(U0, 4404, 700, UID_C)                                # a pod holding no device
    card = node.nvml.card(U0)
    card.gpu_util = 95
    for pid, sm in ((1101, 20), (1101, 40), (2202, 50), (2203, 5), (3303, 1), (4404, 3)):
        node.nvml.add_sample(U0, pid, sm)


def test_shared_card_is_split_by_process_accounting(node: GpuNode):
    shared_a100(node)
    node.kubelet.write_checkpoint()
    s = node.scrape()
    a = pod_labels(U0, A100, "serve-a", "ml", "model")
    b = pod_labels(U0, A100, "serve-b", "ml", "model")
    assert s.value("stowage_pod_gpu_memory_used_bytes", **a) == 10240 * MiB
    assert s.value("stowage_pod_gpu_memory_used_bytes", **b) == 32000 * MiB
    assert s.value("stowage_pod_gpu_utilization_ratio", **a) == pytest.approx(0.30)   # mean of its samples
    assert s.value("stowage_pod_gpu_utilization_ratio", **b) == pytest.approx(0.55)
    assert s.samples("stowage_pod_gpu_memory_used_bytes", pod="debug") == []
    assert s.value("stowage_gpu_memory_used_bytes", gpu=U0) == (10240 + 32000 + 500 + 700) * MiB
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 0
    assert s.up("checkpoint") == 1 and s.up("proc") == 1
    # the next snapshot reads only samples NVML took since: serve-a idle, serve-b busier
    node.nvml.add_sample(U0, 2202, 80)
    s = node.scrape()
    assert s.value("stowage_pod_gpu_utilization_ratio", **a) == 0
    assert s.value("stowage_pod_gpu_utilization_ratio", **b) == pytest.approx(0.80)
    assert s.value("stowage_pod_gpu_memory_used_bytes", **a) == 10240 * MiB


def test_per_process_utilisation_survives_the_clock_stepped_back(node: GpuNode, monkeypatch):
    """NVML stamps its samples with the host's wall clock and answers only those newer than the
    newest seen. After the clock is stepped back (NTP correcting a clock that ran a day ahead), the
    new samples are older than that: asking with the old timestamp got none, and every pod on a
    shared card read 0 % busy until the clock caught up a day later."""
    second, day = 10**6, 86_400 * 10**6
    wall = [int(time.time() * 1e6) + day]                        # the host's clock runs a day ahead
    monkeypatch.setattr(nvmlreader, "_wall_clock_us", lambda: wall[0])
    node.nvml.set_clock_us(wall[0] - 5 * second)
    shared_a100(node)
    node.kubelet.write_checkpoint()
    b = pod_labels(U0, A100, "serve-b", "ml", "model")
    assert node.scrape().value("stowage_pod_gpu_utilization_ratio", **b) == pytest.approx(0.55)
    wall[0] -= day                                               # ... and is stepped back
    node.nvml.set_clock_us(wall[0] - 2 * second)
    node.nvml.add_sample(U0, 2202, 80)                           # a sample taken since
    assert node.scrape().value("stowage_pod_gpu_utilization_ratio", **b) == pytest.approx(0.80)
    wall[0] += 10 * second
    node.nvml.add_sample(U0, 2202, 10)
    assert node.scrape().value("stowage_pod_gpu_utilization_ratio", **b) == pytest.approx(0.10)


def test_pod_log_directories_alone_name_the_pods(node: GpuNode):
    shared_a100(node)
    node.write_pod_logs()    # /var/log/pods mounted, no checkpoint
    s = node.scrape()
    assert s.up("podlogs") == 1 and s.up("checkpoint") is None   # not mounted: not a missing source
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="serve-a") == 10240 * MiB
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="serve-b") == 32000 * MiB
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="serve-b") == pytest.approx(0.55)
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 0


def test_legacy_checkpoint_format_and_stale_entries(node: GpuNode):
    shared_a100(node)
    # a deleted pod's leftover entry claims serve-a's devices under another UID: serve-a's UID is
    # then ambiguous and its process unattributed, never given to the wrong pod
    stale = {"PodUID": "dead0000-0000-0000-0000-000000000000", "ContainerName": "model", "ResourceName": MEM,
             "DeviceIDs": units(U0, 0, 20)}
    node.kubelet.write_checkpoint(legacy_list=True, extra=[stale])
    s = node.scrape()
    b = pod_labels(U0, A100, "serve-b", "ml", "model")
    assert s.value("stowage_pod_gpu_memory_used_bytes", **b) == 32000 * MiB
    # serve-a's own process is unknown -> it goes to the holder with nothing measured: serve-a
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="serve-a") == 10240 * MiB
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 1
    # with the pod log directories as well, serve-a's UID is named directly: measured again
    node.write_pod_logs()
    s = node.scrape()
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="serve-a") == 10240 * MiB
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 0


def test_without_uid_sources_shares_are_estimated_by_units_held(node: GpuNode, caplog):
    shared_a100(node)  # neither checkpoint nor pod log directories
    with caplog.at_level(logging.WARNING, logger="stowage.exporter"):
        s = node.scrape()
    assert s.up("checkpoint") == 0 and s.up("podlogs") == 0
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 1
    assert any("split by units held" in r.getMessage() for r in caplog.records)
    pod_mem = (10240 + 30000 + 2000 + 700) * MiB      # the host process is nobody's; the pods' are unknown
    pod_util = (0.30 + 0.50 + 0.05 + 0.03)
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="serve-a") == pytest.approx(pod_mem * 20 / 60, abs=1)
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="serve-b") == pytest.approx(pod_mem * 40 / 60, abs=1)
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="serve-a") == pytest.approx(pod_util * 30 / 80)
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="serve-b") == pytest.approx(pod_util * 50 / 80)


def test_without_host_pids_shares_are_estimated_and_proc_is_reported_missing(node: GpuNode, caplog):
    node.kubelet.add("ml", "serve-a", UID_A, {"model": {MEM: units(U0, 0, 10)}})
    node.kubelet.add("ml", "serve-b", UID_B, {"model": {MEM: units(U0, 10, 40)}})
    node.kubelet.write_checkpoint()
    node.process(U0, 501, 4000, None)   # no /proc/<pid>: the exporter is not in the host PID namespace
    node.process(U0, 502, 8000, None)
    with caplog.at_level(logging.WARNING, logger="stowage.exporter"):
        s = node.scrape()
        node.scrape()
    assert s.up("proc") == 0 and s.up("checkpoint") == 1
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="serve-a") == 3000 * MiB
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="serve-b") == 9000 * MiB
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 1
    assert len([r for r in caplog.records if "hostPID" in r.getMessage()]) == 1  # said once, not per scrape


def test_idle_holders_of_a_shared_card_report_zero(node: GpuNode):
    node.kubelet.add("ml", "busy", UID_A, {"c": {MEM: units(U2, 0, 8)}})
    node.kubelet.add("ml", "idle", UID_B, {"c": {MEM: units(U2, 8, 16)}})
    node.kubelet.write_checkpoint()
    node.pod_process(U2, 700, 6000, UID_A)
    node.nvml.add_sample(U2, 700, 64)
    s = node.scrape()
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="idle") == 0
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="idle") == 0
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="busy") == pytest.approx(0.64)


def test_no_per_process_utilisation_splits_card_utilisation_like_memory(node: GpuNode):
    shared_a100(node)
    node.kubelet.write_checkpoint()
    node.nvml.card(U0).process_util_supported = False
    s = node.scrape()
    a_mem, b_mem = 10240, 32000
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="serve-a") == pytest.approx(0.95 * a_mem / (a_mem + b_mem))
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="serve-b") == pytest.approx(0.95 * b_mem / (a_mem + b_mem))
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="serve-a") == a_mem * MiB
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 1


def test_two_containers_of_one_pod_on_one_card_split_its_share_by_units(node: GpuNode):
    node.kubelet.add("ml", "duo", UID_A, {"big": {MEM: units(U1, 0, 30)}, "small": {MEM: units(U1, 30, 40)}})
    node.kubelet.add("ml", "other", UID_B, {"c": {MEM: units(U1, 40, 80)}})
    node.kubelet.write_checkpoint()
    node.pod_process(U1, 801, 8000, UID_A, "1" * 64)
    node.pod_process(U1, 802, 12000, UID_B)
    s = node.scrape()
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="duo", container="big") == 6000 * MiB
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="duo", container="small") == 2000 * MiB
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="other") == 12000 * MiB
    assert s.value("stowage_gpu_attribution_estimated", gpu=U1) == 1


# ----------------------------------------------------------------------- missing sources


def test_no_gpu_serves_what_it_can(monkeypatch, tmp_path):
    for node in make_node(monkeypatch, tmp_path, driver_loaded=False):
        node.kubelet.add("ml", "p", UID_A, {"c": {GPU: [U0]}})
        s = node.scrape()
        assert s.up("nvml") == 0 and s.up("podresources") == 1
        assert s.samples("stowage_gpu_memory_total_bytes") == [] and s.samples("stowage_pod_gpu_utilization_ratio") == []
        node.nvml.driver_loaded = True  # the driver arrives later (GPU operator): picked up without a restart
        s = node.scrape()
        assert s.up("nvml") == 1 and len(s.samples("stowage_gpu_healthy")) == 4
        assert len(s.samples("stowage_pod_gpu_memory_used_bytes", pod="p")) == 1


def test_no_kubelet_socket_serves_cards_and_recovers_when_it_appears(monkeypatch, tmp_path, caplog):
    for node in make_node(monkeypatch, tmp_path, kubelet=False):
        node.kubelet.add("ml", "p", UID_A, {"c": {GPU: [U0]}})
        with caplog.at_level(logging.WARNING, logger="stowage.exporter"):
            s = node.scrape()
            node.scrape()
        assert s.up("podresources") == 0 and s.up("nvml") == 1
        assert len(s.samples("stowage_gpu_healthy")) == 4 and s.samples("stowage_pod_gpu_utilization_ratio") == []
        assert len([r for r in caplog.records if "PodResources socket" in r.getMessage()]) == 1
        node.kubelet.start()
        s = node.scrape()
        assert s.up("podresources") == 1 and len(s.samples("stowage_pod_gpu_utilization_ratio", pod="p")) == 1


def test_kubelet_errors_are_reported_not_raised(node: GpuNode):
    import grpc
    node.kubelet.fail = grpc.StatusCode.UNAVAILABLE
    s = node.scrape()
    assert s.up("podresources") == 0 and len(s.samples("stowage_gpu_healthy")) == 4


# ---------------------------------------------------------------------------------- cost


def test_scrapes_within_the_cache_window_read_sources_once(monkeypatch, tmp_path):
    for node in make_node(monkeypatch, tmp_path, cache_s=3600):
        calls = {"n": 0}
        real = pynvml.nvmlDeviceGetUtilizationRates

        def counting(h):
            calls["n"] += 1
            return real(h)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", counting)
        first = node.scrape()
        second = node.scrape()
        assert calls["n"] == 4 and node.kubelet.list_calls == 1
        assert first.samples("stowage_gpu_healthy") == second.samples("stowage_gpu_healthy")


def test_process_memory_nvml_cannot_give_is_estimated_by_units_not_read_as_zero(node: GpuNode):
    """NVML may list a card's processes without their memory (NVML_VALUE_NOT_AVAILABLE: pynvml's
    ``usedGpuMemory`` is None; seen in some containers and under WDDM). Read as 0, as before,
    every holder of a shared card reported 0 bytes while the card held 42 GiB: the false zeros an
    HPA scales down on. The card's used memory is then divided by the units each pod holds, as
    when the processes cannot be listed at all, and the split says it is estimated; per-process
    utilisation, which NVML did give, still decides the utilisation."""
    shared_a100(node)
    node.kubelet.write_checkpoint()
    card = node.nvml.card(U0)
    card.processes = [(pid, None) for pid, _ in card.processes]
    s = node.scrape()
    used = s.value("stowage_gpu_memory_used_bytes", gpu=U0)
    assert used == (10240 + 32000 + 500 + 700) * MiB
    # serve-a holds 20 GiB units, serve-b 40
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="serve-a") == pytest.approx(used * 20 / 60, abs=1)
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="serve-b") == pytest.approx(used * 40 / 60, abs=1)
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="serve-a") == pytest.approx(0.30)
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="serve-b") == pytest.approx(0.55)
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 1
