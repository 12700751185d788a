"""Skip decoding a ``NodeNames`` array the extender has already decoded: recognise its bytes.

Why: with ``nodeCacheCapable: true`` every filter carries the names of ALL nodes (about 75 KB
at 5,000 nodes) and every prioritize the names the filter just passed. Decoding them makes
5,000 new Python strings per request — the largest single cost of reading a request, paid
again for a list that is byte for byte the one before. kube-scheduler encodes
``ExtenderArgs`` with Go's ``encoding/json`` in field order (``Pod``, ``Nodes``,
``NodeNames``), so the array is the body's last member. :class:`NodeNamesMemo` keeps the last
few arrays' bytes with their decoded lists; a request whose array is one of them has only the
rest of its body decoded (the pod: a few KB), and gets the SAME list object back, which also
makes the service's own names->rows memo (:class:`extender.service.NamesMemo`) a comparison of
identical objects.

Correctness does not depend on kube-scheduler's formatting: an array is used only when its
bytes are exactly those of an array that was decoded before (or that we encoded ourselves,
see :meth:`NodeNamesMemo.remember`), it is the top-level object's last member, and the rest
of the body decodes to an object whose ``NodeNames`` is that member. Anything else — a
different layout, a pretty-printed body, a key that only looks like ``"NodeNames"`` inside a
string, invalid JSON — takes the ordinary path (:func:`extender.wire.parse_extender_args`),
which also produces every error message.
"""
from __future__ import annotations

import re
import threading

import orjson

from .wire import ExtenderArgs, WireError, decode_body, parse_extender_args

MIN_NAMES = 64          # shorter lists decode faster than they are looked up and kept
MIN_BODY_BYTES = 2048   # bodies below this are decoded as they are
# Lists beyond these are not kept (anyone reaching the port can send made-up names; kube-scheduler's
# list of 10,000 nodes is ~150 KB): what the memo holds stays bounded in bytes.
MAX_NAMES = 50_000
MAX_ARRAY_BYTES = 4 << 20
_WS = b" \t\r\n"
# The key, then ':' and the array's opening bracket (whitespace allowed as JSON allows).
_KEY = re.compile(rb'"NodeNames"[ \t\r\n]*:[ \t\r\n]*\[')


def names_span(body: bytes) -> tuple[int, int, int] | None:
    """``(key_start, array_start, array_end)`` when ``body`` ends with a top-level-looking
    ``"NodeNames": [...]`` member (``body[array_start:array_end]`` is ``[...]``), else None.

    Only the layout is checked here (the key is the last ``"NodeNames"`` in the body, preceded
    by ``{`` or ``,``, and after the array's last ``]`` comes the object's closing ``}``);
    whether it really is the top-level member is settled by :meth:`NodeNamesMemo.parse`.
    """
    k = body.rfind(b'"NodeNames"')
    if k <= 0:
        return None
    before = body[max(0, k - 64):k].rstrip(_WS)
    if not before or before[-1:] not in (b",", b"{"):
        return None  # e.g. an escaped quote inside a string: ...\"NodeNames"
    m = _KEY.match(body, k)
    if m is None:
        return None
    start = m.end() - 1
    end = body.rfind(b"]")
    if end < start or body[end + 1:].strip(_WS) != b"}":
        return None
    return k, start, end + 1


class NodeNamesMemo:
    """The last few ``NodeNames`` arrays, as (exact bytes, decoded list). Thread-safe.

    Lists handed out are shared between requests: callers must not modify them (the service
    never does; :class:`~extender.wire.ExtenderArgs` copies ``names`` anyway).
    """

    def __init__(self, size: int = 8) -> None:
        if size < 1:
            raise ValueError("the NodeNames memo needs room for at least one list")
        self.size = size
        self._entries: list[tuple[bytes, list[str]]] = []  # newest first
        self._lock = threading.Lock()
        self.hits = 0   # for tests and the benchmark's curiosity
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _find(self, array: bytes) -> list[str] | None:
        n = len(array)
        with self._lock:
            for j, (b, names) in enumerate(self._entries):
                if len(b) == n and b == array:
                    if j:
                        self._entries.insert(0, self._entries.pop(j))
                    return names
        return None

    def remember(self, array: bytes, names: list[str]) -> None:
        """Keep ``array`` (JSON bytes of an array) as decoding to ``names``.

        The caller vouches that ``orjson.loads(array) == names``: the service remembers the
        filter's passing list as encoded in its answer, which is what kube-scheduler sends to
        prioritize next (Go's compact encoding of DNS names is byte-identical to orjson's)."""
        if len(names) < MIN_NAMES or len(names) > MAX_NAMES or len(array) > MAX_ARRAY_BYTES:
            return
        with self._lock:
            for j, (b, _) in enumerate(self._entries):
                if b == array:
                    del self._entries[j]
                    break
            self._entries.insert(0, (array, names))
            del self._entries[self.size:]

    def parse(self, body: bytes) -> ExtenderArgs:
        """:func:`~extender.wire.parse_extender_args` of ``body``, decoding a remembered
        ``NodeNames`` array's bytes no more."""
        span = names_span(body) if isinstance(body, bytes) and len(body) >= MIN_BODY_BYTES else None
        if span is not None:
            k, start, end = span
            array = body[start:end]
            names = self._find(array)
            if names is not None:
                try:
                    doc = decode_body(body[:k] + b'"NodeNames":null' + body[end:])
                except WireError:
                    doc = None  # let the ordinary path report it
                # The member we cut out must be the top-level NodeNames (exact spelling wins
                # in Go's decoding, so no other key can stand in for it).
                if doc is not None and "NodeNames" in doc and doc["NodeNames"] is None:
                    args = parse_extender_args(doc)  # the pod and Nodes, checked as always
                    self.hits += 1
                    if args.nodes is None:  # names only (nodeCacheCapable): checked when kept
                        return ExtenderArgs(pod=args.pod, node_names=names, nodes=None, names=list(names))
                    doc["NodeNames"] = names
                    return parse_extender_args(doc)
        args = parse_extender_args(body)
        self.misses += 1
        if span is not None and args.node_names is not None and len(args.node_names) >= MIN_NAMES:
            array = body[span[1]:span[2]]
            # The span really is that member when the names encode to its very bytes (then it
            # decodes to them): a quarter of the cost of decoding it again, and on every filter
            # from a real kube-scheduler, whose lists come in a new order each time (its filter
            # runs in parallel), so they are remembered but seldom found. An array spelled
            # otherwise (escapes, spaces) is just not remembered.
            if orjson.dumps(args.node_names) == array:
                self.remember(array, args.node_names)
        return args
