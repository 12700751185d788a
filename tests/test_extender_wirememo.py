"""NodeNamesMemo: a NodeNames array decoded before is recognised by its bytes, and the answer
is always exactly what the ordinary parser gives (extender/wirememo.py)."""
from __future__ import annotations

import json
import random

import orjson
import pytest

from packing.model import ClusterModel
from extender.service import ExtenderService
from extender.wire import (ExtenderArgs, FilterResult, WireError, encode, encode_filter_result, filter_answer,
                           parse_extender_args)
from extender.wirememo import MIN_NAMES, NodeNamesMemo, names_span
from extender_harness import Server, gpus, model_from

NAMES = [f"gpu-node-{i:04d}" for i in range(300)]


def body(pod: dict, names, *, pretty: bool = False, nodes=None, extra: bytes = b"") -> bytes:
    """An ExtenderArgs body in kube-scheduler's field order (Go encodes struct fields in order)."""
    doc = {"Pod": pod, "Nodes": nodes, "NodeNames": names}
    raw = json.dumps(doc, indent=1).encode() if pretty else orjson.dumps(doc)
    if extra:  # splice raw bytes in before the closing brace
        raw = raw[:raw.rfind(b"}")] + extra + b"}"
    return raw


def same(a: ExtenderArgs, b: ExtenderArgs) -> bool:
    return (a.pod, a.node_names, a.nodes, a.names) == (b.pod, b.node_names, b.nodes, b.names)


@pytest.fixture()
def pod(wire):
    return wire("node-cache", "01-filter")["Pod"]


def test_second_request_with_the_same_array_is_a_hit_and_equal(pod):
    memo = NodeNamesMemo()
    b = body(pod, NAMES)
    first = memo.parse(b)
    assert (memo.hits, memo.misses) == (0, 1)
    other_pod = dict(pod, metadata=dict(pod["metadata"], name="other", uid="u-2"))
    b2 = body(other_pod, NAMES)
    second = memo.parse(b2)
    assert (memo.hits, memo.misses) == (1, 1)
    assert same(second, parse_extender_args(b2))
    # the very same decoded list is handed out again (the service's memo then compares identical objects)
    assert second.node_names is first.node_names
    assert second.names == NAMES and second.names is not second.node_names  # names is a copy


@pytest.mark.parametrize("pretty", [False, True])
def test_only_compact_arrays_are_remembered_and_every_body_parses_the_same(pod, pretty):
    """An array is remembered when the names encode to its bytes (kube-scheduler's compact
    encoding): cheaper to check than decoding it again. A pretty-printed one (no kube-scheduler
    sends one) is parsed the ordinary way every time, with the same result."""
    memo = NodeNamesMemo()
    b = body(pod, NAMES, pretty=pretty)
    memo.parse(b)
    assert same(memo.parse(b), parse_extender_args(b))
    assert memo.hits == (0 if pretty else 1)


def test_remembered_passing_list_hits_on_prioritize(pod):
    """The filter answer's NodeNames bytes are what kube-scheduler (Go, compact) sends next."""
    memo = NodeNamesMemo()
    passing = NAMES[::3]
    data, names_json = encode_filter_result(filter_answer(parse_extender_args(body(pod, NAMES)), passing=passing))
    assert names_json == orjson.dumps(passing)
    memo.remember(names_json, passing)
    got = memo.parse(body(pod, passing))
    assert memo.hits == 1 and got.node_names is passing and got.names == passing
    # a body with any other bytes for the same list (spaces) decodes the ordinary way, same result
    spaced = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": passing}).encode()
    assert same(memo.parse(spaced), parse_extender_args(spaced))
    assert memo.hits == 1


def test_short_lists_are_not_kept(pod):
    memo = NodeNamesMemo()
    b = body(pod, NAMES[:MIN_NAMES - 1] * 1)
    memo.parse(b)
    memo.parse(b)
    assert memo.hits == 0 and len(memo) == 0


@pytest.mark.parametrize("make", [
    # a member after NodeNames: the array is not the body's last member
    lambda pod: body(pod, NAMES, extra=b',"Extra":[1]'),
    # NodeNames inside the pod only (top level has none): must stay None
    lambda pod: orjson.dumps({"Nodes": None, "Pod": dict(pod, NodeNames=NAMES)}),
    # a key that only looks like NodeNames: an escaped quote inside a longer key
    lambda pod: orjson.dumps({"Pod": pod, 'a"NodeNames': NAMES}),
    # the top-level NodeNames is null and a nested one comes last
    lambda pod: orjson.dumps({"Pod": pod, "NodeNames": None, "X": {"NodeNames": NAMES}}),
    # both forms sent: names and Node objects
    lambda pod: body(pod, NAMES[:100], nodes={"items": [{"metadata": {"name": "extra-node"}}]}),
    # lower-case key (Go decodes it case-insensitively)
    lambda pod: orjson.dumps({"Pod": pod, "nodenames": NAMES}),
])
def test_unusual_layouts_give_the_ordinary_answer(pod, make):
    memo = NodeNamesMemo()
    memo.parse(body(pod, NAMES))  # the array's bytes are known
    memo.parse(body(pod, NAMES[:100]))
    b = make(pod)
    assert same(memo.parse(b), parse_extender_args(b))
    assert same(memo.parse(b), parse_extender_args(b))  # and again, whatever was kept from it


def test_only_arrays_that_are_the_requests_nodenames_are_kept(pod):
    """The kept bytes must decode to exactly the kept list: that is what makes a hit exact."""
    memo = NodeNamesMemo()
    other = [n + "-x" for n in NAMES]
    # the last "NodeNames" is nested, and its array runs to the body's last ']' + '}'
    b = orjson.dumps({"Pod": pod, "NodeNames": NAMES, "X": [{"NodeNames": other}]})
    assert names_span(b) is not None
    assert same(memo.parse(b), parse_extender_args(b))
    assert len(memo) == 0
    memo.parse(body(pod, NAMES))
    assert len(memo) == 1


def test_duplicate_nodenames_keys_follow_the_ordinary_parser(pod):
    memo = NodeNamesMemo()
    memo.parse(body(pod, NAMES))
    arr = orjson.dumps(NAMES)
    b = b'{"Pod":' + orjson.dumps(pod) + b',"NodeNames":["x"],"NodeNames":' + arr + b"}"
    assert same(memo.parse(b), parse_extender_args(b))


def test_broken_bodies_raise_the_ordinary_errors(pod):
    memo = NodeNamesMemo()
    good = body(pod, NAMES)
    memo.parse(good)
    # the known array with a broken pod before it
    broken = b'{"Pod":{"metadata":' + good[good.find(b',"Nodes"'):]
    with pytest.raises(WireError) as ordinary:
        parse_extender_args(broken)
    with pytest.raises(WireError) as memoised:
        memo.parse(broken)
    assert str(memoised.value) == str(ordinary.value)
    # a pod that is not an object, then the known array
    bad_pod = b'{"Pod":[1],"Nodes":null,"NodeNames":' + orjson.dumps(NAMES) + b"}"
    with pytest.raises(WireError, match="'Pod' must be a Pod object"):
        memo.parse(bad_pod)
    # a non-string name in an otherwise known-looking array is never a hit
    odd = body(pod, NAMES[:-1] + [7])
    with pytest.raises(WireError, match="list of node name strings"):
        memo.parse(odd)


def test_randomized_against_the_ordinary_parser(pod):
    """Random mixes of lists, layouts and edits: every answer equals parse_extender_args."""
    rng = random.Random(11)
    memo = NodeNamesMemo(size=3)
    lists = [NAMES, NAMES[:150], NAMES[150:], NAMES[::2], list(reversed(NAMES))]
    for _ in range(300):
        names = rng.choice(lists)
        if rng.random() < 0.2:
            names = names[:]
            names[rng.randrange(len(names))] = "changed-" + str(rng.random())
        b = body(pod, names, pretty=rng.random() < 0.3)
        r = rng.random()
        if r < 0.1:
            b = b.replace(b'"NodeNames"', b'"nodeNames"')
        elif r < 0.15:
            b = b[:-5]  # truncated: invalid JSON
        elif r < 0.2:
            memo.remember(orjson.dumps(names), names)
        try:
            want = parse_extender_args(b)
        except WireError as exc:
            with pytest.raises(WireError) as got:
                memo.parse(b)
            assert str(got.value) == str(exc)
            continue
        assert same(memo.parse(b), want)
    assert memo.hits > 40 and memo.misses > 30


def test_names_span_only_for_a_trailing_member():
    arr = orjson.dumps(NAMES[:3])
    b = b'{"Pod":{},"Nodes":null,"NodeNames":' + arr + b"}"
    k, start, end = names_span(b)
    assert b[start:end] == arr and b[k:k + 11] == b'"NodeNames"'
    assert names_span(b'{"Pod":{},"NodeNames":' + arr + b',"x":1}') is None
    assert names_span(b'{"Pod":{"a":"\\"NodeNames\\":[\\"n\\"]"}}') is None
    assert names_span(b'{"Pod":{},"NodeNames":null}') is None
    assert names_span(orjson.dumps({"Pod": {}, 'a"NodeNames': NAMES[:3]})) is None  # escaped quote before


def test_a_wrong_span_is_caught_by_the_decoded_object(pod, monkeypatch):
    """Second line of defence: were the layout check fooled (here: told to ignore what precedes
    the key), the decoded rest must still have the top-level NodeNames we cut out."""
    import extender.wirememo as wm

    def permissive(b: bytes):
        k = b.rfind(b'"NodeNames"')
        m = wm._KEY.match(b, k)
        end = b.rfind(b"]")
        return (k, m.end() - 1, end + 1) if m and b[end + 1:].strip() == b"}" else None

    monkeypatch.setattr(wm, "names_span", permissive)
    memo = NodeNamesMemo()
    memo.parse(body(pod, NAMES))
    b = orjson.dumps({"Pod": pod, 'a"NodeNames': NAMES})
    assert permissive(b) is not None
    got = memo.parse(b)
    assert got.node_names is None and same(got, parse_extender_args(b))


def test_memo_needs_room():
    with pytest.raises(ValueError):
        NodeNamesMemo(size=0)


@pytest.mark.parametrize("res", [
    FilterResult(node_names=NAMES[:5], failed={"n-1": "no GPU fits", 'quo"te': "x\ny"}, unresolvable={"u": "bad"}),
    FilterResult(node_names=None, nodes=[{"metadata": {"name": "a"}, "status": {"x": 1}}], failed={}),
    FilterResult(node_names=[], error="boom \u00e9"),
    FilterResult(),
])
def test_encode_filter_result_is_byte_identical(res):
    data, names_json = encode_filter_result(res)
    assert data == encode(res.to_json())
    assert names_json == (None if res.node_names is None else orjson.dumps(res.node_names))


def test_over_http_prioritize_reuses_the_filter_answer_and_answers_the_same():
    """kube-scheduler's sequence over real HTTP with compact bodies (as Go sends them): the
    prioritize list is recognised from the filter's answer; answers equal a fresh parse's."""
    doc = {"nodes": [{"name": f"gpu-worker-{i:03d}.zone-a.example.com", "gpus": gpus("NVIDIA A100-SXM4-80GB", 8 if i % 3 else 2, "80Gi")}
                     for i in range(120)]}
    model = model_from(doc)
    svc = ExtenderService(model)
    names = [n["name"] for n in doc["nodes"]]
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "uid-p"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    with Server(svc) as srv:
        memo = srv.app.extensions["stowage"]["names_memo"]
        f = srv.post("/filter", data=body(pod, names), headers={"Content-Type": "application/json"}).json()
        passing = f["NodeNames"]
        assert 0 < len(passing) < len(names) and len(passing) >= MIN_NAMES
        assert memo.misses == 1 and memo.hits == 0
        pr = srv.post("/prioritize", data=body(pod, passing), headers={"Content-Type": "application/json"})
        assert memo.hits == 1
        fresh = ExtenderService(model_from(doc)).prioritize(parse_extender_args(body(pod, passing)))
        assert pr.json() == fresh
        f2 = srv.post("/filter", data=body(pod, names), headers={"Content-Type": "application/json"}).json()
        assert memo.hits == 2 and f2 == f
