"""Client of the kubelet's PodResources API: which device IDs each container was given.

One ``List`` per call over a fresh channel: a scrape every 15-30 s costs one unix-socket connect,
and a kubelet restart (which re-creates the socket) never leaves us on a dead channel waiting out
gRPC's reconnect back-off.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import grpc

from stowage import genprotos

genprotos.ensure("gpunode/podresources/api.proto")
from gpunode.podresources import api_pb2 as pb  # noqa: E402
from gpunode.podresources import api_pb2_grpc as pb_grpc  # noqa: E402

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# The kubelet answers List with up to 16 MiB (its own server limit); gRPC's default is 4 MiB.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ContainerDevices:
    """Device IDs of one resource given to one container (one row of the kubelet's answer)."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


class PodResourcesError(RuntimeError):
    """The kubelet's PodResources API could not be asked; the message says why."""


@dataclass(frozen=True)
class PodList:
    """One ``List`` answer: the device rows (:func:`flatten`) and every pod listed, devices or not.

    The kubelet lists a pod from the moment it takes it up, before its admission allocates any
    device: the device plugin tells by this which pods the kubelet may be admitting right now.
    """

    rows: list[ContainerDevices]
    pods: frozenset[tuple[str, str]]   # (namespace, name)


def list_pods(socket_path: str = DEFAULT_SOCKET, timeout_s: float = 5.0) -> PodList:
    """One ``List`` call: the device rows and the pods listed."""
    if not os.path.exists(socket_path):
        raise PodResourcesError(f"no kubelet PodResources socket at {socket_path} (is the directory mounted?)")
    target = "unix://" + os.path.abspath(socket_path)
    opts = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    try:
        with grpc.insecure_channel(target, options=opts) as channel:
            reply = pb_grpc.PodResourcesListerStub(channel).List(pb.ListPodResourcesRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        raise PodResourcesError(f"PodResources List on {socket_path} failed: {code} {detail}") from exc
    return PodList(flatten(reply), frozenset((p.namespace, p.name) for p in reply.pod_resources))


def list_devices(socket_path: str = DEFAULT_SOCKET, timeout_s: float = 5.0) -> list[ContainerDevices]:
    """All device assignments on this node, flattened to one row per (container, resource)."""
    return list_pods(socket_path, timeout_s).rows


def flatten(reply: "pb.ListPodResourcesResponse") -> list[ContainerDevices]:
    out = []
    for pod in reply.pod_resources:
        for c in pod.containers:
            for d in c.devices:
                if d.device_ids:
                    out.append(ContainerDevices(pod.namespace, pod.name, c.name, d.resource_name, tuple(d.device_ids)))
    return out
