"""Every class of bad input, over real HTTP: a clear answer, never a 500 with a traceback, never
a lost or half-recorded allocation."""
from __future__ import annotations

import orjson
import pytest

from extender.service import UNKNOWN_NODE, ExtenderService
from stowage.inventory import Inventory
from extender_harness import Server, gpus, model_from, simple_placers, take_whole

NODES = ["node-a", "node-b"]


def cluster():
    return model_from({"nodes": [
        {"name": "node-a", "gpus": gpus("NVIDIA A100-SXM4-80GB", 4, "80Gi")},
        {"name": "node-b", "gpus": gpus("Tesla T4", 2, "16Gi")},
    ]})


def pod(name="p1", uid="uid-p1", limits=None, annotations=None, **spec):
    return {"metadata": {"name": name, "namespace": "default", "uid": uid, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits or {}}}], **spec}}


def args(p, names=NODES):
    return {"Pod": p, "Nodes": None, "NodeNames": list(names)}


def snapshot(model):
    return ({u: (a.node, a.cards, a.mem_mib) for u, a in model.allocations.items()},
            model.a.mem_free.copy(), model.a.pods.copy())


def same(s1, s2):
    return s1[0] == s2[0] and (s1[1] == s2[1]).all() and (s1[2] == s2[2]).all()


class RecordingBinder:
    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def bind(self, namespace, name, uid, node, record):
        self.calls.append((namespace, name, uid, node, record))
        if self.fail is not None:
            raise self.fail


@pytest.fixture
def srv():
    s = Server(ExtenderService(cluster(), placer_factory=simple_placers), max_body_bytes=64 * 1024)
    yield s
    s.close()


# --------------------------------------------------------------------------- not a request at all
@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind"])
@pytest.mark.parametrize("data,msg", [
    (b"{not json", "not valid JSON"),
    (b"", "empty request body"),
    (b"[]", "must be a JSON object"),
    (b"\"Pod\"", "must be a JSON object"),
    (b"\xff\xfe", "not valid JSON"),
])
def test_not_json_object(srv, verb, data, msg):
    r = srv.post(f"/{verb}", data=data, headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    assert r.headers["Content-Type"] == "application/json"
    assert msg in r.json()["Error"]


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
@pytest.mark.parametrize("body,msg", [
    ({"NodeNames": NODES}, "no 'Pod'"),
    ({"Pod": [1], "NodeNames": NODES}, "'Pod' must be a Pod object"),
    ({"Pod": pod(), "NodeNames": "node-a"}, "'NodeNames' must be a list"),
    ({"Pod": pod(), "NodeNames": ["node-a", 3]}, "'NodeNames' must be a list"),
    ({"Pod": pod(), "Nodes": ["node-a"]}, "'Nodes' must be a NodeList"),
    ({"Pod": pod(), "Nodes": {"items": {"a": 1}}}, "'Nodes.items' must be a list"),
    ({"Pod": pod(), "Nodes": {"items": [{"metadata": {}}]}}, "has no metadata.name"),
    ({"Pod": pod(), "Nodes": {"items": ["node-a"]}}, "must be a Node object"),
])
def test_wrong_shapes(srv, verb, body, msg):
    r = srv.post(f"/{verb}", body)
    assert r.status_code == 400 and msg in r.json()["Error"]


@pytest.mark.parametrize("body,msg", [
    ({"PodName": "p", "PodNamespace": "default", "PodUID": "u"}, "missing Node"),
    ({"PodNamespace": "default", "Node": "node-a"}, "missing PodName"),
    ({"PodName": 3, "Node": "node-a"}, "'PodName' must be a string"),
    ({"PodName": "p", "Node": ["node-a"]}, "'Node' must be a string"),
])
def test_bind_wrong_shapes(srv, body, msg):
    r = srv.post("/bind", body)
    assert r.status_code == 400 and msg in r.json()["Error"]


def test_oversized_body(srv):
    big = args(pod())
    big["Pod"]["metadata"]["annotations"]["x"] = "y" * 100_000
    r = srv.post("/filter", big)
    assert r.status_code == 413 and "larger than 65536 bytes" in r.json()["Error"]
    # Without Content-Length (chunked), the limit still holds.
    data = orjson.dumps(big)
    r = srv.post("/filter", data=(data[i:i + 8192] for i in range(0, len(data), 8192)))
    assert r.status_code == 413
    # ...and the server is fine afterwards.
    ok = srv.post("/filter", args(pod(limits={"nvidia.com/gpu": "1"})))
    assert ok.status_code == 200 and ok.json()["NodeNames"] and set(ok.json()["NodeNames"]) <= set(NODES)


def test_unknown_paths_and_methods_answer_json(srv):
    r = srv.get("/filter")
    assert r.status_code == 405 and "Method Not Allowed" in r.json()["Error"]
    r = srv.get("/nope")
    assert r.status_code == 404 and "Not Found" in r.json()["Error"]


# ------------------------------------------------------------- requests that cannot be honoured
@pytest.mark.parametrize("limits,annotations,msg", [
    ({"nvidia.com/gpu": "abc"}, {}, "invalid quantity 'abc'"),
    ({"nvidia.com/gpu": "-1"}, {}, "must not be negative"),
    ({"nvidia.com/gpu": "1.5"}, {}, "must be a whole number"),
    ({"nvidia.com/gpu-memory": "8", "nvidia.com/gpu-core": "150"}, {}, "percentage of one card"),
    ({"nvidia.com/gpu-core": "30"}, {}, "needs nvidia.com/gpu-memory"),
    ({"nvidia.com/gpu": "1"}, {"stowage.io/node-policy": "tightest"}, "unknown value 'tightest'"),
    ({"nvidia.com/gpu": "1"}, {"stowage.io/card-policy": ""}, "stowage.io/card-policy: unknown value"),
    ({"nvidia.com/gpu": "1"}, {"stowage.io/min-card-memory": "lots"}, "is not a quantity"),
    ({"nvidia.com/gpu": "1"}, {"stowage.io/gpu-modle": "A100"}, "unknown annotation stowage.io/gpu-modle"),
    # Model lists are learned with the pod and matched against every model at every rebuild of
    # the learned workload: a list written to be huge would cost every later pod.
    ({"nvidia.com/gpu": "1"}, {"stowage.io/gpu-model": ",".join(f"m{i}" for i in range(65))},
     "stowage.io/gpu-model: 65 models, at most 64"),
    ({"nvidia.com/gpu": "1"}, {"stowage.io/gpu-model-exclude": "A100," + "x" * 129},
     "stowage.io/gpu-model-exclude: a model name of 129 characters, at most 128"),
])
def test_bad_requests_are_unresolvable_everywhere(srv, limits, annotations, msg):
    p = pod(limits=limits, annotations=annotations)
    r = srv.post("/filter", args(p, NODES + ["ghost"]))
    assert r.status_code == 200
    ans = r.json()
    assert ans["Error"] == "" and ans["NodeNames"] == [] and ans["FailedNodes"] == {}
    assert set(ans["FailedAndUnresolvableNodes"]) == {"node-a", "node-b", "ghost"}
    for reason in ans["FailedAndUnresolvableNodes"].values():
        assert reason.startswith("Stowage cannot schedule this pod: ") and msg in reason
    assert [h["Score"] for h in srv.post("/prioritize", args(p)).json()] == [0, 0]
    before = snapshot(srv.service.model)
    err = srv.post("/bind", {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "node-a"}).json()
    assert msg in err["Error"]
    assert same(before, snapshot(srv.service.model))


@pytest.mark.parametrize("spec_patch", [
    {"containers": "c"},
    {"containers": [{"name": "c", "resources": "lots"}]},
    {"containers": [{"name": "c", "resources": {"limits": ["nvidia.com/gpu"]}}]},
])
def test_malformed_pod_spec(srv, spec_patch):
    p = pod()
    p["spec"] = spec_patch
    ans = srv.post("/filter", args(p)).json()
    assert ans["NodeNames"] == [] and set(ans["FailedAndUnresolvableNodes"]) == set(NODES)
    assert all("Stowage cannot schedule this pod" in v for v in ans["FailedAndUnresolvableNodes"].values())


def test_all_nodes_unknown(srv):
    ans = srv.post("/filter", args(pod(limits={"nvidia.com/gpu": "1"}), ["x", "y"])).json()
    assert ans["NodeNames"] == [] and ans["FailedNodes"] == {"x": UNKNOWN_NODE, "y": UNKNOWN_NODE}
    assert srv.post("/prioritize", args(pod(limits={"nvidia.com/gpu": "1"}), ["x", "y"])).json() == [
        {"Host": "x", "Score": 0}, {"Host": "y", "Score": 0}]


def test_empty_node_list(srv):
    ans = srv.post("/filter", {"Pod": pod(limits={"nvidia.com/gpu": "1"}), "NodeNames": []}).json()
    assert ans["NodeNames"] == [] and ans["FailedNodes"] == {} and ans["Error"] == ""
    ans = srv.post("/filter", {"Pod": pod(limits={"nvidia.com/gpu": "1"})}).json()
    assert ans["NodeNames"] == []


def test_pod_without_gpu_is_placed_on_host_room():
    """A pod that asks for no GPU goes through the same three steps: it passes the nodes with
    room for its CPU, memory and one more pod, is scored by the placer, and its bind reserves
    that room (no record: it holds no card)."""
    binder = RecordingBinder()
    model = cluster()

    def host(name, **kw):  # the node as the watch would give it, with allocatable host resources
        model.upsert_node(name, Inventory(cards=tuple(model.cards_of(name)), source="annotation"), **kw)

    host("node-b", cpu_milli=1500.0)   # node-b: 1.5 CPUs
    with Server(ExtenderService(model, binder=binder)) as srv:
        p = pod(limits={"cpu": "2", "memory": "1Gi"})
        ans = srv.post("/filter", args(p, NODES + ["cpu-only-node"])).json()
        assert ans["NodeNames"] == ["node-a"]
        assert ans["FailedNodes"] == {"node-b": "too little CPU free for the 2000m the pod needs",
                                      "cpu-only-node": UNKNOWN_NODE}
        scores = {h["Host"]: h["Score"] for h in srv.post("/prioritize", args(p)).json()}
        assert scores["node-a"] == 10 and scores["node-b"] == 0
        assert srv.post("/bind", {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1",
                                  "Node": "node-a"}).json() == {"Error": ""}
        assert binder.calls == [("default", "p1", "uid-p1", "node-a", None)]
        held = model.allocations["uid-p1"]
        assert (held.node, held.cards, held.cpu_milli, held.host_mem_mib) == ("node-a", (), 2000, 1024.0)
        assert model.a.cpu_free[model.index["node-a"]] == float("inf")   # not modelled there
        host("node-a", max_pods=2)   # p1 holds one of the two slots
        q = pod(name="p2", uid="uid-p2", limits={"cpu": "1"})
        assert srv.post("/filter", args(q, ["node-a"])).json()["FailedNodes"] == {}
        host("node-a", max_pods=1)
        assert srv.post("/filter", args(q, ["node-a"])).json()["FailedNodes"] == {
            "node-a": "too many pods: the node's pod limit (allocatable pods) is reached"}


# ------------------------------------------------------------------------------------------ bind
def test_bind_unknown_pod_and_node(srv):
    model = srv.service.model
    before = snapshot(model)
    err = srv.post("/bind", {"PodName": "never", "PodNamespace": "default", "PodUID": "u0", "Node": "node-a"}).json()
    assert "was not seen at filter and no pod source is configured" in err["Error"]
    srv.post("/filter", args(pod(limits={"nvidia.com/gpu": "1"})))
    err = srv.post("/bind", {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "ghost"}).json()
    assert err["Error"] == f"cannot bind default/p1 to ghost: {UNKNOWN_NODE}"
    assert same(before, snapshot(model))


def test_bind_when_cards_were_taken_in_between(srv):
    """filter saw room; another pod took the cards; bind answers Error and changes nothing."""
    model = srv.service.model
    p = pod(limits={"nvidia.com/gpu": "3"})
    assert "node-a" in srv.post("/filter", args(p)).json()["NodeNames"]
    take_whole(model, "node-a", [0, 1], "other")
    before = snapshot(model)
    err = srv.post("/bind", {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "node-a"}).json()
    assert err["Error"] == "cannot bind default/p1 to node-a now: too few free cards for 3 GPUs: 2 free"
    assert same(before, snapshot(model))


def test_bind_recheck_catches_a_bad_card_choice():
    """Even if card choice went wrong, model.assign's re-check refuses an occupied card."""
    from packing.placer import PlacerBase

    class Stubborn(PlacerBase):
        name = "stubborn"

        def score(self, a, req, idx, usable):
            return idx * 0.0

        def choose_cards(self, a, i, req, usable_row, policy):
            return [0]  # always card 0, taken or not

    model = cluster()
    take_whole(model, "node-a", [0], "other")
    with Server(ExtenderService(model, placer_factory=lambda p: Stubborn())) as srv:
        srv.post("/filter", args(pod(limits={"nvidia.com/gpu": "1"})))
        before = snapshot(model)
        err = srv.post("/bind", {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1",
                                 "Node": "node-a"}).json()
        assert err["Error"] == "cannot bind default/p1 to node-a: card 0 on node-a is no longer free"
        assert same(before, snapshot(model))


@pytest.mark.parametrize("failure", [RuntimeError("API server said 409: pod already bound"), OSError("reset")])
def test_binder_failure_releases_reservation(failure):
    model = cluster()
    binder = RecordingBinder(fail=failure)
    with Server(ExtenderService(model, binder=binder, placer_factory=simple_placers)) as srv:
        p = pod(limits={"nvidia.com/gpu-memory": "10"})
        srv.post("/filter", args(p))
        before = snapshot(model)
        b = {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "node-a"}
        err = srv.post("/bind", b).json()["Error"]
        assert err.startswith("cannot bind default/p1 to node-a: ") and str(failure) in err
        assert len(binder.calls) == 1 and binder.calls[0][4].cards[0].memory_mib == 10 * 1024
        assert same(before, snapshot(model))
        binder.fail = None  # the scheduler retries; now it works
        assert srv.post("/bind", b).json() == {"Error": ""}
        assert model.allocations["uid-p1"].mem_mib == (10 * 1024,)


def test_pod_source_used_when_filter_was_not_seen():
    class Pods:
        def __init__(self):
            self.pods = {("default", "p1"): pod(limits={"nvidia.com/gpu": "2"}),
                         ("default", "recreated"): pod(name="recreated", uid="new-uid",
                                                      limits={"nvidia.com/gpu": "1"})}

        def get_pod(self, namespace, name):
            if name == "boom":
                raise ConnectionError("API server unreachable")
            return self.pods.get((namespace, name))

    model = cluster()
    with Server(ExtenderService(model, pod_source=Pods())) as srv:
        assert srv.post("/bind", {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1",
                                  "Node": "node-a"}).json() == {"Error": ""}
        assert len(model.allocations["uid-p1"].cards) == 2
        e = srv.post("/bind", {"PodName": "gone", "PodNamespace": "default", "PodUID": "u", "Node": "node-a"})
        assert e.json()["Error"] == "pod default/gone not found"
        e = srv.post("/bind", {"PodName": "recreated", "PodNamespace": "default", "PodUID": "old-uid",
                               "Node": "node-a"})
        assert "re-created" in e.json()["Error"]
        e = srv.post("/bind", {"PodName": "boom", "PodNamespace": "default", "PodUID": "u", "Node": "node-a"})
        assert "API server unreachable" in e.json()["Error"]
        assert list(model.allocations) == ["uid-p1"]


def test_bind_twice_on_another_node_is_refused(srv):
    srv.post("/filter", args(pod(limits={"nvidia.com/gpu": "1"})))
    b = {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "node-a"}
    assert srv.post("/bind", b).json() == {"Error": ""}
    err = srv.post("/bind", dict(b, Node="node-b")).json()["Error"]
    assert err.startswith("pod default/p1 already holds cards") and "node-a" in err


# --------------------------------------------------------------------------- internal failures
def test_internal_errors_never_500(srv, monkeypatch, caplog):
    def boom(*a, **k):
        raise KeyError("bug")

    for verb in ("filter", "prioritize", "bind"):
        monkeypatch.setattr(srv.service, verb, boom)
    p = pod(limits={"nvidia.com/gpu": "1"})
    r = srv.post("/filter", args(p))
    assert r.status_code == 200
    ans = r.json()
    assert ans["Error"] == "" and ans["NodeNames"] == []
    assert set(ans["FailedNodes"]) == set(NODES) and "internal error" in ans["FailedNodes"]["node-a"]
    full = {"Pod": p, "Nodes": {"items": [{"metadata": {"name": "node-a"}}]}}
    ans = srv.post("/filter", full).json()
    assert ans["Nodes"] == {"metadata": {}, "items": []} and "node-a" in ans["FailedNodes"]
    r = srv.post("/prioritize", args(p))
    assert r.status_code == 200 and r.json() == []
    r = srv.post("/bind", {"PodName": "p1", "Node": "node-a"})
    assert r.status_code == 200 and "internal error" in r.json()["Error"]
    assert "Traceback" not in r.text
    assert any("internal error" in rec.getMessage() for rec in caplog.records)


def test_readyz_and_metrics():
    state = {"ok": False}

    def ready():
        if state.get("raise"):
            raise RuntimeError("feeder crashed")
        return state["ok"], "watch stale for 95s" if not state["ok"] else "synced"

    with Server(ExtenderService(cluster()), ready=ready) as srv:
        r = srv.get("/readyz")
        assert r.status_code == 503 and r.json() == {"ready": False, "message": "watch stale for 95s"}
        state["ok"] = True
        assert srv.get("/readyz").status_code == 200
        state["raise"] = True
        r = srv.get("/readyz")
        assert r.status_code == 503 and "feeder crashed" in r.json()["message"]
        assert srv.get("/healthz").status_code == 200
        state["raise"] = False  # (a readiness check that raises makes the verbs refuse: test_extender_model_gate)
        srv.post("/filter", args(pod(limits={"nvidia.com/gpu": "1"})))
        srv.post("/filter", data=b"nope")
        srv.post("/bind", {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "node-a"})
        text = srv.get("/metrics").text
        assert 'stowage_extender_requests_total{outcome="ok",verb="filter"} 1.0' in text
        assert 'stowage_extender_requests_total{outcome="bad_request",verb="filter"} 1.0' in text
        assert 'stowage_extender_requests_total{outcome="bound",verb="bind"} 1.0' in text
        assert 'stowage_extender_request_duration_seconds_count{verb="filter"} 2.0' in text
        assert "stowage_extender_nodes 2.0" in text and "stowage_extender_cards 6.0" in text
        assert "stowage_extender_allocations 1.0" in text and "stowage_extender_free_whole_cards 5.0" in text
