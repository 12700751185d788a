"""Reading requests from clients we do not trust: bounded in time and in memory.

Anything that reaches the extender's port may be slow or hostile (docs/security.md). Two bounds
hold for every request, in both serving layouts:

- **Time.** A request (the TLS handshake, its head, its body) must arrive within
  ``client_timeout`` seconds of its first byte, and its answer must be taken within as long
  again: gunicorn's ``gthread`` worker commits a request thread as soon as the first bytes
  arrive and then reads with no timeout at all, so 8 clients that sent a ``Content-Length`` and
  stopped held all 8 threads forever. :class:`GuardedWorker` puts a deadline on every read of
  the connection; a client past it gets a 408 (or, mid-head, a closed connection), and its
  thread serves the next request.
- **Memory.** A body of up to 1 MiB is read as it comes (the largest kube-scheduler sends with
  ``nodeCacheCapable: true`` is ~150 KB at 10,000 nodes). A bigger one, or one of unknown length
  (chunked), first takes the *big-body lane*: one at a time per extender, across all its
  processes (an ``flock`` on a file the processes share), so however many arrive at once the
  extender holds about one big body, not one per thread. A chunked body is read in steps and
  refused with a 413 the moment it passes the limit. A client that cannot get the lane before
  its deadline gets a 503 (nothing was read).

A malformed chunked body (a chunk size that is no number, a missing CRLF) is a 400, not a
500.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import selectors
import socket
import ssl
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from gunicorn import sock as gsock
from gunicorn.http import errors as http_errors
from gunicorn.http import get_parser
from gunicorn.http.unreader import SocketUnreader
from gunicorn.workers.gthread import _DEFER, ThreadWorker, TConn

from .verbs import Reply, json_reply
from stowage.digits import whole_number

log = logging.getLogger("stowage.extender")

# Seconds a client has to send a request (and, again, to take its answer). kube-scheduler sends
# each request at once and gives up after its httpTimeout (5 s in scheduler-config.yaml).
DEFAULT_CLIENT_TIMEOUT_S = 10.0
# Bodies up to this size are read without the lane.
SMALL_BODY = 1 << 20
READ_STEP = 1 << 20

_settings = {"client_timeout": DEFAULT_CLIENT_TIMEOUT_S}


def set_client_timeout(seconds: float) -> None:
    """Set before gunicorn forks its workers (they inherit it)."""
    _settings["client_timeout"] = float(seconds)


def client_timeout() -> float:
    return _settings["client_timeout"]


class ClientTooSlow(ConnectionResetError):
    """The client did not send its request (or take its answer) within the deadline.

    A ConnectionResetError, so that gunicorn closes the connection quietly when it happens in
    the middle of a request head."""

    def __init__(self, what: str = "request") -> None:
        super().__init__(errno.ECONNRESET, f"the client did not send its {what} in time ({client_timeout():g} s)")


def return_big_buffers_to_the_system(threshold: int = SMALL_BODY) -> bool:
    """glibc: serve allocations of ``threshold`` bytes and more from their own mappings, given back
    to the system when freed. By default glibc raises that threshold (up to 32 MiB) after the first
    big free, and the request threads' arenas then keep every big body's pages: the resident set
    grew by a body per thread even with one big body at a time. True when set (glibc only)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        m_mmap_threshold = -3
        return bool(libc.mallopt(m_mmap_threshold, threshold))
    except (OSError, AttributeError):
        return False


# ----------------------------------------------------------------------------- the worker
# A request is read ahead, without a thread, until its head and up to PREFETCH_BODY bytes of its
# body are there; only then does a request thread take it.
HEAD_MAX = 64 << 10
PREFETCH_BODY = 64 << 10
# Open connections per worker process (gunicorn's default is 1,000): each may hold up to
# HEAD_MAX + PREFETCH_BODY bytes read ahead, so this bounds that memory (64 MiB).
WORKER_CONNECTIONS = 512
# Answer bytes the socket could not take at once, held per worker process for the event loop to
# write as the clients read them (the same 64 MiB as what is read ahead). Past it the oldest
# such answers are dropped (their clients had the longest to read them) to make room; an answer
# too big for half of it is written by its thread, blocking within the client timeout, as
# gunicorn does.
WRITE_BEHIND_BYTES = 64 << 20
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length[ \t]*:([^\r\n]*)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding[ \t]*:", re.IGNORECASE)
_EXPECT_CONTINUE = re.compile(rb"\r\nexpect[ \t]*:[ \t]*100-continue[ \t]*(?=\r\n)", re.IGNORECASE)
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_PEER_SENDS = 2**63 - 1
MORE, COMPLETE, CLOSE = "more", "complete", "close"
# handle()'s result for a request answered but for bytes the event loop still writes
_DRAIN = object()


def request_is_complete(buf: bytes | bytearray) -> bool:
    """Whether ``buf`` holds a request head and all of its body, or as much as we read ahead
    (a head too long for us is complete too: the parser then refuses it)."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return len(buf) >= HEAD_MAX
    have = len(buf) - end - 4
    if have >= PREFETCH_BODY:
        return True
    head = bytes(buf[:end])
    if _CHUNKED.search(head):
        return buf.endswith(b"0\r\n\r\n")
    m = _CONTENT_LENGTH.search(head)
    if m is None:
        return True
    # The whole value, as the parser reads it: its leading digits alone (``5`` of ``5\x1b[2J``)
    # waited for a body the parser would refuse anyway, until the deadline's 408.
    # A length past any body a peer can send (Go's net/http holds it in an int64) is refused at
    # once too, without waiting for bytes that will not come.
    stated = whole_number(m.group(1).strip(b" \t").decode("latin-1"), _NO_PEER_SENDS)
    return stated is None or stated >= _NO_PEER_SENDS or have >= stated


class _DeadlineSocket:
    """The connection as gunicorn's parser reads it: every recv() bounded by the request's
    deadline; the socket keeps a full ``client_timeout`` for the answer's writes."""

    def __init__(self, sock: socket.socket, conn: "DeadlineConn") -> None:
        self._sock = sock
        self._conn = conn

    def recv(self, n: int) -> bytes:
        left = self._conn.deadline - time.monotonic()
        if left <= 0:
            raise ClientTooSlow()
        self._sock.settimeout(left)
        try:
            return self._sock.recv(n)
        except socket.timeout:
            raise ClientTooSlow() from None
        finally:
            try:
                self._sock.settimeout(client_timeout())
            except OSError:
                pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class DeadlineConn(TConn):
    """A gthread connection read ahead without a thread, then read with a deadline."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = float("inf")      # of the request being read (None between requests)
        self.started: float | None = None
        self.ahead = bytearray()          # read ahead, not yet given to the parser
        self.tls: ssl.SSLSocket | None = None   # after a handshake done without a thread
        self.unsent = bytearray()         # answer bytes the event loop writes (write-behind)
        self.drain_deadline = float("inf")
        self.after_drain = False          # keep the connection alive once they are written

    def init(self) -> None:
        if self.initialized:
            return
        if self.tls is not None:
            self.initialized = True
            self.sock = self.tls
            self.sock.setblocking(True)
            self.parser = get_parser(self.cfg, self.sock, self.client)
        else:
            super().init()
        unreader = getattr(self.parser, "unreader", None)
        if isinstance(unreader, SocketUnreader) and not isinstance(unreader.sock, _DeadlineSocket):
            unreader.sock = _DeadlineSocket(unreader.sock, self)

    def read_ahead(self) -> str:
        """Read what has arrived, without blocking: MORE (wait for the poller), COMPLETE (a thread
        may take it now) or CLOSE (past its deadline, or the client went away)."""
        now = time.monotonic()
        if self.started is None:
            self.started = now
            self.deadline = now + client_timeout()
        if now >= self.deadline:
            return CLOSE
        if self.parser is not None:  # a kept-alive connection: what the parser holds comes first
            self.ahead[:0] = self.parser.unreader.take_buffered()
        src: Any = self.sock
        if self.cfg.is_ssl and not self.initialized:
            if self.tls is None:
                self.sock.setblocking(False)
                try:
                    # wrapping detaches the plain socket: from here on the connection is this one
                    self.sock = self.tls = gsock.ssl_wrap_socket(self.sock, self.cfg)
                except (OSError, ValueError):
                    return CLOSE
            try:
                self.tls.do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return MORE
            except (ssl.SSLError, OSError) as exc:
                log.info("TLS handshake with %s failed: %s", self.client, exc)
                return CLOSE
            src = self.tls
        src.setblocking(False)
        try:
            while len(self.ahead) < HEAD_MAX + PREFETCH_BODY:
                data = src.recv(HEAD_MAX + PREFETCH_BODY - len(self.ahead))
                if not data:  # the client closed its side: the parser sees what there is
                    return COMPLETE if self.ahead else CLOSE
                self.ahead += data
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass
        except (ssl.SSLError, OSError):
            return CLOSE
        if self.ahead and request_is_complete(self.ahead):
            return COMPLETE
        self.answer_expect_continue(src)
        return MORE

    def answer_expect_continue(self, src: Any) -> None:
        """A client waiting for ``100 Continue`` before its body (``Expect: 100-continue``) gets
        it as soon as its head is in (best effort: one non-blocking send), and the expectation is
        taken out of the head, so that gunicorn does not answer it a second time. Without it the
        client waited for the read-ahead's body until the 408 (curl: 1 s per big body)."""
        end = self.ahead.find(b"\r\n\r\n")
        if end < 0:
            return
        line_end = self.ahead.find(b"\r\n")
        m = _EXPECT_CONTINUE.search(self.ahead, line_end, end + 2)
        if m is None or not self.ahead[:line_end].endswith(b" HTTP/1.1"):
            return
        del self.ahead[m.start():m.end()]
        try:
            src.send(CONTINUE)
        except (OSError, ValueError):
            pass

    def refuse_late(self) -> None:
        """Tell a client that sent a request head but not the rest in time why it is cut off
        (best effort: one non-blocking send)."""
        if b"\r\n\r\n" not in self.ahead:
            return
        msg = f'{{"Error": "{ClientTooSlow().strerror}"}}'.encode()
        answer = (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
                  b"Content-Length: " + str(len(msg)).encode() + b"\r\n\r\n" + msg)
        try:
            (self.tls or self.sock).setblocking(False)
            (self.tls or self.sock).send(answer)
        except (OSError, ValueError):
            pass

    def hand_over(self) -> None:
        """Give what was read ahead to the parser (the thread reads the rest, before the deadline)."""
        self.sock.setblocking(True)
        self.init()
        if self.ahead:
            self.parser.unreader.unread(bytes(self.ahead))
            self.ahead = bytearray()
        self.data_ready = True


class _WriteBehindSocket:
    """The plain connection as an answer is written to it: what the socket takes at once is
    sent, the rest goes to ``conn.unsent`` for the event loop (:meth:`GuardedWorker.drain`), so
    that a client that does not read holds no request thread. Where
    :meth:`GuardedWorker.reserve_unsent` finds no room, the thread writes blocking, within the
    client timeout (the socket's timeout), as gunicorn does, after what is queued."""

    def __init__(self, sock: socket.socket, conn: DeadlineConn, worker: "GuardedWorker") -> None:
        self._sock = sock
        self._conn = conn
        self._worker = worker

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        if not self._conn.unsent:
            timeout = self._sock.gettimeout()
            self._sock.setblocking(False)
            try:
                while view:
                    view = view[self._sock.send(view):]
            except (BlockingIOError, InterruptedError):
                pass
            finally:
                self._sock.settimeout(timeout)
            if not view:
                return
        if self._worker.reserve_unsent(len(view)):
            self._conn.unsent += view
            return
        unsent, self._conn.unsent = self._conn.unsent, bytearray()
        self._worker.release_unsent(len(unsent))
        self._sock.sendall(unsent)
        self._sock.sendall(view)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class GuardedWorker(ThreadWorker):
    """gunicorn's ``gthread`` worker that gives a request a thread only once it has arrived, and
    then a deadline (see the module docstring)."""

    def accept(self, listener: socket.socket) -> None:
        try:
            client_sock, client_addr = listener.accept()
            self.nr_conns += 1
            client_sock.setblocking(True)
            self.enqueue_req(DeadlineConn(self.cfg, client_sock, client_addr, listener.getsockname()))
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise

    def handle(self, conn: DeadlineConn):  # type: ignore[override]
        state = conn.read_ahead()
        if state == MORE:
            return _DEFER  # back to the poller, holding no thread
        if state == CLOSE:
            return False
        try:
            conn.hand_over()
        except (OSError, ValueError):
            return False
        try:
            result = super().handle(conn)
        finally:
            conn.started = None  # the next request on this connection gets its own deadline
        if conn.unsent:
            conn.after_drain = bool(result)
            return _DRAIN
        return result

    def handle_request(self, req: Any, conn: DeadlineConn) -> bool:  # type: ignore[override]
        """gunicorn's, writing the answer through :class:`_WriteBehindSocket` on a plain
        connection (TLS keeps gunicorn's blocking write: only clients with a certificate of the
        client CA get that far)."""
        if conn.tls is not None:
            return super().handle_request(req, conn)
        plain = conn.sock
        conn.sock = _WriteBehindSocket(plain, conn, self)
        try:
            return super().handle_request(req, conn)
        finally:
            conn.sock = plain

    # ------------------------------------------------------------------- write-behind
    def init_process(self) -> None:
        self.unsent_bytes = 0
        self.unsent_room = threading.Condition()
        self.draining: deque[DeadlineConn] = deque()
        super().init_process()

    def reserve_unsent(self, n: int) -> bool:
        """Count ``n`` more answer bytes held for the event loop. Past :data:`WRITE_BEHIND_BYTES`
        the loop is asked to drop the oldest held answers and this thread waits for the room
        (within the client timeout), rather than block on its own client's socket: a thread
        blocked there stayed so for the whole client timeout however much was freed meanwhile.
        False (nothing counted) for more than half the bound, which no shedding makes room for,
        or when no room came in time."""
        if n > WRITE_BEHIND_BYTES // 2:
            return False
        fits = lambda: self.unsent_bytes + n <= WRITE_BEHIND_BYTES  # noqa: E731
        with self.unsent_room:
            if not fits():
                self.method_queue.defer(self.shed_oldest_unsent)
                if not self.unsent_room.wait_for(fits, timeout=client_timeout()):
                    return False
            self.unsent_bytes += n
            return True

    def release_unsent(self, n: int) -> None:
        with self.unsent_room:
            self.unsent_bytes -= n
            self.unsent_room.notify_all()

    def finish_request(self, conn: Any, fs: Any) -> None:
        if not fs.cancelled() and fs.exception() is None and fs.result() is _DRAIN and self.alive:
            conn.drain_deadline = time.monotonic() + client_timeout()
            conn.sock.setblocking(False)
            self.draining.append(conn)
            self.poller.register(conn.sock, selectors.EVENT_WRITE, lambda _sock: self.drain(conn))
            return
        if not fs.cancelled() and fs.exception() is None and fs.result() is _DRAIN:  # stopping
            self.release_unsent(len(conn.unsent))
            conn.unsent = bytearray()
            fs = _done(False)
        super().finish_request(conn, fs)

    def drain(self, conn: DeadlineConn) -> None:
        """Write what the socket takes of a held answer; once all is written, the connection goes
        on as gunicorn's would (kept alive, the next pipelined request served, or closed)."""
        try:
            sent = conn.sock.send(conn.unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._end_drain(conn)
            self.nr_conns -= 1
            conn.close()
            return
        del conn.unsent[:sent]
        self.release_unsent(sent)
        if conn.unsent:
            return
        self._end_drain(conn)
        self.finish_request(conn, _done(conn.after_drain))

    def _end_drain(self, conn: DeadlineConn) -> None:
        self.draining.remove(conn)
        try:
            self.poller.unregister(conn.sock)
        except (OSError, KeyError, ValueError):
            pass
        self.release_unsent(len(conn.unsent))
        conn.unsent = bytearray()

    def _drop_draining(self, conn: DeadlineConn) -> None:
        self._end_drain(conn)
        self.nr_conns -= 1
        conn.close()

    def shed_oldest_unsent(self) -> None:
        """Past :data:`WRITE_BEHIND_BYTES`: close the connections holding the oldest answers
        until half of it is free (their clients had the longest to read them)."""
        shed = 0
        while self.draining and self.unsent_bytes > WRITE_BEHIND_BYTES // 2:
            self._drop_draining(self.draining[0])
            shed += 1
        if shed:
            log.warning("answers not taken by their clients filled %d MiB: closed the %d oldest "
                        "connection(s) (a client that sends requests and does not read the answers?)",
                        WRITE_BEHIND_BYTES >> 20, shed)

    def murder_pending(self) -> None:
        """Also close connections waiting for the rest of a request past its deadline, and shed
        idle ones at the connection cap (:meth:`shed_idle_at_cap`)."""
        super().murder_pending()
        now = time.monotonic()
        late = [c for c in self.pending_conns if c.started is not None and now >= c.deadline]
        for conn in late:
            self.pending_conns.remove(conn)
            conn.refuse_late()
            self._drop(conn)
        for conn in [c for c in self.draining if now >= c.drain_deadline]:
            self._drop_draining(conn)  # its client did not take its answer in time
        self.shed_idle_at_cap()

    def shed_idle_at_cap(self) -> None:
        """At the connection cap, close connections that hold a slot with no request being
        served (kept alive between requests, or not yet sent a whole request), from the longer
        of the two queues, oldest first, down to 7/8 of the cap.

        Why: connections that idle (kept alive for 75 s, or silent until the client timeout)
        could fill all ``worker_connections`` slots, and the worker stops accepting while full,
        so kube-scheduler's next connection waited past its own 5 s timeout. Closing an idle
        connection is ordinary HTTP (a client opens another); a request being served is never
        cut. Runs once per event-loop pass (at most 1 s), so a new client waits at most that."""
        if self.nr_conns < self.worker_connections:
            return
        target = self.worker_connections - max(1, self.worker_connections // 8)
        shed = 0
        while self.nr_conns > target and (self.keepalived_conns or self.pending_conns):
            queue = (self.keepalived_conns if len(self.keepalived_conns) >= len(self.pending_conns)
                     else self.pending_conns)
            conn = queue.popleft()
            conn.refuse_late()
            self._drop(conn)
            shed += 1
        if shed:
            log.warning("all %d connection slots were taken: closed %d idle connection(s), oldest first "
                        "(a client holding connections open without requests?)", self.worker_connections, shed)

    def _drop(self, conn: Any) -> None:
        """Forget and close a connection the poller watches (not one a thread serves)."""
        try:
            self.poller.unregister(conn.sock)
        except (OSError, KeyError, ValueError):
            pass
        self.nr_conns -= 1
        conn.close()


def _done(result: Any) -> Future:
    """A finished future holding ``result``, as gunicorn's ``finish_request`` takes it."""
    fs: Future = Future()
    fs.set_result(result)
    return fs


WORKER_CLASS = f"{__name__}.GuardedWorker"
# The oldest gunicorn whose gthread worker has what GuardedWorker builds on: ``pending_conns`` and
# ``murder_pending`` (26.0), ``method_queue`` (24.0). pyproject.toml asks for the same.
MIN_GUNICORN = (26, 0)


def check_gunicorn(version: tuple[int, ...] | None = None) -> None:
    """Raise RuntimeError, saying which gunicorn is installed and which is needed, when it is
    older than :data:`MIN_GUNICORN`. Why: on 22-25 the extender started and then failed inside
    its worker (an AttributeError on the first connection), far from the cause."""
    import gunicorn

    have = tuple(version if version is not None else gunicorn.version_info)
    if tuple(have[:2]) < MIN_GUNICORN:
        need = ".".join(map(str, MIN_GUNICORN))
        raise RuntimeError(f"gunicorn {'.'.join(map(str, have))} is installed; the extender's worker needs "
                           f"gunicorn>={MIN_GUNICORN[0]} ({need} or later: pip install 'gunicorn>={need}')")


# ------------------------------------------------------------------------- the big-body lane
class BigBodyLane:
    """One big body at a time across every process that shares this lane.

    An unlinked temporary file held open by the creator; each acquisition opens it anew through
    ``/proc/self/fd`` (a new open file description) and ``flock``s that, so threads and forked
    processes exclude each other alike, and nothing is left on disk."""

    def __init__(self) -> None:
        fd, path = tempfile.mkstemp(prefix="stowage-lane-")
        os.unlink(path)
        self.fd = fd

    def acquire(self, deadline: float) -> int | None:
        """An fd holding the lane (give it to :meth:`release`), or None at the deadline."""
        fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return None
                time.sleep(0.005)

    @staticmethod
    def release(fd: int | None) -> None:
        if fd is not None:
            os.close(fd)  # closing the description releases its lock


# ----------------------------------------------------------------------------- the body
@dataclass
class Refusal:
    """Why a body was not read: HTTP status, message, the metrics outcome."""

    status: int
    message: str
    outcome: str


def refusal_reply(verb: str | None, refusal: Refusal) -> Reply:
    """The answer to a request whose body was not read whole: its status (408, 400, 503) with
    ``Error`` saying why, for every verb (``Error`` is the field kube-scheduler reads in a bind
    answer too)."""
    return json_reply({"Error": refusal.message}, refusal.status, refusal.outcome)


class BodyReader:
    """Reads request bodies within the bounds above (one per app / per split-layout worker)."""

    def __init__(self, limit: int, lane: BigBodyLane | None = None) -> None:
        self.limit = limit
        self.lane = lane if lane is not None else BigBodyLane()

    def read(self, environ: dict[str, Any]) -> tuple[bytes | Refusal, int | None]:
        """``(body or refusal, lane)``: release ``lane`` (:meth:`done`) once the answer is made."""
        length = environ.get("CONTENT_LENGTH") or ""
        stream = environ["wsgi.input"]
        chunked = "HTTP_TRANSFER_ENCODING" in environ
        if not chunked and not length:
            # Neither header: the request has no body (RFC 9112 6.3; gunicorn's parser reads
            # none). Read as one of unknown length, every GET (/readyz, /metrics) took the
            # big-body lane and waited for it behind a stalled big body.
            return b"", None
        stated = whole_number(length, self.limit + 1) if not chunked else None
        known = stated is not None
        n = stated if stated is not None else -1
        if known and n > self.limit:
            return self.too_large(), None
        held = None
        if not known or n > SMALL_BODY:
            held = self.lane.acquire(time.monotonic() + client_timeout())
            if held is None:
                return Refusal(503, "the extender is busy reading another large request body; retry",
                               "busy"), None
        try:
            if known:
                body = self._read_known(stream, n)
            else:
                body = self._read_chunked(stream)
        except ClientTooSlow as exc:
            log.info("%s %s: %s", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"), exc)
            body = Refusal(408, str(exc), "timeout")
        except socket.timeout:
            body = Refusal(408, str(ClientTooSlow()), "timeout")
        except (http_errors.ParseException, http_errors.NoMoreData, ValueError) as exc:
            body = Refusal(400, f"malformed chunked request body: {type(exc).__name__}: {exc}", "bad_request")
        if isinstance(body, Refusal):
            self.done(held)
            held = None
        return body, held

    @staticmethod
    def done(held: int | None) -> None:
        BigBodyLane.release(held)

    def too_large(self) -> Refusal:
        return Refusal(413, f"request body larger than {self.limit} bytes (raise the extender's --max-body-mib)",
                       "too_large")

    @staticmethod
    def _read_known(stream: Any, n: int) -> bytes:
        if n <= READ_STEP:
            return stream.read(n) if n else b""
        parts, got = [], 0
        while got < n:
            part = stream.read(min(READ_STEP, n - got))
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def _read_chunked(self, stream: Any) -> bytes | Refusal:
        parts, got = [], 0
        while True:
            part = stream.read(READ_STEP)
            if not part:
                return b"".join(parts)
            got += len(part)
            if got > self.limit:  # stop here: the rest is never read
                return self.too_large()
            parts.append(part)
