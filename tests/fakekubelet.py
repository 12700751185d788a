"""A fake kubelet: the kubelet's side of the device plugin API, over real gRPC on unix sockets.

It behaves as ../shared/kubelet/README.md records for a real kubelet v1.28:
- serves ``Registration`` on ``<dir>/kubelet.sock``; inside ``Register``, before returning, calls
  ``GetDevicePluginOptions`` and opens ``ListAndWatch`` on the plugin's endpoint (this fake even
  waits for the first device list, so a plugin that is not yet serving, or that holds the first
  send back until Register returns, fails registration);
- admits a pod container by container (init containers first), one ``Allocate`` per container
  with one container request; before it, ``GetPreferredAllocation`` (if advertised) with ALL
  available healthy device IDs in random order; uses the preferred devices, not in their order;
  a container that reuses an init container's devices gets Allocate without GetPreferredAllocation;
- too few free healthy devices: the admission fails and the plugin gets no call at all;
- a plugin whose ListAndWatch stream ends has all its devices marked Unhealthy;
- ``restart()``: deletes every file in the directory except the checkpoint (the plugin's socket
  included), serves a new ``kubelet.sock`` and never reconnects to old endpoints;
- ``forget(uid)``: a pod deleted while a restarted kubelet still holds its devices (see there);
- ``pod_resources()``: what its PodResources API would list (feed it to
  ``fakepodresources.FakePodResources.source``): every pod from the start of its admission (the
  kubelet adds a pod to the pod manager PodResources lists before it admits it; a pod it rejects
  stays there, here it is dropped) by namespace/name, no UID,
  regular containers only (a v1.28 kubelet does not list init containers), each container's
  devices as soon as its Allocate was answered (the kubelet records them before its next call).
"""
from __future__ import annotations

import os
import random
import socket
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc

from stowage import genprotos

genprotos.ensure("deviceplugin/v1beta1/api.proto")
from deviceplugin.v1beta1 import api_pb2 as pb  # noqa: E402
from deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc  # noqa: E402
from stowage.resources import quantity_to_int  # noqa: E402

CHECKPOINT = "kubelet_internal_checkpoint"


class AdmissionError(Exception):
    """The kubelet rejected the pod (UnexpectedAdmissionError)."""


@dataclass
class PluginConn:
    resource: str
    endpoint: str
    channel: Any
    stub: Any
    options: Any
    devices: dict[str, str] = field(default_factory=dict)   # id -> health
    ids: list[str] = field(default_factory=list)             # the last list's IDs as sent (duplicates kept)
    topology: dict[str, list[int]] = field(default_factory=dict)
    updates: int = 0
    stream: Any = None
    alive: bool = True
    registered_at: float = 0.0


class FakeKubelet:
    def __init__(self, plugin_dir: str, seed: int = 1) -> None:
        self.dir = plugin_dir
        self.sock = os.path.join(plugin_dir, "kubelet.sock")
        self.rng = random.Random(seed)
        self.plugins: dict[str, PluginConn] = {}
        self.registrations: list[tuple[float, str, str]] = []  # (monotonic time, resource, endpoint)
        self.allocated: dict[str, dict[str, dict[str, list[str]]]] = {}  # pod uid -> container -> resource -> ids
        self.responses: dict[str, dict[str, dict[str, Any]]] = {}  # pod uid -> container -> resource -> response
        self.calls: list[tuple[str, str]] = []  # (rpc, resource) in call order
        self.pods: dict[str, tuple[str, str, list[str]]] = {}  # pod uid -> (namespace, name, regular containers)
        self.cond = threading.Condition()
        self.server: Any = None
        self.started_at = 0.0

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="fake-kubelet"))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port("unix://" + os.path.abspath(self.sock))
        server.start()
        self.server = server
        self.started_at = time.monotonic()

    def _drop_plugins(self) -> None:
        with self.cond:
            conns, self.plugins = list(self.plugins.values()), {}
        for c in conns:
            c.alive = False
            if c.stream is not None:
                c.stream.cancel()
            c.channel.close()

    def stop(self) -> None:
        """Kubelet stops: removes nothing on disk, so its kubelet.sock stays behind, refusing connections.

        gRPC unlinks its socket on shutdown; the real kubelet does not (../shared/kubelet/README.md),
        so a socket file nobody listens on is put back in its place.
        """
        if self.server is not None:
            self.server.stop(grace=0).wait(2)
            self.server = None
            if not os.path.exists(self.sock):
                stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                stale.bind(self.sock)
                stale.close()
        self._drop_plugins()

    def restart(self) -> float:
        """Stop, wipe the directory except the checkpoint, start again. Returns the start time."""
        self.stop()
        for name in os.listdir(self.dir):
            if name != CHECKPOINT:
                os.unlink(os.path.join(self.dir, name))
        self.start()
        return self.started_at

    # ---- registration side -------------------------------------------------------------------
    def _register(self, req: Any, context: Any) -> Any:
        if req.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {req.version!r}")
        path = os.path.join(self.dir, req.endpoint)
        channel = grpc.insecure_channel("unix://" + os.path.abspath(path))
        stub = pb_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        except grpc.RpcError as exc:
            channel.close()
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot reach plugin at {path}: {exc.details()}")
        conn = PluginConn(req.resource_name, req.endpoint, channel, stub, options)
        old = self.plugins.get(req.resource_name)
        if old is not None:
            old.alive = False
            if old.stream is not None:
                old.stream.cancel()
        first = threading.Event()
        conn.stream = stub.ListAndWatch(pb.Empty())
        threading.Thread(target=self._watch, args=(conn, first), daemon=True).start()
        if not first.wait(5):
            conn.stream.cancel()
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "plugin sent no device list within 5 s of ListAndWatch")
        conn.registered_at = time.monotonic()
        with self.cond:
            self.plugins[req.resource_name] = conn
            self.registrations.append((conn.registered_at, req.resource_name, req.endpoint))
            self.cond.notify_all()
        return pb.Empty()

    def _watch(self, conn: PluginConn, first: threading.Event) -> None:
        try:
            for resp in conn.stream:
                with self.cond:
                    conn.devices = {d.ID: d.health for d in resp.devices}
                    conn.ids = [d.ID for d in resp.devices]
                    conn.topology = {d.ID: [n.ID for n in d.topology.nodes] for d in resp.devices}
                    conn.updates += 1
                    self.cond.notify_all()
                first.set()
        except grpc.RpcError:
            pass
        with self.cond:  # the stream ended: the plugin is gone, all its devices are unhealthy
            conn.devices = {i: "Unhealthy" for i in conn.devices}
            self.cond.notify_all()

    # ---- queries --------------------------------------------------------------------------------
    def wait_for(self, predicate: Any, timeout: float = 10.0) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout=timeout)

    def devices(self, resource: str) -> dict[str, str]:
        with self.cond:
            c = self.plugins.get(resource)
            return dict(c.devices) if c else {}

    def allocatable(self, resource: str) -> int:
        return sum(1 for h in self.devices(resource).values() if h == "Healthy")

    def _in_use(self, resource: str) -> set[str]:
        return {i for pod in self.allocated.values() for cont in pod.values() for i in cont.get(resource, ())}

    def release(self, uid: str) -> None:
        """The pod ended: its devices are free again."""
        with self.cond:
            self.allocated.pop(uid, None)
            self.pods.pop(uid, None)

    def forget(self, uid: str) -> None:
        """The pod left this kubelet's pod list (deleted while the kubelet was down) but its devices
        stay allocated: neither offered nor listed by PodResources, until :meth:`release`. A real
        v1.28 kubelet, restarted, admits the pods of its first list from the API server before it
        drops such checkpoint entries (../shared/kubelet/README.md). A pod that finished instead
        (phase Succeeded/Failed in the API) stays listed, with its devices, until then: leave it here."""
        with self.cond:
            self.pods.pop(uid, None)

    def pod_resources(self) -> list[Any]:
        """The PodResources List of this kubelet (as ``fakepodresources.FakePod`` rows)."""
        from fakepodresources import FakePod
        out = []
        with self.cond:
            for uid, (ns, name, regular) in self.pods.items():
                alloc = self.allocated.get(uid) or {}
                out.append(FakePod(ns, name, uid, {c: {r: list(ids) for r, ids in (alloc.get(c) or {}).items()}
                                                   for c in regular}))
        return out

    # ---- admission ------------------------------------------------------------------------------
    def take_up(self, pod: dict[str, Any]) -> None:
        """List a pod (PodResources) without admitting it, as the real kubelet's pod manager holds a
        pod from before its admission: a pod taken up whose admission failed stays listed until its
        Failed status is seen (../shared/kubelet/README.md); :meth:`admit` takes a pod up first."""
        meta, spec = pod["metadata"], pod["spec"]
        with self.cond:
            self.pods[meta["uid"]] = (meta.get("namespace") or "default", meta["name"],
                                      [c["name"] for c in spec["containers"]])

    def admit(self, pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Admit a pod (Kubernetes JSON): allocate every container's devices; returns responses."""
        uid = pod["metadata"]["uid"]
        spec = pod["spec"]
        containers = [(c, True) for c in spec.get("initContainers") or []] + [(c, False) for c in spec["containers"]]
        reuse: dict[str, list[str]] = {}
        meta = pod["metadata"]
        with self.cond:
            self.allocated.setdefault(uid, {})
            self.responses.setdefault(uid, {})
            self.pods[uid] = (meta.get("namespace") or "default", meta["name"], [c["name"] for c in spec["containers"]])
        try:
            for c, is_init in containers:
                limits = (c.get("resources") or {}).get("limits") or {}
                for resource, q in limits.items():
                    n = quantity_to_int(q, resource)
                    if n <= 0 or "/" not in resource or resource.startswith(("cpu", "memory")):
                        continue
                    ids, resp = self._allocate_container(resource, n, reuse.get(resource, []))
                    with self.cond:  # recorded before the next call, as the kubelet's device manager does
                        self.allocated[uid].setdefault(c["name"], {})[resource] = ids
                    self.responses[uid].setdefault(c["name"], {})[resource] = resp
                    if is_init:
                        reuse[resource] = sorted(set(reuse.get(resource, [])) | set(ids))
                    else:
                        reuse[resource] = [i for i in reuse.get(resource, []) if i not in ids]
        except AdmissionError:
            # The real kubelet rejects the pod (status Failed, UnexpectedAdmissionError) but keeps it
            # in its pod manager, so PodResources still lists it, holding nothing, until the pod is
            # deleted (../shared/kubelet/README.md): so does the fake.
            with self.cond:
                self.allocated.pop(uid, None)
                self.responses.pop(uid, None)
            raise
        return self.responses[uid]

    def _allocate_container(self, resource: str, n: int, reusable: list[str]) -> tuple[list[str], Any]:
        with self.cond:
            conn = self.plugins.get(resource)
            if conn is None or not conn.alive:
                raise AdmissionError(f"{resource}: no healthy devices present; plugin not registered")
            free = [i for i, h in conn.devices.items() if h == "Healthy" and i not in self._in_use(resource)]
        if len(reusable) >= n:
            ids = reusable[:n]  # reuse an init container's devices: no GetPreferredAllocation
        else:
            available = sorted(set(free) | set(reusable))
            if len(available) < n:
                raise AdmissionError(f"{resource}: requested {n}, only {len(available)} available")
            self.rng.shuffle(available)
            if conn.options.get_preferred_allocation_available:
                req = pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=list(reusable), allocation_size=n)])
                self.calls.append(("GetPreferredAllocation", resource))
                try:
                    resp = conn.stub.GetPreferredAllocation(req, timeout=10)
                except grpc.RpcError as exc:
                    raise AdmissionError(f"{resource}: GetPreferredAllocation failed: {exc.code().name}: {exc.details()}") from exc
                ids = list(resp.container_responses[0].deviceIDs)
                if len(ids) != n or not set(ids) <= set(available) or not set(reusable) <= set(ids):
                    raise AdmissionError(f"{resource}: bad preferred allocation {ids}")
                self.rng.shuffle(ids)  # used, but not in the order given
            else:
                ids = list(reusable) + [i for i in available if i not in reusable][: n - len(reusable)]
        self.calls.append(("Allocate", resource))
        try:
            resp = conn.stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]),
                                      timeout=10)
        except grpc.RpcError as exc:
            raise AdmissionError(f"{resource}: Allocate failed: {exc.code().name}: {exc.details()}") from exc
        if len(resp.container_responses) != 1:
            raise AdmissionError(f"{resource}: Allocate answered {len(resp.container_responses)} containers, want 1")
        return ids, resp.container_responses[0]

    def call_raw(self, resource: str, method: str, request: Any) -> Any:
        """Send a hand-made request (for bad-request tests)."""
        return getattr(self.plugins[resource].stub, method)(request, timeout=10)


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.k = kubelet

    def Register(self, request: Any, context: Any) -> Any:
        return self.k._register(request, context)
