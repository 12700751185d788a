"""Serve the collector over HTTP and stop cleanly.

The server is prometheus_client's WSGI app on the node agents' bounded server
(:mod:`stowage.metrics_http`): the port is open to the whole pod network, and prometheus_client's
own server gives every connection a thread that waits for its request for ever.
"""
from __future__ import annotations

import logging
import threading

from prometheus_client import CollectorRegistry

from stowage.metrics_http import MetricsServer, serve

from .collector import ExporterConfig, GpuCollector, Snapshotter

log = logging.getLogger("stowage.exporter")


class Exporter:
    """Owns the snapshotter, a private registry and the HTTP server thread."""

    def __init__(self, cfg: ExporterConfig, snapshotter: Snapshotter | None = None) -> None:
        if not cfg.node:
            log.warning("no --node-name / NODE_NAME: the `node` label is empty")
        self.cfg = cfg
        self.snapshotter = snapshotter or Snapshotter(cfg)
        self.collector = GpuCollector(self.snapshotter, cfg.node, cfg.cache_s, cfg.reading_wait_s)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._server: MetricsServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve /metrics; returns the bound port (``port`` 0 picks a free one)."""
        self._server, self._thread = serve(self.registry, port, addr)
        self.port = self._server.server_port
        log.info("serving GPU metrics on %s:%d/metrics", addr, self.port)
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server = None
        self.snapshotter.close()
