"""The real kubelet's GPU node: the kubelet (v1.28.7, containerd) of ``../shared/k8s``, our device
plugin on it with NVML faked at the pynvml layer (``tests/fakenvml.py``), and real pods on it.

Why a module of its own: the device-plugin tests (``test_real_kubelet.py``) and the exporter's
(``test_real_exporter.py``) need the same node and make pods on it the same way. The kubelet is
started once per session (the ``k8s`` fixture's, kept until the session ends); each test module
gets its own plugin and fake NVML (fixture ``gpu_node`` in ``conftest.py``), so no module sees
another's cards or pods.

Pods run the image ``example.local/fakegpu-test:1``, which sleeps until SIGTERM (with ``env`` it
first prints its environment). They are bound as the extender binds them (its ``KubeBinder``: one
Binding that carries the record), without a scheduler, so each test controls exactly which card a
pod is recorded on and when it is bound.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from dp_harness import container
from fakenvml import FakeNvml, default_cards
from realk8s import LocalK8s, require_kubelet, wait_until

from stowage.allocation import AllocationRecord, CardShare
from stowage.resources import CORE_MILLI_PER_CARD

NODE = "gpu-node-1"
NS = "dp-it"
IMAGE = "example.local/fakegpu-test:1"
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


@dataclass
class GpuNode:
    """The real kubelet's node, our plugin on it, and the fake NVML under the plugin."""

    k8s: LocalK8s
    nvml: FakeNvml
    plugin: Any
    dev_root: str

    def uuid(self, i: int) -> str:
        return self.nvml.cards[i].uuid

    def restart_plugin(self, wait_registered: bool = True) -> None:
        """Stop the plugin and start a fresh one (empty memory), as a DaemonSet pod restart does."""
        from deviceplugin.server import DevicePlugin
        cfg = self.plugin.cfg
        self.plugin.stop()
        self.plugin = DevicePlugin(cfg)
        self.plugin.start()
        if wait_registered:
            self.wait_registered()

    def registered(self) -> bool:
        kino = self.plugin._kubelet_ino()
        return all(ep.registered_with is not None and ep.registered_with == kino for ep in self.plugin.endpoints)

    def wait_registered(self, timeout: float = 10) -> None:
        wait_until(self.registered, timeout, "the plugin to register all three resources")

    # --- pods ------------------------------------------------------------------------------
    def record(self, cards: list[int], whole: bool, mem_gib: int = 0, core_pct: int = 0) -> AllocationRecord:
        infos = {c.index: c for c in self.plugin.state.table.cards}
        return AllocationRecord(node=NODE, whole=whole, cards=tuple(
            CardShare(index=k, uuid=infos[k].uuid,
                      memory_mib=infos[k].memory_mib if whole else mem_gib * 1024,
                      core_milli=CORE_MILLI_PER_CARD if whole else core_pct * 10) for k in cards))

    def create_pod(self, name: str, containers: list[dict], init: list[dict] | None = None,
                   restart_policy: str = "Always") -> dict:
        """A pod no scheduler picks up (schedulerName names none): the test binds it itself."""
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
                "spec": {"schedulerName": "stowage-it-manual", "terminationGracePeriodSeconds": 1,
                         "restartPolicy": restart_policy,
                         "containers": containers, **({"initContainers": init} if init else {})}}
        return self.k8s.core.api_client.sanitize_for_serialization(
            self.k8s.core.create_namespaced_pod(NS, body))

    def bind(self, pod: dict, rec: AllocationRecord) -> None:
        from extender.kube_binder import KubeBinder
        meta = pod["metadata"]
        KubeBinder(self.k8s.api_client()).bind(NS, meta["name"], meta["uid"], NODE, rec)

    def pod(self, name: str) -> dict:
        resp = self.k8s.core.read_namespaced_pod(name, NS, _preload_content=False)
        return json.loads(resp.data)

    def wait_phase(self, name: str, phase: str, timeout: float = 60) -> dict:
        """Wait for ``phase``; a pod that ends in another terminal phase fails the wait at once."""
        def reached() -> dict | None:
            p = self.pod(name)
            now = p["status"].get("phase")
            if now in ("Failed", "Succeeded") and now != phase:
                raise AssertionError(f"pod {name} is {now}: {p['status'].get('reason')} "
                                     f"{p['status'].get('message')}")
            return p if now == phase else None
        return wait_until(reached, timeout, f"pod {name} {phase}")

    def wait_running(self, name: str, timeout: float = 60) -> dict:
        return self.wait_phase(name, "Running", timeout)

    def container_env(self, name: str, container: str, timeout: float = 30) -> dict[str, str]:
        """The environment the container printed (``fakegpu-test env``), from its log on this node."""
        uid = self.pod(name)["metadata"]["uid"]

        def read() -> dict[str, str] | None:
            logs = sorted(Path("/var/log/pods").glob(f"{NS}_{name}_{uid}/{container}/*.log"))
            if not logs:
                return None
            env = {}
            for line in logs[0].read_text(errors="replace").splitlines():
                m = re.search(r"\bENV ([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
                if m:
                    env[m.group(1)] = m.group(2)
            return env or None
        return wait_until(read, timeout, f"the printed environment of {name}/{container}")

    def container_pids(self, name: str) -> dict[str, int]:
        """Host PID of each running container of pod ``name``, as the node's runtime reports it:
        the container IDs in the pod's status, looked up in containerd's task list (``ctr``)."""
        statuses = self.pod(name)["status"].get("containerStatuses") or []
        ids = {s["name"]: s["containerID"].split("://", 1)[1] for s in statuses
               if s.get("containerID") and "running" in (s.get("state") or {})}
        sock = str(self.k8s.dir / "containerd" / "containerd.sock")
        out = subprocess.run(["ctr", "--address", sock, "-n", "k8s.io", "tasks", "ls"], check=True,
                             capture_output=True, text=True, timeout=30).stdout
        tasks = {f[0]: int(f[1]) for f in (line.split() for line in out.splitlines()[1:]) if len(f) >= 3
                 and f[2] == "RUNNING"}
        missing = sorted(c for c, cid in ids.items() if cid not in tasks)
        assert not missing, f"containerd runs no task for {name}'s containers {missing}:\n{out}"
        return {c: tasks[cid] for c, cid in ids.items()}

    def delete_all_pods(self) -> None:
        for p in self.k8s.core.list_namespaced_pod(NS).items:
            self.k8s.core.delete_namespaced_pod(p.metadata.name, NS, grace_period_seconds=0)
        wait_until(lambda: not self.k8s.core.list_namespaced_pod(NS).items, 60, "the test pods to be gone")

    def node_resources(self) -> tuple[dict[str, str], dict[str, str]]:
        st = self.k8s.core.read_node(NODE).status
        return dict(st.capacity or {}), dict(st.allocatable or {})


def gpu_container(name: str, gpus: int = 0, mem: int = 0, core: int = 0, exit_after: bool = False) -> dict:
    """dp_harness's container on the test image, which prints its environment (then sleeps or exits)."""
    return {**container(name, gpus, mem, core), "image": IMAGE, "imagePullPolicy": "Never",
            "args": ["env", "exit"] if exit_after else ["env"]}


PodPlan = tuple[list[dict], list[dict] | None, AllocationRecord]   # containers, init containers, record


def whole_and_shared_pods(n: GpuNode) -> dict[str, PodPlan]:
    """Pods holding whole cards and shares of one card, by name, with the record each is bound with."""
    return {
        # two whole cards on the NVLinked pair
        "whole-two": ([gpu_container("main", gpus=2)], None, n.record([0, 1], whole=True)),
        # an init container and the app container, one whole card each (the kubelet reuses the init's)
        "whole-init": ([gpu_container("main", gpus=1)], [gpu_container("prep", gpus=1, exit_after=True)],
                       n.record([2], whole=True)),
        # two slices of memory + compute on the same card
        "slice-a": ([gpu_container("main", mem=4, core=25)], None, n.record([3], whole=False, mem_gib=4, core_pct=25)),
        "slice-b": ([gpu_container("main", mem=2, core=10)], None, n.record([3], whole=False, mem_gib=2, core_pct=10)),
    }


def create_and_bind(n: GpuNode, pods: dict[str, PodPlan]) -> None:
    for name, (containers, init, rec) in pods.items():
        n.bind(n.create_pod(name, containers, init), rec)


def gpu_node_on(k8s: LocalK8s) -> Iterator[GpuNode]:
    """The body of the ``gpu_node`` fixture: the kubelet (started on first use), a fresh fake NVML
    and our plugin registered on it; on the way out, the namespace's pods deleted and the plugin
    stopped (the kubelet keeps running for the next module)."""
    require_kubelet()
    from deviceplugin.server import DevicePlugin, PluginConfig
    import kubernetes.client

    fresh = k8s.kubelet_node is None
    if fresh:
        k8s.start_kubelet(NODE)
    nvml = FakeNvml(default_cards())
    undo = nvml.install()
    dev_root = tempfile.mkdtemp(prefix="dp-dev-")   # no /dev/nvidia* here: the plugin sends no device specs
    if not any(n.metadata.name == NS for n in k8s.core.list_namespace().items):
        k8s.core.create_namespace({"metadata": {"name": NS}})
    cfg = PluginConfig(node=NODE, plugin_dir=PLUGIN_DIR, dev_root=dev_root, recovery_quiet_s=2.0,
                       probe_interval_s=0.5, event_wait_ms=100, reconcile_interval_s=1.0,
                       core_api=kubernetes.client.CoreV1Api(k8s.api_client()))
    plugin = DevicePlugin(cfg)
    plugin.start()
    node = GpuNode(k8s, nvml, plugin, dev_root)
    try:
        node.wait_registered()
        if fresh:
            wait_sources_ready(node)
        yield node
    finally:
        try:
            node.delete_all_pods()
        finally:
            node.plugin.stop()
            undo()
            shutil.rmtree(dev_root, ignore_errors=True)


def wait_sources_ready(node: GpuNode) -> None:
    """Wait until a freshly started kubelet has taken its first list of pods from the API server.

    Observed (v1.28.7): the kubelet admits the pods of that first list BEFORE it marks its API
    source ready, and until then its device manager does not drop the allocations its checkpoint
    still holds for pods deleted since (kept from an earlier session, or deleted while it was
    down). A test that binds pods right after the start can then be offered too few devices
    (a card still "held" by a pod that no longer exists) and the pod fails admission. Once a pod
    of our own is Running, the batch that brought it has been handled and the source marked ready.
    """
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "kubelet-ready-probe", "namespace": NS},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never"}]}}
    node.k8s.core.create_namespaced_pod(NS, body)
    node.wait_running("kubelet-ready-probe")
    node.delete_all_pods()


def clean_node(node: GpuNode) -> Iterator[GpuNode]:
    """The body of the ``clean`` fixture: each test starts and ends with no pod on the node and the
    kubelet running."""
    node.delete_all_pods()
    yield node
    if node.k8s.kubelet_pid() is None:
        node.k8s.start_kubelet_again()
        wait_until(lambda: Path(PLUGIN_DIR, "kubelet.sock").exists(), 30, "kubelet.sock")
    node.delete_all_pods()
