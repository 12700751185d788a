"""The device plugin's metrics port (``--metrics-port``, on in the shipped DaemonSet) is open to the
pod network, so anyone there can connect: connections that never finish their request must not
pile up. prometheus_client's own server (``start_http_server``, which the plugin used) gives each
connection a thread that waits for its request for ever; the plugin's memory limit is 256 MiB,
and an OOM-killed plugin fails the admission of every GPU pod pending on its node. The exporter
had the same hole (tests/test_exporter_connections.py); both now serve with the bounded server
they share (gpunode/metrics_http.py)."""
from __future__ import annotations

import socket
import threading
import time

import requests

from deviceplugin.cli import serve_metrics
from dp_harness import rig

CAP = 64   # gpunode.metrics_http.MAX_WAITING_CONNECTIONS


def test_silent_connections_to_the_plugins_metrics_port_are_capped_and_a_scrape_is_answered(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        server, thread = serve_metrics(r.plugin.reconciler.registry, 0, "127.0.0.1")
        port = server.server_port
        try:
            before = threading.active_count()
            socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(CAP * 3)]
            try:
                deadline = time.monotonic() + 20
                # each connection accepted gets its thread at once; the shed ones end theirs
                while time.monotonic() < deadline and threading.active_count() - before > CAP + 8:
                    time.sleep(0.1)
                assert threading.active_count() - before <= CAP + 8, (
                    f"{threading.active_count() - before} threads for {len(socks)} silent connections")
                got = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
                assert got.status_code == 200 and "stowage_deviceplugin_record_corrections" in got.text
            finally:
                for s in socks:
                    s.close()
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
