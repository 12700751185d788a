"""A GPU node for the exporter's tests: fake NVML (pynvml functions), a fake kubelet PodResources
server on a real unix socket, the kubelet checkpoint and a host /proc tree in tmp; the real exporter
serving real HTTP; scrapes parsed with prometheus_client's own text parser."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from exporter.collector import ExporterConfig, Snapshotter, reader_for
from exporter.server import Exporter
from fakenvml import MiB, FakeNvml, default_cards
from fakepodresources import FakePodResources, cgroup_v2_systemd, write_pod_logs, write_proc

NODE = "gpu-node-1"
GiB = 1024 * MiB


class Scrape:
    """One parsed /metrics answer."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def samples(self, name: str, **labels: str) -> list[Any]:
        fam = self.families.get(name)
        if fam is None:
            return []
        return [s for s in fam.samples if all(s.labels.get(k) == v for k, v in labels.items())]

    def value(self, name: str, **labels: str) -> float:
        found = self.samples(name, **labels)
        assert len(found) == 1, f"{name}{labels}: {len(found)} samples in\n{self.text}"
        return found[0].value

    def up(self, source: str) -> float | None:
        found = self.samples("stowage_exporter_up", source=source)
        return found[0].value if found else None


@dataclass
class GpuNode:
    nvml: FakeNvml
    kubelet: FakePodResources
    proc: str
    exporter: Exporter
    pod_logs: str = ""

    def write_pod_logs(self) -> None:
        """The kubelet's /var/log/pods tree for every pod the fake kubelet lists."""
        write_pod_logs(self.pod_logs, self.kubelet.pods)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.exporter.port}/metrics"

    def scrape(self) -> Scrape:
        r = requests.get(self.url, timeout=30)
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"].startswith("text/plain")
        return Scrape(r.text)

    def process(self, uuid: str, pid: int, used_mib: int, cgroup: str | None) -> None:
        """A process on card ``uuid`` holding ``used_mib``; ``cgroup`` None: no /proc entry for it."""
        card = self.nvml.card(uuid)
        card.processes.append((pid, used_mib))
        card.used_mib += used_mib
        if cgroup is not None:
            write_proc(self.proc, pid, cgroup)

    def pod_process(self, uuid: str, pid: int, used_mib: int, pod_uid: str, container_id: str | None = None) -> None:
        self.process(uuid, pid, used_mib, cgroup_v2_systemd(pod_uid, container_id or f"{pid:064x}"))


def make_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, cards: list | None = None,
              driver_loaded: bool = True, kubelet: bool = True, cache_s: float = 0.0,
              exporter_config: dict[str, Any] | None = None, **reader: Any) -> Iterator[GpuNode]:
    """A node with the real exporter serving on a free port. ``exporter_config``: more ExporterConfig
    fields (what the CLI sets), also replacing the harness' own (e.g. ``kubelet_timeout_s``);
    ``reader``: NvmlReader arguments no flag sets (e.g. a shorter XID backoff) on top of those the
    config gives it."""
    fake = FakeNvml(cards if cards is not None else default_cards(), driver_loaded=driver_loaded)
    fake.install(monkeypatch)
    pr = FakePodResources()
    if kubelet:
        pr.start()
    proc = str(tmp_path / "proc")
    os.makedirs(proc)
    pod_logs = str(tmp_path / "log-pods")   # absent until a test writes it
    fields: dict[str, Any] = dict(node=NODE, pod_resources_socket=pr.sock, checkpoint_path=pr.checkpoint,
                                  pod_logs_dir=pod_logs, proc_root=proc, cache_s=cache_s, kubelet_timeout_s=10.0)
    cfg = ExporterConfig(**{**fields, **(exporter_config or {})})
    exp = Exporter(cfg, Snapshotter(cfg, reader_for(cfg, retry_s=0.0, **reader)))
    exp.start(0, "127.0.0.1")
    try:
        yield GpuNode(fake, pr, proc, exp, pod_logs)
    finally:
        exp.stop()
        pr.close()
