"""A peer on the plugin's sockets that is not the kubelet, or a kubelet that answers oddly.

Anything that can reach ``/var/lib/kubelet/device-plugins`` can call the plugin, and the kubelet's
registration server may refuse us. Bad input gets a clear error for that request only: no hang,
no spin, no unbounded work or memory, no state that hurts the next pod. The kubelet's own pattern
(../shared/kubelet/README.md) is one container request per call, one ListAndWatch per
registration; each test breaks one of those assumptions and then checks the real admission path.
"""
from __future__ import annotations

import logging
import os
import threading
from concurrent import futures
from typing import Any

import grpc
import pytest

from dp_harness import bind_pod, container, record, rig

from deviceplugin.v1beta1 import api_pb2 as pb
from deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_MEMORY


def _count_syncs(plugin: Any) -> list[int]:
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


def _pending_whole(r: Any, name: str = "p", card: int = 0) -> dict[str, Any]:
    pod = bind_pod(r, name, [container("main", gpus=1)], record([(card, r.uuid(card))], whole=True),
                   "2024-01-01T00:00:01Z")
    r.kubelet.take_up(pod)   # listed by PodResources, as the kubelet does before it calls the plugin
    return pod


class _RefusingRegistration(pb_grpc.RegistrationServicer):
    """A live kubelet whose Register answers an error at once (a version it does not support, a
    plugin socket it cannot dial from its mount namespace, ...)."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def Register(self, request: Any, context: Any) -> Any:
        with self.lock:
            self.calls += 1
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the kubelet says no")


def test_a_register_the_live_kubelet_refuses_is_retried_after_the_delay_not_at_every_poll(monkeypatch, caplog):
    """Before: kubelet.sock accepting connections counted as "the kubelet is back", so a kubelet that
    answers Register with an error got a Register every 20 ms poll, each with a warning (226 in 2 s).
    The early retry is for a kubelet seen down (kubelet.sock refusing or missing) that comes back."""
    import deviceplugin.server as server
    monkeypatch.setattr(server, "REGISTER_RETRY_S", 60.0)   # far from the polls whatever the load
    caplog.set_level(logging.DEBUG)
    with rig(monkeypatch, start_kubelet=False) as r:
        os.makedirs(r.dir, exist_ok=True)
        reg = _RefusingRegistration()
        refusing = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(reg, refusing)
        refusing.add_insecure_port("unix://" + os.path.abspath(r.kubelet.sock))
        refusing.start()
        try:
            syncs = _count_syncs(r.plugin)
            assert r.kube.wait_for(lambda: reg.calls >= 3)   # each resource tried once
            start = syncs[0]
            assert r.kube.wait_for(lambda: syncs[0] >= start + 50)   # 50 polls, the kubelet still accepting
            assert reg.calls == 3, f"{reg.calls} Register calls"
            loud = [x.getMessage() for x in caplog.records if x.levelno >= logging.WARNING and "registration" in x.getMessage()]
            assert len(loud) == 3 and all("the kubelet says no" in m for m in loud), loud
        finally:
            refusing.stop(grace=0).wait(2)   # gRPC removes its socket: kubelet.sock missing, the kubelet is down
        start = syncs[0]
        assert r.kube.wait_for(lambda: syncs[0] >= start + 5)
        r.kubelet.start()                    # a kubelet that accepts us: registered at once, not in 60 s
        assert r.registered()


def test_list_and_watch_streams_are_capped_so_the_kubelets_calls_are_always_answered(monkeypatch):
    """Each open ListAndWatch holds one of the endpoint's 16 gRPC workers for as long as it lasts.
    Before: 16 streams opened by anyone (or never read) left no worker, and the kubelet's
    GetDevicePluginOptions and Allocate waited for ever. Now streams past MAX_STREAMS are refused
    (RESOURCE_EXHAUSTED), the kubelet's own stream is untouched, and a closed stream frees its slot."""
    from deviceplugin.server import MAX_STREAMS
    with rig(monkeypatch) as r:
        assert r.registered()
        pod = _pending_whole(r)
        ep = next(e for e in r.plugin.endpoints if e.resource == RESOURCE_GPU)
        ch = grpc.insecure_channel("unix://" + os.path.abspath(ep.path))
        stub = pb_grpc.DevicePluginStub(ch)
        try:
            opened = [stub.ListAndWatch(pb.Empty()) for _ in range(20)]   # never read past the first list
            refused = 0
            for s in opened:
                try:
                    next(s)
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    assert "ListAndWatch" in exc.details()
                    refused += 1
            assert refused == 20 - (MAX_STREAMS - 1)   # the kubelet holds one stream already
            # the kubelet is served: its stream still carries lists, and the pod is admitted
            assert r.kubelet.plugins[RESOURCE_GPU].alive
            got = r.kubelet.admit(pod)["main"][RESOURCE_GPU]
            assert got.envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(0)
            for s in opened:
                s.cancel()

            def reopened() -> bool:   # the cancelled streams' slots come free
                s = stub.ListAndWatch(pb.Empty())
                try:
                    return len(next(s).devices) == 4
                except grpc.RpcError:
                    return False
                finally:
                    s.cancel()
            assert r.kube.wait_for(reopened)
        finally:
            ch.close()
