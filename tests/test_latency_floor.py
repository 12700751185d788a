"""The do-nothing extender (benchmarks/latency/floor.py) in the forms the benchmarks use: the
latency floor (passes everything, bind says yes) and the burst floor (--keep-first, bind creates
the Binding through the function it is given)."""
from __future__ import annotations

import json

from benchmarks.latency.floor import create_floor_app

POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}, "spec": {}}
NAMES = ["n-3", "n-1", "n-2"]


def _filter(app, body: dict) -> dict:
    r = app.test_client().post("/filter", data=json.dumps(body), content_type="application/json")
    assert r.status_code == 200
    return r.get_json()


def _bind(app) -> dict:
    body = {"PodName": "p", "PodNamespace": "ns", "PodUID": "u-1", "Node": "n-1"}
    r = app.test_client().post("/bind", data=json.dumps(body), content_type="application/json")
    assert r.status_code == 200
    return r.get_json()


def test_latency_floor_passes_every_node_and_binds_nothing() -> None:
    app = create_floor_app()
    assert _filter(app, {"Pod": POD, "NodeNames": NAMES})["NodeNames"] == NAMES
    assert not _bind(app).get("Error")


def test_burst_floor_keeps_the_first_node_it_was_sent() -> None:
    app = create_floor_app(keep_first=True)
    assert _filter(app, {"Pod": POD, "NodeNames": NAMES})["NodeNames"] == ["n-3"]
    nodes = [{"metadata": {"name": n}} for n in NAMES]
    got = _filter(app, {"Pod": POD, "Nodes": {"items": nodes}})
    assert [n["metadata"]["name"] for n in got["Nodes"]["items"]] == ["n-3"]


def test_burst_floor_binds_through_its_bind_function_and_reports_a_failure() -> None:
    calls = []
    app = create_floor_app(keep_first=True, bind_fn=lambda *a: calls.append(a))
    assert not _bind(app).get("Error")
    assert calls == [("ns", "p", "u-1", "n-1")]

    def refuse(*_a) -> None:
        raise RuntimeError("409 Conflict: pod p is already assigned to node n-9")
    err = _bind(create_floor_app(keep_first=True, bind_fn=refuse))["Error"]
    assert "ns/p" in err and "n-1" in err and "already assigned" in err
