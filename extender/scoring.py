"""Pure, vectorised fit and scoring over :class:`extender.model.CardArrays`.

Modelled on kube-scheduler's NodeResourcesFit strategies: a strategy is a small pure function
of what is requested and what is allocatable, here evaluated for all candidate nodes at once
with numpy. Nothing in this module does I/O or takes locks: the extender calls it under the
model lock, the benchmark calls it on its simulated cluster, and both get the same answers.

Three steps, each a function:
1. :func:`card_mask` — which cards the pod may use at all (model include/exclude, card size).
2. :func:`fit` — which nodes can host the pod now, and per-node facts for the reasons.
3. a :class:`Placer` — ranks feasible nodes (``score``, higher is better) and picks the cards on
   the chosen node (``choose_cards``). :func:`get_placer` maps policy names to placers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

import numpy as np

from stowage.inventory import model_matches
from stowage.resources import CORE_MILLI_PER_CARD, GpuRequest, fmt_mib

from .model import CardArrays, ClusterModel
from .policy import PACK, PREFER_LOCAL, SPREAD, PodPolicy

MAX_EXTENDER_PRIORITY = 10
RAW_DECIMALS = 9  # raw placer scores are compared to 1e-9 (see to_extender_scores)


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


def fit(a: CardArrays, req: GpuRequest, allowed: np.ndarray) -> Fit:
    """Which nodes can take ``req`` now, using only cards in ``allowed`` ([N, K])."""
    healthy = allowed & a.healthy
    host_ok = a.node_ok & (a.cpu_free >= req.cpu_milli) & (a.hmem_free >= req.host_mem_mib)
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
    return Fit(ok=ok, usable=usable, unresolvable=unresolvable | (~a.node_ok & ~ok))


def reason(a: CardArrays, i: int, req: GpuRequest, allowed: np.ndarray, node_name: str = "") -> str:
    """Why node i cannot take the pod, in words a person understands."""
    if not a.node_ok[i]:
        return NOT_SCHEDULABLE
    if not a.exists[i].any():
        return "node has no GPUs"
    if a.cpu_free[i] < req.cpu_milli:
        return f"{a.cpu_free[i]:g} mCPU free, pod needs {req.cpu_milli}"
    if a.hmem_free[i] < req.host_mem_mib:
        return f"{fmt_mib(a.hmem_free[i])} host memory free, pod needs {fmt_mib(req.host_mem_mib)}"
    present = a.exists[i]
    eligible = allowed[i]
    healthy = eligible & a.healthy[i]
    excluded = int(present.sum() - eligible.sum())
    unhealthy = int((eligible & ~a.healthy[i]).sum())
    notes = []
    if excluded:
        notes.append(f"{excluded} excluded by model/size policy")
    if unhealthy:
        notes.append(f"{unhealthy} unhealthy")
    tail = f" ({', '.join(notes)})" if notes else ""
    if req.is_whole:
        free = int((healthy & (a.pods[i] == 0)).sum())
        return f"{free} free card{'s' if free != 1 else ''}, pod needs {req.gpus}{tail}"
    if not healthy.any():
        return f"no usable card for {req.describe()}{tail}"
    mem = np.where(healthy, a.mem_free[i], -1)
    k = int(np.argmax(mem))
    if a.mem_free[i, k] < req.mem_mib:
        return (f"no card with {fmt_mib(req.mem_mib)} GPU memory free: best is "
                f"{fmt_mib(max(int(a.mem_free[i, k]), 0))} on card {k}{tail}")
    core = np.where(healthy & (a.mem_free[i] >= req.mem_mib), a.core_free[i], -1)
    k = int(np.argmax(core))
    return (f"no card with {req.core_milli / 10:g}% compute free and {fmt_mib(req.mem_mib)} memory: best is "
            f"{max(int(a.core_free[i, k]), 0) / 10:g}% on card {k}{tail}")


NOT_SCHEDULABLE = "node is not schedulable for GPU pods (unknown to Stowage or cordoned)"
SMALL_SETTLE = 128  # reasons(): up to this many rows per branch, distinct keys found with a dict


def reasons(a: CardArrays, rows: np.ndarray, req: GpuRequest, allowed: np.ndarray) -> list[str]:
    """``[reason(a, i, req, allowed) for i in rows]``, computed for all rows at once.

    Why: a filter on a large cluster can fail thousands of nodes (a 4-GPU pod on a half-used
    cluster), and one :func:`reason` per node in Python cost more than the whole rest of the
    request. Each branch's inputs are gathered as arrays, and each distinct message is
    formatted once with the same code as :func:`reason`, so the strings are identical.
    """
    rows = np.asarray(rows, np.int64)
    out = np.empty(len(rows), dtype=object)
    if not len(rows):
        return []
    left = np.ones(len(rows), bool)

    def settle(sel: np.ndarray, keys: list[np.ndarray], fmt: Callable[..., str]) -> None:
        """Rows in ``sel`` get fmt(*key) for their key columns, formatted once per distinct key."""
        nonlocal left
        sel = sel & left
        left = left & ~sel
        pos = np.flatnonzero(sel)
        if not pos.size:
            return
        cols = [np.asarray(k)[pos] for k in keys]
        if not cols:
            out[pos] = fmt()
            return
        keyed = np.stack(cols, axis=1)  # one dtype for all key columns, as np.unique sees them
        if len(pos) <= SMALL_SETTLE:
            # A few rows (those changed since the shape's last pod): a dict beats np.unique's
            # row sort by tens of microseconds; same keys, same texts.
            memo: dict[tuple, str] = {}
            texts_list = []
            for key in keyed.tolist():
                t = tuple(key)
                text = memo.get(t)
                if text is None:
                    text = memo[t] = fmt(*key)
                texts_list.append(text)
            texts = np.empty(len(pos), dtype=object)
            texts[:] = texts_list
            out[pos] = texts
            return
        uniq, inverse = np.unique(keyed, axis=0, return_inverse=True)
        texts = np.empty(len(uniq), dtype=object)
        texts[:] = [fmt(*u) for u in uniq.tolist()]
        out[pos] = texts[inverse.ravel()]

    node_ok = a.node_ok[rows]
    present = a.exists[rows]
    cpu, hmem = a.cpu_free[rows], a.hmem_free[rows]
    settle(~node_ok, [], lambda: NOT_SCHEDULABLE)
    settle(~row_any(present), [], lambda: "node has no GPUs")
    settle(cpu < req.cpu_milli, [cpu], lambda c: f"{c:g} mCPU free, pod needs {req.cpu_milli}")
    settle(hmem < req.host_mem_mib, [hmem],
           lambda h: f"{fmt_mib(h)} host memory free, pod needs {fmt_mib(req.host_mem_mib)}")
    if not left.any():
        return out.tolist()
    eligible = allowed[rows]
    card_ok = a.healthy[rows]
    healthy = eligible & card_ok
    excluded = row_count(present) - row_count(eligible)
    unhealthy = row_count(eligible & ~card_ok)

    def tail(excl: int, unh: int) -> str:
        notes = []
        if excl:
            notes.append(f"{excl} excluded by model/size policy")
        if unh:
            notes.append(f"{unh} unhealthy")
        return f" ({', '.join(notes)})" if notes else ""

    if req.is_whole:
        free = row_count(healthy & (a.pods[rows] == 0))
        settle(left, [free, excluded, unhealthy],
               lambda f, e, u: f"{f} free card{'s' if f != 1 else ''}, pod needs {req.gpus}{tail(e, u)}")
        return out.tolist()
    settle(~row_any(healthy), [excluded, unhealthy],
           lambda e, u: f"no usable card for {req.describe()}{tail(e, u)}")
    if not left.any():
        return out.tolist()
    r = np.arange(len(rows))
    mem_free = a.mem_free[rows]
    k_mem = np.argmax(np.where(healthy, mem_free, -1), axis=1)
    best_mem = mem_free[r, k_mem]
    settle(best_mem < req.mem_mib, [k_mem, np.maximum(best_mem, 0), excluded, unhealthy],
           lambda k, m, e, u: (f"no card with {fmt_mib(req.mem_mib)} GPU memory free: best is "
                               f"{fmt_mib(m)} on card {k}{tail(e, u)}"))
    core_free = a.core_free[rows]
    k_core = np.argmax(np.where(healthy & (mem_free >= req.mem_mib), core_free, -1), axis=1)
    best_core = np.maximum(core_free[r, k_core], 0)
    settle(left, [k_core, best_core, excluded, unhealthy],
           lambda k, c, e, u: (f"no card with {req.core_milli / 10:g}% compute free and {fmt_mib(req.mem_mib)} "
                               f"memory: best is {c / 10:g}% on card {k}{tail(e, u)}"))
    return out.tolist()


# --------------------------------------------------------------------------- step 3: placers
class Placer(Protocol):
    """A placement policy: ranks nodes and chooses cards. May learn from the pods it sees."""

    name: str

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        """Raw scores for the feasible nodes ``idx`` (higher is better)."""

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        """Card slots on node i for this pod (len == req.gpus, or 1 for a shared pod)."""

    def observe(self, req: GpuRequest) -> None:
        """A pod of this shape arrived (lets a policy learn the workload mix online)."""


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


@dataclass
class SimplePlacer:
    """A placer made of a node-scoring strategy function and the default card choice."""

    name: str
    strategy: Callable[[CardArrays, GpuRequest, np.ndarray, np.ndarray], np.ndarray]
    # No learned state: a strategy scores each node from its own row, so the extender caches
    # scores per row (extender/rowcache.py). A placer without ``version`` is never cached.
    version = 0

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        return self.strategy(a, req, idx, usable)

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        return choose_cards_default(a, i, req, usable_row, policy)

    def observe(self, req: GpuRequest) -> None:
        return None


def _request_milli(req: GpuRequest, a: CardArrays, idx: np.ndarray) -> np.ndarray:
    if req.is_whole:
        return np.full(len(idx), req.gpus * CORE_MILLI_PER_CARD, float)
    share = req.core_milli
    tot = a.mem_total[idx].max(axis=1).astype(float)
    mem_share = np.where(tot > 0, req.mem_mib * CORE_MILLI_PER_CARD / np.maximum(tot, 1), 0)
    return np.maximum(mem_share, share)


def most_allocated(a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """kube-scheduler MostAllocated on nvidia.com/gpu: (allocated + requested) / allocatable."""
    used, cap = gpu_utilisation(a, idx)
    return (used + _request_milli(req, a, idx)) / np.maximum(cap, 1)


def least_allocated(a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """kube-scheduler LeastAllocated (default spread): (allocatable - allocated - requested) / allocatable."""
    used, cap = gpu_utilisation(a, idx)
    return (cap - used - _request_milli(req, a, idx)) / np.maximum(cap, 1)


PLACERS: dict[str, Callable[[], Placer]] = {
    "most-allocated": lambda: SimplePlacer("most-allocated", most_allocated),
    "least-allocated": lambda: SimplePlacer("least-allocated", least_allocated),
}
# Which placer serves each node-level policy value; "pack" is Stowage's own default policy.
POLICY_PLACER: dict[str, str] = {PACK: "most-allocated", SPREAD: "least-allocated"}


def attach_placer(placer: Placer, model: ClusterModel, *, seed: int | None = None,
                  workload: Iterable[tuple[GpuRequest, Sequence[str]]] | None = None) -> Placer:
    """Connect a placer to the cluster model it will serve, as every user of placers must
    (the benchmarks, `stowage plan`): its tie-break seed, the model's GPU model names, the
    model's count of GPU pods released (churn mode), and — only for a reference placer that
    is defined as knowing its workload up front (the paper's FGD) — that workload. Optional
    hooks: a placer without one simply does not need it."""
    if seed is not None and hasattr(placer, "reseed"):
        placer.reseed(seed)
    if hasattr(placer, "bind_models"):
        placer.bind_models(model.models)
    if hasattr(placer, "watch_releases"):
        placer.watch_releases(lambda: model.gpu_releases)
    if workload is not None and getattr(placer, "knows_workload", False):
        placer.prime(workload)
    return placer


def placer_for(policy_value: str) -> Placer:
    """The placer serving a node-level policy value ("pack" or "spread")."""
    _load_policies()
    return get_placer(POLICY_PLACER[policy_value])


def register_placer(name: str, factory: Callable[[], Placer], *, as_pack_default: bool = False) -> None:
    """Add a placer by name (used by policy modules); optionally make it what 'pack' means."""
    PLACERS[name] = factory
    if as_pack_default:
        POLICY_PLACER[PACK] = name


_POLICIES_LOADED = False


def _load_policies() -> None:
    """Import the policy modules (FGD, Stowage's own, ...) that register themselves here."""
    global _POLICIES_LOADED
    if not _POLICIES_LOADED:
        _POLICIES_LOADED = True
        try:
            import extender.policies  # noqa: F401  (registers placers)
        except ModuleNotFoundError as exc:
            if exc.name != "extender.policies":
                raise


def get_placer(name: str) -> Placer:
    """A fresh placer by name ("most-allocated", "least-allocated", ...; see PLACERS)."""
    _load_policies()
    try:
        return PLACERS[name]()
    except KeyError:
        raise KeyError(f"unknown placement policy {name!r} (known: {', '.join(sorted(PLACERS))})") from None


def to_extender_scores(raw: np.ndarray) -> np.ndarray:
    """Map raw scores (higher better) to kube-scheduler's 0..MaxExtenderPriority integers.

    By dense rank from the top: the best raw score gets 10, the next distinct one 9, ... the
    tenth 1, the rest 0; equal raw scores get equal integers. Why not min-max: placers score in
    tiers (Stowage's churn mode puts a 1e5 cost on opening an empty node; fragmentation deltas
    are tiny beside it), and a linear stretch would round every node of the top tier to 10,
    losing the order the placer chose. Rank keeps the placer's best node strictly first, which
    is what kube-scheduler needs from us (it adds our score x weight to its own).
    """
    # Raw scores equal up to float noise are equal: the fragmentation placers' sums come out a
    # last bit different depending on which other nodes were evaluated in the same call (numpy
    # sums short axes in a shape-dependent order), and a per-node cache must not change answers.
    raw = np.round(np.nan_to_num(np.asarray(raw, float), nan=-np.inf), RAW_DECIMALS)
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
