"""Make a bind real on the API server: ONE write, the ``pods/binding`` subresource carrying the record.

Why one write: the API server copies a Binding's ``metadata.annotations`` onto the pod in the
same storage update that sets ``spec.nodeName`` (upstream ``BindingREST.setPodHostAndAnnotations``,
pkg/registry/core/pod/storage). So the ``stowage.io/allocation`` record and the binding exist
together or not at all: the device plugin on the node always finds the record of a pod bound
there, a restarted extender rebuilds it from the pod, and a failed bind leaves nothing to take
back. It is also half the API work of a record-then-bind sequence (one write, one watch event to
every watcher instead of two), which is what a burst of pods waits on (docs/extender.md, "bind").

- ``metadata.uid`` of the Binding is a precondition: the API server answers 409 Conflict when a
  pod of the same name was re-created, so a new pod never inherits an old choice.
- The python client raises ``ValueError`` when deserialising the Status the API server answers
  (it has no ``target``), so the call is made with ``_preload_content=False``.
- A Binding that fails in a way that leaves its outcome unknown (timeout, connection reset, any
  5xx), or that is refused because the pod is already bound (a repeated bind whose first answer
  was lost), is resolved by reading the pod back: bound to our node WITH our record means success.
  Bound there without it (someone else bound it) is a failure: the device plugin would find no
  cards. Read back unbound after an unknown outcome proves nothing: the API server may apply the
  Binding after answering (kube-apiserver's timeout filter answers 504 while the storage update
  goes on), so that is :class:`BindMayLand` and the service keeps the cards reserved for a while
  (``ExtenderService._hold_unknown``). Only a 4xx, 429 included, is a refusal that applied nothing.
- Who may send a Binding that carries the record is limited by the admission policy
  ``stowage-allocation-record`` (scheduler-config/admission-policy.yaml): the extender only.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Mapping
from urllib.parse import quote

import kubernetes.client
import orjson
from kubernetes.client.exceptions import ApiException

from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, RecordTrust

from .errors import BindError, BindOutcomeUnknown
from .kube import api_message, read_or_none
from .kube_objects import NOT_A_POD, object_meta
from .kube_post import DirectPoster, bound_client, direct_poster, whole_request

log = logging.getLogger("stowage.kube")


class BindMayLand(BindOutcomeUnknown):
    """The Binding was answered 5xx or its answer was lost, and the pod reads back unbound: it
    was not applied yet, but the API server may still apply it (with the record naming the
    cards), so the service keeps the reservation until the watch shows the pod bound or deleted,
    or still unbound once the Binding can no longer land (``ExtenderService._hold_unknown``)."""

MERGE_PATCH = "application/merge-patch+json"


def _pod_parts(pod: Any) -> tuple[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any]] | None:
    """(metadata, spec, annotations) of a pod as the API server reads it back, or None when the
    answer has not that shape (a JSON list or text, a field of another type: a proxy's answer, a
    peer that lies). Why: such an answer proves nothing about the pod; taken as a pod it raised
    AttributeError, or read as "not this pod" (a plain failure) after a 5xx, and the service then
    released cards a Binding still on its way could be given."""
    meta = object_meta(pod)
    if meta is None:
        return None
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping) or not isinstance(meta.get("uid", ""), str) \
            or not isinstance(spec.get("nodeName") or "", str):
        return None
    return meta, spec, annotations


def _drain(resp: Any) -> None:
    """Read the whole answer (we do not need it) so the connection can be reused safely."""
    try:
        resp.read()
    finally:
        resp.release_conn()


class KubeBinder:
    """Binds pods through the API server; the ``Binder`` of :mod:`extender.service` in Kubernetes mode."""

    def __init__(self, api_client: kubernetes.client.ApiClient, request_timeout_s: float = 10.0,
                 readback_attempts: int = 3, readback_delay_s: float = 0.2, trust: RecordTrust | None = None,
                 direct: bool = True) -> None:
        self.core = kubernetes.client.CoreV1Api(api_client)
        # The client's requests (read-backs; the Binding where the fast path does not apply) are
        # bounded whole, as the fast path's are: whole_request (extender/kube_post.py).
        bound_client(api_client)
        # The Binding's fast path (extender/kube_post.py); None: the client's own path.
        self.poster: DirectPoster | None = direct_poster(api_client) if direct else None
        self.trust = trust or RecordTrust()   # signs the records it writes when the cluster has a key
        self.timeout = request_timeout_s
        self.readback_attempts = max(1, readback_attempts)
        self.readback_delay_s = readback_delay_s

    def bind(self, namespace: str, name: str, uid: str, node: str, record: AllocationRecord | None) -> None:
        """Bind the pod to ``node`` with ``record`` on it (when not None), in one Binding; BindError on failure."""
        key = f"{namespace}/{name}"
        if not uid:
            pod = self._read(namespace, name)
            if pod is None:
                raise BindError(f"pod {key} not found")
            parts = _pod_parts(pod)
            if parts is None:
                raise BindError(f"pod {key} read from the API server {NOT_A_POD}")
            uid = str(parts[0].get("uid") or "")
        value = self.trust.encode(record, uid) if record is not None else None
        try:
            self._binding(namespace, name, uid, node, value)
            return
        except ApiException as exc:
            failure: BaseException = exc
        except Exception as exc:  # transport failure: the Binding may or may not have been applied
            failure = exc
        msg = f"binding {key} to {node} failed: {api_message(failure)}"
        pod, readable = self._read_back(namespace, name)
        if not readable:
            if isinstance(failure, ApiException) and failure.status and failure.status < 500:
                raise BindError(msg) from failure  # refused by the API server: nothing was applied
            raise BindOutcomeUnknown(msg + "; the pod could not be read back, so whether it was bound is unknown: "
                                     "its cards stay reserved until it is") from failure
        refused = isinstance(failure, ApiException) and bool(failure.status) and failure.status < 500
        parts = _pod_parts(pod)
        if pod is None or parts is None:   # (a read that is not a pod's shape is not readable: _read_back)
            raise BindError(f"pod {key} not found ({msg})") from failure
        meta, spec, annotations = parts
        if uid and meta.get("uid") != uid:
            raise BindError(f"pod {key} is not the pod with uid {uid} any more (re-created?): "
                            f"{api_message(failure)}") from failure
        bound_to = spec.get("nodeName")
        if bound_to == node:
            if value is None or annotations.get(ALLOCATION_ANNOTATION) == value:
                log.info("binding %s -> %s answered %s but the pod is bound there with our record: success",
                         key, node, api_message(failure))
                return
            raise BindError(f"{msg}; the pod is bound to {node} without this allocation record (bound by "
                            "someone else?)") from failure
        if not bound_to and not refused:
            raise BindMayLand(msg + "; the pod reads unbound, but the API server may still apply the Binding: its "
                              "cards stay reserved until it is seen bound, or still unbound once it cannot be") \
                from failure
        raise BindError(msg) from failure

    # ------------------------------------------------------------------ steps
    def _binding(self, namespace: str, name: str, uid: str, node: str, record_value: str | None) -> None:
        """Create the pod's Binding. One document for both paths: the fast path posts its bytes,
        the client's path (kept where the fast path does not apply) sends it as a V1Binding."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if record_value is not None:
            meta["annotations"] = {ALLOCATION_ANNOTATION: record_value}
        doc = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        if self.poster is not None:
            path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/binding"
            self.poster.post(path, orjson.dumps(doc), self.timeout)
            return
        with whole_request(self.timeout):
            _drain(self.core.create_namespaced_pod_binding(name, namespace, kubernetes.client.V1Binding.from_dict(doc),
                                                           _preload_content=False, _request_timeout=self.timeout))

    def _read(self, namespace: str, name: str) -> dict | None:
        with whole_request(self.timeout):
            return read_or_none(self.core.read_namespaced_pod, name, namespace, _request_timeout=self.timeout)

    def _read_back(self, namespace: str, name: str) -> tuple[dict | None, bool]:
        """(the pod or None when it is gone, True) or (None, False) when it cannot be read, or
        what was read is not a pod's shape (:func:`_pod_parts`: it tells nothing either)."""
        for attempt in range(self.readback_attempts):
            try:
                pod = self._read(namespace, name)
            except Exception:
                pass
            else:
                if pod is None or _pod_parts(pod) is not None:
                    return pod, True
                log.warning("pod %s/%s read back after a failed Binding is not a pod (%s): it tells nothing",
                            namespace, name, type(pod).__name__)
            time.sleep(self.readback_delay_s * (attempt + 1))
        return None, False
