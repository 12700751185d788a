"""A metrics port under silent connections: what every Stowage metrics port must withstand
(stowage/metrics_http.py). Counted as threads of this process, so a server that gives each
connection a thread for ever (prometheus_client's ``start_http_server``) fails it."""
from __future__ import annotations

import socket
import threading
import time

import requests

CAP = 64   # stowage.metrics_http.MAX_WAITING_CONNECTIONS


def assert_capped_and_scraped(port: int, series: str, threads_before: int) -> None:
    """Open 3 x CAP connections that send nothing to ``127.0.0.1:port``: the process may hold at
    most CAP (+ a few) more threads than ``threads_before`` once the shed ones end, and a scrape
    meanwhile answers with ``series`` in it."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(CAP * 3)]
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and threading.active_count() - threads_before > CAP + 8:
            time.sleep(0.1)
        held = threading.active_count() - threads_before
        assert held <= CAP + 8, f"{held} threads for {len(socks)} silent connections"
        got = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert got.status_code == 200 and series in got.text
    finally:
        for s in socks:
            s.close()
