"""GetPreferredAllocation / Allocate through the fake kubelet: whole, shared, multi-container, two pods, errors."""
from __future__ import annotations

import grpc
import pytest

from dp_harness import bind_pod, container, record, rig
from fakekubelet import AdmissionError

from deviceplugin.v1beta1 import api_pb2 as pb
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY


def _cards_of(ids):
    return {i.split("::")[0] for i in ids}


def test_whole_gpu_pod_gets_its_recorded_card(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        u2 = r.uuid(2)
        pod = bind_pod(r, "whole", [container("main", gpus=1)], record([(2, u2)], whole=True, mem_mib=23028, core_milli=1000),
                       "2024-01-01T00:00:01Z")
        resp = r.kubelet.admit(pod)["main"][RESOURCE_GPU]
        assert r.kubelet.allocated[pod["metadata"]["uid"]]["main"][RESOURCE_GPU] == [u2]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == u2
        assert resp.envs["STOWAGE_POD"] == "default/whole"
        # device specs only for nodes that exist under the dev root (no nvidia-uvm there)
        assert sorted(d.container_path for d in resp.devices) == ["/dev/nvidia2", "/dev/nvidiactl"]
        assert ("GetPreferredAllocation", RESOURCE_GPU) in r.kubelet.calls


def test_two_card_whole_pod(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        rec = record([(0, r.uuid(0)), (1, r.uuid(1))], whole=True, mem_mib=81920, core_milli=1000)
        pod = bind_pod(r, "pair", [container("main", gpus=2)], rec, "2024-01-01T00:00:01Z")
        resp = r.kubelet.admit(pod)["main"][RESOURCE_GPU]
        assert set(resp.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == {r.uuid(0), r.uuid(1)}
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"].split(",") == [r.uuid(0), r.uuid(1)]  # record order


def test_shared_pod_memory_and_core(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        u1 = r.uuid(1)
        pod = bind_pod(r, "share", [container("main", mem=10, core=30)],
                       record([(1, u1)], whole=False, mem_mib=10240, core_milli=300), "2024-01-01T00:00:01Z")
        got = r.kubelet.admit(pod)["main"]
        alloc = r.kubelet.allocated[pod["metadata"]["uid"]]["main"]
        assert len(alloc[RESOURCE_GPU_MEMORY]) == 10 and _cards_of(alloc[RESOURCE_GPU_MEMORY]) == {u1}
        assert len(alloc[RESOURCE_GPU_CORE]) == 30 and _cards_of(alloc[RESOURCE_GPU_CORE]) == {u1}
        mem, core = got[RESOURCE_GPU_MEMORY], got[RESOURCE_GPU_CORE]
        assert mem.envs["NVIDIA_VISIBLE_DEVICES"] == u1 and core.envs["NVIDIA_VISIBLE_DEVICES"] == u1
        assert mem.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
        assert core.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
        assert "/dev/nvidia1" in [d.host_path for d in mem.devices]


def test_multi_container_pod_each_container_its_own_limit(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        u0 = r.uuid(0)
        pod = bind_pod(r, "multi", [container("a", mem=4), container("b", mem=6)],
                       record([(0, u0)], whole=False, mem_mib=10240), "2024-01-01T00:00:01Z")
        got = r.kubelet.admit(pod)
        assert got["a"][RESOURCE_GPU_MEMORY].envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
        assert got["b"][RESOURCE_GPU_MEMORY].envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M"
        alloc = r.kubelet.allocated[pod["metadata"]["uid"]]
        assert _cards_of(alloc["a"][RESOURCE_GPU_MEMORY] + alloc["b"][RESOURCE_GPU_MEMORY]) == {u0}
        assert not set(alloc["a"][RESOURCE_GPU_MEMORY]) & set(alloc["b"][RESOURCE_GPU_MEMORY])
        assert [c for c in r.kubelet.calls if c[0] == "Allocate"] == [("Allocate", RESOURCE_GPU_MEMORY)] * 2


def test_init_container_devices_reused_without_preferred_call(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        u3 = r.uuid(3)
        pod = bind_pod(r, "init", [container("main", gpus=1)], record([(3, u3)], whole=True, mem_mib=15360),
                       "2024-01-01T00:00:01Z", init=[container("setup", gpus=1)])
        got = r.kubelet.admit(pod)
        assert got["setup"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u3
        assert got["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u3
        assert r.kubelet.calls == [("GetPreferredAllocation", RESOURCE_GPU), ("Allocate", RESOURCE_GPU), ("Allocate", RESOURCE_GPU)]


def test_two_pending_pods_same_size_different_cards_each_get_their_own(monkeypatch):
    """The gpushare failure: two pods of equal size bound to one node before either is admitted."""
    with rig(monkeypatch) as r:
        assert r.registered()
        u0, u2 = r.uuid(0), r.uuid(2)
        a = bind_pod(r, "a", [container("main", mem=8, core=20)], record([(2, u2)], whole=False, mem_mib=8192, core_milli=200),
                     "2024-01-01T00:00:01Z")
        b = bind_pod(r, "b", [container("main", mem=8, core=20)], record([(0, u0)], whole=False, mem_mib=8192, core_milli=200),
                     "2024-01-01T00:00:02Z")
        ga = r.kubelet.admit(a)["main"]
        gb = r.kubelet.admit(b)["main"]
        for got, pod, card in ((ga, a, u2), (gb, b, u0)):
            alloc = r.kubelet.allocated[pod["metadata"]["uid"]]["main"]
            assert _cards_of(alloc[RESOURCE_GPU_MEMORY]) == {card} and _cards_of(alloc[RESOURCE_GPU_CORE]) == {card}
            assert got[RESOURCE_GPU_MEMORY].envs["NVIDIA_VISIBLE_DEVICES"] == card
            assert got[RESOURCE_GPU_MEMORY].envs["STOWAGE_POD"] == f"default/{pod['metadata']['name']}"


def test_two_whole_pods_pending_each_on_its_card(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        a = bind_pod(r, "a", [container("main", gpus=1)], record([(1, r.uuid(1))], whole=True), "2024-01-01T00:00:01Z")
        b = bind_pod(r, "b", [container("main", gpus=1)], record([(3, r.uuid(3))], whole=True), "2024-01-01T00:00:01Z")
        # both cards are free and offered to either pod: only the record tells the plugin which is whose
        assert r.kubelet.admit(a)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(1)
        assert r.kubelet.admit(b)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(3)


def test_interchangeable_pods_on_same_card(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        u1 = r.uuid(1)
        pods = [bind_pod(r, f"p{i}", [container("main", mem=5)], record([(1, u1)], whole=False, mem_mib=5120),
                         "2024-01-01T00:00:01Z") for i in range(3)]
        for p in pods:
            alloc = r.kubelet.admit(p)["main"]
            assert alloc[RESOURCE_GPU_MEMORY].envs["NVIDIA_VISIBLE_DEVICES"] == u1
        used = [i for p in pods for i in r.kubelet.allocated[p["metadata"]["uid"]]["main"][RESOURCE_GPU_MEMORY]]
        assert len(set(used)) == 15 and _cards_of(used) == {u1}


def test_pod_without_record_is_refused_clearly(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        pod = bind_pod(r, "norecord", [container("main", gpus=1)], None, "2024-01-01T00:00:01Z")
        with pytest.raises(AdmissionError) as exc:
            r.kubelet.admit(pod)
        msg = str(exc.value)
        assert "FAILED_PRECONDITION" in msg and "default/norecord" in msg and "no stowage.io/allocation record" in msg


def test_size_mismatch_refused(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        # the only pending pod needs 4 units: a request for 6 matches no record
        four = bind_pod(r, "four", [container("main", mem=4)], record([(0, r.uuid(0))], whole=False, mem_mib=4096),
                        "2024-01-01T00:00:01Z")
        r.kubelet.take_up(four)   # as the kubelet does before it calls the plugin for a pod
        req = pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=[f"{r.uuid(0)}::{n}" for n in range(10)], allocation_size=6)])
        with pytest.raises(grpc.RpcError) as exc:
            r.kubelet.call_raw(RESOURCE_GPU_MEMORY, "GetPreferredAllocation", req)
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "6 device(s)" in exc.value.details() and "default/four (next container needs 4" in exc.value.details()
        areq = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(
            devices_ids=[f"{r.uuid(0)}::{n}" for n in range(6)])])
        with pytest.raises(grpc.RpcError) as exc:
            r.kubelet.call_raw(RESOURCE_GPU_MEMORY, "Allocate", areq)
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "match no pod" in exc.value.details()


def test_wrong_card_and_unknown_ids_refused(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        pod = bind_pod(r, "p", [container("main", mem=2)], record([(0, r.uuid(0))], whole=False, mem_mib=2048),
                       "2024-01-01T00:00:01Z")
        wrong = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(
            devices_ids=[f"{r.uuid(1)}::0", f"{r.uuid(1)}::1"])])
        with pytest.raises(grpc.RpcError) as exc:
            r.kubelet.call_raw(RESOURCE_GPU_MEMORY, "Allocate", wrong)
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert r.uuid(1) in exc.value.details() and "default/p" in exc.value.details()
        unknown = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["GPU-nope::0", "x"])])
        with pytest.raises(grpc.RpcError) as exc:
            r.kubelet.call_raw(RESOURCE_GPU_MEMORY, "Allocate", unknown)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "GPU-nope::0" in exc.value.details()
        beyond = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[f"{r.uuid(3)}::15"])])
        with pytest.raises(grpc.RpcError) as exc:  # T4 has units 0..14 only
            r.kubelet.call_raw(RESOURCE_GPU_MEMORY, "Allocate", beyond)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # other spellings of an advertised unit were never advertised: a leading zero made '::01' a
        # second device next to '::1', and a non-ASCII digit ('::\u00b2') failed UNKNOWN in int()
        for alias in ([f"{r.uuid(0)}::1", f"{r.uuid(0)}::01"], [f"{r.uuid(0)}::\u00b2"], [f"{r.uuid(0)}::\u0661"],
                      [f"{r.uuid(0)}::+1"], [f"{r.uuid(0)}:: 1"]):
            req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=alias)])
            with pytest.raises(grpc.RpcError) as exc:
                r.kubelet.call_raw(RESOURCE_GPU_MEMORY, "Allocate", req)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (alias, exc.value.details())
            assert alias[-1] in exc.value.details()
        # the refusals did not consume the pod: it is still admitted on its card
        got = r.kubelet.admit(pod)["main"][RESOURCE_GPU_MEMORY]
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(0)


def test_record_for_other_node_is_refused(monkeypatch):
    from stowage.allocation import AllocationRecord, CardShare, encode_allocation
    with rig(monkeypatch) as r:
        assert r.registered()
        rec = encode_allocation(AllocationRecord(node="elsewhere", whole=True, cards=(CardShare(0, r.uuid(0), 0, 0),)))
        pod = bind_pod(r, "lost", [container("main", gpus=1)], rec, "2024-01-01T00:00:01Z")
        with pytest.raises(AdmissionError) as exc:
            r.kubelet.admit(pod)
        assert "elsewhere" in str(exc.value)


def test_no_free_device_means_no_plugin_call(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        pod = bind_pod(r, "big", [container("main", gpus=5)], None, "2024-01-01T00:00:01Z")
        with pytest.raises(AdmissionError):
            r.kubelet.admit(pod)
        assert r.kubelet.calls == []


def test_an_admitted_pod_is_never_a_candidate_even_when_the_kubelet_does_not_list_it():
    """A restarted kubelet re-adds pods one at a time and PodResources lists only those re-added so
    far; a running pod (status.startTime set) it has not re-added yet must not be mistaken for the
    pod being admitted, or the new pod gets the running pod's card (issue 11, bug 1)."""
    from deviceplugin import allocator
    from gpunode.devices import DeviceTable
    from gpunode.nvml import GpuInfo
    from deviceplugin.corrections import KubeletView
    from dp_harness import NODE

    table = DeviceTable([GpuInfo(0, "GPU-0", "NVIDIA A100", 81920), GpuInfo(1, "GPU-1", "NVIDIA A100", 81920)], 1024)

    def pod(name, card, bound_at, started):
        p = {"metadata": {"name": name, "namespace": "ns", "uid": name,
                          "annotations": {"stowage.io/allocation": record([(card, f"GPU-{card}")], whole=False,
                                                                          mem_mib=4096, core_milli=100)}},
             "spec": {"nodeName": NODE, "containers": [container("main", mem=4, core=10)]},
             "status": {"phase": "Running" if started else "Pending",
                        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": bound_at}]}}
        if started:
            p["status"]["startTime"] = bound_at
        return p

    pods = [pod("running", 0, "2026-01-01T00:00:01Z", True), pod("new", 1, "2026-01-01T00:00:09Z", False)]
    empty = KubeletView({}, frozenset({("ns", "new")}))   # the running pod is not re-added yet; "new" is taken up
    found = allocator.survey(pods, NODE, RESOURCE_GPU_MEMORY, allocator.Ledger(), empty)
    assert [c.name for c in found.candidates] == ["new"]
    offered = [d.id for d in table.devices(RESOURCE_GPU_MEMORY, {"GPU-0": True, "GPU-1": True})]
    cand, ids = allocator.preferred(table, RESOURCE_GPU_MEMORY, offered, [], 4, found)
    assert cand.name == "new" and _cards_of(ids) == {"GPU-1"}
    # listed, the running pod is still no candidate; without startTime (not admitted yet) it is
    # one again: the check is startTime
    both = KubeletView({}, frozenset({("ns", "new"), ("ns", "running")}))
    found = allocator.survey(pods, NODE, RESOURCE_GPU_MEMORY, allocator.Ledger(), both)
    assert [c.name for c in found.candidates] == ["new"]
    pods[0]["status"].pop("startTime")
    found = allocator.survey(pods, NODE, RESOURCE_GPU_MEMORY, allocator.Ledger(), both)
    assert [c.name for c in found.candidates] == ["running", "new"]
