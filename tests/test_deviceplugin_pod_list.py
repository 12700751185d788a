"""The device plugin's list of its node's pods: pages bounded in bytes, and only what the plugin
reads kept of each pod (deviceplugin.kube.PodLister, pod_for_plugin), against the fake API server
(the real client, real HTTP) and, for what is kept, against the full pods' answers.

Why: a pod author can bind pods to any node (``spec.nodeName``) and make each ~3 MiB of JSON
(20,000 containers: kube-apiserver v1.28.7 stores one), ~25 MB parsed; ten of them took one list
of the node's pods to 242 MiB, the plugin's limit being 256 MiB, at every Allocate."""
from __future__ import annotations

import copy
import json
import logging

import kubernetes

import pytest
from dp_harness import bind_pod, container, record, rig
from extender_kube_helpers import FakeKube, kube  # noqa: F401
from fakekube import make_pod
from fakekubelet import AdmissionError

from deviceplugin import allocator
from deviceplugin.corrections import bind_order
from deviceplugin.kube import PodLister, pod_for_plugin
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, RecordKey, RecordTrust, encode_allocation
from stowage.resources import GPU_RESOURCES, pod_gpu_request

NODE = "gpu-a"
KEY = RecordKey(b"k" * 32)


def giant(name: str, containers: int = 2000, node: str = NODE) -> dict:
    """A pod bound to ``node`` with many containers that ask for none of our resources, and one that does."""
    p = make_pod(name, gpus=1, node=node, phase="Running")
    p["spec"]["containers"] += [{"name": f"c{i}", "image": "x", "resources": {"limits": {"cpu": "1m"}}}
                                for i in range(containers)]
    return p


def shapes() -> list[dict]:
    """Pods whose GPU request, record and bind order the plugin reads: app and init containers
    with and without our resources, sidecars (restartPolicy Always), overhead, a record signed for
    the pod, a deleted one, odd container lists."""
    out = []
    base = make_pod("plain", gpus=2, node=NODE, phase="Running", uid="u-plain")
    base["spec"]["containers"].append({"name": "log", "image": "x", "resources": {"limits": {"cpu": "1"}}})
    out.append(base)
    side = make_pod("sidecars", gpu_memory=8, gpu_core=30, node=NODE, uid="u-side")
    side["spec"]["initContainers"] = [
        {"name": "setup", "image": "x", "resources": {"limits": {"nvidia.com/gpu-memory": "12"}}},
        {"name": "proxy", "image": "x", "restartPolicy": "Always",
         "resources": {"requests": {"nvidia.com/gpu-memory": "2", "nvidia.com/gpu-core": "5"}}},
        {"name": "wait", "image": "x"},
        {"name": "mesh", "image": "x", "restartPolicy": "Always", "resources": {"limits": {"memory": "1Gi"}}},
    ]
    side["spec"]["containers"].insert(0, {"name": "cpu-only", "image": "x"})
    side["status"]["conditions"] = [{"type": "Initialized", "lastTransitionTime": "2024-01-01T00:00:09Z"},
                                    {"type": "PodScheduled", "lastTransitionTime": "2024-01-01T00:00:05Z"}]
    out.append(side)
    over = make_pod("overhead", gpus=1, node=NODE, uid="u-over")
    over["spec"]["overhead"] = {"nvidia.com/gpu": "1"}
    out.append(over)
    rec = AllocationRecord(node=NODE, whole=True, cards=(
        CardShare(index=0, uuid="GPU-0", memory_mib=81920, core_milli=1000),
        CardShare(index=1, uuid="GPU-1", memory_mib=81920, core_milli=1000)))
    signed = make_pod("signed", gpus=2, node=NODE, uid="u-signed",
                      annotations={ALLOCATION_ANNOTATION: encode_allocation(rec, KEY, "u-signed"), "other": "x" * 999})
    signed["metadata"]["creationTimestamp"] = "2024-01-01T00:00:01Z"
    signed["spec"]["schedulerName"] = "stowage"
    signed["spec"]["containers"] += [{"name": f"c{i}", "image": "x"} for i in range(300)]
    out.append(signed)
    forged = copy.deepcopy(signed)
    forged["metadata"].update(name="forged", uid="u-forged")       # signed for another pod
    out.append(forged)
    gone = make_pod("gone", gpus=1, node=NODE, phase="Succeeded", uid="u-gone")
    gone["metadata"]["deletionTimestamp"] = "2024-01-01T00:01:00Z"
    out.append(gone)
    bad = make_pod("bad-quantity", node=NODE, uid="u-bad")
    bad["spec"]["containers"].append({"name": "x", "resources": {"limits": {"nvidia.com/gpu": "1.5"}}})
    out.append(bad)
    odd = make_pod("odd-resources", node=NODE, uid="u-odd")
    odd["spec"]["containers"].append({"name": "x", "resources": {"limits": ["nvidia.com/gpu"]}})
    out.append(odd)
    return out


def outcome(fn, *args, **kwargs):
    """What ``fn`` answers, or the error it raises (type and words)."""
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:  # the same failure, whatever it is, is the same answer
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize("pod", shapes(), ids=lambda p: p["metadata"]["name"])
def test_the_slim_pod_reads_as_the_full_one(pod):
    """Every answer the plugin draws from a pod (its GPU request, its record as honoured with and
    without a key, bind order, the containers it serves per resource, terminal/deleted state) is
    the same from :func:`pod_for_plugin` as from the whole pod."""
    slim = pod_for_plugin(copy.deepcopy(pod))
    for mib in (1, 1024):
        assert outcome(pod_gpu_request, slim, mib, max_containers=None) == outcome(pod_gpu_request, pod, mib,
                                                                                    max_containers=None)
    for trust in (RecordTrust(), RecordTrust(key=KEY), RecordTrust(scheduler_names=frozenset({"stowage"}))):
        assert outcome(trust.record_of, slim) == outcome(trust.record_of, pod)
    assert bind_order(slim) == bind_order(pod)
    for resource in GPU_RESOURCES:
        assert outcome(allocator._named_sizes, slim, resource) == outcome(allocator._named_sizes, pod, resource)
    for key in ("uid", "name", "namespace", "deletionTimestamp", "creationTimestamp"):
        assert slim["metadata"].get(key) == pod["metadata"].get(key)
    assert slim["spec"].get("nodeName") == NODE and slim["status"].get("phase") == pod["status"].get("phase")


def test_what_is_left_out_is_what_asks_for_none_of_our_resources():
    slim = pod_for_plugin(shapes()[3])        # "signed": 301 containers, one asking for GPUs
    assert [c["name"] for c in slim["spec"]["containers"]] == ["main"]
    assert list(slim["metadata"]["annotations"]) == [ALLOCATION_ANNOTATION]
    assert "image" not in slim["spec"]["containers"][0]


def test_the_node_pods_are_listed_in_pages_bounded_by_bytes_and_kept_slim(kube: FakeKube, caplog):
    """Giant pods bound to the node: pages past the bound are asked for again with fewer pods,
    every pod of the node comes once (no other node's), slim; the next list starts at the size
    the last one ended with instead of paying the abandoned pages again."""
    for i in range(6):
        kube.create_pod(giant(f"giant-{i}"), emit=False)
    for i in range(30):
        kube.create_pod(make_pod(f"small-{i:02d}", gpu_memory=4, node=NODE, phase="Running"), emit=False)
    kube.create_pod(giant("elsewhere", node="other"), emit=False)
    big = len(json.dumps(giant("x")))                     # ~130 KiB of JSON each
    lister = PodLister(kubernetes.client.CoreV1Api(kube.api_client()), NODE, page_bytes=big * 3)
    with caplog.at_level(logging.WARNING, logger="stowage.deviceplugin.kube"):
        pods = lister.pods()
    names = sorted(p["metadata"]["name"] for p in pods)
    assert names == sorted([f"giant-{i}" for i in range(6)] + [f"small-{i:02d}" for i in range(30)])
    assert all(len(p["spec"]["containers"]) == 1 for p in pods)
    first = [int(q["limit"]) for q in kube.list_requests("pods")]
    assert first[:2] == [500, 62] and min(first) < 62
    assert any("pods of node gpu-a: a page of 500 objects passed" in r.getMessage()
               and "asking for 62 from the same point instead" in r.getMessage() for r in caplog.records)
    n = len(first)
    again = sorted(p["metadata"]["name"] for p in lister.pods())
    assert again == names
    second = [int(q["limit"]) for q in kube.list_requests("pods")][n:]
    assert second[0] < 500 and len(second) <= len(first)        # starts where the last list ended


def test_a_single_pod_past_the_object_bound_fails_the_list_of_the_node_pods(kube: FakeKube):
    """A page of one pod was read whole, whatever its size: a peer that is not a real API server
    could hand the plugin gigabytes of one "pod" (its limit is 256 MiB). Now one object is read up
    to 16 MiB of JSON, then the list fails (the Allocate is refused UNAVAILABLE, a reconciliation
    round is skipped; both ask again next time), and lists work again once it is gone."""
    kube.create_pod(make_pod("small", gpus=1, node=NODE, phase="Running"), emit=False)
    huge = make_pod("huge", gpus=1, node=NODE, phase="Running")
    huge["metadata"]["annotations"]["example.com/blob"] = "x" * (17 << 20)
    kube.create_pod(huge, emit=False)
    lister = PodLister(kubernetes.client.CoreV1Api(kube.api_client()), NODE, page_bytes=64 << 10)
    with pytest.raises(Exception, match="pods of node gpu-a: a page of 1 object passed 16 MiB of JSON"):
        lister.pods()
    assert [int(q["limit"]) for q in kube.list_requests("pods")][-1] == 1
    kube.delete_pod("default", "huge", emit=False)
    assert [p["metadata"]["name"] for p in lister.pods()] == ["small"]


def test_an_allocate_while_a_pod_past_the_object_bound_is_listed_is_refused_unavailable(monkeypatch):
    """The plugin's own callers of the list: the kubelet's call is answered UNAVAILABLE with what
    the list said (the kubelet retries the pod), the plugin goes on, and the next call after the
    object is gone is answered as any (the pod admitted again, as the kubelet retries it)."""
    with rig(monkeypatch) as r:
        assert r.registered()
        huge = make_pod("huge", node="gpu-node-1", phase="Running")
        huge["metadata"]["annotations"]["example.com/blob"] = "x" * (17 << 20)
        r.kube.create_pod(huge, emit=False)
        pod = bind_pod(r, "p", [container("main", gpus=1)], record([(0, r.uuid(0))], whole=True),
                       "2024-01-01T00:00:01Z")
        with pytest.raises(AdmissionError) as exc:
            r.kubelet.admit(pod)
        assert "UNAVAILABLE" in str(exc.value) and "a page of 1 object passed 16 MiB of JSON" in str(exc.value)
        r.kube.delete_pod("default", "huge", emit=False)
        assert r.kubelet.admit(pod)["main"]["nvidia.com/gpu"].envs["NVIDIA_VISIBLE_DEVICES"] == r.uuid(0)


def test_an_expired_list_of_the_node_pods_starts_again(kube: FakeKube):
    for i in range(7):
        kube.create_pod(make_pod(f"p{i}", gpus=1, node=NODE, phase="Running"), emit=False)
    done = []

    def between(kind: str, page: int) -> None:
        if page == 0 and not done:
            done.append(1)
            kube.create_pod(make_pod("late", gpus=1, node=NODE, phase="Running"), emit=False)
            kube.expire_lists()

    kube.on_list_page = between
    lister = PodLister(kubernetes.client.CoreV1Api(kube.api_client()), NODE)
    lister._sizer.limit = 3
    pods = lister.pods()
    assert sorted(p["metadata"]["name"] for p in pods) == sorted([f"p{i}" for i in range(7)] + ["late"])
    assert [bool(q.get("continue")) for q in kube.list_requests("pods")] == [False, True, False, True]


def test_the_survey_of_slim_pods_is_the_survey_of_the_full_ones():
    """The plugin's decision input, whole: for every resource and trust, the candidates (pod,
    record, container sizes, order), the notes on the pods left out and the cards claimed are the
    same from the slim pods as from the full ones, a pod the kubelet admitted already (startTime)
    and finished ones included."""
    pods = [p for p in shapes() if p["metadata"]["name"] != "odd-resources"]   # no API server stores that one
    started = make_pod("started", gpus=2, node=NODE, phase="Pending", uid="u-started")
    started["status"]["startTime"] = "2024-01-01T00:00:30Z"
    started["metadata"]["annotations"][ALLOCATION_ANNOTATION] = pods[3]["metadata"]["annotations"][ALLOCATION_ANNOTATION]
    pods.append(started)
    slim = [pod_for_plugin(copy.deepcopy(p)) for p in pods]
    for trust in (RecordTrust(), RecordTrust(key=KEY)):
        for resource in GPU_RESOURCES:
            full = allocator.survey(pods, NODE, resource, allocator.Ledger(), trust=trust)
            got = allocator.survey(slim, NODE, resource, allocator.Ledger(), trust=trust)
            assert got == full
            assert full.candidates or full.notes or resource != "nvidia.com/gpu"   # the case is not empty
