"""No card is ever double-booked, whatever the interleaving of filter/prioritize/bind calls
from many threads over real HTTP (the extender's threads share one model and one lock); and
bind's API write runs outside the lock while its reservation is held (forced interleavings)."""
from __future__ import annotations

import random
import threading
from collections import defaultdict

import requests

from extender.errors import BindError, BindOutcomeUnknown
from extender.service import ExtenderService, SimBinder
from extender.wire import BindingArgs
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


# ---------------------------------------------------------------- bind: writes outside the lock
# The binder's API write runs outside the model lock while the card reservation is held: the
# tests below drive ExtenderService.bind from threads with a binder that blocks on an Event until
# the test lets it go, so every interleaving is forced by events, never by timing.

class GatedBinder:
    """A binder whose write for a chosen pod blocks until released, or fails."""

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}     # pod name -> released when set
        self.entered: dict[str, threading.Event] = {}   # pod name -> set once its write started
        self.fail: set[str] = set()
        self.bound: dict[str, tuple[str, list[int]]] = {}
        self.lock = threading.Lock()

    def hold(self, name: str) -> threading.Event:
        self.gates[name] = threading.Event()
        self.entered[name] = threading.Event()
        return self.gates[name]

    def bind(self, namespace, name, uid, node, record):
        if name in self.entered:
            self.entered[name].set()
        if name in self.gates:
            assert self.gates[name].wait(30), f"the test never released {name}"
        if name in self.fail:
            raise BindError(f"injected API failure for {name}")
        with self.lock:
            self.bound[name] = (node, [c.index for c in record.cards] if record else [])


class PodsByName:
    """The pod source: bind finds the pods here (no filter call needed)."""

    def __init__(self, pods: list[dict]) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}

    def get_pod(self, namespace, name):
        return self.pods.get((namespace, name))


def gpu_pod(name: str, gpus: int = 1) -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def bind_args(name: str, node: str) -> BindingArgs:
    return BindingArgs(pod_name=name, pod_namespace="default", pod_uid=f"uid-{name}", node=node)


def gated_service(nodes: dict[str, int], names: list[str]) -> tuple[ExtenderService, GatedBinder]:
    model = model_from({"nodes": [{"name": n, "gpus": gpus("NVIDIA L4", k, "24Gi")} for n, k in nodes.items()]})
    binder = GatedBinder()
    svc = ExtenderService(model, binder=binder, pod_source=PodsByName([gpu_pod(n) for n in names]),
                          placer_factory=simple_placers)
    return svc, binder


def in_thread(fn, *args) -> tuple[threading.Thread, dict]:
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("result", fn(*args)), daemon=True)
    t.start()
    return t, out


def test_two_binds_racing_for_the_last_card_exactly_one_wins():
    """A's write is in flight (its reservation taken, the lock free); B asks for the same last
    card: refused at once, without waiting for A's write. Then A's write lands: A won, B lost."""
    svc, binder = gated_service({"n": 1}, ["a", "b"])
    gate = binder.hold("a")
    ta, ra = in_thread(svc.bind, bind_args("a", "n"))
    assert binder.entered["a"].wait(30)
    err_b = svc.bind(bind_args("b", "n"))           # returns while a's write is still blocked
    assert not gate.is_set() and ta.is_alive()
    assert err_b == "cannot bind default/b to n now: too few free cards for 1 GPU: 0 free"
    gate.set()
    ta.join(30)
    assert ra["result"] == ""
    assert binder.bound == {"a": ("n", [0])}
    assert list(svc.model.allocations) == ["uid-a"]
    check_no_overbooking(svc.model)


def test_racing_binds_started_together_exactly_one_wins():
    """Eight binds for one last card released at once by a barrier: one wins, whatever the order."""
    names = [f"p{i}" for i in range(8)]
    svc, binder = gated_service({"n": 1}, names)
    go = threading.Barrier(len(names))
    results: dict[str, str] = {}

    def run(name):
        go.wait()
        results[name] = svc.bind(bind_args(name, "n"))

    threads = [threading.Thread(target=run, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [n for n, e in results.items() if e == ""]
    assert len(results) == 8 and len(winners) == 1
    assert list(binder.bound) == winners and list(svc.model.allocations) == [f"uid-{winners[0]}"]
    check_no_overbooking(svc.model)


def test_a_failed_write_releases_the_reservation_for_the_next_pod():
    """A's write fails while B waits behind the taken card: B is refused while A holds it, and
    takes it once A's failure released it. A's answer carries the API's error."""
    svc, binder = gated_service({"n": 1}, ["a", "b"])
    binder.fail.add("a")
    gate = binder.hold("a")
    ta, ra = in_thread(svc.bind, bind_args("a", "n"))
    assert binder.entered["a"].wait(30)
    assert "0 free" in svc.bind(bind_args("b", "n"))    # held by a's reservation meanwhile
    gate.set()
    ta.join(30)
    assert ra["result"] == "cannot bind default/a to n: injected API failure for a"
    assert svc.model.allocations == {}
    assert svc.bind(bind_args("b", "n")) == ""
    assert binder.bound == {"b": ("n", [0])} and list(svc.model.allocations) == ["uid-b"]
    check_no_overbooking(svc.model)


def test_binds_of_different_pods_proceed_concurrently():
    """A's write is blocked; B's bind (another card) runs its own write and completes meanwhile:
    the model lock is not held across the API write."""
    svc, binder = gated_service({"n1": 1, "n2": 1}, ["a", "b"])
    gate = binder.hold("a")
    ta, ra = in_thread(svc.bind, bind_args("a", "n1"))
    assert binder.entered["a"].wait(30)
    assert svc.bind(bind_args("b", "n2")) == ""          # completes while a's write is blocked
    assert binder.bound == {"b": ("n2", [0])} and ta.is_alive() and "result" not in ra
    with svc.model.lock:                                 # a's cards are reserved meanwhile
        assert list(svc.model.allocations["uid-a"].cards) == [0]
    gate.set()
    ta.join(30)
    assert ra["result"] == "" and binder.bound["a"] == ("n1", [0])
    check_no_overbooking(svc.model)


def test_a_write_whose_outcome_is_unknown_keeps_the_reservation():
    """The Binding may have been applied (answer lost, pod unreadable): the pod may be running on
    the card, so the card stays reserved: no other pod gets it. The scheduler's retry of the same
    pod to the same node completes on the reservation it still holds."""
    svc, binder = gated_service({"n": 1}, ["a", "b"])
    real = binder.bind

    def unknown_once(namespace, name, uid, node, record):
        binder.bind = real
        raise BindOutcomeUnknown("binding default/a to n failed: connection reset; the pod could not be read back")

    binder.bind = unknown_once
    err = svc.bind(bind_args("a", "n"))
    assert err.startswith("cannot bind default/a to n: binding default/a to n failed: connection reset")
    assert list(svc.model.allocations) == ["uid-a"]            # kept
    assert "0 free" in svc.bind(bind_args("b", "n"))            # nobody else gets the card
    assert svc.bind(bind_args("a", "n")) == ""                  # the retry completes
    assert binder.bound == {"a": ("n", [0])}
    check_no_overbooking(svc.model)


# ------------------------------------------------------- the same pod bound twice at once (audit)
# kube-scheduler binds a pod once per scheduling cycle, but a bind whose answer it gave up on
# (httpTimeout) is retried while the first may still be writing, and anything that reaches the
# port may send a bind again. Two writes for one pod at once must never leave the pod bound on
# cards the model no longer holds for it.

class ScriptedBinder:
    """Each call takes the next step: "ok", "fail" (BindError), "unknown" (BindOutcomeUnknown),
    or "gate" (block until :attr:`gate` is set, then succeed). Records what it bound."""

    def __init__(self, steps: list[str]) -> None:
        self.steps = list(steps)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.bound: list[tuple[str, str, list[int]]] = []
        self.lock = threading.Lock()

    def bind(self, namespace, name, uid, node, record):
        with self.lock:
            step = self.steps.pop(0)
        if step == "gate":
            self.entered.set()
            assert self.gate.wait(30), "the test never released the gate"
        elif step == "fail":
            self.entered.set()
            assert self.gate.wait(30), "the test never released the gate"
            raise BindError(f"injected API failure for {name}")
        elif step == "unknown":
            raise BindOutcomeUnknown(f"binding {name} to {node}: connection reset; pod could not be read back")
        with self.lock:
            self.bound.append((name, node, [c.index for c in record.cards] if record else []))


def scripted_service(nodes: dict[str, int], names: list[str], steps: list[str]) -> tuple[ExtenderService,
                                                                                        ScriptedBinder]:
    model = model_from({"nodes": [{"name": n, "gpus": gpus("NVIDIA L4", k, "24Gi")} for n, k in nodes.items()]})
    binder = ScriptedBinder(steps)
    svc = ExtenderService(model, binder=binder, pod_source=PodsByName([gpu_pod(n) for n in names]),
                          placer_factory=simple_placers)
    return svc, binder


def test_a_bind_repeated_while_the_first_write_is_in_flight_is_refused():
    """A's write is in flight when a second bind of A to the same node comes: it used to write
    the Binding again at once, on A's reservation; A's first write then failed and released the
    card, the second one bound A on it, and the next pod got the same card (double-booked). Now
    the second bind is refused while the first is in flight, and the card goes to one pod only."""
    svc, binder = scripted_service({"n": 1}, ["a", "c"], ["fail", "ok"])
    ta, ra = in_thread(svc.bind, bind_args("a", "n"))
    assert binder.entered.wait(30)
    again = svc.bind(bind_args("a", "n"))               # while a's first write is blocked
    assert again == "a bind of pod default/a to n is still in progress"
    binder.gate.set()
    ta.join(30)
    assert ra["result"] == "cannot bind default/a to n: injected API failure for a"
    assert svc.model.allocations == {}                  # a's failed bind left nothing
    assert svc.bind(bind_args("c", "n")) == ""          # the next pod takes the card
    assert binder.bound == [("c", "n", [0])]            # and nobody else was bound on it
    assert list(svc.model.allocations) == ["uid-c"]
    check_no_overbooking(svc.model)


def test_a_retry_in_flight_on_a_kept_reservation_is_not_released_under_it():
    """A's first write ended with an unknown outcome (its card stays reserved); the retry to the
    same node is writing when a bind of A to another node comes. That bind used to see no write
    in flight, find A unbound and release the card under the retry's write (which then bound A
    on a card the model had freed). Now it is refused while the retry is in flight."""
    svc, binder = scripted_service({"n": 1, "m": 1}, ["a"], ["unknown", "gate", "ok"])
    assert svc.bind(bind_args("a", "n")).startswith("cannot bind default/a to n: binding a to n: connection reset")
    assert list(svc.model.allocations) == ["uid-a"]      # kept: a may be running on it
    tr, rr = in_thread(svc.bind, bind_args("a", "n"))   # the retry, on the kept reservation
    assert binder.entered.wait(30)
    assert svc.bind(bind_args("a", "m")) == "a bind of pod default/a to n is still in progress"
    binder.gate.set()
    tr.join(30)
    assert rr["result"] == ""
    assert binder.bound == [("a", "n", [0])]
    assert {u: (al.node, al.cards) for u, al in svc.model.allocations.items()} == {"uid-a": ("n", (0,))}
    check_no_overbooking(svc.model)


def test_binds_of_one_pod_to_two_nodes_at_once_book_one_node():
    """A's write to n is in flight; a bind of A to m meanwhile is refused at once (no lookup, no
    second reservation); A ends on n only."""
    svc, binder = scripted_service({"n": 1, "m": 1}, ["a"], ["gate"])
    ta, ra = in_thread(svc.bind, bind_args("a", "n"))
    assert binder.entered.wait(30)
    assert svc.bind(bind_args("a", "m")) == "a bind of pod default/a to n is still in progress"
    binder.gate.set()
    ta.join(30)
    assert ra["result"] == "" and binder.bound == [("a", "n", [0])]
    assert {u: (al.node, al.cards) for u, al in svc.model.allocations.items()} == {"uid-a": ("n", (0,))}
    check_no_overbooking(svc.model)
