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
  op 1/2/3/5 = filter/prioritize/bind/preempt (path empty); op 4 = any other request, path =
  ``"METHOD /path?query"``. flags bit 0 = the body was over the size limit (body empty).
- answer:   ``!HHI`` status, content-type length, body length; then the content type, the body.
"""
from __future__ import annotations

import logging
import selectors
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from .verbs import Reply, Verbs, json_reply

log = logging.getLogger("stowage.extender")

REQ = struct.Struct("!BBHI")
ANS = struct.Struct("!HHI")
MAX_ANSWER_BYTES = (1 << 32) - 1   # the answer's length field
OPS = {"filter": 1, "prioritize": 2, "bind": 3, "preempt": 5}
VERB_OF = {v: k for k, v in OPS.items()}
OP_OTHER = 4
TOO_LARGE = 1
# Filter/prioritize bodies up to this size are answered on the relay's own thread; bigger ones
# (full Node objects: nodeCacheCapable false) take seconds to decode, and go to the pool so they
# do not hold up the binds behind them. NodeNames bodies are ~150 KB at 10,000 nodes.
INLINE_MAX_BODY = 1 << 20


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

    def _round_trip(self, s: socket.socket, frame: bytes | tuple[bytes, bytes]) -> Reply:
        for part in (frame,) if isinstance(frame, bytes) else frame:
            s.sendall(part)
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
        head = REQ.pack(op, flags, len(p), len(body)) + p
        # A big body is sent as it is: joining would copy it (memory is bounded in bytes).
        frame: bytes | tuple[bytes, bytes] = head + body if len(body) <= INLINE_MAX_BODY else (head, body)
        for attempt in (0, 1):
            s = getattr(self._local, "sock", None)
            fresh = s is None
            if fresh:
                s = self._local.sock = self._connect()
            try:
                return self._round_trip(s, frame)
            except OSError as exc:
                self.drop()
                # Only a kept connection that broke is worth one more try on a new one.
                if fresh or attempt or not isinstance(exc, (BrokenPipeError, ConnectionResetError, RelayError)):
                    raise RelayError(f"decision process: {exc}") from exc
        raise AssertionError("unreachable")

    def drop(self) -> None:
        s = getattr(self._local, "sock", None)
        self._local.sock = None
        if s is not None:
            s.close()


# ------------------------------------------------------------------ decision process side
OtherFn = Callable[[str, str, bytes], Reply]   # (method, path?query, body) -> answer


@dataclass
class RelayServer:
    """Serves frames on ``listener`` (a bound, listening unix socket).

    One thread reads every connection and answers filter and prioritize itself, in arrival
    order; binds, the other requests and huge bodies go to a few pool threads. Why not a thread per
    connection: the decisions are serial anyway (the model lock), so more threads only add
    GIL hand-offs between them on every request (measured: ~0.1 ms a request in the decision
    process, the one serial stage of the split layout). Bind keeps its own threads because in
    kube mode it waits on the API server, and must not hold up the next pod's filter.
    """

    listener: socket.socket
    verbs: Verbs
    other: OtherFn
    pool_threads: int = 4

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._back: list[socket.socket] = []    # connections handed back by the pool
        self._pool = ThreadPoolExecutor(max_workers=self.pool_threads, thread_name_prefix="relay-pool")

    def start(self) -> threading.Thread:
        self.listener.setblocking(False)
        self._sel.register(self.listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        t = threading.Thread(target=self._loop, name="relay", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
        self._wake()
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
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

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
                return json_reply({"Error": f"Stowage extender internal error: {type(exc).__name__}"}, 500,
                                  "internal_error")
        return json_reply({"Error": "unknown relay operation"}, 400, "bad_request")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._sel.select(timeout=1.0)
            except OSError:
                if self._stop.is_set():
                    return
                raise
            for key, _ in events:
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    self._rearm()
                else:
                    self._frame(key.fileobj)  # type: ignore[arg-type]

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            if not self._stop.is_set():
                log.exception("relay: accept failed")
            return
        conn.setblocking(True)
        with self._lock:
            self._conns.add(conn)
        self._sel.register(conn, selectors.EVENT_READ, "conn")

    def _rearm(self) -> None:
        try:
            self._wake_r.recv(4096)
        except OSError:
            pass
        with self._lock:
            back, self._back = self._back, []
        for conn in back:
            if conn.fileno() >= 0:
                self._sel.register(conn, selectors.EVENT_READ, "conn")

    def _close(self, conn: socket.socket) -> None:
        with self._lock:
            self._conns.discard(conn)
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def _frame(self, conn: socket.socket) -> None:
        """Read one whole frame (the worker sends it at once) and answer it, here or in the pool."""
        try:
            head = _recv_exact(conn, REQ.size)
            if len(head) < REQ.size:
                self._close(conn)  # the worker closed its connection (or died)
                return
            op, flags, plen, blen = REQ.unpack(head)
            path = _recv_exact(conn, plen).decode("utf-8", "replace")
            body = _recv_exact(conn, blen)
            if len(body) != blen:
                self._close(conn)
                return
        except OSError as exc:
            if not self._stop.is_set():
                log.info("relay: worker connection ended: %s", exc)
            self._close(conn)
            return
        if op in (OPS["filter"], OPS["prioritize"]) and blen <= INLINE_MAX_BODY:
            self._reply(conn, self.answer(op, flags, path, body))
            return
        job: Callable[[], Reply] = lambda: self.answer(op, flags, path, body)  # noqa: E731
        if op == OPS["bind"] and not flags & TOO_LARGE and blen <= INLINE_MAX_BODY:
            # The cards are reserved here, in arrival order with the filters: a filter that
            # arrives after this bind sees them taken, even while the API write is under way.
            first = self.verbs.bind_begin(body)
            if isinstance(first, Reply):
                self._reply(conn, first)
                return
            job = first
        self._sel.unregister(conn)  # the pool answers; nothing else arrives meanwhile
        try:
            self._pool.submit(self._pooled, conn, job)
        except RuntimeError:  # stopping: the pool takes no more work
            self._close(conn)

    def _pooled(self, conn: socket.socket, job: Callable[[], Reply]) -> None:
        try:
            reply = job()
        except Exception as exc:  # noqa: BLE001 - never leave the worker without an answer
            log.exception("relay: request failed")
            reply = json_reply({"Error": f"Stowage extender internal error: {type(exc).__name__}"}, 500,
                               "internal_error")
        if self._reply(conn, reply):
            with self._lock:
                self._back.append(conn)
            self._wake()

    def _reply(self, conn: socket.socket, reply: Reply) -> bool:
        if len(reply.body) > MAX_ANSWER_BYTES:
            # Not framable (the length is 32 bits): this request's 500, not a struct.error that
            # would end the reading thread and leave every later request without an answer.
            log.error("relay: an answer of %d bytes is too large to pass on", len(reply.body))
            reply = json_reply({"Error": f"Stowage extender internal error: answer too large "
                                         f"({len(reply.body)} bytes)"}, 500, "internal_error")
        ctype = reply.content_type.encode()
        try:
            conn.sendall(ANS.pack(reply.status, len(ctype), len(reply.body)) + ctype + reply.body)
            return True
        except OSError as exc:
            if not self._stop.is_set():
                log.info("relay: worker connection ended: %s", exc)
            self._close(conn)
            return False
