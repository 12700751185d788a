"""The Binding write's fast path: one POST of ready JSON bytes on a kept-alive connection.

Why: in a burst of pods the extender's decision process spends more CPU on each Binding than on
deciding where the pod goes. Through the ``kubernetes`` client one Binding costs 2.4 ms of CPU
(building ``V1Binding`` models, pydantic call validation, ``sanitize_for_serialization``,
urllib3's pool), against 0.9 ms for the same request written with ``http.client`` on a kept-alive
connection (300 Bindings each against the real kube-apiserver v1.28.7 of ``../shared/k8s``, TLS
and a bearer token, ``thread_time`` per call; docs/extender.md, "bind"). The request is the same
bytes the API server would get from the client: the same URL, TLS settings, credentials and
JSON document.

It uses the ``ApiClient``'s own configuration, read per request where it can change: the
credentials come from ``Configuration.auth_settings()`` each time, so a refreshed token (the
in-cluster service account's projected token, an exec plugin's) is used as soon as the client
would use it. Settings this path does not implement (a proxy, a TLS server name or hostname
override) make :func:`direct_poster` answer None, and the binder keeps the client's path.

Connections: one per thread (binds run on several threads), kept alive between requests. A
connection idle for more than ``MAX_IDLE_S`` is replaced before use (the API server closes idle
connections); one the API server closed anyway fails on its next request before any answer, and
that request is sent once more on a new connection. Re-sending is safe for a Binding: if the first one
was applied after all, the second is refused (409, the pod is already bound) and the binder's
read-back finds the pod bound to our node with our record (:mod:`extender.kube_binder`).

An answer is bounded in time and size, whatever the peer sends: the whole request (answer
included) gets ``timeout`` seconds, not each socket read (:class:`Deadlines` shuts the socket of
a request still running then: a ``TimeoutError``, an outcome unknown to the binder), and at most
:data:`MAX_ANSWER_BYTES` of the body are read (a Binding's answer is a Status of a few hundred
bytes). Found by experiment: an answer sent a byte at a time, each within the socket timeout,
held a bind (and its pod's reservation, in flight) for as long as the peer liked; a 300 MiB
answer was read whole (600 MiB at the peak).

The ``kubernetes`` client's own requests that a bind or a requeue makes (the Binding where this
path does not apply, the pod's read-back, the requeuer's PATCH) had the same fault: its timeout
is per socket read. :func:`whole_request` bounds them whole with the same :class:`Deadlines`,
through hooks in the client's urllib3 pools (:func:`bound_client`).
"""
from __future__ import annotations

import heapq
import http.client
import itertools
import socket
import ssl
import threading
import time
import urllib.parse
from contextlib import contextmanager
from typing import Any, Iterator

from kubernetes.client.exceptions import ApiException

# Failures of a kept-alive connection that mean "closed by the server while idle": nothing was
# answered, so the request is sent once more on a new connection.
STALE_CONNECTION = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
                    ConnectionAbortedError, http.client.CannotSendRequest, ssl.SSLEOFError, ssl.SSLZeroReturnError)
# A connection idle this long is replaced before use rather than tried: kube-apiserver closes idle
# connections (Go's http.Server IdleTimeout), and a request on one it closed costs a failed try.
MAX_IDLE_S = 30.0
# The most of an answer's body read; past it the rest is left unread and the connection closed.
MAX_ANSWER_BYTES = 1 << 20
# How often a deadline that came while its request was still connecting looks again for the socket.
RECHECK_UNCONNECTED_S = 0.05


class Deadlines:
    """Shuts the socket of a request still running at its deadline, so that a peer that answers
    slowly (a byte within each read's timeout) cannot hold the request past it. One thread for
    all of a poster's requests, started at the first; arming and disarming a request is a heap
    push and a flag under a lock (the hot path pays no thread per request)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[list[Any]] = []   # [deadline, seq, connection or None once disarmed, fired]
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, conn: http.client.HTTPConnection, deadline: float) -> list[Any]:
        entry = [deadline, next(self._seq), conn, False]
        with self._cond:
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stowage-post-deadlines", daemon=True)
                self._thread.start()
            if self._heap[0] is entry:
                self._cond.notify()
        return entry

    def disarm(self, entry: list[Any]) -> bool:
        """The request is over; whether its deadline came first (its socket was shut)."""
        with self._cond:
            entry[2] = None
            return bool(entry[3])

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2] is None:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                left = self._heap[0][0] - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                entry = heapq.heappop(self._heap)
                entry[3] = True
                sock = entry[2].sock
                if sock is not None and not isinstance(sock, socket.socket):
                    sock = getattr(sock, "socket", None)   # (urllib3's TLS inside a TLS proxy tunnel)
                if sock is None:
                    # Not connected yet (still connecting): shut it as soon as it is, or the
                    # request would go on unbounded on the socket its connect then makes.
                    entry[0] = time.monotonic() + RECHECK_UNCONNECTED_S
                    heapq.heappush(self._heap, entry)
                    continue
                try:   # the plain socket's shutdown: an SSL socket's would also drop its TLS state
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)
                except OSError:
                    pass


class _BoundedCall:
    """One call of :func:`whole_request` on one thread: its deadline, and the connections its
    requests have used so far (armed in :data:`CLIENT_DEADLINES`)."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.armed: dict[int, list[Any]] = {}   # id(connection) -> its Deadlines entry
        self.late = False

    def arm(self, conn: Any) -> None:
        if id(conn) not in self.armed:
            self.armed[id(conn)] = CLIENT_DEADLINES.arm(conn, self.deadline)

    def disarm(self, conn: Any) -> bool:
        """The connection goes back to its pool: whether the deadline shut it."""
        entry = self.armed.pop(id(conn), None)
        late = entry is not None and CLIENT_DEADLINES.disarm(entry)
        self.late = self.late or late
        return late

    def end(self) -> bool:
        """The call is over: disarm what is left; whether the deadline came first on any request."""
        for entry in self.armed.values():
            self.late = CLIENT_DEADLINES.disarm(entry) or self.late
        self.armed.clear()
        return self.late


CLIENT_DEADLINES = Deadlines()      # the deadlines of the client's requests (all threads, one thread)
_calls = threading.local()          # .current: the thread's _BoundedCall, or None


@contextmanager
def whole_request(timeout: float) -> Iterator[None]:
    """Bound every request made through a :func:`bound_client` ``ApiClient`` on this thread inside
    the ``with`` by ``timeout`` seconds from its start, answer included (the client's own timeout
    is per socket read: a peer answering a byte at a time held a call for as long as it liked).
    A call still running then has its socket shut; what failed because of that raises
    ``TimeoutError`` (the outcome is unknown, as for a lost answer)."""
    call = _BoundedCall(time.monotonic() + timeout)
    outer = getattr(_calls, "current", None)
    _calls.current = call
    try:
        yield
    except Exception as exc:
        if call.end():
            raise TimeoutError(f"no whole answer within {timeout:g}s") from exc
        raise
    finally:
        call.end()
        _calls.current = outer


class _BoundedPool:
    """Mixed into an ``ApiClient``'s urllib3 connection pools by :func:`bound_client`: a
    connection a request of a :func:`whole_request` call takes is armed with the call's deadline
    until it goes back to the pool (a connection the deadline shut is closed, not reused)."""

    def _make_request(self, conn: Any, *args: Any, **kwargs: Any) -> Any:
        call = getattr(_calls, "current", None)
        if call is not None:
            call.arm(conn)
        return super()._make_request(conn, *args, **kwargs)  # type: ignore[misc]

    def _put_conn(self, conn: Any) -> None:
        call = getattr(_calls, "current", None)
        if call is not None and conn is not None and call.disarm(conn):
            conn.close()
        super()._put_conn(conn)  # type: ignore[misc]


_bounded_classes: dict[type, type] = {}


def bound_client(api_client: Any) -> None:
    """Let :func:`whole_request` bound the requests of ``api_client`` (a ``kubernetes``
    ``ApiClient``; its urllib3 pools get :class:`_BoundedPool`). Idempotent; requests outside
    a ``whole_request`` (the feed's watches) are as before."""
    manager = api_client.rest_client.pool_manager
    classes = manager.pool_classes_by_scheme
    if all(issubclass(c, _BoundedPool) for c in classes.values()):
        return
    manager.pool_classes_by_scheme = {
        scheme: c if issubclass(c, _BoundedPool)
        else _bounded_classes.setdefault(c, type(f"Bounded{c.__name__}", (_BoundedPool, c), {}))
        for scheme, c in classes.items()}
    if len(manager.pools):
        manager.clear()   # pools made before are of the old classes (their requests in flight go on)


class DirectPoster:
    """POSTs of JSON bytes to one API server with an ``ApiClient``'s settings; see the module doc."""

    def __init__(self, configuration: Any, host: str, port: int, https: bool, base_path: str,
                 context: ssl.SSLContext | None, user_agent: str) -> None:
        self.configuration = configuration
        self.host = host
        self.port = port
        self.https = https
        self.base_path = base_path.rstrip("/")
        self.context = context
        self.user_agent = user_agent
        self._local = threading.local()
        self._deadlines = Deadlines()

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self.context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": self.user_agent}
        for auth in self.configuration.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        return headers

    def post(self, path: str, body: bytes, timeout: float) -> bytes:
        """POST ``body`` to ``path`` (below the client's base path); the answer's body on 2xx,
        ``ApiException`` (status, reason, body) otherwise, as the client raises it. Transport
        failures raise as they are (the outcome is unknown to the caller), and so does an answer
        whose status line has not come within ``timeout`` of the call (``TimeoutError``). The body
        is read up to :data:`MAX_ANSWER_BYTES`, and no longer than that same ``timeout``."""
        headers = self._headers()
        url = self.base_path + path
        conn = getattr(self._local, "conn", None)
        now = time.monotonic()
        if conn is not None and now - getattr(self._local, "used", now) > MAX_IDLE_S:
            conn.close()
            conn = self._local.conn = None
        self._local.used = now
        for attempt in (0, 1):
            fresh = conn is None
            if fresh:
                conn = self._connect(timeout)
            else:
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
            armed = self._deadlines.arm(conn, now + timeout)
            try:
                conn.request("POST", url, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read(MAX_ANSWER_BYTES + 1)
            except BaseException as exc:
                late = self._deadlines.disarm(armed)
                conn.close()
                conn = self._local.conn = None
                if late:
                    raise TimeoutError(f"no whole answer within {timeout:g}s") from exc
                if isinstance(exc, STALE_CONNECTION) and not (fresh or attempt):
                    continue
                raise
            if self._deadlines.disarm(armed) or len(data) > MAX_ANSWER_BYTES:
                data = data[:MAX_ANSWER_BYTES]   # (the rest unread: this connection cannot be used again)
                resp.will_close = True
            if resp.will_close:
                conn.close()
                conn = None
            self._local.conn = conn
            if 200 <= resp.status < 300:
                return data
            exc = ApiException(status=resp.status, reason=resp.reason)
            exc.body = data.decode("utf-8", "replace")
            exc.headers = dict(resp.getheaders())
            raise exc
        raise AssertionError("unreachable")


def direct_poster(api_client: Any) -> DirectPoster | None:
    """A :class:`DirectPoster` with ``api_client``'s URL, TLS and credentials, or None where the
    configuration uses something it does not implement (then keep the client's own path)."""
    cfg = getattr(api_client, "configuration", None)
    if cfg is None or getattr(cfg, "proxy", None) or getattr(cfg, "tls_server_name", None) \
            or getattr(cfg, "assert_hostname", None) is not None:
        return None
    url = urllib.parse.urlsplit(str(cfg.host or ""))
    if url.scheme not in ("http", "https") or not url.hostname or url.query or url.fragment:
        return None
    https = url.scheme == "https"
    context = None
    if https:
        if cfg.verify_ssl:   # the client's CA (file or data), else the system's
            context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None,
                                                 cadata=getattr(cfg, "ca_cert_data", None) or None)
        else:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cfg.cert_file:
            context.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    port = url.port or (443 if https else 80)
    agent = str(getattr(api_client, "user_agent", "") or "stowage")
    return DirectPoster(cfg, url.hostname, port, https, url.path, context, agent)
