"""The extender's --metrics-bind port (0.0.0.0:9888 in scheduler.yaml, behind a Service for
Prometheus) is open to the whole pod network, unlike its verbs (the pod's loopback): connections
that never finish their request must not pile up. It used prometheus_client's
``start_http_server``, which gives every connection a thread that waits for its request for ever,
in the process that holds the model and serves every decision: enough silent connections take it
to its memory limit (or its thread limit, and then the watch or a bind cannot start a thread),
and scheduling stops. It now serves on the bounded server the node agents use
(stowage/metrics_http.py; tests/test_exporter_connections.py has the rules)."""
from __future__ import annotations

import threading

from silent_connections import assert_capped_and_scraped

from benchmarks.latency.procs import free_port
from extender.app import create_app
from extender.cli import serve_metrics
from extender.gunicorn_conf import run_exit_callbacks
from extender.service import ExtenderService
from packing.model import ClusterModel


def test_silent_connections_to_the_extenders_metrics_port_are_capped_and_a_scrape_is_answered():
    app = create_app(ExtenderService(ClusterModel()))
    port = free_port()
    before = threading.active_count()
    serve_metrics(app, f"127.0.0.1:{port}")
    try:
        assert_capped_and_scraped(port, "stowage_extender_free_whole_cards", before)
    finally:
        run_exit_callbacks()     # stops the listener, as the worker's exit does
