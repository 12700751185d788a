"""Fixtures of the integration tests: ONE real control plane per test session (~10 s to start).

The tests in this folder talk to the real kube-apiserver, kube-scheduler and kubelet of
``../shared/k8s`` (see ``realk8s.py``). Without them they skip with a message saying how to enable
them; under ``CI=true`` they fail instead. Several sessions can run side by side on one machine with
different ``STOWAGE_IT_PORT_BASE`` values (only one may use the real kubelet).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import pytest

from realk8s import LocalK8s, _port_base, new_cluster_dir, require_control_plane

if TYPE_CHECKING:
    from kubeletbed import GpuNode
    from schedbed import Pool, SchedBed


@pytest.fixture(scope="session")
def k8s() -> Iterator[LocalK8s]:
    require_control_plane()
    port = _port_base()
    cluster = LocalK8s(new_cluster_dir(port), port).up()
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def sched_bed(k8s: LocalK8s) -> Iterator["SchedBed"]:
    """kube-scheduler (the deployed scheduler-config.yaml) + ``stowage extender`` for the session."""
    from schedbed import SchedBed
    bed = SchedBed(k8s)
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture
def sched(sched_bed: "SchedBed") -> "SchedBed":
    """The bed, with its extender and kube-scheduler running (restarted if a test stopped them)."""
    return sched_bed.ensure()


@pytest.fixture
def pool(request: pytest.FixtureRequest, k8s: LocalK8s) -> Iterator["Pool"]:
    """This test's own fake GPU nodes and namespace; its pods and nodes are deleted afterwards."""
    from schedbed import Pool
    p = Pool(k8s, request.node.name)
    try:
        yield p
    finally:
        p.cleanup()


@pytest.fixture(scope="module")
def gpu_node(k8s: LocalK8s) -> Iterator["GpuNode"]:
    """The real kubelet's node (kubelet started on first use, kept for the session) with this
    module's own device plugin on a fresh fake NVML (``kubeletbed.py``)."""
    from kubeletbed import gpu_node_on
    yield from gpu_node_on(k8s)


@pytest.fixture
def clean(gpu_node: "GpuNode") -> Iterator["GpuNode"]:
    """Each test starts and ends with no pod on the node and the kubelet running."""
    from kubeletbed import clean_node
    yield from clean_node(gpu_node)


@pytest.fixture(scope="session")
def rbac_k8s() -> Iterator[LocalK8s]:
    """A second control plane, started on first use: RBAC authorization, the ServiceAccount
    admission plugin and the ValidatingAdmissionPolicy API (v1beta1) on (``local-k8s up --rbac``),
    at port base + 100. What scheduler-config/ needs as a whole (admission-policy.yaml)."""
    require_control_plane()
    port = _port_base() + 100
    cluster = LocalK8s(new_cluster_dir(port), port, rbac=True).up()
    try:
        yield cluster
    finally:
        cluster.down()
