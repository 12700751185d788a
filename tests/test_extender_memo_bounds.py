"""Issue 12, item 5: crafted NodeNames cannot make the extender's memos of recent node lists keep
memory. The memos exist for kube-scheduler's node lists (~150 KB of names at 10,000 nodes); a
list of a million made-up names, or a few huge names, must not be kept, and what stays after
any number of crafted requests is bounded in bytes. Likewise the cache of parsed pods
(``ExtenderService.pod_info``): bounded in estimated bytes as well as in entries."""
from __future__ import annotations

import copy
import gc
import tracemalloc

import orjson

from extender.app import create_app
from extender_harness import bytes_kept, gpus, model_from
from extender.service import ExtenderService
from extender.wirememo import MAX_NAMES

POD = {"metadata": {"name": "p", "namespace": "default", "uid": "uid-1"},
       "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def test_crafted_node_lists_do_not_stay_in_memory():
    model = model_from({"nodes": [{"name": f"node-{i}", "gpus": gpus("Tesla T4", 4, "16Gi")} for i in range(100)]})
    app = create_app(ExtenderService(model))
    verbs = app.extensions["stowage"]["verbs"]
    real = orjson.dumps({"Pod": POD, "NodeNames": [f"node-{i}" for i in range(100)]})
    assert verbs.handle("filter", real).status == 200
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for k in range(6):
            if k % 2:   # many short names: more list entries than a memo keeps (MAX_NAMES)
                names = [f"{k}-{i}" for i in range(MAX_NAMES + 10_000)]
            else:       # few huge names (4 MiB of JSON)
                names = [f"{k}-{i}-" + "x" * (1 << 20) for i in range(4)]
            body = orjson.dumps({"Pod": POD, "NodeNames": names})
            del names
            reply = verbs.handle("filter", body)
            assert reply.status == 200 and b"node unknown to Stowage" in reply.body
            for _ in range(2):  # and again, as kube-scheduler would repeat a list
                assert verbs.handle("filter", body).status == 200
            del body, reply
        gc.collect()
        kept_mib = (tracemalloc.get_traced_memory()[0] - base) / (1 << 20)
    finally:
        tracemalloc.stop()
    print(f"memory kept after 6 crafted node lists: {kept_mib:.1f} MiB")
    assert kept_mib < 8, f"{kept_mib:.0f} MiB kept"
    # kube-scheduler's own lists are still remembered.
    assert verbs.handle("filter", real).status == 200


def fat_pod(i: int, rv: str = "7") -> dict:
    """A pod whose parse keeps the most a policy allows: two lists of 64 GPU models of 128
    characters (stowage.io/gpu-model and its exclude), ~24 KB in the pod cache."""
    from packing.pod_policy import MAX_MODEL_NAME, MAX_MODELS_PER_LIST
    models = lambda c: ",".join(f"{i:08d}-{k:03d}-".ljust(MAX_MODEL_NAME, c)  # noqa: E731
                                for k in range(MAX_MODELS_PER_LIST))
    return {"metadata": {"name": f"fat-{i}", "namespace": "default", "uid": f"uid-fat-{i}", "resourceVersion": rv,
                         "annotations": {"stowage.io/gpu-model": models("m"), "stowage.io/gpu-model-exclude": models("x")}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def test_pod_cache_is_bounded_in_bytes_least_recently_used_out_first():
    """Bounded by entries only (100,000), the pod cache kept whatever pods came through the verbs'
    port: ~24 KB for each pod with the longest model lists, ~2.3 GiB in all. It is bounded by an
    estimate of its bytes too, and the estimate follows what the entries really keep."""
    from extender.service import pod_info_bytes
    budget = 4 << 20
    model = model_from({"nodes": [{"name": "n1", "gpus": gpus("Tesla T4", 4, "16Gi")}]})
    s = ExtenderService(model, pod_cache_bytes=budget)
    s._learn = lambda *a: None   # (what placers learn is bounded apart: measure the cache alone)
    pods = [fat_pod(i) for i in range(600)]
    kept = bytes_kept(s.pod_info, pods)
    entry = pod_info_bytes(s._pods[pods[-1]["metadata"]["uid"]], s.default_policy)
    assert 20_000 < entry < 30_000
    assert budget - entry < s.pod_cache_bytes_used <= budget
    assert len(s._pods) == budget // entry   # 600 before
    assert s.pod_cache_bytes_used == sum(pod_info_bytes(i, s.default_policy) for i in s._pods.values())
    assert 0.8 < kept / s.pod_cache_bytes_used < 1.25, (kept, s.pod_cache_bytes_used)   # the estimate is the memory
    # Least recently used out first: the newest are kept, and the key index follows the cache.
    assert list(s._pods) == [p["metadata"]["uid"] for p in pods[-len(s._pods):]]
    assert set(s._uid_by_key.values()) == set(s._pods)
    oldest, second = list(s._pods)[:2]
    s.pod_info(copy.deepcopy(next(p for p in pods if p["metadata"]["uid"] == oldest)))   # used again: recent
    s.pod_info(fat_pod(600))
    assert oldest in s._pods and second not in s._pods
    # Bind of a recent pod finds what filter parsed; forgetting it gives its bytes back.
    last = s._pods[pods[-1]["metadata"]["uid"]]
    assert s.pod_info(copy.deepcopy(pods[-1])) is last   # a hit, parsed once
    s._forget(last.uid)
    assert s.pod_cache_bytes_used == sum(pod_info_bytes(i, s.default_policy) for i in s._pods.values())


def test_pod_cache_counts_any_long_text_and_keeps_at_least_the_newest_pod():
    """A resourceVersion is any text through the port: a long one is counted as it is."""
    model = model_from({"nodes": [{"name": "n1", "gpus": gpus("Tesla T4", 4, "16Gi")}]})
    s = ExtenderService(model, pod_cache_bytes=4 << 20)
    for i in range(10):
        s.pod_info(fat_pod(i, rv=str(i) * (1 << 20)))   # 1 MiB each
    assert len(s._pods) == 3 and s.pod_cache_bytes_used <= 4 << 20
    huge = s.pod_info(fat_pod(99, rv="9" * (8 << 20)))  # over the whole budget alone: kept, alone
    assert list(s._pods.values()) == [huge]


def test_ordinary_pods_are_held_by_the_entry_bound_as_before():
    """The bytes bound leaves the pod cache of ordinary pods as it was: 100,000 of them fit, so
    hit rates do not change; pods with the longest model lists are what it bounds."""
    from extender.service import POD_CACHE_BYTES, POD_CACHE_ENTRIES, PodInfo, pod_info_bytes
    s = ExtenderService(model_from({"nodes": [{"name": "n1", "gpus": gpus("Tesla T4", 4, "16Gi")}]}))
    ordinary = {"metadata": {"name": "trainer-7f9c5d6b4-x2x7q", "namespace": "ml-team-research",
                             "uid": "0b6f3c1e-5b7a-4f7e-9d39-1c2b3a4d5e6f", "resourceVersion": "123456789012",
                             "annotations": {"stowage.io/gpu-model": "NVIDIA-A100-SXM4-80GB,NVIDIA-H100-80GB-HBM3",
                                             "stowage.io/node-policy": "spread"}},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    info = s.pod_info(ordinary)
    assert isinstance(info, PodInfo) and info.req is not None
    assert pod_info_bytes(info, s.default_policy) * POD_CACHE_ENTRIES < POD_CACHE_BYTES
    assert pod_info_bytes(s.pod_info(fat_pod(1)), s.default_policy) * POD_CACHE_ENTRIES > 10 * POD_CACHE_BYTES
