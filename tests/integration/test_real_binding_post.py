"""The Binding's fast path (extender/kube_post.py) against the real kube-apiserver: TLS with the
kubeconfig's credentials, the API server's answers to a good Binding, to one for a re-created pod
(the uid precondition) and to one for a pod already bound, exactly as through the client."""
from __future__ import annotations

import uuid

import pytest
from realk8s import LocalK8s

from extender.errors import BindError
from extender.kube_binder import KubeBinder
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, decode_allocation

NS = "default"


def _pod(k8s: LocalK8s, name: str) -> dict:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "registry.invalid/none"}]}}
    return k8s.core.api_client.sanitize_for_serialization(k8s.core.create_namespaced_pod(NS, body))


def _record(node: str) -> AllocationRecord:
    return AllocationRecord(node=node, whole=True, cards=(CardShare(0, f"GPU-{node}-0", 1000, 1000),))


@pytest.mark.parametrize("direct", [True, False], ids=["direct-post", "client"])
def test_binding_answers_are_the_same_on_both_paths(k8s: LocalK8s, direct: bool) -> None:
    binder = KubeBinder(k8s.api_client(), direct=direct)
    assert (binder.poster is not None) == direct          # https + kubeconfig credentials: supported
    tag = uuid.uuid4().hex[:6]
    try:
        p = _pod(k8s, f"bp-{tag}")
        rec = _record("gpu-a")
        binder.bind(NS, f"bp-{tag}", p["metadata"]["uid"], "gpu-a", rec)
        got = k8s.core.read_namespaced_pod(f"bp-{tag}", NS)
        assert got.spec.node_name == "gpu-a"
        assert decode_allocation(got.metadata.annotations[ALLOCATION_ANNOTATION]) == rec
        binder.bind(NS, f"bp-{tag}", p["metadata"]["uid"], "gpu-a", rec)  # answered 409, read back: ours
        with pytest.raises(BindError, match="already assigned|bound"):
            binder.bind(NS, f"bp-{tag}", p["metadata"]["uid"], "gpu-b", _record("gpu-b"))
        old = _pod(k8s, f"rc-{tag}")
        k8s.core.delete_namespaced_pod(f"rc-{tag}", NS, grace_period_seconds=0)
        k8s.kubectl("wait", "--for=delete", f"pod/rc-{tag}", "-n", NS, "--timeout=30s", check=False)
        _pod(k8s, f"rc-{tag}")
        with pytest.raises(BindError, match="re-created"):
            binder.bind(NS, f"rc-{tag}", old["metadata"]["uid"], "gpu-a", _record("gpu-a"))
        assert not k8s.core.read_namespaced_pod(f"rc-{tag}", NS).spec.node_name
    finally:
        for name in (f"bp-{tag}", f"rc-{tag}"):
            k8s.kubectl("delete", "pod", name, "-n", NS, "--grace-period=0", "--force", "--ignore-not-found", check=False)
