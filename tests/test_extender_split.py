"""The split layout (`stowage extender --workers N`): HTTP workers in front of one decision process.

Everything runs for real: gunicorn with several worker processes, the decision process, the
unix-socket relay between them, over real HTTP. What must hold:
- the answers are the very bytes the one-process layout gives, for the same requests;
- concurrent binds arriving through different workers never share a card;
- the process tree lives and dies together (no orphaned model, no extender without a model);
- without the decision process, each verb still answers the way kube-scheduler handles best.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import threading
import time
from pathlib import Path

import orjson
import pytest
import requests
import yaml
from werkzeug.test import Client

from benchmarks.latency import cluster as benchcluster
from extender.app import create_app
from extender.demo import ExtenderProcess
from extender_harness import model_from, relay_to, start_process
from extender.frontend import create_frontend
from extender.relay import OP_OTHER, OPS, TOO_LARGE
from extender.service import ExtenderService
from test_extender_gunicorn import CLUSTER

# The wire fixtures' cluster (node-a: 1 T4, node-b: 4 T4, node-c: 8 H100 in two NVLink groups).
SMALL = CLUSTER


def _start(tmp_path: Path, cluster_file: Path, workers: int, name: str) -> tuple[ExtenderProcess, requests.Session]:
    log_dir = tmp_path / name
    log_dir.mkdir()
    return start_process(str(cluster_file), str(log_dir), "--workers", str(workers))


@pytest.fixture
def small_split(tmp_path):
    """The SMALL cluster served by the split layout (2 HTTP workers); (process, session)."""
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    proc, http = _start(tmp_path, path, 2, "small")
    yield proc, http
    http.close()
    proc.stop()


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def _decider_pid(proc: ExtenderProcess) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in Path(proc.log.name).read_text().splitlines():
            if "decision process" in line and "serving the model" in line:
                return int(line.split("decision process ")[1].split()[0])
        time.sleep(0.05)
    raise AssertionError("no decision process in the log:\n" + proc.log_tail())


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _schedule(http: requests.Session, url: str, pod: dict, names: list[str]) -> list[tuple]:
    """kube-scheduler's three calls for one pod; status, content type and raw bytes of each answer."""
    out = []
    seen = lambda r: (r.status_code, r.headers.get("Content-Type"), r.content)  # noqa: E731
    r = http.post(url + "/filter", data=orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}), timeout=30)
    out.append(seen(r))
    passing = r.json()["NodeNames"] or []
    if not passing:
        return out
    node = passing[0]
    if len(passing) > 1:
        r = http.post(url + "/prioritize", data=orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": passing}),
                      timeout=30)
        out.append(seen(r))
        node = max(r.json(), key=lambda s: s["Score"])["Host"]
    m = pod["metadata"]
    r = http.post(url + "/bind", data=orjson.dumps({"PodName": m["name"], "PodNamespace": m["namespace"],
                                                    "PodUID": m["uid"], "Node": node}), timeout=30)
    out.append(seen(r))
    return out


def test_split_answers_are_the_one_process_answers(tmp_path):
    """80 mixed pods (shares, whole cards, multi-card, model and spread annotations) scheduled one
    after another on a 60-node cluster: every answer byte-identical between the layouts, and
    the same cards held at the end."""
    cluster_file = benchcluster.write_cluster(60, tmp_path)
    names = benchcluster.node_names(60)
    pods = benchcluster.pods(80, seed=11)
    one, http1 = _start(tmp_path, cluster_file, 1, "one")
    split, http2 = _start(tmp_path, cluster_file, 2, "split")
    try:
        placed = 0
        for pod in pods:
            a = _schedule(http1, one.url, pod, names)
            b = _schedule(http2, split.url, pod, names)
            assert a == b, pod["metadata"]["name"]
            placed += a[-1] == (200, "application/json", b'{"Error":""}')
        assert placed > 40  # the sequence really binds (not 80 refusals compared)
        s1 = http1.get(one.url + "/state", timeout=30).json()
        s2 = http2.get(split.url + "/state", timeout=30).json()
        assert s1["allocations"] == s2["allocations"] and len(s1["allocations"]) == placed
        assert http2.get(split.url + "/metrics", timeout=30).text.count("stowage_extender_requests_total") >= 3
    finally:
        for s in (http1, http2):
            s.close()
        assert one.stop() == 0
        assert split.stop() == 0


def test_concurrent_binds_through_several_workers_never_share_a_card(tmp_path, wire):
    """24 one-card pods, all bound to the same 4-card node at once from 12 threads, each request on
    a new connection (so they spread over the HTTP workers): exactly 4 win, on 4 distinct cards."""
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    proc, http = _start(tmp_path, path, 3, "race")
    template = wire("node-cache", "01-filter")["Pod"]
    pods = []
    for j in range(24):
        pod = orjson.loads(orjson.dumps(template))
        pod["metadata"].update(name=f"race-{j}", uid=f"race-uid-{j}")
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"},
                                                     "requests": {"nvidia.com/gpu": "1"}}
        pods.append(pod)
    results: list[str] = []
    lock = threading.Lock()
    go = threading.Barrier(12)

    def run(mine: list[dict]) -> None:
        go.wait()
        for pod in mine:
            hdr = {"Connection": "close", "Content-Type": "application/json"}
            body = {"Pod": pod, "Nodes": None, "NodeNames": ["node-b"]}
            requests.post(proc.url + "/filter", data=orjson.dumps(body), headers=hdr, timeout=30)
            m = pod["metadata"]
            r = requests.post(proc.url + "/bind", headers=hdr, timeout=30, data=orjson.dumps(
                {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": "node-b"}))
            with lock:
                results.append(r.json()["Error"])

    threads = [threading.Thread(target=run, args=(pods[i::12],)) for i in range(12)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(results) == 24
        assert sum(e == "" for e in results) == 4
        assert all("cannot bind" in e for e in results if e)
        allocs = http.get(proc.url + "/state", timeout=30).json()["allocations"]
        cards = sorted(c for a in allocs.values() for c in a["cards"])
        assert len(allocs) == 4 and cards == [0, 1, 2, 3]
        assert all(a["node"] == "node-b" for a in allocs.values())
    finally:
        http.close()
        assert proc.stop() == 0


def test_decision_process_death_stops_the_extender(small_split):
    proc, _http = small_split
    pid = _decider_pid(proc)
    os.kill(pid, signal.SIGKILL)
    proc.proc.wait(30)
    assert proc.proc.returncode == 1
    log = Path(proc.log.name).read_text()
    assert f"the decision process (pid {pid}) exited: stopping the extender" in log


def test_master_death_stops_the_decision_process(small_split):
    proc, _http = small_split
    pid = _decider_pid(proc)
    assert _alive(pid)
    proc.proc.kill()
    proc.proc.wait(10)
    assert _gone(pid, 20), "the decision process outlived its master"


def test_graceful_stop_takes_the_whole_tree(small_split):
    proc, _http = small_split
    pid = _decider_pid(proc)
    assert proc.stop() == 0
    assert _gone(pid, 10)
    assert "Traceback" not in Path(proc.log.name).read_text()


def test_processes_are_named_so_ps_tells_them_apart(small_split):
    """ps/top (and the burst benchmark's CPU split) tell the decision process from the HTTP
    workers by name, though all run the same command line; the master keeps its own name."""
    from extender.split import DECIDER_NAME, HTTP_WORKER_NAME

    proc, _http = small_split
    master = proc.proc.pid
    decider = _decider_pid(proc)
    children = [pid for pid in _pids() if _stat(pid)[1] == master]
    names = sorted(_stat(pid)[0] for pid in children)
    assert names == sorted([DECIDER_NAME, HTTP_WORKER_NAME, HTTP_WORKER_NAME]), names
    assert _stat(decider)[0] == DECIDER_NAME
    assert _stat(master)[0] not in (DECIDER_NAME, HTTP_WORKER_NAME)


def _pids() -> list[int]:
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()]


def _stat(pid: int) -> tuple[str, int]:
    """(name, parent pid) of a process; ('', -1) when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", -1
    return stat[stat.find("(") + 1:stat.rfind(")")], int(stat[stat.rfind(")") + 2:].split()[1])


# ------------------------------------------------------------------ in-process, real sockets
def _service() -> ExtenderService:
    return ExtenderService(model_from(SMALL))


def test_frontend_answers_each_verb_when_the_decision_process_is_gone(tmp_path, wire):
    app = create_frontend(str(tmp_path / "nobody-listens.sock"), max_body_bytes=1 << 20)
    c = Client(app)
    r = c.post("/filter", json=wire("node-cache", "01-filter"))
    doc = r.get_json()
    assert r.status_code == 200 and doc["NodeNames"] == []
    assert set(doc["FailedNodes"]) == {"node-a", "node-b", "node-c"}
    assert all("decision process unavailable" in m for m in doc["FailedNodes"].values())
    r = c.post("/prioritize", json=wire("node-cache", "02-prioritize"))
    assert r.status_code == 200 and r.get_json() == []
    r = c.post("/bind", json=wire("node-cache", "03-bind"))
    assert r.status_code == 200 and "decision process unavailable" in r.get_json()["Error"]
    assert c.get("/healthz").status_code == 503
    assert c.post("/filter", data=b"{").status_code == 400
    r = c.post("/filter", data=b"x" * ((1 << 20) + 1))
    assert r.status_code == 413  # refused by the worker itself, before any relay


def test_relay_round_trip_and_reconnect(tmp_path, wire):
    """RelayServer over a real unix socket with the real verbs and Flask app behind it: the
    answers equal the Flask app's own; a connection the server dropped is re-made once."""
    app = create_app(_service())
    with relay_to(app, tmp_path) as (server, client):
        body = orjson.dumps(wire("node-cache", "01-filter"))
        r1 = client.call(OPS["filter"], body)
        assert r1.status == 200 and orjson.loads(r1.body)["NodeNames"] == ["node-b", "node-c"]
        # Drop every server-side connection: the next call reconnects and is answered.
        with server._lock:
            for conn in list(server._conns):
                conn.shutdown(socket.SHUT_RDWR)
        r2 = client.call(OPS["filter"], body)
        assert r2.body == r1.body
        st = client.call(OP_OTHER, b"", "GET /state")
        assert st.status == 200 and st.content_type.startswith("application/json")
        assert set(orjson.loads(st.body)) >= {"nodes", "allocations"}
        assert client.call(OP_OTHER, b"", "GET /no-such-page").status == 404
        assert client.call(9, b"").status == 400
        m = client.call(OP_OTHER, b"", "GET /metrics")
        assert m.status == 200 and m.content_type.startswith("text/plain")
        assert b'stowage_extender_requests_total{outcome="ok",verb="filter"} 2.0' in m.body


def test_relay_passes_readiness_and_errors_through(tmp_path, wire):
    """/readyz's 503 (model not synced) and a bad request's 400 reach the worker unchanged."""
    app = create_app(_service(), ready=lambda: (False, "pod watch not synced yet"))
    with relay_to(app, tmp_path) as (_server, client):
        r = client.call(OP_OTHER, b"", "GET /readyz")
        assert r.status == 503 and orjson.loads(r.body) == {"ready": False, "message": "pod watch not synced yet"}
        r = client.call(OPS["filter"], b"[1, 2]")
        assert r.status == 400 and "JSON object" in orjson.loads(r.body)["Error"]
        r = client.call(OPS["bind"], orjson.dumps({"PodName": "x"}))
        assert r.status == 400 and "missing Node" in orjson.loads(r.body)["Error"]
        r = client.call(OPS["filter"], b"", flags=TOO_LARGE)
        assert r.status == 413


@pytest.mark.parametrize("seed,inline", [(3, True), (4, True), (5, False)])
def test_relay_answers_equal_in_process_verbs_on_random_pods(tmp_path, seed, inline, monkeypatch):
    """The same pods through the relay and straight into a twin service's verbs: same bytes,
    whether the relay's own thread answers filter/prioritize or (big bodies) its pool does."""
    if not inline:
        import extender.relay
        monkeypatch.setattr(extender.relay, "INLINE_MAX_BODY", 0)
    doc = benchcluster.cluster_doc(40)
    twin_a, twin_b = (ExtenderService(model_from(doc)) for _ in range(2))
    app_a, app_b = create_app(twin_a), create_app(twin_b)
    verbs_b = app_b.extensions["stowage"]["verbs"]
    names = benchcluster.node_names(40)
    rng = random.Random(seed)
    with relay_to(app_a, tmp_path) as (_server, client):
        for pod in benchcluster.pods(40, seed=seed):
            body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})
            fa, fb = client.call(OPS["filter"], body), verbs_b.handle("filter", body)
            assert fa.body == fb.body
            passing = orjson.loads(fa.body)["NodeNames"]
            if not passing:
                continue
            body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": passing})
            pa, pb = client.call(OPS["prioritize"], body), verbs_b.handle("prioritize", body)
            assert pa.body == pb.body
            m = pod["metadata"]
            node = rng.choice(passing)
            body = orjson.dumps({"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"],
                                 "Node": node})
            assert client.call(OPS["bind"], body).body == verbs_b.handle("bind", body).body
        assert twin_a.state()["allocations"] == twin_b.state()["allocations"]
