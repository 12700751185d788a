"""End to end: `stowage extender --simulated FILE` under real gunicorn, as a separate process,
driven with the captured kube-scheduler bodies; plus the CLI's own checks."""
from __future__ import annotations

import pytest
import requests
import yaml
from click.testing import CliRunner

from extender.cli import serve
from extender_harness import start_process

CLUSTER = {"nodes": [
    {"name": "node-a", "gpus": {"model": "Tesla T4", "count": 1, "memory": "16Gi"}},
    {"name": "node-b", "gpus": {"model": "Tesla T4", "count": 4, "memory": "16Gi"}},
    {"name": "node-c", "gpus": {"model": "NVIDIA H100-SXM5-80GB", "count": 8, "memory": "80Gi",
                                "nvlink": [[0, 1, 2, 3], [4, 5, 6, 7]]}},
]}


@pytest.fixture(params=[1, 2], ids=["one-process", "split"])
def extender(tmp_path, request):
    """The extender in both serving layouts: one worker holding the model, or (``--workers 2``)
    two HTTP workers in front of one decision process. Every test here must pass on both."""
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    proc, http = start_process(str(path), str(tmp_path), "--url-prefix", "/stowage/v1",
                               "--workers", str(request.param))
    proc.workers = request.param
    try:
        yield proc, http
    finally:
        http.close()
        proc.stop()


def test_gunicorn_end_to_end(extender, wire):
    proc, http = extender
    url = proc.url + "/stowage/v1"
    ans = http.post(url + "/filter", json=wire("node-cache", "01-filter"), timeout=30).json()
    assert ans["NodeNames"] == ["node-b", "node-c"] and ans["FailedAndUnresolvableNodes"] == {
        "node-a": "too few free cards for 2 GPUs: 1 free"}
    scores = http.post(url + "/prioritize", json=wire("node-cache", "02-prioritize"), timeout=30).json()
    assert [s["Host"] for s in scores] == ["node-a", "node-b", "node-c"]
    assert scores[0]["Score"] == 0 and max(s["Score"] for s in scores) == 10
    assert http.post(url + "/bind", json=wire("node-cache", "03-bind"), timeout=30).json() == {"Error": ""}
    uid = wire("node-cache", "03-bind")["PodUID"]
    al = http.get(f"{url}/allocations/{uid}", timeout=30).json()
    assert al["node"] == "node-c" and len(al["cards"]) == 2 and al["whole"]
    assert set(al["cards"]) <= {0, 1, 2, 3} or set(al["cards"]) <= {4, 5, 6, 7}  # one NVLink group

    full = wire("full-nodes", "04-filter")  # gpumem-2: 20 GiB on one card
    ans = http.post(url + "/filter", json=full, timeout=30).json()
    assert ans["NodeNames"] is None and [n["metadata"]["name"] for n in ans["Nodes"]["items"]] == ["node-c"]
    assert set(ans["FailedAndUnresolvableNodes"]) == {"node-a", "node-b"}
    bind = dict(wire("full-nodes", "06-bind"), Node="node-c")
    assert http.post(url + "/bind", json=bind, timeout=30).json() == {"Error": ""}

    state = http.get(url + "/state", timeout=30).json()
    assert set(state["allocations"]) == {uid, bind["PodUID"]}
    # The verbs live under the prefix only; health and metrics at the root.
    assert http.post(proc.url + "/filter", json=full, timeout=30).status_code == 404
    metrics = http.get(proc.url + "/metrics", timeout=30).text
    assert 'stowage_extender_requests_total{outcome="bound",verb="bind"} 2.0' in metrics
    assert "stowage_extender_allocations 2.0" in metrics
    assert http.post(url + "/filter", data=b"{", timeout=30).status_code == 400
    assert proc.proc.poll() is None
    assert proc.stop() == 0  # SIGTERM: graceful stop
    log = open(proc.log.name).read()
    assert "bound default/gpu-1 -> node-c cards" in log and "Traceback" not in log


def test_worker_processes_with_threads(extender):
    proc, http = extender
    log = open(proc.log.name).read()  # start_process waited for every worker to boot
    assert "Using worker: extender.intake.GuardedWorker" in log and log.count("Booting worker") == proc.workers
    assert ("decision process" in log) == (proc.workers > 1)


@pytest.mark.parametrize("argv,msg", [
    ([], "choose one model source"),
    (["--simulated", "builtin", "--in-cluster"], "choose one model source"),
    (["--simulated", "/nonexistent/cluster.yaml"], "cannot read cluster file"),
    (["--simulated", "builtin", "--default-node-policy", "tight"], "Invalid value for '--default-node-policy'"),
])
def test_cli_usage_errors(argv, msg):
    res = CliRunner().invoke(serve, argv)
    assert res.exit_code != 0 and msg in res.output


def test_cli_help_explains_the_two_layouts():
    res = CliRunner().invoke(serve, ["--help"])
    text = " ".join(res.output.split())
    assert res.exit_code == 0 and "ONE process" in text and "ONE decision process" in text


@pytest.mark.parametrize("workers", [1, 2])
def test_gunicorn_body_limits_and_chunked_bodies(tmp_path, wire, workers):
    """Bodies are read straight from gunicorn's input when their length is known: the limit,
    empty bodies and chunked (length-less) bodies still behave as under werkzeug's reader
    (in the split layout the HTTP worker refuses an oversized body; the count is the same)."""
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    proc, http = start_process(str(path), str(tmp_path), "--max-body-mib", "1", "--workers", str(workers), threads=2)
    try:
        big = b'{"Pod":{},"NodeNames":["' + b"n" * (1 << 20) + b'"]}'
        # A refused body is not read, so the server may drop the connection after answering:
        # each of these on a connection of its own (as a client would reconnect).
        r = requests.post(proc.url + "/filter", data=big, headers={"Content-Type": "application/json"}, timeout=30)
        assert r.status_code == 413 and "larger than 1048576 bytes" in r.json()["Error"]
        r = requests.post(proc.url + "/filter", data=iter([big[:1000], big[1000:]]), timeout=30)  # chunked
        assert r.status_code == 413
        r = http.post(proc.url + "/filter", data=b"", timeout=30)
        assert r.status_code == 400 and "empty request body" in r.json()["Error"]
        body = __import__("orjson").dumps(wire("node-cache", "01-filter"))
        r = http.post(proc.url + "/filter", data=iter([body[:100], body[100:]]), timeout=30)  # chunked, valid
        assert r.status_code == 200 and r.json()["NodeNames"] == ["node-b", "node-c"]
        metrics = http.get(proc.url + "/metrics", timeout=30).text
        assert 'stowage_extender_requests_total{outcome="too_large",verb="filter"} 2.0' in metrics
        assert 'stowage_extender_requests_total{outcome="bad_request",verb="filter"} 1.0' in metrics
    finally:
        http.close()
        proc.stop()


@pytest.mark.parametrize("workers", [1, 2])
def test_metrics_listener_serves_metrics_only(tmp_path, wire, workers):
    """--metrics-bind: Prometheus can scrape a second address, which answers nothing but metrics
    (the verbs stay on --bind, the pod's loopback in the sidecar layout)."""
    from benchmarks.latency.procs import free_port

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    mport = free_port()
    proc, http = start_process(str(path), str(tmp_path), "--metrics-bind", f"127.0.0.1:{mport}",
                               "--workers", str(workers), threads=2)
    try:
        assert http.post(proc.url + "/filter", json=wire("node-cache", "01-filter"), timeout=30).status_code == 200
        text = http.get(f"http://127.0.0.1:{mport}/metrics", timeout=30).text
        assert 'stowage_extender_requests_total{outcome="ok",verb="filter"} 1.0' in text
        assert "stowage_extender_nodes 3.0" in text
        # the verbs are not served there: a bind body posted to it binds nothing
        r = http.post(f"http://127.0.0.1:{mport}/bind", json=wire("node-cache", "03-bind"), timeout=30)
        assert r.status_code == 405
        assert http.get(proc.url + "/state", timeout=30).json()["allocations"] == {}
    finally:
        http.close()
        proc.stop()


def test_metrics_bind_is_checked_up_front():
    r = CliRunner().invoke(serve, ["--simulated", "builtin", "--metrics-bind", "9888"])
    assert r.exit_code == 2 and "expected HOST:PORT" in r.output
