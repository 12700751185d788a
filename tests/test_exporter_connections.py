"""The exporter's HTTP port is open to the pod network (Prometheus scrapes it), so anyone there can
connect: connections that never finish their request must not pile up. prometheus_client's own
server gave each connection a thread that waited for its request for ever: 3,000 silent
connections held 3,000 threads and +78 MiB, and ~9,000 would take the exporter past its 256 MiB
limit (OOM-killed, metrics gone, the HPAs that scale on them blind). Now waiting connections are
capped (the oldest is shed for a new one) and each waits at most its timeout; a scrape is served
whatever the others do."""
from __future__ import annotations

import socket
import threading
import time

import pytest
import requests

from exporter import server as exporter_server
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
def test_silent_connections_are_capped_and_scrapes_still_answered(node, partial):
    cap = exporter_server.MAX_WAITING_CONNECTIONS
    threads_before = threading.active_count()
    socks = _open(node.exporter.port, cap * 3, partial)
    try:
        time.sleep(0.5)
        # One handler thread per connection still open on the server's side, at most the cap.
        assert threading.active_count() - threads_before <= cap + 2
        shed = sum(_closed_by_server(s) for s in socks)
        assert shed >= cap * 2 - 2
        assert not any(_closed_by_server(s) for s in socks[-cap // 2:])   # the newest wait on
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
