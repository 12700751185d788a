"""The plugin learns what the kubelet allocated (PodResources): plugin restarts, swapped pods, fallback.

Real plugin over real gRPC: the fake kubelet calls it on unix sockets and lists its allocations
on a fake PodResources socket; records are read from and corrected on the fake API server.
"""
from __future__ import annotations

import logging

import grpc
import pytest

from dp_harness import NODE, bind_pod, container, record, rig
from fakekube import make_pod

from deviceplugin.v1beta1 import api_pb2 as pb
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, allocation_of_pod, encode_allocation
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY


def _cards_of(ids):
    return {i.split("::")[0] for i in ids}


def _record_cards(r, pod):
    return allocation_of_pod(r.kube.get_pod("default", pod["metadata"]["name"])).uuids


def test_plugin_restart_between_admission_and_start_does_not_reoffer_the_pod(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        u1 = r.uuid(1)
        p = bind_pod(r, "p", [container("main", mem=4)], record([(1, u1)], whole=False, mem_mib=4096),
                     "2024-01-01T00:00:01Z")
        r.kubelet.admit(p)                      # admitted, devices allocated, container not started
        r.restart_plugin()                      # the new process has no memory of that Allocate
        assert r.registered()
        q = bind_pod(r, "q", [container("main", mem=4)], record([(1, u1)], whole=False, mem_mib=4096),
                     "2024-01-01T00:00:02Z")
        got = r.kubelet.admit(q)["main"][RESOURCE_GPU_MEMORY]
        # without PodResources, p (bound earlier) would look pending and take q's request
        assert got.envs["STOWAGE_POD"] == "default/q"
        # and nobody is left waiting: a further request for p's size on p's card is refused
        req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(
            devices_ids=[f"{u1}::{n}" for n in range(12, 16)])])
        with pytest.raises(grpc.RpcError) as exc:
            r.kubelet.call_raw(RESOURCE_GPU_MEMORY, "Allocate", req)
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "match no pod" in exc.value.details()


def test_restart_with_whole_gpu_pod_and_init_container(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        u3 = r.uuid(3)
        p = bind_pod(r, "p", [container("main", gpus=1)], record([(3, u3)], whole=True, mem_mib=15360),
                     "2024-01-01T00:00:01Z", init=[container("setup", gpus=1)])
        r.kubelet.admit(p)
        r.restart_plugin()
        assert r.registered()
        # the kubelet lists only regular containers; main being listed means setup is done too
        req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[u3])])
        with pytest.raises(grpc.RpcError) as exc:
            r.kubelet.call_raw(RESOURCE_GPU, "Allocate", req)
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def _two_equal_shares(r):
    """Pods a (bound first, on card 2) and b (bound second, on card 0) of one 8-unit share each."""
    u0, u2 = r.uuid(0), r.uuid(2)
    a = bind_pod(r, "a", [container("main", mem=8, core=20)],
                 record([(2, u2)], whole=False, mem_mib=8192, core_milli=200), "2024-01-01T00:00:01Z")
    b = bind_pod(r, "b", [container("main", mem=8, core=20)],
                 record([(0, u0)], whole=False, mem_mib=8192, core_milli=200), "2024-01-01T00:00:02Z")
    return a, b, u0, u2


def test_swapped_pending_pods_get_their_records_corrected(monkeypatch):
    """a is bound first (card 2), b second (card 0); the kubelet has taken both up (it lists both:
    e.g. a's admission failed, and a stays listed until its Failed status is seen) and admits b.
    The plugin cannot tell which of the two equal pods it admits: b is steered to the card of the
    pod bound earliest, and the records follow what the kubelet did."""
    with rig(monkeypatch, reconcile_interval_s=3600, reconcile_after_allocate_s=3600) as r:
        assert r.registered()
        a, b, u0, u2 = _two_equal_shares(r)
        r.kubelet.take_up(a)
        gb = r.kubelet.admit(b)["main"]
        ga = r.kubelet.admit(a)["main"]
        got_card = {}
        for name, pod, got in (("a", a, ga), ("b", b, gb)):
            alloc = r.kubelet.allocated[pod["metadata"]["uid"]]["main"]
            cards = _cards_of(alloc[RESOURCE_GPU_MEMORY]) | _cards_of(alloc[RESOURCE_GPU_CORE])
            assert len(cards) == 1, f"{name}'s memory and core devices are on different cards: {cards}"
            got_card[name] = cards.pop()
            # both resources of the container name the same card (no conflicting envs)
            assert got[RESOURCE_GPU_MEMORY].envs["NVIDIA_VISIBLE_DEVICES"] == got_card[name]
            assert got[RESOURCE_GPU_CORE].envs["NVIDIA_VISIBLE_DEVICES"] == got_card[name]
        # each planned card carries exactly one of the two equal pods: the plan's load is kept
        assert {got_card["a"], got_card["b"]} == {u0, u2}
        assert got_card["b"] == u2  # b was admitted first and was steered to the earliest-bound pod's card
        fixed = r.plugin.reconciler.run_once()
        assert sorted(c.ref for c in fixed) == ["default/a", "default/b"]
        for name, pod in (("a", a), ("b", b)):
            rec = allocation_of_pod(r.kube.get_pod("default", name))
            assert rec.uuids == [got_card[name]]
            index = [c.uuid for c in r.nvml.cards].index(got_card[name])  # fake cards are listed by index
            assert rec.cards[0] == CardShare(index, got_card[name], 8192, 200)  # amounts kept, index follows
        assert r.plugin.reconciler.corrected._value.get() == 2
        # a second round finds nothing to do
        assert r.plugin.reconciler.run_once() == []


def test_reconciler_corrects_on_its_own_after_allocate(monkeypatch):
    with rig(monkeypatch, reconcile_interval_s=3600, reconcile_after_allocate_s=0.05) as r:
        assert r.registered()
        u1, u3 = r.uuid(1), r.uuid(3)
        a = bind_pod(r, "a", [container("main", gpus=1)], record([(1, u1)], whole=True, core_milli=1000),
                     "2024-01-01T00:00:01Z")
        b = bind_pod(r, "b", [container("main", gpus=1)], record([(3, u3)], whole=True, core_milli=1000),
                     "2024-01-01T00:00:02Z")
        r.kubelet.take_up(a)      # listed too: either may be the pod admitted (see the test above)
        r.kubelet.admit(b)
        got_b = r.kubelet.allocated[b["metadata"]["uid"]]["main"][RESOURCE_GPU]
        assert got_b == [u1]
        # b's record follows to the card it got, and a (still pending) moves to the card b left free
        assert r.kube.wait_for(lambda: _record_cards(r, b) == [u1] and _record_cards(r, a) == [u3])
        rec_b = allocation_of_pod(r.kube.get_pod("default", "b"))
        assert rec_b.cards[0].memory_mib == r.nvml.cards[1].memory_mib  # whole card: that card's memory
        # a is then admitted on the card its (corrected) record names, and consistent records stay
        got_a = r.kubelet.admit(a)["main"][RESOURCE_GPU]
        assert got_a.envs["NVIDIA_VISIBLE_DEVICES"] == u3 and got_a.envs["STOWAGE_POD"] == "default/a"
        assert r.plugin.reconciler.run_once() == []


def test_consistent_records_are_never_patched(monkeypatch):
    with rig(monkeypatch, reconcile_interval_s=3600, reconcile_after_allocate_s=3600) as r:
        assert r.registered()
        a = bind_pod(r, "a", [container("main", mem=8, core=20)],
                     record([(2, r.uuid(2))], whole=False, mem_mib=8192, core_milli=200), "2024-01-01T00:00:01Z")
        b = bind_pod(r, "b", [container("main", mem=8, core=20)],
                     record([(0, r.uuid(0))], whole=False, mem_mib=8192, core_milli=200), "2024-01-01T00:00:02Z")
        w = bind_pod(r, "w", [container("main", gpus=1)], record([(1, r.uuid(1))], whole=True), "2024-01-01T00:00:03Z")
        pending = bind_pod(r, "pending", [container("main", gpus=1)], record([(3, r.uuid(3))], whole=True),
                           "2024-01-01T00:00:04Z")
        # a pod of another node whose record (wrongly) names a card here is not ours to touch
        other = make_pod("other", node="gpu-node-2", annotations={ALLOCATION_ANNOTATION: encode_allocation(
            AllocationRecord(node=NODE, whole=True, cards=(CardShare(1, r.uuid(1), 0, 0),)))})
        r.kube.create_pod(other)
        for p in (a, b, w):
            r.kubelet.admit(p)
        before = {p["metadata"]["name"]: r.kube.get_pod("default", p["metadata"]["name"])
                  for p in (a, b, w, pending, other)}
        assert r.plugin.reconciler.run_once() == []
        for name, pod in before.items():
            now = r.kube.get_pod("default", name)
            assert now["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"], name
        assert r.plugin.reconciler.corrected._value.get() == 0


def test_no_podresources_socket_falls_back_to_memory_with_one_log_line(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="stowage.deviceplugin")
    with rig(monkeypatch, podresources=False, reconcile_interval_s=0.05, reconcile_after_allocate_s=0.01) as r:
        assert r.registered()
        u0, u2 = r.uuid(0), r.uuid(2)
        a = bind_pod(r, "a", [container("main", mem=4)], record([(2, u2)], whole=False, mem_mib=4096),
                     "2024-01-01T00:00:01Z")
        b = bind_pod(r, "b", [container("main", mem=4)], record([(0, u0)], whole=False, mem_mib=4096),
                     "2024-01-01T00:00:02Z")
        # the in-memory count still serves pods in bind order
        assert r.kubelet.admit(a)["main"][RESOURCE_GPU_MEMORY].envs["STOWAGE_POD"] == "default/a"
        assert r.kubelet.admit(b)["main"][RESOURCE_GPU_MEMORY].envs["STOWAGE_POD"] == "default/b"
        rounds = r.plugin.reconciler.rounds
        assert r.kube.wait_for(lambda: r.plugin.reconciler.rounds >= rounds + 3)  # reconciler keeps asking
        assert r.plugin.reconciler.run_once() == []
    fallback = [rec for rec in caplog.records if "falling back" in rec.getMessage()]
    assert len(fallback) == 1, [rec.getMessage() for rec in fallback]
    assert "no kubelet PodResources socket" in fallback[0].getMessage()
    assert fallback[0].levelno == logging.WARNING


def test_pods_admitted_out_of_bind_order_each_get_their_own_card(monkeypatch):
    """a is bound first (card 2), b second (card 0), and the kubelet admits b first. It lists only
    the pod it takes up (PodResources), so b is the one: it gets its own card, a then its own, and
    there is nothing to correct. (Before, b was steered to a's card, the pod bound earliest, and
    both records were rewritten.)"""
    with rig(monkeypatch, reconcile_interval_s=3600, reconcile_after_allocate_s=3600) as r:
        assert r.registered()
        a, b, u0, u2 = _two_equal_shares(r)
        assert r.kubelet.admit(b)["main"][RESOURCE_GPU_MEMORY].envs["NVIDIA_VISIBLE_DEVICES"] == u0
        assert r.kubelet.admit(a)["main"][RESOURCE_GPU_MEMORY].envs["NVIDIA_VISIBLE_DEVICES"] == u2
        assert r.plugin.reconciler.run_once() == []
