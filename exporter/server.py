"""Serve the collector over HTTP (prometheus_client's own server) and stop cleanly."""
from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from .collector import ExporterConfig, GpuCollector, Snapshotter

log = logging.getLogger("stowage.exporter")


class Exporter:
    """Owns the snapshotter, a private registry and the HTTP server thread."""

    def __init__(self, cfg: ExporterConfig, snapshotter: Snapshotter | None = None) -> None:
        if not cfg.node:
            log.warning("no --node-name / NODE_NAME: the `node` label is empty")
        self.cfg = cfg
        self.snapshotter = snapshotter or Snapshotter(cfg)
        self.collector = GpuCollector(self.snapshotter, cfg.node, cfg.cache_s)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self._server: Any = None
        self._thread: Any = None
        self.port = 0

    def start(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve /metrics; returns the bound port (``port`` 0 picks a free one)."""
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        self.port = self._server.server_port
        log.info("serving GPU metrics on %s:%d/metrics", addr, self.port)
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None
        self.snapshotter.close()
