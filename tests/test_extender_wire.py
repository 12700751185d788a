"""Every body a real kube-scheduler sent (../shared/wire), through the real app over real HTTP.

The cluster behind node-a/b/c is ours (the captured Node objects carry no card inventory):
- node-a: 8x A100-80GB, 7 cards held by a whole-GPU pod (1 free card);
- node-b: 4x T4-16GB, all free (too small for 20 GiB of GPU memory);
- node-c: 8x H100-80GB in two NVLink groups {0-3} {4-7}; cards 4-7 each carry a 60 GiB share.
"""
from __future__ import annotations

import copy

import pytest

from packing.model import ClusterModel
from extender.service import ExtenderService
from packing.fit import WHOLE_ONLY
from extender.wire import parse_binding_args, parse_extender_args
from extender_harness import Server, gpus, model_from, simple_placers, take_shared, take_whole
from stowage.inventory import inventory_from_node

GIB = 1024
MODES = ["node-cache", "full-nodes"]


def wire_cluster() -> ClusterModel:
    model = model_from({"nodes": [
        {"name": "node-a", "gpus": gpus("NVIDIA A100-SXM4-80GB", 8, "80Gi", numa=[0, 0, 0, 0, 1, 1, 1, 1])},
        {"name": "node-b", "gpus": gpus("Tesla T4", 4, "16Gi")},
        {"name": "node-c", "gpus": gpus("NVIDIA H100-SXM5-80GB", 8, "80Gi", numa=[0, 0, 0, 0, 1, 1, 1, 1],
                                        nvlink=[[0, 1, 2, 3], [4, 5, 6, 7]])},
    ]})
    take_whole(model, "node-a", [0, 1, 2, 3, 4, 5, 6], "big-a")
    for k in range(4, 8):
        take_shared(model, "node-c", k, 60 * GIB, f"share-c{k}")
    return model


@pytest.fixture
def server():
    # The bodies were captured from kube-scheduler with filter + prioritize, as a config that
    # blends Stowage's ranking with kube-scheduler's scores runs it (--filter-keeps fitting).
    srv = Server(ExtenderService(wire_cluster(), placer_factory=simple_placers, filter_keeps="fitting"))
    yield srv
    srv.close()


def passing(mode: str, answer: dict) -> list[str]:
    """The nodes kube-scheduler would take from a filter answer in this mode."""
    if mode == "full-nodes":
        assert answer["NodeNames"] is None
        return [n["metadata"]["name"] for n in answer["Nodes"]["items"]]
    assert answer["Nodes"] is None
    return answer["NodeNames"]


def scores(answer: list) -> dict[str, int]:
    assert all(set(h) == {"Host", "Score"} for h in answer)
    return {h["Host"]: h["Score"] for h in answer}


@pytest.mark.parametrize("mode", MODES)
def test_captured_bodies_parse(wire, mode):
    for n in ("01", "04", "07"):
        args = parse_extender_args(__import__("orjson").dumps(wire(mode, f"{n}-filter")))
        assert sorted(args.names) == ["node-a", "node-b", "node-c"]
        assert args.full_nodes == (mode == "full-nodes")
    b = parse_binding_args(__import__("orjson").dumps(wire(mode, "03-bind")))
    assert b.pod_namespace == "default"
    assert b.pod_name.startswith("gpu-") and b.node == "node-c"
    assert b.pod_uid == wire(mode, "01-filter")["Pod"]["metadata"]["uid"]


@pytest.mark.parametrize("mode", MODES)
def test_wire_sequence(server, wire, mode):
    model = server.service.model

    # --- gpu-1: nvidia.com/gpu: 2
    r = server.post("/filter", wire(mode, "01-filter"))
    assert r.status_code == 200
    ans = r.json()
    assert set(ans) == {"NodeNames", "Nodes", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert ans["Error"] == ""
    assert sorted(passing(mode, ans)) == ["node-b", "node-c"]
    assert ans["FailedNodes"] == {"node-a": "too few free cards for 2 GPUs: 1 free"}
    assert ans["FailedAndUnresolvableNodes"] == {}
    if mode == "full-nodes":  # the Node objects come back exactly as received
        sent = {n["metadata"]["name"]: n for n in wire(mode, "01-filter")["Nodes"]["items"]}
        for n in ans["Nodes"]["items"]:
            assert n == sent[n["metadata"]["name"]]
    r = server.post("/prioritize", wire(mode, "02-prioritize"))
    s = scores(r.json())
    assert list(s) == [n["metadata"]["name"] for n in wire(mode, "02-prioritize")["Nodes"]["items"]] \
        if mode == "full-nodes" else wire(mode, "02-prioritize")["NodeNames"]
    # pack: node-c is more allocated than the empty node-b; node-a cannot take the pod
    assert s["node-c"] == 10 and s["node-b"] < s["node-c"] and s["node-a"] == 0
    r = server.post("/bind", wire(mode, "03-bind"))
    assert r.status_code == 200 and r.json() == {"Error": ""}
    uid = wire(mode, "03-bind")["PodUID"]
    al = model.allocations[uid]
    assert al.node == "node-c" and al.whole and len(al.cards) == 2
    assert set(al.cards) <= {0, 1, 2, 3}  # the free NVLink group, not split across groups

    # --- gpumem-1: nvidia.com/gpu-memory: 20 (GiB) on one shared card
    ans = server.post("/filter", wire(mode, "04-filter")).json()
    assert sorted(passing(mode, ans)) == ["node-a", "node-c"]
    assert ans["FailedNodes"] == {}
    assert ans["FailedAndUnresolvableNodes"] == {
        "node-b": "no card with 20 GiB GPU memory free"}       # no per-node numbers: they add up
    s = scores(server.post("/prioritize", wire(mode, "05-prioritize")).json())
    assert s["node-b"] == 0 and s["node-a"] > s["node-c"]  # node-a is the fuller node
    bind = wire(mode, "06-bind")
    if bind["Node"] == "node-b":
        # The real scheduler (without Stowage) chose node-b in the full-nodes capture; on our
        # cluster node-b's T4s are too small: bind answers Error and records nothing.
        before = {u: (a.node, a.cards) for u, a in model.allocations.items()}
        ans = server.post("/bind", bind).json()
        assert ans["Error"] == ("cannot bind default/gpumem-2 to node-b now: no card with 20 GiB GPU memory "
                                "free: best is 16 GiB on card 0")
        assert {u: (a.node, a.cards) for u, a in model.allocations.items()} == before
        bind = dict(bind, Node="node-c")  # the scheduler retries; now on a node that fits
    assert server.post("/bind", bind).json() == {"Error": ""}
    al = model.allocations[bind["PodUID"]]
    assert al.node == "node-c" and not al.whole and al.mem_mib == (20 * GIB,)
    k = al.cards[0]
    assert k in {4, 5, 6, 7}  # best fit: an already shared card with exactly 20 GiB left
    i = model.index["node-c"]
    assert model.a.mem_free[i, k] == 0 and model.a.pods[i, k] == 2

    # --- both-1: nvidia.com/gpu: 1 with gpu-memory: 20 = one whole card of >= 20 GiB
    ans = server.post("/filter", wire(mode, "07-filter")).json()
    assert sorted(passing(mode, ans)) == ["node-a", "node-c"]
    assert ans["FailedAndUnresolvableNodes"] == {
        "node-b": "too few free cards for 1 GPU: 0 free (4 excluded by model/size policy)"}
    s = scores(server.post("/prioritize", wire(mode, "08-prioritize")).json())
    assert s["node-b"] == 0
    assert server.post("/bind", wire(mode, "09-bind")).json() == {"Error": ""}
    al = model.allocations[wire(mode, "09-bind")["PodUID"]]
    assert al.node == "node-c" and al.whole and len(al.cards) == 1
    assert al.cards[0] in {0, 1, 2, 3} and al.cards[0] not in model.allocations[uid].cards

    # Repeating a bind that already succeeded is harmless (same node): no second hold.
    assert server.post("/bind", wire(mode, "09-bind")).json() == {"Error": ""}
    assert len(model.allocations) == 1 + 4 + 3


@pytest.mark.parametrize("mode", MODES)
def test_wire_key_case_is_not_checked(server, wire, mode):
    """Go decodes field names case-insensitively; so do we."""
    body = {k.lower(): v for k, v in wire(mode, "01-filter").items()}
    ans = server.post("/filter", body).json()
    assert sorted(passing(mode, ans)) == ["node-b", "node-c"]
    bind = {k.upper(): v for k, v in wire(mode, "03-bind").items()}
    assert server.post("/bind", bind).json() == {"Error": ""}


def test_model_from_captured_nodes(wire):
    """Nodes as captured (NVIDIA's plugin: allocatable only) still pack whole GPUs; shares are refused."""
    model = ClusterModel()
    for node in wire("full-nodes", "01-filter")["Nodes"]["items"]:
        model.upsert_node(node["metadata"]["name"], inventory_from_node(node))
    with Server(ExtenderService(model)) as srv:
        ans = srv.post("/filter", wire("full-nodes", "01-filter")).json()
        assert len(ans["Nodes"]["items"]) == 3
        ans = srv.post("/filter", wire("node-cache", "04-filter")).json()
        assert ans["NodeNames"] == []
        assert ans["FailedAndUnresolvableNodes"] == {n: WHOLE_ONLY for n in ("node-a", "node-b", "node-c")}
        assert srv.post("/bind", wire("full-nodes", "03-bind")).json() == {"Error": ""}
        assert len(model.allocations[wire("full-nodes", "03-bind")["PodUID"]].cards) == 2


def test_bind_without_prioritize(server, wire):
    """kube-scheduler skips prioritize when one node is feasible: bind must not need it."""
    ans = server.post("/filter", wire("node-cache", "07-filter")).json()
    assert "node-c" in ans["NodeNames"]
    assert server.post("/bind", wire("node-cache", "09-bind")).json() == {"Error": ""}
    assert wire("node-cache", "09-bind")["PodUID"] in server.service.model.allocations


def test_unknown_nodes_fail_without_error(server, wire):
    body = copy.deepcopy(wire("node-cache", "01-filter"))
    body["NodeNames"] = ["node-c", "ghost-1", "node-a"]
    ans = server.post("/filter", body).json()
    assert ans["Error"] == "" and ans["NodeNames"] == ["node-c"]
    assert ans["FailedNodes"] == {"ghost-1": "node unknown to Stowage", "node-a": "too few free cards for 2 GPUs: 1 free"}


@pytest.mark.parametrize("field", ["PodName", "PodNamespace", "PodUID", "Node"])
def test_a_bind_body_with_a_name_no_kubernetes_object_has_is_refused_in_a_short_message(field):
    """A Kubernetes name has at most 253 characters. A bind body that is not kube-scheduler's may
    send a name of megabytes: it went into the bind log line, the error answered and a GET of the
    pod, whole."""
    from extender.wire import WireError

    body = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1", field: "x" * 100_000}
    with pytest.raises(WireError) as err:
        parse_binding_args(__import__("orjson").dumps(body))
    assert field in str(err.value) and "253" in str(err.value) and len(str(err.value)) < 200
    body[field] = "x" * 253
    assert parse_binding_args(__import__("orjson").dumps(body))   # the longest name there is
