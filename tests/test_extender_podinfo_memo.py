"""A pod seen again at the same resourceVersion is not parsed again (extender/service.py
``pod_info``); any other change of the object is."""
from __future__ import annotations

import copy

from extender.service import ExtenderService
from extender.wire import parse_extender_args
from extender_harness import gpus, model_from


def svc() -> ExtenderService:
    return ExtenderService(model_from({"nodes": [{"name": "n1", "gpus": gpus("NVIDIA A100-SXM4-80GB", 8, "80Gi")}]}))


def pod(gpu: str, rv: str | None = "7", uid: str | None = "uid-1", ann: dict | None = None) -> dict:
    meta = {"name": "p", "namespace": "ns", "annotations": ann or {}}
    if rv is not None:
        meta["resourceVersion"] = rv
    if uid is not None:
        meta["uid"] = uid
    return {"metadata": meta,
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpu}}}]}}


def test_same_uid_and_resource_version_is_the_same_parse():
    s = svc()
    first = s.pod_info(pod("2"))
    again = s.pod_info(copy.deepcopy(pod("2")))
    assert again is first and first.req.gpus == 2


def test_a_new_resource_version_is_parsed_again():
    s = svc()
    s.pod_info(pod("2", rv="7"))
    newer = s.pod_info(pod("4", rv="8"))
    assert newer.req.gpus == 4 and newer.resource_version == "8"
    # a bad annotation at a new version is reported, not hidden behind the earlier parse
    bad = s.pod_info(pod("4", rv="9", ann={"stowage.io/node-policy": "sideways"}))
    assert bad.req is None and "sideways" in bad.error


def test_without_uid_or_resource_version_every_call_parses():
    s = svc()
    assert s.pod_info(pod("2", rv=None)).req.gpus == 2
    assert s.pod_info(pod("3", rv=None)).req.gpus == 3
    assert s.pod_info(pod("2", uid=None)).req.gpus == 2
    assert s.pod_info(pod("3", uid=None)).req.gpus == 3


def test_filter_then_prioritize_observes_the_pod_once():
    """The placer learns each pod once, whether or not the second call is a memo hit."""
    s = svc()
    placer = s.placers["pack"]
    seen = placer.seen
    body = {"Pod": pod("1"), "NodeNames": ["n1"]}
    s.filter(parse_extender_args(body))
    s.prioritize(parse_extender_args(body))
    assert placer.seen == seen + 1
