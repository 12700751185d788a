"""No card is ever double-booked, whatever the interleaving of filter/prioritize/bind calls
from many threads over real HTTP (the extender's threads share one model and one lock)."""
from __future__ import annotations

import random
import threading
from collections import defaultdict

import requests

from extender.service import ExtenderService, SimBinder
from extender_harness import Server, gpus, model_from, simple_placers
from stowage.resources import CORE_MILLI_PER_CARD

GIB = 1024


def small_cluster():
    return model_from({"nodes": [
        {"name": "n1", "gpus": gpus("NVIDIA L4", 4, "24Gi", numa=[0, 0, 1, 1])},
        {"name": "n2", "gpus": gpus("NVIDIA L4", 4, "24Gi")},
        {"name": "n3", "gpus": gpus("NVIDIA A100-SXM4-80GB", 2, "80Gi", nvlink="all")},
        {"name": "n4", "gpus": gpus("NVIDIA A10", 4, "24Gi")},
        {"name": "n5", "gpus": gpus("Tesla T4", 4, "16Gi")},
    ]})


def pod(i, rng):
    if rng.random() < 0.4:
        limits = {"nvidia.com/gpu": str(rng.choice([1, 1, 2]))}
    else:
        limits = {"nvidia.com/gpu-memory": str(rng.choice([4, 6, 8, 12]))}
        if rng.random() < 0.5:
            limits["nvidia.com/gpu-core"] = str(rng.choice([20, 30, 50]))
    return {"metadata": {"name": f"p{i}", "namespace": "load", "uid": f"uid-{i}",
                         "annotations": {"stowage.io/node-policy": rng.choice(["pack", "spread"])}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


def check_no_overbooking(model):
    """Recompute every card's holds from the allocations and compare with capacity and the arrays."""
    a = model.a
    mem = defaultdict(int)
    core = defaultdict(int)
    holders = defaultdict(list)
    for al in model.allocations.values():
        for k, m, c in zip(al.cards, al.mem_mib, al.core_milli):
            key = (al.node, k)
            mem[key] += m
            core[key] += c
            holders[key].append(al)
    for (node, k), hs in holders.items():
        i = model.index[node]
        assert mem[(node, k)] <= a.mem_total[i, k], f"{node} card {k} memory over-booked"
        assert core[(node, k)] <= CORE_MILLI_PER_CARD, f"{node} card {k} compute over-booked"
        if any(h.whole for h in hs):
            assert len(hs) == 1, f"{node} card {k}: whole card shared by {[h.name for h in hs]}"
        assert a.mem_free[i, k] == a.mem_total[i, k] - mem[(node, k)]
        assert a.core_free[i, k] == CORE_MILLI_PER_CARD - core[(node, k)]
        assert a.pods[i, k] == len(hs)


def test_many_threads_never_double_book():
    model = small_cluster()
    binder = SimBinder()
    names = sorted(model.index)
    bound: dict[str, str] = {}
    lock = threading.Lock()
    errors: list[str] = []
    with Server(ExtenderService(model, binder=binder, placer_factory=simple_placers)) as srv:
        rng = random.Random(42)
        pods = [pod(i, rng) for i in range(120)]
        chunks = [pods[t::8] for t in range(8)]

        def worker(tid, mine):
            http = requests.Session()
            r = random.Random(tid)
            try:
                for p in mine:
                    for _attempt in range(3):
                        ans = http.post(srv.url + "/filter", json={"Pod": p, "NodeNames": names}, timeout=30).json()
                        feasible = ans["NodeNames"]
                        if not feasible:
                            break
                        if len(feasible) > 1:
                            http.post(srv.url + "/prioritize", json={"Pod": p, "NodeNames": names}, timeout=30)
                        # Random feasible node (not the best): maximises contention between threads.
                        node = r.choice(feasible)
                        m = p["metadata"]
                        res = http.post(srv.url + "/bind", json={"PodName": m["name"], "PodNamespace": "load",
                                                                 "PodUID": m["uid"], "Node": node}, timeout=30).json()
                        if res["Error"] == "":
                            with lock:
                                bound[m["uid"]] = node
                            break
                        if not res["Error"].startswith("cannot bind"):
                            errors.append(res["Error"])
            except Exception as exc:  # surfaced below
                errors.append(repr(exc))
            finally:
                http.close()

        threads = [threading.Thread(target=worker, args=(t, c)) for t, c in enumerate(chunks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(bound) > 20  # the cluster filled up: there was real contention
    assert {uid: al.node for uid, al in model.allocations.items()} == bound
    assert set(binder.bound) == set(bound)
    check_no_overbooking(model)


def test_simultaneous_binds_to_one_node_take_exactly_its_capacity():
    """Ten pods all saw 4 free cards at filter; ten binds race for them: exactly 4 win."""
    model = model_from({"nodes": [{"name": "n", "gpus": gpus("NVIDIA L4", 4, "24Gi")}]})
    with Server(ExtenderService(model, placer_factory=simple_placers)) as srv:
        pods = [{"metadata": {"name": f"w{i}", "namespace": "default", "uid": f"w{i}"},
                 "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
                for i in range(10)]
        for p in pods:
            assert srv.post("/filter", {"Pod": p, "NodeNames": ["n"]}).json()["NodeNames"] == ["n"]
        barrier = threading.Barrier(10)
        results: dict[str, str] = {}

        def go(p):
            http = requests.Session()
            barrier.wait()
            m = p["metadata"]
            results[m["uid"]] = http.post(srv.url + "/bind", json={"PodName": m["name"], "PodNamespace": "default",
                                                                   "PodUID": m["uid"], "Node": "n"},
                                          timeout=30).json()["Error"]
            http.close()

        threads = [threading.Thread(target=go, args=(p,)) for p in pods]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    winners = sorted(u for u, e in results.items() if e == "")
    losers = [e for e in results.values() if e]
    assert len(winners) == 4 and len(losers) == 6
    assert all(e.endswith("now: too few free cards for 1 GPU: 0 free") for e in losers)
    assert sorted(model.allocations) == winners
    assert sorted(k for al in model.allocations.values() for k in al.cards) == [0, 1, 2, 3]
    check_no_overbooking(model)
