"""Test rig for the device plugin: fake NVML + fake kubelet (device plugin API and, fed from the same
allocations, its PodResources API) + fake API server, real plugin code."""
from __future__ import annotations

import contextlib
import copy
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from fakekube import FakeKube, make_node, make_pod
from fakekubelet import FakeKubelet
from fakenvml import FakeNvml, default_cards
from fakepodresources import FakePodResources

from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, encode_allocation
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY

NODE = "gpu-node-1"


@dataclass
class Rig:
    kube: FakeKube
    kubelet: FakeKubelet
    nvml: FakeNvml
    plugin: Any
    dir: str
    dev_root: str
    podres: FakePodResources | None = None

    def uuid(self, i: int) -> str:
        return self.nvml.cards[i].uuid

    def registered(self) -> bool:
        return self.kubelet.wait_for(lambda: set(self.kubelet.plugins) == set(self.plugin.cfg.resources))

    def restart_plugin(self) -> None:
        """Stop the plugin process and start a fresh one (empty memory), as a DaemonSet pod restart does."""
        from deviceplugin.server import DevicePlugin
        cfg = self.plugin.cfg
        self.plugin.stop()
        self.plugin = DevicePlugin(cfg)
        self.plugin.start()


def count_syncs(plugin: Any) -> list[int]:
    """Count the watcher's polls (it calls ``plugin._sync`` once per poll)."""
    n = [0]
    real = plugin._sync
    lock = threading.Lock()

    def sync() -> None:
        with lock:
            n[0] += 1
        real()
    plugin._sync = sync
    return n


def short_tmpdir() -> str:
    """Unix socket paths must stay under 108 bytes: pytest's tmp_path can be too long."""
    return tempfile.mkdtemp(prefix="dp-", dir="/tmp")


@contextlib.contextmanager
def rig(monkeypatch: Any, cards: Any = None, driver_loaded: bool = True, start_kubelet: bool = True,
        podresources: bool = True, count_error: int | None = None,
        before_start: Callable[[str], None] | None = None, **cfg: Any) -> Iterator[Rig]:
    """``count_error``: nvmlDeviceGetCount fails with this NVML error code when the plugin starts;
    ``before_start(plugin_dir)`` runs just before the plugin starts."""
    from deviceplugin.server import DevicePlugin, PluginConfig
    import kubernetes.client

    base = short_tmpdir()
    plugin_dir, dev_root = os.path.join(base, "dp"), os.path.join(base, "dev")
    os.makedirs(dev_root)
    nv = FakeNvml(cards if cards is not None else default_cards(), driver_loaded=driver_loaded)
    nv.count_error = count_error
    nv.install(monkeypatch)
    for c in nv.cards:  # only some device nodes exist: the plugin must send only those
        open(os.path.join(dev_root, f"nvidia{c.minor}"), "w").close()
    open(os.path.join(dev_root, "nvidiactl"), "w").close()
    kube = FakeKube().start()
    kube.create_node(make_node(NODE, gpus=len(nv.cards)))
    kubelet = FakeKubelet(plugin_dir)
    if start_kubelet:
        kubelet.start()
    podres = None
    if podresources:
        podres = FakePodResources()
        podres.source = kubelet.pod_resources
        podres.start()
    settings = dict(node=NODE, plugin_dir=plugin_dir, dev_root=dev_root, recovery_quiet_s=0.3,
                    probe_interval_s=0.1, event_wait_ms=50, core_api=kubernetes.client.CoreV1Api(kube.api_client()),
                    pod_resources_socket=podres.sock if podres else os.path.join(base, "no-pod-resources", "kubelet.sock"))
    record_key = cfg.pop("record_key", None)
    if record_key is not None:   # the plugin reads its key from a file, as from the mounted Secret
        settings["record_key_file"] = os.path.join(base, "record.key")
        with open(settings["record_key_file"], "wb") as f:
            f.write(record_key.secret)
    settings.update(cfg)
    plugin = DevicePlugin(PluginConfig(**settings))
    if before_start is not None:
        before_start(plugin_dir)
    plugin.start()
    r = Rig(kube, kubelet, nv, plugin, plugin_dir, dev_root, podres)
    try:
        yield r
    finally:
        r.plugin.stop()
        kubelet.stop()
        if podres is not None:
            podres.close()
        kube.stop()
        shutil.rmtree(base, ignore_errors=True)


def record(uuids_and_index: list[tuple[int, str]], whole: bool, mem_mib: int = 0, core_milli: int = 0) -> str:
    return encode_allocation(AllocationRecord(node=NODE, whole=whole, cards=tuple(
        CardShare(index=i, uuid=u, memory_mib=mem_mib, core_milli=core_milli) for i, u in uuids_and_index)))


def container(name: str, gpus: int = 0, mem: int = 0, core: int = 0) -> dict[str, Any]:
    limits = {}
    if gpus:
        limits[RESOURCE_GPU] = str(gpus)
    if mem:
        limits[RESOURCE_GPU_MEMORY] = str(mem)
    if core:
        limits[RESOURCE_GPU_CORE] = str(core)
    return {"name": name, "image": "cuda", "resources": {"limits": limits, "requests": copy.deepcopy(limits)}}


def bind_pod(r: Rig, name: str, containers: list[dict[str, Any]], rec: str | None, bound_at: str,
             init: list[dict[str, Any]] | None = None, scheduler: str | None = None,
             node: str = NODE) -> dict[str, Any]:
    """Create a pod as the extender leaves it: record annotation, bound to the node, PodScheduled."""
    pod = make_pod(name, node=node, annotations={ALLOCATION_ANNOTATION: rec} if rec else {})
    pod["spec"]["containers"] = containers
    if scheduler is not None:
        pod["spec"]["schedulerName"] = scheduler
    if init:
        pod["spec"]["initContainers"] = init
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": bound_at}]
    return r.kube.create_pod(pod)
