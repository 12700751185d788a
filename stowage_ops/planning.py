"""What-if planning for operators: pure logic over a :class:`packing.model.ClusterModel`.

Three questions an operator asks before scaling, each answered by *running* the extender's
service on a private copy of the model (:meth:`packing.model.ClusterModel.copy`; the live model
is never touched):

- :func:`capacity` — how many more pods of a shape fit right now, and on which nodes. Pods are
  placed one after another through :func:`extender.placing.schedule` — the service's filter,
  prioritize and bind, the calls kube-scheduler makes, with the one choice rule — so the answer
  is what kube-scheduler + Stowage would do, not an arithmetic upper bound (a 40 GiB card with
  30 GiB used holds no 20 GiB slice, however much memory the cluster has in total).
- :func:`drain_plan` — which nodes could be emptied (so the cluster autoscaler can remove them)
  by moving the fewest pods, greedily: on a copy, a candidate node's pods leave and each is
  scheduled again, through the same service calls, on the nodes that stay.
- :func:`fragmentation` — per card, the free share that no typical pod shape could use now.

Shapes are written in a small grammar (:func:`parse_shape`) shared by ``stowage plan`` and its
tests. Nothing here does I/O.
"""
from __future__ import annotations

import copy
import random
import re
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

import numpy as np

from extender.placing import request_pod, schedule, serve
from extender.service import ExtenderService, pod_ask, pod_shape
from packing.fit import card_mask, fit, reason
from packing.model import AllocatableGpu, CardArrays, ClusterModel, Counts, PodAllocation, request_counts
from packing.placer import Placer, attach_placer
from packing.pod_policy import PodPolicy
from packing.registry import PLACERS, POLICY_PLACER, get_placer, placer_for
from stowage.inventory import model_matches
from stowage.resources import (CORE_MILLI_PER_CARD, MAX_CARD_MEMORY_MIB, MAX_GPUS_PER_POD, GpuRequest, RequestError,
                               fmt_mib, parse_quantity)

DEFAULT_LIMIT = 10_000


# --------------------------------------------------------------------------- shapes
class ShapeError(ValueError):
    """A shape string that does not follow the grammar; the message says how to write it."""


SHAPE_GRAMMAR = """\
  N            N whole GPUs                        e.g. 1, 4
  NxMEM        N whole GPUs of at least MEM each    e.g. 1x80Gi, 2x40Gi
  MEM          a slice of one GPU with MEM memory   e.g. 10Gi, 512Mi
  MEM,P%       a slice with MEM and P% of compute   e.g. 10Gi,30%
  ...@MODEL    any of the above, only on GPU models matching MODEL (A100, or A100|H100)
MEM is a Kubernetes quantity with a unit (Mi, Gi, Ti, M, G; 'GiB' is read as 'Gi')."""

_WHOLE = re.compile(r"^(\d+)(?:\s*[x×*]\s*(.*))?$", re.IGNORECASE)


@dataclass(frozen=True)
class Shape:
    """One pod shape: its GPU request and the card constraints (model, card size) it carries."""

    text: str
    req: GpuRequest
    policy: PodPolicy = field(default_factory=PodPolicy)

    def describe(self) -> str:
        s = self.req.describe()
        if self.policy.models_include:
            s += f" on {'/'.join(self.policy.models_include)}"
        return s


def _mem_mib(text: str, shape: str) -> int:
    t = text.strip()
    t = re.sub(r"(?i)([KMGTPE])iB$", lambda m: m.group(1).upper() + "i", t)
    if not t or t[-1].isdigit():
        raise ShapeError(f"shape {shape!r}: memory {text!r} needs a unit, e.g. {t or '10'}Gi")
    try:
        q = parse_quantity(t)
    except RequestError:
        raise ShapeError(f"shape {shape!r}: {text!r} is not a memory quantity (e.g. 10Gi, 512Mi)") from None
    mib = int(q / (1 << 20))
    if mib <= 0:
        raise ShapeError(f"shape {shape!r}: memory {text!r} must be at least 1Mi")
    if mib > MAX_CARD_MEMORY_MIB:   # as the extender refuses such a pod: no card could hold it
        raise ShapeError(f"shape {shape!r}: memory {text!r} is more than any card could hold (at most "
                         f"{fmt_mib(MAX_CARD_MEMORY_MIB)})")
    return mib


def parse_shape(text: str) -> Shape:
    """Parse a shape string (grammar in :data:`SHAPE_GRAMMAR`); raises :class:`ShapeError`."""
    if not isinstance(text, str) or not text.strip():
        raise ShapeError("empty shape; write e.g. 1, 4, 1x80Gi, 10Gi or 10Gi,30%")
    raw = text.strip()
    body, _, models = raw.partition("@")
    body = body.strip()
    policy = PodPolicy()
    if _:
        names = tuple(m.strip() for m in models.split("|") if m.strip())
        if not names:
            raise ShapeError(f"shape {raw!r}: nothing after '@' (write e.g. @A100 or @A100|H100)")
        policy = PodPolicy(models_include=names)
    m = _WHOLE.match(body)
    if m:
        # (the length first: int() refuses a number of more than 4,300 digits with a ValueError)
        gpus = int(m.group(1)) if len(m.group(1)) <= 6 else MAX_GPUS_PER_POD + 1
        if gpus <= 0:
            raise ShapeError(f"shape {raw!r}: the number of GPUs must be at least 1")
        if gpus > MAX_GPUS_PER_POD:   # as the extender refuses such a pod
            raise ShapeError(f"shape {raw!r}: the number of GPUs must be at most {MAX_GPUS_PER_POD}")
        if m.group(2) is not None and not m.group(2).strip():
            raise ShapeError(f"shape {raw!r}: give the card memory after 'x', e.g. {gpus}x80Gi")
        min_mem = _mem_mib(m.group(2), raw) if m.group(2) else 0
        return Shape(text=raw, req=GpuRequest(gpus=gpus, min_card_mem_mib=min_mem), policy=policy)
    mem_text, comma, core_text = body.partition(",")
    if body.lower().startswith(("x", "×")):
        raise ShapeError(f"shape {raw!r}: write the GPU count before 'x', e.g. 1x80Gi")
    mem = _mem_mib(mem_text, raw)
    core = 0
    if comma:
        c = core_text.strip().rstrip("%").strip()
        if not core_text.strip().endswith("%") or not c.isdigit():
            raise ShapeError(f"shape {raw!r}: compute must be a percentage 1-100 like 30%, got {core_text.strip()!r}")
        pct = int(c)
        if not 1 <= pct <= 100:
            raise ShapeError(f"shape {raw!r}: compute must be 1-100%, got {pct}%")
        core = pct * (CORE_MILLI_PER_CARD // 100)
    return Shape(text=raw, req=GpuRequest(mem_mib=mem, core_milli=core), policy=policy)


def shape_of_allocation(alloc: PodAllocation) -> GpuRequest:
    """The request a pod evidently made, rebuilt from what it holds (used to move it elsewhere)."""
    if alloc.whole:
        return GpuRequest(gpus=len(alloc.cards), cpu_milli=alloc.cpu_milli, host_mem_mib=alloc.host_mem_mib)
    return GpuRequest(mem_mib=int(alloc.mem_mib[0]) if alloc.mem_mib else 0,
                      core_milli=int(alloc.core_milli[0]) if alloc.core_milli else 0,
                      cpu_milli=alloc.cpu_milli, host_mem_mib=alloc.host_mem_mib)


# --------------------------------------------------------------------------- simulation
def copy_arrays(a: CardArrays) -> CardArrays:
    """A deep copy, so a what-if never changes the live model."""
    return CardArrays(**{f.name: getattr(a, f.name).copy() for f in fields(a)})


def placer_names() -> list[str]:
    """The names a what-if's ``placer`` takes: the node policy values (pack, spread) and every
    placer by its own name (most-allocated, ...)."""
    return [*POLICY_PLACER, *sorted(PLACERS)]


def _placer(placer: str | Placer | None) -> Placer:
    if placer is None:
        return placer_for("pack")
    if isinstance(placer, str):
        return placer_for(placer) if placer in POLICY_PLACER else get_placer(placer)
    return placer


def _prime(placer: Placer, model: ClusterModel) -> None:
    """Give the placer what the live extender's placer has: the model's GPU model names (the
    fragmentation-aware placers need them) and the pods already running (a learning placer
    has seen them, as a restarted extender learns them from its first list; one that is given
    its workload up front gets them as that workload)."""
    reqs = [shape_of_allocation(al) for al in model.allocations.values()]
    attach_placer(placer, model, workload=[(r, ()) for r in reqs] if reqs else None)
    for r in reqs:
        placer.observe(r)


@dataclass(frozen=True)
class Learned:
    """What the live extender's placer has learned, to replay in every what-if's service: the
    departed pods' past, then the pods of Stowage's schedulers in creation order (what a
    restarted extender learns, so what the running one holds), as (request, models, count).
    ``gpu_pods_left``: GPU pods have left the cluster (the pack placer's churn mode)."""

    shapes: tuple[tuple[GpuRequest, tuple[str, ...], int], ...] = ()
    gpu_pods_left: bool = False
    # The speed-up's seam: True, each what-if gets a copy of a placer taught once (taught());
    # False, the plain path: every what-if's service learns every shape again (0.2 s for 10k
    # pods and a past of 77k on the built-in cluster; --drain builds one per candidate node).
    reuse: bool = field(default=True, compare=False)
    _taught: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    @classmethod
    def of(cls, past: Any, pods: Sequence[Mapping[str, Any]], memory_unit_mib: int) -> "Learned":
        """From a :class:`extender.learned_past.DepartedPods` (or None) and Pod objects, each
        parsed as the watch's ``learn_pod`` parses it (:func:`extender.service.pod_shape`)."""
        shapes = list(past.items()) if past is not None else []
        left = past is not None and past.gpu_pods_left
        for pod in pods:
            shape = pod_shape(pod, memory_unit_mib)
            if shape is not None:
                shapes.append((shape[0], shape[1], 1))
        return cls(tuple(shapes), left)

    @classmethod
    def held(cls, model: ClusterModel) -> "Learned":
        """What a simulated cluster's placer learns (it has no Pod objects): the shapes of the pods
        the model holds, as :func:`_prime` shows them, to teach once and copy per what-if."""
        return cls(tuple((shape_of_allocation(al), (), 1) for al in model.allocations.values()))

    @property
    def pods(self) -> int:
        return sum(n for _, _, n in self.shapes)

    def taught(self, name: str) -> Placer:
        """A new placer ``name`` (not attached to any model yet) that has learned ``shapes``, as
        :meth:`ExtenderService.learn_shapes` teaches one: a copy of one taught at the first call.
        Learning reads no model, so the copy, attached to a what-if's model, is the placer the
        plain path builds (tested against it: tests/test_plan_learned.py)."""
        template = self._taught.get(name)
        if template is None:
            template = _placer(name)
            with template.learning_in_bulk():
                for req, models, n in self.shapes:
                    template.observe(req, models, n)
            if self.gpu_pods_left:
                template.note_release()
            self._taught[name] = template
        return copy.deepcopy(template)


def _service(model: ClusterModel, placer: str | Placer | None, learned: Learned | None = None) -> ExtenderService:
    """The extender's service over ``model`` (a copy, for a what-if). Its placer knows what the
    live extender's does when ``learned`` says it (a live cluster); otherwise (a simulated one,
    whose pods are only allocations) it is primed on the pods the model holds. Pods are then
    learned as the service sees them (at filter)."""
    pl = _placer(placer)
    if learned is None:
        _prime(pl, model)
        return serve(model, pl)
    if learned.reuse and not pl.knows_workload and (placer is None or isinstance(placer, str)):
        pl = learned.taught(placer or "pack")
        attach_placer(pl, model)
        return serve(model, pl)
    workload = [(r, m) for r, m, n in learned.shapes for _ in range(n)] if pl.knows_workload else []
    attach_placer(pl, model, workload=workload or None)   # a placer defined as knowing its workload: this one
    service = serve(model, pl)
    service.learn_shapes(learned.shapes, gpu_pods_left=learned.gpu_pods_left)
    return service


def _node_names(model: ClusterModel) -> list[str]:
    """Every node, in slot order (what kube-scheduler sends the extender; ties go to the lowest slot)."""
    return [n for n in model.names if n is not None]


WHATIF_NAMESPACE = "stowage-plan"

# kube-scheduler's NodeResourcesFit words for a node whose allocatable nvidia.com/gpu is used up.
KUBE_GPU_REFUSAL = ("Insufficient nvidia.com/gpu (kube-scheduler: the node's allocatable nvidia.com/gpu, less what its "
                    "pods ask, is too few)")
# ... and for a slice's two resources.
KUBE_GPU_MEMORY_REFUSAL = ("Insufficient nvidia.com/gpu-memory (kube-scheduler: the node's allocatable "
                           "nvidia.com/gpu-memory, less what its pods ask, is too little)")
# ... for a pod asking more whole GPUs than the node's allocatable has, whatever is evicted.
KUBE_GPU_SHORT = ("Insufficient nvidia.com/gpu (kube-scheduler: the node's allocatable nvidia.com/gpu is fewer than "
                  "the pod asks, whatever is evicted)")
KUBE_GPU_CORE_REFUSAL = ("Insufficient nvidia.com/gpu-core (kube-scheduler: the node's allocatable nvidia.com/gpu-core, "
                         "less what its pods ask, is too little)")


@dataclass(frozen=True)
class GpuAllocatable:
    """kube-scheduler's own check of the GPU resources (NodeResourcesFit), made before it sends
    the extender a node: a pod goes only to a node whose allocatable ``nvidia.com/gpu``,
    ``nvidia.com/gpu-memory`` and ``nvidia.com/gpu-core``, each less what the pods bound there
    ask of it, covers what the pod asks (N whole GPUs ask ``nvidia.com/gpu``, and the gpu-memory
    they state; a slice its memory and compute). The live extender never sees a node that fails
    it, so a what-if must not offer one either: on a node whose allocatable is below its
    inventory's healthy cards (or whose pods hold unhealthy cards) Stowage's free cards promised
    room kube-scheduler refuses.

    ``stated``: node -> allocatable ``nvidia.com/gpu``
    (:attr:`stowage_ops.cluster_source.LiveFacts.gpu_allocatable`: a missing one is 0, as
    kube-scheduler reads it; None: unreadable, not checked). Memory and compute are the model's
    (:attr:`packing.model.NodeMeta.gpu_allocatable`, as the feed read the Node, in the feed's
    memory unit); a node that does not state one is not checked for it (a node with Stowage's
    device plugin states all three; one without it has no card memory for a slice). What the
    pods bound there ask of each is the model's count of them
    (:attr:`packing.model.PodAllocation.kube_request`: every bound pod, those without a record
    or with one the feed refused too), the one the preempt verb uses."""

    stated: Mapping[str, int | None] = field(default_factory=dict)

    def room(self, model: ClusterModel, node: str) -> int | None:
        """Whole GPUs kube-scheduler would still admit on ``node`` (None: not checked)."""
        stated = self.stated.get(node)
        if stated is None or node not in model.index:
            return None
        return stated - _asked(model, node).gpus

    @staticmethod
    def share_room(model: ClusterModel, node: str) -> tuple[int | None, int | None]:
        """(gpu-memory MiB, gpu-core milli) kube-scheduler would still admit on ``node``; None
        where the node does not state it (not checked)."""
        meta = model.meta.get(node)
        if meta is None or node not in model.index:
            return None, None
        st = meta.gpu_allocatable
        if st.mem_mib is None and st.core_milli is None:
            return None, None
        used = _asked(model, node)
        return (None if st.mem_mib is None else st.mem_mib - used.mem_mib,
                None if st.core_milli is None else st.core_milli - used.core_milli)

    def refusal(self, model: ClusterModel, node: str, req: GpuRequest) -> str:
        """kube-scheduler's words refusing a pod of ``req`` on ``node`` ('' when it admits it)."""
        ask = request_counts(req)
        if ask.gpus:
            room = self.room(model, node)
            if room is not None and room < ask.gpus:
                return KUBE_GPU_REFUSAL
        if ask.mem_mib or ask.core_milli:
            mem, core = self.share_room(model, node)
            if ask.mem_mib and mem is not None and mem < ask.mem_mib:
                return KUBE_GPU_MEMORY_REFUSAL
            if ask.core_milli and core is not None and core < ask.core_milli:
                return KUBE_GPU_CORE_REFUSAL
        return ""

    def tight(self, model: ClusterModel) -> frozenset[str]:
        """The nodes where kube-scheduler's room is below what Stowage's healthy cards have free
        (whole cards; memory; compute): the only ones where its check can refuse what the
        extender would take. (Placing pods takes as much of both, or more of the cards: a whole
        card all its memory; only a pod leaving unhealthy cards, or a whole card, frees more of
        the second, and a drain's emptied node takes no pods.)"""
        out = []
        a = model.a
        for node in set(self.stated) | {n for n, meta in model.meta.items() if meta.gpu_allocatable != _UNSTATED}:
            i = model.index.get(node)
            if i is None:
                continue
            healthy = a.exists[i] & a.healthy[i]
            room = self.room(model, node)
            if room is not None and room < int((healthy & (a.pods[i] == 0)).sum()):
                out.append(node)
                continue
            mem, core = self.share_room(model, node)
            if (mem is not None and mem < int(np.maximum(a.mem_free[i][healthy], 0).sum())) or (
                    core is not None and core < int(np.maximum(a.core_free[i][healthy], 0).sum())):
                out.append(node)
        return frozenset(out)

    def admitted(self, model: ClusterModel, names: Sequence[str], req: GpuRequest, tight: Collection[str],
                 refusals: dict[str, str] | None = None) -> list[str]:
        """``names`` less the ``tight`` nodes kube-scheduler refuses a pod of ``req`` (each
        given its words, :meth:`refusal`, in ``refusals``)."""
        if not req.is_gpu or not tight:
            return list(names)
        out = []
        for n in names:
            why = self.refusal(model, n, req) if n in tight else ""
            if why:
                if refusals is not None:
                    refusals[n] = why
                continue
            out.append(n)
        return out


_UNSTATED = AllocatableGpu()


@dataclass
class CapacityResult:
    """How many more pods of ``shape`` fit now, and where they would go."""

    shape: Shape
    count: int
    per_node: dict[str, int]
    placements: list[tuple[str, tuple[int, ...]]]
    limited: bool          # stopped at the limit: at least ``count`` fit
    why_not: dict[str, int]  # when nothing more fits: reason -> number of nodes

    def to_json(self) -> dict:
        return {"shape": self.shape.text, "describe": self.shape.describe(), "count": self.count,
                "atLeast": self.limited, "perNode": self.per_node,
                "placements": [{"node": n, "cards": list(c)} for n, c in self.placements],
                "whyNotMore": self.why_not}


def capacity(model: ClusterModel, shape: Shape, placer: str | Placer | None = None,
             limit: int = DEFAULT_LIMIT, learned: Learned | None = None,
             progress: Callable[[int], None] | None = None,
             allocatable: GpuAllocatable | None = None) -> CapacityResult:
    """Schedule pods of ``shape`` one after another, through the extender's service on a copy of
    the cluster, until none fits; then why not, per node, in the words filter uses. ``progress``
    is told the count after each pod placed (a big cluster takes minutes to fill to ``limit``).
    ``allocatable``: a live cluster's nodes' allocatable GPU resources, which kube-scheduler
    checks before it sends the extender a node (:class:`GpuAllocatable`)."""
    sim = model.copy()
    service = _service(sim, placer, learned)
    all_names = _node_names(sim)
    kube = allocatable or GpuAllocatable()
    tight = kube.tight(sim)
    per_node: Counter[str] = Counter()
    placements: list[tuple[str, tuple[int, ...]]] = []
    refusals: dict[str, str] = {}
    while len(placements) < limit:
        n = len(placements)
        uid = f"{WHATIF_NAMESPACE}/what-if-{n}"
        pod = request_pod(f"what-if-{n}", shape.req, shape.policy, namespace=WHATIF_NAMESPACE, uid=uid)
        kube_refused: dict[str, str] = {}
        names = kube.admitted(sim, all_names, shape.req, tight, kube_refused)
        node = schedule(service, pod, names, refusals=refusals) if names else None
        if node is None:
            refusals.update(kube_refused)
            break
        per_node[node] += 1
        placements.append((node, sim.allocations[uid].cards))
        if progress is not None:
            progress(len(placements))
    limited = len(placements) >= limit
    why: Counter[str] = Counter()
    if not limited:
        for text in refusals.values():
            why[text] += 1   # filter's reasons hold no per-node numbers: equal causes add up
    return CapacityResult(shape=shape, count=len(placements),
                          per_node=dict(sorted(per_node.items(), key=lambda kv: (-kv[1], kv[0]))),
                          placements=placements, limited=limited, why_not=dict(why.most_common()))


def _whole_only(model: ClusterModel, name: str) -> bool:
    """Whether the node's card memory is unknown (``reason``'s ``whole_only``; its fifth
    argument, which once got the node's name here and so called every node whole-only)."""
    meta = model.meta.get(name)
    return bool(meta is not None and meta.whole_only)


# --------------------------------------------------------------------------- drain plan
@dataclass(frozen=True)
class Move:
    pod: str
    uid: str
    source: str
    source_cards: tuple[int, ...]
    target: str
    target_cards: tuple[int, ...]
    shape: str


@dataclass
class DrainedNode:
    node: str
    gpus: int
    moves: list[Move]


@dataclass
class DrainPlan:
    """Nodes that can be emptied, in the order they were chosen, and the pods to move."""

    drained: list[DrainedNode]
    kept: dict[str, str]  # node -> why it cannot be emptied (first pod that found no room)
    not_tried: int = 0    # candidates never tried: the plan had emptied max_nodes already

    @property
    def moves(self) -> list[Move]:
        return [m for d in self.drained for m in d.moves]

    @property
    def gpus_freed(self) -> int:
        return sum(d.gpus for d in self.drained)

    def to_json(self) -> dict:
        return {"nodesFreed": len(self.drained), "gpusFreed": self.gpus_freed, "podsToMove": len(self.moves),
                "drained": [{"node": d.node, "gpus": d.gpus,
                             "moves": [{"pod": m.pod, "uid": m.uid, "from": m.source, "fromCards": list(m.source_cards),
                                        "to": m.target, "toCards": list(m.target_cards), "shape": m.shape}
                                       for m in d.moves]} for d in self.drained],
                "kept": self.kept, "notTried": self.not_tried}


def _pods_on(model: ClusterModel, node: str) -> list[PodAllocation]:
    meta = model.meta.get(node)
    if meta is None:
        return []
    allocs = [model.allocations[u] for u in sorted(meta.pods) if u in model.allocations]
    return [al for al in allocs if al.applied]


def _asked(model: ClusterModel, node: str) -> Counts:
    """What the pods bound to ``node`` ask of the GPU resources, as kube-scheduler counts them
    (:attr:`packing.model.PodAllocation.kube_request`)."""
    used = Counts()
    for al in _pods_on(model, node):
        used = used + al.kube_request
    return used


def _milli_held(al: PodAllocation) -> int:
    """Milli-cards a pod holds (0 for a pod without cards)."""
    if not al.cards:
        return 0
    return len(al.cards) * CORE_MILLI_PER_CARD if al.whole else max(al.core_milli)


def _size_key(al: PodAllocation) -> tuple:
    """Biggest first (first-fit decreasing): whole multi-GPU pods are the hardest to re-place."""
    return (-(len(al.cards) * CORE_MILLI_PER_CARD if al.whole else 0), -sum(al.mem_mib), -sum(al.core_milli), al.uid)


# What a pod asks of the extender: its request and its card constraints (models, card size).
Ask = tuple[GpuRequest, PodPolicy]


def pod_asks(pods: Iterable[Mapping[str, Any]], memory_unit_mib: int) -> dict[str, Ask]:
    """Pod uid -> what the pod asks, parsed as the extender parses it (``extender.service.pod_ask``:
    its request and ``stowage.io/`` annotations), for :func:`drain_plan` to move each pod as what
    it asks rather than as a guess from what it holds. A pod that cannot be parsed (the extender
    never placed it, so it holds no card) or has no uid is left out; hostile values fail here as
    at filter."""
    out: dict[str, Ask] = {}
    for pod in pods:
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        uid = meta.get("uid") if isinstance(meta, Mapping) else None
        ask = pod_ask(pod, memory_unit_mib) if isinstance(uid, str) else None
        if ask is not None:
            out[uid] = ask
    return out


def drain_plan(model: ClusterModel, placer: str | Placer | None = None, *, keep_model: bool = True,
               max_nodes: int | None = None, learned: Learned | None = None, stays: Collection[str] = (),
               unrecorded: Mapping[str, str] | None = None, asks: Mapping[str, Ask] | None = None,
               progress: Callable[[int, int], None] | None = None,
               allocatable: GpuAllocatable | None = None) -> DrainPlan:
    """Greedy: try to empty nodes with the fewest, lightest GPU pods first.

    A candidate is emptied only if every one of its pods can be scheduled again, through the
    extender's service (:func:`extender.placing.schedule`), on nodes that stay: on a copy of
    the cluster the candidate's pods leave (as evicted pods do), and each is sent to filter with
    the nodes kube-scheduler would send once the candidate is cordoned — never the candidate
    itself nor a node already emptied — biggest first. A node that received moved pods is never
    emptied in turn (so each pod moves once). A pod in ``asks`` (a live cluster's pods, by uid:
    :func:`pod_asks`) asks what it asks itself, its request and card constraints, as the
    extender would see it when recreated. Any other pod (a simulated cluster's) asks what it
    holds, and, since the model does not record which constraints it asked for: with
    ``keep_model`` the GPU model it runs on now (``stowage.io/gpu-model``); without it a
    whole-GPU pod cards with at least as much memory as it has now, and a slice any card with
    room. Empty GPU nodes come first
    and cost no move. Each candidate gets a fresh placer primed on the pods that stay (or, with
    ``learned``, knowing what the live extender's placer knows), so a candidate that cannot be
    emptied teaches the next nothing.

    Pods that hold no cards (CPU-only pods: kube-scheduler sends them through the extender too)
    must leave as well and are moved the same way, by their host CPU and memory. ``stays``: pods
    that go with their node and are not moved (DaemonSet pods, which ``kubectl drain
    --ignore-daemonsets`` and the cluster autoscaler leave). ``unrecorded``: GPU pods bound
    without Stowage's record (uid -> node); Stowage does not know their cards, so their node is
    never emptied by this plan. ``progress`` is told (candidates tried, candidates) after each.
    ``allocatable``: as for :func:`capacity`, no pod moves to a node kube-scheduler would not
    send the extender for it.
    """
    sim = model.copy()
    if learned is None and (placer is None or isinstance(placer, str)):
        # A simulated cluster's placer learns the pods the cluster holds: taught once, copied per
        # candidate (Learned.taught), as a live cluster's. Taught afresh per candidate (_prime),
        # the plan was O(nodes x pods): 143 of 149 s on 1,000 nodes and 7,250 pods.
        learned = Learned.held(sim)
    names = _node_names(sim)
    kube = allocatable or GpuAllocatable()
    tight = kube.tight(sim)
    index = dict(sim.index)
    staying = frozenset(stays)
    pods = {n: [al for al in _pods_on(sim, n) if al.uid not in staying] for n in index}
    gpu_nodes = [n for n, i in index.items() if sim.a.exists[i].any()]
    held = {n: sum(_milli_held(al) for al in pods[n]) for n in gpu_nodes}
    order = sorted(gpu_nodes, key=lambda n: (len(pods[n]), held[n], n))
    drained: list[DrainedNode] = []
    kept: dict[str, str] = {}
    unknown = Counter((unrecorded or {}).values())
    for node in gpu_nodes:
        if unknown[node]:
            kept[node] = (f"runs {unknown[node]} GPU pod(s) bound without Stowage's record (their cards are "
                          "unknown to Stowage): not emptied")
    order = [n for n in order if n not in kept]
    receivers: set[str] = set()
    emptied: set[str] = set()
    for tried, node in enumerate(order):
        if progress is not None and tried:
            progress(tried, len(order))
        if max_nodes is not None and len(drained) >= max_nodes:
            return DrainPlan(drained=drained, kept=kept, not_tried=len(order) - tried)
        if node in receivers:
            kept[node] = "receives pods moved from another emptied node"
            continue
        i = index[node]
        gpus = int(sim.a.exists[i].sum())
        if not pods[node]:
            emptied.add(node)
            drained.append(DrainedNode(node=node, gpus=gpus, moves=[]))
            continue
        # Tried on ``sim`` itself and undone if it fails (:func:`_undo_trial`): a copy of the
        # whole cluster per candidate made the plan O(nodes x cluster), over 15 minutes on 5,000
        # nodes and 49,000 pods.
        trial, releases = sim, sim.gpu_releases
        for al in pods[node]:
            trial.release(al.uid)
        service = _service(trial, placer, learned)
        targets = [n for n in names if n != node and n not in emptied]
        moves: list[Move] = []
        failed = ""
        for al in sorted(pods[node], key=_size_key):
            req, pol = (asks or {}).get(al.uid) or _move_request(sim, i, al, keep_model)
            namespace, _, name = al.name.rpartition("/")
            pod = request_pod(name or al.uid, req, pol, namespace=namespace or "default", uid=al.uid)
            admitted = kube.admitted(trial, targets, req, tight)
            target = schedule(service, pod, admitted) if admitted else None
            if target is None:
                failed = f"no room on the nodes that stay for {al.name} ({_move_shape(req)})"
                break
            moves.append(Move(pod=al.name, uid=al.uid, source=node, source_cards=tuple(al.cards),
                              target=target, target_cards=trial.allocations[al.uid].cards,
                              shape=_move_shape(req)))
        if failed:
            _undo_trial(sim, pods[node], moves, releases)
            kept[node] = failed
            continue
        emptied.add(node)
        receivers.update(m.target for m in moves)
        drained.append(DrainedNode(node=node, gpus=gpus, moves=moves))
    return DrainPlan(drained=drained, kept=kept)


def _undo_trial(sim: ClusterModel, left: Sequence[PodAllocation], moves: Sequence[Move], releases: int) -> None:
    """Put ``sim`` back as it was before a drain candidate was tried: the pods moved take back
    their reservations (not pods leaving), the candidate's pods (``left``, as they were) hold
    their cards again, and the count of GPU pods that left is what it was (placers read it,
    :func:`packing.placer.attach_placer`), so the next candidate plans as on an untouched copy."""
    for mv in moves:
        sim.release(mv.uid, departed=False)
    for al in left:
        req = shape_of_allocation(al)
        sim.assign(al.uid, al.name, al.node, al.cards, req, check=False, mem_mib=al.mem_mib, core_milli=al.core_milli)
    sim.gpu_releases = releases


def unmatched_models(model: ClusterModel, patterns: Iterable[str]) -> list[str]:
    """The model names of ``patterns`` that no card of the cluster matches (a typo, or a model
    this cluster does not have), so that '0 fit' can say why."""
    present = [m for m in model.models if m != "UNKNOWN"]
    return [p for p in patterns if not any(model_matches(p, m) for m in present)]


def _move_shape(req: GpuRequest) -> str:
    """What a moved pod asks for, for people: its GPU shape, or its host request when it has none."""
    if req.is_gpu:
        return req.describe()
    return f"no GPU; {req.cpu_milli / 1000:g} CPU, {fmt_mib(req.host_mem_mib)} memory"


def _move_request(model: ClusterModel, i: int, al: PodAllocation, keep_model: bool) -> tuple[GpuRequest, PodPolicy]:
    """The request and card constraints a pod moved off node slot ``i`` asks for (see
    :func:`drain_plan`): its shape, and its current GPU model or (whole GPUs) card size."""
    req = shape_of_allocation(al)
    if keep_model and al.cards:
        return req, PodPolicy(models_include=(model.models[int(model.a.model[i, al.cards[0]])],))
    if al.whole and al.cards:
        return replace(req, min_card_mem_mib=int(model.a.mem_total[i, list(al.cards)].min())), PodPolicy()
    return req, PodPolicy()


# --------------------------------------------------------------------------- fragmentation
def free_share(a: CardArrays) -> np.ndarray:
    """[N, K] milli-cards still free on each healthy card: the smaller of free compute and
    free memory as a share of the card (an empty card is 1000)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        mem_share = np.where(a.mem_total > 0, a.mem_free * CORE_MILLI_PER_CARD // np.maximum(a.mem_total, 1),
                             a.core_free)
    share = np.minimum(a.core_free, mem_share)
    share = np.where(a.pods == 0, CORE_MILLI_PER_CARD, share)
    return np.clip(np.where(a.exists & a.healthy, share, 0), 0, CORE_MILLI_PER_CARD)


def typical_shapes(model: ClusterModel, coverage: float = 0.95) -> list[Shape]:
    """The pod shapes running now, most frequent first until ``coverage`` of pods is covered,
    plus one whole GPU (what an empty card is always good for)."""
    counts: Counter[GpuRequest] = Counter()
    with model.lock:
        for al in model.allocations.values():
            if not al.cards:
                continue        # a pod without cards (CPU only) is no GPU shape
            r = shape_of_allocation(al)
            counts[GpuRequest(gpus=r.gpus, mem_mib=r.mem_mib, core_milli=r.core_milli)] += 1
    total = sum(counts.values())
    out: list[Shape] = [Shape(text="1", req=GpuRequest(gpus=1))]
    seen = 0
    for r, c in counts.most_common():
        if total and seen >= coverage * total:
            break
        seen += c
        if r != out[0].req:
            out.append(Shape(text=r.describe(), req=r))
    return out


@dataclass
class Fragmentation:
    """Per card: free share (milli) and the part of it no typical shape could use now."""

    free: np.ndarray      # [N, K]
    stranded: np.ndarray  # [N, K]
    shapes: list[Shape]

    def node_totals(self, i: int) -> tuple[int, int]:
        return int(self.free[i].sum()), int(self.stranded[i].sum())

    @property
    def cluster_pct(self) -> float:
        """Stranded share of all free GPU capacity, in percent."""
        tot = float(self.free.sum())
        return 100.0 * float(self.stranded.sum()) / tot if tot else 0.0


def fragmentation(model: ClusterModel, shapes: Sequence[Shape] | None = None) -> Fragmentation:
    """A card's free share is stranded when no shape in ``shapes`` (default: the typical ones
    running now) could be placed using that card right now — FGD's notion of fragmentation,
    reported per card so an operator sees where the waste sits."""
    shapes = list(shapes) if shapes else typical_shapes(model)
    with model.lock:
        a = copy_arrays(model.a)
        models = list(model.models)
    usable_any = np.zeros(a.shape, bool)
    for s in shapes:
        f = fit(a, s.req, card_mask(a, models, s.policy, s.req), s.policy.tolerates)
        usable_any |= f.usable & f.ok[:, None]
    free = free_share(a)
    stranded = np.where(usable_any, 0, free)
    return Fragmentation(free=free, stranded=stranded, shapes=shapes)


# --------------------------------------------------------------------------- demo fill
FILL_MIX: tuple[tuple[float, GpuRequest], ...] = (
    (0.35, GpuRequest(gpus=1)),
    (0.08, GpuRequest(gpus=2)),
    (0.04, GpuRequest(gpus=4)),
    (0.18, GpuRequest(mem_mib=10 * 1024, core_milli=300)),
    (0.15, GpuRequest(mem_mib=20 * 1024, core_milli=500)),
    (0.12, GpuRequest(mem_mib=5 * 1024, core_milli=100)),
    (0.08, GpuRequest(mem_mib=40 * 1024, core_milli=0)),
)


def fill_random(model: ClusterModel, n: int, seed: int = 0, placer: str | Placer | None = None,
                namespace: str = "fill", progress: Callable[[int, int], None] | None = None) -> int:
    """Schedule up to ``n`` pods of a seeded random mix (:data:`FILL_MIX`) into the model, through
    the extender's service (:func:`extender.placing.schedule`), so a simulated cluster shows
    something. Returns how many were placed (the rest found no room). ``progress`` is told
    (pods tried, ``n``) after each (about 2 ms a pod on 5,000 nodes: a big fill takes minutes)."""
    rng = random.Random(seed)
    service = _service(model, placer)
    names = _node_names(model)
    weights = [w for w, _ in FILL_MIX]
    placed = 0
    for p in range(n):
        req = rng.choices([r for _, r in FILL_MIX], weights)[0]
        pod = request_pod(f"pod-{p:05d}", req, namespace=namespace, uid=f"{namespace}-uid-{p:05d}")
        if schedule(service, pod, names) is not None:
            placed += 1
        if progress is not None:
            progress(p + 1, n)
    return placed


def iter_nodes(model: ClusterModel) -> Iterable[tuple[int, str]]:
    """(slot, name) of every node, in name order (what tables show)."""
    return sorted(((i, n) for n, i in model.index.items()), key=lambda t: t[1])


# --------------------------------------------------------------------------- what would it take
@dataclass(frozen=True)
class Eviction:
    pod: str
    uid: str
    priority: int
    cards: tuple[int, ...]
    shape: str


@dataclass(frozen=True)
class PreemptOption:
    """One node where the pod would fit once ``evict`` are gone (none: it fits now)."""

    node: str
    evict: tuple[Eviction, ...]

    @property
    def key(self) -> tuple:
        """Fewest pods, then the lowest highest priority, then the lowest sum (kube-scheduler's
        order among preemption candidates, less PodDisruptionBudgets, which are not modelled)."""
        prios = [e.priority for e in self.evict]
        return (len(prios), max(prios, default=-(1 << 62)), sum(prios), self.node)


@dataclass
class PreemptPlan:
    """What it would take to place one pod of ``shape`` at ``priority``."""

    shape: Shape
    priority: int
    options: list[PreemptOption]   # best first
    no_help: dict[str, int]        # why no eviction helps -> number of nodes

    @property
    def fits_now(self) -> bool:
        return bool(self.options) and not self.options[0].evict

    def to_json(self) -> dict:
        return {"shape": self.shape.text, "describe": self.shape.describe(), "priority": self.priority,
                "fitsNow": self.fits_now,
                "options": [{"node": o.node, "evict": [{"pod": e.pod, "uid": e.uid, "priority": e.priority,
                                                        "cards": list(e.cards), "shape": e.shape} for e in o.evict]}
                            for o in self.options],
                "noEvictionHelps": self.no_help}


def _describe_alloc(al: PodAllocation) -> str:
    return shape_of_allocation(al).describe()


def preemption_plan(model: ClusterModel, shape: Shape, priority: int,
                    priorities: dict[str, int] | None = None,
                    allocatable: GpuAllocatable | None = None) -> PreemptPlan:
    """Which pods would have to go where for one pod of ``shape`` at ``priority``: on every node,
    the pods of lower priority are the candidates (as kube-scheduler proposes them), and
    :func:`packing.preempt.judge_node` — the extender's preempt verb — keeps the fewest of them
    whose going frees cards the pod can use. ``priorities``: pod uid -> priority (0 when absent).
    ``allocatable``: as for :func:`capacity`; a node whose allocatable ``nvidia.com/gpu`` is
    below the pod's GPUs is no option, whatever is evicted; one where kube-scheduler's check of
    ``nvidia.com/gpu``, gpu-memory or gpu-core refuses the pod for what the pods there ask gets
    the evictions its count needs (:func:`packing.preempt.judge_node` counts the node's
    allocatable, as kube-scheduler counts the node without its victims), even where the cards
    have room now. (Before, a node whose pods asked any of its GPUs was no option for a
    whole-GPU pod: "evictions for it are not planned".)"""
    from packing.preempt import judge_node, row_copy

    prio = dict(priorities or {})
    kube = allocatable or GpuAllocatable()
    options: list[PreemptOption] = []
    why: Counter[str] = Counter()
    with model.lock:
        mask = card_mask(model.a, model.models, shape.policy, shape.req)
        for i, name in iter_nodes(model):
            stated = kube.stated.get(name) if shape.req.gpus else None
            if stated is not None and stated < shape.req.gpus:
                why[KUBE_GPU_SHORT] += 1   # however many pods go
                continue
            row = row_copy(model.a, i)
            f = fit(row, shape.req, mask[i:i + 1], shape.policy.tolerates)
            # The cards have room, but kube-scheduler's count of gpu-memory or gpu-core may not:
            # then it preempts there, and judge_node keeps the pods its count needs gone.
            refused = kube.refusal(model, name, shape.req) if f.ok[0] else ""
            if f.ok[0] and not refused:
                options.append(PreemptOption(name, ()))
                continue
            if f.unresolvable[0]:  # wrong model, cards too small or too few: no eviction helps
                why[reason(model.a, i, shape.req, mask, _whole_only(model, name), detail=False,
                       tolerates=shape.policy.tolerates)] += 1
                continue
            pods = {al.uid: al for al in _pods_on(model, name)}
            lower = sorted((u for u in pods if prio.get(u, 0) < priority), key=lambda u: (prio.get(u, 0), u))
            if not lower:
                why[refused or ("no pod of lower priority holds cards here" if pods else
                                reason(model.a, i, shape.req, mask, _whole_only(model, name), detail=False,
                                       tolerates=shape.policy.tolerates))] += 1
                continue
            verdict = judge_node(model, name, shape.req, shape.policy, lower, prio)
            if verdict.victims is None:
                why[f"evicting every lower-priority pod would not free cards for {shape.describe()}"] += 1
                continue
            options.append(PreemptOption(name, tuple(
                Eviction(pods[u].name, u, prio.get(u, 0), tuple(pods[u].cards), _describe_alloc(pods[u]))
                for u in verdict.victims)))
    options.sort(key=lambda o: o.key)
    return PreemptPlan(shape=shape, priority=priority, options=options, no_help=dict(why.most_common()))
