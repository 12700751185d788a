"""The metrics ports of Stowage's processes: a WSGI app on a thread-per-connection server that
bounds the connections waiting for their request.

Every such port is open to the whole pod network (Prometheus scrapes it): the exporter's, the
device plugin's ``--metrics-port`` and the extender's ``--metrics-bind``. prometheus_client's own
server gives every connection a thread that waits for its request for ever: 3,000 silent
connections held 3,000 threads and +78 MiB, and ~9,000 take the exporter past its 256 MiB limit
(the device plugin has the same limit, and an OOM-killed plugin fails the admission of every GPU
pod pending on its node; in the extender the threads pile up in the process that holds the model
and makes every decision). Here a connection's request must be in within
:data:`REQUEST_TIMEOUT_S` of its arrival (the socket's timeout bounds each read only: a client that
sends one byte before each read times out never meets it), its headers are at most
:data:`MAX_HEADER_BYTES` (http.server reads 100 lines of 64 KiB: 6.4 MB a connection), and at
most :data:`MAX_WAITING_CONNECTIONS` wait at once: a new one sheds the one that has waited longest
(a scrape sends its request at once and is answered in milliseconds, so the connections shed are
those that send nothing). A connection closed for its request is not answered; a request being
answered is never cut. A collection that raises is a short 500, logged once per error.

On the ground floor, beside the other pieces every host shares (``stowage.kubelist``): it serves
a Prometheus registry and knows nothing of what the registry holds.
"""
from __future__ import annotations

import http.client
import logging
import socket
import sys
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any, BinaryIO, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger("stowage.metrics")

MAX_WAITING_CONNECTIONS = 64   # connections whose request has not all arrived yet
REQUEST_TIMEOUT_S = 10.0       # each read and write, and a request's arrival (Prometheus' default scrape timeout)
MAX_HEADER_BYTES = 16 * 1024   # a request's header lines together (Prometheus sends ~300 bytes)


class _HeadersTooLarge(http.client.HTTPException):
    """Raised into http.server's header parsing, which answers it with 431."""


class _HeaderBudget:
    """The request's stream as http.server's header parsing reads it, at most ``left`` bytes: 64
    connections waiting with 100 header lines of 64 KiB each (what http.server allows) held 424 MiB
    in a probe, past the node agents' 256 MiB limit. Past the budget the next line is refused, before
    more is read."""

    def __init__(self, raw: BinaryIO, left: int) -> None:
        self.raw, self.left = raw, left

    def readline(self, size: int = -1) -> bytes:
        if self.left <= 0:
            raise _HeadersTooLarge(f"request headers over {MAX_HEADER_BYTES} bytes")
        line = self.raw.readline(self.left if size < 0 else min(size, self.left))
        self.left -= len(line)
        return line


class _Handler(WSGIRequestHandler):
    """One connection: its socket times out (:data:`REQUEST_TIMEOUT_S`); once its request line
    and headers are in, it is being answered and no longer counts as waiting, unless the server
    closed it meanwhile (shed, or its request too slow): then it is not answered at all (its
    headers read as ended when its socket was shut, and nobody is there to read a collection)."""

    def setup(self) -> None:
        self.timeout = REQUEST_TIMEOUT_S   # read when the connection is set up (StreamRequestHandler)
        super().setup()

    def parse_request(self) -> bool:
        stream = self.rfile
        self.rfile = _HeaderBudget(stream, MAX_HEADER_BYTES)   # type: ignore[assignment]  # the headers' reads
        try:
            ok = super().parse_request()
        finally:
            self.rfile = stream
        waited = self.server.answering(self.connection)   # type: ignore[attr-defined]
        return ok and waited

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
        self.timed_out = 0                     # connections closed for their request's lateness (tests)
        self.handlers = 0                      # connection threads started and not finished
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._waiting_lock:
            while len(self._waiting) >= MAX_WAITING_CONNECTIONS:
                self._close_waiting(min(self._waiting, key=self._waiting.__getitem__))
                self.shed += 1
                if self.shed == 1 or self.shed % 1000 == 0:
                    log.warning("%d connection(s) to the metrics port closed without a request: more than %d "
                                "waited at once (something connects and sends nothing)", self.shed,
                                MAX_WAITING_CONNECTIONS)
            self._waiting[request] = time.monotonic()
            self.handlers += 1
        try:
            super().process_request(request, client_address)
        except BaseException:   # no thread started: it will not count itself out
            with self._waiting_lock:
                self._waiting.pop(request, None)
                self.handlers -= 1
            raise

    def _close_waiting(self, request: Any) -> None:
        """Close a waiting connection (the caller holds the lock): its thread's read ends at once."""
        del self._waiting[request]
        try:
            request.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def service_actions(self) -> None:
        """Between accepts (every half second at least): close the connections whose request has not
        all arrived :data:`REQUEST_TIMEOUT_S` after they did. The socket's timeout bounds each read,
        not the request: one byte before each timeout (slowloris) kept a connection for ever."""
        super().service_actions()
        late = time.monotonic() - REQUEST_TIMEOUT_S
        with self._waiting_lock:
            for request in [r for r, since in self._waiting.items() if since < late]:
                self._close_waiting(request)
                self.timed_out += 1
                log.debug("a connection to the metrics port sent no whole request within %.0f s: closed",
                          REQUEST_TIMEOUT_S)

    def answering(self, request: Any) -> bool:
        """The request's line and headers are in: it is answered, not waiting. False when the
        server closed it meanwhile (it is not to be answered)."""
        with self._waiting_lock:
            return self._waiting.pop(request, None) is not None

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


def _failures_as_500(app: Callable[..., Any]) -> Callable[..., Any]:
    """``app`` with a collection that raises (an NVML error, a bug) answered with a short 500 that
    names it, and logged through this module's logger once per error, not on every scrape: wsgiref
    answers its generic "A server error occurred" and prints the traceback on stderr, past the
    process's logging, on every scrape. The next scrape collects again."""
    last = ""   # the error last logged ("" after a collection that worked)

    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        nonlocal last
        try:
            answer = app(environ, start_response)
        except Exception as exc:
            said = f"{type(exc).__name__}: {exc}"
            log.log(logging.DEBUG if said == last else logging.ERROR, "collecting the metrics failed",
                    exc_info=True)
            last = said
            body = f"collecting the metrics failed ({type(exc).__name__}); the process's log has the error\n".encode()
            start_response("500 Internal Server Error", [("Content-Type", "text/plain; charset=utf-8"),
                                                         ("Content-Length", str(len(body)))], sys.exc_info())
            return [body]
        last = ""
        return answer
    return wsgi


def serve(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> tuple[MetricsServer, threading.Thread]:
    """Serve ``registry`` as prometheus_client's WSGI app (``/metrics``) on ``addr:port`` (0: a
    free port; an IPv6 address in brackets or not) from a daemon thread, with ``/healthz`` for
    liveness probes; returns (server, thread). Stop with ``server.shutdown()`` and
    ``server.server_close()``."""
    host = addr.strip("[]")
    server = make_server(host, port, _with_healthz(_failures_as_500(make_wsgi_app(registry))), _server_class(host),
                         handler_class=_Handler)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server, thread
