"""The plugin's Kubernetes API side: list the pods bound to this node, publish the card inventory.

Uses the official ``kubernetes`` client. Pods are read as raw JSON (camelCase, as the shared
``stowage`` helpers expect). The inventory is written with a JSON merge patch that touches only
our annotation, from a background thread that retries with backoff, so a slow or unreachable API
server never delays a kubelet call.
"""
from __future__ import annotations

import json
import logging
import threading
from typing import Any

from stowage.inventory import INVENTORY_ANNOTATION

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


class PodLister:
    """The pods bound to one node (field selector ``spec.nodeName``), as JSON dicts."""

    def __init__(self, core_api: Any, node: str, timeout_s: float = 5.0) -> None:
        self.core_api, self.node, self.timeout_s = core_api, node, timeout_s

    def pods(self) -> list[dict[str, Any]]:
        resp = self.core_api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}",
                                                         _preload_content=False, _request_timeout=self.timeout_s)
        return list(json.loads(resp.data).get("items") or [])


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
