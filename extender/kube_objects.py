"""Pure interpretation of Kubernetes Node and Pod objects (camelCase JSON dicts) for the model.

No I/O here: :mod:`extender.kube` fetches the objects and applies what these functions say,
so the rules ("which node is schedulable", "which pod holds cards") are testable on plain dicts.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import ROUND_CEILING
from itertools import islice
from typing import Any, Mapping

from stowage.allocation import (ALLOCATION_ANNOTATION, AllocationError, AllocationRecord, RecordTrust,
                                allocation_of_pod)
from packing.model import AllocatableGpu, ClusterModel, Counts
from stowage.inventory import Inventory, InventoryError, inventory_from_node
from packing.pod_policy import policy_annotations, small_like
from stowage.taints import NodeClosure, tolerated_closures, tolerations_for
from stowage.resources import (CORE_MILLI_PER_CARD, DEFAULT_MEMORY_UNIT_MIB, MAX_CONTAINERS_PER_POD, RESOURCE_GPU,
                               RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY, REQUEST_RESOURCES, GpuRequest, RequestError,
                               parse_quantity, pod_gpu_amounts, pod_host_request, quantity_to_bytes, quantity_to_milli)

INF = float("inf")

TERMINAL_PHASES = ("Succeeded", "Failed")


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def resource_version(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("resourceVersion") or "")


def pod_key(pod: Mapping[str, Any]) -> str:
    m = meta(pod)
    return f"{m.get('namespace') or 'default'}/{m.get('name') or '?'}"


NOT_A_POD = "is not a pod (an object with object metadata and spec)"


def object_meta(pod: Any) -> Mapping[str, Any] | None:
    """``metadata`` of a pod read from the API server or the watch's copy ({} when it has none),
    or None when what was read is not a pod's shape (a JSON list or text, metadata or spec of
    another type: a proxy's answer, a peer that lies): it tells nothing about the pod, and must
    not crash the bind that reads it (``ExtenderService``, ``KubeBinder``)."""
    if not isinstance(pod, Mapping) or not isinstance(pod.get("spec") or {}, Mapping):
        return None
    meta = pod.get("metadata") or {}
    return meta if isinstance(meta, Mapping) else None


def pod_for_bind(pod: Mapping[str, Any]) -> dict:
    """The parts of a pending pod that bind reads (``ExtenderService.pod_info``: identity, the
    requests by :func:`~stowage.resources.pod_request`, the ``stowage.io/`` policy annotations,
    the closed nodes its tolerations open; the stale-reservation check: uid and
    ``spec.nodeName``), as a pod object of its own.

    Why: the feed keeps every pending pod of Stowage's schedulers until it is bound, and a pod
    author can keep pods pending forever, each with 256 KiB of annotations (~5 MiB parsed, as many
    small keys) and long container specs. Whatever bind makes of this copy it makes of the pod:
    the fields kept are the ones read, as they are; a field of an unexpected shape (which an API
    server never sends) is kept as it is, so it fails the same way. Of the annotations, what
    ``parse_policy`` reads, bounded (:func:`~packing.pod_policy.policy_annotations`: each value
    up to one character past its length limit, where it is refused whatever follows; ~20 KiB at
    most): kept as they were, a pod written to be big kept ~256 KiB until bound, that is for ever.
    Annotations that are not a map (only the port sends them) fail by their type alone. Of the
    containers (the app ones, then the init ones, those that are objects), at most one past
    :data:`~stowage.resources.MAX_CONTAINERS_PER_POD` in all: a pod with more is refused by their
    count alone, before any is read, and so is the copy; a pod within the limit is kept whole.
    Kept all, a pod of ~18,000 containers (within etcd's 1.5 MiB) kept ~11.5 MiB. Of the
    tolerations, one per closure they open (:func:`~stowage.taints.tolerations_for`), at most three.
    """
    m = meta(pod)
    out_meta: dict[str, Any] = {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in m}
    ann = m.get("annotations")
    if isinstance(ann, Mapping):
        out_meta["annotations"] = policy_annotations(ann)
    elif "annotations" in m:   # None reads as no annotations: kept None
        out_meta["annotations"] = small_like(ann)
    out: dict[str, Any] = {"metadata": out_meta}
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        if "spec" in pod:
            out["spec"] = spec
        return out
    out_spec: dict[str, Any] = {k: spec[k] for k in ("nodeName", "schedulerName") if k in spec}
    # Of the tolerations, the fewest that open the same closed nodes (a pod may write thousands).
    tolerates = tolerated_closures(pod)
    if tolerates:
        out_spec["tolerations"] = tolerations_for(tolerates)
    room = MAX_CONTAINERS_PER_POD + 1   # containers kept, app ones first: see the docstring
    for key in ("containers", "initContainers"):
        if key in spec:
            cs = spec[key]
            if isinstance(cs, list):
                kept = list(islice((c for c in cs if isinstance(c, Mapping)), room))
                room -= len(kept)
                out_spec[key] = [_container_for_bind(c) for c in kept]
            else:
                out_spec[key] = cs
    if "overhead" in spec:
        out_spec["overhead"] = _resources_only(spec["overhead"])
    out["spec"] = out_spec
    return out


# The learn copies (pod_for_learn) a pod list keeps until its last page (KubeFeeder._relist), packed
# (extender.pending_pods.pack), in bytes: past it, those kept are shown to on_pod_seen at once, in
# creation order among themselves, and the list goes on. Why: a copy is kept for every pod of
# Stowage's schedulers in the cluster, and every list (the first after a restart included) held
# them all at once. Packed, an ordinary pod's takes ~0.75 KiB (~2.2 KiB parsed, as they were kept
# before), one written to be big ~80 KiB (the biggest policy annotations and 128 containers with
# long names and quantities; ~210 KiB parsed, and without the container limit no bound at all), so
# their number is what a pod author could still grow. ~85,000 ordinary pods stay within it, shown
# in creation order across all pages as before. `stowage extender --list-learn-mib` sets it (defined
# here, not in extender.kube, so the command line reads it without loading the Kubernetes client).
LIST_LEARN_BYTES = 64 << 20


def pod_for_learn(pod: Mapping[str, Any]) -> dict:
    """The parts of a pod that learning reads, as a pod object of its own: what
    ``ExtenderService.learn_pod`` reads (``metadata.uid``, and :func:`~extender.service.pod_shape`:
    the request by :func:`~stowage.resources.pod_request` and the ``stowage.io/`` policy
    annotations, both kept by :func:`pod_for_bind`), plus ``metadata.creationTimestamp``, so
    that :func:`extender.kube.creation_order` sorts the copy where it sorts the pod.

    Why: a paged list applies each page and drops it, but shows the pods to the placers in
    creation order across all pages, after the last one; it keeps this copy of each (~1-2 KiB
    parsed, kept packed: :data:`LIST_LEARN_BYTES`) until then, not the whole object (4-8 KiB of
    JSON, several times that parsed, with managedFields). Whatever learning makes of this copy it makes of the pod (tested on unusual
    pods, as :func:`pod_for_bind` is).
    """
    out = pod_for_bind(pod)
    m = meta(pod)
    if "creationTimestamp" in m:
        out["metadata"]["creationTimestamp"] = m["creationTimestamp"]
    return out


def _resources_only(amounts: Any) -> Any:
    """A requests/limits/overhead map with only the resources :func:`pod_request` reads."""
    if not isinstance(amounts, Mapping):
        return amounts
    return {k: v for k, v in amounts.items() if k in REQUEST_RESOURCES}


def _container_for_bind(c: Mapping[str, Any]) -> dict:
    out: dict[str, Any] = {k: c[k] for k in ("name", "restartPolicy") if k in c}
    if "resources" in c:
        res = c["resources"]
        out["resources"] = ({k: _resources_only(res[k]) for k in ("limits", "requests") if k in res}
                            if isinstance(res, Mapping) else res)
    return out


def node_cordoned(node: Mapping[str, Any]) -> bool:
    """``spec.unschedulable`` (``kubectl cordon``)."""
    spec = node.get("spec") or {}
    return bool(isinstance(spec, Mapping) and spec.get("unschedulable"))


def ready_status(node: Mapping[str, Any]) -> Any:
    """The status of the node's (first) ``Ready`` condition ("True", "False", "Unknown"), None
    when it has none."""
    conditions = (node.get("status") or {}).get("conditions") or []
    for c in conditions:
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return c.get("status")
    return None


def node_ready(node: Mapping[str, Any]) -> bool:
    """The node's (first) ``Ready`` condition is ``True``."""
    return ready_status(node) == "True"


def node_closure(node: Mapping[str, Any]) -> NodeClosure:
    """Why the node takes no new pods (0: it does), as the taints kube-scheduler tests for it
    (:mod:`stowage.taints`): cordoned; Ready condition False, or none yet (the kubelet registers a
    node with the not-ready taint); Ready condition Unknown (the node lifecycle controller's
    unreachable taint)."""
    closure = NodeClosure.CORDONED if node_cordoned(node) else NodeClosure(0)
    ready = ready_status(node)
    if ready == "True":
        return closure
    return closure | (NodeClosure.UNREACHABLE if ready == "Unknown" else NodeClosure.NOT_READY)


@dataclass(frozen=True)
class NodeView:
    """What the model needs from one Node object."""

    name: str
    inventory: Inventory
    closed: int     # why it takes no new pods (stowage.taints.NodeClosure bits; 0: open)
    error: str = ""  # set when the inventory could not be read (the node then has no cards)
    cpu_milli: float = INF   # status.allocatable (INF: not stated, not modelled)
    mem_mib: float = INF
    max_pods: float = INF
    gpu_allocatable: AllocatableGpu = AllocatableGpu()   # status.allocatable's GPU resources

    def fingerprint(self) -> tuple:
        """Equal fingerprints mean an update would not change the model (heartbeats are skipped)."""
        return (self.inventory, self.closed, self.error, self.cpu_milli, self.mem_mib, self.max_pods,
                self.gpu_allocatable)


def node_allocatable(node: Mapping[str, Any]) -> tuple[float, float, float]:
    """(milli-CPU, memory MiB, pods) from ``status.allocatable``, what kube-scheduler's
    NodeResourcesFit counts requests against. A missing or unreadable value is INF (not
    modelled: kube-scheduler still checks it itself)."""
    status = node.get("status")
    alloc = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(alloc, Mapping):
        return INF, INF, INF

    def read(key: str, conv: Any) -> float:
        if key not in alloc:
            return INF
        try:
            return float(conv(alloc[key]))
        except (RequestError, TypeError, ValueError, ArithmeticError):
            return INF

    return (read("cpu", quantity_to_milli), read("memory", lambda v: quantity_to_bytes(v, "memory") / float(1 << 20)),
            read("pods", lambda v: int(parse_quantity(v))))


# Past this an allocatable GPU quantity is no count kube-scheduler could hold (int64): not stated.
_MAX_STATED = 2 ** 63 - 1


def node_gpu_allocatable(node: Mapping[str, Any], memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB) -> AllocatableGpu:
    """The node's ``status.allocatable`` of ``nvidia.com/gpu``, ``nvidia.com/gpu-memory`` and
    ``nvidia.com/gpu-core`` as kube-scheduler reads them (``Quantity.Value()``: a fraction rounded
    up), in the model's units: gpu-memory units times ``memory_unit_mib`` (the feed's unit, the
    one pods' requests are read in, so both sides scale alike and compare as kube-scheduler's
    units do), gpu-core percent times 10. One not stated, or not a non-negative quantity an
    int64 holds, is None (the reader falls back on the cards: :class:`packing.model.AllocatableGpu`)."""
    status = node.get("status")
    alloc = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(alloc, Mapping):
        return AllocatableGpu()

    def read(key: str) -> int | None:
        if key not in alloc:
            return None
        try:
            v = parse_quantity(alloc[key]).to_integral_value(rounding=ROUND_CEILING)
        except (RequestError, TypeError, ValueError, ArithmeticError):
            return None
        return int(v) if v.is_finite() and 0 <= v <= _MAX_STATED else None

    gpus, mem, core = read(RESOURCE_GPU), read(RESOURCE_GPU_MEMORY), read(RESOURCE_GPU_CORE)
    return AllocatableGpu(gpus=gpus, mem_mib=None if mem is None else mem * memory_unit_mib,
                          core_milli=None if core is None else core * (CORE_MILLI_PER_CARD // 100))


def node_view(node: Mapping[str, Any], memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB) -> NodeView:
    """Node -> inventory + schedulability. A malformed inventory yields a node with no cards.
    ``memory_unit_mib``: the unit of ``nvidia.com/gpu-memory`` (:func:`node_gpu_allocatable`)."""
    name = str(meta(node).get("name") or "")
    try:
        inv = inventory_from_node(node)
        err = ""
    except (InventoryError, TypeError, ValueError, AttributeError) as exc:
        inv = Inventory(cards=(), source="invalid")
        err = str(exc) or repr(exc)
    cpu, mem, pods = node_allocatable(node)
    return NodeView(name=name, inventory=inv, closed=int(node_closure(node)), error=err,
                    cpu_milli=cpu, mem_mib=mem, max_pods=pods,
                    gpu_allocatable=node_gpu_allocatable(node, memory_unit_mib))


def node_into_model(model: ClusterModel, v: NodeView) -> None:
    """Apply a node's view to the model: its cards, allocatable CPU, memory and pod count, and
    schedulability. The watch does this for every node it sees, and so does every simulation
    that stands in for an API server (the bin-packing replay), so both models hold the same."""
    model.upsert_node(v.name, v.inventory, cpu_milli=v.cpu_milli, host_mem_mib=v.mem_mib,
                      max_pods=v.max_pods, closed=v.closed, gpu_allocatable=v.gpu_allocatable)


@dataclass(frozen=True)
class PodView:
    """What the model needs from one Pod object."""

    uid: str
    key: str                       # namespace/name
    node: str                      # spec.nodeName ("" while pending)
    terminal: bool                 # phase Succeeded/Failed: its cards are free again
    record: AllocationRecord | None
    error: str = ""                # malformed allocation annotation
    has_annotation: bool = False
    cpu_milli: int = 0             # host CPU / memory by the effective-request rule (pod_host_request)
    host_mem_mib: float = 0
    scheduler: str = ""            # spec.schedulerName ("default-scheduler" when unset)

    @property
    def holds_cards(self) -> bool:
        return self.record is not None and not self.terminal

    @property
    def host_request(self) -> GpuRequest:
        """The pod's host CPU and memory as a request without cards (what it holds on its node
        besides any cards)."""
        return GpuRequest(cpu_milli=self.cpu_milli, host_mem_mib=self.host_mem_mib)


def pod_view(pod: Mapping[str, Any], trust: RecordTrust | None = None) -> PodView:
    """Pod -> what the model needs. With ``trust``, a record counts only if it could have been
    written by the extender for this pod (signed, right scheduler and node, exactly the request);
    otherwise ``error`` says why and the pod holds no cards in the model."""
    m = meta(pod)
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    ann = m.get("annotations") if isinstance(m.get("annotations"), Mapping) else {}
    record, err = None, ""
    try:
        record = trust.record_of(pod) if trust is not None else allocation_of_pod(pod)
    except AllocationError as exc:
        err = str(exc)
    except (TypeError, ValueError, AttributeError) as exc:
        err = f"{ALLOCATION_ANNOTATION} is unreadable: {exc!r}"
    if record is not None:
        err = record_problem(record)
        if err:
            record = None
    try:
        cpu, mem = pod_host_request(pod, max_containers=None)   # held on its node whatever its size
    except (RequestError, TypeError, ValueError, AttributeError):
        cpu, mem = 0, 0.0  # an API server stores no malformed quantity; a hand-made object counts nothing
    return PodView(uid=str(m.get("uid") or ""), key=pod_key(pod), node=str(spec.get("nodeName") or ""),
                   terminal=status.get("phase") in TERMINAL_PHASES, record=record, error=err,
                   has_annotation=ALLOCATION_ANNOTATION in ann, cpu_milli=cpu, host_mem_mib=mem,
                   scheduler=str(spec.get("schedulerName") or "default-scheduler"))


def pod_kube_request(pod: Mapping[str, Any], memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB) -> Counts:
    """What kube-scheduler counts a bound pod as asking of the GPU resources on its node
    (:func:`stowage.resources.pod_gpu_amounts`, in the model's units); nothing for a malformed
    one, as for its host request. Read only where the model takes the pod in, not in
    :func:`pod_view`: most events of a bound pod (our own bind's echo, status updates) change
    nothing in the model, and the parse would be paid on every one of them."""
    try:
        return Counts(*pod_gpu_amounts(pod, memory_unit_mib, max_containers=None))
    except (RequestError, TypeError, ValueError, AttributeError):
        return Counts()



def record_problem(record: AllocationRecord) -> str:
    """Why a well-formed JSON record still cannot be replayed into the model ('' when it can)."""
    idx = [c.index for c in record.cards]
    if not record.node:
        return f"{ALLOCATION_ANNOTATION} names no node"
    if not idx:
        return f"{ALLOCATION_ANNOTATION} lists no cards"
    if any(k < 0 for k in idx) or len(set(idx)) != len(idx):
        return f"{ALLOCATION_ANNOTATION} has negative or duplicate card indices {idx}"
    if any(c.memory_mib < 0 or c.core_milli < 0 for c in record.cards):
        return f"{ALLOCATION_ANNOTATION} has a negative memory or core share"
    return ""


def record_by_uuid(record: AllocationRecord, uuids: Mapping[int, str]) -> AllocationRecord:
    """``record`` with each card at the index its uuid has on the node now (``uuids``: the node's
    index -> uuid). Why: the device plugin numbers cards in NVML order, so after it restarts with
    a card missing the later cards' indices shift down, while a running pod keeps its physical
    card, which its record names by uuid. A card whose uuid the node does not list keeps its
    index (the node's inventory may come from another source than when the record was written);
    if that would put two cards on one index, the record is replayed as written."""
    where = {u: k for k, u in uuids.items()}
    cards = tuple(replace(c, index=where.get(c.uuid, c.index)) for c in record.cards)
    if cards == record.cards or len({c.index for c in cards}) != len(cards):
        return record
    return replace(record, cards=cards)


def assign_args(record: AllocationRecord, cpu_milli: int = 0, host_mem_mib: float = 0,
                kube_request: Counts | None = None) -> dict[str, Any]:
    """Keyword arguments for ``ClusterModel.assign(..., check=False)`` that replay ``record`` exactly
    (with the pod's host CPU and memory, and what kube-scheduler counts it as asking: by default
    what the record books)."""
    cards = [c.index for c in record.cards]
    if record.whole:
        req = GpuRequest(gpus=max(1, len(cards)), cpu_milli=cpu_milli, host_mem_mib=host_mem_mib)
    else:
        req = GpuRequest(mem_mib=max((c.memory_mib for c in record.cards), default=0),
                         core_milli=max((c.core_milli for c in record.cards), default=0),
                         cpu_milli=cpu_milli, host_mem_mib=host_mem_mib)
    return {"node": record.node, "cards": cards, "req": req, "check": False,
            "mem_mib": [c.memory_mib for c in record.cards], "core_milli": [c.core_milli for c in record.cards],
            "kube_request": kube_request}
