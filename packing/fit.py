"""Fit and reasons: which nodes can take a pod now, and why each other one cannot. Pure and
vectorised over :class:`packing.model.CardArrays` (all nodes at once, with numpy).

Modelled on kube-scheduler's NodeResourcesFit: what is requested against what is allocatable.
Two steps, each a function:

1. :func:`card_mask` — which cards the pod may use at all (model include/exclude, card size).
2. :func:`fit` — which nodes can host the pod now, and per-node facts for the reasons;
   :func:`reason` — the words for one node that cannot. Its messages are the ``msg_*``
   functions, which a host's vectorised reasons (the extender's) format with too, so the two
   can never word a reason differently.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from stowage.inventory import model_matches
from stowage.resources import GpuRequest, fmt_mib
from stowage.taints import closure_words

from .model import CardArrays
from .pod_policy import PodPolicy


# --------------------------------------------------------------------------- step 1: cards
def allowed_models(models: Sequence[str], policy: PodPolicy) -> np.ndarray:
    """[M] bool over the model table: which models the pod's include/exclude lists allow."""
    ok = np.ones(len(models), bool)
    if policy.models_include:
        ok &= np.array([any(model_matches(p, m) for p in policy.models_include) for m in models], bool)
    if policy.models_exclude:
        ok &= ~np.array([any(model_matches(p, m) for p in policy.models_exclude) for m in models], bool)
    return ok


def card_mask(a: CardArrays, models: Sequence[str], policy: PodPolicy, req: GpuRequest) -> np.ndarray:
    """[N, K] cards this pod may ever use: they exist and pass model and card-size rules."""
    mask = a.exists.copy()
    if policy.models_include or policy.models_exclude:
        mask &= allowed_models(models, policy)[a.model]
    min_mem = max(policy.min_card_mem_mib, req.min_card_mem_mib)
    if min_mem and req.is_whole:
        mask &= a.mem_total >= min_mem
    return mask


# --------------------------------------------------------------------------- step 2: fit
def _as_words(b: np.ndarray) -> np.ndarray:
    """A 2-D bool array as [N, ceil(K/8)] uint64 words (8 cards per word, zero-padded)."""
    n, k = b.shape
    if k % 8:
        padded = np.zeros((n, k + (-k) % 8), bool)
        padded[:, :k] = b
        b = padded
    else:
        b = np.ascontiguousarray(b)
    return b.view(np.uint64)


def row_count(b: np.ndarray) -> np.ndarray:
    """Per-row number of True in a 2-D bool array: ``b.sum(axis=1)``, ~50x faster.

    Why: numpy reduces a short inner axis (8 cards) with per-row overhead, which made these
    sums most of a filter on a 5,000-node cluster; 8 bools are one 64-bit word, and a bool
    byte is 0 or 1, so a popcount per word is the count.
    """
    words = np.bitwise_count(_as_words(b))
    if words.shape[1] == 1:
        return words[:, 0].astype(np.int64)
    return words.sum(axis=1, dtype=np.int64)


def row_any(b: np.ndarray) -> np.ndarray:
    """Per-row any() of a 2-D bool array (``b.any(axis=1)``), on 64-bit words like :func:`row_count`."""
    words = _as_words(b) != 0
    return words[:, 0].copy() if words.shape[1] == 1 else words.any(axis=1)


@dataclass
class Fit:
    """Feasibility of every node for one pod, with what the reasons need."""

    ok: np.ndarray          # [N] node can host the pod now
    usable: np.ndarray      # [N, K] cards that could take the pod now
    unresolvable: np.ndarray  # [N] no preemption could help (cards too small/wrong model/too few)


def open_nodes(a: CardArrays, tolerates: int = 0) -> np.ndarray:
    """[N] nodes open to a pod whose tolerations open the closures ``tolerates``
    (:class:`stowage.taints.NodeClosure` bits, :attr:`PodPolicy.tolerates`): the open nodes, and
    the closed ones all of whose reasons it tolerates (kube-scheduler's NodeUnschedulable and
    TaintToleration filters let such a pod there too)."""
    if not tolerates:
        return a.node_ok
    return a.node_ok | ((a.closed != 0) & ((a.closed & np.uint8(~tolerates & 0xFF)) == 0))


def _opened(closed: int, tolerates: int) -> bool:
    """:func:`open_nodes` of one closed node: it has reasons, and the pod tolerates them all."""
    return closed != 0 and not closed & ~tolerates


def fit(a: CardArrays, req: GpuRequest, allowed: np.ndarray, tolerates: int = 0) -> Fit:
    """Which nodes can take ``req`` now, using only cards in ``allowed`` ([N, K]), on the nodes
    open to it (:func:`open_nodes`)."""
    healthy = allowed & a.healthy
    node_ok = open_nodes(a, tolerates)
    host_ok = (node_ok & (a.cpu_free >= req.cpu_milli) & (a.hmem_free >= req.host_mem_mib)
               & (a.pod_room >= 1))
    if not req.is_gpu:
        # A pod without GPUs needs host room only (any node, with cards or not). ``usable``
        # stays the healthy cards: the placers' fragmentation what-ifs read it as they always have.
        return Fit(ok=host_ok, usable=healthy, unresolvable=~node_ok & ~host_ok)
    if req.is_whole:
        usable = healthy & (a.pods == 0)
        ok = host_ok & (row_count(usable) >= req.gpus)
        unresolvable = row_count(healthy) < req.gpus
    else:
        usable = healthy & (a.mem_free >= req.mem_mib) & (a.core_free >= req.core_milli)
        ok = host_ok & row_any(usable)
        big_enough = healthy & (a.mem_total >= req.mem_mib)
        unresolvable = ~row_any(big_enough)
    unresolvable &= ~ok
    return Fit(ok=ok, usable=usable, unresolvable=unresolvable | (~node_ok & ~ok))


NOT_SCHEDULABLE = "node is not schedulable for GPU pods (unknown to Stowage or cordoned)"
NO_GPUS = "node has no GPUs"
WHOLE_ONLY = ("card memory unknown on this node (no stowage.io/gpu-inventory annotation or GPU Feature "
              "Discovery memory label): only whole-GPU pods can be placed here")


# Every message starts with a word and holds no ", ": kube-scheduler prefixes each reason with the
# count of nodes that gave it and joins them with ", " ("0/1213 nodes are available: 412 no card
# with 20 GiB GPU memory free, 801 Insufficient cpu"). What filter answers (``detail=False``) holds
# no per-node number beyond small counts (free cards, excluded, unhealthy), so equal causes add up
# to one entry: with each node's best card in the text, a failing pod on the openb cluster got
# up to 78 entries of "1 no card with ... best is 130 MiB on card 1" (5 KB in its PodScheduled
# condition, 47 KB before kube-scheduler's own CPU filter), unreadable in `kubectl describe`. The
# detail (``detail=True``: the node's own numbers) is for one node at a time, a bind refused.
def msg_closed(closed: int) -> str:
    """Why a closed node takes no pod, its reasons named (:class:`stowage.taints.NodeClosure`
    bits: "node is cordoned", "node is not Ready"); :data:`NOT_SCHEDULABLE` without a reason."""
    words = closure_words(closed)
    return f"node is {words}" if words else NOT_SCHEDULABLE


def msg_cpu(req: GpuRequest, free: float | None = None) -> str:
    """``free``: the node's free CPU (millicores), said only with ``detail``."""
    if free is None:
        return f"too little CPU free for the {req.cpu_milli}m the pod needs"
    return f"too little CPU free: {max(free, 0):g}m of the {req.cpu_milli}m the pod needs"


def msg_host_memory(req: GpuRequest, free: float | None = None) -> str:
    """``free``: the node's free host memory (MiB), said only with ``detail``."""
    if free is None:
        return f"too little host memory free for the {fmt_mib(req.host_mem_mib)} the pod needs"
    return f"too little host memory free: {fmt_mib(max(free, 0))} of the {fmt_mib(req.host_mem_mib)} the pod needs"


POD_LIMIT = "too many pods: the node's pod limit (allocatable pods) is reached"
FITS = "node has room for the pod"  # only when asked about a node that fits


def msg_tail(excluded: int, unhealthy: int) -> str:
    """What a count of free cards leaves out: `` (2 excluded by model/size policy; 1 unhealthy)``."""
    notes = []
    if excluded:
        notes.append(f"{excluded} excluded by model/size policy")
    if unhealthy:
        notes.append(f"{unhealthy} unhealthy")
    return f" ({'; '.join(notes)})" if notes else ""


def msg_free_cards(free: int, req: GpuRequest, tail: str) -> str:
    """Worded to start with a word and to hold no ", ": kube-scheduler's event prefixes each reason
    with its node count and joins them with ", " ("0/36 nodes are available: 16 too few free
    cards for 1 GPU: 0 free (8 excluded by model/size policy), ...")."""
    return f"too few free cards for {req.gpus} GPU{'s' if req.gpus != 1 else ''}: {free} free{tail}"


def msg_no_usable_card(req: GpuRequest, tail: str) -> str:
    return f"no usable card for {req.describe()}{tail}"


def msg_memory(req: GpuRequest, tail: str, best: tuple[int, int] | None = None) -> str:
    """``best``: (MiB free, card) of the node's best card, said only with ``detail``."""
    head = f"no card with {fmt_mib(req.mem_mib)} GPU memory free"
    return f"{head}: best is {fmt_mib(best[0])} on card {best[1]}{tail}" if best else head + tail


def msg_compute(req: GpuRequest, tail: str, best: tuple[int, int] | None = None) -> str:
    """``best``: (milli free, card) of the node's best card with the memory, said only with ``detail``."""
    head = f"no card with {req.core_milli / 10:g}% compute free and {fmt_mib(req.mem_mib)} memory"
    return f"{head}: best is {best[0] / 10:g}% on card {best[1]}{tail}" if best else head + tail


def reason(a: CardArrays, i: int, req: GpuRequest, allowed: np.ndarray, whole_only: bool = False,
           detail: bool = True, tolerates: int = 0) -> str:
    """Why node i cannot take the pod, in words a person understands. ``whole_only``: the
    node's card memory is unknown (:attr:`packing.model.NodeMeta.whole_only`). ``detail``: say
    this node's own free CPU, memory and best card; filter answers without (``False``), so that
    kube-scheduler's count of nodes per reason adds equal causes up. ``tolerates``: the closures
    the pod's tolerations open (:func:`open_nodes`)."""
    if whole_only and req.is_shared and a.exists[i].any():
        return WHOLE_ONLY
    if not a.node_ok[i] and not (tolerates and _opened(int(a.closed[i]), tolerates)):
        return msg_closed(int(a.closed[i]))
    if req.is_gpu and not a.exists[i].any():
        return NO_GPUS
    if a.cpu_free[i] < req.cpu_milli:
        return msg_cpu(req, a.cpu_free[i] if detail else None)
    if a.hmem_free[i] < req.host_mem_mib:
        return msg_host_memory(req, a.hmem_free[i] if detail else None)
    if a.pod_room[i] < 1:
        return POD_LIMIT
    if not req.is_gpu:
        return FITS
    present = a.exists[i]
    eligible = allowed[i]
    healthy = eligible & a.healthy[i]
    tail = msg_tail(int(present.sum() - eligible.sum()), int((eligible & ~a.healthy[i]).sum()))
    if req.is_whole:
        return msg_free_cards(int((healthy & (a.pods[i] == 0)).sum()), req, tail)
    if not healthy.any():
        return msg_no_usable_card(req, tail)
    mem = np.where(healthy, a.mem_free[i], -1)
    k = int(np.argmax(mem))
    if a.mem_free[i, k] < req.mem_mib:
        return msg_memory(req, tail, (max(int(a.mem_free[i, k]), 0), k) if detail else None)
    core = np.where(healthy & (a.mem_free[i] >= req.mem_mib), a.core_free[i], -1)
    k = int(np.argmax(core))
    return msg_compute(req, tail, (max(int(a.core_free[i, k]), 0), k) if detail else None)
