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


def test_watch_from_zero_starts_with_current_objects_and_ends_on_timeout(kube):
    kube.create_node(make_node("n1"))
    core = kubernetes.client.CoreV1Api(kube.api_client())
    events = [(e["type"], e["raw_object"]["metadata"]["name"])
              for e in watch.Watch(return_type="object").stream(core.list_node, resource_version="0", timeout_seconds=1)]
    assert events == [("ADDED", "n1")]
