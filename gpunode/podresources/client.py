"""Client of the kubelet's PodResources API: which device IDs each container was given.

One ``List`` per call over a fresh channel: a scrape every 15-30 s costs one unix-socket connect,
and a kubelet restart (which re-creates the socket) never leaves us on a dead channel waiting out
gRPC's reconnect back-off.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from stowage import genprotos

genprotos.ensure("gpunode/podresources/api.proto")
from gpunode.podresources import api_pb2 as pb  # noqa: E402

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


def _lenient(message: str) -> Any:
    """The class of ``v1.<message>`` with every ``string`` field read as ``bytes``.

    Protobuf refuses a whole message when one ``string`` field is not UTF-8: one such pod name in a
    ``List`` answer (not from a real kubelet, whose Go protobuf cannot send one, but from whatever
    serves the socket) failed the whole list, and every pod of the node lost what PodResources
    tells the device plugin. On the wire ``string`` and ``bytes`` are the same, so this reads the
    same answer and leaves the decoding to :func:`_str`, field by field.
    """
    fd = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(fd)
    fd.name, fd.package = "stowage/podresources_lenient.proto", "v1lenient"
    del fd.service[:]
    for m in fd.message_type:
        for f in m.field:
            if f.type == descriptor_pb2.FieldDescriptorProto.TYPE_STRING:
                f.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
            if f.type_name.startswith(".v1."):
                f.type_name = ".v1lenient." + f.type_name[len(".v1."):]
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("v1lenient." + message))


_LenientListResponse = _lenient("ListPodResourcesResponse")


def _str(value: Any) -> str:
    """A field read by the lenient class: its text, bytes that are not UTF-8 escaped (``\\xff``). An
    escaped name can be no API server pod's (names are DNS labels), and an escaped device ID or
    resource is none this node advertises: the entry keeps its devices held, and names no other pod."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, (bytes, bytearray)) else str(value)


def list_pods(socket_path: str = DEFAULT_SOCKET, timeout_s: float = 5.0) -> PodList:
    """One ``List`` call: the device rows and the pods listed."""
    if not os.path.exists(socket_path):
        raise PodResourcesError(f"no kubelet PodResources socket at {socket_path} (is the directory mounted?)")
    target = "unix://" + os.path.abspath(socket_path)
    opts = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    try:
        with grpc.insecure_channel(target, options=opts) as channel:
            call = channel.unary_unary("/v1.PodResourcesLister/List",
                                       request_serializer=pb.ListPodResourcesRequest.SerializeToString,
                                       response_deserializer=_LenientListResponse.FromString)
            reply = call(pb.ListPodResourcesRequest(), timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        detail = exc.details() if hasattr(exc, "details") else str(exc)
        raise PodResourcesError(f"PodResources List on {socket_path} failed: {code} {detail}") from exc
    return PodList(flatten(reply), frozenset((_str(p.namespace), _str(p.name)) for p in reply.pod_resources))


def list_devices(socket_path: str = DEFAULT_SOCKET, timeout_s: float = 5.0) -> list[ContainerDevices]:
    """All device assignments on this node, flattened to one row per (container, resource)."""
    return list_pods(socket_path, timeout_s).rows


def flatten(reply: Any) -> list[ContainerDevices]:
    """One row per (container, resource) of a ``List`` answer, read by the generated class or the
    lenient one (whose text fields are bytes)."""
    out = []
    for pod in reply.pod_resources:
        for c in pod.containers:
            for d in c.devices:
                if d.device_ids:
                    out.append(ContainerDevices(_str(pod.namespace), _str(pod.name), _str(c.name),
                                                _str(d.resource_name), tuple(_str(i) for i in d.device_ids)))
    return out
