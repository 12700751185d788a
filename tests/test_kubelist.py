"""stowage.kubelist: a list page read in chunks and abandoned past its byte bound, and the size
of the next page (fewer objects after a page too big, more again after small ones)."""
from __future__ import annotations

import io
import json
import logging

import pytest

from stowage.kubelist import (EMPTY_PAGES, OBJECT_BYTES, ListLoop, PageSizer, PageTooBig, byte_size, list_in_pages,
                              read_page)


class Resp:
    """An unread response: ``read(amt)``, ``close()``, ``release_conn()``, as urllib3's."""

    def __init__(self, doc: object) -> None:
        self.data = json.dumps(doc).encode()
        self.body = io.BytesIO(self.data)
        self.reads = 0
        self.closed = self.released = False

    def read(self, amt: int) -> bytes:
        self.reads += 1
        return self.body.read(amt)

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        self.released = True


def page(n: int, each: int) -> dict:
    return {"metadata": {}, "items": [{"blob": "x" * each} for _ in range(n)]}


def test_a_page_within_its_bound_is_read_and_parsed():
    r = Resp(page(3, 100))
    doc, size = read_page(r, 10_000)
    assert len(doc["items"]) == 3 and size == len(r.data)
    assert r.released and not r.closed


def test_a_page_past_its_bound_is_closed_unread_and_its_connection_released():
    r = Resp(page(8, 1 << 20))                     # ~8 MiB, read in 1 MiB chunks
    with pytest.raises(PageTooBig) as exc:
        read_page(r, 2 << 20)
    assert r.closed and r.released
    assert exc.value.read <= 3 << 20 and r.reads <= 3   # stopped at the bound, not read to the end
    assert r.body.tell() < len(r.data)


def test_a_page_of_one_object_is_bounded_by_the_bound_of_one_object_or_the_page_bound_if_larger():
    """A page of one object is read past the page bound (etcd bounds one object; asked again, it
    would come again), but no further than one object may take: a peer that is no API server
    decides how long a body is."""
    assert OBJECT_BYTES == 16 << 20
    s = PageSizer(1, 1 << 20, object_bytes=2 << 20)
    assert s.max_bytes() == 2 << 20
    s.read(Resp(page(1, (2 << 20) - 100)))          # big and alone, within one object's bound: read
    r = Resp(page(1, 64 << 20))
    with pytest.raises(PageTooBig) as exc:
        s.read(r)
    assert exc.value.limit == 1 and exc.value.bound == 2 << 20 and s.limit == 1
    assert r.closed and r.released and r.reads <= 3 and exc.value.read <= 3 << 20   # not read on
    assert PageSizer(1, 8 << 20, object_bytes=2 << 20).max_bytes() == 8 << 20      # never below a page's
    assert PageSizer(2, 1 << 20, object_bytes=2 << 20).max_bytes() == 1 << 20


def test_the_sizer_shrinks_by_eight_to_one_and_grows_back_by_two_to_the_page_size():
    s = PageSizer(500, 1 << 20)
    limits = [s.limit]
    for _ in range(3):                              # pages too big, one after another
        with pytest.raises(PageTooBig) as exc:
            s.read(Resp(page(2, 1 << 20)))
        assert exc.value.limit == limits[-1]
        limits.append(s.limit)
    assert limits == [500, 62, 7, 1]
    assert s.max_bytes() == OBJECT_BYTES            # one object: read up to one object's bound
    s.read(Resp(page(1, 3 << 20)))                  # big and alone: read, no growth
    assert s.limit == 1
    grown = []
    for _ in range(12):                             # small pages: x2 each, up to 500
        s.read(Resp(page(1, 10)))
        grown.append(s.limit)
    assert grown[:4] == [2, 4, 8, 16] and grown[-1] == 500 and max(grown) == 500


@pytest.mark.parametrize("size,bound,one", [(0, 1, 1), (1, 0, 1), (-1, 5, 1), (1, 1, 0)])
def test_a_sizer_needs_one_object_and_one_byte_at_least(size, bound, one):
    with pytest.raises(ValueError, match="at least 1"):
        PageSizer(size, bound, one)


def test_byte_sizes_read_well_in_logs():
    assert byte_size(16 << 20) == "16 MiB" and byte_size(40 << 10) == "40 KiB"


class Unending(Exception):
    """The list under test asked for more pages than any bounded list would."""


def pages_from(pages: dict[str, dict], most: int = 500):
    """A ``call(limit, continue)`` serving ``pages[continue]``, and the continue tokens asked for."""
    asked: list[str] = []

    def call(limit: int, cont: str) -> Resp:
        asked.append(cont)
        if len(asked) > most:
            raise Unending(f"still listing after {most} requests: {asked[-4:]}")
        return Resp(pages[cont])
    return call, asked


def empty_page(cont: str) -> dict:
    return {"metadata": {"resourceVersion": "7", "continue": cont}, "items": []}


@pytest.mark.parametrize("cycle", [["A", "B"], ["A", "B", "C"]], ids=["two-tokens", "three-tokens"])
def test_a_list_whose_continue_tokens_come_round_again_fails_instead_of_listing_for_ever(cycle):
    """Found by experiment: a peer answering empty pages whose continue tokens go round (A, B, A,
    ...; a proxy or a server that is not kube-apiserver) kept the list asking for ever: the loop
    check caught only a page giving back the very token it was sent, and "listed twice" only
    pages with objects. The feed's thread stayed in that list (its watch never re-opened, the
    model frozen) until /readyz's silence rule, 12 minutes later. Now a continue token asked for
    once already in the list fails it (ListLoop: back-off, then a new list), after one round."""
    pages = {"": empty_page(cycle[0])}
    for token, nxt in zip(cycle, cycle[1:] + cycle[:1]):
        pages[token] = empty_page(nxt)
    call, asked = pages_from(pages)
    with pytest.raises(ListLoop, match="continue token"):
        list_in_pages(call, PageSizer(), "pods list", "pods", lambda items: None, lambda: None, logging.getLogger())
    assert asked == ["", *cycle]


def test_a_list_of_empty_pages_that_never_ends_fails():
    """Empty pages with a new continue token each time (kube-apiserver fills every page it can:
    an empty page with a token never comes from it) kept the list asking for ever too. Now
    EMPTY_PAGES in a row fail the list."""
    call, asked = pages_from(_Endless())
    with pytest.raises(ListLoop, match="empty"):
        list_in_pages(call, PageSizer(), "pods list", "pods", lambda items: None, lambda: None, logging.getLogger())
    assert len(asked) == EMPTY_PAGES


def test_empty_pages_between_pages_of_objects_do_not_fail_the_list():
    """One empty page fewer than EMPTY_PAGES in a row, then objects: the list completes."""
    pages = {"": empty_page("t0")}
    for i in range(EMPTY_PAGES - 2):
        pages[f"t{i}"] = empty_page(f"t{i + 1}")
    pages[f"t{EMPTY_PAGES - 2}"] = {"metadata": {"continue": "last"}, "items": [{"a": 1}]}
    pages["last"] = {"metadata": {}, "items": [{"b": 2}]}
    got: list = []
    call, _ = pages_from(pages)
    rv, count, requests = list_in_pages(call, PageSizer(), "pods list", "pods", got.extend, lambda: None,
                                        logging.getLogger())
    assert (rv, count, requests) == ("7", 2, EMPTY_PAGES + 1) and got == [{"a": 1}, {"b": 2}]


class _Endless(dict):
    """Every continue token's page: empty, with a token never sent before."""

    def __getitem__(self, cont: str) -> dict:
        return empty_page(f"t{int(cont[1:] or 0) + 1}")
