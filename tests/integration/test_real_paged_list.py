"""The feeder's paged list against the real kube-apiserver v1.28.7: the same client calls
(``CoreV1Api.list_*`` with ``limit`` and ``_continue``) that the fake API server answers in
tests/test_extender_kube_paged_list.py, here answered from etcd."""
from __future__ import annotations

from typing import Any

from realk8s import LocalK8s
from schedbed import IMAGE, POOL_LABEL, Pool

from extender.kube import PODS, KubeFeeder
from packing.model import ClusterModel


def test_the_feeder_lists_pods_in_pages_from_kube_apiserver(k8s: LocalK8s, pool: Pool) -> None:
    for i in range(7):
        k8s.core.create_namespaced_pod(pool.namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"paged-{i}", "labels": {POOL_LABEL: pool.name}},
            "spec": {"schedulerName": "nobody", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": IMAGE}]}})
    f = KubeFeeder(ClusterModel(), k8s.api_client(), page_size=2)
    calls: list[tuple[str, int, bool]] = []
    list_call = f._list_call

    def recorded(kind: str, limit: int = 0, cont: str = "") -> Any:
        calls.append((kind, limit, bool(cont)))
        return list_call(kind, limit, cont)

    f._list_call = recorded  # type: ignore[method-assign]
    shown: list[str] = []
    f.on_pod_seen = lambda pod: shown.append(pod["metadata"]["uid"])
    f.sync_once()
    pages = [c for c in calls if c[0] == PODS]
    assert len(pages) >= 4 and {limit for _, limit, _ in pages} == {2}
    assert [cont for _, _, cont in pages] == [False] + [True] * (len(pages) - 1)
    mine = {p.metadata.uid for p in pool.pods().values()}
    assert len(mine) == 7 and mine <= set(shown) and len(shown) == len(set(shown))
    assert f.streams[PODS].synced and int(f.streams[PODS].rv) > 0
