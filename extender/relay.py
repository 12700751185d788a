"""The split layout's hop: gunicorn workers hand each request to the one decision process.

Why the hop exists: the extender's decisions need ONE model of the cards, so that two binds can
never hand out the same card; with one process, every request also pays gunicorn's HTTP
handling under that process's one GIL, and that handling is about two thirds of the do-nothing
floor's CPU per pod (docs/latency.md). The split layout runs the HTTP in several gunicorn worker
processes (stateless, any number) and the decisions in one decision process; a worker passes
each request's body over a unix socket and writes back the answer bytes it gets. The decision
process runs exactly the one-process layout's code (:class:`extender.verbs.Verbs` for the verbs,
the Flask app for everything else), so answers are the same byte for byte.

The frames are deliberately tiny, one request and one answer per round trip on a connection
(one connection per worker thread, so no multiplexing):

- request:  ``!BBHI`` op, flags, path length, body length; then the path, then the body.
  op 1/2/3 = filter/prioritize/bind (path empty); op 4 = any other request, path =
  ``"METHOD /path?query"``. flags bit 0 = the body was over the size limit (body empty).
- answer:   ``!HHI`` status, content-type length, body length; then the content type, the body.
"""
from __future__ import annotations

import logging
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Callable

from .verbs import Reply, Verbs

log = logging.getLogger("stowage.extender")

REQ = struct.Struct("!BBHI")
ANS = struct.Struct("!HHI")
OPS = {"filter": 1, "prioritize": 2, "bind": 3}
VERB_OF = {v: k for k, v in OPS.items()}
OP_OTHER = 4
TOO_LARGE = 1


class RelayError(ConnectionError):
    """The decision process cannot be reached, or hung up in the middle of an answer."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes (b'' when the peer closed before the first byte)."""
    if n == 0:
        return b""
    data = sock.recv(n, socket.MSG_WAITALL)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n:  # a signal or a peer that closed mid-frame
        chunk = sock.recv(n - got, socket.MSG_WAITALL)
        if not chunk:
            raise RelayError(f"connection closed after {got} of {n} bytes")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


# ----------------------------------------------------------------------------- worker side
class RelayClient:
    """A worker thread's connection to the decision process (one per thread: see module docs)."""

    def __init__(self, path: str, timeout: float = 120.0) -> None:
        self.path = path
        self.timeout = timeout
        self._local = threading.local()

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except OSError as exc:
            s.close()
            raise RelayError(f"cannot reach the decision process at {self.path}: {exc}") from exc
        return s

    def _round_trip(self, s: socket.socket, frame: bytes) -> Reply:
        s.sendall(frame)
        head = _recv_exact(s, ANS.size)
        if len(head) < ANS.size:
            raise RelayError("the decision process closed the connection")
        status, clen, blen = ANS.unpack(head)
        ctype = _recv_exact(s, clen).decode() if clen else ""
        body = _recv_exact(s, blen)
        if len(body) != blen:
            raise RelayError("the decision process closed the connection mid-answer")
        return Reply(status, body, content_type=ctype)

    def call(self, op: int, body: bytes, path: str = "", flags: int = 0) -> Reply:
        """One request, one answer. A kept connection found broken is re-made once and the
        request sent again: safe, since every verb is idempotent for the same pod (a bind
        repeated to the node whose cards the pod already holds just completes). When the
        decision process is gone the reconnect fails and the caller answers with an error."""
        p = path.encode()
        frame = REQ.pack(op, flags, len(p), len(body)) + p + body
        s = getattr(self._local, "sock", None)
        fresh = s is None
        if s is None:
            s = self._local.sock = self._connect()
        try:
            return self._round_trip(s, frame)
        except OSError as exc:
            self.drop()
            if fresh or not isinstance(exc, (BrokenPipeError, ConnectionResetError, RelayError)):
                raise RelayError(f"decision process: {exc}") from exc
        # A kept connection that broke before the answer started: reconnect once.
        s = self._local.sock = self._connect()
        try:
            return self._round_trip(s, frame)
        except OSError as exc:
            self.drop()
            raise RelayError(f"decision process: {exc}") from exc

    def drop(self) -> None:
        s = getattr(self._local, "sock", None)
        self._local.sock = None
        if s is not None:
            s.close()


# ------------------------------------------------------------------ decision process side
OtherFn = Callable[[str, str, bytes], Reply]   # (method, path?query, body) -> answer


@dataclass
class RelayServer:
    """Serves frames on ``listener`` (a bound, listening unix socket): a thread per connection."""

    listener: socket.socket
    verbs: Verbs
    other: OtherFn

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self._accept_loop, name="relay-accept", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        with self._lock:
            for c in list(self._conns):
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                if self._stop.is_set():
                    return
                log.exception("relay: accept failed")
                continue
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="relay-conn", daemon=True).start()

    def answer(self, op: int, flags: int, path: str, body: bytes) -> Reply:
        """The answer to one frame (never raises: a request we cannot read is a 400)."""
        verb = VERB_OF.get(op)
        if verb is not None:
            return self.verbs.handle(verb, None if flags & TOO_LARGE else body)
        if op == OP_OTHER:
            method, _, target = path.partition(" ")
            try:
                return self.other(method, target, body)
            except Exception as exc:
                log.exception("relay: %s %s failed", method, target)
                return Reply(500, f'{{"Error": "Stowage extender internal error: {type(exc).__name__}"}}'.encode(),
                             "internal_error")
        return Reply(400, b'{"Error": "unknown relay operation"}', "bad_request")

    def _serve(self, conn: socket.socket) -> None:
        try:
            while not self._stop.is_set():
                head = _recv_exact(conn, REQ.size)
                if len(head) < REQ.size:
                    return  # the worker closed its connection (or died)
                op, flags, plen, blen = REQ.unpack(head)
                path = _recv_exact(conn, plen).decode("utf-8", "replace")
                body = _recv_exact(conn, blen)
                if len(body) != blen:
                    return
                reply = self.answer(op, flags, path, body)
                ctype = reply.content_type.encode()
                conn.sendall(ANS.pack(reply.status, len(ctype), len(reply.body)) + ctype + reply.body)
        except OSError as exc:
            if not self._stop.is_set():
                log.info("relay: worker connection ended: %s", exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()
