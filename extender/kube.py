"""Feed the :class:`~packing.model.ClusterModel` from the Kubernetes API: list+watch of nodes and pods.

Why this shape:
- The model must follow the cluster closely (filter answers are only as good as the model), so
  nodes and pods are each listed once, then watched from the list's resourceVersion, resuming
  from the last resourceVersion seen when a stream ends or breaks (no event is applied twice, none
  is missed), and relisting only when the API server says the history is gone (410, as an HTTP
  status or as an ``ERROR`` watch event). A list comes in pages of :data:`LIST_PAGE_SIZE`
  objects (``limit`` + ``continue``, as client-go's reflector lists) and at most
  :data:`LIST_PAGE_BYTES` of JSON (fewer objects when they are big: :mod:`stowage.kubelist`),
  each applied as it arrives and dropped: its peak memory is a page's, not the cluster's, nor
  what a pod author made of their pods (:meth:`KubeFeeder._relist`).
- Errors back off exponentially with jitter, so a struggling API server is not hammered by
  every replica at once.
- ``ready()`` is what ``/readyz`` reports: False until both first lists are applied, and False
  with a reason when a watch has been failing for longer than ``stale_after_s``: the extender
  never serves from a model that stopped updating without saying so. A watch that merely opens
  proves nothing (the API server may accept it and end it at once with an error, every time):
  a failure streak ends with an event, a clean end of the watch, a list, or a watch that stayed
  open without error for ``open_grace_s`` (an idle watch on a quiet cluster sends nothing).
  A watch the server ends cleanly in under ``short_watch_s`` (1 s) without any event is a failure
  too, as client-go's reflector has it ("very short watch"): a misbehaving API server or proxy
  that closes every watch at once would otherwise have it re-opened straight away, forever.
  One that ends that soon *with* events is no failure, but the next watch of the kind still
  waits until ``short_watch_s`` after it opened: a peer that sends one bookmark and ends every
  watch does not make the feeder loop either.
- Everything the model holds is rebuilt from the API server (node inventory annotations/labels,
  pod allocation annotations): a restarted extender gets the very same model.

Objects are handled as camelCase JSON dicts (exactly what the API server sends): list pages are
read with ``_preload_content=False`` and parsed once, and so is each watch event (:class:`WatchStream`):
no generated model classes, no second encoding, on the hot path. Each event takes the model lock
only for its own small update.
"""
from __future__ import annotations

import logging
import random
import socket
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ContextManager, Iterator, Mapping

import kubernetes.client
from kubernetes.client.exceptions import ApiException
from orjson import loads as _loads

from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, RecordTrust
from stowage.digits import whole_number
from stowage.logtext import escaped
from stowage.kubelist import (LIST_PAGE_BYTES, LIST_PAGE_SIZE, OBJECT_BYTES, ListLoop, PageSizer, byte_size,
                               list_in_pages, read_page, status_of)
from stowage.resources import DEFAULT_MEMORY_UNIT_MIB, pod_gpu_request, shown

from .errors import KubeConfigError
from .bounds import BoundUse, ListLearnUse
from .feed_health import FeedHealth, StreamHealth
from .kube_objects import (LIST_LEARN_BYTES, assign_args, meta, node_into_model, node_view, pod_for_bind, pod_key,
                           pod_for_learn, pod_kube_request, pod_view, record_by_uuid, resource_version)
from .pending_pods import PENDING_BYTES, PENDING_ENTRIES, PendingPods, pack, unpack
from packing.model import ClusterModel
from stowage.taints import NodeClosure

log = logging.getLogger("stowage.kube")


def read_json(resp: Any) -> Any:
    """Body of a ``_preload_content=False`` response, parsed; the connection goes back to the pool
    only once fully read (an unread body would be taken for the next response's status line)."""
    try:
        data = resp.data
    finally:
        resp.release_conn()
    return _loads(data)


def read_or_none(read: Callable[..., Any], *args: Any, **kwargs: Any) -> dict | None:
    """One object through a client ``read_namespaced_*`` call (``read(*args, **kwargs)``, with
    ``_preload_content=False``), parsed; None when it does not exist (404). Other API errors
    propagate."""
    try:
        resp = read(*args, _preload_content=False, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return read_json(resp)

NODES = "nodes"
PODS = "pods"

# What a learn entry holds besides its texts and bytes: its two tuples and list slot (rounded up).
# (Their bound, LIST_LEARN_BYTES, is defined in kube_objects, where the command line reads it.)
_LEARN_ENTRY_BYTES = 160


def creation_order(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """Sort key: creationTimestamp (RFC 3339 in UTC sorts as text), then namespace/name, then uid."""
    m = meta(obj)
    return (str(m.get("creationTimestamp") or ""), f"{m.get('namespace') or ''}/{m.get('name') or ''}",
            str(m.get("uid") or ""))


# The most one watch event's line may take (JSON bytes) before the stream is abandoned
# (:func:`watch_lines`): one event holds one object, so the bound of one object, as a list page of
# one object has it (stowage.kubelist.OBJECT_BYTES: what etcd stores is served as 9 MiB of JSON at
# most), never reached by a real API server's event.
WATCH_EVENT_BYTES = OBJECT_BYTES
# Bytes asked of a watch body per read: an HTTP chunk is read in pieces of this size, not whole
# (a peer may declare one chunk of any size), and a stream that is not chunked gives its events in
# pieces of this size rather than only at its end. A chunk smaller than this comes as it is.
WATCH_READ_BYTES = 1 << 20


class WatchStream:
    """One watch request: its newline-delimited events, each decoded ONCE into a plain dict.

    Why not ``kubernetes.watch.Watch``: even with ``return_type="object"`` it decodes each line
    with the standard library's json, then encodes the object again and decodes it a second time
    (``ApiClient.deserialize``) — three passes over every pod event of the cluster, on the decision
    process's GIL, where a burst's filters wait for it (docs/binpack.md, "Burst throughput").
    Same protocol otherwise: the request is made by ``fn`` with ``watch=True`` and an unread
    body; an ``ERROR`` event raises :class:`ApiException` with the Status's code (410: the
    history is gone, which the feeder turns into a relist); :meth:`stop` ends the stream after
    the event being handled.
    """

    def __init__(self) -> None:
        self._stopped = False
        self._resp: Any = None

    def stop(self) -> None:
        """End the stream: after the event being handled, or at once when the reading thread is
        blocked waiting for the next one (its socket is shut down under it, which a blocked TLS
        read notices where closing the response from another thread could hang)."""
        self._stopped = True
        sock = _socket_of(self._resp)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stream(self, fn: Callable[..., Any], **kwargs: Any) -> Iterator[dict]:
        resp = fn(watch=True, _preload_content=False, **kwargs)
        self._resp = resp
        try:
            if self._stopped:
                return
            status = getattr(resp, "status", 200)
            if isinstance(status, int) and not 200 <= status <= 299:
                raise ApiException(status=status, reason=f"watch answered HTTP {status}")
            for line in watch_lines(resp.stream(amt=WATCH_READ_BYTES, decode_content=False)):
                event = watch_event(line)
                if event.get("type") == "ERROR":
                    obj = event.get("object") if isinstance(event.get("object"), Mapping) else {}
                    raise ApiException(status=obj.get("code") if isinstance(obj.get("code"), int) else 500,
                                       reason=f"{obj.get('reason')}: {obj.get('message')}")
                yield event
                if self._stopped:
                    return
        finally:
            self._resp = None
            resp.close()
            resp.release_conn()


def _socket_of(resp: Any) -> socket.socket | None:
    """The socket a urllib3 response reads from, or None.

    Usually the pooled connection's (``resp.connection.sock``). But when the server answers
    ``Connection: close`` (a proxy before the API server may), http.client gives the socket to the
    response and empties the connection's ``sock``; the response still reads it through its file
    object (``http.client.HTTPResponse.fp``, a buffered reader over a ``socket.SocketIO``)."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if isinstance(sock, socket.socket):
        return sock
    raw = getattr(getattr(getattr(resp, "_fp", None), "fp", None), "raw", None)
    sock = getattr(raw, "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


def watch_lines(chunks: Iterator[bytes], max_line: int | None = None) -> Iterator[bytes]:
    """The non-empty lines of a watch body, whatever the chunking (an event may span chunks, a
    chunk may hold several events). A newline never occurs inside a UTF-8 multi-byte sequence
    nor, unescaped, inside JSON, so splitting the bytes is safe.

    ``max_line`` (None: :data:`WATCH_EVENT_BYTES`): a line longer than this raises ValueError as
    soon as it is passed, before more of it is read (the stream is then re-opened from the last
    resourceVersion): one event holds one object, which etcd bounds, and a line that never ends
    (a peer that is not an API server) must not take the component's memory. Each chunk is
    looked at once and a long line is gathered in one buffer, so a line's cost is linear in its
    length, whatever the chunking (joining each piece to all those before took ~18 s of CPU for a
    16 MiB line in 4 KiB pieces)."""
    bound = WATCH_EVENT_BYTES if max_line is None else max_line
    rest = bytearray()
    for chunk in chunks:
        if not chunk:
            continue
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if rest:
                rest += chunk[start:end]
                line = bytes(rest)
                rest.clear()
            else:
                line = chunk[start:end]
            if len(line) > bound:
                raise ValueError(_too_long(bound))
            if line and not line.isspace():
                yield line
            start = end + 1
        if start < len(chunk):
            rest += chunk[start:] if start else chunk
            if len(rest) > bound:
                raise ValueError(_too_long(bound))
    if rest and not rest.isspace():
        yield bytes(rest)


def _too_long(bound: int) -> str:
    return (f"watch event past {byte_size(bound)} (the bound of one event: one object, which etcd bounds at "
            f"~1.5 MiB); the stream is abandoned")


def watch_event(line: bytes) -> dict:
    """One watch event line as a dict; ValueError (the stream is then re-opened from the last
    resourceVersion) when it is not a JSON object."""
    try:
        event = _loads(line)
    except ValueError as exc:
        raise ValueError(f"undecodable watch event ({exc}): {line[:200]!r}") from None
    if not isinstance(event, dict):
        raise ValueError(f"watch event is not an object: {line[:200]!r}")
    return event


def _revision(rv: str) -> int | None:
    """A resourceVersion as the etcd revision it is on kube-apiserver (a whole number of at most
    20 digits), else None (opaque: not compared)."""
    return int(rv) if 0 < len(rv) <= 20 and rv.isascii() and rv.isdigit() else None


class Gone(Exception):
    """The resourceVersion we wanted to resume from is too old: relist."""


class UnusableEvent(ValueError):
    """A watch event the feeder cannot apply as a whole (:meth:`KubeFeeder._event`): the stream
    fails there, as an undecodable line does."""


# The watch event types of the API (besides ERROR, which WatchStream raises).
_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})
# The ``kind`` each stream's event objects have (bookmarks' too). A real API server writes it in every
# watch event; one without it is taken as the stream's kind (a hand-made object), one of another
# kind is refused (:meth:`KubeFeeder._event`), as client-go's reflector refuses an unexpected type.
_KINDS = {NODES: "Node", PODS: "Pod"}


class WatchOverran(Exception):
    """A watch still open ``watch_overrun_s`` after the ``timeoutSeconds`` it was asked to end at:
    cut, counted as a failure, and re-opened from the last resourceVersion."""


class ShortWatch(Exception):
    """The API server ended a watch cleanly, at once, without an event: taken as a failure (backed
    off), as client-go's reflector does, rather than as the clean end of a working stream."""


def api_status(exc: ApiException) -> dict:
    """The Status object an ApiException's body carries ({} when the body is none: e.g. a proxy's
    error page)."""
    return status_of(exc.body)


API_MESSAGE_CHARS = 1024   # of an API server's message quoted in an error or a log line
GO_MAX_INT = 2**63 - 1    # the largest Retry-After client-go's strconv.Atoi reads; a larger one reads as this


def api_message(exc: BaseException) -> str:
    """The API server's own message from an ApiException (its Status body), else a short repr.

    The message is escaped (:func:`stowage.logtext.escaped`) and cut at :data:`API_MESSAGE_CHARS`:
    it goes into bind errors, which kube-scheduler puts in the pod's FailedScheduling event, and an
    admission webhook's denial may quote what the pod's author wrote, control characters and all,
    at any length."""
    if isinstance(exc, ApiException):
        message = api_status(exc).get("message")
        if message:
            text = escaped(str(message))
            if len(text) > API_MESSAGE_CHARS:
                text = f"{text[:API_MESSAGE_CHARS]}... ({len(text)} characters)"
            return f"{text} (HTTP {exc.status})"
        return f"HTTP {exc.status} {exc.reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"


def retry_after_s(exc: BaseException) -> int | None:
    """The seconds an API error's ``Retry-After`` header asks for, on a 429 or a 5xx (as client-go
    reads it: a whole number of seconds, nothing else), else None. kube-apiserver's priority and
    fairness sheds load with 429 and ``Retry-After``; coming back sooner only adds to the load."""
    if not isinstance(exc, ApiException) or not (exc.status == 429 or (exc.status or 0) >= 500):
        return None
    value = str((exc.headers or {}).get("Retry-After") or "").strip()
    return whole_number(value, GO_MAX_INT)   # client-go reads it with strconv.Atoi


def load_api_client(kubeconfig: str | None = None, in_cluster: bool = False,
                    context: str | None = None, retries: int | None = None) -> kubernetes.client.ApiClient:
    """A configured ApiClient: in-cluster service account, or a kubeconfig file/context.

    With neither ``in_cluster`` nor ``kubeconfig``: the in-cluster account when running in a
    pod (``KUBERNETES_SERVICE_HOST`` set), else ``$KUBECONFIG`` / ``~/.kube/config``.
    ``retries``: how often a failed request is tried again (None: the client's default, 3;
    an operator's one-shot command waits less for a server that does not answer).
    Raises :class:`~extender.errors.KubeConfigError` with what was tried.
    """
    import os

    import yaml
    from kubernetes import config as kconfig

    cfg = kubernetes.client.Configuration()
    if retries is not None:
        cfg.retries = retries
    tried: list[str] = []
    if in_cluster or (not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST")):
        try:
            kconfig.load_incluster_config(client_configuration=cfg)
            return kubernetes.client.ApiClient(cfg)
        except kconfig.ConfigException as exc:
            tried.append(f"in-cluster service account: {exc}")
            if in_cluster:
                raise KubeConfigError("cannot use the in-cluster Kubernetes configuration: " + "; ".join(tried)) from exc
    path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    advice = "" if kubeconfig else " Pass --kubeconfig, or run in a pod with a service account."

    def unusable(why: str) -> KubeConfigError:
        tried.append(why)
        return KubeConfigError("no usable Kubernetes configuration: " + "; ".join(tried) + "." + advice)

    if os.pathsep not in path and not os.path.exists(path):
        raise unusable(f"kubeconfig {path} does not exist")
    try:
        kconfig.load_kube_config(config_file=path, context=context, client_configuration=cfg, persist_config=False)
    except (TypeError, AttributeError) as exc:   # YAML, but not a kubeconfig's mappings
        raise unusable(f"{path} is not a kubeconfig (YAML with clusters, users and contexts)") from exc
    except (kconfig.ConfigException, OSError, ValueError, yaml.YAMLError) as exc:
        raise unusable(f"kubeconfig {path}: {exc}") from exc
    return kubernetes.client.ApiClient(cfg)


@dataclass
class JitteredBackoff:
    """Exponential back-off with jitter: base * 2^(n-1), capped, times a random factor in [0.5, 1).

    A delay rule only: the failure count lives in each :class:`StreamState`, since both streams
    share one rule. The jitter keeps many extender replicas from retrying a recovering API server
    in step. (Not :class:`gpunode.backoff.Backoff`, the node agents' streak keeper with no jitter:
    one agent per node, nothing to spread.)"""

    base_s: float = 0.5
    max_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, failures: int) -> float:
        d = min(self.max_s, self.base_s * (2 ** max(0, failures - 1)))
        return d * (0.5 + 0.5 * self.rng.random())


@dataclass
class StreamState:
    """Bookkeeping of one list+watch loop (nodes or pods); read by ``ready()`` and ``status()``."""

    kind: str
    rv: str = ""
    synced: bool = False
    failures: int = 0
    failing_since: float | None = None
    last_error: str = ""
    last_contact: float = 0.0
    open_since: float | None = None   # when the watch now open was opened (None: none is open)
    last_list: float = 0.0
    gone_streak: int = 0
    gone_relists: int = 0             # watches answered 410 Gone since start (each relisted): /metrics
    short_said: bool = False          # this failure streak's short watches were logged (once per streak)
    lists: int = 0
    watches: int = 0
    events: int = 0
    errors: int = 0


@dataclass
class PodListing:
    """What a pod list gathers across its pages until its last one (:meth:`KubeFeeder._relist`)."""

    # uid -> namespace/name of the object listed under it (the first one; not one that came under a
    # uid the model held for another pod, see KubeFeeder._uid_taken)
    seen: dict[str, str] = field(default_factory=dict)
    clashed: set[str] = field(default_factory=set)   # uids the model holds that came under another name
    pending: set[str] = field(default_factory=set)   # ns/name of the pending pods it wrote for bind
    # (creation_order, packed pod_for_learn copy) of each pod, for on_pod_seen at the end
    learn: list[tuple[tuple[str, str, str], bytes]] = field(default_factory=list)
    learn_bytes: int = 0                             # what they hold (sys.getsizeof)

    def clear(self) -> None:
        """Start again (the list is read again from its first object)."""
        self.seen.clear()
        self.clashed.clear()
        self.pending.clear()
        self.learn.clear()
        self.learn_bytes = 0


class KubeFeeder:
    """Keeps ``model`` equal to what the API server says, from background threads.

    ``resync_s``: a full relist this often even when watches are healthy (a safety net; 0 = never).
    ``watch_timeout_s``: server-side timeout of each watch request (randomised up to 2x, as
    client-go does), after which the watch is resumed from the last resourceVersion.
    ``stale_after_s``: how long a stream may fail before ``ready()`` turns False.
    ``open_grace_s``: how long a watch opened during a failure streak must stay open without error
    (and without an event, which proves it sooner) before the streak counts as over.
    ``short_watch_s``: a watch the server ends cleanly sooner than this, without an event, is a
    failure (client-go's "very short watch"), so a server that closes every watch at once is not
    asked again straight away, every time.
    ``watch_overrun_s``: how long past its server-side timeout a watch may stay open before it is
    cut and re-opened (a failure): a peer that sends a byte now and then, never a whole event,
    passes every read timeout and would otherwise hold the watch, and freeze the model, for as
    long as it went on.
    ``page_size``: objects per list request (client-go's 500): a list's peak memory is a page's,
    not the cluster's. ``page_bytes``: the JSON one list response may take before it is asked
    for again with fewer objects (:class:`~stowage.kubelist.PageSizer`).
    ``pending_entries``, ``pending_bytes``: the bounds of the pending pods kept for bind
    (:mod:`extender.pending_pods`).
    ``list_learn_bytes``: the learn copies a pod list keeps before it shows them (:data:`LIST_LEARN_BYTES`);
    ``list_learn_flag``: the command-line flag that sets it, named when a list passes it (the
    extender's ``--list-learn-mib``; empty where none does, as in ``stowage inspect`` and ``plan``).
    """

    def __init__(self, model: ClusterModel, api_client: kubernetes.client.ApiClient,
                 memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB, resync_s: float = 600.0,
                 watch_timeout_s: int = 300, stale_after_s: float = 60.0, backoff_base_s: float = 0.5,
                 backoff_max_s: float = 30.0, request_timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 trust: RecordTrust | None = None, open_grace_s: float = 5.0,
                 short_watch_s: float = 1.0, watch_overrun_s: float = 30.0, page_size: int = LIST_PAGE_SIZE, page_bytes: int = LIST_PAGE_BYTES,
                 pending_entries: int = PENDING_ENTRIES, pending_bytes: int = PENDING_BYTES,
                 list_learn_bytes: int = LIST_LEARN_BYTES, list_learn_flag: str = "") -> None:
        self.model = model
        # Objects and JSON bytes per list request (checked here: a bad value fails at start). The
        # size each kind's next page asks for is kept from list to list (a hint: see PageSizer),
        # so a cluster holding giant pods pays the pages abandoned on the way down once.
        self._sizers = {kind: PageSizer(page_size, page_bytes) for kind in (NODES, PODS)}
        self.list_learn_bytes, self.list_learn_flag = list_learn_bytes, list_learn_flag
        # Since start: the most a list's learn copies held at once (at a batch shown), and the
        # batches shown before a list's end for the bound (_show_listed; status(), /metrics).
        self.list_learn_peak = 0
        self.list_learn_early_batches = 0
        # Which records count: by default, well-formed ones that book exactly the pod's request.
        self.trust = trust or RecordTrust(memory_unit_mib=memory_unit_mib)
        self.api_client = api_client
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.memory_unit_mib = memory_unit_mib
        self.resync_s = resync_s
        self.watch_timeout_s = max(1, int(watch_timeout_s))
        self.stale_after_s = stale_after_s
        self.open_grace_s = open_grace_s
        self.short_watch_s = short_watch_s
        self.watch_overrun_s = watch_overrun_s
        self.request_timeout_s = request_timeout_s
        self.clock = clock
        self.rng = rng or random.Random()
        self.backoff = JitteredBackoff(backoff_base_s, backoff_max_s, self.rng)
        self.streams = {NODES: StreamState(NODES), PODS: StreamState(PODS)}
        self._lock = threading.Lock()            # feeder bookkeeping below (never held across I/O)
        self._stop = threading.Event()
        self._threads: dict[str, threading.Thread] = {}
        self._watches: dict[str, WatchStream] = {}
        self._node_fp: dict[str, tuple] = {}     # node -> fingerprint last applied
        self.node_errors: dict[str, str] = {}    # node -> why its inventory could not be read
        self._records: dict[str, AllocationRecord] = {}  # uid -> record applied from its annotation
        self._pod_errors: dict[str, str] = {}    # uid -> malformed-annotation message (logged once)
        self._uid_clashes: dict[str, str] = {}   # held uid -> why an object of another name under it is ignored
        self._overbooked: dict[str, str] = {}    # uid -> which of its record's cards others hold too (_note_overbooked)
        self._unrecorded: dict[str, str] = {}    # uid -> node: GPU pods bound without our record
        # ns/name -> pending pod of Stowage's schedulers, only what bind reads (pod_for_bind): for
        # get_pod at bind and pending_uid at requeue. Small whatever the pod's annotations and
        # containers, and bounded together (extender/pending_pods.py: what a dropped copy costs).
        self._pending = PendingPods(pending_entries, pending_bytes)
        # Called with the model's generation after it gained room (a pod left, a node came or
        # changed): kube-scheduler may have retried a waiting pod on the same event before this
        # watch delivered it.
        self.on_cards_freed: Callable[[int], None] | None = None
        # Told of every pod (its priority, its nominatedNodeName while pending): the preempt
        # verb and the hold of nominated pods' cards (extender/nominated.py).
        self.marks: Any = None
        # Told of every pod of Stowage's schedulers the feed sees (pending or bound, not yet
        # deleted), and of every pod deleted: the service rebuilds what its placers learn from
        # them, and refuses a late bind of a deleted one (ExtenderService.learn_pod / pod_deleted).
        self.on_pod_seen: Callable[[Mapping[str, Any]], None] | None = None
        # Wraps the pods of a list shown to on_pod_seen at once (ExtenderService.learning_in_bulk:
        # the learned table is built once for them, not every 128 pods).
        self.learning_in_bulk: Callable[[], ContextManager[None]] = nullcontext
        self.on_pod_deleted: Callable[[str], None] | None = None
        # Asked of every node the feed applies (listed or watched; not a deleted one), before it
        # is applied: True when the node takes no new pods for a reason the feed does not read
        # itself (it reads spec.unschedulable and the Ready condition), so it is applied as
        # closed for a reason no pod's toleration opens (stowage.taints.NodeClosure.OTHER). Also
        # where a reader notes nodes (stowage inspect/plan: why a node takes no pods). An exception it raises is logged and reads as False. The extender sets none:
        # kube-scheduler applies taints itself before it asks the extender, and it still places
        # pods on a node that only has a deletionTimestamp (v1.28.7:
        # tests/integration/test_real_node_deleting.py), so the extender offers that node too.
        self.node_closed: Callable[[Mapping[str, Any]], bool] | None = None
        # uids shown to on_pod_seen and not yet told deleted: a relist tells those it no longer
        # finds (deleted while the watch was gone, with no DELETED event).
        self._shown: set[str] = set()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "KubeFeeder":
        """Start one list+watch thread per kind. Returns at once; see ``ready()``."""
        self._stop.clear()
        for kind in (NODES, PODS):
            t = self._threads.get(kind)
            if t is None or not t.is_alive():
                t = threading.Thread(target=self._run, args=(self.streams[kind],), name=f"stowage-watch-{kind}",
                                     daemon=True)
                self._threads[kind] = t
                t.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the threads (interrupting open watch streams) and wait for them."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in list(self._threads.values()):
            # Repeat: a watch request still waiting for its response headers cannot be interrupted yet.
            while t.is_alive() and time.monotonic() < deadline:
                for w in list(self._watches.values()):
                    w.stop()
                t.join(0.05)

    def sync_once(self) -> None:
        """List nodes and pods once, synchronously, and apply them (``stowage inspect``). Raises on API errors."""
        self._relist(self.streams[NODES])
        self._relist(self.streams[PODS])

    # ------------------------------------------------------------------ readiness
    def ready(self) -> tuple[bool, str]:
        """(ready, why). Ready once both first lists are applied and while no stream is failing for long."""
        now = self.clock()
        with self._lock:
            for st in self.streams.values():
                self._settle(st, now)
                if not st.synced:
                    why = f"waiting for the first list of {st.kind} from the API server"
                    return False, why + (f" (last error: {st.last_error})" if st.last_error else "")
                if st.failing_since is not None and now - st.failing_since > self.stale_after_s:
                    return False, (f"{st.kind} watch failing for {now - st.failing_since:.0f}s "
                                   f"({st.failures} attempts): {st.last_error}; the model may be stale")
                silent = now - st.last_contact
                if st.failing_since is None and silent > self.silent_after_s:
                    return False, f"no word from the API server on {st.kind} for {silent:.0f}s; the model may be stale"
            t_dead = [k for k, t in self._threads.items() if not t.is_alive()]
        if self._stop.is_set() and self._threads:
            return False, "the Kubernetes feed is stopped"
        if t_dead:
            return False, f"{', '.join(t_dead)} watch thread stopped"
        # (Asked before every verb too: counts only, nothing copied.)
        return True, f"in sync with the API server: {len(self.model.index)} nodes, {len(self.model.allocations)} pods bound"

    @property
    def silent_after_s(self) -> float:
        """How long a stream that is not failing may go without a word from the API server (an
        event, a bookmark, a watch's end or opening, a list) before ``ready()`` calls the model
        stale: a healthy watch ends at the latest after twice the watch timeout (its timeout is
        randomised up to 2x), plus a minute of slack, plus ``stale_after_s``. Past it the
        connection is hung somewhere between (a proxy, a half-open TCP connection) without an
        error to count."""
        return 2 * self.watch_timeout_s + 60 + self.stale_after_s

    def status(self) -> dict[str, Any]:
        """Everything the feed keeps about itself, names included: for ``stowage inspect`` and
        people (``/metrics`` reads :meth:`health` and :meth:`bounds`)."""
        now = self.clock()
        with self._lock:
            for st in self.streams.values():
                self._settle(st, now)
            out: dict[str, Any] = {k: dict(vars(st)) for k, st in self.streams.items()}
            out["node_errors"] = dict(self.node_errors)
            out["pod_errors"] = dict(self._pod_errors)
            for uid, why in [*self._uid_clashes.items(), *self._overbooked.items()]:   # (both counted, not ignored)
                out["pod_errors"][uid] = f"{out['pod_errors'][uid]}; {why}" if uid in out["pod_errors"] else why
            out["unrecorded_gpu_pods"] = dict(self._unrecorded)
            out["bounds"] = self._bounds()
        return out

    def health(self) -> FeedHealth:
        """Each stream's counters and state, and how many nodes and pods the feed cannot read or
        count, as numbers only (extender/feed_health.py): for /metrics, whose labels must stay
        bounded (``status()`` has the names). Ages are on the feeder's clock, evaluated as
        ``ready()`` does, so ``failing_s > stale_after_s``, or ``silent_s > silent_after_s`` while not
        failing, is exactly when ``/readyz`` says stale."""
        now = self.clock()
        with self._lock:
            streams: dict[str, StreamHealth] = {}
            for kind, st in self.streams.items():
                self._settle(st, now)
                streams[kind] = StreamHealth(
                    lists=st.lists, watches=st.watches, events=st.events, errors=st.errors,
                    gone_relists=st.gone_relists, synced=st.synced,
                    failing_s=max(0.0, now - st.failing_since) if st.failing_since is not None else 0.0,
                    list_age_s=max(0.0, now - st.last_list) if st.lists else None,
                    silent_s=max(0.0, now - st.last_contact) if st.synced else None)
            return FeedHealth(streams=streams, stale_after_s=self.stale_after_s, silent_after_s=self.silent_after_s,
                              node_errors=len(self.node_errors),
                              pod_errors=len(self._pod_errors) + len(self._uid_clashes) + len(self._overbooked),
                              unrecorded_gpu_pods=len(self._unrecorded))

    def bounds(self) -> dict[str, BoundUse | ListLearnUse]:
        """What the pending pods and a list's learn copies hold against their bounds, and what
        passing them cost since start (extender/bounds.py): for /metrics (``status()`` has it too)."""
        with self._lock:
            return self._bounds()

    def _bounds(self) -> dict[str, BoundUse | ListLearnUse]:
        return {"pending_pods": self._pending.use(),
                "list_learn": ListLearnUse(max_bytes=self.list_learn_bytes, peak_bytes=self.list_learn_peak,
                                           early_batches=self.list_learn_early_batches)}

    # ------------------------------------------------------------------ pods for bind
    def pending_pod(self, namespace: str, name: str) -> dict | None:
        """The watch's copy of the pending pod ``namespace/name`` of Stowage's schedulers, holding
        only what bind reads (:func:`pod_for_bind`), or None (no such pending pod, another
        scheduler's, or its copy went past the cache's bounds). No API call."""
        with self._lock:
            packed = self._pending.packed(f"{namespace}/{name}")
        return unpack(packed) if packed is not None else None

    def get_pod(self, namespace: str, name: str) -> dict | None:
        """A pod as camelCase JSON, None when it does not exist: a pending pod of Stowage's
        schedulers from the watch's cache (:meth:`pending_pod`), else (another pod, or one whose
        copy went past the cache's bounds) the whole pod by a GET."""
        pod = self.pending_pod(namespace, name)
        if pod is not None:
            return pod
        try:
            return read_or_none(self.core.read_namespaced_pod, name, namespace,
                                _request_timeout=self.request_timeout_s)
        except ApiException as exc:
            raise RuntimeError(api_message(exc)) from exc

    # ------------------------------------------------------------------ the loops
    def _run(self, st: StreamState) -> None:
        """The stream's thread: list, then watch, for as long as the feeder runs.

        Nothing may end it but ``stop()``: a kind whose thread ended would freeze its part of the
        model for good. So a fault in this loop's own handling of a failure (a bug: it happened,
        with a ``Retry-After`` of odd digits) is logged with its traceback, and the stream relists
        after the back-off's ceiling."""
        while not self._stop.is_set():
            try:
                self._list_and_watch(st)
            except Exception as exc:
                log.exception("%s stream: internal error in the feeder's own failure handling; relisting in %gs",
                              st.kind, self.backoff.max_s)
                with self._lock:   # the stream counts as failing (/readyz, status) until it works again
                    st.errors += 1
                    if st.failing_since is None:
                        st.failing_since = self.clock()
                    st.last_error = f"internal error: {type(exc).__name__}"
                if self._stop.wait(self.backoff.max_s):
                    break

    def _list_and_watch(self, st: StreamState) -> None:
        """List, then watch from the list's resourceVersion; relist on 410 Gone and every
        ``resync_s``; back off after any other failure."""
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list or (self.resync_s > 0 and self.clock() - st.last_list >= self.resync_s):
                    self._relist(st)
                    need_list = False
                self._watch(st)
            except Gone as exc:
                need_list = True
                with self._lock:
                    st.gone_streak += 1
                    st.gone_relists += 1
                    streak = st.gone_streak
                log.info("%s watch: %s; relisting", st.kind, exc)
                if streak > 1 and self._stop.wait(self.backoff.delay(streak - 1)):
                    break
            except Exception as exc:  # any API/transport failure: back off, then resume
                if self._stop.is_set():
                    break
                delay = self._failed(st, exc)
                if self._stop.wait(delay):
                    break

    def _failed(self, st: StreamState, exc: BaseException) -> float:
        msg = str(exc) if isinstance(exc, (ShortWatch, WatchOverran)) else api_message(exc)
        now = self.clock()
        with self._lock:
            st.failures += 1
            st.errors += 1
            if st.failing_since is None:
                st.failing_since = now
            st.last_error = msg
            n = st.failures
            first_short = isinstance(exc, ShortWatch) and not st.short_said
            if first_short:
                st.short_said = True
        delay = self.backoff.delay(n)
        asked = retry_after_s(exc)
        if asked is not None:
            # No sooner than the server asks; no later than the back-off's ceiling, whatever a
            # peer writes there (the stream's failing time, and so /readyz, counts on meanwhile).
            delay = max(delay, min(float(asked), self.backoff.max_s))
        if isinstance(exc, ShortWatch):
            # Said once per failure streak: the server may do it to every watch, for hours.
            log.log(logging.WARNING if first_short else logging.DEBUG,
                    "%s watch ended at once (attempt %d): %s. The API server, or a proxy before it, closes "
                    "watches as soon as they open; the feeder backs off (retrying in %.1fs, then up to %gs) and "
                    "/readyz turns false after %.0fs of it (said once until the watch works again)",
                    st.kind, n, msg, delay, self.backoff.max_s, self.stale_after_s)
        else:
            log.warning("%s %s failed (attempt %d): %s; retrying in %.1fs", st.kind,
                        "list" if not st.synced else "watch", n, msg, delay)
        return delay

    def _healthy(self, st: StreamState) -> None:
        """The stream is known to work: an event came, a watch ended cleanly, or a list succeeded."""
        with self._lock:
            self._recovered(st)
            st.last_contact = self.clock()

    def _recovered(self, st: StreamState) -> None:
        """End the failure streak (under ``self._lock``)."""
        if st.failing_since is not None:
            log.info("%s stream recovered after %d failed attempts", st.kind, st.failures)
        st.failures = 0
        st.failing_since = None
        st.last_error = ""
        st.short_said = False

    def _opened(self, st: StreamState) -> None:
        """A watch request was answered 200: the API server is reachable, but the stream has yet to
        show it works (it may end at once with an ERROR event), so the failure streak goes on."""
        now = self.clock()
        with self._lock:
            st.last_contact = now
            st.open_since = now

    def _settle(self, st: StreamState, now: float) -> None:
        """(Under ``self._lock``.) A watch that has stayed open without error for ``open_grace_s``
        ends the failure streak, event or not: a healthy watch on a quiet cluster sends nothing.
        Evaluated when asked (``ready()``, ``status()``, the end of the watch): no timer."""
        if (st.failing_since is not None and st.open_since is not None
                and now - st.open_since >= self.open_grace_s):
            self._recovered(st)

    def _list_call(self, kind: str, limit: int = 0, cont: str = "") -> Any:
        """One list request (a page of ``limit`` objects from ``cont``; 0 and "": everything), unread."""
        fn = self.core.list_node if kind == NODES else self.core.list_pod_for_all_namespaces
        paging: dict[str, Any] = {}
        if limit > 0:
            paging["limit"] = limit
        if cont:
            paging["_continue"] = cont
        return fn(_preload_content=False, _request_timeout=self.request_timeout_s, **paging)

    def _list_pages(self, kind: str, apply: Callable[[list], None], restart: Callable[[], None]) -> tuple[str, int, int]:
        """List every object of ``kind`` in pages of ``page_size`` objects and ``page_bytes`` of
        JSON (``limit`` + ``continue``, as client-go's pager does), handing each page's items to
        ``apply`` as it arrives and dropping it: the list's peak memory is a page's, not the
        cluster's. Returns (resourceVersion, objects, requests).

        A page whose body passes ``page_bytes`` is abandoned unread and asked for again, from the
        same ``continue`` token (the same snapshot), with an eighth of the objects, down to one
        (:class:`~stowage.kubelist.PageSizer`): a pod author's giant pods cost small pages, not the
        component. The first page asked again is a new list (nothing was applied yet). A page of
        one object past :data:`~stowage.kubelist.OBJECT_BYTES` (no API server serves one; a peer
        that lies could send gigabytes) is abandoned unread and fails the list
        (:class:`~stowage.kubelist.ObjectTooBig`): the feed backs off and lists again.

        The API server serves every page of one list from the same snapshot (the first page's
        resourceVersion; no resourceVersion is sent, so the snapshot is current). When that
        snapshot is compacted before the list ends, a continued page answers 410 with the Status
        reason ``Expired`` ("the provided continue parameter is too old"): then ``restart`` is
        called (forget what the pages so far gathered; what they applied is applied again, or
        removed if the new list no longer has it: it was deleted meanwhile, and no watch will say
        so) and the list starts again from its first page, in pages. client-go's pager lists
        everything in one request there instead (``FullListIfExpired``), and that one response is
        the whole cluster's size: the memory the pages bound. A snapshot lasts ~5 minutes (etcd
        compaction), far longer than a list of pages takes, so a new list completes; after
        :data:`~stowage.kubelist.EXPIRED_RESTARTS` expired in a row, the list fails (backs off, lists again).
        Any other error propagates, a 410 of another reason (``Gone``, a proxy's) or an Expired
        first page included: the list fails, and the feed backs off and lists again from the
        start, as client-go does.
        """
        return list_in_pages(lambda limit, cont: self._list_call(kind, limit, cont), self._sizers[kind],
                             f"{kind} list", kind, apply, restart, log, list_kind=f"{_KINDS[kind]}List")

    def _relist(self, st: StreamState) -> None:
        """List every object of the kind and make the model match it exactly.

        The list comes in pages (:meth:`_list_pages`), each applied as it arrives, so a list that
        fails part-way (the feed then backs off and lists again) has applied its first pages.
        That is safe: what a page applies is the object as the API server holds it now (the
        list's snapshot is newer than anything the model had from the watch; a pod's record, a
        node's cards), exactly what a complete list applies of it. What makes the model *match*
        the list waits for its end: nothing is removed for being absent (nodes and pods gone,
        pending pods no longer listed, the pods told deleted to ``on_pod_deleted``, the marks
        kept), no pod is shown to ``on_pod_seen``, and neither the resourceVersion the watch
        resumes from nor ``synced`` is set, until the last page is applied.

        Pods are shown to ``on_pod_seen`` in creation order across all pages, after the last
        one, as the whole list sorted once showed them: pods a restarted extender learns from
        are shown to its placers in the order the running one saw them arrive. Until then only
        what learning reads is kept of each (:func:`pod_for_learn`), not the whole object, and
        those up to ``list_learn_bytes`` (:data:`LIST_LEARN_BYTES`): past it, the copies kept
        are shown at once, in creation order among themselves (a pod shown that a list
        restarted after a 410 Expired no longer finds is told deleted, as any other).

        A pod listed twice (one uid, one namespace/name) fails the list: a page served again (a
        proxy that drops ``continue``). Two objects of one uid under different names are no loop
        but a peer that lies (uids are unique on an API server): the list goes on, the second is
        that object's error (:meth:`_uid_taken`), and the pod holding the uid keeps its cards,
        whichever comes first. Failing the list there, as it did, failed every list while both
        existed: no first list (the extender never ready), or a model frozen at the last one.
        """
        if st.kind == PODS:
            with self.model.lock:
                before = set(self.model.allocations)  # allocations older than this list
        else:
            before = set(self.model.node_names())
        if st.kind == NODES:
            seen: set[str] = set()

            def apply(items: list) -> None:
                for node in items:
                    name = str(meta(node).get("name") or "")
                    if name and name in seen:
                        raise ListLoop.twice(NODES, name)
                    seen.add(name)
                    self._apply_node(node)

            def restart() -> None:   # what the pages so far applied goes too if the full list lacks it
                before.update(seen)
                seen.clear()

            rv, count, requests = self._list_pages(NODES, apply, restart)
            for name in before - seen:
                self._remove_node(name)
        else:
            listing = PodListing()

            def apply(items: list) -> None:
                for pod in items:
                    uid = str(meta(pod).get("uid") or "")
                    key = pod_key(pod)
                    first = listing.seen.get(uid) if uid else None
                    if first == key:   # the same pod again: a page served twice
                        raise ListLoop.twice(PODS, uid)
                    if first is None:
                        listing.seen[uid] = key
                    # else another name under a uid this list gave already: that object's error
                    # (_uid_taken), the list goes on (see _relist's docstring)
                    self._apply_pod(pod, listing=listing)
                    if listing.learn_bytes > self.list_learn_bytes:
                        self._show_listed(listing)

            def restart() -> None:   # what the pages so far applied goes too if the full list lacks it
                before.update(listing.seen.keys())
                listing.clear()

            rv, count, requests = self._list_pages(PODS, apply, restart)
            self._listed_pods(before, listing)
        now = self.clock()
        with self._lock:
            st.rv = rv
            st.synced = True
            st.lists += 1
            st.last_list = now
        self._healthy(st)
        log.info("listed %d %s at resourceVersion %s (%d request%s)", count, st.kind, rv, requests,
                 "" if requests == 1 else "s")

    def _listed_pods(self, before: set[str], listing: "PodListing") -> None:
        """A pod list is complete: show its pods to ``on_pod_seen`` in creation order, then make
        the model match it (``before``: the allocations the model held when the list began)."""
        seen = listing.seen.keys()
        with self._lock:   # the pending pods this list did not write are gone, and so are the
            self._pending.keep_only(listing.pending)   # objects of other names under held uids it did not list
            self._uid_clashes = {u: why for u, why in self._uid_clashes.items() if u in listing.clashed}
            # and the errors of pods it does not list (deleted while the watch was away): a pending
            # pod's holds nothing in the model, so no release below would drop it
            self._pod_errors = {u: why for u, why in self._pod_errors.items() if u in seen}
        self._show_listed(listing)
        with self._lock:
            gone_known = [u for u in self._records if u not in seen]
            gone_shown = self._shown - seen
            self._shown -= gone_shown
        # Pods deleted while we were not watching. Allocations made after the list began are kept.
        for uid in (before - seen) | set(gone_known):
            self._forget_pod(uid)
        if self.on_pod_deleted is not None:
            for uid in sorted(gone_shown):
                self.on_pod_deleted(uid)
        if self.marks is not None:
            self.marks.keep_only(seen)

    def _show_listed(self, listing: "PodListing") -> None:
        """Show the learn copies a pod list kept to ``on_pod_seen``, in creation order, and drop them.
        Copies over ``list_learn_bytes`` are a batch shown before the list's end: counted, and said once."""
        early = listing.learn_bytes > self.list_learn_bytes
        with self._lock:
            self.list_learn_peak = max(self.list_learn_peak, listing.learn_bytes)
            self.list_learn_early_batches += int(early)
            first = early and self.list_learn_early_batches == 1
        if first:
            # Named only where a flag sets it: stowage inspect/plan list with a feeder of their own.
            setting = f" (set by {self.list_learn_flag})" if self.list_learn_flag else ""
            log.warning("pod list: its learn copies passed their bound of %s%s; they are shown to the placers in "
                        "batches, in creation order only within each, so the learned table may differ from one "
                        "built from the same pods in creation order (logged once)",
                        byte_size(self.list_learn_bytes), setting)
        if self.on_pod_seen is not None:
            listing.learn.sort(key=lambda kept: kept[0])
            with self.learning_in_bulk():
                for _, data in listing.learn:
                    pod = unpack(data)
                    with self._lock:
                        self._shown.add(str(meta(pod).get("uid")))
                    try:
                        self.on_pod_seen(pod)
                    except Exception:  # one odd pod must not fail the list (nor did it when shown while applied)
                        log.exception("pod %s could not be shown to the placers", meta(pod).get("name"))
        listing.learn = []
        listing.learn_bytes = 0

    def _watch(self, st: StreamState) -> None:
        """One watch request from ``st.rv`` until the server ends it; events applied as they come."""
        w = WatchStream()
        timeout = int(self.watch_timeout_s * (1 + self.rng.random()))
        list_fn = self.core.list_node if st.kind == NODES else self.core.list_pod_for_all_namespaces

        def fn(*args: Any, **kwargs: Any) -> Any:
            resp = list_fn(*args, **kwargs)  # non-2xx raised here; returning means the stream is open
            self._opened(st)
            return resp

        if self._stop.is_set():
            return
        self._watches[st.kind] = w
        with self._lock:
            st.watches += 1
        # Real time, from before the request (as client-go measures it): ``self.clock`` may be a
        # test's hand-moved clock, and this is about how fast the server really closed the stream.
        started = time.monotonic()
        seen = 0
        ended = False
        # The read timeout ends a watch whose peer sends nothing; this ends one whose peer sends
        # bytes that make no event (each read succeeds): asked to end after ``timeout``, a watch
        # still open ``watch_overrun_s`` later is cut (its socket shut down under the reader).
        overran = threading.Event()

        def cut() -> None:
            overran.set()
            w.stop()
        limit = threading.Timer(timeout + self.watch_overrun_s, cut)
        limit.daemon = True
        limit.start()
        try:
            for ev in w.stream(fn, resource_version=st.rv, timeout_seconds=timeout, allow_watch_bookmarks=True,
                               _request_timeout=(self.request_timeout_s, timeout + 30)):
                if self._stop.is_set():
                    break
                seen += 1
                self._event(st, ev.get("type"), ev.get("object"))
            ended = True
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(api_message(exc)) from exc
            raise
        except Exception:
            if overran.is_set():
                raise self._overran(timeout) from None
            raise
        finally:
            limit.cancel()
            self._watches.pop(st.kind, None)
            lasted = time.monotonic() - started
            short = ended and seen == 0 and lasted < self.short_watch_s
            with self._lock:   # open long enough, it ended any earlier streak: a failure now starts a new one
                if not short:  # (a watch closed at once proves nothing, whatever a test's clock says)
                    self._settle(st, self.clock())
                st.open_since = None
        if self._stop.is_set():
            return
        if overran.is_set():
            raise self._overran(timeout)
        if short:
            raise ShortWatch(f"the API server ended the watch cleanly after {lasted:.2f}s without an event "
                             f"(a very short watch)")
        self._healthy(st)
        with self._lock:
            st.gone_streak = 0
        if seen == 0:
            self._check_not_ahead(st)
        if lasted < self.short_watch_s:
            # Over at once, yet with events: not a failure (it delivered), but a server that does
            # it every time (one bookmark, then the end) must not have the watch re-opened in a
            # loop. client-go is held to 5 requests a second by its client's rate limiter; this is
            # one watch a kind per short_watch_s at most, while it goes on.
            self._stop.wait(self.short_watch_s - lasted)

    def _check_not_ahead(self, st: StreamState) -> None:
        """After a watch that ended without an event: raise :class:`Gone` (a relist) when the
        stream's resourceVersion is ahead of the API server's current one.

        Why: kube-apiserver (v1.28.7, checked) answers a watch from a resourceVersion ahead of
        its own with 200 and then nothing until its timeout, and a healthy watch on a quiet
        cluster also ends without an event (no bookmark either), so the watch alone cannot tell a
        frozen model from a quiet cluster. It happens after etcd is restored from a backup, or
        after a peer's lying bookmark; the model then missed every change until the 10-minute
        resync while /readyz said in sync. The API server's current resourceVersion is what a
        list of one object carries (read from etcd: its revision now, which no resourceVersion
        the feed took from the server passes). resourceVersions are opaque by the API's rules,
        so they are compared only when both are whole numbers (etcd's revisions); a failed
        probe is logged and changes nothing (the watch itself worked). One small request per
        quiet watch (5-10 minutes) per kind."""
        ours = st.rv
        try:
            server = str((read_page(self._list_call(st.kind, limit=1), OBJECT_BYTES)[0].get("metadata") or {})
                         .get("resourceVersion") or "")
        except Exception as exc:   # (a probe only: the next quiet watch asks again)
            log.debug("%s: could not read the API server's resourceVersion: %s", st.kind, api_message(exc))
            return
        if _revision(ours) is not None and _revision(server) is not None and _revision(ours) > _revision(server):
            log.warning("%s watch: resourceVersion %s is ahead of the API server's %s (etcd restored from a "
                        "backup?): a watch from it sees nothing until the server passes it; relisting",
                        st.kind, ours, escaped(server))
            raise Gone(f"resourceVersion {ours} is ahead of the API server's {escaped(server)}")

    def _overran(self, timeout: int) -> WatchOverran:
        return WatchOverran(f"the watch was still open {self.watch_overrun_s:g}s after the timeoutSeconds={timeout} it "
                            f"was asked to end at (the API server, or a proxy before it, kept it open without "
                            f"whole events); it was cut and is re-opened")

    def _event(self, st: StreamState, type_: str | None, obj: Any) -> None:
        """Apply one watch event. An event that cannot be applied as a whole (a type other than
        ADDED, MODIFIED, DELETED, BOOKMARK; no object; an object of another ``kind`` than the
        stream's) raises :class:`UnusableEvent`: the stream
        fails and is re-opened from the last resourceVersion applied (client-go's watch decoder
        refuses both too). Skipped, the change it carried was lost while the model read complete,
        and taking its resourceVersion moved the watch past events not yet applied (or past the
        API server's own: kube-apiserver answers a watch from there with nothing). An object that
        lacks what its kind needs (a name, a uid) is that object's error only (logged)."""
        what = ""
        if type_ not in _EVENT_TYPES:
            what = f"of type {type_!r}"
        elif not isinstance(obj, Mapping):
            what = f"{type_} without an object"
        elif obj.get("kind", _KINDS[st.kind]) != _KINDS[st.kind]:
            what = f"{type_} of a {shown(obj.get('kind'))}, not a {_KINDS[st.kind]}"
        if what:
            raise UnusableEvent(f"{st.kind} watch: an event {what} cannot be applied; the watch is re-opened from "
                                f"resourceVersion {st.rv or '(none)'}")
        rv = resource_version(obj)
        if type_ in ("ADDED", "MODIFIED", "DELETED"):
            deleted = type_ == "DELETED"
            if st.kind == NODES:
                if deleted:
                    self._remove_node(str(meta(obj).get("name") or ""))
                else:
                    self._apply_node(obj)
            else:
                self._apply_pod(obj, deleted=deleted)
        with self._lock:
            if rv:
                st.rv = rv
            st.events += 1
            st.gone_streak = 0
        self._healthy(st)

    # ------------------------------------------------------------------ applying objects
    def _apply_node(self, node: Mapping[str, Any]) -> None:
        try:
            v = node_view(node, self.memory_unit_mib)
            if not v.name:
                log.error("node without metadata.name ignored")
                return
            if self._closed(node) and not v.closed & NodeClosure.OTHER:
                v = replace(v, closed=v.closed | NodeClosure.OTHER)
            with self._lock:
                if v.error and self.node_errors.get(v.name) != v.error:
                    log.error("node %s: cannot read its GPU inventory (%s); it gets no schedulable cards until fixed",
                              v.name, v.error)
                if v.error:
                    self.node_errors[v.name] = v.error
                else:
                    self.node_errors.pop(v.name, None)
                unchanged = self._node_fp.get(v.name) == v.fingerprint() and v.name in self.model.index
                self._node_fp[v.name] = v.fingerprint()
            if not unchanged:
                before = self._uuids_of(v.name)
                node_into_model(self.model, v)
                if self._uuids_of(v.name) != before:   # renumbered cards: not a cordon or a Ready flip
                    self._replace_records(v.name)
                if self.on_cards_freed is not None:
                    self.on_cards_freed(self.model.generation)
        except Exception:  # never let one odd object stop the feed
            log.exception("node %s could not be applied", meta(node).get("name"))

    def _closed(self, node: Mapping[str, Any]) -> bool:
        """What :attr:`node_closed` says of ``node`` (False without one, or when it fails)."""
        if self.node_closed is None:
            return False
        try:
            return bool(self.node_closed(node))
        except Exception:  # a reader's hook must not stop the feed: the node reads as it is
            log.exception("node %s: node_closed failed; the node is applied as it is", meta(node).get("name"))
            return False

    def _uuids_of(self, node: str) -> dict[int, str]:
        """The node's card index -> uuid as the model has it now (empty when unknown)."""
        with self.model.lock:
            meta = self.model.meta.get(node)
            return dict(meta.uuids) if meta is not None else {}

    def _placed(self, record: Any) -> Any:
        """The record with its cards where their uuids are on the node now (:func:`record_by_uuid`)."""
        uuids = self._uuids_of(record.node)
        return record_by_uuid(record, uuids) if uuids else record

    def _replace_records(self, node: str) -> None:
        """The node's inventory changed: put every recorded pod on it back on its cards by uuid
        (their indices may have shifted)."""
        with self._lock:
            records = [(uid, rec) for uid, rec in self._records.items() if rec.node == node]
        for uid, rec in records:
            placed = self._placed(rec)
            alloc = self.model.allocations.get(uid)
            if alloc is not None and alloc.node == node and tuple(c.index for c in placed.cards) != alloc.cards:
                log.warning("node %s: pod %s's card(s) %s now have index(es) %s (the node's cards were renumbered)",
                            node, alloc.name, [c.uuid for c in rec.cards], [c.index for c in placed.cards])
                self.model.assign(uid, alloc.name, **assign_args(placed, alloc.cpu_milli, alloc.host_mem_mib,
                                                                 alloc.kube_request))

    def _remove_node(self, name: str) -> None:
        with self._lock:
            self._node_fp.pop(name, None)
            self.node_errors.pop(name, None)
        self.model.remove_node(name)

    def _forget_pod(self, uid: str, departed: bool = True) -> None:
        """Drop the pod; ``departed``: it left the cluster (deleted, finished), rather than its
        record being rolled back (see :meth:`ClusterModel.release`)."""
        with self._lock:
            self._records.pop(uid, None)
            self._pod_errors.pop(uid, None)
            self._uid_clashes.pop(uid, None)
            self._overbooked.pop(uid, None)
            self._unrecorded.pop(uid, None)
        alloc = self.model.release(uid, departed=departed)
        if departed and alloc is not None and alloc.cards and self.on_cards_freed is not None:
            self.on_cards_freed(self.model.generation)

    def pending_uid(self, key: str) -> str | None:
        """The uid of the pending (unbound) pod ``namespace/name``, or None (also when its copy went
        past the cache's bounds: :mod:`extender.pending_pods`)."""
        with self._lock:
            return self._pending.uid(key)

    def _apply_pod(self, pod: Mapping[str, Any], deleted: bool = False, listing: PodListing | None = None) -> None:
        try:
            self._apply_pod_unsafe(pod, deleted, listing)
        except Exception:  # never let one odd object stop the feed
            log.exception("pod %s could not be applied", meta(pod).get("name"))

    def _apply_pod_unsafe(self, pod: Mapping[str, Any], deleted: bool, listing: PodListing | None = None) -> None:
        """Apply one pod (a watch event, or with ``listing`` one of a list's pods: it is then
        shown to ``on_pod_seen`` when the list is complete, in creation order, and the pending
        pods the list does not write are dropped at its end).

        Everything here is keyed by uid, which is whatever the peer sends. A pod whose uid the
        model holds under another namespace/name is that object's error only (:meth:`_uid_taken`):
        otherwise its events would be taken for the holder's, and its DELETED free the cards of a
        pod that still runs. (One dict lookup and one string compare per event: the burst's
        filters wait on this thread.)"""
        v = pod_view(pod, self.trust)
        held = self.model.allocations.get(v.uid)
        if held is not None and held.name != v.key:
            self._uid_taken(v, held.name, deleted, listing)
            return
        if self.marks is not None:
            self.marks.note(pod, gone=deleted or v.terminal)
        # Only Stowage's schedulers' pods come to its bind (another scheduler's record is not
        # honoured), and bind reads little of them; a GET serves any other.
        ours = self.trust.scheduler_names is None or v.scheduler in self.trust.scheduler_names
        kept = pod_for_bind(pod) if ours and not (deleted or v.terminal or v.node) else None
        packed = pack(kept) if kept is not None else None   # (outside the lock: get_pod waits on it)
        with self._lock:
            if packed is None:   # (a copy that cannot be packed, only a hand-made object's: a GET at bind)
                self._pending.pop(v.key)
            else:
                self._pending.put(v.key, meta(kept).get("uid"), packed)
                if listing is not None:
                    listing.pending.add(v.key)
        if not v.uid:
            log.error("pod %s without metadata.uid ignored", v.key)
            return
        if deleted:
            with self._lock:
                self._shown.discard(v.uid)
            if self.on_pod_deleted is not None:
                self.on_pod_deleted(v.uid)
        elif self.on_pod_seen is not None and ours:
            if listing is not None:   # shown at the list's end, in creation order (_listed_pods)
                copy = pod_for_learn(pod)
                data = pack(copy)
                if data is None:   # only a hand-made object holds what JSON has no form for
                    log.error("pod %s could not be kept for the placers until the list's end; not shown", v.key)
                else:
                    order = creation_order(copy)
                    listing.learn.append((order, data))
                    listing.learn_bytes += _LEARN_ENTRY_BYTES + sum(map(sys.getsizeof, order)) + sys.getsizeof(data)
            else:
                with self._lock:
                    self._shown.add(v.uid)
                self.on_pod_seen(pod)
        if deleted or v.terminal:
            self._forget_pod(v.uid)
            return
        if v.error:
            with self._lock:
                first = self._pod_errors.get(v.uid) != v.error
                self._pod_errors[v.uid] = v.error
            if first:
                log.error("pod %s (uid %s): %s. Stowage cannot tell which cards it uses; they are NOT counted "
                          "(any earlier valid record is kept)", v.key, v.uid, v.error)
            if v.node and v.uid not in self.model.allocations:
                self._hold_host(v, pod)  # it still runs there: its CPU, memory and pod slot count
            return
        with self._lock:
            self._pod_errors.pop(v.uid, None)
            known = self._records.get(v.uid)
        if v.record is not None and not v.node:
            # Recorded but not bound: a bind in flight (this extender already booked it in memory),
            # or one whose extender died between the record and the Binding. Such a record must not
            # count against the pod itself when it is scheduled again, so only bound pods' records
            # are replayed; a record applied earlier is taken back (the pod was never bound).
            if known is not None:
                self._forget_pod(v.uid, departed=False)
            return
        if v.record is not None:
            if known == v.record:
                if not (self._overbooked and v.uid in self._overbooked):
                    return  # nothing new for the model (status updates, our own bind echo)
            else:
                self.model.assign(v.uid, v.key, **assign_args(self._placed(v.record), v.cpu_milli, v.host_mem_mib,
                                                              pod_kube_request(pod, self.trust.memory_unit_mib)))
                with self._lock:
                    self._records[v.uid] = v.record
                    self._unrecorded.pop(v.uid, None)
            self._note_overbooked(v.uid, v.key)
            return
        if known is not None:
            if v.node == known.node:
                # Removed from a pod bound there: its containers keep the devices they started
                # with, so the cards stay counted as its last record named them (as for a record
                # turned invalid). Freeing them once gave the card it still used to the next pod.
                self._record_removed(v)
                return
            self._forget_pod(v.uid, departed=False)
        if v.node:
            self._note_unrecorded(pod, v.uid, v.key, v.node)
            self._hold_host(v, pod)

    def _record_removed(self, v: Any) -> None:
        """Bound pod ``v``'s applied record was removed: a pod error, logged once; its cards stay."""
        why = (f"{ALLOCATION_ANNOTATION} was removed from the bound pod: its cards stay counted as its last "
               "record named them")
        with self._lock:
            first = self._pod_errors.get(v.uid) != why
            self._pod_errors[v.uid] = why
        if first:
            log.error("pod %s (uid %s): %s", v.key, v.uid, why)

    def _note_overbooked(self, uid: str, key: str) -> None:
        """Pod ``uid``'s record was applied (or it was said overbooked before): whether its cards
        are now booked past what they have (free memory or compute below zero: a whole card that
        another pod holds too, shares past its memory), and if so, a pod error that names them and
        their other holders, logged once, until the pod or they go (re-checked at each of its
        events while it stands). Both records stay booked: the feed replays records with no check
        (a pod bound there may run there, and counting one only would give the card to a third);
        the device plugin decides on the node (it refuses the devices of a second whole holder;
        shares past a card's memory it does not check). The pod said is the one whose record came
        second, in watch order (list order after a relist). Before, nothing was said: such a
        record came from a Binding applied after its failure was answered (ExtenderService.
        _hold_unknown), or from a hand. Two array reads per card of each new record."""
        model = self.model
        with model.lock:
            alloc = model.allocations.get(uid)
            i = model.index.get(alloc.node) if alloc is not None and alloc.applied else None
            over: list[int] = []
            others: list[str] = []
            if alloc is not None and i is not None:
                a = model.a
                over = [k for k in alloc.cards if k < a.shape[1] and (a.mem_free[i, k] < 0 or a.core_free[i, k] < 0)]
            if over:
                meta = model.meta.get(alloc.node)
                others = sorted({o.name for u in (meta.pods if meta is not None else ()) if u != uid
                                 for o in (model.allocations.get(u),) if o is not None and set(o.cards) & set(over)})
        if not over:
            if self._overbooked:
                with self._lock:
                    self._overbooked.pop(uid, None)
            return
        assert alloc is not None
        msg = (f"its record books card{'s' if len(over) > 1 else ''} {', '.join(map(str, over))} of node "
               f"{alloc.node} past what {'they have' if len(over) > 1 else 'it has'}, with "
               f"{', '.join(others) if others else 'the pods there'} (both counted; on the node the device plugin "
               "decides)")
        with self._lock:
            first = self._overbooked.get(uid) != msg
            self._overbooked[uid] = msg
        if first:
            log.error("pod %s (uid %s): %s", key, uid, msg)

    def _uid_taken(self, v: Any, holder: str, deleted: bool, listing: PodListing | None) -> None:
        """Pod ``v.key`` came with the uid of pod ``holder``, which holds it in the model. A real
        API server's uids are unique (a pod's namespace and name never change), so the peer lies
        (a proxy, a bug): nothing of it is applied, and the holder keeps its cards (taking them
        for the other's, or freeing them at its DELETED, would let a second pod be given cards in
        use). It is a pod error (``status()``, ``health()``; logged once) until the other object
        is deleted or finished, a complete list no longer has it, or the holder goes.

        In a list, such an object listed before the holder does not count the uid as listed: if
        the holder comes later in the list, it is listed then; if not, it is gone, and its cards
        are freed at the list's end like any pod's not listed (the other pod is then applied from
        its next event or list, as any). One listed after the holder leaves the uid listed: the
        holder keeps its cards, whatever the order (a second object of one name under one uid is
        a page served again, and fails the list: :meth:`_relist`)."""
        if listing is not None and listing.seen.get(v.uid) == v.key:
            del listing.seen[v.uid]   # listed first under the uid: the holder is not listed (yet)
        msg = (f"pod {v.key} came with the uid of pod {holder}, which holds it in the model (uids are unique on an "
               f"API server: a proxy or a peer that lies?); it is ignored and {holder} keeps its cards")
        with self._lock:
            if deleted or v.terminal:   # the other object is gone or done: nothing of it left to count
                self._uid_clashes.pop(v.uid, None)
                return
            if listing is not None:
                listing.clashed.add(v.uid)
            first = self._uid_clashes.get(v.uid) != msg
            self._uid_clashes[v.uid] = msg
        if first:
            log.error("pod %s (uid %s): %s", v.key, v.uid, msg)

    def _hold_host(self, v: Any, pod: Mapping[str, Any]) -> None:
        """A pod bound to a node without cards in the model (no GPU, or another scheduler's GPU
        pod): it holds its CPU, memory and a pod slot there, which the model counts as
        kube-scheduler does. Kept as it is when already held there (our own bind's reservation)."""
        held = self.model.allocations.get(v.uid)
        if held is not None and held.node == v.node and (held.cpu_milli, held.host_mem_mib) == (
                v.cpu_milli, v.host_mem_mib):
            return
        self.model.assign(v.uid, v.key, v.node, (), v.host_request, check=False,
                          kube_request=pod_kube_request(pod, self.trust.memory_unit_mib))

    def _note_unrecorded(self, pod: Mapping[str, Any], uid: str, key: str, node: str) -> None:
        """A bound GPU pod without our record (bound by another scheduler): say so once."""
        with self._lock:
            if uid in self._unrecorded:
                return
        try:
            req = pod_gpu_request(pod, self.memory_unit_mib, max_containers=None)
        except (ValueError, TypeError, AttributeError):   # RequestError, or an object of the wrong shape
            return
        if not req.is_gpu:
            return
        with self._lock:
            self._unrecorded[uid] = node
        log.warning("pod %s uses %s on node %s but has no stowage.io/allocation record (bound without the "
                    "Stowage extender?): Stowage does not know its cards and does not count them",
                    key, req.describe(), node)

