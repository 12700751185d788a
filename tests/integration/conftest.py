"""Fixtures of the integration tests: ONE real control plane per test session (~10 s to start).

The tests in this folder talk to the real kube-apiserver, kube-scheduler and kubelet of
``../shared/k8s`` (see ``realk8s.py``). Without them they skip with a message saying how to enable
them; under ``CI=true`` they fail instead. Several sessions can run side by side on one machine with
different ``STOWAGE_IT_PORT_BASE`` values (only one may use the real kubelet).
"""
from __future__ import annotations

from typing import Iterator

import pytest

from realk8s import LocalK8s, _port_base, new_cluster_dir, require_control_plane


@pytest.fixture(scope="session")
def k8s() -> Iterator[LocalK8s]:
    require_control_plane()
    port = _port_base()
    cluster = LocalK8s(new_cluster_dir(port), port).up()
    try:
        yield cluster
    finally:
        cluster.down()
