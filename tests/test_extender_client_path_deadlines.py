"""The ``kubernetes`` client's requests that a bind or a requeue makes are bounded whole, not per
socket read: the Binding where the fast path does not apply (``KubeBinder(direct=False)``: a
proxy, a TLS server name), the pod's read-back after a failed Binding (on either path), and the
requeuer's PATCH. Found by experiment: a peer answering a byte every 0.2 s (each read within the
client's timeout) held each of them for as long as it liked, as it once held the fast path
(tests/test_extender_kube_post_answers.py)."""
from __future__ import annotations

import itertools
import socket
import threading
import time
from typing import Callable

import kubernetes.client
import pytest

from extender.errors import BindError
from extender.kube_binder import MERGE_PATCH, KubeBinder
from extender.kube_post import Deadlines
from extender.requeue import Requeuer


class DrippingPeer:
    """An HTTP peer on localhost that answers every request (on any number of connections) a byte
    every ``every_s`` seconds, for as long as the client reads: a status line that never ends."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s = every_s
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.accepted: list[socket.socket] = []
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            for i in itertools.count():
                if self.stopped.is_set():
                    return
                conn.sendall(b"HTTP/1.1 200 OK"[i:i + 1] or b"X")
                time.sleep(self.every_s)
        except OSError:
            pass

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()
        for c in self.accepted:
            c.close()


@pytest.fixture
def peer():
    p = DrippingPeer()
    yield p
    p.close()


def api_client(url: str) -> kubernetes.client.ApiClient:
    cfg = kubernetes.client.Configuration()
    cfg.host = url
    return kubernetes.client.ApiClient(cfg)


def outcome_within(call: Callable[[], object], limit_s: float) -> tuple[list, float]:
    """Run ``call`` on a thread; (what it returned or raised, seconds) once it ended, or an empty
    list if it still runs after ``limit_s``."""
    out: list = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # noqa: BLE001 - what it raised is the outcome
            out.append(exc)

    started = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit_s)
    return out, time.monotonic() - started


def test_the_clients_binding_and_read_back_end_at_their_timeouts(peer):
    binder = KubeBinder(api_client(peer.url), request_timeout_s=1.0, readback_attempts=2, readback_delay_s=0.0,
                        direct=False)
    out, took = outcome_within(lambda: binder.bind("default", "p", "uid-1", "n1", None), 15)
    assert out, "the bind was still running 15 s after its 1 s requests began"
    assert isinstance(out[0], BindError)   # the outcome is unknown: nothing could be read back
    assert took < 6   # one Binding and two read-backs of 1 s each, with slack for a busy machine


def test_the_fast_paths_read_back_ends_at_its_timeout(peer):
    binder = KubeBinder(api_client(peer.url), request_timeout_s=1.0, readback_attempts=2, readback_delay_s=0.0)
    assert binder.poster is not None
    out, took = outcome_within(lambda: binder.bind("default", "p", "uid-1", "n1", None), 15)
    assert out, "the bind was still running 15 s after its 1 s requests began"
    assert isinstance(out[0], BindError)
    assert took < 6


def test_the_requeuers_patch_ends_at_its_timeout(peer):
    core = kubernetes.client.CoreV1Api(api_client(peer.url))
    KubeBinder(core.api_client, direct=False)   # (the extender's binder and requeuer share one client)
    requeuer = Requeuer(lambda ns, name, body: core.patch_namespaced_pod(
        name, ns, body, _content_type=MERGE_PATCH, _request_timeout=1.0), lambda key: "uid-1", patch_timeout_s=1.0)
    requeuer.refused("uid-1", "default", "p", generation=1)
    requeuer.cards_freed(2)
    out, took = outcome_within(requeuer.requeue_now, 15)
    assert out == [0], "the PATCH was still running 15 s after its 1 s timeout, or it did not fail"
    assert took < 4


def test_a_deadline_that_comes_while_connecting_shuts_the_socket_once_connected():
    """A request whose deadline passes during its connect (its socket not made yet) is shut as
    soon as the socket exists; before, the deadline found no socket, and the request then went on
    unbounded on the socket the connect made."""
    class Connecting:
        sock = None

    conn = Connecting()
    deadlines = Deadlines()
    entry = deadlines.arm(conn, time.monotonic())
    time.sleep(0.2)   # the deadline has passed while "connecting"
    ours, theirs = socket.socketpair()
    try:
        conn.sock = ours
        ours.settimeout(5)
        started = time.monotonic()
        assert ours.recv(1) == b""   # shut: the read ends at once instead of waiting for the peer
        assert time.monotonic() - started < 2
        assert deadlines.disarm(entry)
    finally:
        ours.close()
        theirs.close()
