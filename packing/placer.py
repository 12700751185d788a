"""The placer protocol: what a placement policy must do, and every optional hook it may have.

A placer ranks the nodes that fit a pod (:meth:`Placer.score`, higher is better) and picks the
card(s) on the chosen node (:meth:`Placer.choose_cards`). It may learn from the pods it sees
(:meth:`Placer.observe`). Everything else is optional and declared here, with a default that
does nothing, so callers call hooks instead of probing for them:

- ``version``: None when a node's score is not a function of the node's row and the placer's
  learned state (``random`` draws from a stream); otherwise a value that changes whenever the
  learned state changes scores. Hosts may cache per-row scores of a placer with a version.
- ``knows_workload`` / :meth:`prime`: a reference placer defined as knowing its workload up
  front (the paper's FGD) is given it; others ignore it.
- :meth:`reseed`, :meth:`bind_models`, :meth:`watch_releases`: the tie-break seed, the model's
  GPU model names, the model's count of GPU pods released (churn mode).
- :meth:`learning_in_bulk`: many observations follow before any score (a restart's learned
  past); a placer may defer what they make it rebuild to the end.
- :meth:`track_rows`: the owner's per-row change counters, for placers with an incremental index.
- ``split_pairs`` / :meth:`local_pairs` + :meth:`global_pairs`: a share pod's node score is the
  max over the node's usable cards of a row-local pair score plus a cluster-wide term; hosts
  may cache the local part. ``keyed_pairs`` / :meth:`pair_keys` + :meth:`global_of_keys`: the
  cluster-wide term from row-local per-pair keys.

Also here: the card choice the simple placers share (NVLink/NUMA locality for whole-GPU pods,
best or worst fit for shares) and :func:`attach_placer`. Pure: no I/O.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Iterable, Protocol, Sequence

import numpy as np

from stowage.resources import CORE_MILLI_PER_CARD, GpuRequest

from .model import CardArrays, ClusterModel
from .pod_policy import PACK, PREFER_LOCAL, SPREAD, PodPolicy

RowGenOf = Callable[[CardArrays], "np.ndarray | None"]
RowGroupsOf = Callable[[CardArrays], "tuple[np.ndarray, np.ndarray] | None"]
RowTickOf = Callable[[CardArrays], "int | None"]


class Placer(Protocol):
    """A placement policy: ranks nodes and chooses cards. May learn from the pods it sees."""

    name: str
    version: Any
    knows_workload: bool
    split_pairs: bool
    keyed_pairs: bool

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        """Raw scores for the feasible nodes ``idx`` (higher is better)."""

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        """Card slots on node i for this pod (len == req.gpus, or 1 for a shared pod)."""

    def observe(self, req: GpuRequest, models: Sequence[str] = (), count: int = 1) -> None:
        """A pod of this shape arrived (lets a policy learn the workload mix online).
        ``models``: the GPU models it may run on (its ``models_include`` patterns; empty =
        any), so a policy can learn which classes are tied to which models. ``count``: that
        many pods of the shape at once (a restarted extender learning the departed pods its
        predecessor kept, extender/learned_past.py), the same as ``count`` single calls except
        that learned tables are rebuilt at most once."""

    def reseed(self, seed: int) -> None: ...
    def learning_in_bulk(self) -> ContextManager[None]: ...
    def bind_models(self, models: Sequence[str]) -> None: ...
    def watch_releases(self, count: Callable[[], int]) -> None: ...
    def note_release(self) -> None: ...
    def prime(self, workload: Iterable[tuple[GpuRequest, Sequence[str]]]) -> None: ...
    def track_rows(self, row_gen_of: RowGenOf, row_groups_of: RowGroupsOf | None = None,
                   row_tick_of: RowTickOf | None = None) -> None: ...
    def local_pairs(self, a: CardArrays, req: GpuRequest, idx: np.ndarray,
                    usable: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def global_pairs(self, a: CardArrays, req: GpuRequest, ii: np.ndarray, kk: np.ndarray) -> np.ndarray: ...
    def pair_keys(self, a: CardArrays, req: GpuRequest, ii: np.ndarray, kk: np.ndarray) -> np.ndarray: ...
    def global_of_keys(self, a: CardArrays, req: GpuRequest, keys: np.ndarray) -> np.ndarray: ...

    def table_bound(self) -> str | None:
        """What a size bound of the learned state merged, in words (for the host to log), or None."""


class PlacerBase:
    """Defaults for every optional hook of :class:`Placer`: a placer with no learned state,
    whose scores depend on the node's row alone (``version = 0``), that needs no seed, model
    names, release count, workload or row tracking. Subclasses override what they use."""

    name = "base"
    version: Any = 0
    knows_workload = False
    split_pairs = False
    keyed_pairs = False

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        return choose_cards_default(a, i, req, usable_row, policy)

    def observe(self, req: GpuRequest, models: Sequence[str] = (), count: int = 1) -> None:
        return None

    def reseed(self, seed: int) -> None:
        return None

    def learning_in_bulk(self) -> ContextManager[None]:
        """Many observations follow and nothing scores until they end: a placer may defer work
        they make (a learned table rebuilt), as long as the end leaves what one at a time would."""
        return nullcontext()

    def bind_models(self, models: Sequence[str]) -> None:
        return None

    def watch_releases(self, count: Callable[[], int]) -> None:
        return None

    def note_release(self) -> None:
        """A GPU pod left the cluster (where no release count is watched, or before it was)."""
        return None

    def prime(self, workload: Iterable[tuple[GpuRequest, Sequence[str]]]) -> None:
        return None

    def track_rows(self, row_gen_of: RowGenOf, row_groups_of: RowGroupsOf | None = None,
                   row_tick_of: RowTickOf | None = None) -> None:
        return None

    def local_pairs(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray):
        raise NotImplementedError(f"placer {self.name} does not split its pair scores")

    def global_pairs(self, a: CardArrays, req: GpuRequest, ii: np.ndarray, kk: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"placer {self.name} does not split its pair scores")

    def pair_keys(self, a: CardArrays, req: GpuRequest, ii: np.ndarray, kk: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"placer {self.name} has no pair keys")

    def global_of_keys(self, a: CardArrays, req: GpuRequest, keys: np.ndarray) -> np.ndarray:
        raise NotImplementedError(f"placer {self.name} has no pair keys")

    def table_bound(self) -> str | None:
        return None


Strategy = Callable[[CardArrays, GpuRequest, np.ndarray, np.ndarray], np.ndarray]


class SimplePlacer(PlacerBase):
    """A placer made of a node-scoring strategy function (one file each under
    ``packing/strategies/``) and the default card choice. No learned state: a strategy scores
    each node from its own row, so hosts may cache its scores per row (``version = 0``)."""

    def __init__(self, name: str, strategy: Strategy) -> None:
        self.name = name
        self.strategy = strategy

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        return self.strategy(a, req, idx, usable)


def attach_placer(placer: Placer, model: ClusterModel, *, seed: int | None = None,
                  workload: Iterable[tuple[GpuRequest, Sequence[str]]] | None = None) -> Placer:
    """Connect a placer to the cluster model it will serve, as every user of placers must
    (the benchmarks, `stowage plan`): its tie-break seed, the model's GPU model names, the
    model's count of GPU pods released (churn mode), and — only for a reference placer that
    is defined as knowing its workload up front (the paper's FGD) — that workload."""
    if seed is not None:
        placer.reseed(seed)
    placer.bind_models(model.models)
    placer.watch_releases(lambda: model.gpu_releases)
    if workload is not None and placer.knows_workload:
        placer.prime(workload)
    return placer


# --------------------------------------------------------------------------- shared card choice
def first_free_cards(a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray) -> list[int]:
    """Whole-GPU pods in the FGD paper's simulator take the lowest-index free cards."""
    return [int(k) for k in np.flatnonzero(usable_row)[: req.gpus]]


def choose_cards_default(a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                         policy: PodPolicy) -> list[int]:
    """Card choice shared by the simple placers.

    Whole-GPU pods: the free cards that keep the pod inside one NVLink/NUMA domain when the
    policy prefers locality, packing onto the domain with the fewest free cards (pack) or the
    most (spread). Shared pods: the usable card with the least free memory (pack, best fit) or
    the most (spread).
    """
    cand = np.flatnonzero(usable_row)
    if req.is_whole:
        return choose_whole_cards(a, i, req.gpus, cand, policy)
    free = a.mem_free[i, cand] * CORE_MILLI_PER_CARD + a.core_free[i, cand]
    # Cards already shared come first when packing: keeps empty cards whole for whole-GPU pods.
    shared_first = np.where(a.pods[i, cand] > 0, 0, 1)
    if policy.card == SPREAD:
        order = np.lexsort((cand, -free))
    else:
        order = np.lexsort((cand, free, shared_first))
    return [int(cand[order[0]])]


def choose_whole_cards(a: CardArrays, i: int, n: int, cand: np.ndarray, policy: PodPolicy) -> list[int]:
    """n free cards on node i, preferring one NVLink clique / NUMA node when asked to."""
    cand = [int(k) for k in cand]
    if n >= len(cand):
        return cand[:n]
    if policy.topology != PREFER_LOCAL or n == 1:
        if n == 1 and policy.card == PACK:
            # Take the card whose NUMA domain has the fewest free cards: keeps big domains whole.
            numa = a.numa[i]
            counts = {d: sum(1 for k in cand if numa[k] == d) for d in set(int(numa[k]) for k in cand)}
            return [min(cand, key=lambda k: (counts[int(numa[k])], k))]
        return cand[:n]
    return _local_group(a, i, n, cand, policy)


def _local_group(a: CardArrays, i: int, n: int, cand: list[int], policy: PodPolicy) -> list[int]:
    """Greedy: grow a set from each seed card, adding the card with most NVLinks into the set
    (then same NUMA); keep the set with most links, tie-broken by the smallest leftover domain."""
    link = a.nvlink[i]
    numa = a.numa[i]
    best: tuple | None = None
    for seed in cand:
        group = [seed]
        rest = [k for k in cand if k != seed]
        while len(group) < n:
            k = max(rest, key=lambda c: (int(link[c, group].sum()), sum(numa[c] == numa[g] >= 0 for g in group), -c))
            group.append(k)
            rest.remove(k)
        links = int(link[np.ix_(group, group)].sum())
        same_numa = int(sum(numa[g] == numa[group[0]] >= 0 for g in group))
        key = (links, same_numa, -sum(group))
        if best is None or key > best[0]:
            best = (key, sorted(group))
    return best[1] if best else cand[:n]


def segment_max(values: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """[n] max of values per row id (rows sorted ascending, every row present): a node's score
    from its (node, card) pair scores."""
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    out = np.full(n, -np.inf)
    out[rows[starts]] = np.maximum.reduceat(values, starts)
    return out


def gpu_utilisation(a: CardArrays, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(allocated, capacity) in milli-cards per node in ``idx``: the ``nvidia.com/gpu`` view."""
    ex = a.exists[idx] & a.healthy[idx]
    cap = ex.sum(axis=1) * CORE_MILLI_PER_CARD
    with np.errstate(divide="ignore", invalid="ignore"):
        mem_used = np.where(a.mem_total[idx] > 0,
                            (a.mem_total[idx] - a.mem_free[idx]) * CORE_MILLI_PER_CARD / np.maximum(a.mem_total[idx], 1), 0)
    core_used = CORE_MILLI_PER_CARD - a.core_free[idx]
    used_card = np.maximum(mem_used, core_used)
    used_card = np.where(a.pods[idx] > 0, np.maximum(used_card, 1), 0)
    return (used_card * ex).sum(axis=1), cap


def request_milli(req: GpuRequest, a: CardArrays, idx: np.ndarray) -> np.ndarray:
    """[n] milli-cards the pod adds on each node in ``idx`` (a share: the larger of its compute
    and its memory as a part of the node's biggest card)."""
    if req.is_whole:
        return np.full(len(idx), req.gpus * CORE_MILLI_PER_CARD, float)
    share = req.core_milli
    tot = a.mem_total[idx].max(axis=1).astype(float)
    mem_share = np.where(tot > 0, req.mem_mib * CORE_MILLI_PER_CARD / np.maximum(tot, 1), 0)
    return np.maximum(mem_share, share)
