"""The control plane of ../shared/k8s answers, and it is the version the project targets."""
from realk8s import LocalK8s


def test_control_plane_is_upstream_v1_28(k8s: LocalK8s) -> None:
    info = k8s.kubectl("version", "-o", "json").stdout
    assert '"gitVersion": "v1.28.7"' in info
    assert k8s.core.read_namespace("default").status.phase == "Active"
