"""The device plugin's metrics port (``--metrics-port``, on in the shipped DaemonSet) is open to the
pod network, so anyone there can connect: connections that never finish their request must not
pile up. prometheus_client's own server (``start_http_server``, which the plugin used) gives each
connection a thread that waits for its request for ever; the plugin's memory limit is 256 MiB,
and an OOM-killed plugin fails the admission of every GPU pod pending on its node. The exporter
had the same hole (tests/test_exporter_connections.py); both now serve with the bounded server
they share (stowage/metrics_http.py)."""
from __future__ import annotations

import threading

from silent_connections import assert_capped_and_scraped

from deviceplugin.cli import serve_metrics
from dp_harness import rig


def test_silent_connections_to_the_plugins_metrics_port_are_capped_and_a_scrape_is_answered(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        server, thread = serve_metrics(r.plugin.reconciler.registry, 0, "127.0.0.1")
        try:
            assert_capped_and_scraped(server.server_port, "stowage_deviceplugin_record_corrections",
                                      threading.active_count())
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
