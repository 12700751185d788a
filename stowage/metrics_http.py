"""The metrics ports of Stowage's processes: a WSGI app on a thread-per-connection server that
bounds the connections waiting for their request.

Every such port is open to the whole pod network (Prometheus scrapes it): the exporter's, the
device plugin's ``--metrics-port`` and the extender's ``--metrics-bind``. prometheus_client's own
server gives every connection a thread that waits for its request for ever: 3,000 silent
connections held 3,000 threads and +78 MiB, and ~9,000 take the exporter past its 256 MiB limit
(the device plugin has the same limit, and an OOM-killed plugin fails the admission of every GPU
pod pending on its node; in the extender the threads pile up in the process that holds the model
and makes every decision). Here a connection waits for its request at most
:data:`REQUEST_TIMEOUT_S`, and at most :data:`MAX_WAITING_CONNECTIONS` wait at once: a new one
sheds the one that has waited longest (a scrape sends its request at once and is answered in
milliseconds, so the connections shed are those that send nothing). A request being answered is
never cut.

On the ground floor, beside the other pieces every host shares (``stowage.kubelist``): it serves
a Prometheus registry and knows nothing of what the registry holds.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger("stowage.metrics")

MAX_WAITING_CONNECTIONS = 64   # connections whose request has not all arrived yet
REQUEST_TIMEOUT_S = 10.0       # each socket read and write (Prometheus' default scrape timeout)


class _Handler(WSGIRequestHandler):
    """One connection: its socket times out (:data:`REQUEST_TIMEOUT_S`); once its request line
    and headers are in, it is being answered and no longer counts as waiting."""

    def setup(self) -> None:
        self.timeout = REQUEST_TIMEOUT_S   # read when the connection is set up (StreamRequestHandler)
        super().setup()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.server.answering(self.connection)   # type: ignore[attr-defined]
        return ok

    def log_message(self, format: str, *args: Any) -> None:   # noqa: A002 - the base class's name
        """Nothing per request (Prometheus scrapes every few seconds)."""


class MetricsServer(ThreadingMixIn, WSGIServer):
    """Thread per connection, with the waiting ones bounded (module docstring)."""

    daemon_threads = True
    request_queue_size = 128   # listen backlog (socketserver's 5 dropped connections in a burst)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._waiting: dict[Any, float] = {}   # connection -> when it was accepted
        self._waiting_lock = threading.Lock()
        self.shed = 0                          # connections closed to make room (for tests, logs)
        self.handlers = 0                      # connection threads started and not finished
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._waiting_lock:
            while len(self._waiting) >= MAX_WAITING_CONNECTIONS:
                oldest = min(self._waiting, key=self._waiting.__getitem__)
                del self._waiting[oldest]
                self.shed += 1
                if self.shed == 1 or self.shed % 1000 == 0:
                    log.warning("%d connection(s) to the metrics port closed without a request: more than %d "
                                "waited at once (something connects and sends nothing)", self.shed,
                                MAX_WAITING_CONNECTIONS)
                try:
                    oldest.shutdown(socket.SHUT_RDWR)   # its thread's read ends at once
                except OSError:
                    pass
            self._waiting[request] = time.monotonic()
            self.handlers += 1
        try:
            super().process_request(request, client_address)
        except BaseException:   # no thread started: it will not count itself out
            with self._waiting_lock:
                self._waiting.pop(request, None)
                self.handlers -= 1
            raise

    def answering(self, request: Any) -> None:
        """The request's line and headers are in: it is answered, not waiting."""
        with self._waiting_lock:
            self._waiting.pop(request, None)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._waiting_lock:
                self._waiting.pop(request, None)
                self.handlers -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or went away is its own business, not a traceback in the log."""
        log.debug("metrics connection from %s ended with an error", client_address, exc_info=True)


def _server_class(addr: str) -> type[MetricsServer]:
    class Server(MetricsServer):
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    return Server


def _with_healthz(app: Callable[..., Any]) -> Callable[..., Any]:
    """``app`` with ``/healthz`` answered by the server itself, for liveness probes: prometheus_client
    answers every path with a collection, which for the exporter is a reading that waits on its
    peers (the kubelet's PodResources, NVML); a probe must ask whether the process serves, not
    whether its peers are quick, or a slow kubelet gets a healthy agent restarted."""
    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", "3")])
            return [b"ok\n"]
        return app(environ, start_response)
    return wsgi


def serve(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> tuple[MetricsServer, threading.Thread]:
    """Serve ``registry`` as prometheus_client's WSGI app (``/metrics``) on ``addr:port`` (0: a
    free port; an IPv6 address in brackets or not) from a daemon thread, with ``/healthz`` for
    liveness probes; returns (server, thread). Stop with ``server.shutdown()`` and
    ``server.server_close()``."""
    host = addr.strip("[]")
    server = make_server(host, port, _with_healthz(make_wsgi_app(registry)), _server_class(host),
                         handler_class=_Handler)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread
