"""Pods admitted while the kubelet still holds devices of pods gone or finished since.

A restarted kubelet (v1.28) admits the pods of its first list from the API server before its
device manager drops the checkpoint allocations of pods deleted while it was down, or finished:
those devices are not offered, and PodResources still lists a finished pod with them
(../shared/kubelet/README.md; tests/integration/test_real_kubelet.py shows it on the real
kubelet). The fake kubelet models it: ``forget(uid)`` for a deleted pod, a finished pod left as it
is until ``release(uid)``. Fake NVML, fake kubelet and fake API server; the plugin's code real.
"""
from __future__ import annotations

import pytest

from dp_harness import bind_pod, container, record, rig
from fakekubelet import AdmissionError

from stowage.allocation import ALLOCATION_ANNOTATION, decode_allocation
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY

A100 = 81920   # cards 0 and 1 of the fake node: A100-80GB, NVLinked; card 2 an A10, card 3 a T4


def _whole(r, card: int) -> str:
    return record([(card, r.uuid(card))], whole=True, mem_mib=r.nvml.cards[card].memory_mib, core_milli=1000)


def _gone(r, pod: dict) -> None:
    """The pod was deleted while the kubelet was down: gone from the API, its devices still held."""
    r.kube.delete_pod("default", pod["metadata"]["name"])
    r.kubelet.forget(pod["metadata"]["uid"])


def _finished(r, pod: dict) -> None:
    """The pod finished: Succeeded in the API, still listed with its devices by the kubelet."""
    r.kube.patch_pod("default", pod["metadata"]["name"], {"status": {"phase": "Succeeded"}})


def _held_then(r, ending, name: str = "old", containers: list | None = None, rec: str | None = None,
               card: int = 0) -> None:
    """Pod ``name`` (one whole card ``card`` unless told) admitted, then gone or finished (``ending``)."""
    old = bind_pod(r, name, containers or [container("main", gpus=1)], rec or _whole(r, card), "2024-01-01T00:00:01Z")
    r.kubelet.admit(old)
    ending(r, old)


def _share_cards(r, pod: dict) -> tuple[set[str], set[str]]:
    """The cards of the pod's memory devices and of its compute devices, as the kubelet gave them."""
    alloc = r.kubelet.allocated[pod["metadata"]["uid"]]["main"]
    return _cards(alloc[RESOURCE_GPU_MEMORY]), _cards(alloc[RESOURCE_GPU_CORE])


def _record(r, name: str) -> list[str]:
    return decode_allocation(r.kube.get_pod("default", name)["metadata"]["annotations"][ALLOCATION_ANNOTATION]).uuids


def _cards(ids) -> set[str]:
    return {i.split("::")[0] for i in ids}


@pytest.mark.parametrize("ending", [_gone, _finished], ids=["deleted", "finished"])
def test_whole_pod_whose_card_the_kubelet_still_holds_gets_an_equal_free_card_and_its_record_follows(monkeypatch, ending):
    with rig(monkeypatch) as r:
        assert r.registered()
        _held_then(r, ending)
        new = bind_pod(r, "new", [container("main", gpus=1)], _whole(r, 0), "2024-01-01T00:00:02Z")
        resp = r.kubelet.admit(new)["main"][RESOURCE_GPU]
        # card 1 is the only free card of card 0's model and memory (cards 2 and 3 are smaller)
        assert r.kubelet.allocated[new["metadata"]["uid"]]["main"][RESOURCE_GPU] == [r.uuid(1)]
        assert (resp.envs["NVIDIA_VISIBLE_DEVICES"], resp.envs["STOWAGE_POD"]) == (r.uuid(1), "default/new")
        done = r.plugin.reconciler.run_once()
        assert [(c.name, c.old.uuids, c.new.uuids) for c in done] == [("new", [r.uuid(0)], [r.uuid(1)])]
        assert _record(r, "new") == [r.uuid(1)]
        rec = decode_allocation(r.kube.get_pod("default", "new")["metadata"]["annotations"][ALLOCATION_ANNOTATION])
        assert rec.cards[0].index == 1 and rec.cards[0].memory_mib == A100


def test_no_equal_free_card_the_pod_is_refused_with_a_reason(monkeypatch):
    """Card 1, card 0's only twin, is recorded for a share not admitted yet: a whole pod moved there
    would share the card with it. Cards 2 and 3 are free but smaller: a pod may have asked for the
    model or its memory. Refused, and the message says why."""
    with rig(monkeypatch) as r:
        assert r.registered()
        _held_then(r, _gone)
        new = bind_pod(r, "new", [container("main", gpus=1)], _whole(r, 0), "2024-01-01T00:00:02Z")
        bind_pod(r, "planned", [container("main", mem=4)], record([(1, r.uuid(1))], whole=False, mem_mib=4096),
                 "2024-01-01T00:00:03Z")
        with pytest.raises(AdmissionError, match="offers no device .or too few. on the recorded card.s. of default/new: .*no equal card"):
            r.kubelet.admit(new)
        assert not r.plugin.reconciler.run_once()


def test_shared_pod_moves_whole_to_one_equal_card_for_memory_and_compute(monkeypatch):
    """The stale holder had all of card 0's memory devices: the share's memory goes to the twin
    card 1, and its compute follows it there (the kubelet asks for each resource separately)."""
    with rig(monkeypatch) as r:
        assert r.registered()
        _held_then(r, _gone, containers=[container("main", mem=80)],
                   rec=record([(0, r.uuid(0))], whole=False, mem_mib=80 * 1024))
        new = bind_pod(r, "new", [container("main", mem=8, core=20)],
                       record([(0, r.uuid(0))], whole=False, mem_mib=8192, core_milli=200), "2024-01-01T00:00:02Z")
        got = r.kubelet.admit(new)["main"]
        assert _share_cards(r, new) == ({r.uuid(1)}, {r.uuid(1)})
        assert got[RESOURCE_GPU_MEMORY].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(1)
        assert got[RESOURCE_GPU_MEMORY].envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
        assert got[RESOURCE_GPU_CORE].envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
        r.plugin.reconciler.run_once()
        rec = decode_allocation(r.kube.get_pod("default", "new")["metadata"]["annotations"][ALLOCATION_ANNOTATION])
        assert rec.uuids == [r.uuid(1)] and (rec.cards[0].memory_mib, rec.cards[0].core_milli) == (8192, 200)


def test_init_container_moved_and_the_app_container_reusing_its_card(monkeypatch):
    """PodResources (v1.28) does not list init containers: the app container, which reuses the
    init container's device (Allocate without GetPreferredAllocation), must be matched to the
    card the init container was moved to."""
    with rig(monkeypatch) as r:
        assert r.registered()
        _held_then(r, _gone)
        new = bind_pod(r, "new", [container("main", gpus=1)], _whole(r, 0), "2024-01-01T00:00:02Z",
                       init=[container("prep", gpus=1)])
        got = r.kubelet.admit(new)
        assert got["prep"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(1)
        assert got["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(1)
        r.plugin.reconciler.run_once()
        assert _record(r, "new") == [r.uuid(1)]


def test_two_card_pod_keeps_its_offered_card_and_replaces_the_held_one(monkeypatch):
    with rig(monkeypatch, cards=_four_a100s()) as r:
        assert r.registered()
        _held_then(r, _gone)
        new = bind_pod(r, "new", [container("main", gpus=2)],
                       record([(0, r.uuid(0)), (1, r.uuid(1))], whole=True, mem_mib=A100, core_milli=1000),
                       "2024-01-01T00:00:02Z")
        resp = r.kubelet.admit(new)["main"][RESOURCE_GPU]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"].split(",") == [r.uuid(2), r.uuid(1)]   # record order, 0 -> 2
        r.plugin.reconciler.run_once()
        assert _record(r, "new") == [r.uuid(2), r.uuid(1)]


def _four_a100s():
    from fakenvml import FakeCard
    return [FakeCard(f"GPU-b000000{i}-1111-2222-3333-000000000000", "NVIDIA A100-SXM4-80GB", A100, i,
                     f"00000000:0{i + 1}:00.0", numa=0) for i in range(4)]


def test_share_on_the_card_of_a_finished_whole_pod_is_honoured(monkeypatch):
    """The finished whole pod held only nvidia.com/gpu: the card's memory and compute are offered,
    and PodResources still lists the finished pod with the card. A finished pod holds nothing."""
    with rig(monkeypatch) as r:
        assert r.registered()
        _held_then(r, _finished)
        new = bind_pod(r, "new", [container("main", mem=4, core=10)],
                       record([(0, r.uuid(0))], whole=False, mem_mib=4096, core_milli=100), "2024-01-01T00:00:02Z")
        got = r.kubelet.admit(new)["main"]
        assert _share_cards(r, new) == ({r.uuid(0)}, {r.uuid(0)})
        assert got[RESOURCE_GPU_MEMORY].envs["STOWAGE_POD"] == "default/new"
        assert not r.plugin.reconciler.run_once()


def test_two_pods_on_held_cards_of_one_model_are_moved_alike(monkeypatch):
    """The kubelet does not say which pod it admits; moved alike, either pod is right on the card."""
    with rig(monkeypatch, cards=_four_a100s()) as r:
        assert r.registered()
        for i in (0, 1):
            _held_then(r, _gone, f"old-{i}", card=i)
        new = [bind_pod(r, f"new-{i}", [container("main", gpus=1)], _whole(r, i), f"2024-01-01T00:00:0{2 + i}Z")
               for i in (0, 1)]
        for p in new:
            r.kubelet.admit(p)
        got = {p["metadata"]["name"]: r.kubelet.allocated[p["metadata"]["uid"]]["main"][RESOURCE_GPU] for p in new}
        assert got == {"new-0": [r.uuid(2)], "new-1": [r.uuid(3)]}
        r.plugin.reconciler.run_once()
        assert (_record(r, "new-0"), _record(r, "new-1")) == ([r.uuid(2)], [r.uuid(3)])


def test_pods_on_held_cards_of_different_models_are_not_moved(monkeypatch):
    """An A100 is free, but the pods waiting on held cards are on an A100 and on an A10, and the
    kubelet lists both (the A10 pod was taken up earlier and waits, e.g. its admission failed):
    the plugin cannot tell which one the kubelet is admitting, and the A10 pod must not land on
    the A100."""
    with rig(monkeypatch) as r:
        assert r.registered()
        for i in (0, 2):
            _held_then(r, _gone, f"old-{i}", card=i)
        a100 = bind_pod(r, "on-a100", [container("main", gpus=1)], _whole(r, 0), "2024-01-01T00:00:02Z")
        r.kubelet.take_up(bind_pod(r, "on-a10", [container("main", gpus=1)], _whole(r, 2), "2024-01-01T00:00:03Z"))
        with pytest.raises(AdmissionError, match="not alike"):
            r.kubelet.admit(a100)


def test_the_pod_the_kubelet_lists_is_moved_to_an_equal_card_of_its_own_model_only(monkeypatch):
    """The same two pods, the kubelet listing only the one it admits: the A100 pod moves to the
    free A100; the A10 pod, admitted next, finds no free A10 and is refused (the A100 is not for it)."""
    with rig(monkeypatch) as r:
        assert r.registered()
        for i in (0, 2):
            _held_then(r, _gone, f"old-{i}", card=i)
        a100 = bind_pod(r, "on-a100", [container("main", gpus=1)], _whole(r, 0), "2024-01-01T00:00:02Z")
        a10 = bind_pod(r, "on-a10", [container("main", gpus=1)], _whole(r, 2), "2024-01-01T00:00:03Z")
        assert r.kubelet.admit(a100)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(1)
        with pytest.raises(AdmissionError, match="no equal card"):
            r.kubelet.admit(a10)


def test_without_podresources_a_pod_is_not_moved(monkeypatch):
    """Without the kubelet's list the reconciler cannot correct a moved pod's record: it would run
    on a card its record does not name, which the extender counts as free. Refused instead."""
    with rig(monkeypatch, podresources=False) as r:
        assert r.registered()
        _held_then(r, _gone)
        new = bind_pod(r, "new", [container("main", gpus=1)], _whole(r, 0), "2024-01-01T00:00:02Z")
        with pytest.raises(AdmissionError, match="PodResources API is unavailable"):
            r.kubelet.admit(new)
