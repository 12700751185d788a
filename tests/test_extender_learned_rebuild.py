"""Issue 13: what the placers learn (the workload mix, the share sizes seen) is rebuilt from the
cluster, so a restarted extender or the standby replica decides exactly as the one that saw the
pods arrive: the feed shows every pod of Stowage's schedulers to the service once (in creation
order on a list), and a pod seen again (a second scheduling cycle after its bind, a watch echo)
is not learned twice."""
from __future__ import annotations

import random

from extender.kube import creation_order
from extender.service import ExtenderService
from extender.wire import BindingArgs, ExtenderArgs
from extender_harness import gpus, model_from
from extender_kube_helpers import feeders, inv_node, kube, make_pod, new_feeder  # noqa: F401 (fixtures)
from packing.registry import placer_for
from stowage.allocation import RecordTrust

NODES = ["a100-1", "a100-2", "t4-1", "t4-2"]


def cluster():
    return model_from({"nodes": [
        {"name": "a100-1", "gpus": gpus("NVIDIA A100-SXM4-80GB", 4, "80Gi")},
        {"name": "a100-2", "gpus": gpus("NVIDIA A100-SXM4-80GB", 8, "80Gi")},
        {"name": "t4-1", "gpus": gpus("Tesla T4", 2, "16Gi")},
        {"name": "t4-2", "gpus": gpus("Tesla T4", 4, "16Gi")},
    ]})


def pod(i: int, limits: dict) -> dict:
    return {"metadata": {"name": f"p{i:03d}", "namespace": "default", "uid": f"uid-{i:03d}",
                         "resourceVersion": str(100 + i), "creationTimestamp": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"},
            "spec": {"schedulerName": "stowage-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": limits}}]}}


def workload(n: int, seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    shapes = [{"nvidia.com/gpu": "1"}, {"nvidia.com/gpu-memory": "10"}, {"nvidia.com/gpu-memory": "3"},
              {"nvidia.com/gpu-memory": "20", "nvidia.com/gpu-core": "50"}, {"cpu": "2"}, {"nvidia.com/gpu": "2"}]
    return [pod(i, dict(rng.choice(shapes))) for i in range(n)]


def schedule(svc: ExtenderService, p: dict) -> None:
    """What kube-scheduler does with one pod: filter, prioritize, bind the best-scored node."""
    names = svc.filter(ExtenderArgs(pod=p, node_names=NODES, nodes=None, names=NODES)).node_names or []
    if not names:
        return
    got = svc.prioritize(ExtenderArgs(pod=p, node_names=names, nodes=None, names=names))
    best = max(got, key=lambda h: h["Score"])["Host"]
    m = p["metadata"]
    assert svc.bind(BindingArgs(m["name"], m["namespace"], m["uid"], best)) == ""


def answers(svc: ExtenderService, probes: list[dict]) -> list:
    return [svc.prioritize(ExtenderArgs(pod=p, node_names=NODES, nodes=None, names=NODES)) for p in probes]


def test_a_restarted_extender_learns_the_same_from_the_pods_and_answers_the_same():
    model = cluster()
    running = ExtenderService(model)
    pods = workload(40)
    for p in pods:
        schedule(running, p)
    # The restarted extender (or the standby) over the same model, rebuilt from the same pods:
    # its feed lists them (in the API server's order) and shows them in creation order.
    restarted = ExtenderService(model)
    listed = pods[:]
    random.Random(5).shuffle(listed)
    for p in sorted(listed, key=creation_order):
        restarted.learn_pod(p)
    probes = [pod(900 + i, limits) for i, limits in enumerate(
        [{"nvidia.com/gpu-memory": "5"}, {"nvidia.com/gpu-memory": "12"}, {"nvidia.com/gpu": "1"}, {"cpu": "1"},
         {"nvidia.com/gpu-memory": "40", "nvidia.com/gpu-core": "30"}])]
    # Probes are pods too: each service learns each probe once, in the same order.
    assert answers(restarted, probes) == answers(running, probes)
    # What they learned is the same, which a service that learned only the probes does not have.
    assert learned(restarted) == learned(running)
    blank = ExtenderService(model)
    answers(blank, probes)
    assert learned(blank) != learned(running)


def learned(svc: ExtenderService) -> dict:
    """The pack placer's learned workload (Stowage's: counts, host resources per GPU, share sizes)."""
    p = svc.placers["pack"]
    return {"seen": p.seen, "whole": p.whole_milli, "cpu": p.gpu_cpu, "mem": p.gpu_mem,
            "shares": list(zip(p._share_core, p._share_mem, p._share_w)), "version": p.version}


def counting(seen: list):
    def factory(value: str):
        placer = placer_for(value)
        observe = placer.observe

        def counted(req, models=()):
            seen.append(value)
            return observe(req, models)
        placer.observe = counted
        return placer
    return factory


def test_a_pod_seen_again_after_its_bind_is_learned_once():
    seen: list = []
    svc = ExtenderService(cluster(), placer_factory=counting(seen))
    p = pod(1, {"nvidia.com/gpu-memory": "10"})
    svc.learn_pod(p)                      # the watch shows it pending
    schedule(svc, p)                      # filter, prioritize, bind
    bound = {**p, "spec": {**p["spec"], "nodeName": "a100-1"}}
    svc.learn_pod(bound)                  # the watch shows it bound
    p["metadata"]["resourceVersion"] = "999"
    schedule_again = ExtenderArgs(pod=p, node_names=NODES, nodes=None, names=NODES)
    svc.filter(schedule_again)            # a second scheduling cycle after the bind
    svc.prioritize(schedule_again)
    assert seen == ["pack", "spread"]     # once per placer


def test_the_feed_shows_the_service_the_pods_of_stowage_schedulers(kube, feeders):  # noqa: F811
    kube.create_node(inv_node("n1", [80] * 2))
    mine = make_pod("mine", gpu_memory=10)
    mine["spec"]["schedulerName"] = "stowage-scheduler"
    mine = kube.create_pod(mine)
    kube.create_pod(make_pod("other", gpus=1))          # the default scheduler's: counted, not learned
    svc = ExtenderService(cluster())
    f = new_feeder(kube, model=svc.model, trust=RecordTrust(scheduler_names=frozenset({"stowage-scheduler"})))
    f.on_pod_seen, f.on_pod_deleted = svc.learn_pod, svc.forget_learned
    feeders.append(f)
    f.start()
    kube.wait_for(lambda: f.ready()[0])
    uid = mine["metadata"]["uid"]
    assert list(svc._learned) == [uid]
    late = make_pod("late", gpus=1)
    late["spec"]["schedulerName"] = "stowage-scheduler"
    late = kube.create_pod(late)
    kube.wait_for(lambda: late["metadata"]["uid"] in svc._learned)
    kube.delete_pod("default", "mine")
    kube.wait_for(lambda: uid not in svc._learned)       # a deleted uid can never come back


# ------------------------------------------------------------------ with the capability pressure
def big_and_small_nodes():
    """9 big 8-card nodes (128 cores, 768 GiB) and 3 small ones (96 cores, 384 GiB): 8-GPU pods of
    120 cores and 720 GiB fit only the big ones, so the capability pressure protects them."""
    import numpy as np

    from benchmarks.binpack.replay import build_cluster
    from benchmarks.binpack.trace import Nodes
    names = tuple(f"big-{i}" for i in range(9)) + tuple(f"small-{i}" for i in range(3))
    model = build_cluster(Nodes(names=names, cpu_milli=np.array([128_000] * 9 + [96_000] * 3),
                                memory_mib=np.array([786_432] * 9 + [393_216] * 3), gpus=np.array([8] * 12),
                                model=("G3",) * 12))
    return model, list(names)


def test_a_restarted_extender_answers_the_same_where_the_capability_pressure_is_active():
    """The scarcity measured on the nodes as they are (issue 15) comes from the model at the
    rebuild of the learned table, which a restarted extender sees later: on these workloads it
    still answers as the running one, and the term does change the pressure in some of them."""
    from extender.placing import request_pod
    from stowage.resources import GpuRequest

    big8 = GpuRequest(gpus=8, cpu_milli=120_000, host_mem_mib=737_280)
    one = GpuRequest(gpus=1, cpu_milli=8_000, host_mem_mib=32_768)
    two = GpuRequest(gpus=2, cpu_milli=16_000, host_mem_mib=65_536)
    share = GpuRequest(mem_mib=500, core_milli=500, cpu_milli=4_000, host_mem_mib=16_384)
    active = 0
    for seed in range(8):
        for n in (36, 70):
            model, names = big_and_small_nodes()
            rng = random.Random(seed)
            pods = []
            for i in range(n):
                p = request_pod(f"p{i:03d}", rng.choices([big8, one, two, share], weights=[1, 12, 4, 6])[0],
                                uid=f"uid-{i:03d}")
                p["metadata"]["creationTimestamp"] = f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"
                pods.append(p)
            running = ExtenderService(model)
            for p in pods:
                got = running.filter(ExtenderArgs(pod=p, node_names=names, nodes=None, names=names)).node_names
                if got:
                    m = p["metadata"]
                    assert running.bind(BindingArgs(m["name"], m["namespace"], m["uid"], got[0])) == ""
            restarted = ExtenderService(model)
            for p in sorted(pods, key=creation_order):
                restarted.learn_pod(p)
            probes = [request_pod(f"probe{i}", r, uid=f"probe-{i}") for i, r in enumerate([one, two, share, one, big8])]
            ask = lambda svc: [svc.filter(ExtenderArgs(pod=p, node_names=names, nodes=None, names=names)).node_names  # noqa: E731
                               for p in probes]
            assert ask(restarted) == ask(running), (seed, n)
            placer = running.placers["pack"]
            with model.lock:
                values = []
                for now in (True, False):
                    placer._capability, placer.scarcity_now = None, now
                    placer._index(model.a)
                    got = placer.capability_pressure(model.a)
                    values.append(None if got is None else got.value.tolist())
                placer._capability, placer.scarcity_now = None, True
            active += values[0] != values[1]
    assert active > 0, "the workloads never made the scarcity measured now matter: the test would prove nothing"
