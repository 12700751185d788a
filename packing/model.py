"""The live model of the cluster's cards: nodes x cards as numpy arrays, plus who holds what.

Why arrays: the extender scores every candidate node on every request (thousands of nodes) and
the benchmark replays ~100k placements per policy; both run the same pure functions
(:mod:`packing.fit`, :mod:`packing.decide`) over :class:`CardArrays`, vectorised with numpy.

Why one model per process, guarded by one lock: a card is never double-booked only if every
filter/prioritize/bind sees the same state and bind's re-check + commit is atomic. The extender
therefore holds the model in one process (see ``extender/gunicorn_conf.py``).

The booking arithmetic — what a pod takes from a card and a node — is :func:`card_shares` and
:func:`book`, used by :class:`ClusterModel` and by what-ifs on a copy of the arrays alike.

Nothing here is the source of truth: allocations live on the pods as annotations
(:mod:`stowage.allocation`), so the model can always be rebuilt from the API server.
"""
from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from stowage.inventory import Card, Inventory, normalize_model
from stowage.resources import CORE_MILLI_PER_CARD, GpuRequest

INF = float("inf")


class AllocationConflict(RuntimeError):
    """The chosen cards no longer have room (another pod took them in between)."""


@dataclass
class CardArrays:
    """Pure data the scoring functions read. Shape [N] for nodes, [N, K] for cards.

    A card slot k of node i exists when ``exists[i, k]``; its card index on the node is k.
    ``mem_*`` are MiB, ``core_free`` milli-cards (1000 = whole card). A card that holds a
    whole-GPU pod has ``mem_free == core_free == 0``. ``pods`` counts pods on the card, so a
    card is free for a whole-GPU pod iff it exists, is healthy and ``pods == 0``.
    """

    exists: np.ndarray
    healthy: np.ndarray
    mem_total: np.ndarray
    mem_free: np.ndarray
    core_free: np.ndarray
    pods: np.ndarray
    model: np.ndarray      # int ids into ClusterModel.models
    numa: np.ndarray       # -1 unknown
    nvlink: np.ndarray     # [N, K, K] bool adjacency
    node_ok: np.ndarray    # [N] node present and open to every pod
    cpu_free: np.ndarray   # [N] milli-CPU (inf when not modelled)
    hmem_free: np.ndarray  # [N] host MiB (inf when not modelled)
    pod_room: np.ndarray   # [N] pods the node may still take: allocatable pods - pods on it (inf when not modelled)
    # [N] allocatable milli-CPU and host MiB of the node, whatever is booked (inf when not
    # modelled): what the node could offer a pod when empty (placers' capability pressure).
    cpu_total: np.ndarray = field(default_factory=lambda: np.zeros(0))
    hmem_total: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # [N] why a present node is closed (:class:`stowage.taints.NodeClosure` bits; 0 where
    # ``node_ok`` or no node): a pod whose tolerations cover them all may still go there
    # (:func:`packing.fit.open_nodes`), as kube-scheduler lets it.
    closed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))

    @classmethod
    def empty(cls, n: int, k: int) -> "CardArrays":
        return cls(
            exists=np.zeros((n, k), bool), healthy=np.zeros((n, k), bool),
            mem_total=np.zeros((n, k), np.int64), mem_free=np.zeros((n, k), np.int64),
            core_free=np.zeros((n, k), np.int64), pods=np.zeros((n, k), np.int32),
            model=np.zeros((n, k), np.int32), numa=np.full((n, k), -1, np.int32),
            nvlink=np.zeros((n, k, k), bool), node_ok=np.zeros(n, bool),
            cpu_free=np.full(n, INF), hmem_free=np.full(n, INF), pod_room=np.full(n, INF),
            cpu_total=np.full(n, INF), hmem_total=np.full(n, INF), closed=np.zeros(n, np.uint8))

    @property
    def shape(self) -> tuple[int, int]:
        return self.exists.shape  # type: ignore[return-value]

    def resized(self, n: int, k: int) -> "CardArrays":
        """A copy grown to at least n nodes and k card slots (new slots empty)."""
        out = CardArrays.empty(n, k)
        n0, k0 = self.shape
        for name in ("exists", "healthy", "mem_total", "mem_free", "core_free", "pods", "model", "numa"):
            getattr(out, name)[:n0, :k0] = getattr(self, name)
        out.nvlink[:n0, :k0, :k0] = self.nvlink
        for name in ("node_ok", "cpu_free", "hmem_free", "pod_room", "cpu_total", "hmem_total", "closed"):
            getattr(out, name)[:n0] = getattr(self, name)
        return out

    def free_whole(self) -> np.ndarray:
        """[N, K] cards a whole-GPU pod could take now."""
        return self.exists & self.healthy & (self.pods == 0)


def card_shares(a: CardArrays, i: int | None, cards: Sequence[int],
                req: GpuRequest) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(memory MiB, compute milli) the pod takes on each of ``cards`` of node i: a whole card
    its total memory and all its compute (0 memory when the node or card is unknown), a
    share what it asks for."""
    if req.is_whole:
        mems = tuple(int(a.mem_total[i, k]) if i is not None and k < a.shape[1] else 0 for k in cards)
        return mems, tuple(CORE_MILLI_PER_CARD for _ in cards)
    return tuple(req.mem_mib for _ in cards), tuple(req.core_milli for _ in cards)


def book(a: CardArrays, i: int, cards: Sequence[int], mem_mib: Sequence[int], core_milli: Sequence[int],
         cpu_milli: float, host_mem_mib: float, sign: int = 1) -> None:
    """Book (sign=+1) or give back (-1) a pod's hold on node i: its card shares, one pod on
    each card, its host CPU and memory, and one of the node's pod slots. A card slot that no
    longer exists is skipped."""
    a.cpu_free[i] -= sign * cpu_milli
    a.hmem_free[i] -= sign * host_mem_mib
    a.pod_room[i] -= sign
    book_cards(a, i, cards, mem_mib, core_milli, sign)


def book_cards(a: CardArrays, i: int, cards: Sequence[int], mem_mib: Sequence[int], core_milli: Sequence[int],
               sign: int = 1, from_slot: int = 0) -> None:
    """The card part of :func:`book`, on the cards at slots ``from_slot`` and up only. A card
    past the model's slots is skipped (the allocation is kept on record; the slot is booked if
    the model widens: :meth:`ClusterModel._book_widened`)."""
    for k, mem, core in zip(cards, mem_mib, core_milli):
        if k < from_slot or k >= a.shape[1]:
            continue
        a.mem_free[i, k] -= sign * mem
        a.core_free[i, k] -= sign * core
        a.pods[i, k] += sign


def book_request(a: CardArrays, i: int, cards: Sequence[int], req: GpuRequest, sign: int = 1) -> None:
    """:func:`book` a request on ``cards`` of node i, as :meth:`ClusterModel.assign` books it."""
    mems, cores = card_shares(a, i, cards, req)
    book(a, i, cards, mems, cores, req.cpu_milli, req.host_mem_mib, sign)


class ModelNames(list):
    """:attr:`ClusterModel.models`: GPU model names by id (``CardArrays.model`` holds the ids).

    A plain list of names, plus ``epoch``: bumped whenever :meth:`ClusterModel.compact_models`
    renumbers the ids (the list is rewritten in place, so every holder of it sees the new
    names). Anything that caches data derived from the ids or the names (a placer's per-model
    matches or pressures) keys it by ``epoch`` as well as by ``len``; see
    :func:`models_epoch` for lists that are not a ``ModelNames``."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        super().__init__(names)
        self.epoch = 0


def models_epoch(models: Sequence[str]) -> int:
    """The renumbering epoch of a model-name list (:class:`ModelNames`), 0 for any other list
    (a fixed table, as the benchmarks and tests pass, is never renumbered)."""
    return int(getattr(models, "epoch", 0))


# Compact the model-name table when more than max(this, names in use) of its names are on no card.
MODEL_NAMES_SLACK = 64


@dataclass(frozen=True)
class Counts:
    """kube-scheduler's node-wide view of the GPU resources: whole cards (``nvidia.com/gpu``),
    share memory MiB (``nvidia.com/gpu-memory`` x the memory unit) and share compute milli
    (``nvidia.com/gpu-core`` x 10). What a pod asks of them, what a node has free, what evicting
    pods frees: kube-scheduler's NodeResourcesFit compares these, not cards."""

    gpus: int = 0
    mem_mib: int = 0
    core_milli: int = 0

    def __add__(self, o: "Counts") -> "Counts":
        return Counts(self.gpus + o.gpus, self.mem_mib + o.mem_mib, self.core_milli + o.core_milli)

    def __sub__(self, o: "Counts") -> "Counts":
        return Counts(self.gpus - o.gpus, self.mem_mib - o.mem_mib, self.core_milli - o.core_milli)

    def covers(self, o: "Counts") -> bool:
        return self.gpus >= o.gpus and self.mem_mib >= o.mem_mib and self.core_milli >= o.core_milli

    def at_least_zero(self) -> "Counts":
        return Counts(max(self.gpus, 0), max(self.mem_mib, 0), max(self.core_milli, 0))


def request_counts(req: GpuRequest) -> Counts:
    """What a pod of ``req`` asks in kube-scheduler's count: a whole-GPU pod its cards and the
    ``nvidia.com/gpu-memory`` it states as a per-card minimum (kube-scheduler counts that too),
    a share its memory and compute."""
    if req.is_whole:
        return Counts(gpus=req.gpus, mem_mib=req.min_card_mem_mib)
    return Counts(mem_mib=req.mem_mib, core_milli=req.core_milli)


@dataclass(frozen=True)
class AllocatableGpu:
    """A node's ``status.allocatable`` of the three GPU resources, in :class:`Counts`' units
    (memory in MiB by the feed's memory unit): what kube-scheduler's NodeResourcesFit counts pods'
    requests against. None: the node does not state it (or not as a quantity); whoever counts
    then falls back on its own estimate (the healthy cards), since kube-scheduler, which reads a
    missing one as 0, proposes no victims there for a pod asking it anyway."""

    gpus: int | None = None
    mem_mib: int | None = None
    core_milli: int | None = None


@dataclass
class PodAllocation:
    """One pod's hold on one node: its cards (none for a pod that asks for no GPU), its host
    CPU and memory, and one of the node's pod slots. The extender keeps one for every pod bound
    to a node (any scheduler's), read from its watch, as the benchmark does for its pods."""

    uid: str
    name: str               # namespace/name, for people
    node: str
    cards: tuple[int, ...]  # card indices (slots) on the node
    mem_mib: tuple[int, ...]
    core_milli: tuple[int, ...]
    whole: bool
    cpu_milli: int = 0      # host CPU (milli) and memory (MiB) the pod requests
    host_mem_mib: float = 0
    applied: bool = False   # False while the node is not (yet) in the model
    # What kube-scheduler counts the pod as asking of the GPU resources on its node, from its
    # spec (the feed's) or its request (a bind): also for a pod that holds no card in the model
    # (another scheduler's, a refused record), as kube-scheduler subtracts every bound pod's.
    kube_request: Counts = field(default_factory=Counts)


@dataclass
class NodeMeta:
    name: str
    uuids: dict[int, str] = field(default_factory=dict)
    models: dict[int, str] = field(default_factory=dict)
    source: str = "simulated"
    whole_only: bool = False
    pods: set[str] = field(default_factory=set)
    gpu_allocatable: AllocatableGpu = field(default_factory=AllocatableGpu)


class ClusterModel:
    """Nodes and their cards, and every GPU pod's allocation, behind one re-entrant lock.

    All mutating methods take the lock themselves; readers that need several consistent reads
    (filter, prioritize, bind) hold ``model.lock`` around them.
    """

    def __init__(self, max_cards: int = 8, capacity: int = 64) -> None:
        self.lock = threading.RLock()
        self.a = CardArrays.empty(capacity, max_cards)
        self.names: list[str | None] = [None] * capacity
        self.index: dict[str, int] = {}
        self.meta: dict[str, NodeMeta] = {}
        # GPU model names by id. Ids are handed out as new names come and, so that the table
        # stays bounded by what the nodes hold now (an inventory rewritten with new names on
        # every update would otherwise grow it, and every model-restricted filter's matching,
        # for the life of the process), renumbered by compact_models when unused names pile up.
        self.models: ModelNames = ModelNames(["UNKNOWN"])
        self._model_ids: dict[str, int] = {"UNKNOWN": 0}
        # Look for unused names (a pass over all card slots) only once the table grows past
        # this: after each look, the names in use plus twice max(MODEL_NAMES_SLACK, them), so
        # the looks cost O(cards / MODEL_NAMES_SLACK) per new name.
        self._models_check_at = 1 + 2 * MODEL_NAMES_SLACK
        self.models_compacted = 0  # times compact_models renumbered the ids (for tests, people)
        self.allocations: dict[str, PodAllocation] = {}
        self._free_slots: list[int] = list(range(capacity - 1, -1, -1))
        self.generation = 0  # bumped on every change; lets callers cache derived data
        # Per-row change counter: bumped whenever anything in row i (its cards, host resources,
        # schedulability, name or whole-only flag) changes, so callers can cache per-node work
        # and recompute only the rows that changed (see extender/rowcache.py). A resize
        # replaces ``self.a``; callers detect that by the arrays' identity.
        self.row_gen = np.zeros(capacity, np.int64)
        self._row_tick = 0
        self.index_gen = 0  # bumped when a node name is added to or removed from ``index``
        # GPU pods that LEFT (deleted, finished) and gave their cards back; never decreases. It
        # tells placers that pods come and go; a reservation taken back (a failed bind, a stale
        # or replaced record) is not a pod leaving and is not counted.
        self.gpu_releases = 0

    def copy(self) -> "ClusterModel":
        """A private copy for what-ifs (``stowage plan``): the same nodes, cards, allocations
        and counters, sharing nothing mutable with this one (its own lock), so placing pods in
        it through the extender's service never changes the live model."""
        with self.lock:
            return copy.deepcopy(self, {id(self.lock): threading.RLock()})

    # ----------------------------------------------------------------- nodes
    def model_id(self, model: str) -> int:
        key = normalize_model(model)
        mid = self._model_ids.get(key)
        if mid is None:
            mid = self._model_ids[key] = len(self.models)
            self.models.append(key)
        return mid

    def compact_models(self, *, force: bool = False) -> bool:
        """Drop the model names no card slot of the arrays carries, when more than
        ``max(MODEL_NAMES_SLACK, names in use)`` of them are unused (or always, with ``force``),
        and renumber the rest. Returns whether it did.

        Why: names come from node inventories, which a node's agent (or whoever may write its
        annotation) can rewrite with new names at will; kept forever, they grow memory and the
        per-filter matching of gpu-model patterns (``packing.fit.allowed_models``) without bound.

        How it stays consistent: the kept names keep their order ("UNKNOWN" stays 0), the list
        object is rewritten in place (placers hold it: ``bind_models``) and its ``epoch`` bumped,
        ``self.a`` is replaced by a copy with the ids remapped (as a resize does, so caches keyed
        by the arrays' identity — the row cache, a placer's FragIndex — start afresh), every
        row's ``row_gen`` and ``generation`` move. A name's meaning never changes, so no fit,
        score or card choice does."""
        with self.lock:
            a = self.a
            # In use: on any card slot of the arrays, including the slots of a removed node's
            # row until the row is reused (bounded by the arrays; and a placer that noticed a
            # new id there, before, notices it the same way after).
            used = np.unique(np.concatenate([[0], a.model.ravel().astype(np.int64)]))
            unused = len(self.models) - len(used)
            self._models_check_at = len(used) + 2 * max(MODEL_NAMES_SLACK, len(used))
            if not unused or (not force and unused <= max(MODEL_NAMES_SLACK, len(used))):
                return False
            remap = np.zeros(len(self.models), np.int32)
            remap[used] = np.arange(len(used), dtype=np.int32)
            kept = [self.models[int(m)] for m in used]
            out = a.resized(*a.shape)
            out.model = remap[a.model]
            self.a = out
            self.models[:] = kept
            self.models.epoch += 1
            self._model_ids = {name: m for m, name in enumerate(kept)}
            self._row_tick += 1
            self.row_gen[:] = self._row_tick
            self.generation += 1
            self.models_compacted += 1
            return True

    def _slot_for(self, name: str, ncards: int) -> int:
        n, k = self.a.shape
        if ncards > k:
            self.a = self.a.resized(n, max(ncards, k))
            self._book_widened(k)
        if name in self.index:
            return self.index[name]
        if not self._free_slots:
            grow = max(n, 16)
            self.a = self.a.resized(n + grow, self.a.shape[1])
            self.row_gen = np.concatenate([self.row_gen, np.zeros(grow, np.int64)])
            self.names.extend([None] * grow)
            self._free_slots.extend(range(n + grow - 1, n - 1, -1))
        slot = self._free_slots.pop()
        self.index[name] = slot
        self.index_gen += 1
        self.names[slot] = name
        return slot

    def _book_widened(self, k0: int) -> None:
        """The model just grew from ``k0`` card slots: book each applied allocation's cards at the
        new slots, which :func:`book` skipped while they did not exist, so that its release (which
        gives them back) leaves them as they were. Why: a record may name an index past any
        node's cards (indices go to 63); once a wider node widened the model, its pod's release
        took a pod count to -1 on a slot it never held. The new slots hold no card (0 memory), so
        a whole card's share there is 0, as :meth:`_apply` would book it."""
        a = self.a
        for alloc in self.allocations.values():
            i = self.index.get(alloc.node) if alloc.applied and alloc.cards and max(alloc.cards) >= k0 else None
            if i is not None:
                mems = tuple(0 for _ in alloc.cards) if alloc.whole else alloc.mem_mib
                book_cards(a, i, alloc.cards, mems, alloc.core_milli, +1, from_slot=k0)
                self._touch(i)

    def upsert_node(self, name: str, inventory: Inventory, *, cpu_milli: float = INF,
                    host_mem_mib: float = INF, max_pods: float = INF, closed: int = 0,
                    gpu_allocatable: AllocatableGpu = AllocatableGpu()) -> None:
        """Add a node or replace its cards and allocatable CPU, memory and pod count (INF: not
        modelled); allocations already held on it are kept. ``closed``: why it takes no new pods
        (:class:`stowage.taints.NodeClosure` bits; 0: open). ``gpu_allocatable``: its allocatable
        GPU resources as kube-scheduler counts them (read by the preempt verb and ``stowage
        plan``, never by filter: it costs no array)."""
        with self.lock:
            cards = list(inventory.cards)
            width = max((c.index for c in cards), default=-1) + 1
            i = self._slot_for(name, width)
            a = self.a
            a.exists[i] = False
            a.healthy[i] = False
            a.mem_total[i] = 0
            a.model[i] = 0
            a.numa[i] = -1
            a.nvlink[i] = False
            meta = self.meta.get(name) or NodeMeta(name=name)
            meta.uuids, meta.models = {}, {}
            meta.source, meta.whole_only = inventory.source, inventory.whole_only
            meta.gpu_allocatable = gpu_allocatable
            for c in cards:
                k = c.index
                a.exists[i, k] = True
                a.healthy[i, k] = c.healthy
                a.mem_total[i, k] = c.memory_mib
                a.model[i, k] = self.model_id(c.model)
                a.numa[i, k] = c.numa
                for peer in c.nvlink:
                    if 0 <= peer < a.shape[1]:
                        a.nvlink[i, k, peer] = a.nvlink[i, peer, k] = True
                meta.uuids[k] = c.uuid
                meta.models[k] = c.model
            a.node_ok[i] = not closed
            a.closed[i] = closed
            a.cpu_free[i] = a.cpu_total[i] = cpu_milli
            a.hmem_free[i] = a.hmem_total[i] = host_mem_mib
            a.pod_room[i] = max_pods
            self.meta[name] = meta
            self._recompute_node(i, meta)
            self._touch(i)
            self.generation += 1
            if len(self.models) > self._models_check_at:
                self.compact_models()

    def _recompute_node(self, i: int, meta: NodeMeta) -> None:
        """Free memory/core/pods of node i from its totals and the allocations on it."""
        a = self.a
        a.mem_free[i] = a.mem_total[i]
        # cpu_free/hmem_free/pod_room were just reset to the node's totals by upsert_node.
        a.core_free[i] = np.where(a.exists[i], CORE_MILLI_PER_CARD, 0)
        a.pods[i] = 0
        for uid in sorted(meta.pods):
            alloc = self.allocations.get(uid)
            if alloc is not None:
                self._apply(i, alloc, +1)

    @property
    def row_tick(self) -> int:
        """The latest ``row_gen`` value handed out: unchanged since a caller last read it
        means no row changed (a cheap check before comparing ``row_gen`` row by row)."""
        return self._row_tick

    def _touch(self, i: int) -> None:
        """Row i changed: give it a generation no earlier snapshot can hold."""
        self._row_tick += 1
        self.row_gen[i] = self._row_tick

    def _apply(self, i: int, alloc: PodAllocation, sign: int) -> None:
        self._touch(i)
        mems = alloc.mem_mib
        if alloc.whole:
            # A card held whole is held whole whatever its record says it held: all the memory it
            # has now. A record written when the card's memory was unknown (0) or smaller (a GFD
            # label that grew, a forged record) once left memory free on it, and a memory-only
            # share fit there: two pods on one card.
            a = self.a
            mems = tuple(int(a.mem_total[i, k]) if k < a.shape[1] else 0 for k in alloc.cards)
        book(self.a, i, alloc.cards, mems, alloc.core_milli, alloc.cpu_milli, alloc.host_mem_mib, sign)
        alloc.applied = sign > 0

    def remove_node(self, name: str) -> None:
        """Forget a node's cards. Its pods' allocations stay on record until the pods go."""
        with self.lock:
            i = self.index.pop(name, None)
            if i is None:
                return
            self.index_gen += 1
            a = self.a
            for arr in (a.exists, a.healthy, a.node_ok):
                arr[i] = False
            a.closed[i] = 0
            a.mem_total[i] = a.mem_free[i] = a.core_free[i] = a.pods[i] = 0
            a.nvlink[i] = False
            self.names[i] = None
            self._free_slots.append(i)
            self._touch(i)
            meta = self.meta.get(name)
            if meta is not None:
                for uid in meta.pods:
                    if uid in self.allocations:
                        self.allocations[uid].applied = False
            self.generation += 1

    def node_names(self) -> list[str]:
        return [n for n in self.names if n is not None]

    # ----------------------------------------------------------- allocations
    def assign(self, uid: str, name: str, node: str, cards: Iterable[int], req: GpuRequest, *,
               check: bool = True, mem_mib: Iterable[int] | None = None,
               core_milli: Iterable[int] | None = None, kube_request: Counts | None = None) -> PodAllocation:
        """Record that pod ``uid`` holds ``cards`` on ``node``.

        With ``check`` (bind), raises :class:`AllocationConflict` unless the cards still have room.
        Without it (rebuilding from pod annotations), the allocation is recorded whatever the
        state, so an allocation that exists on the cluster is never lost from the model.
        ``kube_request``: what kube-scheduler counts the pod as asking (:class:`Counts`; by
        default ``req``'s, :func:`request_counts`).
        """
        cards = tuple(int(k) for k in cards)
        with self.lock:
            if uid in self.allocations:
                prev = self.allocations[uid]
                if prev.node == node and prev.cards == cards:
                    return prev
                if check:
                    raise AllocationConflict(f"pod {name} already holds cards {list(prev.cards)} on {prev.node}")
                self.release(uid, departed=False)  # replaced by the new record
            i = self.index.get(node)
            a = self.a
            mems, cores = card_shares(a, i, cards, req)
            if mem_mib is not None:  # replaying a record: what it holds (a whole card: its total)
                mems = tuple(int(m) for m in mem_mib) if req.is_whole else tuple(mem_mib)
            if core_milli is not None and not req.is_whole:
                cores = tuple(core_milli)
            if check:
                self._check_room(node, i, cards, req, mems, cores)
            alloc = PodAllocation(uid=uid, name=name, node=node, cards=cards, mem_mib=mems,
                                  core_milli=cores, whole=req.is_whole, cpu_milli=req.cpu_milli,
                                  host_mem_mib=req.host_mem_mib,
                                  kube_request=request_counts(req) if kube_request is None else kube_request)
            self.allocations[uid] = alloc
            meta = self.meta.setdefault(node, NodeMeta(name=node))
            meta.pods.add(uid)
            if i is not None:
                self._apply(i, alloc, +1)
            self.generation += 1
            return alloc

    def _check_room(self, node: str, i: int | None, cards: tuple[int, ...], req: GpuRequest,
                    mems: tuple[int, ...], cores: tuple[int, ...]) -> None:
        a = self.a
        if i is None:
            raise AllocationConflict(f"node {node} is not known to the extender")
        if a.cpu_free[i] < req.cpu_milli or a.hmem_free[i] < req.host_mem_mib:
            raise AllocationConflict(f"node {node} has no room for the pod's CPU/memory")
        if a.pod_room[i] < 1:
            raise AllocationConflict(f"node {node} has reached its pod limit")
        if not req.is_gpu and not cards:
            return  # a pod without GPUs holds host resources only
        if len(set(cards)) != len(cards) or not cards:
            raise AllocationConflict(f"invalid card choice {list(cards)}")
        for k, mem, core in zip(cards, mems, cores):
            if k >= a.shape[1] or not a.exists[i, k]:
                raise AllocationConflict(f"card {k} does not exist on {node}")
            if not a.healthy[i, k]:
                raise AllocationConflict(f"card {k} on {node} is unhealthy")
            if req.is_whole:
                if a.pods[i, k] != 0:
                    raise AllocationConflict(f"card {k} on {node} is no longer free")
            elif a.mem_free[i, k] < mem or a.core_free[i, k] < core:
                raise AllocationConflict(
                    f"card {k} on {node} has {a.mem_free[i, k]} MiB / {a.core_free[i, k] / 10:g}% free now, "
                    f"pod needs {mem} MiB / {core / 10:g}%")

    def release(self, uid: str, *, departed: bool = True) -> PodAllocation | None:
        """Give the pod's cards back: it is gone (deleted, finished), or with ``departed=False``
        its reservation is taken back without the pod having run (not counted in
        :attr:`gpu_releases`)."""
        with self.lock:
            alloc = self.allocations.pop(uid, None)
            if alloc is None:
                return None
            meta = self.meta.get(alloc.node)
            if meta is not None:
                meta.pods.discard(uid)
            i = self.index.get(alloc.node)
            if i is not None and alloc.applied:
                self._apply(i, alloc, -1)
            self.generation += 1
            if alloc.cards and departed:
                self.gpu_releases += 1
            return alloc

    def card_uuid(self, node: str, k: int) -> str:
        meta = self.meta.get(node)
        return meta.uuids.get(k, f"{node}/gpu{k}") if meta else f"{node}/gpu{k}"

    def cards_of(self, node: str) -> list[Card]:
        """The node's cards as inventory records (current health), for people and `inspect`."""
        with self.lock:
            i = self.index[node]
            meta = self.meta[node]
            a = self.a
            return [Card(index=k, uuid=meta.uuids.get(k, ""), model=meta.models.get(k, "UNKNOWN"),
                         memory_mib=int(a.mem_total[i, k]), healthy=bool(a.healthy[i, k]),
                         numa=int(a.numa[i, k]),
                         nvlink=tuple(int(p) for p in np.flatnonzero(a.nvlink[i, k])))
                    for k in range(a.shape[1]) if a.exists[i, k]]
