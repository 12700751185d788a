"""A PodResources ``List`` answer with one entry that is not UTF-8 (a peer that is not the kubelet).

Protobuf refuses a whole message whose ``string`` fields are not UTF-8: before, one such pod name
failed the whole ``List`` (``INTERNAL: Exception deserializing response``), and the plugin fell
back to its in-memory count for every pod of the node: no record corrections, no check that a
pod being admitted is one the kubelet lists, no card held by a pod admitted before a plugin
restart. Now such a field is read with its bad bytes escaped (``\\xff``): the entry keeps what it
holds (its devices stay held, by a pod no API server pod can be named like), and the others are
read as they are.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from concurrent import futures
from typing import Any, Callable

import grpc

from dp_harness import rig
from fakepodresources import FakePod, FakePodResources
from test_deviceplugin_podresources import _cards_of, _two_equal_shares

from deviceplugin.podres import KubeletAllocations
from gpunode.podresources import api_pb2 as pb
from gpunode.podresources.client import list_pods
from stowage.allocation import allocation_of_pod
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_MEMORY

BAD = b"\xff\xfe"


class OddPodResources:
    """A PodResources server that answers with raw bytes: the pods of ``source()`` as the kubelet
    lists them, and ``odd`` pods whose name has bytes that are not UTF-8 in it."""

    def __init__(self, source: Callable[[], list[FakePod]] = list) -> None:
        self.dir = tempfile.mkdtemp(prefix="podres-odd-")
        self.sock = os.path.join(self.dir, "kubelet.sock")
        self.source = source
        self.odd: list[FakePod] = []   # names with "@@" where the bad bytes go
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(self._list)})])
        self.server.add_insecure_port("unix://" + self.sock)
        self.server.start()

    def _list(self, request: bytes, context: Any) -> bytes:
        pods = list(self.source()) + self.odd
        raw = pb.ListPodResourcesResponse(pod_resources=[FakePodResources._pod(None, p) for p in pods])
        return raw.SerializeToString().replace(b"@@", BAD)   # same length: the framing stays right

    def close(self) -> None:
        self.server.stop(None)
        shutil.rmtree(self.dir, ignore_errors=True)


def test_an_entry_that_is_not_utf8_spoils_that_entry_only():
    srv = OddPodResources(lambda: [FakePod("default", "good", "u1", {"main": {RESOURCE_GPU: ["GPU-a"]}})])
    srv.odd = [FakePod("default", "odd@@pod", "u2", {"c@@": {RESOURCE_GPU: ["GPU-b"], "x@@": ["GPU-c"]}})]
    try:
        listed = list_pods(srv.sock)
        assert ("default", "good") in listed.pods and ("default", "odd\\xff\\xfepod") in listed.pods
        rows = {(r.pod, r.container, r.resource): r.device_ids for r in listed.rows}
        assert rows == {("good", "main", RESOURCE_GPU): ("GPU-a",),
                        ("odd\\xff\\xfepod", "c\\xff\\xfe", RESOURCE_GPU): ("GPU-b",),   # still held
                        ("odd\\xff\\xfepod", "c\\xff\\xfe", "x\\xff\\xfe"): ("GPU-c",)}
        source = KubeletAllocations(srv.sock)
        assert source.listing() is not None and source.available is True
    finally:
        srv.close()


def test_records_are_still_corrected_beside_an_entry_that_is_not_utf8(monkeypatch):
    """The swapped pending pods of test_deviceplugin_podresources, with an odd entry in the list."""
    srv = OddPodResources()
    try:
        with rig(monkeypatch, pod_resources_socket=srv.sock, reconcile_interval_s=3600,
                 reconcile_after_allocate_s=3600) as r:
            srv.source = r.kubelet.pod_resources
            srv.odd = [FakePod("default", "stray@@", "u-stray", {"main": {RESOURCE_GPU: [r.uuid(3)]}})]
            assert r.registered()
            a, b, u0, u2 = _two_equal_shares(r)
            r.kubelet.take_up(a)
            r.kubelet.admit(b)
            r.kubelet.admit(a)
            got = {name: _cards_of(r.kubelet.allocated[p["metadata"]["uid"]]["main"][RESOURCE_GPU_MEMORY])
                   for name, p in (("a", a), ("b", b))}
            fixed = r.plugin.reconciler.run_once()
            assert sorted(c.ref for c in fixed) == ["default/a", "default/b"]
            for name in ("a", "b"):
                assert set(allocation_of_pod(r.kube.get_pod("default", name)).uuids) == got[name]
            assert r.plugin.allocs.kubelet.available is True
    finally:
        srv.close()
