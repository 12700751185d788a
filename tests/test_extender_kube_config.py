"""load_api_client: kubeconfig files, contexts, and clear errors when there is no configuration."""
from __future__ import annotations

import kubernetes.client
import pytest
import yaml
from extender_kube_helpers import FakeKube, make_node

from extender.errors import KubeConfigError
from extender.kube import load_api_client
from extender.kube_objects import assign_args, node_closure, pod_view, record_problem
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, encode_allocation


def _kubeconfig(tmp_path, server: str) -> str:
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "bad",
           "clusters": [{"name": "fake", "cluster": {"server": server}},
                        {"name": "nowhere", "cluster": {"server": "http://127.0.0.1:9"}}],
           "users": [{"name": "u", "user": {"token": "t"}}],
           "contexts": [{"name": "good", "context": {"cluster": "fake", "user": "u"}},
                        {"name": "bad", "context": {"cluster": "nowhere", "user": "u"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_kubeconfig_with_context_reaches_the_server(tmp_path):
    with FakeKube() as kube:
        kube.create_node(make_node("n1", gpus=1))
        api = load_api_client(kubeconfig=_kubeconfig(tmp_path, kube.url), context="good")
        nodes = kubernetes.client.CoreV1Api(api).list_node()
        assert [n.metadata.name for n in nodes.items] == ["n1"]


def test_missing_kubeconfig_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="no usable Kubernetes configuration: kubeconfig .*nope does not exist"):
        load_api_client(kubeconfig=str(tmp_path / "nope"))


def test_broken_kubeconfig_yaml_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    path.write_text("clusters: [unclosed\n  - {")
    with pytest.raises(KubeConfigError, match="no usable Kubernetes configuration"):
        load_api_client(kubeconfig=str(path))


def test_in_cluster_without_service_account_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match="in-cluster"):
        load_api_client(in_cluster=True)


@pytest.mark.parametrize("node,expected", [
    ({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, True),
    ({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}, False),
    ({"spec": {"unschedulable": True}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}, False),
    ({"status": {}}, False),
])
def test_node_schedulable(node, expected):
    assert (not node_closure(node)) is expected   # open: Ready and not cordoned


def test_record_checks_and_replay_arguments():
    rec = AllocationRecord("n", (CardShare(2, "u", 4096, 250),), whole=False)
    assert record_problem(rec) == ""
    args = assign_args(rec)
    assert (args["node"], args["cards"], args["mem_mib"], args["core_milli"], args["check"]) == ("n", [2], [4096], [250], False)
    assert not args["req"].is_whole
    assert "duplicate" in record_problem(AllocationRecord("n", (CardShare(1, "u", 0, 0), CardShare(1, "u", 0, 0)), True))
    assert "no cards" in record_problem(AllocationRecord("n", (), True))
    pod = {"metadata": {"uid": "x", "namespace": "ns", "name": "p", "annotations": {ALLOCATION_ANNOTATION: encode_allocation(rec)}},
           "spec": {"nodeName": "n"}, "status": {"phase": "Failed"}}
    v = pod_view(pod)
    assert v.key == "ns/p" and v.terminal and not v.holds_cards and v.record == rec
