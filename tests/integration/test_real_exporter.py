"""The exporter with the REAL kubelet (v1.28.7, containerd): attribution of real containers'
processes to pods, over real HTTP scrapes of /metrics.

Everything the exporter reads is the node's own: the kubelet's PodResources API
(``/var/lib/kubelet/pod-resources/kubelet.sock``), its device-manager checkpoint, its pod log
directories (``/var/log/pods``) and the host's ``/proc``, at the paths ``stowage exporter`` uses by
default. The exporter is built from its config as the CLI builds it (``Exporter(cfg)``), in this
process, as in the unit harness (``tests/exporter_harness.py``). Only NVML is faked, at the pynvml
layer (``tests/fakenvml.py``), shared with the device plugin as on a real node: it reports, as the
running processes of each card, the REAL host PIDs of the pods' containers, which the test takes
from containerd's task list by the container IDs in the pod status. The pod each PID belongs to is
never handed to the exporter: it finds it as on any node, from ``/proc/<pid>/cgroup`` (whatever
layout the real kubelet and runc made) and the kubelet's own files.

The pods and cards are those of ``test_real_kubelet.py::test_each_container_gets_exactly_its_recorded_cards``,
plus a pod that holds no card and a finished one, bound with their records (``kubeletbed.py``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import pytest
import requests

from exporter_harness import Scrape
from fakenvml import MiB
from kubeletbed import IMAGE, NODE, NS, GpuNode, create_and_bind, gpu_container, whole_and_shared_pods
from realk8s import wait_until

from exporter.cgroups import PodCgroup, parse_proc_cgroup
from exporter.collector import ExporterConfig
from exporter.server import Exporter

pytestmark = pytest.mark.timeout(300)

POD_FAMILIES = ("stowage_pod_gpu_memory_used_bytes", "stowage_pod_gpu_utilization_ratio")
CARD_FAMILIES = ("stowage_gpu_utilization_ratio", "stowage_gpu_memory_used_bytes", "stowage_gpu_memory_total_bytes",
                 "stowage_gpu_power_watts", "stowage_gpu_temperature_celsius", "stowage_gpu_healthy")


@dataclass
class Exporters:
    """Two exporters on the node: as deployed (UIDs named from ``/var/log/pods``), and one that can
    name UIDs only from the kubelet's checkpoint joined with PodResources (``--pod-logs-dir``
    pointing nowhere), so that both ways are checked against the real kubelet's files."""

    deployed: Exporter
    checkpoint_only: Exporter

    def scrape(self, exp: Exporter) -> Scrape:
        r = requests.get(f"http://127.0.0.1:{exp.port}/metrics", timeout=30)
        assert r.status_code == 200, r.text
        return Scrape(r.text)


def _cli_defaults() -> dict[str, object]:
    from exporter.cli import main
    return {p.name: p.default for p in main.params}


@pytest.fixture
def exporters(clean: GpuNode, tmp_path) -> Iterator[Exporters]:
    cli = _cli_defaults()
    started = []
    try:
        for logs in (cli["pod_logs_dir"], str(tmp_path / "no-pod-logs")):
            # the CLI's config with its defaults (the node's real paths); --cache-seconds 0: each
            # scrape reads anew
            cfg = ExporterConfig(node=NODE, pod_resources_socket=cli["pod_resources_socket"],
                                 checkpoint_path=cli["kubelet_checkpoint"], pod_logs_dir=logs,
                                 proc_root=cli["proc_root"], cache_s=0.0)
            exp = Exporter(cfg)
            exp.start(0, "127.0.0.1")
            started.append(exp)
            exp.collector.snapshot()     # as `stowage exporter` does at start, before any pod exists
        yield Exporters(*started)
    finally:
        for exp in started:
            exp.stop()


def _running_on_node(n: GpuNode, name: str) -> dict:
    """A pod with no GPU at all, created on the node (no scheduler, no record)."""
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never"}]}}
    n.k8s.core.create_namespaced_pod(NS, body)
    return n.wait_running(name)


def _check_cgroup_layout(n: GpuNode, pod: str, pid: int) -> str:
    """The real ``/proc/<pid>/cgroup`` of a container's process names its pod's UID and its
    container ID to ``exporter/cgroups.py``; returns the file for the failure messages."""
    text = open(f"/proc/{pid}/cgroup").read()
    p = n.pod(pod)
    cid = next(s["containerID"].split("://", 1)[1] for s in p["status"]["containerStatuses"] if s["name"] == "main")
    assert parse_proc_cgroup(text) == PodCgroup(p["metadata"]["uid"], cid), (
        f"exporter/cgroups.py misreads the real kubelet's cgroup of {pod} (uid {p['metadata']['uid']}):\n{text}")
    return text


def _pod_series(s: Scrape) -> dict[str, dict[tuple[str, str, str, str], float]]:
    """family -> (namespace, pod, container, gpu) -> value, checking the node label on the way."""
    out: dict[str, dict[tuple[str, str, str, str], float]] = {}
    for fam in POD_FAMILIES:
        for x in s.samples(fam):
            assert x.labels["node"] == NODE, x
            key = (x.labels["namespace"], x.labels["pod"], x.labels["container"], x.labels["gpu"])
            assert key not in out.setdefault(fam, {}), f"two {fam} series for {key}"
            out[fam][key] = x.value
    return out


def test_real_containers_processes_are_attributed_to_their_pods_and_cards(clean: GpuNode, exporters: Exporters) -> None:
    n = clean
    u = [n.uuid(i) for i in range(4)]
    models = {c.uuid: c.name for c in n.nvml.cards}
    pods = whole_and_shared_pods(n)
    create_and_bind(n, pods)
    # a share of the shared card whose pod has finished: the kubelet must not list it as a holder
    done = n.create_pod("finished", [gpu_container("main", mem=1, core=5, exit_after=True)], restart_policy="Never")
    n.bind(done, n.record([3], whole=False, mem_gib=1, core_pct=5))
    for name in pods:
        n.wait_running(name)
    n.wait_phase("finished", "Succeeded")
    _running_on_node(n, "no-gpu")

    # The containers' real host PIDs, from containerd; their cgroups as the real kubelet made them.
    pid = {name: n.container_pids(name)["main"] for name in (*pods, "no-gpu")}
    layouts = {name: _check_cgroup_layout(n, name, p) for name, p in pid.items()}
    host = os.getpid()                                   # a process of no pod (this test's own)

    # What NVML reports: each card's processes with their memory and SM utilisation.
    procs = {
        u[0]: [(pid["whole-two"], 3000, 40)],
        u[1]: [(pid["whole-two"], 5000, 60)],
        u[2]: [(pid["whole-init"], 7000, 55)],
        u[3]: [(pid["slice-a"], 1000, 30), (pid["slice-b"], 500, 10), (pid["no-gpu"], 250, 5), (host, 100, 5)],
    }
    card_util = {u[0]: 40, u[1]: 60, u[2]: 55, u[3]: 50}

    def nvml_reports(procs: dict[str, list[tuple[int, int, int]]]) -> None:
        for uuid, ps in procs.items():
            c = n.nvml.card(uuid)
            c.processes = [(p, mib) for p, mib, _ in ps]
            c.used_mib, c.gpu_util = sum(mib for _, mib, _ in ps), card_util[uuid]
            c.power_mw, c.temperature_c = 100_000 + 1000 * c.minor, 50 + c.minor
        for uuid, ps in procs.items():      # fresh samples: each exporter reads those since its last reading
            for p, _, sm in ps:
                n.nvml.add_sample(uuid, p, sm)

    nvml_reports(procs)
    for exp in (exporters.deployed, exporters.checkpoint_only):
        s = exporters.scrape(exp)
        assert [s.up(src) for src in ("nvml", "podresources", "checkpoint", "proc")] == [1, 1, 1, 1], s.text
        assert s.up("podlogs") == (1 if exp is exporters.deployed else None)   # not there: not missing
        got = _pod_series(s)
        # exactly the running containers that hold a card, on exactly their cards: not the init
        # container, not the finished pod, not the pod without a GPU
        want_mem = {
            (NS, "whole-two", "main", u[0]): 3000 * MiB,       # one holder: the card's own memory used
            (NS, "whole-two", "main", u[1]): 5000 * MiB,
            (NS, "whole-init", "main", u[2]): 7000 * MiB,
            (NS, "slice-a", "main", u[3]): 1000 * MiB,         # shared: its own process's memory
            (NS, "slice-b", "main", u[3]): 500 * MiB,
        }
        assert got["stowage_pod_gpu_memory_used_bytes"] == want_mem, (s.text, layouts)
        want_util = {k: pytest.approx(v) for k, v in {
            (NS, "whole-two", "main", u[0]): 0.40, (NS, "whole-two", "main", u[1]): 0.60,
            (NS, "whole-init", "main", u[2]): 0.55,
            (NS, "slice-a", "main", u[3]): 0.30, (NS, "slice-b", "main", u[3]): 0.10,   # their own SM share
        }.items()}
        assert got["stowage_pod_gpu_utilization_ratio"] == want_util, s.text
        for fam in POD_FAMILIES:
            assert all(x.labels["model"] == models[x.labels["gpu"]] for x in s.samples(fam))
        # measured, not estimated, on every held card
        for uuid in u:
            assert s.value("stowage_gpu_attribution_estimated", gpu=uuid, model=models[uuid]) == 0, s.text
        # per card: NVML's own numbers, every card
        for uuid in u:
            c, lab = n.nvml.card(uuid), dict(node=NODE, gpu=uuid, model=models[uuid])
            assert s.value("stowage_gpu_memory_used_bytes", **lab) == c.used_mib * MiB
            assert s.value("stowage_gpu_memory_total_bytes", **lab) == c.memory_mib * MiB
            assert s.value("stowage_gpu_utilization_ratio", **lab) == pytest.approx(card_util[uuid] / 100)
            assert s.value("stowage_gpu_power_watts", **lab) == pytest.approx(c.power_mw / 1000)
            assert s.value("stowage_gpu_temperature_celsius", **lab) == c.temperature_c
            assert s.value("stowage_gpu_healthy", **lab) == 1
        for fam in CARD_FAMILIES:
            assert {x.labels["gpu"] for x in s.samples(fam)} == set(u)

    # Deleting pods: the kubelet stops listing them, their processes exit (NVML stops listing
    # them), and their series go; the card left with one holder gives it the card's own numbers.
    for name in ("slice-b", "whole-two"):
        n.k8s.core.delete_namespaced_pod(name, NS)
    for name in ("slice-b", "whole-two"):
        wait_until(lambda: not os.path.exists(f"/proc/{pid[name]}"), 30, f"{name}'s process to exit")
    procs[u[3]] = [p for p in procs[u[3]] if p[0] != pid["slice-b"]]
    procs[u[0]], procs[u[1]] = [], []
    nvml_reports(procs)

    def gone(exp: Exporter) -> Scrape | None:
        s = exporters.scrape(exp)
        held = {(pod, gpu) for (_, pod, _, gpu) in _pod_series(s).get("stowage_pod_gpu_memory_used_bytes", {})}
        return s if held == {("whole-init", u[2]), ("slice-a", u[3])} else None
    for exp in (exporters.deployed, exporters.checkpoint_only):
        s = wait_until(lambda: gone(exp), 30, "the deleted pods' series to go")
        assert set(_pod_series(s)["stowage_pod_gpu_utilization_ratio"]) == {
            (NS, "whole-init", "main", u[2]), (NS, "slice-a", "main", u[3])}
        lab3 = dict(gpu=u[3], model=models[u[3]])
        assert s.value("stowage_pod_gpu_memory_used_bytes", pod="slice-a", namespace=NS, container="main", **lab3) \
            == (1000 + 250 + 100) * MiB          # the only holder: the card's own memory used
        assert s.value("stowage_pod_gpu_utilization_ratio", pod="slice-a", namespace=NS, container="main", **lab3) \
            == pytest.approx(0.50)
        assert s.value("stowage_gpu_attribution_estimated", **lab3) == 0
        # cards nobody holds keep their per-card series and have no attribution series
        for uuid in u[:2]:
            assert s.samples("stowage_gpu_attribution_estimated", gpu=uuid) == []
            assert s.value("stowage_gpu_memory_used_bytes", gpu=uuid) == 0
        assert s.up("podresources") == 1
