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


def _compact_etcd(k8s: LocalK8s) -> None:
    """Compact etcd at its current revision (through its HTTP gateway), as kube-apiserver does
    every 5 minutes: a list under way loses its snapshot."""
    import base64
    import json
    from urllib.request import Request, urlopen

    def post(path: str, body: dict) -> dict:
        req = Request(f"http://127.0.0.1:{k8s.port_base}{path}", data=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})
        with urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    rev = post("/v3/kv/range", {"key": base64.b64encode(b"/registry/namespaces").decode()})["header"]["revision"]
    post("/v3/kv/compaction", {"revision": rev, "physical": True})


def test_a_compacted_list_answers_expired_and_the_feeder_lists_again_in_pages(k8s: LocalK8s, pool: Pool) -> None:
    """kube-apiserver answers a continued page whose snapshot etcd compacted with 410 and the
    Status reason ``Expired``, the one error after which the feeder starts the list again from
    its first page (client-go's pager lists everything in one request there); tests/fakekube.py
    answers the same."""
    from kubernetes.client.exceptions import ApiException

    from extender.kube import api_status

    def make(name: str) -> None:
        k8s.core.create_namespaced_pod(pool.namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {POOL_LABEL: pool.name}},
            "spec": {"schedulerName": "nobody", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": IMAGE}]}})

    for i in range(5):
        make(f"expiring-{i}")
    f = KubeFeeder(ClusterModel(), k8s.api_client(), page_size=2)
    calls: list[tuple[str, int, bool]] = []
    errors: list[tuple[int, str]] = []
    list_call = f._list_call

    def recorded(kind: str, limit: int = 0, cont: str = "") -> Any:
        calls.append((kind, limit, bool(cont)))
        try:
            resp = list_call(kind, limit, cont)
        except ApiException as exc:
            errors.append((exc.status, api_status(exc).get("reason")))
            raise
        if kind == PODS and not cont and not errors:   # the first page: then the snapshot goes
            make("late")
            _compact_etcd(k8s)
        return resp

    f._list_call = recorded  # type: ignore[method-assign]
    shown: list[str] = []
    f.on_pod_seen = lambda pod: shown.append(pod["metadata"]["uid"])
    f.sync_once()
    pages = [(limit, cont) for kind, limit, cont in calls if kind == PODS]
    assert pages[:3] == [(2, False), (2, True), (2, False)] and len(pages) >= 5
    assert {limit for limit, _ in pages} == {2}
    assert errors == [(410, "Expired")]
    mine = {p.metadata.uid for p in pool.pods().values()}
    assert len(mine) == 6 and mine <= set(shown) and len(shown) == len(set(shown))
    assert f.streams[PODS].synced


def test_giant_pods_are_listed_in_pages_bounded_by_bytes(k8s: LocalK8s, pool: Pool, monkeypatch) -> None:
    """kube-apiserver v1.28.7 stores a pod of 20,000 minimal containers (etcd's 1.5 MiB request
    limit is the only bound) and serves it as ~3 MiB of JSON (~25 MB parsed): 40 of them in one
    page of 500 took the feeder to ~1 GB (docs/kube.md). A page past ``page_bytes`` is abandoned
    unread and asked for again, from the same continue token, with fewer pods; kube-apiserver
    serves the same snapshot for it. Every pod is listed once, and no body past the bound is
    parsed unless it holds one pod."""
    import stowage.kubelist as kubelist

    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {POOL_LABEL: pool.name}},
            "spec": {"schedulerName": "nobody", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": f"c{i}", "image": "x"} for i in range(20_000)]}}
    for i in range(4):
        body["metadata"]["name"] = f"giant-{i}"
        k8s.core.create_namespaced_pod(pool.namespace, body, _preload_content=False).release_conn()
    for i in range(6):
        k8s.core.create_namespaced_pod(pool.namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"a-small-{i}", "labels": {POOL_LABEL: pool.name}},
            "spec": {"schedulerName": "nobody", "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": IMAGE}]}})
    giant = len(k8s.core.read_namespaced_pod("giant-0", pool.namespace, _preload_content=False).data)
    bound = 4 << 20
    assert 2 << 20 < giant < bound          # one fits the bound, two do not

    sizes: list[int] = []
    real = kubelist.loads
    monkeypatch.setattr(kubelist, "loads", lambda data: (sizes.append(len(data)), real(data))[1])
    f = KubeFeeder(ClusterModel(), k8s.api_client(), page_bytes=bound)
    calls: list[tuple[str, int, str]] = []
    list_call = f._list_call

    def recorded(kind: str, limit: int = 0, cont: str = "") -> Any:
        calls.append((kind, limit, cont))
        return list_call(kind, limit, cont)

    f._list_call = recorded  # type: ignore[method-assign]
    shown: list[str] = []
    f.on_pod_seen = lambda pod: shown.append(pod["metadata"]["uid"])
    f.sync_once()
    pages = [(limit, cont) for kind, limit, cont in calls if kind == PODS]
    assert pages[0] == (500, "") and pages[1] == (62, "")          # the first page, asked again smaller
    # the small pods sort first, so a continued page (the giants) is asked again smaller too
    assert any(a[1] and a[1] == b[1] and b[0] < a[0] for a, b in zip(pages, pages[1:])), pages
    mine = {p.metadata.uid for p in pool.pods().values()}
    assert len(mine) == 10 and mine <= set(shown) and len(shown) == len(set(shown))
    assert all(size <= bound or size < giant + (64 << 10) for size in sizes)
    assert f.streams[PODS].synced


def test_the_device_plugin_lists_giant_pods_of_its_node_in_bounded_pages_and_keeps_them_slim(
        k8s: LocalK8s, pool: Pool, monkeypatch) -> None:
    """The device plugin's list of its node's pods (field selector ``spec.nodeName``) against the
    real API server: pods bound by ``spec.nodeName`` at creation (no scheduler, no kubelet needed),
    three of them ~3 MiB of JSON. Pages past the bound are asked for again smaller, every pod of
    the node comes once (none of another node), and only the container asking for a GPU is kept."""
    import kubernetes

    import stowage.kubelist as kubelist
    from deviceplugin.kube import PodLister

    node = f"{pool.name}-gpu"[:63]

    def pinned(name: str, containers: list[dict]) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {POOL_LABEL: pool.name}},
                "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0, "containers": containers}}

    gpu = {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    for i in range(3):
        k8s.core.create_namespaced_pod(pool.namespace, pinned(f"giant-{i}", [gpu] + [
            {"name": f"c{j}", "image": "x"} for j in range(20_000)]), _preload_content=False).release_conn()
    for i in range(4):
        k8s.core.create_namespaced_pod(pool.namespace, pinned(f"a-small-{i}", [gpu]))
    other = pinned("elsewhere", [gpu])
    other["spec"]["nodeName"] = node + "-x"
    k8s.core.create_namespaced_pod(pool.namespace, other)

    sizes: list[int] = []
    real = kubelist.loads
    monkeypatch.setattr(kubelist, "loads", lambda data: (sizes.append(len(data)), real(data))[1])
    bound = 4 << 20
    lister = PodLister(kubernetes.client.CoreV1Api(k8s.api_client()), node, timeout_s=60, page_bytes=bound)
    pods = lister.pods()
    names = sorted(p["metadata"]["name"] for p in pods)
    assert names == sorted([f"giant-{i}" for i in range(3)] + [f"a-small-{i}" for i in range(4)])
    assert all([c["name"] for c in p["spec"]["containers"]] == ["main"] for p in pods)
    assert any(size > 2 << 20 for size in sizes)                      # a giant read alone, whole
    assert all(size <= bound or size < (3 << 20) + (64 << 10) for size in sizes)
    again = sorted(p["metadata"]["name"] for p in lister.pods())      # from the page size the last list ended at
    assert again == names


def test_the_biggest_json_an_api_server_serves_for_one_pod_is_within_the_bound_of_one_object(
        k8s: LocalK8s, pool: Pool) -> None:
    """A page of one object is read up to ``OBJECT_BYTES`` (16 MiB), then the list fails: no API
    server serves one that big. The biggest JSON kube-apiserver v1.28.7 serves for what etcd stores
    (1.5 MiB): one string of '<', which Go's JSON writes as six bytes each (``\\u003c``), ~9 MiB.
    It is past the device plugin's page bound (8 MiB), so the plugin reads it as a page of one;
    both the feed and the plugin list it."""
    import kubernetes

    from deviceplugin.kube import NODE_PODS_PAGE_BYTES, PodLister
    from stowage.kubelist import OBJECT_BYTES

    node = f"{pool.name}-gpu"[:63]
    k8s.core.create_namespaced_pod(pool.namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "escaped", "labels": {POOL_LABEL: pool.name}},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0, "containers": [
            {"name": "main", "image": "x", "env": [{"name": "V", "value": "<" * 1_500_000}],
             "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}, _preload_content=False).release_conn()
    served = len(k8s.core.read_namespaced_pod("escaped", pool.namespace, _preload_content=False).data)
    assert NODE_PODS_PAGE_BYTES < served < OBJECT_BYTES and served > 6 * 1_500_000
    lister = PodLister(kubernetes.client.CoreV1Api(k8s.api_client()), node, timeout_s=60)
    assert [p["metadata"]["name"] for p in lister.pods()] == ["escaped"]
    f = KubeFeeder(ClusterModel(), k8s.api_client(), page_bytes=4 << 20)
    shown: list[str] = []
    f.on_pod_seen = lambda pod: shown.append(pod["metadata"]["name"])
    f.sync_once()
    assert "escaped" in shown and f.streams[PODS].synced
