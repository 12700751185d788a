"""A fake kubelet PodResources API v1 server on a real unix socket, plus the kubelet's
device-manager checkpoint, its pod log directories and a host ``/proc`` tree: everything the
exporter reads on a node.

Like the kubelet, ``List`` returns every pod with every container (containers without devices
included, with an empty device list; init containers are the test's to leave out, the kubelet
lists only ``spec.containers``), one row per device ID, and no pod UID; the checkpoint holds the same allocations keyed
by pod UID and container name, in the kubelet >= 1.20 format (``DeviceIDs`` by NUMA node).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc

from stowage import genprotos

genprotos.ensure("gpunode/podresources/api.proto")
from gpunode.podresources import api_pb2 as pb  # noqa: E402
from gpunode.podresources import api_pb2_grpc as pb_grpc  # noqa: E402


@dataclass
class FakePod:
    namespace: str
    name: str
    uid: str
    containers: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # container -> resource -> IDs


class FakePodResources(pb_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        # unix socket paths are limited to 107 bytes: keep the directory short
        self.dir = tempfile.mkdtemp(prefix="podres-")
        self.sock = os.path.join(self.dir, "kubelet.sock")
        self.checkpoint = os.path.join(self.dir, "kubelet_internal_checkpoint")
        self.pods: list[FakePod] = []
        self.list_calls = 0
        self.fail: grpc.StatusCode | None = None
        self.server: Any = None
        # when set, List answers with the pods this returns (e.g. a fake kubelet's live allocations)
        self.source: Callable[[], list[FakePod]] | None = None
        # when set, List waits for this event before answering: a kubelet that hangs (the test sets
        # it before stopping, so no handler thread is left blocked)
        self.hold: threading.Event | None = None
        self.held = threading.Event()      # a List call is waiting on ``hold``

    def add(self, namespace: str, name: str, uid: str, containers: dict[str, dict[str, list[str]]]) -> FakePod:
        pod = FakePod(namespace, name, uid, containers)
        self.pods.append(pod)
        return pod

    # ---- the kubelet's service ---------------------------------------------------------------
    def _pod(self, p: FakePod) -> Any:
        # One ContainerDevices row per device ID, as the real kubelet answers (v1.28: a row per
        # device, and per NUMA node of a device that reports topology; seen in
        # tests/integration/test_real_exporter.py), not one row holding a resource's IDs.
        return pb.PodResources(name=p.name, namespace=p.namespace, containers=[
            pb.ContainerResources(name=c, devices=[pb.ContainerDevices(resource_name=r, device_ids=[i])
                                                   for r, ids in res.items() for i in ids])
            for c, res in p.containers.items()])

    def List(self, request: Any, context: Any) -> Any:
        self.list_calls += 1
        if self.hold is not None:
            self.held.set()
            self.hold.wait()
        if self.fail is not None:
            context.abort(self.fail, "injected failure")
        pods = self.source() if self.source is not None else self.pods
        return pb.ListPodResourcesResponse(pod_resources=[self._pod(p) for p in pods])

    def Get(self, request: Any, context: Any) -> Any:
        for p in self.pods:
            if (p.name, p.namespace) == (request.pod_name, request.pod_namespace):
                return pb.GetPodResourcesResponse(pod_resources=self._pod(p))
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        return pb.AllocatableResourcesResponse()

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self) -> "FakePodResources":
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-podres"))
        pb_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port("unix://" + self.sock)
        self.server.start()
        return self

    def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()
        if self.server is not None:
            self.server.stop(grace=None).wait(5)
            self.server = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---- the kubelet's checkpoint ----------------------------------------------------------------
    def write_checkpoint(self, legacy_list: bool = False, extra: list[dict] | None = None) -> str:
        entries = [{"PodUID": p.uid, "ContainerName": c, "ResourceName": r,
                    "DeviceIDs": list(ids) if legacy_list else {"-1": list(ids)}, "AllocResp": ""}
                   for p in self.pods for c, res in p.containers.items() for r, ids in res.items()]
        doc = {"Data": {"PodDeviceEntries": entries + list(extra or []), "RegisteredDevices": {}}, "Checksum": 1}
        with open(self.checkpoint, "w") as f:
            json.dump(doc, f)
        return self.checkpoint


def write_pod_logs(root: str, pods: list[FakePod], containers_too: bool = True) -> None:
    """The kubelet's ``/var/log/pods/<namespace>_<name>_<uid>/<container>/0.log`` tree."""
    for p in pods:
        d = os.path.join(root, f"{p.namespace}_{p.name}_{p.uid}")
        os.makedirs(d, exist_ok=True)
        for c in p.containers if containers_too else ():
            os.makedirs(os.path.join(d, c), exist_ok=True)
            with open(os.path.join(d, c, "0.log"), "w") as f:
                f.write("2024-01-01T00:00:00.000000000Z stdout F started\n")


def write_proc(root: str, pid: int, cgroup: str) -> None:
    """A host process ``pid`` whose ``/proc/<pid>/cgroup`` says ``cgroup``."""
    os.makedirs(os.path.join(root, str(pid)), exist_ok=True)
    with open(os.path.join(root, str(pid), "cgroup"), "w") as f:
        f.write(cgroup)


def cgroup_v2_systemd(uid: str, container_id: str, qos: str = "burstable") -> str:
    return (f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{uid.replace('-', '_')}.slice/"
            f"cri-containerd-{container_id}.scope\n")


def cgroup_v1_cgroupfs(uid: str, container_id: str, qos: str = "besteffort", unified: bool = True) -> str:
    """cgroup v1, cgroupfs driver, as the real kubelet (v1.28) and runc lay it out: every hierarchy
    names ``/kubepods[/<qos>]/pod<uid>/<container id>`` (guaranteed pods: no QoS level; a pod
    asking only for extended resources such as GPUs is besteffort). ``unified``: the cgroup v2
    hierarchy is mounted beside v1 ("hybrid", as on the integration tests' node, where the ``0::``
    line carries the same path); else the ``0::`` line is ``/``."""
    path = f"/kubepods/{qos}/pod{uid}/{container_id}" if qos != "guaranteed" else f"/kubepods/pod{uid}/{container_id}"
    lines = [f"{i}:{ctl}:{path}" for i, ctl in ((9, "name=systemd"), (8, "pids"), (7, "blkio"), (6, "freezer"),
                                                (5, "devices"), (4, "memory"), (3, "cpuset"), (2, "cpuacct"), (1, "cpu"))]
    return "\n".join(lines + [f"0::{path if unified else '/'}"]) + "\n"
