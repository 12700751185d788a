"""The split layout reserves a bind's cards on the relay's reading thread, in arrival order with
the filters: a filter that comes after a bind sees its cards taken even while the bind's API
write still waits (here: for the one pool thread, held by another pod's blocked write).

Before, the whole bind ran in the pool: kube-scheduler's next pod could be filtered against a
model without the previous pod's cards, be offered the same node, and fail its bind (seen as
"Error scheduling pod; retrying" in bursts through the real kube-scheduler)."""
from __future__ import annotations

import time

import orjson

from extender.app import create_app
from extender.relay import OPS

from extender_harness import relay_to
from test_extender_concurrency import gated_service, gpu_pod, in_thread


def until(cond, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_filter_after_a_bind_sees_its_cards_while_the_write_waits(tmp_path):
    svc, binder = gated_service({"n1": 1, "n3": 1}, ["a", "b", "c"])
    app = create_app(svc)
    with relay_to(app, tmp_path, pool_threads=1) as (_server, client):
        one_pool_thread(svc, binder, app, client)


def one_pool_thread(svc, binder, app, client) -> None:
    """c's write holds the relay's one pool thread; a's bind must still reserve at once."""
    def filt(name: str, nodes: list[str]) -> dict:
        body = orjson.dumps({"Pod": gpu_pod(name), "Nodes": None, "NodeNames": nodes})
        return orjson.loads(client.call(OPS["filter"], body).body)

    def bind(name: str, node: str) -> dict:
        body = orjson.dumps({"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": node})
        return orjson.loads(client.call(OPS["bind"], body).body)

    gate_c = binder.hold("c")
    try:
        assert filt("c", ["n3"])["NodeNames"] == ["n3"]
        tc, rc = in_thread(bind, "c", "n3")
        assert binder.entered["c"].wait(30)          # c's write holds the one pool thread
        assert filt("a", ["n1"])["NodeNames"] == ["n1"]
        ta, ra = in_thread(bind, "a", "n1")           # its write must wait behind c's
        until(lambda: "uid-a" in svc.model.allocations, "a's cards to be reserved")
        assert "a" not in binder.entered and ta.is_alive()
        got = filt("b", ["n1"])
        assert got["NodeNames"] == [] and got["FailedNodes"]["n1"].startswith("too few free cards")
        gate_c.set()
        tc.join(30)
        ta.join(30)
        assert rc["result"] == {"Error": ""} and ra["result"] == {"Error": ""}
        assert binder.bound == {"c": ("n3", [0]), "a": ("n1", [0])}
        m = app.extensions["stowage"]["verbs"].metrics
        assert m.requests.labels("bind", "bound")._value.get() == 2   # counted once each, as before
    finally:
        gate_c.set()


def test_a_bind_of_a_pod_not_seen_at_filter_runs_whole_in_the_pool(tmp_path):
    """Reading the pod from the API would block the reading thread: such a bind is not split."""
    svc, binder = gated_service({"n1": 1}, ["a"])
    with relay_to(create_app(svc), tmp_path) as (_server, client):
        body = orjson.dumps({"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "n1"})
        assert orjson.loads(client.call(OPS["bind"], body).body) == {"Error": ""}
        assert binder.bound == {"a": ("n1", [0])}


def test_a_model_that_is_not_current_reserves_nothing_in_the_first_half():
    from extender.gate import NOT_READY, GatedVerbs
    svc, binder = gated_service({"n1": 1}, ["a"])
    app = create_app(svc)
    gated = GatedVerbs(app.extensions["stowage"]["verbs"], lambda: (False, "pods not listed yet"))
    svc.pod_info(gpu_pod("a"))
    body = orjson.dumps({"PodName": "a", "PodNamespace": "default", "PodUID": "uid-a", "Node": "n1"})
    first = gated.bind_begin(body)
    assert not callable(first) and NOT_READY in orjson.loads(first.body)["Error"]
    assert svc.model.allocations == {} and binder.bound == {}
