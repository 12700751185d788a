"""The plugin's Kubernetes API side: list the pods bound to this node, publish the card inventory.

Uses the official ``kubernetes`` client. Pods are read as raw JSON (camelCase, as the shared
``stowage`` helpers expect), in pages bounded in bytes (:mod:`stowage.kubelist`), and only what
the plugin reads of each is kept (:func:`pod_for_plugin`): a pod author decides how big a pod
is, and may bind pods to any node by ``spec.nodeName``. The inventory is written with a JSON merge patch that touches only
our annotation, from a background thread that retries with backoff, so a slow or unreachable API
server never delays a kubelet call.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from stowage.allocation import ALLOCATION_ANNOTATION
from stowage.inventory import INVENTORY_ANNOTATION
from stowage.kubelist import LIST_PAGE_SIZE, PageSizer, list_in_pages
from stowage.resources import GPU_RESOURCES

log = logging.getLogger("stowage.deviceplugin.kube")


def make_core_api(api_url: str | None = None) -> Any:
    """A ``CoreV1Api``: explicit URL (tests, kubectl proxy), else in-cluster, else kubeconfig."""
    from kubernetes import client, config

    if api_url:
        cfg = client.Configuration()
        cfg.host = api_url
        return client.CoreV1Api(client.ApiClient(cfg))
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api()


# JSON bytes of one page of the node's pods (a page past it is asked for again with fewer pods:
# stowage.kubelist). 8 MiB parses to at most ~65 MB; the plugin's memory limit is 256 MiB. 110
# ordinary pods (the kubelet's default maximum) take ~1 MiB.
NODE_PODS_PAGE_BYTES = 8 << 20

_META_KEPT = ("uid", "name", "namespace", "creationTimestamp", "deletionTimestamp")
_SPEC_KEPT = ("nodeName", "schedulerName", "overhead")
_STATUS_KEPT = ("phase", "startTime")


def _gpu_container(c: Any) -> dict | None:
    """What the plugin reads of a container (name, our resources, restartPolicy), None when it
    asks for none of them. A container whose resources are not objects is kept whole, so the
    request rule reads it (and refuses it) exactly as before (an API server stores no such pod)."""
    if not isinstance(c, dict):
        return None
    res = c.get("resources") or {}
    parts = [res.get("limits") or {}, res.get("requests") or {}] if isinstance(res, dict) else [None]
    if not all(isinstance(q, dict) for q in parts):
        return c
    limits, requests = ({k: v for k, v in q.items() if k in GPU_RESOURCES} for q in parts)
    if not limits and not requests:
        return None
    out: dict[str, Any] = {"name": c.get("name"), "resources": {"limits": limits, "requests": requests}}
    if "restartPolicy" in c:
        out["restartPolicy"] = c["restartPolicy"]
    return out


def pod_for_plugin(pod: Any) -> dict[str, Any]:
    """What the plugin reads of a pod: identity and times, its allocation record, node and
    scheduler, the containers that ask for our resources (in order, init containers apart),
    phase and the PodScheduled condition (bind order).

    Why: the plugin lists the node's pods at every Allocate and reconciliation round, and a pod of
    20,000 containers (kube-apiserver v1.28.7 stores one; ~3 MiB of JSON) parses to ~25 MB: ten
    of them bound to the node by ``spec.nodeName`` took a pod list to 242 MiB, the plugin's limit
    being 256 MiB. Leaving out containers that ask for none of our resources changes no GPU
    request: such a container adds nothing to the sum of app containers, and an init container's
    term (itself plus the sidecars before it, KEP-753) is then at most that sum."""
    if not isinstance(pod, dict):
        return {}
    m, spec, st = (pod.get(k) if isinstance(pod.get(k), dict) else {} for k in ("metadata", "spec", "status"))
    meta: dict[str, Any] = {k: m[k] for k in _META_KEPT if k in m}
    ann = m.get("annotations")
    if isinstance(ann, dict) and ALLOCATION_ANNOTATION in ann:
        meta["annotations"] = {ALLOCATION_ANNOTATION: ann[ALLOCATION_ANNOTATION]}
    slim_spec: dict[str, Any] = {k: spec[k] for k in _SPEC_KEPT if k in spec}
    for key in ("initContainers", "containers"):
        cs = spec.get(key)
        if isinstance(cs, list):
            slim_spec[key] = [c for c in map(_gpu_container, cs) if c is not None]
        elif key in spec:
            slim_spec[key] = cs          # not a list: refused by the request rule, as before
    status: dict[str, Any] = {k: st[k] for k in _STATUS_KEPT if k in st}
    conds = st.get("conditions")
    if isinstance(conds, list):
        status["conditions"] = [c for c in conds if isinstance(c, dict) and c.get("type") == "PodScheduled"]
    return {"metadata": meta, "spec": slim_spec, "status": status}


class PodLister:
    """The pods bound to one node (field selector ``spec.nodeName``), as JSON dicts holding what
    the plugin reads (:func:`pod_for_plugin`), listed in pages of at most ``page_bytes`` of JSON."""

    def __init__(self, core_api: Any, node: str, timeout_s: float = 5.0,
                 page_bytes: int = NODE_PODS_PAGE_BYTES) -> None:
        self.core_api, self.node, self.timeout_s = core_api, node, timeout_s
        self.page_bytes = page_bytes
        # Kept from list to list: the plugin lists at every Allocate, and a node holding giant pods
        # would otherwise pay the pages abandoned on the way down every time (measured with ten
        # 3 MiB pods: 6.4 s a list starting at 500, ~1.5 s starting where the last one ended).
        # Two lists at once (Allocate, reconciler) may both adjust it: it is only a hint.
        self._sizer = PageSizer(LIST_PAGE_SIZE, page_bytes)

    def _page(self, limit: int, cont: str) -> Any:
        paging: dict[str, Any] = {"limit": limit}
        if cont:
            paging["_continue"] = cont
        return self.core_api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}",
                                                         _preload_content=False, _request_timeout=self.timeout_s,
                                                         **paging)

    def pods(self) -> list[dict[str, Any]]:
        """Every pod bound to the node, from one snapshot, slim (:func:`pod_for_plugin`), listed by
        :func:`~stowage.kubelist.list_in_pages`: a page past ``page_bytes`` is asked for again with
        fewer pods; a list whose snapshot expired (410 Expired) starts again, a few times; any other
        error propagates (the caller refuses or skips, and asks again next time)."""
        out: list[dict[str, Any]] = []
        list_in_pages(self._page, self._sizer, f"pods of node {self.node}", "pods",
                      lambda items: out.extend(pod_for_plugin(p) for p in items), out.clear, log)
        return out


class InventoryPublisher:
    """Keeps ``stowage.io/gpu-inventory`` on the Node current; the latest value always wins."""

    def __init__(self, core_api: Any, node: str, retry_s: float = 2.0, max_retry_s: float = 60.0) -> None:
        self.core_api, self.node = core_api, node
        self.retry_s, self.max_retry_s = retry_s, max_retry_s
        self._cond = threading.Condition()
        self._pending: str | None = None
        self._stop = False
        self.published: str | None = None
        self._thread = threading.Thread(target=self._run, name="inventory-publisher", daemon=True)
        self._thread.start()

    def publish(self, value: str) -> None:
        with self._cond:
            self._pending = value
            self._cond.notify_all()

    def _patch(self, value: str) -> None:
        body = {"metadata": {"annotations": {INVENTORY_ANNOTATION: value}}}
        self.core_api.patch_node(self.node, body, _content_type="application/merge-patch+json", _request_timeout=10)

    def _run(self) -> None:
        delay = self.retry_s
        while True:
            with self._cond:
                while self._pending is None and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                value = self._pending
                self._pending = None
            try:
                self._patch(value)
                self.published = value
                delay = self.retry_s
                log.info("published the card inventory on node %s", self.node)
            except Exception as exc:  # API errors, connection errors: retry, never crash
                log.warning("could not publish the card inventory on node %s (%s); retrying in %.0fs",
                            self.node, exc, delay)
                with self._cond:
                    if self._pending is None:
                        self._pending = value
                    self._cond.wait(delay)
                delay = min(delay * 2, self.max_retry_s)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=5)
