"""The load driver: kube-scheduler's side of the extender protocol over real HTTP, in client processes.

Each client process holds ONE keep-alive HTTP/1.1 connection (a plain socket, see
:class:`Conn`; like kube-scheduler's Go client reusing connections) and, per pod, does what kube-scheduler does
with an extender configured with filter, prioritize and bind verbs:

1. ``POST /filter`` with the Pod and every node (``NodeNames`` with ``nodeCacheCapable: true``,
   full ``Nodes`` objects otherwise);
2. ``POST /prioritize`` with the nodes that passed (skipped when only one passed, as
   kube-scheduler does), then picks the best-scored node;
3. ``POST /bind`` to that node; a bind refused because another client took the cards first
   is retried from filter (kube-scheduler's backoff retry), at most three times.

The clients run in their own processes so that their JSON work does not share a GIL with the
measurement, and request bodies are pre-encoded (the fixed node list once, each pod once), so
a client's own CPU per pod stays small; it is measured (``client_cpu_s``) and reported.
Latency is what the client sees: from sending the request to having read the whole answer.
"""
from __future__ import annotations

import multiprocessing as mp
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

@dataclass
class Workload:
    """What the clients send. Kept in a module global so forked clients inherit it without pickling."""

    host: str
    port: int
    pods: list[dict[str, Any]]
    names: list[str]
    node_items: dict[str, bytes] | None = None   # full-nodes mode: each Node's JSON
    # Derived, pre-encoded once.
    names_json: bytes = b""
    all_items: bytes = b""
    pod_json: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.names_json = orjson.dumps(self.names)
        if self.node_items is not None:
            self.all_items = b",".join(self.node_items[n] for n in self.names)
        self.pod_json = [orjson.dumps(p) for p in self.pods]

    def args_body(self, j: int, names: list[str] | None) -> bytes:
        """An ExtenderArgs body for pod j and ``names`` (None: every node)."""
        pod = self.pod_json[j]
        if self.node_items is None:
            nn = self.names_json if names is None else orjson.dumps(names)
            return b'{"Pod":' + pod + b',"Nodes":null,"NodeNames":' + nn + b"}"
        items = self.all_items if names is None else b",".join(self.node_items[n] for n in names)
        return b'{"Pod":' + pod + b',"Nodes":{"metadata":{},"items":[' + items + b']},"NodeNames":null}'


@dataclass
class ClientResult:
    filter_ms: list[float] = field(default_factory=list)
    prioritize_ms: list[float] = field(default_factory=list)
    bind_ms: list[float] = field(default_factory=list)
    fp_ms: list[float] = field(default_factory=list)      # filter + prioritize of one attempt
    placed: int = 0
    unschedulable: int = 0
    bind_refused: int = 0
    errors: list[str] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0
    client_cpu_s: float = 0.0


_WORK: Workload | None = None


class Conn:
    """One keep-alive HTTP/1.1 connection on a plain socket; reconnects once if the server closed it.

    Why not ``http.client``: its response parsing (headers through ``email.parser``) costs
    ~0.3 ms a request in Python, about a third of a client's CPU per pod; on a 2-core machine
    shared with the server that is CPU the server does not get. kube-scheduler's Go client
    costs a fraction of it, so the leaner client is the fairer stand-in. The requests are the
    same bytes on the wire (method, path, Host, Content-Type, Content-Length, body); an answer
    must carry a Content-Length (gunicorn's always do here) or end with the connection.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sock: socket.socket | None = None
        self.buf = b""

    def _connect(self) -> socket.socket:
        s = socket.create_connection((self.host, self.port), timeout=120)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        return s

    def _read_response(self, s: socket.socket) -> tuple[int, bytes, bool]:
        buf = self.buf
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(262144)
            if not chunk:
                raise ConnectionResetError("server closed the connection")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length, close = None, False
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            k = k.strip().lower()
            if k == b"content-length":
                length = int(v)
            elif k == b"connection" and v.strip().lower() == b"close":
                close = True
        if length is None:  # read to the end of the connection
            parts = [rest]
            while chunk := s.recv(262144):
                parts.append(chunk)
            self.buf = b""
            return status, b"".join(parts), True
        parts, got = [rest], len(rest)
        while got < length:
            chunk = s.recv(max(262144, length - got))
            if not chunk:
                raise ConnectionResetError("server closed the connection mid-answer")
            parts.append(chunk)
            got += len(chunk)
        data = b"".join(parts)
        self.buf = data[length:]
        return status, data[:length], close

    def post(self, path: str, body: bytes) -> bytes:
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        for attempt in (0, 1):
            try:
                if self.sock is None:
                    self.sock = self._connect()
                self.sock.sendall(head + body)
                status, data, close = self._read_response(self.sock)
                if close:
                    self.close()
                if status != 200:
                    raise RuntimeError(f"{path}: HTTP {status}: {data[:300]!r}")
                return data
            except (ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _passing(answer: dict[str, Any]) -> list[str]:
    if answer.get("Nodes") is not None:
        return [n["metadata"]["name"] for n in answer["Nodes"]["items"]]
    return answer.get("NodeNames") or []


def _best(scores: list[dict[str, Any]]) -> str:
    best, host = -1, ""
    for s in scores:
        if s["Score"] > best:
            best, host = s["Score"], s["Host"]
    return host


def _schedule_pods(cid: int, pods: list[int], go: Any, out: Any) -> None:
    w = _WORK
    assert w is not None
    res = ClientResult()
    conn = Conn(w.host, w.port)
    go.wait()
    cpu0 = time.process_time()
    res.start = time.monotonic()
    clock = time.perf_counter
    try:
        for j in pods:
            meta = w.pods[j]["metadata"]
            for _attempt in range(3):
                t0 = clock()
                answer = orjson.loads(conn.post("/filter", w.args_body(j, None)))
                t1 = clock()
                res.filter_ms.append((t1 - t0) * 1e3)
                passing = _passing(answer)
                if not passing:
                    res.fp_ms.append((t1 - t0) * 1e3)
                    res.unschedulable += 1
                    break
                if len(passing) > 1:
                    body = w.args_body(j, passing)
                    t2 = clock()
                    scores = orjson.loads(conn.post("/prioritize", body))
                    t3 = clock()
                    res.prioritize_ms.append((t3 - t2) * 1e3)
                    res.fp_ms.append((t1 - t0 + t3 - t2) * 1e3)
                    node = _best(scores) or passing[0]
                else:
                    res.fp_ms.append((t1 - t0) * 1e3)
                    node = passing[0]
                bind = orjson.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                     "PodUID": meta["uid"], "Node": node})
                t4 = clock()
                err = orjson.loads(conn.post("/bind", bind)).get("Error", "")
                res.bind_ms.append((clock() - t4) * 1e3)
                if not err:
                    res.placed += 1
                    break
                res.bind_refused += 1
    except Exception as exc:  # report, do not hang the benchmark
        res.errors.append(f"client {cid}: {exc!r}")
    res.end = time.monotonic()
    res.client_cpu_s = time.process_time() - cpu0
    conn.close()
    out.put(res)


def _prefill(cid: int, plan: list[tuple[str, bytes, dict]], go: Any, out: Any) -> None:
    """Filter the pod against its one target node, then bind it there (the usage a cluster already has)."""
    w = _WORK
    assert w is not None
    res = ClientResult()
    conn = Conn(w.host, w.port)
    go.wait()
    try:
        for node, pod_json, meta in plan:
            conn.post("/filter", b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + orjson.dumps([node]) + b"}")
            err = orjson.loads(conn.post("/bind", orjson.dumps(
                {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                 "Node": node}))).get("Error", "")
            if err:
                res.bind_refused += 1
            else:
                res.placed += 1
    except Exception as exc:
        res.errors.append(f"prefill client {cid}: {exc!r}")
    conn.close()
    out.put(res)


def _run(target, parts: list[Any], work: Workload) -> list[ClientResult]:
    global _WORK
    _WORK = work
    ctx = mp.get_context("fork")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(cid, part, go, out), daemon=True) for cid, part in enumerate(parts)]
    for p in procs:
        p.start()
    time.sleep(0.2)
    go.set()
    results = [out.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    _WORK = None
    return results


def schedule(work: Workload, clients: int) -> list[ClientResult]:
    """Schedule every pod of ``work`` with ``clients`` concurrent client processes."""
    parts = [list(range(c, len(work.pods), clients)) for c in range(clients)]
    return _run(_schedule_pods, parts, work)


def prefill(host: str, port: int, plan: list[tuple[str, dict[str, Any]]], clients: int) -> tuple[int, int]:
    """Bind the prefill plan's pods through filter+bind; (bound, refused)."""
    encoded = [(node, orjson.dumps(pod), pod["metadata"]) for node, pod in plan]
    parts = [encoded[c::clients] for c in range(clients)]
    results = _run(_prefill, parts, Workload(host=host, port=port, pods=[], names=[]))
    errors = [e for r in results for e in r.errors]
    if errors:
        raise RuntimeError("; ".join(errors))
    return sum(r.placed for r in results), sum(r.bind_refused for r in results)
