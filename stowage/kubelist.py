"""Reading a list from kube-apiserver in pages bounded by bytes as well as by objects.

Why bytes too: a page of ``limit`` objects (client-go's 500) is bounded in memory only while
objects are small, and a pod author decides how big a pod is. kube-apiserver v1.28.7 stores a pod
of 20,000 minimal containers (etcd's 1.5 MiB request limit is the only bound) and serves it as
~3 MiB of JSON, which parses to ~25 MB of Python objects: one list page holding 40 such pods took
a component to ~1 GB (measured; the extender's limit is 1 GiB, the device plugin's 256 MiB), so
a few dozen pods made it crash on every list, for ever. Here a page's body is read in chunks and
abandoned (its connection closed, the rest never read) once it passes ``page_bytes``; the same
page (same ``continue`` token, same snapshot) is then asked for again with fewer objects, down to
one. A page of one object is bounded too, by what one object may take (:data:`OBJECT_BYTES`,
16 MiB; etcd bounds what a real API server stores): the peer need not be one (a proxy, a server
that lies), and a one-object page read whole could be gigabytes. Past it the list fails
(:class:`ObjectTooBig`), and is asked for again after a back-off like any failed list. Pages of
ordinary objects never come near either bound (500 ordinary pods are 3-8 MiB of JSON), so
nothing changes for them.

The paging itself (``continue`` tokens, a snapshot that expires, a server that loops) is here
too, once for the extender's feed and the device plugin (:func:`list_in_pages`). It imports
nothing of ours and does no I/O of its own: it calls the request it is handed and reads the
response object that returns.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from orjson import loads

# Objects per list request, as client-go's reflector and pager ask: a list's peak memory is a
# page's, whatever the size of the cluster (one unpaged list of 30,000 ordinary pods once took the
# extender's RSS up by ~2 GiB, over its 1 GiB limit; docs/kube.md).
LIST_PAGE_SIZE = 500
# JSON bytes of one list response past which it is abandoned and asked for again with fewer
# objects (a page of one object is bounded by OBJECT_BYTES instead). 16 MiB parses to at most
# ~130 MB of Python objects (measured: ~8x for container-heavy pods), well within every
# component's memory limit, and is 2-5x what 500 ordinary pods take.
LIST_PAGE_BYTES = 16 << 20
# JSON bytes one object may take: a page of one object (read up to this, or up to the page bound
# where that is larger: never less than a page of more) and one watch event (extender.kube's
# WATCH_EVENT_BYTES). What a real API server serves stays under it: etcd refuses a write past
# 1.5 MiB (its default --max-request-bytes); kube-apiserver v1.28.7 (measured) serves a pod of
# 20,000 minimal containers that fits as ~3 MiB of JSON, and one whose env value is 1.5 million
# '<' as 9.0 MiB (Go's encoding/json writes '<', '>', '&' and control characters as six bytes,
# \u003c). Past it the peer is no API server (a proxy, one that lies) and the list fails rather
# than read on: a page of one object read whole may be any size.
OBJECT_BYTES = 16 << 20
# How often one list starts again from its first page after its snapshot expired (410 Expired)
# before it fails instead (:func:`list_in_pages`).
EXPIRED_RESTARTS = 3
# Pages without an object, each with a continue token, in a row, past which a list fails
# (:class:`ListLoop`). kube-apiserver fills every page it serves (it reads on from etcd until the
# page holds ``limit`` objects or none are left, selectors or not), so an empty page with a token
# does not come from it; a peer serving them with a new token each time kept a list asking for ever.
EMPTY_PAGES = 64
# Bytes asked of the response per read while a page is bounded.
_CHUNK = 1 << 20
# A page too big asks next for this fraction of its objects; a page under 1/GROW_BELOW of the
# bound lets the next one ask for twice as many (never more than the page size).
_SHRINK = 8
_GROW_BELOW = 4


class ListLoop(RuntimeError):
    """A paged list that would never end: its pages come again (a proxy that drops ``continue``
    answers every request with the first page and a token), or a page gives back the token it
    was asked with. One consistent list has each object once; the list fails (back-off, then a
    new list) rather than go on for ever, keeping what it gathered of every page."""

    @classmethod
    def twice(cls, kind: str, key: str) -> "ListLoop":
        return cls(f"{kind} list: {key} listed twice (the API server, or a proxy before it, served a page "
                   "again: is the continue parameter passed on?); the list is abandoned")


class WrongListKind(RuntimeError):
    """A list page whose ``kind`` is not the list's (a PodList answered for nodes: a proxy that
    routes wrong, a peer that lies): the list fails before anything of the page is applied, as
    client-go refuses an object of an unexpected type."""


class ObjectTooBig(RuntimeError):
    """A page of one object passed :data:`OBJECT_BYTES` (or the page bound, if larger) before it
    was read to the end: no API server serves such an object (etcd bounds what it stores), and
    with fewer objects there is nothing left to ask for. The list fails, its response closed
    unread; the caller backs off and lists again, as after any failed list."""


class PageTooBig(Exception):
    """A list response passed its byte bound before it was read to the end."""

    def __init__(self, limit: int, read: int, bound: int) -> None:
        super().__init__(limit, read, bound)
        self.limit, self.read, self.bound = limit, read, bound

    def __str__(self) -> str:
        return f"a page of {self.limit} objects passed {byte_size(self.bound)} of JSON ({self.read} bytes read)"


def status_of(body: Any) -> dict:
    """The Status object an API error's body carries ({} when there is none, or it is not JSON:
    e.g. a proxy's error page)."""
    if body:
        try:
            doc = loads(body if isinstance(body, (bytes, bytearray)) else str(body).encode())
        except ValueError:
            return {}
        if isinstance(doc, dict):
            return doc
    return {}


def expired(body: Any) -> bool:
    """An API error's Status reason is ``Expired`` (apimachinery's ``errors.IsResourceExpired``
    reads the reason only; kube-apiserver sends it with a 410): a list's snapshot (continue
    token) or a resourceVersion that etcd compacted."""
    return status_of(body).get("reason") == "Expired"


def _digest(token: str) -> bytes:
    """16 bytes that stand for a continue token in a list's memory of those it sent."""
    return hashlib.blake2b(token.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def byte_size(n: int) -> str:
    """``n`` bytes for a log line: whole MiB from 1 MiB, else whole KiB."""
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def read_page(resp: Any, max_bytes: int) -> tuple[Any, int]:
    """The body of an unread (``_preload_content=False``) response, parsed, and its size in bytes.

    Read in chunks, and past ``max_bytes`` the response is closed (its connection is not reused:
    the rest of the body is never read) and :class:`PageTooBig` raised (``limit`` left 0 for the
    caller to fill in). Either way the connection goes back to the pool (a closed one is opened
    again on next use). No page is read whole: its peer decides how long a body is."""
    try:
        buf = bytearray()
        while True:
            chunk = resp.read(_CHUNK)
            if not chunk:
                break
            buf += chunk
            if len(buf) > max_bytes:
                resp.close()
                raise PageTooBig(0, len(buf), max_bytes)
    finally:
        resp.release_conn()
    return loads(buf), len(buf)


@dataclass
class PageSizer:
    """How many objects the next page of one list asks for, and how many bytes it may take.

    Starts at ``page_size``; a page too big asks again for an eighth (at least one), and a page
    that took under a quarter of ``page_bytes`` lets the next one ask for twice as many, up to
    ``page_size`` again: a few big objects among many small ones cost a few small pages, not a
    small page size for the rest of the list. A page of one object may take ``object_bytes``, or
    ``page_bytes`` where that is larger (one object is never refused where a page of more would
    have been read); past that, no smaller page is left to ask for (:class:`ObjectTooBig`)."""

    page_size: int = LIST_PAGE_SIZE
    page_bytes: int = LIST_PAGE_BYTES
    object_bytes: int = OBJECT_BYTES
    limit: int = field(init=False)

    def __post_init__(self) -> None:
        for name in ("page_size", "page_bytes", "object_bytes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)!r}")
        self.limit = int(self.page_size)

    def max_bytes(self) -> int:
        """The bound for the page asked for now: ``page_bytes``, or for a page of one object the
        larger of ``page_bytes`` and ``object_bytes``."""
        if self.limit <= 1:
            return max(int(self.page_bytes), int(self.object_bytes))
        return int(self.page_bytes)

    def read(self, resp: Any) -> Any:
        """:func:`read_page` of the page asked for now, adjusting the next page's size: raises
        :class:`PageTooBig` (with this page's limit) after shrinking it; a page of one object
        too big raises it with ``limit`` 1 (nothing smaller to ask for: :func:`list_in_pages`
        fails the list)."""
        try:
            doc, size = read_page(resp, self.max_bytes())
        except PageTooBig as big:
            big.limit = self.limit
            self.limit = max(1, self.limit // _SHRINK)
            raise
        if size * _GROW_BELOW < self.page_bytes:
            self.limit = min(int(self.page_size), self.limit * 2)
        return doc


def list_in_pages(call: Callable[[int, str], Any], sizer: PageSizer, what: str, kind: str,
                  apply: Callable[[list], None], restart: Callable[[], None],
                  log: logging.Logger, list_kind: str = "") -> tuple[str, int, int]:
    """List every object in pages (``call(limit, continue)`` returns one unread response), sized
    by ``sizer``, handing each page's items to ``apply`` as it arrives and dropping it. Returns
    (the first page's resourceVersion, objects, requests). ``what`` names the list in log lines
    and errors (``"pods list"``), ``kind`` its objects (``"pods"``).

    - A page past ``sizer.page_bytes`` is abandoned unread and asked for again from the same
      ``continue`` token (the same snapshot) with fewer objects (:class:`PageSizer`). A page of
      one object past its bound (:data:`OBJECT_BYTES`) is abandoned unread and fails the list
      (:class:`ObjectTooBig`): no real API server serves it, and asked again it comes again.
    - A continued page answered with the Status reason ``Expired`` (the snapshot was compacted):
      ``restart`` is called (forget what the pages so far gathered) and the list starts again
      from its first page, in pages (client-go's pager lists everything in one request there:
      the whole cluster's size, the memory the pages bound); after :data:`EXPIRED_RESTARTS` in a
      row it fails. Any other error, an Expired first page included, propagates.
    - With ``list_kind`` (``"PodList"``): a page of another ``kind`` fails the list before any
      of it is applied (:class:`WrongListKind`); a page without one is taken as the list's.
    - A page that gives back a ``continue`` token this list asked with already (the very one it
      was sent, or one of a round: A, B, A) fails the list (:class:`ListLoop`): asked again, it
      would answer again. So do :data:`EMPTY_PAGES` pages in a row without an object, each with
      a token. (Pages that come again *with* objects, under new tokens, are the caller's to
      catch: an object listed twice.) Before, only the very token sent was caught: empty pages
      whose tokens went round kept the list asking for ever, the feed's watch never re-opened.
      Of each token sent only a 16-byte digest is kept (a peer decides how long a token is).
    """
    rv, count, cont, requests, restarts = "", 0, "", 0, 0
    sent_tokens: set[bytes] = set()   # digests of the continue tokens this list asked with
    empty_run = 0                     # pages in a row without an object
    while True:
        requests += 1
        try:
            doc = sizer.read(call(sizer.limit, cont))
        except PageTooBig as big:
            if big.limit <= 1:
                raise ObjectTooBig(f"{what}: a page of 1 object passed {byte_size(big.bound)} of JSON, the bound of "
                                   f"one object (etcd bounds what an API server stores; is a proxy or another peer "
                                   f"answering?), after {count} {kind} in {requests} requests; the list is "
                                   f"abandoned unread") from None
            log.warning("%s: a page of %d objects passed %s of JSON before it was read to the end; asking for %d "
                        "from the same point instead (big objects: e.g. pods of very many containers)", what,
                        big.limit, byte_size(big.bound), sizer.limit)
            continue
        except Exception as exc:
            body = getattr(exc, "body", None)
            if not cont or not expired(body):
                raise
            restarts += 1
            if restarts > EXPIRED_RESTARTS:
                raise
            log.warning("%s: the API server no longer holds the list's snapshot after %d objects in %d requests "
                        "(%s, HTTP %s); listing all %s again from the first page", what, count, requests - 1,
                        status_of(body).get("message") or "Expired", getattr(exc, "status", "?"), kind)
            restart()
            cont, count, empty_run = "", 0, 0
            sent_tokens.clear()
            continue
        if list_kind and isinstance(doc, dict) and doc.get("kind", list_kind) != list_kind:
            raise WrongListKind(f"{what}: a page of kind {str(doc.get('kind'))[:64]!r} came, not {list_kind}, after "
                                f"{count} {kind} in {requests} requests; the list is abandoned")
        lmeta = doc.get("metadata") or {}
        items = doc.get("items") or []
        del doc
        if not cont:
            rv = str(lmeta.get("resourceVersion") or "")
        apply(items)
        count += len(items)
        empty_run = empty_run + 1 if not items else 0
        del items
        sent, cont = cont, str(lmeta.get("continue") or "")
        if not cont:
            return rv, count, requests
        if sent:
            sent_tokens.add(_digest(sent))
        if _digest(cont) in sent_tokens:
            which = "the very continue token it was sent" if cont == sent else "a continue token it was sent before"
            raise ListLoop(f"{what}: the API server answered a page with {which}, after {count} objects in "
                           f"{requests} requests; the list is abandoned")
        if empty_run >= EMPTY_PAGES:
            raise ListLoop(f"{what}: {empty_run} empty pages in a row, each with a continue token (kube-apiserver "
                           f"fills its pages), after {count} objects in {requests} requests; the list is abandoned")
