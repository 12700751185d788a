"""The exporter against odd and hostile answers from its peers: what the kubelet's PodResources API
lists (names, device IDs, many pods, a socket that hangs or goes away), what NVML reports (odd
names, absurd numbers, processes of no pod), what /proc and the kubelet's checkpoint hold. None may
crash a scrape, hang it, grow without bound, or spoil the series of the other pods and cards.
Fake NVML (pynvml functions) and a fake kubelet over real gRPC; scrapes parsed as Prometheus text."""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import pytest
import requests

from exporter_harness import GpuNode, MiB, Scrape, make_node
from fakenvml import default_cards
from fakepodresources import cgroup_v2_systemd
from gpunode.devices import card_key

U0, U1, U2, U3 = (c.uuid for c in default_cards())
MEM, GPU = "nvidia.com/gpu-memory", "nvidia.com/gpu"


def uid(n: int) -> str:
    return f"0f6c3b1e-8d2a-4c5e-9b7f-{n:012x}"


def units(uuid: str, lo: int, hi: int) -> list[str]:
    return [f"{card_key(uuid)}::{n}" for n in range(lo, hi)]


@pytest.fixture
def node(monkeypatch, tmp_path):
    yield from make_node(monkeypatch, tmp_path)


def _pods(s: Scrape, fam: str = "stowage_pod_gpu_memory_used_bytes") -> set[tuple[str, str, str, str]]:
    return {(x.labels["namespace"], x.labels["pod"], x.labels["container"], x.labels["gpu"]) for x in s.samples(fam)}


# ------------------------------------------------------------------------- names as label values

ODD_NAMES = ['quo"te', "back\\slash", "new\nline", "tab\tcr\rnul\x00bell\x07", "trailing\\", 'x"}\n# TYPE evil gauge',
             "ünïcödé-名前", "\u2028sep\x85"]


def test_odd_characters_in_names_are_escaped_and_read_back_exactly(node: GpuNode):
    """The kubelet's names become label values as they are: the exposition stays valid text format
    and every value reads back exactly, whatever characters it has."""
    for i, name in enumerate(ODD_NAMES):
        node.kubelet.add(name, name, uid(i), {name: {MEM: units(U0, 10 * i, 10 * i + 10)}})
    node.kubelet.add("ml", "plain", uid(99), {"c": {GPU: [U1]}})
    s = node.scrape()      # Scrape parses the text with prometheus_client's own parser
    assert _pods(s) == {(n, n, n, U0) for n in ODD_NAMES} | {("ml", "plain", "c", U1)}
    assert "evil" not in s.families
    assert s.value("stowage_gpu_attribution_estimated", gpu=U0) == 0   # no process on the card: all idle


def test_names_no_kubernetes_object_can_have_are_left_out_alone(node: GpuNode, caplog):
    """A name longer than any Kubernetes name (253) or empty would be served as a label value as it
    is: a megabyte-long pod name made every scrape megabytes long (and Prometheus' label length
    limit, if set, fails the whole scrape). Such rows are skipped and logged; the others are served."""
    huge = "p" * 200_000
    node.kubelet.add("ml", huge, uid(1), {"c": {MEM: units(U0, 0, 10)}})
    node.kubelet.add("n" * 300, "p", uid(2), {"c": {MEM: units(U0, 10, 20)}})
    node.kubelet.add("ml", "q", uid(3), {"c" * 300: {MEM: units(U0, 20, 30)}})
    node.kubelet.add("", "p", uid(4), {"c": {MEM: units(U0, 30, 40)}})
    node.kubelet.add("ml", "", uid(5), {"c": {MEM: units(U0, 40, 50)}})
    longest = "l" * 253                      # the longest pod name Kubernetes allows is served
    node.kubelet.add("ml", longest, uid(6), {"c": {MEM: units(U0, 50, 60)}})
    node.kubelet.add("ml", "fine", uid(7), {"c": {GPU: [U1]}})
    with caplog.at_level(logging.WARNING, logger="stowage.exporter"):
        s = node.scrape()
        again = node.scrape()
    assert _pods(s) == _pods(again) == {("ml", longest, "c", U0), ("ml", "fine", "c", U1)}
    assert len(s.text) < 20_000
    said = [r.getMessage() for r in caplog.records if "no Kubernetes object" in r.getMessage()]
    assert len(said) == 1 and len(said[0]) < 2000, said     # once, and short


# ------------------------------------------------------------------- what PodResources lists


def test_device_ids_listed_twice_count_once(node: GpuNode):
    """The kubelet lists a device once per NUMA node it reports: a container holding one unit on a
    card spanning two nodes is listed twice for it. It still holds one unit."""
    node.kubelet.add("ns", "a", uid(1), {"c": {MEM: units(U2, 0, 4) + units(U2, 0, 4)}})
    node.kubelet.add("ns", "b", uid(2), {"c": {MEM: units(U2, 4, 16)}})
    node.process(U2, 101, 8000, None)        # no /proc entry: its pod cannot be told, split by units
    s = node.scrape()
    assert s.value("stowage_gpu_attribution_estimated", gpu=U2) == 1
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="a") == pytest.approx(8000 * MiB * 4 / 16, abs=1)
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="b") == pytest.approx(8000 * MiB * 12 / 16, abs=1)


def test_a_device_two_pods_claim_and_devices_of_no_card_here_spoil_nothing(node: GpuNode):
    node.kubelet.add("ns", "a", uid(1), {"c": {GPU: [U0], "example.com/nic": ["eth7", U0 + "::x"]}})
    node.kubelet.add("ns", "b", uid(2), {"c": {GPU: [U0]}})          # the same card, listed for two pods
    node.kubelet.add("ns", "c", uid(3), {"c": {GPU: ["GPU-elsewhere", "", "::", "MIG-1/2/3"],
                                              "vendor.example/thing": ["x" * 60]}})
    node.kubelet.add("ns", "d", uid(4), {"c": {GPU: [U1]}})
    node.write_pod_logs()
    node.pod_process(U0, 501, 3000, uid(1))
    node.pod_process(U1, 502, 4000, uid(4))
    s = node.scrape()
    assert _pods(s) == {("ns", "a", "c", U0), ("ns", "b", "c", U0), ("ns", "d", "c", U1)}
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="a") == 3000 * MiB
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="b") == 0
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="d") == 4000 * MiB


def test_many_pods_give_one_series_per_container_and_card_and_none_for_other_devices(node: GpuNode):
    """Series are bounded by the devices of this node's cards: a container needs one of a card's
    devices to get a series for it; thousands of containers holding other devices add none."""
    for i in range(80):
        node.kubelet.add("ns", f"slice-{i}", uid(i), {"c": {MEM: units(U0, i, i + 1)}})
    for i in range(80, 2080):
        node.kubelet.add("ns", f"other-{i}", uid(i), {f"c{j}": {"example.com/fpga": [f"fpga-{i}-{j}"]}
                                                      for j in range(3)})
    s = node.scrape()
    assert len(s.samples("stowage_pod_gpu_memory_used_bytes")) == 80
    assert len(s.samples("stowage_pod_gpu_utilization_ratio")) == 80
    assert s.up("podresources") == 1


def test_series_of_deleted_pods_go_over_many_pod_lifetimes(node: GpuNode):
    """Pods come and go: the series are those of the pods listed now, never an accumulation."""
    node.kubelet.add("ns", "stays", uid(0), {"c": {GPU: [U3]}})
    for life in range(40):
        node.kubelet.add("ns", f"job-{life}", uid(life + 1), {"c": {MEM: units(U0, 0, 10)}})
        node.kubelet.add("ns", f"peer-{life}", uid(life + 1001), {"c": {MEM: units(U0, 10, 20)}})
        node.write_pod_logs()
        node.pod_process(U0, 1000 + life, 100, uid(life + 1))
        s = node.scrape()
        assert _pods(s) == {("ns", "stays", "c", U3), ("ns", f"job-{life}", "c", U0), ("ns", f"peer-{life}", "c", U0)}
        assert s.value("stowage_pod_gpu_memory_used_bytes", pod=f"job-{life}") == 100 * MiB
        del node.kubelet.pods[1:]
        node.nvml.card(U0).processes.clear()
    s = node.scrape()
    assert _pods(s) == {("ns", "stays", "c", U3)}
    assert s.samples("stowage_gpu_attribution_estimated", gpu=U0) == []


def test_a_kubelet_that_hangs_costs_its_timeout_not_the_scrape(monkeypatch, tmp_path):
    """List is given the exporter's kubelet timeout (5 s; 0.5 s here): a kubelet that never answers
    leaves the per-pod series out of that reading, and the card series are served."""
    for node in make_node(monkeypatch, tmp_path, exporter_config=dict(kubelet_timeout_s=0.5)):
        node.kubelet.add("ns", "p", uid(1), {"c": {GPU: [U0]}})
        assert _pods(node.scrape()) == {("ns", "p", "c", U0)}
        node.kubelet.hold = threading.Event()
        s = node.scrape()                     # the harness' HTTP timeout (30 s) fails a hung scrape
        assert node.kubelet.held.is_set()
        assert s.up("podresources") == 0 and s.samples("stowage_pod_gpu_memory_used_bytes") == []
        assert len(s.samples("stowage_gpu_memory_total_bytes")) == 4
        node.kubelet.hold.set()
        node.kubelet.hold = None
        assert _pods(node.scrape()) == {("ns", "p", "c", U0)}


def test_a_socket_that_accepts_and_never_speaks_is_a_timeout(monkeypatch, tmp_path):
    """Something listening on the socket that never speaks gRPC: the same deadline ends the wait."""
    for node in make_node(monkeypatch, tmp_path, kubelet=False, exporter_config=dict(kubelet_timeout_s=0.5)):
        mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        mute.bind(node.kubelet.sock)
        mute.listen(16)
        accepted: list[socket.socket] = []
        stop = threading.Event()

        def accept() -> None:
            mute.settimeout(0.1)
            while not stop.is_set():
                try:
                    accepted.append(mute.accept()[0])
                except OSError:
                    pass
        t = threading.Thread(target=accept, daemon=True)
        t.start()
        try:
            s = node.scrape()
            assert s.up("podresources") == 0 and len(s.samples("stowage_gpu_healthy")) == 4
            assert accepted                   # it did connect: the deadline, not a refusal, ended it
        finally:
            stop.set()
            t.join(5)
            for c in accepted:
                c.close()
            mute.close()


def test_a_kubelet_restart_drops_pod_series_while_down_and_they_come_back(node: GpuNode):
    node.kubelet.add("ns", "p", uid(1), {"c": {GPU: [U0]}})
    assert _pods(node.scrape()) == {("ns", "p", "c", U0)}
    node.kubelet.stop()                       # the kubelet goes down ...
    if os.path.exists(node.kubelet.sock):
        os.unlink(node.kubelet.sock)          # ... and its socket with it
    s = node.scrape()
    assert s.up("podresources") == 0 and _pods(s) == set() and len(s.samples("stowage_gpu_healthy")) == 4
    node.kubelet.add("ns", "q", uid(2), {"c": {GPU: [U1]}})
    node.kubelet.start()                      # a new socket at the same path
    s = node.scrape()
    assert s.up("podresources") == 1 and _pods(s) == {("ns", "p", "c", U0), ("ns", "q", "c", U1)}


# ---------------------------------------------------------------------------------- NVML answers


def test_a_card_whose_name_is_not_utf8_spoils_no_other_card(monkeypatch, tmp_path, caplog):
    """pynvml decodes NVML's strings strictly; a card answering bytes that are not UTF-8 makes that
    read fail with UnicodeDecodeError. That card cannot be read; the others are served."""
    cards = default_cards()
    for node in make_node(monkeypatch, tmp_path, cards=cards):
        node.kubelet.add("ns", "p", uid(1), {"c": {GPU: [U0]}})
        assert len(node.scrape().samples("stowage_gpu_healthy")) == 4
        cards[1].name = b"NVIDIA \xff\xfe broken"
        with caplog.at_level(logging.WARNING, logger="stowage.exporter.nvml"):
            s = node.scrape()
            node.scrape()
        assert s.up("nvml") == 1
        assert {x.labels["gpu"] for x in s.samples("stowage_gpu_memory_total_bytes")} == {U0, U2, U3}
        assert s.value("stowage_gpu_healthy", gpu=U1) == 0          # read before: unreachable now
        assert _pods(s) == {("ns", "p", "c", U0)}
        assert len([r for r in caplog.records if U1 in r.getMessage() and "cannot be read" in r.getMessage()]) == 1


def test_a_card_unreadable_from_the_start_for_its_odd_answers_has_no_series_and_spoils_none(monkeypatch, tmp_path):
    cards = default_cards()
    cards[2].name = b"\xc3\x28"
    cards[3].uuid = "GPU-not-utf8"
    for node in make_node(monkeypatch, tmp_path, cards=cards):
        real = node.nvml.nvmlDeviceGetUUID
        monkeypatch.setattr("pynvml.nvmlDeviceGetUUID",
                            lambda h: b"GPU-\xff" if real(h) == "GPU-not-utf8" else real(h))
        node.kubelet.add("ns", "p", uid(1), {"c": {GPU: [U0]}})
        s = node.scrape()
        assert s.up("nvml") == 1 and _pods(s) == {("ns", "p", "c", U0)}
        assert {x.labels["gpu"] for x in s.samples("stowage_gpu_healthy")} == {U0, U1}


def test_absurd_nvml_numbers_stay_in_range_and_alone(node: GpuNode):
    """Utilisation NVML reports beyond 0..100 % is clamped; memory used above the total is served as
    NVML says it (it is NVML's reading, not ours to correct); nothing else is touched."""
    a, b = node.nvml.card(U0), node.nvml.card(U2)
    a.gpu_util, a.used_mib = 250, a.memory_mib * 2
    b.gpu_util = -7
    node.kubelet.add("ns", "one", uid(1), {"c": {GPU: [U0]}})
    node.kubelet.add("ns", "x", uid(2), {"c": {MEM: units(U1, 0, 10)}})
    node.kubelet.add("ns", "y", uid(3), {"c": {MEM: units(U1, 10, 20)}})
    node.kubelet.write_checkpoint()
    node.pod_process(U1, 701, 1000, uid(2))
    node.pod_process(U1, 702, 2000, uid(3))
    node.nvml.add_sample(U1, 701, 4000)
    node.nvml.add_sample(U1, 702, -50)
    s = node.scrape()
    assert s.value("stowage_gpu_utilization_ratio", gpu=U0) == 1.0
    assert s.value("stowage_gpu_utilization_ratio", gpu=U2) == 0.0
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="one") == 1.0
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="one") == a.memory_mib * 2 * MiB
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="x") == 1.0
    assert s.value("stowage_pod_gpu_utilization_ratio", pod="y") == 0.0
    assert s.value("stowage_gpu_memory_total_bytes", gpu=U3) == 15360 * MiB


def test_processes_of_no_pod_and_odd_pids_and_cgroup_files(node: GpuNode):
    """Processes on a shared card whose /proc entry is odd: a directory where the cgroup file should
    be, a cgroup file of binary junk, one larger than any real one with a pod line only beyond what is
    read, PID 0 and negative PIDs. None crashes the scrape; the holders' own processes are measured."""
    node.kubelet.add("ns", "a", uid(1), {"c": {MEM: units(U0, 0, 10)}})
    node.kubelet.add("ns", "b", uid(2), {"c": {MEM: units(U0, 10, 30)}})
    node.write_pod_logs()
    node.pod_process(U0, 11, 1000, uid(1))
    node.pod_process(U0, 12, 2000, uid(2))
    os.makedirs(os.path.join(node.proc, "13", "cgroup"))                       # a directory
    node.process(U0, 13, 300, None)
    node.process(U0, 14, 400, "\x00\xff" * 1000)                               # junk, not a pod
    node.process(U0, 15, 500, "0::/x\n" * 20_000 + cgroup_v2_systemd(uid(1), "f" * 64))  # pod line past 64 KiB
    node.process(U0, 0, 600, None)
    node.process(U0, -1, 700, None)
    s = node.scrape()
    assert s.up("proc") == 0                  # 13, 0 and -1 cannot be read
    # the unreadable ones would go to holders with nothing measured (none here); junk is nobody's
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="a") == 1000 * MiB
    assert s.value("stowage_pod_gpu_memory_used_bytes", pod="b") == 2000 * MiB


# ------------------------------------------------------------------------------ the checkpoint


def test_a_checkpoint_larger_than_the_exporter_can_parse_is_refused(node: GpuNode, caplog):
    """A checkpoint over the bound (what it costs to parse: below) is refused with its reason, and
    shared cards are then estimated as without it; it is never read whole."""
    from exporter import checkpoint as ckpt
    node.kubelet.add("ns", "a", uid(1), {"c": {MEM: units(U0, 0, 10)}})
    node.kubelet.add("ns", "b", uid(2), {"c": {MEM: units(U0, 10, 30)}})
    path = node.kubelet.write_checkpoint()
    with open(path) as f:
        doc = f.read()
    with open(path, "w") as f:                # valid JSON, padded past the bound with whitespace
        f.write(doc + " " * (ckpt.MAX_BYTES + 1 - len(doc)))
    node.pod_process(U0, 11, 1000, uid(1))
    with caplog.at_level(logging.WARNING, logger="stowage.exporter"):
        s = node.scrape()
    assert s.up("checkpoint") == 0 and s.value("stowage_gpu_attribution_estimated", gpu=U0) == 1
    assert any("larger than" in r.getMessage() for r in caplog.records)
    assert len(s.samples("stowage_pod_gpu_memory_used_bytes")) == 2


def test_the_checkpoint_bound_fits_the_exporters_memory_limit(tmp_path):
    """What reading and joining a checkpoint costs per byte of it, measured on the largest kind the
    kubelet writes (every device registered and allocated, PodResources listing the same), must fit
    the DaemonSet's memory limit at the bound, with room for the rest of the exporter (~60 MiB)."""
    import tracemalloc

    import yaml

    from exporter import checkpoint as ckpt
    from gpunode.podresources.client import ContainerDevices
    from shared_paths import ROOT
    ids = units(U0, 0, 20_000)
    per_pod = {uid(k): ids[k::200] for k in range(200)}
    entries = [{"PodUID": u, "ContainerName": "c", "ResourceName": MEM, "DeviceIDs": {"0": held},
                "AllocResp": "Cg4KBEZPTxIGYmFy" * 8} for u, held in per_pod.items()]
    path = tmp_path / "checkpoint"
    path.write_text(json.dumps({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {MEM: ids}},
                                "Checksum": 1}))
    live = [ContainerDevices("ns", u, "c", MEM, tuple(held)) for u, held in per_pod.items()]
    tracemalloc.start()
    try:
        assert len(ckpt.join(live, ckpt.read(str(path))).pods) == 200
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    per_byte = peak / path.stat().st_size
    manifest = (ROOT / "scheduler-config" / "exporter.yaml").read_text()
    ds = next(d for d in yaml.safe_load_all(manifest) if d and d.get("kind") == "DaemonSet")
    limit = ds["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    assert per_byte * ckpt.MAX_BYTES + 60 * MiB < int(limit[:-2]) * MiB, (per_byte, ckpt.MAX_BYTES, limit)


@pytest.mark.parametrize("content", [
    '{"Data": {"PodDeviceEntries": [{"PodUID": 7}, {"PodUID": "u", "DeviceIDs": {"0": "notalist", "1": [{"x": 1}]}},'
    ' {"PodUID": "v", "ContainerName": ["c"], "ResourceName": null, "DeviceIDs": 5}, "junk", null]}}',
    '{"Data": {"PodDeviceEntries": [' + '[' * 5000 + ']' * 5000 + ']}}',       # nested past Python's recursion
    '{"Data": {"PodDeviceEntries": [{"PodUID": "' + '9' * 5000 + '", "DeviceIDs": [' + '9' * 5000 + ']}]}}',
    '\ufeff{"Data": {"PodDeviceEntries": []}}',
    '{"Data": {"PodDeviceEntries": [{"PodUID": "u", "ContainerName": "c", "ResourceName": "r", "DeviceIDs": ["a\\u0000\\ud800"]}]}}',
])
def test_hostile_checkpoint_content_is_an_error_or_ignored_never_a_crash(node: GpuNode, content):
    from exporter import checkpoint as ckpt
    try:
        ckpt.parse(content.encode("utf-8", "surrogatepass"))
    except ckpt.CheckpointError:
        pass
    node.kubelet.add("ns", "a", uid(1), {"c": {MEM: units(U0, 0, 10)}})
    node.kubelet.add("ns", "b", uid(2), {"c": {MEM: units(U0, 10, 30)}})
    with open(node.kubelet.checkpoint, "wb") as f:
        f.write(content.encode("utf-8", "surrogatepass"))
    node.pod_process(U0, 11, 1000, uid(1))
    s = node.scrape()
    assert s.up("nvml") == 1 and len(s.samples("stowage_pod_gpu_memory_used_bytes")) == 2


def test_a_checkpoint_path_that_is_a_fifo_does_not_hang_the_scrape(node: GpuNode):
    """Opening a FIFO for reading waits for a writer, for ever: the scrape (and, behind the snapshot
    lock, every later one) would hang. Only regular files are read."""
    os.mkfifo(node.kubelet.checkpoint)
    node.kubelet.add("ns", "a", uid(1), {"c": {MEM: units(U0, 0, 10)}})
    node.kubelet.add("ns", "b", uid(2), {"c": {MEM: units(U0, 10, 30)}})
    node.pod_process(U0, 11, 1000, uid(1))
    try:
        s = node.scrape()
        assert s.up("checkpoint") == 0 and len(s.samples("stowage_pod_gpu_memory_used_bytes")) == 2
    finally:
        # a hung reader (the bug) is released so the test process can end
        fd = os.open(node.kubelet.checkpoint, os.O_RDWR | os.O_NONBLOCK)
        os.close(fd)


def test_unreadable_processes_are_logged_once_while_their_pids_change(node: GpuNode, caplog):
    """Without hostPID no GPU process' cgroup can be read; processes come and go, but the cause is
    one: it is logged when it starts and when it ends, not on every scrape whose PIDs differ."""
    node.kubelet.add("ns", "a", uid(1), {"c": {MEM: units(U0, 0, 10)}})
    node.kubelet.add("ns", "b", uid(2), {"c": {MEM: units(U0, 10, 30)}})
    node.kubelet.write_checkpoint()
    with caplog.at_level(logging.INFO, logger="stowage.exporter"):
        for pid in range(100, 110):
            node.nvml.card(U0).processes[:] = [(pid, 1000)]       # a new short-lived process each time
            assert node.scrape().up("proc") == 0
        node.nvml.card(U0).processes.clear()
        assert node.scrape().up("proc") == 1
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("proc:")]
    assert len(said) == 2 and "hostPID" in said[0] and "100" in said[0] and "available again" in said[1], said


class _CountingLock:
    """The collector's snapshot lock, counting the scrapes that reached it (holding or waiting)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reached = 0

    def acquire(self, timeout: float = -1) -> bool:
        self.reached += 1
        return self._lock.acquire(timeout=timeout)

    def release(self) -> None:
        self._lock.release()


def test_scrapes_waiting_on_a_slow_reading_share_it_instead_of_each_taking_another(monkeypatch, tmp_path):
    """A reading that takes longer than the cache window (a kubelet slow to answer List) must not be
    taken once more by every scrape queued behind it: two Prometheus replicas and the liveness probe
    would wait one full reading each in turn (past their timeouts), asking the slow kubelet again."""
    for node in make_node(monkeypatch, tmp_path, exporter_config=dict(cache_s=0.0, reading_wait_s=60.0)):
        node.kubelet.add("ns", "p", uid(1), {"c": {GPU: [U0]}})
        node.scrape()
        lock = _CountingLock()
        node.exporter.collector._lock = lock
        node.kubelet.hold = threading.Event()
        calls_before = node.kubelet.list_calls
        results: list[Scrape] = []
        threads = [threading.Thread(target=lambda: results.append(node.scrape())) for _ in range(3)]
        threads[0].start()
        assert node.kubelet.held.wait(30)           # the first reading is waiting on the kubelet
        for t in threads[1:]:
            t.start()
        deadline = time.monotonic() + 30
        while lock.reached < 3:                      # the other two are queued behind it
            assert time.monotonic() < deadline, lock.reached
            time.sleep(0.01)
        node.kubelet.hold.set()                      # the kubelet answers at last
        for t in threads:
            t.join(60)
        assert len(results) == 3 and all(_pods(s) == {("ns", "p", "c", U0)} for s in results)
        assert node.kubelet.list_calls - calls_before == 1


def test_healthz_answers_while_a_reading_waits_on_a_hung_kubelet(monkeypatch, tmp_path):
    """The liveness probe's path (/healthz, scheduler-config/exporter.yaml) says the server serves,
    without a reading: a /metrics scrape waits on a kubelet that hangs (up to its timeout, 5 s as
    shipped, the probe's timeout too), and /healthz must not wait with it."""
    for node in make_node(monkeypatch, tmp_path, exporter_config=dict(kubelet_timeout_s=20.0)):
        node.kubelet.add("ns", "p", uid(1), {"c": {GPU: [U0]}})
        node.kubelet.hold = threading.Event()
        scraping = threading.Thread(target=node.scrape)
        scraping.start()
        try:
            assert node.kubelet.held.wait(10)      # a reading is now waiting on List
            health = node.url.rsplit("/", 1)[0] + "/healthz"
            r = requests.get(health, timeout=3)
            assert (r.status_code, r.text) == (200, "ok\n")
            assert scraping.is_alive()             # the reading still waits: /healthz did not take one
        finally:
            node.kubelet.hold.set()
            scraping.join(30)
            node.kubelet.hold = None
