"""The fake API server itself, through the real client (other areas reuse it as a fixture)."""
from __future__ import annotations

import kubernetes.client
import pytest
from fakekube import FakeKube, make_node, make_pod
from kubernetes import watch
from kubernetes.client.exceptions import ApiException


@pytest.fixture
def kube():
    with FakeKube(bookmark_interval=3600) as k:
        yield k


def test_node_annotation_patch_as_a_device_plugin_does(kube):
    kube.create_node(make_node("n1", gpus=2, annotations={"keep": "me"}))
    core = kubernetes.client.CoreV1Api(kube.api_client())
    core.patch_node("n1", {"metadata": {"annotations": {"stowage.io/gpu-inventory": "{}"}}})
    assert kube.get_node("n1")["metadata"]["annotations"] == {"keep": "me", "stowage.io/gpu-inventory": "{}"}
    assert core.read_node("n1").metadata.annotations["stowage.io/gpu-inventory"] == "{}"
    with pytest.raises(ApiException) as err:
        core.read_node("nope")
    assert err.value.status == 404


def test_field_selector_and_json_patch_test_op(kube):
    kube.create_pod(make_pod("a", node="n1"))
    kube.create_pod(make_pod("b", node="n2"))
    core = kubernetes.client.CoreV1Api(kube.api_client())
    names = [p.metadata.name for p in core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").items]
    assert names == ["a"]
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod("a", "default", [{"op": "test", "path": "/spec/nodeName", "value": "n2"},
                                                   {"op": "remove", "path": "/spec/nodeName"}],
                                  _content_type="application/json-patch+json")
    assert err.value.status == 422
    assert kube.get_pod("default", "a")["spec"]["nodeName"] == "n1"


def test_lists_page_like_kube_apiserver(kube):
    """``limit`` + ``continue`` through the client's own parameters (the calls the feeder makes of
    a real kube-apiserver): key order, one snapshot for all pages (same resourceVersion; a pod
    deleted after the first page still on a later one), ``remainingItemCount``; a continue token
    whose snapshot is gone gets 410 Expired, and one for another list 400."""
    import json
    for ns, name in [("b", "p1"), ("a", "p3"), ("a", "p1"), ("c", "p0"), ("a", "p2")]:
        kube.create_pod(make_pod(name, namespace=ns))
    core = kubernetes.client.CoreV1Api(kube.api_client())
    first = core.list_pod_for_all_namespaces(limit=2)
    assert [(p.metadata.namespace, p.metadata.name) for p in first.items] == [("a", "p1"), ("a", "p2")]
    assert first.metadata.remaining_item_count == 3 and first.metadata._continue
    kube.delete_pod("c", "p0")
    kube.create_pod(make_pod("p9", namespace="b"))
    second = core.list_pod_for_all_namespaces(limit=2, _continue=first.metadata._continue)
    last = core.list_pod_for_all_namespaces(limit=2, _continue=second.metadata._continue)
    assert [(p.metadata.namespace, p.metadata.name) for p in second.items + last.items] == [
        ("a", "p3"), ("b", "p1"), ("c", "p0")]
    assert first.metadata.resource_version == second.metadata.resource_version == last.metadata.resource_version
    assert not last.metadata._continue and not last.metadata.remaining_item_count
    assert len(core.list_pod_for_all_namespaces().items) == 5    # unpaged: everything, now
    with pytest.raises(ApiException) as err:
        core.list_node(limit=1, _continue=first.metadata._continue)
    assert err.value.status == 400
    again = core.list_pod_for_all_namespaces(limit=2)
    kube.expire_lists()
    with pytest.raises(ApiException) as err:
        core.list_pod_for_all_namespaces(limit=2, _continue=again.metadata._continue)
    status = json.loads(err.value.body)
    assert (err.value.status, status["reason"], status["code"]) == (410, "Expired", 410)
    assert "continue parameter is too old" in status["message"]


def test_watch_from_zero_starts_with_current_objects_and_ends_on_timeout(kube):
    kube.create_node(make_node("n1"))
    core = kubernetes.client.CoreV1Api(kube.api_client())
    events = [(e["type"], e["raw_object"]["metadata"]["name"])
              for e in watch.Watch(return_type="object").stream(core.list_node, resource_version="0", timeout_seconds=1)]
    assert events == [("ADDED", "n1")]
