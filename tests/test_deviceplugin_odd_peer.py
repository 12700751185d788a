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

from dp_harness import bind_pod, container, count_syncs, record, rig

from deviceplugin.v1beta1 import api_pb2 as pb
from deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_MEMORY


def _pending_whole(r: Any) -> dict[str, Any]:
    pod = bind_pod(r, "p", [container("main", gpus=1)], record([(0, r.uuid(0))], whole=True),
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
            syncs = count_syncs(r.plugin)
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


def _refusal(r: Any, resource: str, method: str, request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as exc:
        r.kubelet.call_raw(resource, method, request)
    return exc.value


def test_a_huge_bad_request_is_refused_with_its_own_error_in_bounded_words(monkeypatch, caplog):
    """The refusal named every device ID of the request. Before: 50,000 unknown IDs made a 1 MB
    status message, which gRPC could not deliver (the caller got RESOURCE_EXHAUSTED "received
    metadata size exceeds hard limit" instead of INVALID_ARGUMENT), and a 1 MB log line per call.
    Now a refusal names a few IDs and how many there are."""
    from deviceplugin.server import MAX_DETAILS
    with rig(monkeypatch) as r:
        assert r.registered()
        pod = _pending_whole(r)
        unknown = [f"GPU-nope-{n:06d}" for n in range(50000)]
        core = [i for i in r.kubelet.devices("nvidia.com/gpu-core")]   # 400 real IDs, no pod wants them
        cases = [
            (RESOURCE_GPU, "Allocate", pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=unknown)]), grpc.StatusCode.INVALID_ARGUMENT, "50000"),
            (RESOURCE_GPU, "Allocate", pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[r.uuid(0)] * 50000)]), grpc.StatusCode.INVALID_ARGUMENT,
             "duplicate"),
            ("nvidia.com/gpu-core", "Allocate", pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=core)]), grpc.StatusCode.FAILED_PRECONDITION, "400 devices"),
            (RESOURCE_GPU, "GetPreferredAllocation", pb.PreferredAllocationRequest(container_requests=[
                pb.ContainerPreferredAllocationRequest(available_deviceIDs=unknown, allocation_size=1)]),
             grpc.StatusCode.INVALID_ARGUMENT, "50000"),
        ]
        for resource, method, req, code, says in cases:
            caplog.clear()
            err = _refusal(r, resource, method, req)
            assert err.code() == code, (method, err.code(), err.details()[:300])
            assert says in err.details() and len(err.details()) <= MAX_DETAILS, err.details()[:300]
            logged = [x.getMessage() for x in caplog.records if "refused" in x.getMessage()]
            assert logged and all(len(m) < 20000 for m in logged), [len(m) for m in logged]
        assert r.kubelet.admit(pod)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(0)


def test_one_call_with_many_container_requests_reads_the_nodes_pods_once(monkeypatch):
    """The kubelet sends one container request per call; the API allows many. Before: every
    container request listed the node's pods from the API server and asked PodResources again, so a
    GetPreferredAllocation repeating one request 50 times made 50 of each (4 MiB of requests: tens of
    thousands, the allocation lock held meanwhile). Now a call reads them once."""
    with rig(monkeypatch) as r:
        assert r.registered()
        _pending_whole(r)
        one = pb.ContainerPreferredAllocationRequest(available_deviceIDs=[r.uuid(0), r.uuid(1)], allocation_size=1)

        def reads(n: int) -> tuple[int, int]:
            lists, podres = len(r.kube.list_requests("pods")), r.podres.list_calls
            resp = r.kubelet.call_raw(RESOURCE_GPU, "GetPreferredAllocation",
                                      pb.PreferredAllocationRequest(container_requests=[one] * n))
            assert [list(c.deviceIDs) for c in resp.container_responses] == [[r.uuid(0)]] * n
            return len(r.kube.list_requests("pods")) - lists, r.podres.list_calls - podres
        assert reads(50) == reads(1)


def test_a_refused_allocate_leaves_no_trace_for_the_pod(monkeypatch):
    """An Allocate of two container requests, the first right for a waiting pod and the second
    bad, is refused as a whole. Before: the first one stayed booked to the pod, which then counted
    as served, and its real admission was refused ("no pod waiting")."""
    with rig(monkeypatch) as r:
        assert r.registered()
        pod = _pending_whole(r)
        err = _refusal(r, RESOURCE_GPU, "Allocate", pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[r.uuid(0)]), pb.ContainerAllocateRequest(devices_ids=["nope"])]))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "nope" in err.details()
        assert r.kubelet.admit(pod)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(0)


def test_repeated_available_ids_never_make_an_answer_repeat_a_device(monkeypatch):
    """The kubelet offers each device once. Before: an ID offered twice could be proposed twice
    (a two-card pod was steered to [card 0, card 0])."""
    with rig(monkeypatch) as r:
        assert r.registered()
        pod = bind_pod(r, "two", [container("main", gpus=2)], record([(0, r.uuid(0)), (1, r.uuid(1))], whole=True),
                       "2024-01-01T00:00:01Z")
        r.kubelet.take_up(pod)
        for must in ([], [r.uuid(0), r.uuid(0)]):
            resp = r.kubelet.call_raw(RESOURCE_GPU, "GetPreferredAllocation", pb.PreferredAllocationRequest(
                container_requests=[pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=[r.uuid(0), r.uuid(0), r.uuid(1), r.uuid(2)],
                    must_include_deviceIDs=must, allocation_size=2)]))
            assert sorted(resp.container_responses[0].deviceIDs) == sorted([r.uuid(0), r.uuid(1)]), must


def test_steering_left_by_preferred_calls_without_an_allocate_stays_bounded(monkeypatch):
    """GetPreferredAllocation remembers which pod it steered a device set to, for the Allocate that
    follows. Before: a set never allocated (calls from something other than the kubelet) stayed
    for ever, one entry per distinct set. Now only the latest few are kept."""
    from deviceplugin.server import MAX_STEERED
    with rig(monkeypatch) as r:
        assert r.registered()
        pod = bind_pod(r, "m", [container("main", mem=1)], record([(0, r.uuid(0))], whole=False, mem_mib=1024),
                       "2024-01-01T00:00:01Z")
        r.kubelet.take_up(pod)
        for n in range(MAX_STEERED + 20):   # each offers card 0 from unit n on: steered to unit n
            r.kubelet.call_raw(RESOURCE_GPU_MEMORY, "GetPreferredAllocation", pb.PreferredAllocationRequest(
                container_requests=[pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=[f"{r.uuid(0)}::{k}" for k in range(n, 80)], allocation_size=1)]))
        assert len(r.plugin.allocs._steered) <= MAX_STEERED
        assert r.kubelet.admit(pod)["main"][RESOURCE_GPU_MEMORY].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(0)


@pytest.mark.parametrize("case", ["more must_include than the size", "must_include not offered"])
def test_a_preferred_request_that_contradicts_itself_is_refused_as_such(monkeypatch, case):
    """The kubelet's must_include are the devices a container already has (an init container's),
    always among the available ones and never more than the size. Before: a request breaking that
    was answered FAILED_PRECONDITION "no pod waiting on this node matches", sending whoever reads it
    looking for a pod or record at fault; now it is INVALID_ARGUMENT naming the request's own fault."""
    with rig(monkeypatch) as r:
        assert r.registered()
        pod = _pending_whole(r)
        u = [r.uuid(i) for i in range(4)]
        available, must = (u, u[:2]) if case == "more must_include than the size" else (u[1:], u[:1])
        err = _refusal(r, RESOURCE_GPU, "GetPreferredAllocation", pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, must_include_deviceIDs=must,
                                                   allocation_size=1)]))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
        assert "must_include" in err.details(), err.details()
        assert r.kubelet.admit(pod)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(0)
