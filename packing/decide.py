"""Deciding one pod: the one place where a pod's node and cards are chosen.

The extender's verbs are the three steps below (filter, prioritize and bind, asked for over
HTTP one at a time); ``stowage plan``, the bin-packing replay and the elastic simulation reach
them only through the extender's service (:mod:`extender.placing`), so a figure from a
benchmark or a plan is a figure for what the extender does. :func:`decide` is the three steps
at once, for tests of the core:

1. :func:`feasible` — the pod's card mask and fit: which nodes can take it now
   (:mod:`packing.fit`; the nodes that cannot get a :func:`packing.fit.reason`);
2. :func:`score` — the placer ranks the feasible nodes (:mod:`packing.strategies`); for
   kube-scheduler the raw scores become 0..10 by rank (:func:`to_extender_scores`), and the
   best is chosen by the one rule (:func:`best_node`), on raw scores or on those 0..10;
3. :func:`choose_cards` — the placer picks the card(s) on the chosen node.

The caller books the result (``ClusterModel.assign``, or :func:`packing.model.book` on a copy of
the arrays). The placer observes each pod once, before it is scored, wherever it is decided.
Pure: no I/O, no caches.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from stowage.resources import GpuRequest

from .fit import Fit, card_mask, fit
from .model import CardArrays
from .placer import Placer
from .pod_policy import PodPolicy

MAX_EXTENDER_PRIORITY = 10
RAW_DECIMALS = 9  # raw placer scores are compared to 1e-9 (see to_extender_scores)


def feasible(a: CardArrays, models: Sequence[str], req: GpuRequest, policy: PodPolicy,
             mask: np.ndarray | None = None) -> tuple[np.ndarray, Fit]:
    """Step 1: (the pod's card mask, its fit over every node). ``mask`` when the caller kept it
    (it depends only on the cards' existence, model and size)."""
    if mask is None:
        mask = card_mask(a, models, policy, req)
    return mask, fit(a, req, mask, policy.tolerates)


def score(placer: Placer, a: CardArrays, req: GpuRequest, rows: np.ndarray, f: Fit) -> np.ndarray:
    """Step 2: the placer's raw scores of the feasible nodes ``rows`` (higher is better)."""
    return np.asarray(placer.score(a, req, rows, f.usable), float)


def comparable(scores: np.ndarray) -> np.ndarray:
    """Scores as they are compared, everywhere a node is chosen: rounded to 1e-9
    (:data:`RAW_DECIMALS`), NaN as the worst. Raw scores equal up to float noise are equal: the
    fragmentation placers' sums come out a last bit different depending on which other nodes
    were evaluated in the same call (numpy sums short axes in a shape-dependent order), and a
    per-node cache must not change answers. Integers (prioritize's 0..10) pass unchanged."""
    return np.round(np.nan_to_num(np.asarray(scores, float), nan=-np.inf), RAW_DECIMALS)


def best_node(scores: np.ndarray, rows: np.ndarray, tie: np.ndarray | None = None) -> int:
    """The ONE choice rule: the best-scoring node of ``rows`` (scores compared as
    :func:`comparable`, to 1e-9, as prioritize ranks them); among equal scores the one with the
    lowest ``tie`` (a fixed random order, as kube-scheduler's random pick among equal nodes), or
    without ``tie`` the lowest slot, which keeps answers reproducible.

    Used on raw scores by :func:`decide` and on prioritize's 0..10 by
    :func:`extender.placing.schedule` (the benchmarks and ``stowage plan``): the top 10 is
    exactly the set of nodes whose raw scores are best to 1e-9, so both choose the same node."""
    s = comparable(scores)
    rows = np.asarray(rows)
    cand = rows[s == s.max()]
    if tie is not None and len(cand) > 1:
        return int(cand[np.argmin(tie[cand])])
    return int(cand.min())


def choose_cards(placer: Placer, a: CardArrays, i: int, req: GpuRequest, f: Fit, policy: PodPolicy,
                 row: int | None = None) -> list[int]:
    """Step 3: the card slots on node ``i`` (``row``: the node's row in ``f`` when ``f`` was
    computed for that node alone)."""
    usable = f.usable[i if row is None else row]
    return [int(k) for k in placer.choose_cards(a, i, req, usable, policy)]


def decide(a: CardArrays, models: Sequence[str], req: GpuRequest, policy: PodPolicy, placer: Placer, *,
           mask: np.ndarray | None = None, tie: np.ndarray | None = None) -> tuple[int, list[int]] | None:
    """Where this pod goes now: (node slot, card slots), or None when no node can take it.
    The three steps at once, for callers that decide a pod in one go (not over HTTP)."""
    _, f = feasible(a, models, req, policy, mask)
    rows = np.flatnonzero(f.ok)
    if not rows.size:
        return None
    i = best_node(score(placer, a, req, rows, f), rows, tie)
    return i, choose_cards(placer, a, i, req, f, policy)


def best_mask(raw: np.ndarray) -> np.ndarray:
    """[n] bool: the raw scores that are the best to 1e-9 (compared as :func:`comparable`), i.e.
    exactly those :func:`to_extender_scores` maps to 10 and among which :func:`best_node`
    chooses; without ranking the others (the filter that answers only the best needs no more)."""
    s = comparable(raw)
    return s == s.max() if s.size else np.zeros(0, bool)


def to_extender_scores(raw: np.ndarray) -> np.ndarray:
    """Map raw scores (higher better) to kube-scheduler's 0..MaxExtenderPriority integers.

    By dense rank from the top: the best raw score gets 10, the next distinct one 9, ... the
    tenth 1, the rest 0; equal raw scores get equal integers. Why not min-max: placers score in
    tiers (Stowage's churn mode puts a 1e5 cost on opening an empty node; fragmentation deltas
    are tiny beside it), and a linear stretch would round every node of the top tier to 10,
    losing the order the placer chose. Rank keeps the placer's best node strictly first, which
    is what kube-scheduler needs from us (it adds our score x weight to its own).
    """
    # Raw scores equal up to float noise are equal (see comparable): the same rule as best_node.
    raw = comparable(raw)
    n = raw.size
    if n == 0:
        return np.zeros(0, np.int64)
    levels = MAX_EXTENDER_PRIORITY + 1
    neg = -raw
    # The `levels` best distinct values, without sorting all n (prioritize sees thousands of nodes).
    k = min(n, 4 * levels)
    top = np.unique(np.partition(neg, k - 1)[:k] if k < n else neg)
    if top.size < levels and k < n:
        top = np.unique(neg)
    top = top[:levels]
    rank = np.searchsorted(top, neg)  # dense rank among the top values; >= levels below them
    return np.maximum(MAX_EXTENDER_PRIORITY - rank, 0).astype(np.int64)
