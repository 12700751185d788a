"""Issue 12, item 1: the device plugin hands out a card only by a record the extender could have
written for that pod (fake NVML + fake kubelet + fake API server, the plugin's code real)."""
from __future__ import annotations

import pytest

from dp_harness import NODE, bind_pod, container, record, rig
from fakekubelet import AdmissionError

from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, RecordKey, encode_allocation
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_MEMORY

KEY = RecordKey(b"q" * 32)


@pytest.mark.parametrize("podresources", [True, False], ids=["podresources", "ledger-only"])
def test_a_share_recorded_on_a_card_another_pod_holds_whole_gets_nothing(monkeypatch, podresources):
    """A pod created with spec.nodeName and a hand-written record naming the card another pod holds
    whole used to get that card in NVIDIA_VISIBLE_DEVICES. Without the PodResources API (a documented
    fallback) it still did: the plugin's own ledger of what it handed out now says who holds it."""
    with rig(monkeypatch, podresources=podresources) as r:
        assert r.registered()
        owner = bind_pod(r, "owner", [container("main", gpus=1)],
                         record([(0, r.uuid(0))], whole=True, mem_mib=81920, core_milli=1000), "2024-01-01T00:00:01Z")
        assert r.kubelet.admit(owner)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(0)
        thief = bind_pod(r, "thief", [container("main", mem=4)], record([(0, r.uuid(0))], whole=False, mem_mib=4096),
                         "2024-01-01T00:00:02Z")
        with pytest.raises(AdmissionError, match="already holds"):
            r.kubelet.admit(thief)


def test_without_podresources_a_whole_card_record_on_a_shared_card_gets_nothing(monkeypatch):
    with rig(monkeypatch, podresources=False) as r:
        assert r.registered()
        share = bind_pod(r, "share", [container("main", mem=4)], record([(1, r.uuid(1))], whole=False, mem_mib=4096),
                         "2024-01-01T00:00:01Z")
        assert r.kubelet.admit(share)["main"][RESOURCE_GPU_MEMORY].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(1)
        grab = bind_pod(r, "grab", [container("main", gpus=1)],
                        record([(1, r.uuid(1))], whole=True, mem_mib=81920, core_milli=1000), "2024-01-01T00:00:02Z")
        with pytest.raises(AdmissionError, match="share already holds devices on"):
            r.kubelet.admit(grab)


def test_without_podresources_a_card_is_free_again_once_its_holder_ended(monkeypatch):
    with rig(monkeypatch, podresources=False) as r:
        assert r.registered()
        owner = bind_pod(r, "owner", [container("main", gpus=1)],
                         record([(0, r.uuid(0))], whole=True, mem_mib=81920, core_milli=1000), "2024-01-01T00:00:01Z")
        r.kubelet.admit(owner)
        r.kube.patch_pod("default", "owner", {"status": {"phase": "Succeeded"}})
        r.kubelet.release(owner["metadata"]["uid"])
        later = bind_pod(r, "later", [container("main", mem=4)], record([(0, r.uuid(0))], whole=False, mem_mib=4096),
                         "2024-01-01T00:00:02Z")
        assert r.kubelet.admit(later)["main"][RESOURCE_GPU_MEMORY].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(0)


def test_a_record_booking_more_than_the_pod_asks_gets_nothing(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        greedy = bind_pod(r, "greedy", [container("main", gpus=1)],
                          record([(0, r.uuid(0)), (1, r.uuid(1))], whole=True, mem_mib=81920, core_milli=1000),
                          "2024-01-01T00:00:01Z")
        with pytest.raises(AdmissionError, match="names 2 whole card"):
            r.kubelet.admit(greedy)


def test_signed_cluster_refuses_unsigned_records_and_honours_signed_ones(monkeypatch):
    with rig(monkeypatch, record_key=KEY) as r:
        assert r.registered()
        rec = AllocationRecord("gpu-node-1", (CardShare(2, r.uuid(2), 4096, 0),), False)
        unsigned = bind_pod(r, "unsigned", [container("main", mem=4)], encode_allocation(rec), "2024-01-01T00:00:01Z")
        with pytest.raises(AdmissionError, match="not signed"):
            r.kubelet.admit(unsigned)
        pod = bind_pod(r, "signed", [container("main", mem=4)], None, "2024-01-01T00:00:02Z")
        r.kube.patch_pod("default", "signed", {"metadata": {"annotations": {
            "stowage.io/allocation": encode_allocation(rec, KEY, pod["metadata"]["uid"])}}})
        pod = r.kube.get_pod("default", "signed")
        resp = r.kubelet.admit(pod)["main"][RESOURCE_GPU_MEMORY]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(2) and resp.envs["STOWAGE_POD"] == "default/signed"


@pytest.mark.parametrize("hostile", ["no-record", "unsigned-record"])
def test_a_pod_without_an_honoured_record_admitted_first_does_not_take_a_waiting_pods_card(monkeypatch, hostile):
    """The kubelet's calls do not name the pod. A pod bound to the node by hand (``spec.nodeName``)
    asking for a GPU, with no record or a record the plugin does not honour, admitted while a
    recorded pod waits on a card the kubelet offers, was taken for the waiting pod: it got that
    pod's card, and the recorded pod was refused when its turn came. The kubelet lists a pod
    (PodResources) before it admits it, so a waiting pod it does not list yet is not the one being
    admitted: the hand-bound pod is refused, and the recorded pod then gets its card."""
    with rig(monkeypatch, record_key=KEY) as r:
        assert r.registered()
        waiting = bind_pod(r, "waiting", [container("main", gpus=1)], None, "2024-01-01T00:00:01Z")
        r.kube.patch_pod("default", "waiting", {"metadata": {"annotations": {ALLOCATION_ANNOTATION: encode_allocation(
            AllocationRecord(node=NODE, whole=True, cards=(CardShare(0, r.uuid(0), 81920, 1000),)), KEY,
            waiting["metadata"]["uid"])}}})
        rec = None if hostile == "no-record" else record([(0, r.uuid(0))], whole=True, mem_mib=81920, core_milli=1000)
        thief = bind_pod(r, "thief", [container("main", gpus=1)], rec, "2024-01-01T00:00:00Z")
        with pytest.raises(AdmissionError, match="does not list"):
            r.kubelet.admit(thief)
        got = r.kubelet.admit(r.kube.get_pod("default", "waiting"))
        assert got["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(0)
