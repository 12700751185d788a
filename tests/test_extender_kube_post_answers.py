"""The Binding's fast path (extender/kube_post.py) against a peer that answers in a hostile way: a
byte at a time (each within the socket's timeout), or a body far past any Status. Found by
experiment: the first held the bind for as long as the peer liked (the socket timeout is per
read), the second was read whole into memory. Now the whole request gets its timeout and the
body is read up to MAX_ANSWER_BYTES."""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable

import pytest
from kubernetes.client.exceptions import ApiException

from extender.kube_post import MAX_ANSWER_BYTES, DirectPoster


class _Config:
    def auth_settings(self) -> dict:
        return {}


def serving(answer: Callable[[socket.socket], None]):
    """A one-connection HTTP peer on localhost that reads the request and runs ``answer``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted: list[socket.socket] = []

    def run() -> None:
        conn, _ = listener.accept()
        accepted.append(conn)
        conn.recv(65536)
        try:
            answer(conn)
        except OSError:
            pass

    threading.Thread(target=run, daemon=True).start()
    return listener, accepted


def poster_for(listener: socket.socket) -> DirectPoster:
    return DirectPoster(_Config(), "127.0.0.1", listener.getsockname()[1], False, "", None, "test")


def dripping(status_line: bytes) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.sendall(status_line + b"Content-Length: 100000\r\n\r\n")
        for _ in range(100000):
            conn.sendall(b"x")
            time.sleep(0.2)
    return answer


def headers_dripping(conn: socket.socket) -> None:
    conn.sendall(b"HTTP/1.1 504 Gateway Timeout\r\n")
    for i in range(100000):
        conn.sendall(b"X-%d: y\r\n" % i)
        time.sleep(0.2)


@pytest.mark.parametrize("answer", [dripping(b"HTTP/1.1 504 Gateway Timeout\r\n"), headers_dripping],
                         ids=["body", "headers"])
def test_an_answer_sent_a_byte_at_a_time_ends_at_the_requests_timeout(answer):
    listener, accepted = serving(answer)
    poster = poster_for(listener)
    outcome: list[BaseException | bytes] = []

    def post() -> None:
        try:
            outcome.append(poster.post("/binding", b"{}", 1.0))
        except BaseException as exc:  # noqa: BLE001 - what it raised is the outcome
            outcome.append(exc)

    started = time.monotonic()
    t = threading.Thread(target=post, daemon=True)
    t.start()
    t.join(10)
    try:
        assert outcome, "the request was still running 10 s after its 1 s timeout"
        assert time.monotonic() - started < 5
        got = outcome[0]
        # Before the status line ends: a lost answer (the binder reads the pod back). After it:
        # the status, which is all a Binding's answer tells.
        assert isinstance(got, TimeoutError) or (isinstance(got, ApiException) and got.status == 504)
        assert getattr(poster._local, "conn", None) is None   # that connection is not used again
    finally:
        for c in accepted:
            c.close()
        listener.close()


def test_a_huge_answer_is_read_only_up_to_its_bound():
    size = 64 * MAX_ANSWER_BYTES

    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n" % size)
        chunk = b"x" * (1 << 20)
        for _ in range(size // len(chunk)):
            conn.sendall(chunk)

    listener, accepted = serving(answer)
    poster = poster_for(listener)
    try:
        with pytest.raises(ApiException) as err:
            poster.post("/binding", b"{}", 5.0)
        assert err.value.status == 500
        assert len(err.value.body) == MAX_ANSWER_BYTES
        assert getattr(poster._local, "conn", None) is None   # the rest was left unread: not reused
    finally:
        for c in accepted:
            c.close()
        listener.close()
