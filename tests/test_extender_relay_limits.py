"""The split layout's relay frames an answer's length in 32 bits: an answer it cannot frame
becomes a 500 for that request, and the relay's one reading thread keeps serving (review: the
``struct.error`` escaped on that thread and every later request waited for an answer that
never came). The answer is a stub that only reports a 4 GiB length: nothing that big is made."""
from __future__ import annotations

import os
import socket
import tempfile

import orjson

from extender.relay import OPS, RelayClient, RelayServer
from extender.verbs import Reply


class ReportsFourGiB(bytes):
    def __len__(self) -> int:
        return 1 << 32


class StubVerbs:
    names_memo = None

    def handle(self, verb, body):
        return Reply(200, ReportsFourGiB(b"x")) if body == b"huge" else Reply(200, b'{"ok":1}')


def test_an_answer_too_big_to_frame_is_a_500_and_the_relay_keeps_serving():
    d = tempfile.mkdtemp()
    path = os.path.join(d, "relay.sock")
    ls = socket.socket(socket.AF_UNIX)
    ls.bind(path)
    ls.listen(16)
    srv = RelayServer(ls, StubVerbs(), other=lambda m, p, b: Reply(200, b"{}"))
    thread = srv.start()
    try:
        c1, c2 = RelayClient(path, timeout=5), RelayClient(path, timeout=5)
        big = c1.call(OPS["filter"], b"huge")
        assert big.status == 500 and "too large" in orjson.loads(big.body)["Error"]
        assert thread.is_alive()
        assert c2.call(OPS["filter"], b"small").body == b'{"ok":1}'
        assert c1.call(OPS["filter"], b"small").body == b'{"ok":1}'
    finally:
        srv.stop()
