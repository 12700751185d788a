"""Issue 12, item 1: records that anything honours can only come from the extender, for that pod."""
from __future__ import annotations

import pytest

from stowage.allocation import (ALLOCATION_ANNOTATION, AllocationError, AllocationRecord, CardShare, RecordKey,
                                RecordTrust, allocation_of_pod, decode_allocation, encode_allocation)

KEY = RecordKey(b"k" * 32)
WHOLE2 = AllocationRecord("n1", (CardShare(0, "GPU-0", 81920, 1000), CardShare(1, "GPU-1", 81920, 1000)), True)
SHARE = AllocationRecord("n1", (CardShare(2, "GPU-2", 10240, 300),), False)


def pod(uid="u1", limits=None, value=None, node="n1", scheduler="stowage-scheduler"):
    return {"metadata": {"name": "p", "namespace": "ns", "uid": uid,
                         "annotations": {ALLOCATION_ANNOTATION: value} if value else {}},
            "spec": {"schedulerName": scheduler, "nodeName": node,
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"} if limits is None else limits}}]}}


def test_signed_record_round_trips_and_is_bound_to_its_pod():
    value = encode_allocation(WHOLE2, KEY, "u1")
    rec = allocation_of_pod(pod(value=value), KEY)
    assert rec.cards == WHOLE2.cards and rec.sig
    with pytest.raises(AllocationError, match="does not match this pod"):
        allocation_of_pod(pod(uid="u2", value=value), KEY)        # copied onto another pod
    with pytest.raises(AllocationError, match="does not match"):
        allocation_of_pod(pod(value=value.replace('"index":1', '"index":3')), KEY)   # altered
    with pytest.raises(AllocationError, match="does not match"):
        allocation_of_pod(pod(value=value), RecordKey(b"x" * 32))  # signed with another key


def test_unsigned_record_is_refused_where_records_are_signed_and_read_where_not():
    value = encode_allocation(WHOLE2)
    assert '"sig"' not in value and decode_allocation(value).sig == ""
    assert allocation_of_pod(pod(value=value)).cards == WHOLE2.cards
    with pytest.raises(AllocationError, match="not signed"):
        allocation_of_pod(pod(value=value), KEY)


def test_short_key_file_is_refused(tmp_path):
    f = tmp_path / "key"
    f.write_text("short\n")
    with pytest.raises(AllocationError, match="at least 32 are needed"):
        RecordKey.load(f)
    f.write_text("a" * 64 + "\n")
    assert RecordKey.load(f).secret == b"a" * 64
    with pytest.raises(AllocationError, match="cannot read"):
        RecordKey.load(tmp_path / "missing")


@pytest.mark.parametrize("limits,rec,ok", [
    ({"nvidia.com/gpu": "2"}, WHOLE2, True),
    ({"nvidia.com/gpu": "1"}, WHOLE2, False),                                  # 2 cards for a 1-GPU pod
    ({}, WHOLE2, False),                                                       # a pod asking for no GPU
    ({"nvidia.com/gpu-memory": "10", "nvidia.com/gpu-core": "30"}, SHARE, True),
    ({"nvidia.com/gpu-memory": "10"}, SHARE, False),                           # more compute than asked
    ({"nvidia.com/gpu-memory": "20", "nvidia.com/gpu-core": "30"}, SHARE, False),
    ({"nvidia.com/gpu-memory": "10", "nvidia.com/gpu-core": "30"}, WHOLE2, False),
])
def test_record_must_book_exactly_what_the_pod_asks(limits, rec, ok):
    trust = RecordTrust(KEY)
    p = pod(limits=limits, value=trust.encode(rec, "u1"))
    if ok:
        assert trust.record_of(p).cards == rec.cards
    else:
        with pytest.raises(AllocationError, match="not honoured"):
            trust.record_of(p)


def test_record_of_another_scheduler_or_node_is_not_honoured():
    trust = RecordTrust(scheduler_names=frozenset({"stowage-scheduler"}))
    value = encode_allocation(WHOLE2)
    assert trust.record_of(pod(value=value)) is not None
    with pytest.raises(AllocationError, match="scheduler 'default-scheduler'"):
        trust.record_of(pod(value=value, scheduler=None))
    with pytest.raises(AllocationError, match="bound to 'n2'"):
        trust.record_of(pod(value=value, node="n2"))
    assert trust.record_of(pod(value=value, node=None)) is not None   # not bound yet: the node is not checked


VALID = encode_allocation(SHARE)
HOSTILE_RECORDS = {
    "float overflow": VALID.replace('"index":2', '"index":1e999'),
    "Infinity": VALID.replace('"index":2', '"index":Infinity'),
    "NaN memory": VALID.replace('"memoryMiB":10240', '"memoryMiB":NaN'),
    "deep nesting": "[" * 100_000,
    "deep nesting in a card": VALID.replace('"uuid":"GPU-2"', '"uuid":' + "[" * 50_000),
    "index as text": VALID.replace('"index":2', '"index":"2"'),
    "index as bool": VALID.replace('"index":2', '"index":true'),
    "index as float": VALID.replace('"index":2', '"index":2.0'),
    "index huge": VALID.replace('"index":2', '"index":' + "9" * 300),
    "index negative": VALID.replace('"index":2', '"index":-1'),
    "memory beyond any card": VALID.replace('"memoryMiB":10240', f'"memoryMiB":{1 << 40}'),
    "core beyond a card": VALID.replace('"coreMilli":300', '"coreMilli":5000'),
    "uuid not text": VALID.replace('"uuid":"GPU-2"', '"uuid":{"a":1}'),
    "node not text": VALID.replace('"node":"n1"', '"node":["n1"]'),
    "whole not bool": VALID.replace('"whole":false', '"whole":"no"'),
    "cards not a list": VALID.replace('"cards":[', '"cards":{"x":[').replace("}]", "}]}"),
    "too many cards": VALID.replace('"cards":[', '"cards":[' + ",".join(
        '{"coreMilli":0,"index":%d,"memoryMiB":1,"uuid":"g"}' % i for i in range(70)) + ","),
    "card not an object": VALID.replace('"cards":[', '"cards":[7,'),
    "not an object": "[1,2]",
    "null": "null",
    "number": "3",
    "not JSON": "{",
    "empty": " ",
}


@pytest.mark.parametrize("value", HOSTILE_RECORDS.values(), ids=HOSTILE_RECORDS.keys())
def test_a_hostile_record_is_an_allocation_error_and_nothing_else(value):
    """Any pod author can write the annotation: whatever it holds, reading it raises
    AllocationError (that pod's problem) and never another exception (OverflowError from
    ``int(inf)``, RecursionError from deep nesting), which the device plugin's and the extender's
    callers would not expect and which blocked every other pod of the node."""
    with pytest.raises(AllocationError, match=ALLOCATION_ANNOTATION):
        decode_allocation(value)
    with pytest.raises(AllocationError):
        allocation_of_pod(pod(value=value), KEY)


def test_random_mutations_of_a_record_read_back_or_are_allocation_errors():
    import random
    rng = random.Random(7)
    pieces = ["1e999", "-1", "NaN", "[", "]", "{", "}", '""', "true", "null", "0.5", "9" * 40, ",", ":"]
    for _ in range(3000):
        text = list(VALID)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(text))
            if rng.random() < 0.5:
                text[at:at + rng.randint(1, 6)] = list(rng.choice(pieces))
            else:
                del text[at]
        try:
            rec = decode_allocation("".join(text))
        except AllocationError:
            continue
        assert all(isinstance(c.index, int) and 0 <= c.index and 0 <= c.core_milli <= 1000 for c in rec.cards)
        assert decode_allocation(encode_allocation(rec)) == rec
