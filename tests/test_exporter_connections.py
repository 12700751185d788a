"""The exporter's HTTP port is open to the pod network (Prometheus scrapes it), so anyone there can
connect: connections that never finish their request must not pile up. prometheus_client's own
server gave each connection a thread that waited for its request for ever: 3,000 silent
connections held 3,000 threads and +78 MiB, and ~9,000 would take the exporter past its 256 MiB
limit (OOM-killed, metrics gone, the HPAs that scale on them blind). Now waiting connections are
capped (the oldest is shed for a new one) and each waits at most its timeout; a scrape is served
whatever the others do."""
from __future__ import annotations

import socket
import time

import pytest
import requests

from stowage import metrics_http as exporter_server
from exporter_harness import make_node


@pytest.fixture
def node(monkeypatch, tmp_path):
    yield from make_node(monkeypatch, tmp_path)


def _open(port: int, n: int, partial: bool) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if partial:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")   # never the blank line that ends it
        socks.append(s)
    return socks


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(0.0)
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.mark.parametrize("partial", [False, True])
def test_silent_connections_are_capped_and_scrapes_still_answered(node, partial, monkeypatch):
    monkeypatch.setattr(exporter_server, "REQUEST_TIMEOUT_S", 120.0)   # only the cap closes them here
    cap = exporter_server.MAX_WAITING_CONNECTIONS
    socks = _open(node.exporter.port, cap * 3, partial)
    try:
        # One handler thread per connection still open on the server's side: at most the cap,
        # once the shed ones have seen their socket closed (a loaded machine may take a moment).
        # Counted by the server itself: other tests in the same process run servers whose threads
        # socketserver names alike (a process-wide count of those names once took 77 for 64).
        server = node.exporter._server
        deadline = time.monotonic() + 20
        while server.shed < len(socks) - cap or server.handlers > cap:   # every connection accepted
            assert time.monotonic() < deadline, (f"{server.handlers} connection threads, cap {cap}; "
                                                 f"{server.shed} shed")
            time.sleep(0.05)
        assert server.shed == len(socks) - cap
        closed: set[int] = set()
        while len(closed) < len(socks) - cap:   # the oldest were closed on the client's side too
            closed |= {i for i, s in enumerate(socks) if i not in closed and _closed_by_server(s)}
            assert time.monotonic() < deadline, f"{len(closed)} closed"
            time.sleep(0.05)
        assert closed == set(range(len(socks) - cap))   # oldest first: the newest wait on
        r = requests.get(node.url, timeout=10)
        assert r.status_code == 200 and "stowage_gpu_memory_total_bytes" in r.text
    finally:
        for s in socks:
            s.close()


def test_a_connection_that_sends_nothing_is_closed_after_its_timeout(node, monkeypatch):
    monkeypatch.setattr(exporter_server, "REQUEST_TIMEOUT_S", 0.3)
    node.exporter.stop()
    node.exporter.start(0, "127.0.0.1")
    (s,) = _open(node.exporter.port, 1, partial=True)
    try:
        deadline = time.monotonic() + 10
        while not _closed_by_server(s):
            assert time.monotonic() < deadline, "a silent connection was kept open"
            time.sleep(0.05)
        assert requests.get(node.url, timeout=10).status_code == 200
    finally:
        s.close()
