"""Pod objects written to hurt: what a pod author (or anything reaching the extender's port)
can put in a pod stays that pod's short, clear error (found by review, each failing before).

- An annotation's bad value was echoed whole into the reason, and a pod-level reason goes to
  every node: a 262,000-character annotation (within the API server's 256 KiB limit) on a
  2,000-node cluster gave a 524 MB filter answer and pushed the extender past 1.6 GiB; the
  reason also kept the ", " that kube-scheduler joins reasons with.
- Values nested ~1,000 deep (below orjson's limit) raised RecursionError when turned into
  text, answered as an internal error "will retry" on every node.
- A negative ``spec.overhead.cpu`` (refused by a real API server, not by the port) gave its
  node a billion spare CPUs in the model.
- ``1Ei`` (a valid quantity) was read as an exponent and refused as malformed.
"""
from __future__ import annotations

import pytest

from extender.service import ExtenderService
from extender.wire import encode, parse_extender_args
from extender_harness import gpus, model_from
from packing.pod_policy import (GPU_MODEL, GPU_MODEL_EXCLUDE, MAX_KEY_CHARS, MAX_MODEL_LIST_CHARS, MAX_MODEL_NAME,
                                MAX_MODELS_PER_LIST, MAX_SETTING_CHARS, MAX_VALUE_CHARS, MIN_CARD_MEMORY, NODE_POLICY,
                                POLICY_KEYS, PolicyError, parse_policy)
from stowage.resources import RequestError, parse_quantity, pod_host_request

LONG = "x" * 262_000
NODES = [f"n{i}" for i in range(200)]


def svc() -> ExtenderService:
    return ExtenderService(model_from({"nodes": [{"name": n, "gpus": gpus("NVIDIA A100-SXM4-80GB", 8, "80Gi")}
                                                 for n in NODES[:3]]}))


def pod(ann: dict | None = None, *, name: object = "p", uid: object = "uid-1", container: object = "c",
        overhead: dict | None = None, cpu: str = "1") -> dict:
    spec: dict = {"containers": [{"name": container,
                                  "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": cpu}}}]}
    if overhead is not None:
        spec["overhead"] = overhead
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": ann or {}}, "spec": spec}


def deep(n: int = 1000) -> object:
    v: object = "x"
    for _ in range(n):
        v = [v]
    return v


@pytest.mark.parametrize("key", ["stowage.io/node-policy", "stowage.io/card-policy", "stowage.io/gpu-topology",
                                 "stowage.io/min-card-memory", "stowage.io/gpu-model"])
def test_a_huge_annotation_value_gives_a_short_reason(key):
    with pytest.raises(PolicyError) as exc:
        parse_policy({key: LONG})
    assert len(str(exc.value)) < 300 and key in str(exc.value)


def test_a_reason_never_carries_kube_schedulers_separator():
    with pytest.raises(PolicyError) as exc:
        parse_policy({"stowage.io/node-policy": "pack, spread"})
    assert ", " not in str(exc.value) and "unknown value" in str(exc.value)


def test_an_unknown_annotation_key_is_shown_short():
    with pytest.raises(PolicyError) as exc:
        parse_policy({"stowage.io/" + "k" * 100_000: "v"})
    assert len(str(exc.value)) < 400


@pytest.mark.parametrize("key", sorted(POLICY_KEYS))
def test_a_value_past_the_limit_is_refused_by_its_length_alone(key):
    """The feed keeps of a pending pod's policy values only up to one character past their limit
    (``extender.kube_objects.pod_for_bind``), so the error must not depend on anything past it:
    not the rest of the value, not its exact length."""
    limit = MAX_VALUE_CHARS[key]
    errors = set()
    for value in ("x" * (limit + 1), "pack" + " " * limit, "y" * 262_000):
        with pytest.raises(PolicyError) as exc:
            parse_policy({key: value})
        errors.add(str(exc.value))
    assert errors == {f"annotation {key}: longer than {limit} characters"}


def test_the_longest_meaningful_values_are_within_the_limits():
    """The limits refuse nothing that means something: the longest model list allowed (64 names
    of 128 characters), with ", " between names, and padded with blanks and empty items up to
    the limit itself; settings and sizes padded with blanks up to theirs."""
    assert MAX_VALUE_CHARS[GPU_MODEL] == MAX_VALUE_CHARS[GPU_MODEL_EXCLUDE] == MAX_MODEL_LIST_CHARS
    names = [f"{i:03d}" + "m" * (MAX_MODEL_NAME - 3) for i in range(MAX_MODELS_PER_LIST)]
    longest = ", ".join(names)
    padded = (" , " + longest + " ," * MAX_MODEL_LIST_CHARS)[:MAX_MODEL_LIST_CHARS]
    for value in (longest, padded):
        assert parse_policy({GPU_MODEL: value}).models_include == tuple(names)
        assert parse_policy({GPU_MODEL_EXCLUDE: value}).models_exclude == tuple(names)
    assert parse_policy({MIN_CARD_MEMORY: " " * (MAX_SETTING_CHARS - 4) + "80Gi"}).min_card_mem_mib == 80 * 1024
    assert parse_policy({NODE_POLICY: "spread".center(MAX_SETTING_CHARS)}).node == "spread"


def test_an_unknown_key_past_kubernetes_bound_is_refused_without_its_length():
    """An API server accepts annotation keys of at most 317 characters (a 253-character prefix,
    '/', a 63-character name); the feed keeps one character more of a longer unknown key, so
    its error says "longer than 317", the same for any longer key."""
    errors = set()
    for n in (MAX_KEY_CHARS + 1, 5000, 100_000):
        with pytest.raises(PolicyError) as exc:
            parse_policy({("stowage.io/" + "k" * n)[:n]: "v"})
        errors.add(str(exc.value))
    assert len(errors) == 1 and f"longer than {MAX_KEY_CHARS} characters" in errors.pop()
    with pytest.raises(PolicyError, match=r"\(317 characters\)"):
        parse_policy({("stowage.io/" + "k" * 400)[:MAX_KEY_CHARS]: "v"})   # within the bound: as before


def test_the_filter_answer_stays_small_whatever_the_annotation():
    s = svc()
    args = parse_extender_args({"Pod": pod({"stowage.io/node-policy": LONG}), "NodeNames": NODES})
    ans = s.filter(args)
    body = encode(ans.to_json())
    assert len(body) < 300 * len(NODES), len(body)
    assert set(ans.unresolvable) == set(NODES)
    # the cached parse keeps the short reason, not the value
    assert len(s.pod_info(pod({"stowage.io/node-policy": LONG})).error) < 300


@pytest.mark.parametrize("where", ["annotation", "name", "uid", "container"])
def test_deeply_nested_values_are_that_pods_error_not_an_internal_one(where):
    s = svc()
    p = pod({"stowage.io/node-policy": deep()} if where == "annotation" else None,
            **({where: deep()} if where in ("name", "uid", "container") else {}))
    info = s.pod_info(p)
    if where == "container":   # a container's name only ever appears in messages: shown by its type
        assert info.req is not None and info.req.gpus == 1
    else:
        assert info.req is None and "Stowage cannot schedule this pod" in info.error and len(info.error) < 300
    # the next, normal pod is unharmed
    assert s.pod_info(pod(uid="uid-2")).req.gpus == 1
    with pytest.raises(RequestError, match="<list>"):   # and a message naming it stays short
        pod_host_request(pod(container=deep(), cpu="-1"))


def test_negative_overhead_cpu_is_refused():
    with pytest.raises(RequestError, match="negative"):
        pod_host_request(pod(overhead={"cpu": "-1000000"}))
    info = svc().pod_info(pod(overhead={"cpu": "-1000000"}))
    assert info.req is None and "negative" in info.error


@pytest.mark.parametrize("text,value", [("1Ei", 2**60), ("2Ei", 2**61), ("1E", 10**18), ("1e3", 1000),
                                        ("1E3", 1000)])
def test_exa_binary_suffix_is_a_unit_not_an_exponent(text, value):
    assert parse_quantity(text) == value


def test_a_pod_of_more_containers_than_stowage_schedules_is_that_pods_error():
    """A real API server stores a pod of 25,774 minimal containers; the feed kept each one's name
    and requests of a pending pod for ever (~11.5 MiB for 18,000). Stowage schedules pods of at
    most MAX_CONTAINERS_PER_POD (init containers included): more is that pod's short error on
    every node, the same whatever the count, and the next pod is unharmed."""
    from stowage.resources import MAX_CONTAINERS_PER_POD as N
    s = svc()
    errors = set()
    for n, uid in ((N + 1, "uid-a"), (25_774, "uid-b")):
        p = pod(uid=uid)
        p["spec"]["containers"] = [{"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                                   for i in range(n)]
        ans = s.filter(parse_extender_args({"Pod": p, "NodeNames": NODES}))
        assert set(ans.unresolvable) == set(NODES)
        errors.update(ans.unresolvable.values())
    assert errors == {f"Stowage cannot schedule this pod: more than {N} containers (init containers included): "
                      f"Stowage schedules pods of at most {N}"}
    assert s.pod_info(pod(uid="uid-c")).req.gpus == 1
