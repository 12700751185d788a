"""Peers that are not kube-scheduler, over real sockets against the real gunicorn server: whatever
they do, kube-scheduler's requests and the kubelet's probes are still answered in time
(docs/security.md#slow-clients-and-big-bodies). Found by attacking `stowage extender
--simulated builtin --workers 2` with such peers while a client called filter every 0.2 s."""
from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import orjson
import pytest
import requests
import yaml

from extender_harness import start_process, stop_with_clients, timed_post

CLUSTER = {"nodes": [{"name": "node-b", "gpus": {"model": "Tesla T4", "count": 4, "memory": "16Gi"}}]}
POD = {"metadata": {"name": "p", "namespace": "default", "uid": "uid-1"},
       "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
FILTER = orjson.dumps({"Pod": POD, "NodeNames": ["node-b"]})


def _start(tmp_path: Path, workers: int, *args: str, threads: int = 2):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    return start_process(str(path), str(tmp_path), "--workers", str(workers), *args, threads=threads)


def _port(proc) -> int:
    return int(proc.url.rsplit(":", 1)[1])


def _read_all(s: socket.socket) -> bytes:
    """What the server sends until it closes the connection."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def _hold_the_big_body_lane(port: int) -> socket.socket:
    """A client that starts a chunked body (a body of unknown length takes the big-body lane),
    sends more than the read-ahead so that a thread takes it, then stalls: it holds the lane
    until the client timeout."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    chunk = b"x" * (128 << 10)
    s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(chunk) + chunk + b"\r\n")
    return s


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "split"])
def test_a_request_without_a_body_does_not_wait_for_the_big_body_lane(tmp_path, workers):
    """Found: a request with neither Content-Length nor Transfer-Encoding (every GET: /readyz,
    /healthz, /metrics, /state) was read as a body of unknown length, so it took the big-body
    lane, one per extender. While a client held the lane (a stalled chunked body, or in the split
    layout a GET the stopped decision process had not answered), the kubelet's /readyz probe
    waited the whole client timeout and got 503 "busy reading another large request body". Such
    a request has no body (RFC 9112 6.3; gunicorn reads none): it now takes no lane."""
    timeout_s = 8.0
    proc, http = _start(tmp_path, workers, "--client-timeout", str(timeout_s))
    holder = None
    try:
        holder = _hold_the_big_body_lane(_port(proc))
        time.sleep(1.0)  # a request thread has taken it, and the lane with it
        for path in ("/readyz", "/healthz", "/metrics", "/state"):
            t0 = time.monotonic()
            r = requests.get(proc.url + path, timeout=60)
            waited = time.monotonic() - t0
            assert r.status_code == 200, (path, r.status_code, r.text[:200])
            assert waited < timeout_s / 2, f"{path} waited {waited:.1f} s for the lane"
        # A bodiless POST is an empty body, refused as such (400), not a wait for the lane.
        # (requests would add "Content-Length: 0"; a peer need not.)
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", _port(proc)), timeout=60) as s:
            s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = _read_all(s)
        waited = time.monotonic() - t0
        assert answer.startswith(b"HTTP/1.1 400 ") and waited < timeout_s / 2, (waited, answer[:300])
    finally:
        stop_with_clients(proc, http, [holder] if holder is not None else [])


def _non_reading_client(port: int, requests_bytes: bytes) -> socket.socket:
    """A client with a small receive buffer that sends ``requests_bytes`` (as much as the server
    takes now) and never reads an answer."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    try:
        s.send(requests_bytes)
    except BlockingIOError:
        pass
    return s


def _filter_is_answered_in_time(proc, body: bytes, node: str) -> None:
    """kube-scheduler's filter, three times: each answered, within its 5 s httpTimeout."""
    for _ in range(3):
        r, waited = timed_post(proc.url + "/filter", body)
        assert r.status_code == 200 and r.json()["NodeNames"] == [node], r.text[:300]
        assert waited < 5.0, f"filter waited {waited:.1f} s behind clients that do not read"
    assert proc.proc.poll() is None


BIG_CLUSTER = {"nodes": [{"name": "node-{i:03d}", "count": 200,
                          "gpus": {"model": "Tesla T4", "count": 8, "memory": "16Gi"}}]}


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "split"])
def test_clients_that_never_read_their_answers_do_not_hold_the_request_threads(tmp_path, workers):
    """Found: a client that sends requests (pipelined, or one after another) and never reads the
    answers held a request thread for the whole --client-timeout once the socket's buffers were
    full: the thread blocked writing. As many such clients as there are threads (8 per worker
    as shipped) and kube-scheduler's filter waited past its 5 s httpTimeout, again and again.
    An answer the socket cannot take now is handed to the worker's event loop, which writes it as
    the client reads, within the client timeout, holding no thread (and the next pipelined
    request waits for it). Here: twice as many such clients as threads, answers of ~300 KB
    (/state of 200 nodes), a client timeout of 30 s; a filter must be answered well within it."""
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(BIG_CLUSTER))
    threads = 2
    proc, http = start_process(str(path), str(tmp_path), "--workers", str(workers), "--client-timeout", "30",
                               threads=threads)
    readers: list[socket.socket] = []
    try:
        port = _port(proc)
        state = http.get(proc.url + "/state", timeout=60).content
        assert len(state) > 100_000, len(state)
        pipelined = b"GET /state HTTP/1.1\r\nHost: x\r\n\r\n" * (20 * (1 << 20) // len(state))  # ~20 MiB of answers
        for _ in range(2 * threads * workers):  # (the requests are small: all sent at once)
            readers.append(_non_reading_client(port, pipelined))
        time.sleep(3.0)  # they have filled their sockets by now
        _filter_is_answered_in_time(proc, orjson.dumps({"Pod": POD, "NodeNames": ["node-001"]}), "node-001")
    finally:
        stop_with_clients(proc, http, readers)


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "split"])
def test_a_client_that_expects_100_continue_is_told_to_send_its_body(tmp_path, workers):
    """Found: a client that sends ``Expect: 100-continue`` and waits for the ``100 Continue``
    before its body (curl does for bodies over 1 MiB, for 1 s; Go's net/http with
    ExpectContinueTimeout set) got nothing: the request is read ahead until its body is there,
    and gunicorn answers the expectation only once a thread takes it. A strict client waited
    for the 408 at the client timeout, curl 1 s per big body. The read-ahead now answers it as
    soon as the head is in, once."""
    proc, http = _start(tmp_path, workers, "--client-timeout", "20")
    try:
        with socket.create_connection(("127.0.0.1", _port(proc)), timeout=5) as s:
            s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Expect: 100-continue\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(FILTER))
            first = s.recv(4096)
            assert first == b"HTTP/1.1 100 Continue\r\n\r\n", first
            s.sendall(FILTER)
            s.settimeout(30)
            answer = _read_all(s)
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
        assert b"100 Continue" not in answer, answer[:300]  # once, not again when a thread takes it
        assert orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["NodeNames"] == ["node-b"]
    finally:
        stop_with_clients(proc, http)


def _extender_with_write_behind_bytes(tmp_path: Path, monkeypatch, budget: int) -> Path:
    """Make the extenders this test starts hold at most ``budget`` bytes of answers for the event
    loop (:data:`extender.intake.WRITE_BEHIND_BYTES`), set in the master before it forks: the
    interpreter the harness runs is a script that sets it, then runs ``-m extender.cli``."""
    script = tmp_path / "python-small-write-behind"
    script.write_text(f"#!{sys.executable}\n"
                      "import os, runpy, sys\n"
                      "sys.path.insert(0, os.getcwd())\n"
                      "import extender.intake\n"
                      f"extender.intake.WRITE_BEHIND_BYTES = {budget}\n"
                      "assert sys.argv[1:3] == ['-m', 'extender.cli'], sys.argv\n"
                      "sys.argv = ['extender.cli'] + sys.argv[3:]\n"
                      "runpy.run_module('extender.cli', run_name='__main__', alter_sys=True)\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    return script


def test_past_the_write_behind_bound_the_oldest_unread_answers_are_dropped(tmp_path, monkeypatch):
    """The answers held for clients that do not read them are bounded per worker; past the bound
    the connections holding the oldest are closed (and logged), so neither memory nor the request
    threads are theirs, and kube-scheduler's filter is still answered in time. Here the bound is
    4 MiB, each answer ~1.7 MB (a filter naming 50,000 unknown nodes) and eight clients pipeline
    three each without reading."""
    _extender_with_write_behind_bytes(tmp_path, monkeypatch, 4 << 20)
    threads = 2
    proc, http = _start(tmp_path, 1, "--client-timeout", "30", threads=threads)
    readers: list[socket.socket] = []
    try:
        body = orjson.dumps({"Pod": POD, "NodeNames": [f"unknown-{i}" for i in range(50_000)]})
        pipelined = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        for _ in range(4 * threads):
            readers.append(_non_reading_client(_port(proc), pipelined * 3))
        log = Path(proc.log.name)
        deadline = time.monotonic() + 60
        while "answers not taken by their clients filled 4 MiB" not in log.read_text():
            assert time.monotonic() < deadline, proc.log_tail()
            time.sleep(0.2)
        _filter_is_answered_in_time(proc, FILTER, "node-b")
    finally:
        stop_with_clients(proc, http, readers)
