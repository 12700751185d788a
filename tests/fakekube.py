"""A small Kubernetes API server for tests: real HTTP on loopback, enough for the real `kubernetes` client.

Why: our code talks to the API server through the official client (REST calls, watch
streams, patches, the ``pods/binding`` subresource). Faking at the HTTP layer lets that client
code run for real; only the API server itself is fake.

Usage::

    from fakekube import FakeKube, make_node, make_pod   # pytest puts tests/ on sys.path

    with FakeKube() as kube:                     # threaded server on 127.0.0.1:<free port>
        kube.create_node(make_node("n1", gpus=4))
        kube.create_pod(make_pod("p1", gpus=1))  # uid/resourceVersion/creationTimestamp filled in
        api = kube.api_client()                  # kubernetes.client.ApiClient pointed at it
        core = kubernetes.client.CoreV1Api(api)
        core.list_node()
        kube.patch_pod("default", "p1", {"metadata": {"annotations": {"a": "b"}}})  # emits MODIFIED
        kube.delete_pod("default", "p1")                                           # emits DELETED
        kube.expire_watches()        # compaction: watches from older resourceVersions get 410 Gone
        kube.expire_lists()          # paged lists under way: their next page gets 410 Expired
        kube.on_list_page = lambda kind, page: ...   # called after each list page (0: the first)
        kube.fail_next(2, status=500)  # the next 2 requests (optionally matching a path) fail
        kube.drop_watches()          # cut every open watch stream
        kube.end_watches("pods")     # every new pods watch ends at once, cleanly, without an event
        kube.raw_watches("pods", [b'{"type": "BOOKMARK", ...}\n'])  # every new pods watch sends these bytes first
        kube.clear_faults()          # forget pending injected failures
        kube.delete_pod("default", "p1", emit=False)  # a change no watch will see (then expire_watches())
        kube.requests                # [(method, path, query dict)] for assertions
        kube.list_requests("pods")   # the query of each pods list request (limit, continue)
        kube.bodies                  # the JSON body of each POST/PATCH/PUT, in order
        kube.wait_for(lambda: ...)   # poll helper for tests (no timed assertions)

Endpoints (JSON, core/v1 only):
- ``GET /api/v1/{nodes,pods}`` and ``GET /api/v1/namespaces/{ns}/pods``: list (``kind: NodeList`` /
  ``PodList`` with ``metadata.resourceVersion``); simple ``fieldSelector`` (``metadata.name``,
  ``metadata.namespace``, ``spec.nodeName``, ``status.phase`` with ``=``/``==``/``!=``) and
  equality ``labelSelector``.
- Same paths with ``?watch=true``: a chunked stream of newline-delimited watch events from
  ``resourceVersion`` (absent, "" or "0": synthetic ADDED events for the current objects first),
  ``allowWatchBookmarks`` (BOOKMARK events on :meth:`FakeKube.bookmark` and every
  ``bookmark_interval`` seconds), ``timeoutSeconds`` (the stream ends cleanly). A resourceVersion
  older than the last :meth:`FakeKube.expire_watches` gets 410 Gone: as an ``ERROR`` event
  (``gone_mode="event"``, what a real API server does) or an HTTP 410 (``gone_mode="status"``).
- ``GET/PATCH/DELETE /api/v1/namespaces/{ns}/pods/{name}``, ``POST /api/v1/namespaces/{ns}/pods``;
  ``GET/PATCH /api/v1/nodes/{name}`` (and ``/status``), ``POST /api/v1/nodes``.
  PATCH: ``application/merge-patch+json``, ``application/strategic-merge-patch+json`` (applied as a
  merge patch: right for maps such as annotations and labels, lists are replaced) and
  ``application/json-patch+json`` (add/replace/remove/test). ``metadata.uid`` in a merge patch is a
  precondition (409 Conflict when it differs), ``metadata.resourceVersion`` too, as in Kubernetes.
- ``POST /api/v1/namespaces/{ns}/pods/{name}/binding``: sets ``spec.nodeName`` (and copies the
  Binding's annotations); 409 when already bound or the Binding's ``metadata.uid`` differs, 404
  when the pod is missing. Answers a Status object, as the real API server does.
  :meth:`FakeKube.hold_bindings` answers the next ones with an error (504, 500) without applying
  them yet, and :meth:`FakeKube.apply_held` applies them later: a write the API server completes
  after its client was told it failed (kube-apiserver's timeout filter answers 504 while the
  storage update goes on; etcd's "request timed out" is a 500 whose proposal may still commit).
- ``POST .../events`` (core/v1 events): accepted and recorded in :attr:`FakeKube.events_posted`.
- ``POST /api/v1/namespaces/{ns}/configmaps``, ``GET/PUT/DELETE .../configmaps/{name}``: PUT
  replaces the object, with ``metadata.resourceVersion`` as precondition (409 Conflict).
Errors are ``kind: Status`` objects with the matching ``code`` and ``reason``.
"""
from __future__ import annotations

import base64
import copy
import itertools
import json
import re
import socket
import threading
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

Obj = dict[str, Any]
KINDS = ("nodes", "pods", "configmaps")
# Paged-list snapshots the fake keeps (the newest); kube-apiserver keeps every one until etcd compacts.
SNAPSHOTS_KEPT = 64
# kube-apiserver's message for a list page whose snapshot etcd has compacted (410, reason Expired).
CONTINUE_EXPIRED = ("The provided continue parameter is too old to display a consistent list result. You can start "
                    "a new list without the continue parameter, or use the continue token in this response to "
                    "retrieve the remainder of the results. Continuing with the provided token results in an "
                    "inconsistent list - objects that were created, modified, or deleted between the time the "
                    "first chunk was returned and now may show up in the list.")


class ApiError(Exception):
    """An error answer: HTTP status + Kubernetes Status reason."""

    def __init__(self, code: int, reason: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.headers = headers or {}


def status_obj(code: int, reason: str, message: str) -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (null deletes a key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"json patch path {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: Obj, ops: list[Obj]) -> Obj:
    """RFC 6902 subset: add, replace, remove, test."""
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "path" not in op:
            raise ApiError(422, "Invalid", f"bad json patch operation {op!r}")
        parts = _pointer(op["path"])
        if not parts:
            raise ApiError(422, "Invalid", "json patch on the whole object is not supported")
        parent: Any = doc
        for p in parts[:-1]:
            try:
                parent = parent[int(p)] if isinstance(parent, list) else parent[p]
            except (KeyError, IndexError, ValueError) as exc:
                raise ApiError(422, "Invalid", f"json patch path {op['path']!r} does not exist") from exc
        last, kind = parts[-1], op.get("op")
        if kind == "test":
            cur = parent.get(last) if isinstance(parent, dict) else parent[int(last)]
            if cur != op.get("value"):
                raise ApiError(422, "Invalid", f"json patch test failed at {op['path']!r}")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op.get("value"))
                elif kind == "add":
                    parent.insert(int(last), op.get("value"))
                else:
                    parent[int(last)] = op.get("value")
            else:
                if kind == "replace" and last not in parent:
                    raise ApiError(422, "Invalid", f"json patch replace: {op['path']!r} does not exist")
                parent[last] = op.get("value")
        elif kind == "remove":
            try:
                del parent[int(last) if isinstance(parent, list) else last]
            except (KeyError, IndexError, ValueError) as exc:
                raise ApiError(422, "Invalid", f"json patch remove: {op['path']!r} does not exist") from exc
        else:
            raise ApiError(422, "Invalid", f"json patch op {kind!r} is not supported")
    return doc


def _field(obj: Obj, path: str) -> str:
    cur: Any = obj
    for p in path.split("."):
        cur = cur.get(p) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def _selector_matches(obj: Obj, field_sel: str | None, label_sel: str | None) -> bool:
    for term in filter(None, (field_sel or "").split(",")):
        m = re.fullmatch(r"\s*([\w.]+)\s*(==|!=|=)\s*(.*?)\s*", term)
        if not m:
            raise ApiError(400, "BadRequest", f"unsupported fieldSelector term {term!r}")
        key, op, val = m.groups()
        if (_field(obj, key) == val) != (op != "!="):
            return False
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (label_sel or "").split(",")):
        m = re.fullmatch(r"\s*([\w./-]+)\s*(==|!=|=)\s*(.*?)\s*", term)
        if not m:
            if labels.get(term.strip()) is None:
                return False
            continue
        key, op, val = m.groups()
        if (labels.get(key) == val) != (op != "!="):
            return False
    return True


@dataclass
class _Event:
    rv: int
    kind: str
    type: str
    obj: Obj


@dataclass
class _Fault:
    remaining: int
    status: int
    path_re: re.Pattern | None
    method: str | None
    reason: str | None = None   # the Status's reason (None: InternalError for 5xx, else Injected)
    headers: dict[str, str] | None = None  # sent with the error (e.g. Retry-After)


def kubeconfig_file(directory: Any, server: str) -> str:
    """Write a kubeconfig for ``server`` (no auth) into ``directory``; return its path. Lets the
    code under test go through the real kubeconfig loading, as a user's ``--kubeconfig`` does."""
    import os

    import yaml

    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
           "clusters": [{"name": "fake", "cluster": {"server": server}}],
           "users": [{"name": "u", "user": {"token": "t"}}],
           "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}]}
    path = os.path.join(str(directory), "kubeconfig")
    with open(path, "w") as f:
        f.write(yaml.safe_dump(doc))
    return path


@dataclass
class FakeKube:
    """The fake API server. Thread-safe; every mutation (HTTP or test hook) emits watch events."""

    gone_mode: str = "event"          # "event" (ERROR event, like a real API server) or "status" (HTTP 410)
    bookmark_interval: float = 1.0
    host: str = "127.0.0.1"
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)   # the JSON body of each POST/PATCH/PUT, as sent
    events_posted: list[Obj] = field(default_factory=list)
    # Called after each list page is read, outside the lock, with the kind and the page's number
    # in its list (0: the first): a test changes the cluster, or expires the list, between pages.
    on_list_page: Callable[[str, int], None] | None = None

    def __post_init__(self) -> None:
        self._cond = threading.Condition()
        self._store: dict[str, dict[str, Obj]] = {k: {} for k in KINDS}
        self._events: list[_Event] = []
        self._rv = itertools.count(100)
        self._last_rv = next(self._rv)
        self._compacted_rv = 0
        self._snapshots: dict[int, tuple[int, list[Obj]]] = {}   # paged lists under way: id -> (rv, items)
        self._snapshot_ids = itertools.count(1)
        self._drop_gen = 0
        self._faults: list[_Fault] = []
        self._watch_errors: dict[str, Obj] = {}   # kind -> Status every new watch of it ends with
        self._watch_ends: set[str] = set()        # kinds whose new watches end at once, cleanly, with no event
        self._watch_raw: dict[str, tuple[list[bytes], bool]] = {}   # kind -> (raw chunks first, end after them)
        self._watch_trickle: dict[str, float] = {}   # kind -> seconds between the bytes of a line that never ends
        self._closed = False
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._watch_socks: dict[socket.socket, str] = {}   # open watch stream -> its kind
        self._kind_drop_gen: dict[str, int] = {}           # drop_watches(kind) of one kind only
        self._holds: list[tuple[int, str]] = []            # Bindings to answer (status, reason) unapplied
        self.held: list[tuple[str, str, Obj]] = []         # (namespace, name, body) of those, not applied yet

    # ------------------------------------------------------------- lifecycle
    def start(self) -> "FakeKube":
        fake = self

        class Handler(_Handler):
            kube = fake

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fakekube", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.drop_watches()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> "FakeKube":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "FakeKube not started"
        return f"http://{self.host}:{self._server.server_address[1]}"

    def api_client(self):
        """A real ``kubernetes.client.ApiClient`` configured for this server (no auth)."""
        import kubernetes.client

        cfg = kubernetes.client.Configuration()
        cfg.host = self.url
        cfg.retries = 0  # let our code see errors; urllib3 retries would hide injected faults
        return kubernetes.client.ApiClient(cfg)

    # ------------------------------------------------------------ test hooks
    @staticmethod
    def key(namespace: str | None, name: str) -> str:
        return f"{namespace}/{name}" if namespace else name

    def _emit(self, kind: str, type_: str, obj: Obj, emit: bool = True) -> None:
        rv = next(self._rv)
        self._last_rv = rv
        obj["metadata"]["resourceVersion"] = str(rv)
        if emit:
            self._events.append(_Event(rv, kind, type_, copy.deepcopy(obj)))
        self._cond.notify_all()

    def create(self, kind: str, obj: Obj, emit: bool = True) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "metadata.name is required")
        if kind == "pods":
            meta.setdefault("namespace", "default")
            obj.setdefault("kind", "Pod")
            obj.setdefault("spec", {}).setdefault("containers", [])
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        elif kind == "configmaps":
            meta.setdefault("namespace", "default")
            obj.setdefault("kind", "ConfigMap")
        else:
            obj.setdefault("kind", "Node")
        obj.setdefault("apiVersion", "v1")
        meta.setdefault("uid", str(uuidlib.uuid4()))
        meta.setdefault("creationTimestamp", now_iso())
        key = self.key(meta.get("namespace"), meta["name"])
        with self._cond:
            if key in self._store[kind]:
                raise ApiError(409, "AlreadyExists", f'{kind} "{meta["name"]}" already exists')
            self._store[kind][key] = obj
            self._emit(kind, "ADDED", obj, emit)
            return copy.deepcopy(obj)

    def create_node(self, node: Obj, emit: bool = True) -> Obj:
        return self.create("nodes", node, emit)

    def create_pod(self, pod: Obj, emit: bool = True) -> Obj:
        return self.create("pods", pod, emit)

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        with self._cond:
            obj = self._store[kind].get(self.key(namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        return self.get("pods", namespace, name)

    def get_node(self, name: str) -> Obj | None:
        return self.get("nodes", None, name)

    def update(self, kind: str, namespace: str | None, name: str, fn: Callable[[Obj], Obj | None],
               emit: bool = True) -> Obj:
        """Change an object (``fn`` edits it or returns a replacement); emits MODIFIED unless ``emit`` is False."""
        with self._cond:
            cur = self._store[kind].get(self.key(namespace, name))
            if cur is None:
                raise ApiError(404, "NotFound", f'{kind[:-1]} "{name}" not found')
            new = copy.deepcopy(cur)
            out = fn(new)
            new = out if out is not None else new
            new.setdefault("metadata", {})
            for keep in ("uid", "name", "namespace", "creationTimestamp"):
                if keep in cur["metadata"]:
                    new["metadata"][keep] = cur["metadata"][keep]
            self._store[kind][self.key(namespace, name)] = new
            self._emit(kind, "MODIFIED", new, emit)
            return copy.deepcopy(new)

    def patch_pod(self, namespace: str, name: str, patch: Obj, emit: bool = True) -> Obj:
        """Merge-patch a pod (``None`` values delete keys)."""
        return self.update("pods", namespace, name, lambda o: merge_patch(o, patch), emit)

    def patch_node(self, name: str, patch: Obj, emit: bool = True) -> Obj:
        return self.update("nodes", None, name, lambda o: merge_patch(o, patch), emit)

    def delete(self, kind: str, namespace: str | None, name: str, emit: bool = True) -> Obj:
        with self._cond:
            cur = self._store[kind].pop(self.key(namespace, name), None)
            if cur is None:
                raise ApiError(404, "NotFound", f'{kind[:-1]} "{name}" not found')
            self._emit(kind, "DELETED", cur, emit)
            return copy.deepcopy(cur)

    def delete_pod(self, namespace: str, name: str, emit: bool = True) -> Obj:
        return self.delete("pods", namespace, name, emit)

    def delete_node(self, name: str, emit: bool = True) -> Obj:
        return self.delete("nodes", None, name, emit)

    def objects(self, kind: str) -> list[Obj]:
        with self._cond:
            return [copy.deepcopy(o) for o in self._store[kind].values()]

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._last_rv

    def expire_watches(self) -> None:
        """Compact history: every watch from a resourceVersion up to now gets 410 Gone."""
        with self._cond:
            self._last_rv = self._compacted_rv = next(self._rv)  # like an etcd compaction at a new revision
            self._events.clear()
            self._snapshots.clear()  # and paged lists under way lose their snapshot
            self._drop_gen += 1  # open streams end with the 410 too
            self._cond.notify_all()

    def expire_lists(self) -> None:
        """Every paged list under way loses its snapshot (as an etcd compaction past its revision
        does, after ~5 minutes): its next page gets 410 ``Expired``. Watches are not affected
        (:meth:`expire_watches` expires both)."""
        with self._cond:
            self._snapshots.clear()

    def list_requests(self, kind: str) -> list[dict[str, str]]:
        """The query of each list request (not watch) of ``kind`` (``nodes``/``pods``), in order."""
        return [q for m, p, q in list(self.requests)
                if m == "GET" and p.endswith("/" + kind) and q.get("watch") not in ("true", "1")]

    def drop_watches(self, kind: str | None = None) -> None:
        """Cut every open watch stream abruptly (as a dying API server or load balancer would), or
        only those of ``kind`` ("nodes", "pods"): a test of one stream whose hand-moved clock must
        not leave the other stream's reopening to chance."""
        with self._cond:
            if kind is None:
                self._drop_gen += 1
            else:
                self._kind_drop_gen[kind] = self._kind_drop_gen.get(kind, 0) + 1
            socks = [s for s, k in self._watch_socks.items() if kind is None or k == kind]
            self._cond.notify_all()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def bookmark(self) -> None:
        """Make every open watch that allows bookmarks send one now."""
        with self._cond:
            self._bookmark_gen = getattr(self, "_bookmark_gen", 0) + 1
            self._cond.notify_all()

    def fail_next(self, n: int = 1, status: int = 500, path: str | None = None, method: str | None = None,
                  reason: str | None = None, headers: dict[str, str] | None = None) -> None:
        """The next ``n`` requests whose path matches the regex ``path`` (and ``method``) fail with
        ``status``, and a Status of that ``reason`` (e.g. 410 ``Gone``, not ``Expired``), sent with
        ``headers`` (e.g. ``Retry-After``, as kube-apiserver's priority and fairness does with 429)."""
        with self._cond:
            self._faults.append(_Fault(n, status, re.compile(path) if path else None, method, reason, headers))

    def hold_bindings(self, n: int = 1, status: int = 504, reason: str = "Timeout") -> None:
        """The next ``n`` Bindings are answered ``status`` (a Status of ``reason``) and NOT applied
        yet: kept in :attr:`held` until :meth:`apply_held`, as a write the API server completes after
        answering its client that it failed."""
        with self._cond:
            self._holds.extend([(status, reason)] * n)

    def apply_held(self) -> list[Obj]:
        """Apply the held Bindings now, in order (each as the API server would have: 409 if the pod
        was bound meanwhile, 404 if gone); the answers they would have had, Status or error."""
        with self._cond:
            held, self.held = self.held, []
        answers = []
        for namespace, name, body in held:
            try:
                answers.append(self._bind(namespace, name, body))
            except ApiError as e:
                answers.append(status_obj(e.code, e.reason, e.message))
        return answers

    def _take_hold(self, namespace: str, name: str, body: Any) -> tuple[int, str] | None:
        with self._cond:
            if not self._holds:
                return None
            self.held.append((namespace, name, copy.deepcopy(body)))
            return self._holds.pop(0)

    def error_watches(self, kind: str, code: int = 500, reason: str = "InternalError",
                      message: str = "Internal error occurred: unable to transform key") -> None:
        """Every new watch of ``kind`` is accepted (HTTP 200), then ends at once with an ``ERROR``
        event carrying this Status (as a real API server does for an object in etcd it cannot
        decode: resuming from the same resourceVersion hits it again). Until :meth:`clear_faults`."""
        with self._cond:
            self._watch_errors[kind] = status_obj(code, reason, message)

    def end_watches(self, kind: str) -> None:
        """Every new watch of ``kind`` is accepted (HTTP 200), then ends cleanly at once without an
        event (as a misbehaving API server or proxy in front of it may do, every time). Until
        :meth:`clear_faults`."""
        with self._cond:
            self._watch_ends.add(kind)

    def raw_watches(self, kind: str, chunks: list[bytes], end: bool = True) -> None:
        """Every new watch of ``kind`` is accepted (HTTP 200) and first sends ``chunks`` as they are
        (each one HTTP chunk: anything, not only well-formed events: a peer that is not a real API
        server), then ends cleanly (``end``) or goes on as a normal watch from its resourceVersion.
        Until :meth:`clear_faults`."""
        with self._cond:
            self._watch_raw[kind] = (list(chunks), end)

    def trickle_watches(self, kind: str, every_s: float = 0.05) -> None:
        """Every new watch of ``kind`` is accepted (HTTP 200), then sends one space every
        ``every_s``, never a newline, whatever its ``timeoutSeconds`` (a peer that keeps a
        connection alive with bytes that are no event: each read succeeds, so no read timeout
        ever fires), until the client closes it. Until :meth:`clear_faults` (then the watches
        open meanwhile end cleanly)."""
        with self._cond:
            self._watch_trickle[kind] = every_s

    def clear_faults(self) -> None:
        with self._cond:
            self._watch_trickle.clear()
            self._faults.clear()
            self._watch_errors.clear()
            self._watch_ends.clear()
            self._watch_raw.clear()
            self._holds.clear()

    def watch_count(self, kind: str | None = None) -> int:
        """How many watch requests were made (optionally for one kind)."""
        return sum(1 for m, p, q in list(self.requests)
                   if q.get("watch") in ("true", "1") and (kind is None or p.endswith("/" + kind)))

    @staticmethod
    def wait_for(pred: Callable[[], Any], timeout: float = 20.0, interval: float = 0.01) -> Any:
        """Poll until ``pred()`` is truthy; raises AssertionError after ``timeout`` (a hang guard only)."""
        deadline = time.monotonic() + timeout
        while True:
            v = pred()
            if v:
                return v
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached")
            time.sleep(interval)

    # ------------------------------------------------------------ internals
    def _take_fault(self, method: str, path: str) -> _Fault | None:
        with self._cond:
            for f in self._faults:
                if f.remaining > 0 and (f.path_re is None or f.path_re.search(path)) \
                        and (f.method is None or f.method == method):
                    f.remaining -= 1
                    if f.remaining == 0:
                        self._faults.remove(f)
                    return f
        return None

    def _list(self, kind: str, namespace: str | None, q: dict[str, str]) -> Obj:
        """A list, or one page of it (``limit``, ``continue``), as kube-apiserver serves it from
        etcd: items in key order (namespace/name), every page of one list from the snapshot its
        first page was read at (same ``resourceVersion``), ``metadata.continue`` (opaque) and
        ``metadata.remainingItemCount`` while more remain. A continue token issued before the
        last :meth:`expire_watches` or :meth:`expire_lists` gets 410 ``Expired``, as a real one
        does once etcd compacted its revision. :attr:`on_list_page` is called after each page."""
        try:
            limit = int(q.get("limit") or 0)
        except ValueError:
            raise ApiError(400, "BadRequest", f"invalid limit {q.get('limit')!r}") from None
        if limit < 0:
            raise ApiError(400, "BadRequest", f"limit must be non-negative, not {limit}")
        cont = q.get("continue") or ""
        which = [kind, namespace, q.get("fieldSelector"), q.get("labelSelector")]
        with self._cond:
            if cont:
                if q.get("resourceVersion"):
                    raise ApiError(400, "BadRequest", "specifying resource version is not allowed when using continue")
                try:
                    tok = json.loads(base64.b64decode(cont.encode(), validate=True))
                    snap_id, begin, page_no = int(tok["id"]), int(tok["next"]), int(tok["page"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise ApiError(400, "BadRequest", f"continue key is not valid: {exc}") from None
                if tok.get("list") != which:
                    raise ApiError(400, "BadRequest", "the continue token was made for another list")
                snap = self._snapshots.get(snap_id)
                if snap is None:
                    raise ApiError(410, "Expired", CONTINUE_EXPIRED)
                rv, items = snap
            else:
                rv = self._last_rv
                items = [o for _, o in sorted(self._store[kind].items())
                         if (namespace is None or o["metadata"].get("namespace") == namespace)
                         and _selector_matches(o, q.get("fieldSelector"), q.get("labelSelector"))]
                snap_id, begin, page_no = 0, 0, 0
            end = begin + limit if limit else len(items)
            page = [copy.deepcopy(o) for o in items[begin:end]]
            lmeta: Obj = {"resourceVersion": str(rv)}
            if end < len(items):
                if not snap_id:
                    # Stored objects are never changed in place (a change stores a new one): the
                    # snapshot holds references to them, as etcd serves an older revision.
                    snap_id = next(self._snapshot_ids)
                    self._snapshots[snap_id] = (rv, items)
                lmeta["continue"] = base64.b64encode(json.dumps(
                    {"id": snap_id, "next": end, "page": page_no + 1, "list": which}).encode()).decode()
                lmeta["remainingItemCount"] = len(items) - end
                # A token stays good until compaction, the last page's included (a client may ask
                # for a page again, e.g. with a smaller limit, as kube-apiserver then serves it);
                # the fake keeps the newest snapshots only.
                while len(self._snapshots) > SNAPSHOTS_KEPT:
                    self._snapshots.pop(min(self._snapshots))
        if self.on_list_page is not None:
            self.on_list_page(kind, page_no)
        return {"kind": "NodeList" if kind == "nodes" else "PodList", "apiVersion": "v1",
                "metadata": lmeta, "items": page}

    def _patch(self, kind: str, namespace: str | None, name: str, ctype: str, body: Any) -> Obj:
        ctype = ctype.split(";")[0].strip()
        with self._cond:
            cur = self._store[kind].get(self.key(namespace, name))
            if cur is None:
                raise ApiError(404, "NotFound", f'{kind[:-1]} "{name}" not found')
            if ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
                pmeta = body.get("metadata") or {}
                if pmeta.get("uid") and pmeta["uid"] != cur["metadata"].get("uid"):
                    raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on {kind} \"{name}\": "
                                   f"Precondition failed: UID in precondition: {pmeta['uid']}, "
                                   f"UID in object meta: {cur['metadata'].get('uid')}")
                if pmeta.get("resourceVersion") and pmeta["resourceVersion"] != cur["metadata"].get("resourceVersion"):
                    raise ApiError(409, "Conflict", f"Operation cannot be fulfilled on {kind} \"{name}\": "
                                   "the object has been modified; please apply your changes to the latest version and try again")
                new = merge_patch(copy.deepcopy(cur), body)   # never the stored object's parts: a list snapshot holds it
            elif ctype == "application/json-patch+json":
                if not isinstance(body, list):
                    raise ApiError(400, "BadRequest", "a json patch must be a list of operations")
                new = json_patch(cur, body)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"unsupported patch content type {ctype!r}")
            for keep in ("uid", "name", "namespace", "creationTimestamp"):
                if keep in cur["metadata"]:
                    new.setdefault("metadata", {})[keep] = cur["metadata"][keep]
            self._store[kind][self.key(namespace, name)] = new
            self._emit(kind, "MODIFIED", new)
            return copy.deepcopy(new)

    def _replace(self, kind: str, namespace: str, name: str, body: Any) -> Obj:
        """PUT: the whole object; a ``metadata.resourceVersion`` in it is a precondition (409
        Conflict when the stored object has moved on), as in Kubernetes."""
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "body must be an object")

        def replace(cur: Obj) -> Obj:
            rv = (body.get("metadata") or {}).get("resourceVersion")
            if rv and rv != cur["metadata"].get("resourceVersion"):
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {kind} "{name}": the object '
                                                "has been modified; please apply your changes to the latest version")
            new = copy.deepcopy(body)
            new.setdefault("metadata", {})
            return new
        return self.update(kind, namespace, name, replace)

    def _bind(self, namespace: str, name: str, body: Any) -> Obj:
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict) or not body["target"].get("name"):
            raise ApiError(400, "BadRequest", "Binding needs target.name")
        with self._cond:
            cur = self._store["pods"].get(self.key(namespace, name))
            if cur is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            uid = (body.get("metadata") or {}).get("uid")
            if uid and uid != cur["metadata"].get("uid"):
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": '
                               f"Precondition failed: UID in precondition: {uid}, UID in object meta: {cur['metadata'].get('uid')}")
            node = (cur.get("spec") or {}).get("nodeName")
            if node:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": '
                               f'pod {name} is already assigned to node "{node}"')
            new = copy.deepcopy(cur)
            new.setdefault("spec", {})["nodeName"] = body["target"]["name"]
            ann = (body.get("metadata") or {}).get("annotations") or {}
            if ann:
                new["metadata"].setdefault("annotations", {}).update(ann)
            self._store["pods"][self.key(namespace, name)] = new
            self._emit("pods", "MODIFIED", new)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _check_watch_start(self, kind: str, q: dict[str, str]) -> None:
        """Errors a watch request gets instead of a stream."""
        rv_s = q.get("resourceVersion", "")
        if rv_s in ("", "0"):
            return
        try:
            rv = int(rv_s)
        except ValueError:
            raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv_s!r}") from None
        with self._cond:
            if rv < self._compacted_rv and self.gone_mode == "status":
                raise ApiError(410, "Expired", f"too old resource version: {rv} ({self._compacted_rv})")

    def _watch_events(self, kind: str, namespace: str | None, q: dict[str, str], write: Callable[[Obj], None]) -> bool:
        """Stream events until timeout, drop, close or a write failure. True: the stream ended
        cleanly (its timeout, :meth:`end_watches`), and its connection is kept for the client's
        next request."""
        rv_s = q.get("resourceVersion", "")
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        deadline = time.monotonic() + timeout if timeout else None
        fsel, lsel = q.get("fieldSelector"), q.get("labelSelector")

        def visible(o: Obj) -> bool:
            return (namespace is None or o["metadata"].get("namespace") == namespace) and _selector_matches(o, fsel, lsel)

        with self._cond:
            drop_gen = (self._drop_gen, self._kind_drop_gen.get(kind, 0))
            self._check_watch_start(kind, q)
            broken = copy.deepcopy(self._watch_errors.get(kind))
            if kind in self._watch_ends:
                return True
        if broken is not None:
            write({"type": "ERROR", "object": broken})
            return False
        with self._cond:
            bm_gen = getattr(self, "_bookmark_gen", 0)
            if rv_s in ("", "0"):
                initial = [{"type": "ADDED", "object": copy.deepcopy(o)} for o in self._store[kind].values() if visible(o)]
                cursor = self._last_rv
            else:
                try:
                    cursor = int(rv_s)
                except ValueError:
                    raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv_s!r}")
                if cursor < self._compacted_rv:  # (status mode answered 410 before the stream began)
                    initial = [{"type": "ERROR", "object": status_obj(
                        410, "Expired", f"too old resource version: {cursor} ({self._compacted_rv})")}]
                    cursor = -1  # end after the error
                else:
                    initial = []
        for ev in initial:
            write(ev)
        if cursor < 0:
            return False
        last_bookmark = time.monotonic()
        while True:
            bookmark_rv = None
            with self._cond:
                pending = [e for e in self._events if e.rv > cursor and e.kind == kind]
                if not pending:
                    if self._closed or (self._drop_gen, self._kind_drop_gen.get(kind, 0)) != drop_gen:
                        if self._compacted_rv > cursor and self.gone_mode == "event":
                            break  # the history this stream needs is gone: say so
                        return False
                    bm_gen_now = getattr(self, "_bookmark_gen", 0)
                    if bookmarks and (bm_gen_now != bm_gen or time.monotonic() - last_bookmark >= self.bookmark_interval):
                        bm_gen = bm_gen_now
                        bookmark_rv = cursor = max(cursor, self._last_rv)  # nothing of ours is pending up to here
                    elif deadline is not None and time.monotonic() >= deadline:
                        return True
                    else:
                        wait = 0.2 if deadline is None else min(0.2, max(0.0, deadline - time.monotonic()))
                        self._cond.wait(wait)
                        continue
            for e in pending:
                cursor = e.rv
                if visible(e.obj):
                    write({"type": e.type, "object": e.obj})
            if bookmark_rv is not None:
                write({"type": "BOOKMARK", "object": {"kind": "Node" if kind == "nodes" else "Pod", "apiVersion": "v1",
                                                      "metadata": {"resourceVersion": str(bookmark_rv)}}})
                last_bookmark = time.monotonic()
            if deadline is not None and time.monotonic() >= deadline:
                return True
        write({"type": "ERROR", "object": status_obj(410, "Expired", "too old resource version")})


_PATHS = [
    (re.compile(r"^/api/v1/(nodes|pods)$"), "collection"),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/(pods)$"), "ns_collection"),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/binding$"), "binding"),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)(/status)?$"), "pod"),
    (re.compile(r"^/api/v1/nodes/([^/]+)(/status)?$"), "node"),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/events$"), "events"),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps$"), "configmaps"),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps/([^/]+)$"), "configmap"),
]


class _Handler(BaseHTTPRequestHandler):
    kube: FakeKube
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    # -------------------------------------------------------------- plumbing
    def _send_json(self, code: int, obj: Obj, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"request body is not JSON: {exc}") from exc

    def _dispatch(self, method: str) -> None:
        parts = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        kube = self.kube
        kube.requests.append((method, parts.path, q))
        try:
            body = self._body() if method in ("POST", "PATCH", "PUT") else None
            if method in ("POST", "PATCH", "PUT"):
                kube.bodies.append(copy.deepcopy(body))
            fault = kube._take_fault(method, parts.path)
            if fault is not None:
                reason = fault.reason if fault.reason is not None else \
                    "InternalError" if fault.status >= 500 else "Injected"
                raise ApiError(fault.status, reason, f"injected failure ({fault.status})", fault.headers)
            for rx, route in _PATHS:
                m = rx.match(parts.path)
                if m:
                    return self._route(route, method, m.groups(), q, body)
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({parts.path})")
        except ApiError as e:
            self._send_json(e.code, status_obj(e.code, e.reason, e.message), e.headers)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _route(self, route: str, method: str, g: tuple, q: dict[str, str], body: Any) -> None:
        kube = self.kube
        if route in ("collection", "ns_collection"):
            kind, ns = (g[0], None) if route == "collection" else (g[1], g[0])
            if method == "GET":
                if q.get("watch") in ("true", "1"):
                    return self._stream(kind, ns, q)
                return self._send_json(200, kube._list(kind, ns, q))
            if method == "POST" and (route == "ns_collection" or kind == "nodes"):
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "body must be an object")
                if ns:
                    body.setdefault("metadata", {})["namespace"] = ns
                return self._send_json(201, kube.create(kind, body))
        elif route == "binding" and method == "POST":
            hold = kube._take_hold(g[0], g[1], body)
            if hold is not None:
                raise ApiError(hold[0], hold[1], f"injected: the Binding is answered {hold[0]} and applied later")
            return self._send_json(201, kube._bind(g[0], g[1], body))
        elif route in ("pod", "node"):
            kind, ns, name = ("pods", g[0], g[1]) if route == "pod" else ("nodes", None, g[0])
            if method == "GET":
                obj = kube.get(kind, ns, name)
                if obj is None:
                    raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
                return self._send_json(200, obj)
            if method == "PATCH":
                return self._send_json(200, kube._patch(kind, ns, name, self.headers.get("Content-Type", ""), body))
            if method == "DELETE":
                return self._send_json(200, kube.delete(kind, ns, name))
        elif route == "configmaps" and method == "POST":
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "body must be an object")
            body.setdefault("metadata", {})["namespace"] = g[0]
            return self._send_json(201, kube.create("configmaps", body))
        elif route == "configmap":
            ns, name = g
            if method == "GET":
                obj = kube.get("configmaps", ns, name)
                if obj is None:
                    raise ApiError(404, "NotFound", f'configmaps "{name}" not found')
                return self._send_json(200, obj)
            if method == "PUT":
                return self._send_json(200, kube._replace("configmaps", ns, name, body))
            if method == "DELETE":
                return self._send_json(200, kube.delete("configmaps", ns, name))
        elif route == "events" and method == "POST":
            kube.events_posted.append(body)
            return self._send_json(201, body if isinstance(body, dict) else {})
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {self.path}")

    def _stream(self, kind: str, ns: str | None, q: dict[str, str]) -> None:
        kube = self.kube
        sock = self.connection

        def write_raw(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def write(ev: Obj) -> None:
            write_raw(json.dumps(ev).encode() + b"\n")

        keep = False
        with kube._cond:
            kube._watch_socks[sock] = kind
        try:
            kube._check_watch_start(kind, q)  # errors (410 in "status" mode, bad rv) before any header
            # Headers go out at once, as a real API server does: the client's watch is open now.
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            with kube._cond:
                raw, end = kube._watch_raw.get(kind, ([], False))
            for data in raw:
                write_raw(data)
            with kube._cond:
                trickle = kube._watch_trickle.get(kind)
            while trickle is not None:
                write_raw(b" ")
                time.sleep(trickle)
                with kube._cond:
                    trickle = kube._watch_trickle.get(kind)
                end = True
            keep = True if end else kube._watch_events(kind, ns, q, write)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            keep = False
        finally:
            with kube._cond:
                kube._watch_socks.pop(sock, None)
            # A stream that ended cleanly keeps its connection, as a real API server's does: closed,
            # the client may take it from its pool for its next request at once and fail on it.
            self.close_connection = not keep

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        self._dispatch("PUT")


# ----------------------------------------------------------------- builders
def make_node(name: str, *, gpus: int = 0, ready: bool = True, unschedulable: bool = False,
              annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
              allocatable: dict[str, str] | None = None) -> Obj:
    """A minimal but realistic v1 Node (Ready condition, allocatable with ``nvidia.com/gpu``)."""
    alloc = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    alloc.update(allocatable or {})
    node: Obj = {"apiVersion": "v1", "kind": "Node",
                 "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                              "annotations": dict(annotations or {})},
                 "spec": {},
                 "status": {"capacity": dict(alloc), "allocatable": alloc,
                            "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                            "reason": "KubeletReady" if ready else "KubeletNotReady"}]}}
    if unschedulable:
        node["spec"]["unschedulable"] = True
    return node


def make_pod(name: str, *, namespace: str = "default", gpus: int = 0, gpu_memory: int = 0, gpu_core: int = 0,
             node: str | None = None, phase: str = "Pending", annotations: dict[str, str] | None = None,
             uid: str | None = None) -> Obj:
    """A minimal v1 Pod with one container asking for the given GPU resources (as limits)."""
    limits: dict[str, str] = {}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    if gpu_memory:
        limits["nvidia.com/gpu-memory"] = str(gpu_memory)
    if gpu_core:
        limits["nvidia.com/gpu-core"] = str(gpu_core)
    pod: Obj = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
                "spec": {"schedulerName": "default-scheduler",
                         "containers": [{"name": "main", "image": "busybox",
                                         "resources": {"limits": dict(limits), "requests": dict(limits)}}]},
                "status": {"phase": phase}}
    if uid:
        pod["metadata"]["uid"] = uid
    if node:
        pod["spec"]["nodeName"] = node
    return pod
