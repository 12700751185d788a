"""Issue 12 against the real peers of ../shared/k8s: the real kube-scheduler reaches the extender
only over mutual TLS (item 3)."""
from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import pytest
import requests

from realk8s import ExtenderProc, LocalK8s, fake_gpu_node, scheduler_config_for_test, wait_until
from stowage.inventory import Card
from tlsutil import TLSSet, make_tls_set

ALLOCATION = "stowage.io/allocation"


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TLSSet:
    return make_tls_set(tmp_path_factory.mktemp("tls"))


class TLSExtenderProc(ExtenderProc):
    """The kube-mode extender serving HTTPS that only kube-scheduler's client certificate opens."""

    tls: TLSSet | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def session(self) -> requests.Session:
        s = requests.Session()
        s.trust_env = False  # REQUESTS_CA_BUNDLE would override s.verify
        s.verify, s.cert = str(self.tls.ca.cert), (str(self.tls.client.cert), str(self.tls.client.key))
        return s


@pytest.fixture
def tls_extender(k8s: LocalK8s, tls: TLSSet) -> Iterator[TLSExtenderProc]:
    ext = TLSExtenderProc(k8s, args=tuple(tls.server_args()), name="extender-tls")
    ext.tls = tls
    ext.start()
    try:
        yield ext
    finally:
        ext.stop()
        if k8s.scheduler is not None:
            k8s.scheduler.stop()
            k8s.scheduler = None


def _pod(name: str, gpus: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": "stowage-scheduler", "restartPolicy": "Never",
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def test_kube_scheduler_schedules_through_the_extender_over_mutual_tls(k8s: LocalK8s, tls_extender: TLSExtenderProc,
                                                                      tls: TLSSet) -> None:
    node = f"tls-gpu-{uuid.uuid4().hex[:6]}"
    fake_gpu_node(k8s, node, [Card(index=i, uuid=f"GPU-{node}-{i}", model="NVIDIA A100-SXM4-80GB",
                                   memory_mib=81920) for i in range(4)])

    def https(cfg: dict) -> None:
        ext = cfg["extenders"][0]
        ext["enableHTTPS"] = True
        ext["tlsConfig"] = {"certFile": str(tls.client.cert), "keyFile": str(tls.client.key),
                            "caFile": str(tls.ca.cert)}
    k8s.start_scheduler(scheduler_config_for_test(tls_extender.url, https), name="kube-scheduler-tls")
    name = f"tls-pod-{uuid.uuid4().hex[:6]}"
    k8s.core.create_namespaced_pod("default", _pod(name, 2))
    try:
        pod = wait_until(lambda: (p := k8s.core.read_namespaced_pod(name, "default")).spec.node_name and p, 60,
                         f"kube-scheduler to bind {name} through the extender")
        assert pod.spec.node_name == node
        record = (pod.metadata.annotations or {}).get(ALLOCATION)
        assert record and f'"node":"{node}"' in record.replace(" ", "")
        assert pod.metadata.uid in tls_extender.state()["allocations"]
        # Anyone without kube-scheduler's certificate gets no answer at all.
        for path in ("/state", f"/allocations/{pod.metadata.uid}", "/readyz"):
            with pytest.raises(requests.exceptions.SSLError):
                requests.get(tls_extender.url + path, verify=str(tls.ca.cert), timeout=10)
        bind = {"PodName": name, "PodNamespace": "default", "PodUID": pod.metadata.uid, "Node": node}
        for cert in (None, (str(tls.stranger.cert), str(tls.stranger.key))):
            with pytest.raises(requests.exceptions.RequestException):
                requests.post(tls_extender.url + "/bind", json=bind, verify=str(tls.ca.cert), cert=cert, timeout=10)
        log = Path(k8s.scheduler.log_path).read_text(errors="replace")
        assert "x509" not in log and "tls:" not in log, log[-2000:]
    finally:
        k8s.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        k8s.core.delete_node(node)
