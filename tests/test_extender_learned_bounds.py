"""The pods the placers learned from, by uid (``ExtenderService._learned``,
extender/learned_uids.py), are bounded in estimated bytes as well as in entries, and shapes are
interned. Before, each uid kept its own request and ``stowage.io/gpu-model`` list, bounded only by
100,000 entries: pods written with distinct lists of 64 names of 128 characters kept ~12 KB each
(measured: 20,000 such pods 233 MiB, ~1.1 GiB at 100,000; the container has 1 GiB)."""
from __future__ import annotations

import sys

from extender.learned_uids import LEARNED_BYTES, LEARNED_ENTRIES, LONG_LIST_BYTES, LearnedUids
from extender.service import ExtenderService
from extender_harness import bytes_kept, gpus, model_from
from fakekube import make_pod
from packing.pod_policy import MAX_MODEL_NAME, MAX_MODELS_PER_LIST
from packing.registry import placer_for
from stowage.resources import GpuRequest

SHARED = "NVIDIA-A100-SXM4-80GB,NVIDIA-H100-80GB-HBM3"


def pod(i: int, models: str | None = SHARED, gpus_: int = 1) -> dict:
    """A pod of Stowage's scheduler, as the watch shows it."""
    p = make_pod(f"p-{i}", gpus=gpus_, annotations={"stowage.io/gpu-model": models} if models else {},
                 uid=f"{i:08d}-5b7a-4f7e-9d39-1c2b3a4d5e6f")
    p["spec"]["schedulerName"] = "stowage-scheduler"
    return p


def crafted(i: int) -> dict:
    """A pod whose model list is the longest a policy allows, unlike every other pod's."""
    return pod(i, ",".join(f"{i:08d}-{k:03d}-".ljust(MAX_MODEL_NAME, "m") for k in range(MAX_MODELS_PER_LIST)))


def uid(p: dict) -> str:
    return p["metadata"]["uid"]


def service(**kw) -> ExtenderService:
    return ExtenderService(model_from({"nodes": [{"name": "n1", "gpus": gpus("Tesla T4", 4, "16Gi")}]}), **kw)


def recording_placers(seen: list):
    """Placers as usual, each observe also recorded (policy, request, models, count)."""
    def factory(policy_value: str):
        placer = placer_for(policy_value)
        observe = placer.observe

        def recorded(req, models=(), count=1):
            seen.append((policy_value, req, tuple(models), count))
            return observe(req, models, count)
        placer.observe = recorded
        return placer
    return factory


def test_crafted_pods_keep_the_learned_uids_within_their_bytes():
    """Distinct long model lists used to stay ~12 KB a pod, whatever their number; now the bytes
    kept stay under the budget, the estimate follows what is really held, the newest stay."""
    budget = 2 << 20
    s = service(learned_bytes=budget)
    s._distinct_placers = lambda: []   # (what the placers learn is bounded apart: measure the uids alone)
    pods = [crafted(i) for i in range(400)]    # ~5 MB of lists
    kept = bytes_kept(s.learn_pod, pods)
    assert kept < budget * 1.1, f"{kept / 2**20:.1f} MiB kept"     # 4.8 MiB before
    assert s._learned.bytes_used <= budget
    assert 0.8 < kept / s._learned.bytes_used < 1.25, (kept, s._learned.bytes_used)
    assert 100 < len(s._learned) < 200         # ~12.6 KB each
    assert list(s._learned) == [uid(p) for p in pods[-len(s._learned):]]   # the oldest went first


def test_pods_of_one_list_share_one_tuple_and_pods_of_one_shape_one_record():
    s = service()
    a, b, c = pod(1), pod(2), pod(3, "NVIDIA-H100-80GB-HBM3, NVIDIA-A100-SXM4-80GB")   # c: another order
    d = pod(4, gpus_=2)                                                         # another request
    for p in (a, b, c, d):
        s.learn_pod(p)
    sa, sb, sc, sd = (s._learned.get(uid(p)) for p in (a, b, c, d))
    assert sa == (GpuRequest(gpus=1), ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"))
    assert sa is sb is sc                       # one shape record, not one per pod
    assert sd[1] is sa[1] and sd[0] != sa[0]    # one list for every shape naming it
    # Each distinct shape and list is counted once in the estimate: a fourth pod costs its uid only.
    before = s._learned.bytes_used
    s.learn_pod(pod(5))
    assert s._learned.bytes_used - before < 250


def test_under_the_byte_bound_long_lists_go_first_and_departures_of_the_rest_still_count():
    """Past the bytes, pods with long lists are forgotten first, so a flood of them leaves the
    ordinary pods learned: their deletion is counted in ``departed`` exactly as before. A pod
    forgotten (here a crafted one) costs what the docs say: seen again it is learned again, and
    its deletion is not counted."""
    seen: list = []
    s = service(learned_bytes=1 << 20, placer_factory=recording_placers(seen))
    ordinary = [pod(i) for i in range(50)]
    for p in ordinary:
        s.learn_pod(p)
    flood = [crafted(1000 + i) for i in range(200)]   # ~2.5 MB
    for p in flood:
        s.learn_pod(p)
    assert s._learned.bytes_used <= 1 << 20
    assert all(uid(p) in s._learned for p in ordinary)
    assert uid(flood[-1]) in s._learned and uid(flood[0]) not in s._learned
    for p in ordinary[:3]:
        s.forget_learned(uid(p))
    s.forget_learned(uid(flood[0]))        # forgotten by the bound: not counted
    s.forget_learned(uid(flood[-1]))       # still known: counted
    got = list(s.departed.items())
    assert got[0] == (GpuRequest(gpus=1), ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"), 3)
    assert [n for _, _, n in got] == [3, 1] and got[1][1][0].startswith("00001199-000-")
    n = len(seen)
    s.learn_pod(flood[1])                  # forgotten, seen again: learned again (once per placer)
    assert len(seen) == n + 2


def test_the_newest_pod_is_kept_even_alone_over_the_budget():
    s = service(learned_bytes=4096)        # less than one crafted pod
    for i in range(3):
        s.learn_pod(crafted(i))
    assert list(s._learned) == [uid(crafted(2))]
    s.learn_pod(pod(9))                    # an ordinary pod after it: the crafted one goes
    assert list(s._learned) == [uid(pod(9))]


def test_a_pod_seen_again_is_the_most_recently_used():
    """The entry bound forgets the pod learned or seen longest ago (it kept insertion order: a pod
    still filtered or listed again went as early as one long gone)."""
    s = service(pod_cache_size=3)
    a, b, c, d = (pod(i) for i in range(4))
    for p in (a, b, c):
        s.learn_pod(p)
    s.learn_pod(a)                         # seen again: not learned again, but recent
    s.learn_pod(d)
    assert list(s._learned) == [uid(c), uid(a), uid(d)]


def test_ordinary_workloads_stay_within_the_bytes():
    """100,000 ordinary pods (a few hundred shapes, lists of a few models) stay far below the
    byte bound: only the entry bound governs them, as before."""
    learned = LearnedUids()
    lists = [(), ("NVIDIA-A100-SXM4-80GB",), tuple(SHARED.split(",")), ("Tesla-T4", "Tesla-V100-SXM2-32GB")]
    for i in range(LEARNED_ENTRIES):
        req = GpuRequest(gpus=1 + i % 8, cpu_milli=1000 * (i % 50), host_mem_mib=float(4096 * (i % 7)))
        assert learned.add(f"{i:08d}-5b7a-4f7e-9d39-1c2b3a4d5e6f", req, lists[i % 4])
    assert len(learned) == LEARNED_ENTRIES and learned.forgotten == 0
    assert learned.bytes_used < LEARNED_BYTES / 2, learned.bytes_used / 2**20
    assert learned.add("one-more", GpuRequest(gpus=1)) and learned.forgotten == 1   # then the entries
    # A list is long well past what real pods write (8 names of 21 characters), well below crafted ones.
    assert sys.getsizeof("x" * MAX_MODEL_NAME) * MAX_MODELS_PER_LIST > 4 * LONG_LIST_BYTES
    assert sys.getsizeof("NVIDIA-A100-SXM4-80GB") * 8 < LONG_LIST_BYTES / 3


def test_learning_of_ordinary_pods_is_unchanged():
    """The placers observe each pod once, in order, with its models as written, however often it
    is seen (filter's pod_info, the watch), and forgetting departed pods shows them nothing."""
    seen: list = []
    s = service(placer_factory=recording_placers(seen))
    pods = [pod(0), pod(1, "NVIDIA-H100-80GB-HBM3,NVIDIA-A100-SXM4-80GB"), pod(2, None, 2), pod(3)]
    s.learn_pod(pods[0])
    s.pod_info(pods[1])
    s.learn_pod(pods[1])
    s.pod_info(pods[0])
    s.forget_learned(uid(pods[0]))
    s.learn_pod(pods[2])
    s.learn_pod(pods[3])
    s.learn_pod(pods[2])
    want = [(GpuRequest(gpus=1), ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"), 1),
            (GpuRequest(gpus=1), ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"), 1),
            (GpuRequest(gpus=2), (), 1),
            (GpuRequest(gpus=1), ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"), 1)]
    assert [x[1:] for x in seen if x[0] == "pack"] == want
    assert list(s.departed.items()) == [(GpuRequest(gpus=1), ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"), 1)]
