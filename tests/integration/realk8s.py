"""The real peers, for the integration tests: upstream kube-apiserver, kube-scheduler and kubelet
(v1.28.7, from ``../shared/k8s``) on this machine's loopback, started with ``local-k8s``.

The harness itself (:class:`LocalK8s`, :class:`ExtenderProc`, :func:`scheduler_config_for_test`,
:func:`fake_gpu_node`, ...) is :mod:`benchmarks.localk8s`, shared with the real-scheduler benchmark
(``python -m benchmarks.binpack.real``) so that both start the peers the same way; it is
re-exported here. What this module adds is pytest's business:

- :func:`require_control_plane` / :func:`require_kubelet`: skip with a message that says how to
  enable the tests when a peer cannot run here (no ``../shared/k8s``, no etcd, not root, no
  containerd); under ``CI=true`` a missing peer fails the test instead, so CI can never pass by
  skipping.
- :func:`new_cluster_dir` and the port base (``STOWAGE_IT_PORT_BASE``) of this test session.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from benchmarks.localk8s import (LOCAL_K8S, REPO, SCHEDULER_CONFIG, SHARED_K8S, ExtenderProc,  # noqa: F401 - re-exported
                                 LocalK8s, Proc, WaitTimeout, dumps, fake_gpu_node, free_port, json_patch_status,
                                 missing_for_control_plane, scheduler_config_for_test, wait_until)

DEBIAN_PACKAGES = "etcd-server containerd runc containernetworking-plugins"
HOW_TO_ENABLE = ("to run them: as root, `apt-get install -y " + DEBIAN_PACKAGES + " openssl curl xz-utils` "
                 "with ../shared/k8s beside the checkout (what .ci/run does), then `make test`")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing_for_kubelet() -> list[str]:
    out = missing_for_control_plane()
    if os.geteuid() != 0:
        out.append("a real kubelet needs root")
    for tool in ("containerd", "runc", "ctr"):
        if shutil.which(tool) is None:
            out.append(f"`{tool}` is not installed")
    if not os.path.exists("/usr/lib/cni/bridge"):
        out.append("the CNI plugins are not installed (/usr/lib/cni/bridge)")
    return out


def _require(missing: list[str], what: str) -> None:
    if not missing:
        return
    msg = f"{what} cannot run here: {'; '.join(missing)}; {HOW_TO_ENABLE}"
    if in_ci():
        pytest.fail("CI=true, so a missing real peer is a failure, not a skip: " + msg, pytrace=False)
    pytest.skip(msg)


def require_control_plane() -> None:
    _require(missing_for_control_plane(), "the real kube-apiserver/kube-scheduler tests")


def require_kubelet() -> None:
    _require(missing_for_kubelet(), "the real kubelet tests")


def _port_base() -> int:
    """Tests that run side by side on one machine pick different bases (STOWAGE_IT_PORT_BASE)."""
    return int(os.environ.get("STOWAGE_IT_PORT_BASE", "23790"))


def new_cluster_dir(port_base: int) -> Path:
    base = Path(os.environ.get("STOWAGE_IT_DIR", tempfile.gettempdir()))
    d = base / f"stowage-it-{port_base}"
    d.mkdir(parents=True, exist_ok=True)
    return d
