"""Make a bind real on the API server: record the allocation on the pod, then create the Binding.

Order and why:
1. PATCH the pod's ``stowage.io/allocation`` annotation, with ``metadata.uid`` in the merge patch
   as a precondition (the API server answers 409 Conflict when a pod of the same name was
   re-created, so a new pod never inherits an old choice). The record exists BEFORE the pod is
   bound, so the device plugin on the node always finds it, and a restarted extender rebuilds it.
2. POST the ``pods/binding`` subresource (target Node, ``metadata.uid`` precondition too). The
   python client raises ``ValueError`` when deserialising the Status the API server answers
   (it has no ``target``), so the call is made with ``_preload_content=False``.
3. If the Binding fails, remove the record again with a JSON patch that first *tests* the pod's
   uid and that the annotation still holds exactly our record (so we never delete a newer one),
   then raise :class:`~extender.errors.BindError` with the API server's message.
   A Binding that fails in a way that leaves its outcome unknown (timeout, connection reset) is
   resolved by reading the pod back: bound to our node means success.
No half-recorded allocation is left behind: either the pod is bound with its record, or it has
no record (or, if even the pod cannot be read back, the error says so and the record is kept:
keeping cards reserved for a pod that might be running is the safe side).
"""
from __future__ import annotations

import logging
import time
from typing import Any

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, RecordTrust

from .errors import BindError
from .kube import api_message, read_json

log = logging.getLogger("stowage.kube")

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
_ANNOTATION_PTR = "/metadata/annotations/" + ALLOCATION_ANNOTATION.replace("~", "~0").replace("/", "~1")


def _drain(resp: Any) -> None:
    """Read the whole answer (we do not need it) so the connection can be reused safely."""
    try:
        resp.read()
    finally:
        resp.release_conn()


class KubeBinder:
    """Binds pods through the API server; the ``Binder`` of :mod:`extender.service` in Kubernetes mode."""

    def __init__(self, api_client: kubernetes.client.ApiClient, request_timeout_s: float = 10.0,
                 readback_attempts: int = 3, readback_delay_s: float = 0.2, trust: RecordTrust | None = None) -> None:
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.trust = trust or RecordTrust()   # signs the records it writes when the cluster has a key
        self.timeout = request_timeout_s
        self.readback_attempts = max(1, readback_attempts)
        self.readback_delay_s = readback_delay_s

    def bind(self, namespace: str, name: str, uid: str, node: str, record: AllocationRecord | None) -> None:
        """Record ``record`` on the pod (when not None) and bind it to ``node``; BindError on failure."""
        key = f"{namespace}/{name}"
        if not uid:
            pod = self._read(namespace, name)
            if pod is None:
                raise BindError(f"pod {key} not found")
            uid = str((pod.get("metadata") or {}).get("uid") or "")
        value = self.trust.encode(record, uid) if record is not None else None
        if value is not None:
            self._record(namespace, name, uid, value)
        try:
            self._binding(namespace, name, uid, node)
        except ApiException as exc:
            if self._bound_to(namespace, name, uid, node):
                log.info("binding %s -> %s answered %s but the pod is bound there: success", key, node, exc.status)
                return
            msg = f"binding {key} to {node} failed: {api_message(exc)}"
            self._rollback(namespace, name, uid, value, msg)
            raise BindError(msg) from exc
        except Exception as exc:  # transport failure: the Binding may or may not have been created
            outcome = self._bound_to(namespace, name, uid, node)
            if outcome:
                log.info("binding %s -> %s: lost the answer (%s) but the pod is bound there: success", key, node, exc)
                return
            msg = f"binding {key} to {node} failed: {api_message(exc)}"
            if outcome is None:
                raise BindError(msg + "; the pod could not be read back, so its allocation record is kept "
                                "(the cards stay reserved until the pod's fate is known)") from exc
            self._rollback(namespace, name, uid, value, msg)
            raise BindError(msg) from exc

    # ------------------------------------------------------------------ steps
    def _record(self, namespace: str, name: str, uid: str, value: str) -> None:
        body = {"metadata": {"uid": uid, "annotations": {ALLOCATION_ANNOTATION: value}}}
        try:
            _drain(self.core.patch_namespaced_pod(name, namespace, body, _content_type=MERGE_PATCH,
                                                  _preload_content=False, _request_timeout=self.timeout))
        except ApiException as exc:
            if exc.status == 409:
                raise BindError(f"pod {namespace}/{name} is not the pod with uid {uid} any more (re-created?): "
                                f"{api_message(exc)}") from exc
            raise BindError(f"cannot record the allocation on pod {namespace}/{name}: {api_message(exc)}") from exc
        except Exception as exc:  # the patch may have been applied: take it back if it was
            msg = f"cannot record the allocation on pod {namespace}/{name}: {api_message(exc)}"
            self._rollback(namespace, name, uid, value, msg)
            raise BindError(msg) from exc

    def _binding(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = kubernetes.client.V1Binding(
            metadata=kubernetes.client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=kubernetes.client.V1ObjectReference(api_version="v1", kind="Node", name=node))
        _drain(self.core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False,
                                                       _request_timeout=self.timeout))

    def _rollback(self, namespace: str, name: str, uid: str, value: str | None, why: str) -> None:
        """Remove our record if (and only if) the pod is still ours and still carries exactly it."""
        if value is None:
            return
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": uid},
                                     {"op": "test", "path": _ANNOTATION_PTR, "value": value},
                                     {"op": "remove", "path": _ANNOTATION_PTR}]
        last: BaseException | None = None
        for attempt in range(self.readback_attempts):
            try:
                _drain(self.core.patch_namespaced_pod(name, namespace, ops, _content_type=JSON_PATCH,
                                                      _preload_content=False, _request_timeout=self.timeout))
                log.info("removed the allocation record of %s/%s after: %s", namespace, name, why)
                return
            except ApiException as exc:
                if exc.status in (404, 409, 422):  # pod gone, or the record is not ours / not there
                    return
                last = exc
            except Exception as exc:
                last = exc
            time.sleep(self.readback_delay_s * (attempt + 1))
        log.error("could not remove the allocation record of %s/%s after a failed bind (%s): %s. The cards stay "
                  "reserved for it until it is bound again or deleted", namespace, name, why,
                  api_message(last) if last else "?")

    def _read(self, namespace: str, name: str) -> dict | None:
        try:
            resp = self.core.read_namespaced_pod(name, namespace, _preload_content=False,
                                                 _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return read_json(resp)

    def _bound_to(self, namespace: str, name: str, uid: str, node: str) -> bool | None:
        """Is this very pod bound to ``node``? None when it cannot be read back."""
        for attempt in range(self.readback_attempts):
            try:
                pod = self._read(namespace, name)
            except Exception:
                time.sleep(self.readback_delay_s * (attempt + 1))
                continue
            if pod is None:
                return False
            meta = pod.get("metadata") or {}
            spec = pod.get("spec") or {}
            return (not uid or meta.get("uid") == uid) and spec.get("nodeName") == node
        return None
