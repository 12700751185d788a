"""Issue 12, item 5 ("exhaustion"), over real sockets against the real gunicorn server in both
serving layouts: a client that stops half-way through a request times out without blocking the
others; a malformed chunked body is a 400; the memory that request bodies take is bounded in
bytes however many arrive at once."""
from __future__ import annotations

import socket
import threading
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
THREADS = 2


def _start(tmp_path: Path, workers: int, *args: str, threads: int = THREADS):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(CLUSTER))
    return start_process(str(path), str(tmp_path), "--workers", str(workers), *args, threads=threads)


def _port(proc) -> int:
    return int(proc.url.rsplit(":", 1)[1])


def _read_all(s: socket.socket, limit_s: float) -> bytes:
    """What the server sends until it closes the connection (fails the test after ``limit_s``)."""
    s.settimeout(limit_s)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except socket.timeout:
        raise AssertionError(f"the server kept a stalled connection open for {limit_s:.0f}s; got {data[:200]!r}")
    except ConnectionResetError:
        pass
    return data


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "split"])
def test_stalled_clients_time_out_and_others_are_served(tmp_path, workers):
    proc, http = _start(tmp_path, workers, "--client-timeout", "8")
    stalled: list[tuple[str, socket.socket]] = []
    try:
        port = _port(proc)
        # Four times as many stalled clients as there are request threads in all workers: half send
        # a Content-Length and part of the body, half stop in the middle of the headers.
        for i in range(4 * THREADS * workers):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i % 2:
                s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 100000\r\n\r\n{\"Pod\":")
                stalled.append(("body", s))
            else:
                s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Le")
                stalled.append(("headers", s))
        time.sleep(1.0)  # every one of them has reached a request thread by now
        # A well-behaved client is answered (the liveness bound is generous: not a speed test).
        r = requests.post(proc.url + "/filter", data=FILTER, timeout=60)
        assert r.status_code == 200 and r.json()["NodeNames"] == ["node-b"]
        # ... without waiting for the stalled ones to be cut off: they are all still open.
        for _, s in stalled:
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)
            s.setblocking(True)
        for kind, s in stalled:
            data = _read_all(s, 60)
            if kind == "body":  # it had a request: it gets an answer that says why
                assert data.startswith(b"HTTP/1.1 408 "), data[:300]
                assert b"did not send its request in time" in data
        assert proc.proc.poll() is None
    finally:
        for _, s in stalled:
            s.close()
        http.close()
        proc.stop()


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "split"])
def test_a_malformed_chunked_body_is_a_400(tmp_path, workers):
    proc, http = _start(tmp_path, workers)
    try:
        for bad in (b"zz\r\n{}\r\n0\r\n\r\n", b"2\r\n{}XX0\r\n\r\n"):  # a chunk size that is no number; no CRLF
            with socket.create_connection(("127.0.0.1", _port(proc)), timeout=30) as s:
                s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n" + bad)
                data = _read_all(s, 30)
            assert data.startswith(b"HTTP/1.1 400 "), data[:300]
            assert b"malformed chunked request body" in data
        assert http.post(proc.url + "/filter", data=FILTER, timeout=30).status_code == 200
        assert "Traceback" not in Path(proc.log.name).read_text()
    finally:
        http.close()
        proc.stop()


def _tree_kib(pid: int, field: str = "VmHWM") -> int:
    """The sum of ``field`` (VmHWM: peak resident set; VmRSS: now) over ``pid`` and its descendants."""
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        try:
            for t in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (t / "children").read_text().split()]
        except FileNotFoundError:
            pass
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(field + ":"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total


class _PeakRss:
    """Samples the resident set of ``pid`` and its descendants every 5 ms until :meth:`stop`;
    ``before`` is the first sample, ``peak`` the largest (KiB)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = self.peak = _tree_kib(pid, "VmRSS")
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, _tree_kib(self.pid, "VmRSS"))

    def stop(self) -> float:
        """Stop sampling; the growth seen, in MiB."""
        self._done.set()
        self._thread.join(30)
        return (self.peak - self.before) / 1024


BIG_MIB = 32


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "split"])
def test_concurrent_big_bodies_take_bounded_memory(tmp_path, workers):
    """Eight clients send a 32 MiB body each at once (four with a length, four chunked). Without a
    bound, each is read and decoded at the same time (several times 32 MiB each); with it, the
    extender as a whole holds about one big body at a time, whatever arrives."""
    proc, http = _start(tmp_path, workers, "--max-body-mib", "64", threads=8)
    try:
        before = _tree_kib(proc.proc.pid)
        rss = _PeakRss(proc.proc.pid)
        pad = b"a" * (BIG_MIB << 20)
        body = b'{"Pod":' + orjson.dumps(POD) + b',"NodeNames":["node-b"],"Pad":"' + pad + b'"}'
        answers: list[int] = []

        def send(i: int) -> None:
            data = body if i % 2 else iter([body[j:j + (1 << 20)] for j in range(0, len(body), 1 << 20)])
            r = requests.post(proc.url + "/filter", data=data, timeout=120)
            answers.append(r.status_code)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        rss_mib = rss.stop()
        assert sorted(answers) and set(answers) <= {200, 503}, answers
        assert answers.count(200) >= 1
        hwm_mib = (_tree_kib(proc.proc.pid) - before) / 1024
        print(f"8 concurrent {BIG_MIB} MiB bodies, {workers} worker(s): resident set of the extender's processes "
              f"grew by at most {rss_mib:.0f} MiB at once (sampled), sum of per-process peaks +{hwm_mib:.0f} MiB; "
              f"answers {sorted(answers)}")
        # About one big body at a time (read, joined, relayed, decoded): 8 at once before.
        assert rss_mib < 5 * BIG_MIB, f"{rss_mib:.0f} MiB"
        assert http.post(proc.url + "/filter", data=FILTER, timeout=30).status_code == 200
    finally:
        http.close()
        proc.stop()


@pytest.mark.parametrize("mode", ["silent", "keepalive"])
def test_a_client_holding_every_connection_slot_does_not_lock_others_out(tmp_path, mode):
    """Review finding: WORKER_CONNECTIONS (512) connections that send nothing, or that make one
    request and then idle on keep-alive (75 s), filled the worker's connection slots, so a new
    client (kube-scheduler) waited for them to time out: 10 s at the default --client-timeout,
    past kube-scheduler's 5 s httpTimeout. At the cap the worker now closes the connections that
    hold a slot with no request in progress, oldest first. The client timeout here is 60 s, so
    a probe answered well within it was not let in by the timeouts."""
    from extender.intake import WORKER_CONNECTIONS

    proc, http = _start(tmp_path, 1, "--client-timeout", "60")
    held: list[socket.socket] = []
    try:
        port = _port(proc)
        for _ in range(WORKER_CONNECTIONS + 16):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            if mode == "keepalive":
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert s.recv(4096).startswith(b"HTTP/1.1 200")
            held.append(s)
        r, waited = timed_post(proc.url + "/filter", FILTER)
        assert r.status_code == 200 and r.json()["NodeNames"] == ["node-b"]
        assert waited < 30, f"the probe waited {waited:.1f} s: let in by the 60 s timeout, not by shedding"
        assert proc.proc.poll() is None
    finally:
        stop_with_clients(proc, http, held)


def _shipped_extender() -> tuple[int, int]:
    """(``--max-body-mib``, memory limit in MiB) of the extender container as shipped in
    scheduler-config/scheduler.yaml (the CLI's default where the manifest sets no limit)."""
    from extender.app import DEFAULT_MAX_BODY_BYTES
    from shared_paths import ROOT

    docs = yaml.safe_load_all((ROOT / "scheduler-config" / "scheduler.yaml").read_text())
    deploy = next(d for d in docs if d and d.get("kind") == "Deployment")
    c = next(c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "extender")
    args = list(c.get("command", [])) + list(c.get("args", []))
    body_mib = DEFAULT_MAX_BODY_BYTES >> 20
    for i, a in enumerate(args):
        if a == "--max-body-mib":
            body_mib = int(args[i + 1])
        elif a.startswith("--max-body-mib="):
            body_mib = int(a.split("=", 1)[1])
    limit = c["resources"]["limits"]["memory"]
    assert limit.endswith(("Mi", "Gi")), limit
    return body_mib, int(limit[:-2]) * (1024 if limit.endswith("Gi") else 1)


# The split layout's three processes together at 10,000 nodes under load (scheduler.yaml's comment,
# from benchmarks/latency): what the shipped memory limit must leave room for besides a body.
MODEL_PEAK_MIB_AT_10K_NODES = 410


def test_the_shipped_body_limit_fits_the_shipped_memory_limit_whatever_the_body_holds(tmp_path):
    """A body's bytes are not its cost: decoded JSON of many tiny strings is 10-20x its size (a
    preempt body of short victim UIDs is the worst a well-formed body gets; one padded string, as
    above, costs ~1x). The helper's audit measured ~920 MiB resident for a 44 MiB preempt body,
    while the shipped container allowed 256 MiB bodies under a 1 GiB limit: a body well inside
    the limit ended the extender. Measured here on the split layout as shipped (the HTTP worker
    and the decision process), with an 8 MiB body of tiny UIDs; the growth per MiB of body times
    the shipped --max-body-mib, plus the model's peak, must fit the shipped memory limit."""
    body_mib, limit_mib = _shipped_extender()
    proc, http = _start(tmp_path, 2, "--max-body-mib", "64")
    try:
        rss = _PeakRss(proc.proc.pid)
        victims = [{"UID": f"{i:x}"} for i in range(520_000)]
        body = orjson.dumps({"Pod": POD, "NodeNameToVictims": None,
                             "NodeNameToMetaVictims": {"node-b": {"Pods": victims, "NumPDBViolations": 0}}})
        sent_mib = len(body) / (1 << 20)
        r = http.post(proc.url + "/preempt", data=body, timeout=120)
        grown_mib = rss.stop()
        assert r.status_code == 200, r.text[:300]
        per_mib = grown_mib / sent_mib
        need = per_mib * body_mib + MODEL_PEAK_MIB_AT_10K_NODES
        print(f"a {sent_mib:.1f} MiB preempt body of tiny UIDs: +{per_mib:.1f} MiB resident per MiB of body; "
              f"shipped --max-body-mib {body_mib} -> {per_mib * body_mib:.0f} MiB, plus the model's "
              f"{MODEL_PEAK_MIB_AT_10K_NODES} MiB, against the shipped limit of {limit_mib} MiB")
        assert per_mib > 2, "the measurement saw no decoding at all"
        assert need < limit_mib, f"{need:.0f} MiB needed, {limit_mib} MiB allowed"
        assert http.post(proc.url + "/filter", data=FILTER, timeout=30).status_code == 200
    finally:
        http.close()
        proc.stop()


@pytest.mark.parametrize("length", ["\u00b2", "1\u0663"])
def test_a_content_length_of_digits_int_cannot_read_is_no_known_length(length):
    """gunicorn refuses such a header itself (400), but the reader must not count on its host:
    ``"²".isdigit()`` is true and ``int("²")`` raises, which was a 500 from inside the reader.
    A length that is not ASCII digits is read as one of unknown length, within the limit."""
    import io

    from extender.intake import BodyReader
    reader = BodyReader(limit=100)
    body, held = reader.read({"CONTENT_LENGTH": length, "wsgi.input": io.BytesIO(b'{"Pod": {}}')})
    reader.done(held)
    assert body == b'{"Pod": {}}'


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "split"])
def test_a_content_length_that_is_no_number_is_a_400_at_once(tmp_path, workers):
    """The read-ahead took the leading digits of ``Content-Length: 5\\x1b[2J`` (or ``5 5``) for the
    length, waited for a body of 5 bytes that never came, and cut the client off with a 408 at
    its deadline; the parser refuses such a header with a 400, and now it gets to. A length of
    5,000 digits raised int()'s digit-limit error in the read-ahead: the connection was dropped
    with no answer at all."""
    proc, http = _start(tmp_path, workers, "--client-timeout", "8")
    try:
        for bad in (b"5\x1b[2J", b"5 5", b"5, 5", b"9" * 5000):
            with socket.create_connection(("127.0.0.1", _port(proc)), timeout=30) as s:
                s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: " + bad + b"\r\n\r\n{}")
                data = _read_all(s, 30)
            assert data.startswith(b"HTTP/1.1 400 "), (bad[:20], data[:300])
        assert http.post(proc.url + "/filter", data=FILTER, timeout=30).status_code == 200
        assert "Traceback" not in Path(proc.log.name).read_text()
    finally:
        http.close()
        proc.stop()
