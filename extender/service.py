"""Filter, prioritize and bind over a :class:`~packing.model.ClusterModel`, without HTTP.

The Flask app (:mod:`extender.app`) only decodes bodies and encodes answers; every decision is
made here, with :mod:`packing.decide` — and ``stowage plan`` and the benchmarks place through
these very calls (:mod:`extender.placing`) — so tests, the demo and the benchmarks exercise the
very same logic:

- filter: step 1, which nodes fit (and :func:`packing.fit.reason` for each one that does not),
  and by default (``filter_keeps="best"``) step 2 at once: of the nodes that fit, only those
  prioritize would score 10 (the best to 1e-9), so kube-scheduler needs no prioritize call and
  chooses among equal nodes with its own scores — one round trip per pod instead of two;
- prioritize: step 2, the placer's scores of the nodes that fit, ranked 0..10 (for a scheduler
  config that blends them with kube-scheduler's own scores: ``filter_keeps="fitting"``);
- bind: step 3, the card(s) on the chosen node, re-checked and reserved.

The verbs are written as the plain reference path (:class:`ReferencePath`: every answer computed
afresh, one node's reason at a time) with ONE seam where the speed-ups plug in: the service asks
``self.path`` — the reference, or :class:`extender.speedups.FastPath` (the default) — to look up
node names, find the nodes that fit, word the reasons and score; both answer the same, which
the tests check by running both (``ExtenderService(speedups=False)``).

Concurrency contract: every read of the model that must be consistent (fit for all nodes,
scores, card choice) happens under ``model.lock``; bind's re-check and reservation
(``model.assign(check=True)``) happen in the same critical section as the card choice, so two
binds can never take the same card whatever the interleaving. The binder (which talks to the
API server and may be slow) runs OUTSIDE the lock, so binds of different pods write concurrently
while each holds its reservation; if it fails, the reservation is released under the lock (the
next pod can take the cards), except when the write's outcome is unknown
(:class:`~extender.errors.BindOutcomeUnknown`: the pod may be running on them, or be bound on
them when the API server applies the Binding late; :meth:`ExtenderService._hold_unknown`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import sys
import threading
import time
from collections import OrderedDict
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol

import numpy as np

from packing import decide
from packing.fit import reason
from packing.model import AllocationConflict, CardArrays, ClusterModel, PodAllocation
from packing.placer import Placer, attach_placer
from packing.preempt import DEFAULT_BUDGET, judge_node, pdb_violations, reserve, row_copy
from packing.pod_policy import PACK, SPREAD, PodPolicy, PolicyError, pod_policy
from packing.registry import placer_for
from packing.stranded import typical_one_gpu_host_request, stranded_whole_cards
from stowage.allocation import AllocationRecord, CardShare
from stowage.resources import DEFAULT_MEMORY_UNIT_MIB, GpuRequest, RequestError, fmt_cards, pod_request

from .bounds import BoundUse
from .errors import BindError, BindOutcomeUnknown  # noqa: F401  (BindError re-exported: binders raise it)
from .hold_timer import HoldTimer
from .kube_objects import NOT_A_POD, TERMINAL_PHASES, object_meta
from .learned_past import DepartedPods, Shape, replay
from .learned_uids import LEARNED_BYTES, LearnedUids
from .nominated import PodMarks
from .rowcache import DEFAULT_MAX_SHAPES
from .speedups import FastPath
from .wire import (BindingArgs, ExtenderArgs, FilterResult, PlainParser, PreemptionArgs, encode_priority_list,
                   filter_answer, pod_priority, priority_list, take)

log = logging.getLogger("stowage.extender")

UNKNOWN_NODE = "node unknown to Stowage"
# filter's answer (ExtenderService(filter_keeps=...), `stowage extender --filter-keeps`)
FILTER_KEEPS_BEST = "best"        # only the nodes prioritize would score 10: the decision itself
FILTER_KEEPS_FITTING = "fitting"  # every node that fits; prioritize ranks them
FILTER_KEEPS = (FILTER_KEEPS_BEST, FILTER_KEEPS_FITTING)
PREEMPT_BUDGET = 4000
# Proposed victims examined per preempt request, all nodes together: each is read under the model's
# lock (~4 us), so 200,000 hold it ~0.8 s in all at most. kube-scheduler proposes a minimal set
# on each of at most its candidate nodes (10 % of the nodes, at least 100): tens of thousands on
# the largest clusters.
PREEMPT_VICTIMS = 200_000


class Binder(Protocol):
    """Makes a bind real: binds the pod with its allocation record (Kubernetes: one Binding that
    carries the record, :mod:`extender.kube_binder`).

    ``record`` is None for a pod that asks for no GPU (nothing to record, just bind). Raise
    :class:`BindError` on failure, leaving no record behind when the pod was not bound; raise
    :class:`BindOutcomeUnknown` when whether it was bound cannot be told (the service then
    keeps the cards reserved).
    """

    def bind(self, namespace: str, name: str, uid: str, node: str, record: AllocationRecord | None) -> None: ...


class PodSource(Protocol):
    """Where bind finds a pod it did not see at filter (e.g. after an extender restart).

    A source may also have ``pending_pod(namespace, name) -> dict | None``, the copy of a
    pending pod it already holds, without an API call (:meth:`extender.kube.KubeFeeder.pending_pod`):
    bind then books what that copy asks for, not what a request body said (see
    :meth:`ExtenderService._pod_for_bind`)."""

    def get_pod(self, namespace: str, name: str) -> dict | None: ...


class SimBinder:
    """Embedded (simulated) mode: there is no API server, the model reservation is the binding.

    Keeps what was bound so the demo and tests can look at it.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bound: dict[str, tuple[str, AllocationRecord | None]] = {}

    def bind(self, namespace: str, name: str, uid: str, node: str, record: AllocationRecord | None) -> None:
        with self.lock:
            self.bound[uid] = (f"{namespace}/{name}", record)


@dataclass(frozen=True)
class PodInfo:
    """What the service needs to know about one pod, parsed once per request body."""

    uid: str
    namespace: str
    name: str
    req: GpuRequest | None  # None when the request or policy is invalid
    policy: PodPolicy | None
    error: str = ""         # the user-facing message when req/policy is invalid
    resource_version: str = ""  # metadata.resourceVersion of the object parsed ("" if none)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def row_view(a: CardArrays, i: int) -> CardArrays:
    """Node i alone as a 1-node :class:`CardArrays` (numpy views, no copy)."""
    return CardArrays(**{f.name: getattr(a, f.name)[i:i + 1] for f in dataclasses.fields(CardArrays)})


@dataclass
class Feasibility:
    """Step 1's answer for every row of the model: fit, no-preemption-helps, card mask, usable cards."""

    ok: np.ndarray      # [N] bool
    unres: np.ndarray   # [N] bool
    mask: np.ndarray    # [N, K] bool
    usable: np.ndarray  # [N, K] bool


@dataclass
class NodeRows:
    """Request node names and their model rows (-1: unknown to the model)."""

    names: list[str]
    rows: np.ndarray

    def take(self, sel: np.ndarray) -> list[str]:
        return take(self.names, sel)


class ReferencePath:
    """The seam, and the plain path through it: every answer computed afresh from
    :mod:`packing`, the obvious way. :class:`extender.speedups.FastPath` has the same methods and
    gives the same answers faster. Called under ``model.lock``."""

    def wire_parser(self) -> PlainParser:
        """What decodes request bodies (the fast path recognises repeated NodeNames arrays)."""
        return PlainParser()

    def attach(self, placer: Placer, model: ClusterModel) -> None:
        """Connect a placer to the model (the fast path lets incremental indexes track rows)."""

    def lookup(self, model: ClusterModel, names: list[str]) -> NodeRows:
        """The model rows of the request's node names."""
        return NodeRows(names, np.array([model.index.get(n, -1) for n in names], np.int64))

    def remember_passing(self, model: ClusterModel, entry: NodeRows, passing: list[str], rows: np.ndarray,
                         sel: np.ndarray) -> None:
        """A filter's passing list, which the pod's prioritize will send (the fast path keeps it)."""

    def feasible(self, model: ClusterModel, req: GpuRequest, policy: PodPolicy) -> Feasibility:
        """Step 1 over every node of the model."""
        mask, f = decide.feasible(model.a, model.models, req, policy)
        return Feasibility(ok=f.ok, unres=f.unresolvable, mask=mask, usable=f.usable)

    def reasons(self, model: ClusterModel, feas: Feasibility, rows: np.ndarray, req: GpuRequest,
                tolerates: int = 0) -> list[str]:
        """Why each of ``rows`` cannot take the pod, without per-node numbers (filter's answer:
        kube-scheduler counts the nodes per reason, :func:`packing.fit.reason`); ``tolerates``:
        the node closures the pod's tolerations open."""
        return [node_reason(model, model.a, i, req, feas.mask, model.names[i], detail=False, tolerates=tolerates)
                for i in rows.tolist()]

    def scores(self, model: ClusterModel, feas: Feasibility, placer: Placer, req: GpuRequest,
               rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Step 2: raw scores of the feasible ``rows``, as (values, inverse) with the scores
        ``values[inverse]`` (inverse None: ``values`` itself)."""
        return decide.score(placer, model.a, req, rows, feas), None

    def answer_heads(self, entry: NodeRows) -> list[bytes] | None:
        """Prepared pieces of the prioritize answer for these names, if kept (None: encode afresh)."""
        return None


def node_reason(model: ClusterModel, a: CardArrays, i: int, req: GpuRequest, mask: np.ndarray,
                name: str | None, detail: bool = True, tolerates: int = 0) -> str:
    """:func:`packing.fit.reason` of row i of ``a`` (the model's arrays, or one node's row of
    them), knowing whether node ``name`` is whole-only (its card memory is unknown), for a pod
    whose tolerations open the node closures ``tolerates``."""
    meta = model.meta.get(name) if name else None
    return reason(a, i, req, mask, whole_only=meta is not None and meta.whole_only, detail=detail,
                  tolerates=tolerates)


@dataclass
class BindWrite:
    """Bind's second half (:meth:`ExtenderService.reserve` made the first): the API write, outside
    the model lock; on failure the reservation is released (unless the outcome is unknown)."""

    service: "ExtenderService"
    namespace: str
    name: str
    uid: str
    node: str
    record: AllocationRecord | None
    reserved: PodAllocation | None     # what reserve() booked (None: the pod already held it)
    what: str                          # the request, for the log line
    forget: bool                       # drop the pod from the service's cache once bound

    def write(self) -> str:
        """'' or the error message, as :meth:`ExtenderService.bind` answers."""
        svc = self.service
        err = svc._complete(self.namespace, self.name, self.uid, self.node, self.record, self.reserved, self.what)
        if not err and self.forget:
            svc._forget(self.uid)
        return err


def pod_ask(pod: Mapping[str, Any], memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB,
            default_policy: PodPolicy | None = None) -> tuple[GpuRequest, PodPolicy] | None:
    """What a pod asks: its request (GPU, host CPU and memory) and its policy from its
    ``stowage.io/`` annotations; None for a pod Stowage cannot schedule (as at filter). The one
    parse of a pod outside filter: what the placers learn (:func:`pod_shape`) and what ``stowage
    plan --drain`` moves a live cluster's pods as."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    try:
        req = pod_request(pod, memory_unit_mib)
        ann = meta.get("annotations")
        if ann is not None and not isinstance(ann, Mapping):
            return None
        return req, pod_policy(pod, ann, default_policy or PodPolicy())
    except (RequestError, PolicyError, TypeError, AttributeError, ValueError):
        return None


def pod_shape(pod: Mapping[str, Any], memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB,
              default_policy: PodPolicy | None = None) -> Shape | None:
    """What the placers learn from a pod: its request and its list of allowed GPU models; None
    for a pod Stowage cannot schedule (it teaches nothing, as at filter). The watch's
    (``learn_pod``) and ``stowage plan``'s."""
    ask = pod_ask(pod, memory_unit_mib, default_policy)
    return None if ask is None else (ask[0], ask[1].models_include)


MAX_META_TEXT = 253   # characters: the longest name or namespace Kubernetes allows

# The pod-info cache's bounds: entries, and bytes (estimated by :func:`pod_info_bytes`). Entries
# alone let crafted pods through the verbs' port (two 64-model lists of 128-character names each,
# ~24 KB an entry) keep ~2.3 GiB; 100,000 ordinary pods (~0.5 KB each, estimated ~0.85 KB) stay
# within the bytes, so the entry bound alone governs them, as before.
POD_CACHE_ENTRIES = 100_000
POD_CACHE_BYTES = 128 * 1024 * 1024
# What an entry holds besides its texts: the PodInfo, its GpuRequest and PodPolicy, the LRU's node
# and the key index's slot (tracemalloc: ~60-350 B; rounded up, so the estimate errs high).
_ENTRY_BYTES = 400
# Deleted pods' UIDs remembered so that a late bind of one reserves nothing (pod_deleted): a bind
# comes within seconds of its filter, far fewer pods than this are deleted meanwhile. ~2 MB.
DELETED_UIDS = 10_000
# How long a reservation whose Binding's outcome is unknown (answered 5xx, answer lost) is kept
# though the pod reads unbound, unless the watch shows it bound (then it is simply held) or
# deleted: the API server may still be applying the Binding. kube-apiserver ends a request at its
# ``--request-timeout`` (60 s by default), and its storage update runs under that request's
# context; twice that leaves room for a proposal etcd commits late (docs/kube.md, "What it writes").
UNKNOWN_OUTCOME_HOLD_S = 120.0
# How soon a hold whose time is up, but whose pod could not be read (the API server did not
# answer) or is being bound again, is looked at again by the hold timer (end_lapsed_holds).
HOLD_RECHECK_S = 5.0


def pod_info_bytes(info: "PodInfo", shared: PodPolicy | None = None) -> int:
    """About how much memory ``info`` keeps in the pod cache: a fixed part and its texts (the model
    lists of its policy included, unless they are ``shared``'s, the default policy's, held once)."""
    n = _ENTRY_BYTES + sum(sys.getsizeof(t) for t in (info.uid, info.namespace, info.name, info.error,
                                                        info.resource_version, info.key))
    pol = info.policy
    if pol is not None:
        for models, common in ((pol.models_include, shared.models_include if shared else None),
                               (pol.models_exclude, shared.models_exclude if shared else None)):
            if models and models is not common:
                n += sys.getsizeof(models) + sum(sys.getsizeof(m) for m in models)
    return n


def _bound_or_finished(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` is bound (``spec.nodeName``) or finished (phase Succeeded or Failed): no
    Binding of it can land any more, so a hold of its cards for one has nothing left to wait for."""
    spec, status = pod.get("spec"), pod.get("status")
    return bool(isinstance(spec, Mapping) and spec.get("nodeName")) or (
        isinstance(status, Mapping) and status.get("phase") in TERMINAL_PHASES)


def _identity(meta: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """A pod's (name, namespace, uid, resourceVersion) as the pod cache keys it: the uid, else
    ``namespace/name``; the resourceVersion only with a uid, else ''."""
    name = _meta_text(meta, "name", "")
    namespace = _meta_text(meta, "namespace", "default")
    uid = _meta_text(meta, "uid", "") or f"{namespace}/{name}"
    rv = meta.get("resourceVersion")
    return name, namespace, uid, (rv if isinstance(rv, str) and meta.get("uid") else "")


def _meta_text(meta: Mapping[str, Any], field_name: str, default: str) -> str:
    """A pod's name, namespace or uid as text: a value that is not text or longer than any
    Kubernetes name (only the port can send one) is replaced by a bounded stand-in, so no
    reason, log line or cache entry carries it."""
    v = meta.get(field_name)
    if v is None or v == "":
        return default
    if isinstance(v, str) and len(v) <= MAX_META_TEXT:
        return v
    return f"<malformed {field_name}>"


class ExtenderService:
    """The three extender verbs over one shared model.

    Placers are kept per node-policy value ("pack", "spread") for the life of the service,
    because a placer may learn the workload mix from the pods it observes.
    """

    def __init__(self, model: ClusterModel, *, binder: Binder | None = None, pod_source: PodSource | None = None,
                 memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB, default_policy: PodPolicy | None = None,
                 placer_factory: Callable[[str], Placer] = placer_for,
                 pod_cache_size: int = POD_CACHE_ENTRIES, pod_cache_bytes: int = POD_CACHE_BYTES,
                 learned_bytes: int = LEARNED_BYTES, speedups: bool = True,
                 row_cache_shapes: int = DEFAULT_MAX_SHAPES, filter_keeps: str = FILTER_KEEPS_BEST,
                 unknown_outcome_hold_s: float = UNKNOWN_OUTCOME_HOLD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if memory_unit_mib <= 0:
            raise ValueError("memory unit must be a positive number of MiB")
        if filter_keeps not in FILTER_KEEPS:
            raise ValueError(f"filter_keeps must be one of {', '.join(FILTER_KEEPS)}, not {filter_keeps!r}")
        self.model = model
        # What filter answers: the nodes the placer ranks best (the decision, made in one round
        # trip; kube-scheduler's own scores choose among equals) or every node that fits (for a
        # scheduler config that also calls prioritize to blend our ranking with its scores).
        self.filter_keeps = filter_keeps
        self.binder: Binder = binder if binder is not None else SimBinder()
        self.pod_source = pod_source
        self.memory_unit_mib = memory_unit_mib
        self.default_policy = default_policy or PodPolicy()
        # The seam: the plain reference path, or the speed-ups (same answers; guarded by model.lock).
        self.path: ReferencePath | FastPath = FastPath(row_cache_shapes) if speedups else ReferencePath()
        self.placers: dict[str, Placer] = {p: placer_factory(p) for p in (PACK, SPREAD)}
        for placer in self._distinct_placers():
            # The model's GPU model names (the fragmentation placers match pods' model lists
            # against them) and its count of pods leaving (churn mode): what every user of a
            # placer gives it (attach_placer), the live extender included.
            attach_placer(placer, model)
            self.path.attach(placer, model)
        self._pods: OrderedDict[str, PodInfo] = OrderedDict()  # uid -> info, LRU
        self._uid_by_key: dict[str, str] = {}
        self._pods_lock = threading.Lock()
        # Bounded in entries and in estimated bytes (pod_info_bytes), least recently used out
        # first: what a pod author or the verbs' port puts in a pod cannot make the cache big.
        self._cache_size = pod_cache_size
        self._cache_bytes = pod_cache_bytes
        self.pod_cache_bytes_used = 0   # the estimate for what the cache holds now (under _pods_lock)
        self.pod_cache_evicted = 0      # entries dropped for the bounds since start (under _pods_lock)
        # uids the placers have learned from, kept apart from the pod cache (which forgets a pod
        # once it is bound): a pod sent again after its bind must not be learned twice. With
        # each, the shape learned (interned): when the pod is deleted it goes to ``departed``.
        # Bounded like the pod cache, in entries and estimated bytes (extender/learned_uids.py:
        # what forgetting a uid costs, and why pods with long model lists go first).
        self._learned = LearnedUids(pod_cache_size, learned_bytes)
        # What was learned from pods now deleted (and, loaded at start, from those its
        # predecessors saw): kept in a ConfigMap so a restart does not lose it
        # (extender/learned_past.py, extender/learned_store.py). Guarded by _pods_lock.
        self.departed = DepartedPods()
        # Whether a learned table's size bound was logged (Placer.table_bound; once per process).
        self._bound_logged = False
        # Its writer (extender/learned_store.PastKeeper) in kube mode, for /metrics; else None.
        self.past_keeper: Any = None
        self._inflight: set[str] = set()  # pod UIDs whose binder call is running (guarded by model.lock)
        # Pod UIDs whose reservation is kept because a Binding of theirs may still be applied (its
        # outcome unknown), with the clock time until which it is kept though the pod reads
        # unbound (guarded by model.lock). See _hold_unknown; empty on the normal path.
        self._unknown: dict[str, float] = {}
        self.unknown_outcome_hold_s = unknown_outcome_hold_s
        self._clock = clock
        # Ends those holds when their time is up (start_hold_timer: kube mode); None: only at the
        # pod's filter or a bind of it elsewhere.
        self._hold_timer: HoldTimer | None = None
        # UIDs of pods the watch saw deleted, the oldest forgotten first past DELETED_UIDS
        # (pod_deleted): bind refuses them. Guarded by _pods_lock.
        self._deleted: OrderedDict[str, None] = OrderedDict()
        # Told (uid, namespace, name, model generation) of each pod that fits on none of its
        # candidate nodes: kube mode requeues those when the model gains room (extender/requeue.py).
        self.on_refused: Callable[[str, str, str, int], None] | None = None
        # Pod priorities and nominated pods (fed by the Kubernetes watch): preempt and the
        # hold of nominated pods' cards (extender/nominated.py).
        self.marks = PodMarks(memory_unit_mib, self.default_policy)
        # Fits tried per preempt request, all nodes together (~0.25 ms each): kube-scheduler sends
        # at most its candidate nodes with their victims, far below this; a hostile body cannot
        # hold the model's lock for long (it is taken per node).
        self.preempt_budget = PREEMPT_BUDGET
        # ... and proposed victims read per request (a body may name millions on one node).
        self.preempt_victims = PREEMPT_VICTIMS

    # ------------------------------------------------------------------------------- pods
    def pod_info(self, pod: Mapping[str, Any]) -> PodInfo:
        """Parse a pod's GPU request and policy; remember it for bind; observe new pods."""
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
        name, namespace, uid, rv = _identity(meta)
        if rv:
            # The API server gives every change of an object a new resourceVersion, so the same
            # uid at the same version is the object parsed before (prioritize sends the pod that
            # filter just had): no need to parse its containers and annotations again.
            with self._pods_lock:
                known = self._pods.get(uid)
                if (known is not None and known.resource_version == rv and known.name == name
                        and known.namespace == namespace):
                    self._pods.move_to_end(uid)
                    self._uid_by_key[known.key] = uid
                    return known
        info = self._parse_pod(pod, meta, (name, namespace, uid, rv))
        size = pod_info_bytes(info, self.default_policy)
        with self._pods_lock:
            replaced = self._pods.get(uid)
            if replaced is not None:
                self.pod_cache_bytes_used -= pod_info_bytes(replaced, self.default_policy)
            self._pods[uid] = info
            self._pods.move_to_end(uid)
            self._uid_by_key[info.key] = uid
            self.pod_cache_bytes_used += size
            # (The newest entry stays even alone over the budget: bind needs the pod filter saw.)
            while len(self._pods) > self._cache_size or (len(self._pods) > 1
                                                         and self.pod_cache_bytes_used > self._cache_bytes):
                old_uid, old = self._pods.popitem(last=False)
                self.pod_cache_bytes_used -= pod_info_bytes(old, self.default_policy)
                self.pod_cache_evicted += 1
                if self._uid_by_key.get(old.key) == old_uid:
                    del self._uid_by_key[old.key]
        if info.req is not None:
            self._learn(uid, info.req, info.policy.models_include if info.policy is not None else ())
        return info

    def _parse_pod(self, pod: Mapping[str, Any], meta: Mapping[str, Any],
                   identity: tuple[str, str, str, str]) -> PodInfo:
        """A pod's GPU request and policy, or the pod's error, with its ``metadata`` and
        :func:`_identity` as the caller read them; nothing kept or learned."""
        name, namespace, uid, rv = identity
        try:
            bad = [f for f in ("name", "namespace", "uid") if _meta_text(meta, f, "").startswith("<malformed")]
            if bad:
                raise PolicyError(f"malformed pod object (metadata.{bad[0]} is not a Kubernetes name)")
            req = pod_request(pod, self.memory_unit_mib)
            ann = meta.get("annotations")
            if ann is not None and not isinstance(ann, Mapping):
                raise PolicyError("metadata.annotations must be an object")
            policy = pod_policy(pod, ann, self.default_policy)
            return PodInfo(uid=uid, namespace=namespace, name=name, req=req, policy=policy, resource_version=rv)
        except (RequestError, PolicyError) as exc:
            return PodInfo(uid=uid, namespace=namespace, name=name, req=None, policy=None,
                           error=f"Stowage cannot schedule this pod: {exc}", resource_version=rv)
        except (TypeError, AttributeError, ValueError, OverflowError, RecursionError) as exc:
            # A Pod object of the wrong shape (only the port can send one; a value nested ~1,000
            # deep passes the JSON decoder and fails when made text).
            return PodInfo(uid=uid, namespace=namespace, name=name, req=None, policy=None,
                           error=f"Stowage cannot schedule this pod: malformed pod object ({str(exc)[:160]})",
                           resource_version=rv)

    def _learn(self, uid: str, req: GpuRequest, models: tuple[str, ...] = ()) -> None:
        """Show the placers a pod, once per uid however often it is seen (filter, prioritize, a
        second scheduling cycle after its bind, the watch) while :attr:`_learned` remembers the
        uid: one its bounds forgot is learned again if seen again (extender/learned_uids.py).
        Nor once the watch showed it deleted (a scheduling cycle begun before the deletion may
        reach filter after it): it was learned already, no second deletion would ever forget its
        uid, and a restarted extender learns it once (:attr:`departed`)."""
        with self._pods_lock:
            if uid in self._deleted or not self._learned.add(uid, req, models):
                return
        with self.model.lock:  # placers are not required to be thread-safe
            for placer in self._distinct_placers():
                placer.observe(req, models)
            self._log_table_bound()

    def learn_departed(self, past: DepartedPods) -> int:
        """Learn the departed pods an earlier extender kept (its ConfigMap, read at start), before
        the first list shows the pods that still exist: the placers then hold what the earlier
        one had learned from the pods now gone, each shape at once (``Placer.observe`` with its
        count). They stay in :attr:`departed`, so what this one writes keeps them. Returns the
        pods learned."""
        with self._pods_lock:
            self.departed = self.departed.merged(past)
        # GPU pods have left the cluster: what the earlier extender's placers knew from the
        # releases it saw (the pack placer's churn mode), this one's release count (which starts
        # now) cannot tell it.
        return self.learn_shapes(past.items(), gpu_pods_left=past.gpu_pods_left)

    def learn_shapes(self, shapes: Iterable[tuple[GpuRequest, tuple[str, ...], int]],
                     gpu_pods_left: bool = False) -> int:
        """Show the placers ``count`` pods of each (request, models, count), in order, without
        the per-uid bookkeeping of :meth:`learn_pod` (the departed pods' past; a what-if of
        ``stowage plan`` replaying what the live extender learned). ``gpu_pods_left``: GPU pods
        have left the cluster (churn mode). Returns the pods learned."""
        with self.learning_in_bulk(), self.model.lock:
            placers = self._distinct_placers()
            shown = replay(shapes, lambda req, models, n: [p.observe(req, models, n) for p in placers])
            if gpu_pods_left:
                for p in placers:
                    p.note_release()
        return shown

    @contextmanager
    def learning_in_bulk(self) -> Iterator[None]:
        """Many pods are about to be learned before it matters (the departed past at start, the
        pods of a list, which the feed shows once it is complete): each placer builds its learned
        table once, at the end, as it stood at the last rebuild point crossed, instead of at
        every point (``Placer.learning_in_bulk``). The same table as one pod at a time; a
        30,000-pod first list learned in 1.3 s instead of 4.4, a 4,096-shape past in 0.5 s
        instead of ~115. A decision made meanwhile (only during a relist; the extender is not
        ready before its first lists) uses the table from before the bulk."""
        with ExitStack() as bulk:
            with self.model.lock:
                for placer in self._distinct_placers():
                    bulk.enter_context(placer.learning_in_bulk())
            try:
                yield
            finally:
                with self.model.lock:
                    bulk.close()
                    self._log_table_bound()

    def _log_table_bound(self) -> None:
        """Say once when a placer's learned table hit its size bound (pods of many distinct
        shapes; the placer then merges the rarest, see packing/frag.py). Under model.lock."""
        if self._bound_logged:
            return
        for placer in self._distinct_placers():
            what = placer.table_bound()
            if what is not None:
                self._bound_logged = True
                log.warning("learned workload: %s (placer %s; logged once)", what, placer.name)
                return

    def _distinct_placers(self) -> list[Placer]:
        """Each placer once (a factory may serve both node policies with one placer)."""
        return list({id(p): p for p in self.placers.values()}.values())

    def learn_pod(self, pod: Mapping[str, Any]) -> None:
        """The watch shows a pod (pending or bound, once per uid): teach the placers, as a filter
        of it would. What the placers learn is then rebuilt from the cluster: a restarted
        extender, or the standby replica, learns the pods that exist from its first list, so it
        decides as the one that saw them arrive. A pod Stowage cannot schedule teaches nothing,
        as at filter."""
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
        uid = meta.get("uid")
        if not isinstance(uid, str) or not uid:
            return
        if self._unknown and uid in self._unknown and _bound_or_finished(pod):
            # Bound: the Binding whose outcome was unknown was applied (or another). Finished: the
            # feed frees what it held, and a Binding can no longer land on it.
            with self.model.lock:
                self._unknown.pop(uid, None)
        with self._pods_lock:
            if self._learned.touch(uid):
                return
        shape = pod_shape(pod, self.memory_unit_mib, self.default_policy)
        if shape is not None:
            self._learn(uid, *shape)

    def forget_learned(self, uid: str) -> None:
        """The pod is deleted: its uid can never come back, so it need not be remembered (what the
        placers learned from it stays, as it would in a process that saw it, and its shape is
        counted in :attr:`departed`, which outlives a restart). A pod the bounds of
        :attr:`_learned` forgot before (past 100,000 pods, or past its bytes, pods with long model
        lists first: extender/learned_uids.py) is not counted: its shape is no longer known."""
        with self._pods_lock:
            shape = self._learned.pop(uid)
            if shape is not None:
                self.departed.add(*shape)

    def pod_deleted(self, uid: str) -> None:
        """The watch saw the pod deleted (``KubeFeeder.on_pod_deleted``, after the feed released
        what it held): what was learned from it is counted as departed (:meth:`forget_learned`),
        its parse is dropped from the pod cache, and a bind of it from now on is refused
        (:meth:`reserve`). Why: a reservation made after the deletion would be released by no
        later event, so a Binding whose outcome is unknown would keep the cards held until the
        next full list (up to 10 minutes). UIDs never come back; the most recent
        :data:`DELETED_UIDS` are remembered, enough for any bind still under way for them."""
        self.forget_learned(uid)
        self._forget(uid)
        if self._unknown:
            with self.model.lock:
                self._unknown.pop(uid, None)
        with self._pods_lock:
            self._deleted[uid] = None
            self._deleted.move_to_end(uid)
            while len(self._deleted) > DELETED_UIDS:
                self._deleted.popitem(last=False)

    def _was_deleted(self, uid: str) -> bool:
        """Whether the watch saw pod ``uid`` deleted (among the last :data:`DELETED_UIDS`)."""
        with self._pods_lock:
            return uid in self._deleted

    def departed_snapshot(self) -> DepartedPods:
        """A copy of :attr:`departed` to write (taken under the lock the feed adds under)."""
        with self._pods_lock:
            return self.departed.copy()

    def _forget(self, uid: str) -> None:
        with self._pods_lock:
            info = self._pods.pop(uid, None)
            if info is not None:
                self.pod_cache_bytes_used -= pod_info_bytes(info, self.default_policy)
            if info is not None and self._uid_by_key.get(info.key) == uid:
                del self._uid_by_key[info.key]

    def _known_pod(self, args: BindingArgs) -> PodInfo | None:
        with self._pods_lock:
            uid = args.pod_uid or self._uid_by_key.get(args.key, "")
            info = self._pods.get(uid)
        if info is not None and info.key == args.key:
            return info
        return None

    # ----------------------------------------------------------------------------- filter
    def filter(self, args: ExtenderArgs) -> FilterResult:
        """Which of the candidate nodes can host the pod now (step 1 of :mod:`packing.decide`),
        and why each other one cannot; with ``filter_keeps="best"`` only the best of them (step 2:
        the nodes :meth:`prioritize` would score 10), the others that fit left out without a reason."""
        names = args.names
        info = self.pod_info(args.pod)
        if info.req is None:
            # A pod-level problem: no node will ever do until the user fixes the pod.
            return filter_answer(args, unresolvable={n: info.error for n in names})
        req, policy = info.req, info.policy
        assert policy is not None
        if self._unknown and info.uid in self._unknown:   # (the normal path: one test of an empty dict)
            self._end_lapsed_hold(info.uid, info.key)
        path = self.path
        fail_names: list[str] = []
        texts: list[str] = []
        unres = np.zeros(0, bool)
        with self.model.lock:
            entry = path.lookup(self.model, names)
            idx = entry.rows
            known = idx >= 0
            feas = path.feasible(self.model, req, policy)
            ok = known & feas.ok[np.where(known, idx, 0)]
            fail = np.flatnonzero(known & ~ok)
            if fail.size:
                rows = idx[fail]
                fail_names = entry.take(fail)
                texts = path.reasons(self.model, feas, rows, req, policy.tolerates)
                unres = feas.unres[rows]
            sel = np.flatnonzero(ok)
            generation = self.model.generation
            ranks = None
            # Nodes that nominated pods hold are taken out below, before the best are kept. With
            # no pod nominated (the usual case) none are, so the best are kept here already and
            # only their names are made, not a list of every node that fits.
            nominated = self.marks.any_nominated()
            if self.filter_keeps == FILTER_KEEPS_BEST and len(sel) > 1:
                # Step 2 here, on the same model as step 1.
                placer = self.placers[policy.node]
                if nominated:  # prioritize's 0..10 of each fitting node, to choose again below
                    ranks = self._ranked(feas, placer, req, idx[sel])
                else:
                    best = self._ranked(feas, placer, req, idx[sel], decide.best_mask)
                    if not best.all():
                        sel = sel[best]
            passing = entry.take(sel) if len(sel) < len(names) else names
            path.remember_passing(self.model, entry, passing, idx[sel], sel)
        if not passing and self.on_refused is not None:
            self.on_refused(info.uid, info.namespace, info.name, generation)
        if unres.any():
            unresolvable = dict(zip(take(fail_names, unres), take(texts, unres)))
            failed = dict(zip(take(fail_names, ~unres), take(texts, ~unres)))
        else:
            unresolvable, failed = {}, dict(zip(fail_names, texts))
        for j in np.flatnonzero(~known):
            failed[names[j]] = UNKNOWN_NODE
        passing_nodes = None
        held = self._held_for_nominees(info, pod_priority(args.pod), passing) if nominated else {}
        if held:
            failed.update(held)
            keep = np.array([n not in held for n in passing], bool)
            passing = take(passing, keep)
            sel = sel[keep]
            ranks = ranks[keep] if ranks is not None else None
        if ranks is not None and len(sel) > 1:
            # Only the best (to 1e-9, as best_node compares) of the nodes left: the others fit
            # but are not chosen, so they are left out of the answer without a reason (a reason
            # is shown only when no node passes, and then none is left out).
            best = ranks == ranks.max()
            if not best.all():
                passing = take(passing, best)
                sel = sel[best]
        if args.nodes is not None:
            if args.node_names is None:
                passing_nodes = take(args.nodes, sel)
            else:  # both forms sent: match Node objects by name
                keep = set(passing)
                passing_nodes = [n for n in args.nodes if n["metadata"]["name"] in keep]
        return filter_answer(args, passing=passing, passing_nodes=passing_nodes,
                             failed=failed, unresolvable=unresolvable)

    def _ranked(self, feas: Feasibility, placer: Placer, req: GpuRequest, rows: np.ndarray,
                rank: Callable[[np.ndarray], np.ndarray] = decide.to_extender_scores) -> np.ndarray:
        """``rank`` of the placer's raw scores of the feasible ``rows`` (under ``model.lock``, with
        their ``feas``), one per row: prioritize's 0..10 (:func:`packing.decide.to_extender_scores`)
        or just which rows get the 10 (:func:`packing.decide.best_mask`). Ranks depend on the raw
        values alone, so where the row cache gives one value per distinct row content, those few
        are ranked and then spread to the rows."""
        raw, inverse = self.path.scores(self.model, feas, placer, req, rows)
        ranked = rank(raw)
        return ranked if inverse is None else ranked[inverse]

    # ------------------------------------------------------------------------- prioritize
    def prioritize(self, args: ExtenderArgs, *, as_json: bool = False) -> list[dict[str, Any]] | bytes:
        """Scores 0..10 for every candidate node: the placer's ranking among feasible nodes
        (step 2 of :mod:`packing.decide`), 0 for nodes that cannot take the pod (or when the pod
        asks for no GPU).

        ``as_json``: the answer already encoded (what the app sends), made without a dict per
        node, which on thousands of nodes costs more than the scoring of the simple placers.
        """
        names, scores, entry = self._prioritize(args)
        if as_json:
            return encode_priority_list(names, scores, None if entry is None else self.path.answer_heads(entry))
        return priority_list(names, scores.tolist())

    def prioritize_scores(self, args: ExtenderArgs) -> tuple[list[str], np.ndarray]:
        """:meth:`prioritize` as (node names, int64 scores): what the app encodes without dicts."""
        names, scores, _ = self._prioritize(args)
        return names, scores

    def _prioritize(self, args: ExtenderArgs) -> tuple[list[str], np.ndarray, Any]:
        names = args.names
        scores = np.zeros(len(names), np.int64)
        entry = None
        info = self.pod_info(args.pod)
        if info.req is not None and names:
            req, policy = info.req, info.policy
            assert policy is not None
            path = self.path
            with self.model.lock:
                entry = path.lookup(self.model, names)
                idx = entry.rows
                known = idx >= 0
                feas = path.feasible(self.model, req, policy)
                feasible = known & feas.ok[np.where(known, idx, 0)]
                fidx = idx[feasible]
                if fidx.size:
                    scores[feasible] = self._ranked(feas, self.placers[policy.node], req, fidx)
        return names, scores, entry

    # ------------------------------------------------------------------------------- bind
    def _pod_for_bind(self, args: BindingArgs, may_block: bool = True) -> PodInfo | str | None:
        """The pod to bind, or the refusal message; None (only with ``may_block`` False) when only
        an API call could tell.

        The pod source's own copy of the pending pod comes first (Kubernetes mode: the watch's,
        that is the API server's), then what filter parsed. Why: the parse kept at filter is of
        a request body, and anything that reaches the port may send one naming a real pending pod
        with other requests (the parse is kept by uid, and per resourceVersion the first body
        wins). Bound on that, the pod got a record that does not match it: not honoured by the
        feed or the device plugin, the model holding cards the cluster does not count. The body
        is still what decides where no copy is held (simulated mode, a copy past its bounds, a
        pod the watch has not delivered yet or holds another of that name: the Binding's uid
        precondition guards that one)."""
        watched = self._watched_pod(args)
        if watched is not None:
            return watched
        info = self._known_pod(args)
        if info is not None:
            return info
        if not may_block:
            return None
        if self.pod_source is None:
            return (f"pod {args.key} (uid {args.pod_uid or '?'}) was not seen at filter and no pod source is "
                    "configured: it cannot be bound by this extender")
        try:
            pod = self.pod_source.get_pod(args.pod_namespace, args.pod_name)
        except Exception as exc:  # the API server may be unreachable: retryable
            return f"cannot read pod {args.key}: {exc}"
        if pod is None:
            return f"pod {args.key} not found"
        meta = object_meta(pod)
        if meta is None:
            return f"pod {args.key} read from the API server {NOT_A_POD}"
        uid = str(meta.get("uid") or "")
        if args.pod_uid and uid and uid != args.pod_uid:
            return f"pod {args.key} has uid {uid}, bind asked for uid {args.pod_uid} (pod was re-created)"
        return self.pod_info(pod)

    def _watched_pod(self, args: BindingArgs) -> PodInfo | None:
        """The pod source's copy of the pending pod (``pending_pod``), parsed afresh, when it is the
        pod of the bind's uid; else None."""
        pending = getattr(self.pod_source, "pending_pod", None)
        if pending is None:
            return None
        pod = pending(args.pod_namespace, args.pod_name)
        if pod is None:
            return None
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
        if args.pod_uid and meta.get("uid") != args.pod_uid:
            return None
        # for this bind only: the pod cache keeps what filter parsed
        return self._parse_pod(pod, meta, _identity(meta))

    def _record(self, alloc: PodAllocation) -> AllocationRecord:
        return AllocationRecord(
            node=alloc.node, whole=alloc.whole,
            cards=tuple(CardShare(index=k, uuid=self.model.card_uuid(alloc.node, k), memory_mib=int(m),
                                  core_milli=int(c))
                        for k, m, c in zip(alloc.cards, alloc.mem_mib, alloc.core_milli)))

    def bind(self, args: BindingArgs) -> str:
        """Choose cards on ``args.node``, reserve them, and bind. Returns '' or the error message.

        An error makes kube-scheduler retry the pod within seconds, which is the right answer
        when another pod took the cards in between.
        """
        step = self.reserve(args)
        assert step is not None
        return step if isinstance(step, str) else step.write()

    def reserve(self, args: BindingArgs, *, may_block: bool = True) -> "str | BindWrite | None":
        """Bind's first half: choose the cards and reserve them (under the model lock), without
        the API write. Returns the refusal message, or the second half to run (:meth:`BindWrite.write`,
        which may wait on the API server). The split layout runs this half on the thread that
        answers filter, in arrival order, so a filter that comes after a bind sees its cards
        taken even while the write is still on its way.

        ``may_block=False``: None instead of a step that would wait on the API server (a pod not
        seen at filter, cards held on another node): the caller then runs :meth:`bind` where
        waiting is fine."""
        node = args.node
        if args.pod_uid and self._was_deleted(args.pod_uid):
            return f"pod {args.key} was deleted"
        if args.pod_uid:
            other = self._uid_held_by_another(args.pod_uid, args.key)
            if other:
                return other
            if not may_block and self._stale_elsewhere(args.pod_uid, node):
                return None
            busy = self._release_if_stale(args.pod_uid, node, args.key, args.pod_namespace, args.pod_name)
            if busy:
                return busy
            with self.model.lock:
                prev = self.model.allocations.get(args.pod_uid)
                if prev is not None and prev.node == node:
                    # Already holds cards on this node (a bind repeated, a reservation kept after an
                    # unknown outcome, or rebuilt from the pod's annotation): write the Binding
                    # again on them, but never alongside another write for the pod. If the first
                    # failed it would release the cards while this one bound the pod on them; and
                    # a bind to another node must not release them while this one writes.
                    if args.pod_uid in self._inflight:
                        return f"a bind of pod {args.key} to {node} is still in progress"
                    self._inflight.add(args.pod_uid)
                    record = self._record(prev) if prev.cards else None
                    return BindWrite(self, args.pod_namespace, args.pod_name, args.pod_uid, node, record, None,
                                     "", forget=False)
        info = self._pod_for_bind(args, may_block)
        if info is None:
            return None
        if isinstance(info, str):
            log.warning("bind %s -> %s refused: %s", args.key, node, info)
            return info
        if info.req is None:
            return info.error
        uid = args.pod_uid or info.uid
        if not args.pod_uid and self._was_deleted(uid):   # a bind naming its uid was checked above
            return f"pod {info.key} was deleted"
        other = self._uid_held_by_another(uid, info.key)
        if other:
            return other
        # Every pod reserves: a GPU pod its cards, any pod its CPU, memory and pod slot.
        req, policy = info.req, info.policy
        assert policy is not None
        if not may_block and self._stale_elsewhere(uid, node):
            return None
        busy = self._release_if_stale(uid, node, info.key, info.namespace, info.name)
        if busy:
            return busy
        with self.model.lock:
            prev = self.model.allocations.get(uid)
            if prev is not None:  # only reachable without PodUID in the request
                return f"pod {info.key} already holds cards {list(prev.cards)} on node {prev.node}"
            i = self.model.index.get(node)
            if i is None:
                return f"cannot bind {info.key} to {node}: {UNKNOWN_NODE}"
            row = row_view(self.model.a, i)
            mask, f = decide.feasible(row, self.model.models, req, policy)   # step 1, this node
            if not f.ok[0]:
                why = node_reason(self.model, row, 0, req, mask, node, tolerates=policy.tolerates)
                msg = f"cannot bind {info.key} to {node} now: {why}"
                log.info("bind refused: %s", msg)
                return msg
            held = (self._nominee_hold(info.uid, self._bind_priority(info), node, req, policy)
                    if req.is_gpu else None)
            if held is not None:
                if not held[1].ok[0]:
                    return f"cannot bind {info.key} to {node} now: {held[0]}"
                f = held[1]  # only the cards the nominated pods leave free
            # Step 3 on the whole arrays and row i, not the 1-row view: a placer's incremental
            # index (FragIndex) is kept for model.a and would be rebuilt twice for another object.
            cards = (decide.choose_cards(self.placers[policy.node], self.model.a, i, req, f, policy, row=0)
                     if req.is_gpu else [])
            try:
                alloc = self.model.assign(uid, info.key, node, cards, req, check=True)
            except AllocationConflict as exc:
                log.info("bind refused: %s -> %s: %s", info.key, node, exc)
                return f"cannot bind {info.key} to {node}: {exc}"
            record = self._record(alloc) if req.is_gpu else None
            self._inflight.add(uid)
        return BindWrite(self, info.namespace, info.name, uid, node, record, alloc, info.req.describe(), forget=True)

    def _uid_held_by_another(self, uid: str, key: str) -> str:
        """The refusal when the model holds ``uid`` for a pod of another namespace/name ('' when
        not). The model keys pods by uid, which is whatever the peer sends; uids are unique on an
        API server, so this is a peer that lies (the feed ignores such an object's events:
        ``KubeFeeder._uid_taken``). Bound anyway, the pod was written onto the holder's cards with
        its record (to the holder's node), or took the holder's cards for a stale reservation of
        its own and released them while the holder ran (to another node)."""
        with self.model.lock:
            held = self.model.allocations.get(uid)
            if held is None or held.name == key:
                return ""
        return (f"pod {key} came with uid {uid}, which pod {held.name} holds (uids are unique on an API server: "
                f"a proxy or a peer that lies?); not bound")

    def _stale_elsewhere(self, uid: str, node: str) -> bool:
        """Whether ``uid`` holds cards on another node (dealing with them may read the pod)."""
        with self.model.lock:
            prev = self.model.allocations.get(uid)
            return prev is not None and prev.node != node

    def _complete(self, namespace: str, name: str, uid: str, node: str, record: AllocationRecord | None,
                  reserved: PodAllocation | None, what: str) -> str:
        """Call the binder outside the model lock; on failure release ``reserved`` (ours only),
        unless the outcome is unknown (then the cards stay reserved for the pod)."""
        key = f"{namespace}/{name}"
        try:
            self.binder.bind(namespace, name, uid, node, record)
        except BindOutcomeUnknown as exc:
            # The pod may be bound on these cards, now or when the API server applies the Binding
            # later: keep them (see _hold_unknown for how the reservation ends). Releasing them
            # could give a running pod's card to another.
            with self.model.lock:
                self._inflight.discard(uid)
                held = self.model.allocations.get(uid)
                if held is not None and held.node == node:
                    self._hold_unknown(uid)
            if self._hold_timer is not None:
                self._hold_timer.wake()
            log.warning("bind %s -> %s: outcome unknown, reservation kept: %s", key, node, exc)
            return f"cannot bind {key} to {node}: {exc}"
        except Exception as exc:  # BindError or anything else: never keep the reservation
            with self.model.lock:
                self._inflight.discard(uid)
                if reserved is not None and self.model.allocations.get(uid) is reserved:
                    self.model.release(uid, departed=False)  # the pod never ran
                    self._unknown.pop(uid, None)
            # The binder's message is meant for the user (BindError); anything else is shown as is.
            msg = str(exc) or repr(exc)
            log.warning("bind %s -> %s failed%s: %s", key, node,
                        ", reservation released" if reserved is not None else "", msg)
            return f"cannot bind {key} to {node}: {msg}"
        with self.model.lock:
            self._inflight.discard(uid)
            if self._unknown:
                self._unknown.pop(uid, None)
        if record is None:
            log.info("bound %s -> %s (no GPU)", key, node)
        else:
            log.info("bound %s -> %s %s%s", key, node, fmt_cards(c.index for c in record.cards),
                     f" ({what})" if what else " (already held)")
        return ""

    def _release_if_stale(self, uid: str, node: str, key: str, namespace: str, name: str) -> str:
        """Before binding ``uid`` to ``node``: deal with cards it holds on ANOTHER node.

        kube-scheduler only binds pods that are not bound yet. Cards such a pod holds elsewhere
        are then a stale reservation: a bind whose Binding failed and whose clean-up failed too,
        leaving the record on the pod (the feeder re-reads it). Keeping it would refuse the pod
        forever, so it is released — but only once the pod source confirms the pod is unbound
        (one lookup, outside the model lock), never while a bind of the pod is in flight, never
        while a Binding of it whose outcome is unknown may still be applied (:meth:`_hold_unknown`:
        it would meet this one, and the cards released here would be given away under it), and
        never without a pod source (embedded mode has no stale records). Returns '' or the
        refusal message.
        """
        with self.model.lock:
            prev = self.model.allocations.get(uid)
            if prev is None or prev.node == node:
                return ""
            if uid in self._inflight:
                return f"a bind of pod {key} to {prev.node} is still in progress"
            until = self._unknown.get(uid)
            left = until - self._clock() if until is not None else 0.0
            if left > 0:
                return (f"a Binding of pod {key} to {prev.node} may still be applied (its outcome is unknown): its "
                        f"cards there stay reserved, and it is not bound elsewhere, for up to {left:.0f}s more "
                        "unless the watch shows it bound or deleted first")
        refusal = f"pod {key} already holds cards {list(prev.cards)} on node {prev.node}"
        if self.pod_source is None:
            return refusal
        try:
            pod = self.pod_source.get_pod(namespace, name)
        except Exception as exc:  # the API is down: keep the reservation, the scheduler retries
            return f"{refusal} (cannot check whether it is bound: {exc})"
        if pod is None:
            return refusal
        meta = object_meta(pod)
        if meta is None:
            return f"{refusal} (cannot check whether it is bound: the pod read {NOT_A_POD})"
        if not pod or meta.get("uid", uid) != uid:
            return refusal
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to:
            return f"{refusal}; it is bound to {bound_to}"
        with self.model.lock:
            if self.model.allocations.get(uid) is prev and uid not in self._inflight:
                log.warning("pod %s held cards %s on %s but is unbound and being bound to %s: "
                            "releasing the stale reservation", key, list(prev.cards), prev.node, node)
                self.model.release(uid, departed=False)
                self._unknown.pop(uid, None)
        return ""

    def _hold_unknown(self, uid: str) -> None:
        """(Under ``model.lock``.) Keep pod ``uid``'s reservation as "outcome unknown": a Binding
        of it was sent and its answer was a 5xx or was lost, so the API server may apply it later,
        even after a read-back found the pod unbound (its timeout filter answers 504 while the
        storage update goes on). Released at once, the cards went to the next pod while the
        Binding, and the record naming them, landed: two pods on one card (the device plugin then
        refuses the second's devices whole; shares it does not check, and a card's memory was
        booked past its size).

        It ends when the watch shows the pod bound (:meth:`learn_pod`: the reservation is its
        record's, or the feed replaces it), or deleted (:meth:`pod_deleted`); a bind of it to the
        same node writes the Binding again on the same cards (a 409 "already assigned" is then
        resolved by the read-back). It is released only once the Binding can no longer be applied
        (``unknown_outcome_hold_s`` after it was sent) and the pod is still seen unbound: at its
        next filter (the watch's copy, :meth:`_end_lapsed_hold`), at a bind elsewhere
        (:meth:`_release_if_stale`), which is refused until then, or at the latest by the hold
        timer (:meth:`end_lapsed_holds`, which reads the pod when the watch's copy is gone). kube-scheduler forgets its
        assumed pod on any bind error (its cache counts the pod again if the informer shows it
        bound later, and the kubelet's admission refuses what does not fit); the kubelet does not
        see which card a record names, so the extender must not give it away first.

        Entries of pods no longer holding anything are dropped here: only this rare path adds."""
        for gone in [u for u in self._unknown if u not in self.model.allocations]:
            del self._unknown[gone]
        self._unknown[uid] = self._clock() + self.unknown_outcome_hold_s

    def _end_lapsed_hold(self, uid: str, key: str) -> None:
        """Release pod ``uid``'s "outcome unknown" reservation (:meth:`_hold_unknown`) when its
        time is up and the watch's copy of the pod (``pending_uid``, no API call: this runs on
        filter's thread) shows it still unbound: the Binding was not applied and no longer can be.
        Without a watch's copy it is left to the hold timer (:meth:`end_lapsed_holds`) or a bind
        elsewhere, which may read the pod."""
        lapsed = self._lapsed_hold(uid)
        if lapsed is None:
            return
        pending = getattr(self.pod_source, "pending_uid", None)
        if pending is not None and pending(key) != uid:
            return
        self._release_lapsed(uid, *lapsed, "is still unbound")

    def _lapsed_hold(self, uid: str) -> tuple[PodAllocation, float] | None:
        """(The reservation, the time its hold ended) when pod ``uid``'s hold is up and no bind of
        it is under way; else None. A hold whose reservation is gone is dropped here."""
        with self.model.lock:
            until = self._unknown.get(uid)
            if until is None or self._clock() < until or uid in self._inflight:
                return None
            alloc = self.model.allocations.get(uid)
            if alloc is None:
                del self._unknown[uid]
                return None
            return alloc, until

    def _release_lapsed(self, uid: str, alloc: PodAllocation, until: float, why: str) -> None:
        """Release ``alloc``, the reservation of a lapsed hold, unless something changed it
        meanwhile (a bind of the pod began, the feed replaced it, a new hold was made)."""
        with self.model.lock:
            if self.model.allocations.get(uid) is not alloc or self._unknown.get(uid) != until \
                    or uid in self._inflight:
                return
            del self._unknown[uid]
            self.model.release(uid, departed=False)
        log.warning("pod %s: its Binding to %s (outcome unknown) was not applied in %.0fs and the pod %s: "
                    "cards %s released", alloc.name, alloc.node, self.unknown_outcome_hold_s, why,
                    list(alloc.cards))

    def end_lapsed_holds(self) -> float | None:
        """End every "outcome unknown" hold whose time is up (the hold timer's round, off the
        request path: it may read pods with a GET). The pod is read from the pod source (the
        watch's copy when it keeps one, else the API server): unbound, gone, or re-created under
        its name (the Binding's uid precondition fails), its cards are released; bound, the hold
        is confirmed and the cards stay held as any bound pod's; unreadable, the hold stays and is
        looked at again in :data:`HOLD_RECHECK_S`. Holds whose reservation went are dropped.
        Returns the seconds until the next round is due, None when no hold is left."""
        with self.model.lock:
            for gone in [u for u in self._unknown if u not in self.model.allocations]:
                del self._unknown[gone]
            now = self._clock()
            due = [u for u, until in self._unknown.items() if until <= now]
        for uid in due:
            lapsed = self._lapsed_hold(uid)
            if lapsed is not None:
                self._settle_lapsed(uid, *lapsed)
        with self.model.lock:
            if not self._unknown:
                return None
            now = self._clock()
            waits = [until - now for until in self._unknown.values()]
        return min(HOLD_RECHECK_S if w <= 0 else w for w in waits)

    def _settle_lapsed(self, uid: str, alloc: PodAllocation, until: float) -> None:
        """One lapsed hold of :meth:`end_lapsed_holds`: read the pod, release or confirm."""
        if self.pod_source is None:   # nothing to ask (no Binding of this mode can land late)
            self._release_lapsed(uid, alloc, until, "has no pod source to be read from")
            return
        namespace, _, name = alloc.name.partition("/")
        try:
            pod = self.pod_source.get_pod(namespace, name)
        except Exception as exc:  # noqa: BLE001 - the API server may be down: looked at again later
            log.info("pod %s: its bind hold is up but the pod cannot be read (%s); tried again in %.0fs",
                     alloc.name, exc, HOLD_RECHECK_S)
            return
        meta = object_meta(pod) if pod is not None else {}
        if meta is None:
            log.info("pod %s: its bind hold is up but the pod read %s; tried again in %.0fs", alloc.name, NOT_A_POD,
                     HOLD_RECHECK_S)
        elif pod is None:
            self._release_lapsed(uid, alloc, until, "is gone")
        elif meta.get("uid") != uid:
            self._release_lapsed(uid, alloc, until, f"was re-created (uid {meta.get('uid')})")
        elif _bound_or_finished(pod):
            with self.model.lock:
                if self._unknown.get(uid) == until:
                    del self._unknown[uid]
            log.info("pod %s: read back bound or finished after its bind hold; its cards stay held as the "
                     "pod's own", alloc.name)
        else:
            self._release_lapsed(uid, alloc, until, "is still unbound")

    def start_hold_timer(self) -> None:
        """End lapsed holds on a thread of their own (kube mode: :mod:`extender.hold_timer`)."""
        if self._hold_timer is None:
            self._hold_timer = HoldTimer(self.end_lapsed_holds)
        self._hold_timer.start()

    def stop_hold_timer(self) -> None:
        if self._hold_timer is not None:
            self._hold_timer.stop()

    # ---------------------------------------------------------------- preempt, nominations
    def _bind_priority(self, info: PodInfo) -> int:
        prio = self.marks.priority(info.uid)
        return 0 if prio is None else prio

    def _nominee_hold(self, uid: str, prio: int, node: str, req: GpuRequest,
                      policy: PodPolicy) -> tuple[str, Any] | None:
        """(why, fit) of the pod on ``node`` once the pods nominated there with priority >= its
        own took their cards (None: none nominated there). Under ``model.lock``."""
        noms = self.marks.nominees(node, prio, uid)
        i = self.model.index.get(node)
        if not noms or i is None:
            return None
        row = row_copy(self.model.a, i)
        booked = set(reserve(row, self.model.models, noms))
        if not booked:
            return None
        _, f = decide.feasible(row, self.model.models, req, policy)
        who = ", ".join(sorted(n.name for n in noms if n.uid in booked))
        return (f"cards held for {who} (nominated to this node at a higher or equal priority after "
                "preemption)"), f

    def _held_for_nominees(self, info: PodInfo, prio: int, passing: list[str]) -> dict[str, str]:
        """Passing nodes where pods nominated at a higher or equal priority leave no room for
        this pod, with why: kube-scheduler counts nominated pods the same way for its own
        filters, and without this the cards a preemption freed could go to a lower-priority pod."""
        if (not self.marks.any_nominated() or not passing or info.req is None or info.policy is None
                or not info.req.is_gpu):  # nominated pods' CPU and memory: kube-scheduler counts them itself
            return {}
        nodes = self.marks.nominated_nodes().intersection(passing)
        out: dict[str, str] = {}
        with self.model.lock:
            for node in sorted(nodes):
                held = self._nominee_hold(info.uid, prio, node, info.req, info.policy)
                if held is not None and not held[1].ok[0]:
                    out[node] = held[0]
        return out

    def preempt(self, args: PreemptionArgs) -> dict[str, tuple[list[str], int]]:
        """kube-scheduler's ``ProcessPreemption``: for each candidate node, the victims (a subset
        of those proposed) whose eviction frees cards the pod can use under its policy, or no
        entry (the node is dropped) when no subset would (:func:`packing.preempt.judge_node`).

        A node is never answered with no victims: kube-scheduler rejects that answer (and with
        ``ignorable: false`` the whole preemption attempt). A pod Stowage cannot place at all
        gets no node; a pod that asks for no GPU keeps the scheduler's proposal unchanged."""
        info = self.pod_info(args.pod)
        if info.req is None:
            return {}
        if not info.req.is_gpu:
            return {n: (list(v.uids), v.num_pdb_violations) for n, v in args.victims.items() if v.uids}
        req, policy = info.req, info.policy
        assert policy is not None
        prio = pod_priority(args.pod)
        out: dict[str, tuple[list[str], int]] = {}
        left = self.preempt_budget
        victims_left = self.preempt_victims
        skipped = 0
        for node, v in args.victims.items():
            if not v.uids:
                continue
            if left <= 0 or len(v.uids) > victims_left:
                # A request far beyond any kube-scheduler sends: such a node gets no eviction.
                skipped += 1
                continue
            victims_left -= len(v.uids)
            known = self.marks.priorities(v.uids)
            known.update(v.priorities)
            noms = self.marks.nominees(node, prio, info.uid)
            with self.model.lock:  # per node: filter and bind are not held up for a whole request
                verdict = judge_node(self.model, node, req, policy, v.uids, known, noms,
                                     budget=min(DEFAULT_BUDGET, left))
            left -= max(verdict.tried, 1)
            if verdict.victims:
                out[node] = (list(verdict.victims), pdb_violations(v.num_pdb_violations, len(verdict.victims)))
            log.debug("preempt %s on %s: %s -> %s (%s)", info.key, node, len(v.uids),
                      len(verdict.victims) if verdict.victims else "dropped", verdict.why)
        log.info("preempt %s: %d of %d candidate node(s) kept: %s", info.key, len(out), len(args.victims),
                 "; ".join(f"{n}: {len(u)} victim(s)" for n, (u, _) in list(out.items())[:5])
                 + (" ..." if len(out) > 5 else ""))
        if skipped:
            log.warning("preempt %s: work budget spent (%d fits, %d proposed victims a request); %d more node(s) "
                        "not examined (dropped)", info.key, self.preempt_budget, self.preempt_victims, skipped)
        return out

    # ------------------------------------------------------------------------------ views
    def stats(self) -> dict[str, int]:
        """Counts for /metrics and logs."""
        with self.model.lock:
            a = self.model.a
            live = a.exists & a.node_ok[:, None]
            typical = typical_one_gpu_host_request(self.model.allocations.values())
            return {"nodes": len(self.model.index), "cards": int(live.sum()),
                    "healthy_cards": int((live & a.healthy).sum()),
                    "free_whole_cards": int((live & a.free_whole()).sum()),
                    "stranded_whole_cards": stranded_whole_cards(a, *typical),
                    "allocations": len(self.model.allocations)}

    def bounds(self) -> dict[str, BoundUse]:
        """The pod cache's and the learned pods' use of their bounds, and what they dropped for
        them since start (extender/bounds.py: what a drop costs): for /metrics."""
        with self._pods_lock:
            return {"pod_cache": BoundUse(entries=len(self._pods), max_entries=self._cache_size,
                                          bytes=self.pod_cache_bytes_used, max_bytes=self._cache_bytes,
                                          dropped=self.pod_cache_evicted),
                    "learned_pods": self._learned.use()}

    def state(self) -> dict[str, Any]:
        """The whole model as JSON-able data: per node, per card, and every allocation."""
        with self.model.lock:
            a = self.model.a
            nodes = []
            for name in sorted(self.model.index):
                i = self.model.index[name]
                meta = self.model.meta[name]
                cards = []
                for k in np.flatnonzero(a.exists[i]):
                    k = int(k)
                    cards.append({"index": k, "uuid": meta.uuids.get(k, ""), "model": meta.models.get(k, ""),
                                  "memoryMiB": int(a.mem_total[i, k]), "freeMemoryMiB": int(a.mem_free[i, k]),
                                  "freeCoreMilli": int(a.core_free[i, k]), "pods": int(a.pods[i, k]),
                                  "healthy": bool(a.healthy[i, k]), "numa": int(a.numa[i, k])})
                nodes.append({"name": name, "schedulable": bool(a.node_ok[i]), "source": meta.source,
                              "cards": cards})
            allocs = {uid: {"pod": al.name, "node": al.node, "cards": list(al.cards), "memoryMiB": list(al.mem_mib),
                            "coreMilli": list(al.core_milli), "whole": al.whole}
                      for uid, al in self.model.allocations.items()}
            for uid in self._unknown:   # kept for a Binding whose outcome is unknown (_hold_unknown)
                if uid in allocs:
                    allocs[uid]["bindOutcomeUnknown"] = True
        # Outside the model's lock: the summary takes the pods lock first, never under the model's.
        return {"nodes": nodes, "allocations": allocs, "learned": self.learned_summary()}

    def learned_summary(self, digest: bool = True) -> dict[str, Any]:
        """What the pack placer has learned, in brief: pods learned, distinct classes, a digest of
        the class counts (equal digests: the same learned workload, as a restarted extender should
        have; left out with ``digest`` False, as /metrics does), and the departed pods kept for
        the next start. Only a copy of the counts is taken under the model's lock."""
        with self._pods_lock:
            departed, shapes = self.departed.pods, len(self.departed)
        with self.model.lock:
            placer = self.placers[PACK]
            workload = getattr(placer, "workload", None)
            items = list(workload.counts.items()) if workload is not None else []
            seen = int(getattr(placer, "seen", 0))
        out: dict[str, Any] = {"pods": seen, "classes": len(items)}
        if digest:
            counts = sorted((repr(c), n) for c, n in items)
            out["workload"] = hashlib.sha256(repr(counts).encode()).hexdigest()[:16]
        out.update(departedPods=departed, departedShapes=shapes)
        return out

    def allocation(self, uid: str) -> dict[str, Any] | None:
        with self.model.lock:
            al = self.model.allocations.get(uid)
            if al is None:
                return None
            return {"pod": al.name, "node": al.node, "cards": list(al.cards), "memoryMiB": list(al.mem_mib),
                    "coreMilli": list(al.core_milli), "whole": al.whole}
