"""An Allocate the plugin answered but the kubelet never took up must not count the container as served.

Such an answer comes from another caller of the plugin's socket, or is cut off when a restarting
kubelet deletes the socket and the plugin serves it again. Before, the plugin's ledger of answered
Allocate calls counted it (``max(ledger, listed)``), so the pod's real admission was then refused
("no pod waiting on this node matches"). The kubelet's PodResources list is what says a regular
container has its devices; the ledger remains the only record of init containers (a v1.28 kubelet
does not list them), so their reuse must keep working.
"""
from __future__ import annotations

import grpc
import pytest

from dp_harness import bind_pod, container, record, rig

from deviceplugin.v1beta1 import api_pb2 as pb
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_MEMORY


def _allocate(r, resource, ids):
    """An Allocate whose answer the kubelet never records (another caller, or one cut off)."""
    req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
    return r.kubelet.call_raw(resource, "Allocate", req).container_responses[0]


def test_lost_allocate_does_not_block_the_pods_real_admission(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        u0 = r.uuid(0)
        pod = bind_pod(r, "w", [container("main", gpus=1)], record([(0, u0)], whole=True), "2024-01-01T00:00:01Z")
        r.kubelet.take_up(pod)
        assert _allocate(r, RESOURCE_GPU, [u0]).envs["NVIDIA_VISIBLE_DEVICES"] == u0
        got = r.kubelet.admit(pod)["main"][RESOURCE_GPU]
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == u0 and got.envs["STOWAGE_POD"] == "default/w"
        assert r.kubelet.allocated[pod["metadata"]["uid"]]["main"][RESOURCE_GPU] == [u0]


def test_lost_share_allocate_does_not_block_the_pods_real_admission(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        u1 = r.uuid(1)
        share = record([(1, u1)], whole=False, mem_mib=4096)
        r.kubelet.take_up(pod := bind_pod(r, "s", [container("main", mem=4)], share, "2024-01-01T00:00:01Z"))
        _allocate(r, RESOURCE_GPU_MEMORY, [f"{u1}::{n}" for n in range(4)])
        got = r.kubelet.admit(pod)["main"][RESOURCE_GPU_MEMORY]
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == u1
        assert got.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"


def test_lost_init_container_allocate_keeps_init_reuse_working(monkeypatch):
    """The init container's answer was lost; the kubelet then admits the pod whole: its init container
    (GetPreferredAllocation + Allocate) and the main container reusing those devices (Allocate only)."""
    with rig(monkeypatch) as r:
        assert r.registered()
        u3 = r.uuid(3)
        pod = bind_pod(r, "init", [container("main", gpus=1)], record([(3, u3)], whole=True),
                       "2024-01-01T00:00:01Z", init=[container("setup", gpus=1)])
        r.kubelet.take_up(pod)
        _allocate(r, RESOURCE_GPU, [u3])
        got = r.kubelet.admit(pod)
        assert got["setup"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u3
        assert got["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u3


def test_init_container_reuse_with_a_larger_main_container(monkeypatch):
    """Init 1 card, main 2 (one reused, one new): the ledger's init entry still counts until the kubelet lists main."""
    with rig(monkeypatch) as r:
        assert r.registered()
        u0, u1 = r.uuid(0), r.uuid(1)
        pod = bind_pod(r, "grow", [container("main", gpus=2)], record([(0, u0), (1, u1)], whole=True),
                       "2024-01-01T00:00:01Z", init=[container("setup", gpus=1)])
        got = r.kubelet.admit(pod)
        assert got["setup"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] in (u0, u1)
        assert got["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == f"{u0},{u1}"


def _admitted_and_replayed(r):
    """A whole-card pod on card 0 admitted by the kubelet; an Allocate replaying its device is refused."""
    u0 = r.uuid(0)
    pod = bind_pod(r, "w", [container("main", gpus=1)], record([(0, u0)], whole=True), "2024-01-01T00:00:01Z")
    r.kubelet.admit(pod)
    with pytest.raises(grpc.RpcError) as err:
        _allocate(r, RESOURCE_GPU, [u0])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    return pod


def test_an_admitted_container_is_not_served_again(monkeypatch):
    """What the kubelet lists stays served: a replayed Allocate of an admitted pod's devices is refused,
    and a second pod cannot be answered onto the card the first one holds."""
    with rig(monkeypatch) as r:
        assert r.registered()
        _admitted_and_replayed(r)
        other = bind_pod(r, "w2", [container("main", gpus=1)], record([(0, r.uuid(0))], whole=True),
                         "2024-01-01T00:00:02Z")
        r.kubelet.take_up(other)
        with pytest.raises(grpc.RpcError) as err:
            _allocate(r, RESOURCE_GPU, [r.uuid(0)])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "already holds" in err.value.details()


def test_without_podresources_the_ledger_still_counts_answers(monkeypatch):
    """The fallback has nothing else to go by: an answered Allocate counts, so an admitted pod is not
    served twice (the lost-answer case stays a documented limit there)."""
    with rig(monkeypatch, podresources=False) as r:
        assert r.registered()
        _admitted_and_replayed(r)


def test_a_lost_move_does_not_outlive_its_answer(monkeypatch):
    """A pod moved off a card the kubelet did not offer (its checkpoint still gave it to a pod deleted
    while it was down), by an answer the kubelet never took up, is judged afresh from its record when
    the kubelet asks again: by then its own card is free, and the card it was moved to is another
    pod's."""
    with rig(monkeypatch) as r:
        assert r.registered()
        u0, u1 = r.uuid(0), r.uuid(1)
        whole = lambda i: record([(i, r.uuid(i))], whole=True, mem_mib=r.nvml.cards[i].memory_mib, core_milli=1000)
        old = bind_pod(r, "old", [container("main", gpus=1)], whole(0), "2024-01-01T00:00:01Z")
        r.kubelet.admit(old)
        r.kube.delete_pod("default", "old")
        r.kubelet.forget(old["metadata"]["uid"])       # gone, but the kubelet still holds card 0
        new = bind_pod(r, "new", [container("main", gpus=1)], whole(0), "2024-01-01T00:00:02Z")
        r.kubelet.take_up(new)
        offered = [r.uuid(i) for i in (1, 2, 3)]
        hint = r.kubelet.call_raw(RESOURCE_GPU, "GetPreferredAllocation", pb.PreferredAllocationRequest(
            container_requests=[pb.ContainerPreferredAllocationRequest(available_deviceIDs=offered, allocation_size=1)]))
        assert list(hint.container_responses[0].deviceIDs) == [u1]   # moved to card 0's twin
        assert _allocate(r, RESOURCE_GPU, [u1]).envs["NVIDIA_VISIBLE_DEVICES"] == u1   # ... and lost
        r.kubelet.release(old["metadata"]["uid"])       # the kubelet drops the stale allocation
        other = bind_pod(r, "other", [container("main", gpus=1)], whole(1), "2024-01-01T00:00:03Z")
        assert r.kubelet.admit(new)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u0
        assert r.kubelet.admit(other)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u1


def _restarted_kubelet(r):
    """The kubelet restarts (its answers in flight lost); the plugin serves and registers again."""
    r.kubelet.restart()
    assert r.registered()


def _lost_init_then_admit(r, init_sizes, main_size, lost):
    """A pod whose init containers ask ``init_sizes`` cards and main container ``main_size``, recorded on
    cards 0..n-1; the answers of its first ``lost`` init containers are lost (the kubelet restarted
    mid-admission), then the restarted kubelet admits it again from its first container."""
    n = max(max(init_sizes), main_size)
    uuids = [r.uuid(i) for i in range(n)]
    pod = bind_pod(r, "retry", [container("main", gpus=main_size)], record(list(enumerate(uuids)), whole=True),
                   "2024-01-01T00:00:01Z", init=[container(f"setup{k}", gpus=s) for k, s in enumerate(init_sizes)])
    r.kubelet.take_up(pod)
    for k in range(lost):
        _allocate(r, RESOURCE_GPU, uuids[: init_sizes[k]])
    _restarted_kubelet(r)
    return pod, uuids, r.kubelet.admit(pod)


@pytest.mark.parametrize("podresources", [True, False])
def test_a_retried_init_allocate_of_another_size_is_served(monkeypatch, podresources):
    """Init 1 card, main 2: the init container's answer was lost, so the restarted kubelet asks for it again.
    Before, the ledger counted the init container as served and expected the main container's 2
    devices: the retried 1-device request (GetPreferredAllocation, then Allocate) was refused and the
    pod could never start."""
    with rig(monkeypatch, podresources=podresources) as r:
        assert r.registered()
        pod, (u0, u1), got = _lost_init_then_admit(r, [1], 2, lost=1)
        assert got["setup0"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] in (u0, u1)
        assert got["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == f"{u0},{u1}"
        assert sorted(r.kubelet.allocated[pod["metadata"]["uid"]]["main"][RESOURCE_GPU]) == sorted([u0, u1])


def test_several_lost_init_answers_are_asked_again_in_order(monkeypatch):
    """Init containers of 2 and 1 cards, main 3: both init answers lost; the kubelet asks for each again."""
    with rig(monkeypatch) as r:
        assert r.registered()
        _, uuids, got = _lost_init_then_admit(r, [2, 1], 3, lost=2)
        assert set(got["setup0"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"].split(",")) < set(uuids)
        assert got["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)


def test_a_retried_init_allocate_gives_nothing_once_the_pod_is_admitted(monkeypatch):
    """Once the kubelet lists the main container, an init-sized request is no retry: refused, so no
    other caller gets the pod's card again; and a second pod recorded on it is refused too."""
    with rig(monkeypatch) as r:
        assert r.registered()
        _, (u0, u1), _ = _lost_init_then_admit(r, [1], 2, lost=1)
        with pytest.raises(grpc.RpcError) as err:
            _allocate(r, RESOURCE_GPU, [u0])
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        other = bind_pod(r, "other", [container("main", gpus=1)], record([(0, u0)], whole=True), "2024-01-01T00:00:02Z")
        r.kubelet.take_up(other)
        with pytest.raises(grpc.RpcError) as err:
            _allocate(r, RESOURCE_GPU, [u0])
        assert "already holds" in err.value.details()


def test_a_retried_init_allocate_of_a_share_is_served(monkeypatch):
    """The same for a share: init container 2 GiB, main 4 GiB of one card; the init answer was lost."""
    with rig(monkeypatch) as r:
        assert r.registered()
        u2 = r.uuid(2)
        pod = bind_pod(r, "share", [container("main", mem=4)], record([(2, u2)], whole=False, mem_mib=4096),
                       "2024-01-01T00:00:01Z", init=[container("setup", mem=2)])
        r.kubelet.take_up(pod)
        _allocate(r, RESOURCE_GPU_MEMORY, [f"{u2}::{n}" for n in range(2)])
        _restarted_kubelet(r)
        got = r.kubelet.admit(pod)
        assert got["setup"][RESOURCE_GPU_MEMORY].envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
        assert got["main"][RESOURCE_GPU_MEMORY].envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
        assert got["main"][RESOURCE_GPU_MEMORY].envs["NVIDIA_VISIBLE_DEVICES"] == u2


def _pod_a_with_a_lost_init_answer(r):
    """Pod a (init container 1 card, main 2, recorded on cards 0 and 1) taken up by the kubelet, its init
    container's answer lost; returns the UUIDs of cards 0-2."""
    u0, u1, u2 = r.uuid(0), r.uuid(1), r.uuid(2)
    a = bind_pod(r, "a", [container("main", gpus=2)], record([(0, u0), (1, u1)], whole=True),
                 "2024-01-01T00:00:01Z", init=[container("setup", gpus=1)])
    r.kubelet.take_up(a)
    _allocate(r, RESOURCE_GPU, [u0])
    return u0, u1, u2


@pytest.mark.parametrize("restart", [False, True])
def test_the_next_pod_is_not_steered_onto_a_pod_whose_init_answer_was_lost(monkeypatch, restart):
    """Pod b (1 card, bound after a) is admitted next. Without a kubelet restart, a's admission failed
    (its Failed status not yet seen) and a running kubelet asks nothing of it again; after one, a may be
    asked again, but b is at its own next container and comes first (a restarted kubelet lists only the
    pods it re-added so far, so a true retry of a is then the only candidate). Either way the hint
    and the answer are b's card, not a's."""
    with rig(monkeypatch) as r:
        assert r.registered()
        _, _, u2 = _pod_a_with_a_lost_init_answer(r)
        if restart:
            _restarted_kubelet(r)
        b = bind_pod(r, "b", [container("main", gpus=1)], record([(2, u2)], whole=True), "2024-01-01T00:00:02Z")
        assert r.kubelet.admit(b)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u2


def test_without_a_kubelet_restart_a_lost_init_answer_lends_its_card_to_no_other_pod(monkeypatch):
    """Pod a's init answer was lost but the kubelet did not restart (it rejected a, and asks nothing of
    it again). The kubelet then admits c, a pod without a record: a's 1-card init size must not make a
    look like the pod being admitted, or c is steered onto, and answered with, a's card."""
    from fakekubelet import AdmissionError
    with rig(monkeypatch) as r:
        assert r.registered()
        _pod_a_with_a_lost_init_answer(r)
        c = bind_pod(r, "c", [container("main", gpus=1)], None, "2024-01-01T00:00:02Z")
        with pytest.raises(AdmissionError):
            r.kubelet.admit(c)
