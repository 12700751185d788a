"""The feeder's watch reader (:class:`extender.kube.WatchStream`): every event of the API server's
newline-delimited stream, decoded once, whatever the chunking; an ERROR event becomes the
ApiException the feeder acts on (410: relist); the response is always closed.

The feeder's behaviour over a whole stream (resume, relist on 410, broken streams, stop) is tested
against the fake API server (test_extender_kube_feeder.py) and the real one (tests/integration)."""
from __future__ import annotations

import json
import random

import pytest
from kubernetes.client.exceptions import ApiException

from extender.kube import WatchStream, watch_event, watch_lines

EVENTS = [
    {"type": "ADDED", "object": {"kind": "Pod", "metadata": {"name": "p-ä", "resourceVersion": "5"}}},
    {"type": "MODIFIED", "object": {"kind": "Pod", "metadata": {"name": "日本", "resourceVersion": "6"},
                                    "spec": {"nodeName": "n1"}}},
    {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "9"}}},
]


def body(events: list[dict], blank_lines: bool = True) -> bytes:
    sep = b"\n\n" if blank_lines else b"\n"
    return sep.join(json.dumps(e, ensure_ascii=False).encode() for e in events) + b"\n"


def chunked(data: bytes, rng: random.Random) -> list[bytes]:
    """``data`` cut at random places (inside events and inside multi-byte characters too)."""
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(1, 12))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])] + [b""]


@pytest.mark.parametrize("seed", range(20))
def test_lines_are_the_events_whatever_the_chunking(seed):
    rng = random.Random(seed)
    data = body(EVENTS, blank_lines=bool(seed % 2))
    got = [watch_event(line) for line in watch_lines(iter(chunked(data, rng)))]
    assert got == EVENTS


def test_a_last_line_without_newline_is_still_an_event():
    data = body(EVENTS)[:-1]
    assert [watch_event(x) for x in watch_lines(iter([data[:7], data[7:]]))] == EVENTS


def test_a_line_that_is_not_a_json_object_is_an_error_naming_it():
    with pytest.raises(ValueError, match="undecodable watch event"):
        watch_event(b'{"type": "ADDED", "object": ')
    with pytest.raises(ValueError, match="not an object"):
        watch_event(b'["ADDED"]')


class FakeResponse:
    def __init__(self, chunks: list[bytes], status: int = 200) -> None:
        self.chunks, self.status, self.closed, self.released = chunks, status, False, False

    def stream(self, amt=None, decode_content=False):
        yield from self.chunks

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        self.released = True


def run(resp: FakeResponse, stop_after: int | None = None) -> tuple[list[dict], dict]:
    calls: dict = {}
    w = WatchStream()

    def fn(**kwargs):
        calls.update(kwargs)
        return resp

    out = []
    for ev in w.stream(fn, resource_version="4", timeout_seconds=30):
        out.append(ev)
        if stop_after is not None and len(out) == stop_after:
            w.stop()
    return out, calls


def test_stream_yields_decoded_events_and_closes_the_response():
    resp = FakeResponse(chunked(body(EVENTS), random.Random(1)))
    got, calls = run(resp)
    assert got == EVENTS
    assert calls == {"watch": True, "_preload_content": False, "resource_version": "4", "timeout_seconds": 30}
    assert resp.closed and resp.released


def test_stop_ends_the_stream_after_the_event_being_handled():
    resp = FakeResponse([body(EVENTS)])
    got, _ = run(resp, stop_after=1)
    assert got == EVENTS[:1] and resp.closed


@pytest.mark.parametrize("code", [410, 500])
def test_an_error_event_raises_its_status_code_and_closes_the_response(code):
    error = {"type": "ERROR", "object": {"kind": "Status", "code": code, "reason": "Expired",
                                         "message": "too old resource version: 4 (99)"}}
    resp = FakeResponse([body([EVENTS[0], error, EVENTS[1]])])
    got: list = []
    with pytest.raises(ApiException) as exc:
        for ev in WatchStream().stream(lambda **_: resp):
            got.append(ev)
    assert exc.value.status == code and "too old resource version" in str(exc.value)
    assert got == EVENTS[:1] and resp.closed


def test_a_non_2xx_answer_is_an_api_exception():
    resp = FakeResponse([], status=403)
    with pytest.raises(ApiException) as exc:
        list(WatchStream().stream(lambda **_: resp))
    assert exc.value.status == 403 and resp.closed


@pytest.mark.parametrize("connection_header", ["", "Connection: close\r\n"])
def test_stop_interrupts_a_read_blocked_on_a_quiet_stream(connection_header):
    """A watch that is open and quiet blocks its reading thread in the socket read; ``stop`` must
    end it at once, also when the server answered ``Connection: close`` (a proxy in front of the
    API server may): http.client then hands the socket to the response and the pooled connection
    no longer holds it, so shutting down only the connection's socket left the feeder waiting for
    its stop timeout. A real socket server and the real kubernetes client and urllib3."""
    import socket
    import threading
    import time

    import kubernetes

    srv = socket.create_server(("127.0.0.1", 0))
    release = threading.Event()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                          f"{connection_header}\r\n").encode())
            release.wait(30)     # open and quiet until the test ends

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    cfg = kubernetes.client.Configuration()
    cfg.host = f"http://127.0.0.1:{srv.getsockname()[1]}"
    core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))
    w = WatchStream()
    ended = threading.Event()
    outcome: list = []

    def read() -> None:
        try:
            outcome.extend(w.stream(core.list_node, timeout_seconds=300))
        except Exception as exc:    # an interrupted read may end in a protocol error: the feeder retries
            outcome.append(exc)
        ended.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 10
        while w._resp is None and time.monotonic() < deadline:   # the response headers are in
            time.sleep(0.01)
        assert w._resp is not None
        w.stop()
        assert ended.wait(5), "stop() did not interrupt the blocked read"
        assert not any(isinstance(x, dict) for x in outcome)
    finally:
        release.set()
        srv.close()


def test_a_line_past_the_event_bound_is_an_error_before_the_rest_is_read():
    """A watch line that never ends (a peer that is not an API server, or a proxy gone wrong) was
    gathered whole, however big, and each piece was joined to all the ones before (a 16 MiB line
    in 4 KiB pieces took ~18 s of the decision process's CPU). Past the bound of one event (an
    object is what etcd bounds: ~1.5 MiB) the stream fails at once; the feeder re-opens it."""
    from extender.kube import WATCH_EVENT_BYTES

    piece = b"x" * 4096
    read = 0

    def endless():
        nonlocal read
        for _ in range(2 * WATCH_EVENT_BYTES // len(piece)):
            read += len(piece)
            yield piece
        yield b"\n"

    with pytest.raises(ValueError, match="watch event past"):
        list(watch_lines(endless()))
    assert read <= WATCH_EVENT_BYTES + len(piece)


def test_a_line_of_any_size_within_the_bound_is_one_event_whatever_the_chunking():
    big = {"type": "MODIFIED", "object": {"kind": "Pod", "metadata": {"name": "big", "resourceVersion": "7",
                                                                      "annotations": {"a": "y" * (3 << 20)}}}}
    data = body([EVENTS[0], big, EVENTS[1]])
    pieces = [data[i:i + 4096] for i in range(0, len(data), 4096)]
    assert [watch_event(x) for x in watch_lines(iter(pieces))] == [EVENTS[0], big, EVENTS[1]]


def test_one_huge_http_chunk_is_read_in_bounded_pieces():
    """The body's HTTP chunks were each read whole before the line was looked at: a peer declaring
    one chunk of 64 MiB (no newline in it) had all of it in memory at once. Read in bounded pieces,
    the stream fails once one event's bound is passed. A real socket server, the real client."""
    import socket
    import threading
    import tracemalloc

    import kubernetes

    import extender.kube as kube_mod

    size = 64 << 20
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"%x\r\n" % size)
            piece = b"x" * (1 << 20)
            try:
                for _ in range(size // len(piece)):
                    conn.sendall(piece)
                conn.sendall(b"\r\n0\r\n\r\n")
            except OSError:   # the client gave up on the line: what it should do
                pass

    threading.Thread(target=serve, daemon=True).start()
    cfg = kubernetes.client.Configuration()
    cfg.host = f"http://127.0.0.1:{srv.getsockname()[1]}"
    core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(cfg))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError):
            list(WatchStream().stream(core.list_node, timeout_seconds=300))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        srv.close()
    assert peak < kube_mod.WATCH_EVENT_BYTES + (8 << 20), peak
