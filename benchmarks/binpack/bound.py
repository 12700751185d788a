"""How low can unallocated % at 100 % arrived go? An offline reference for the share pods.

At 100 % arrived the GPU-milli requested equals the cluster's, so whatever is unallocated is
idle GPU, and on the openb traces it is idle on *shared* cards: whole cards run out first and
every card left holds share pods with a gap no arriving pod fits. How small those gaps can be is
a bin-packing question about the share pods alone. This module answers it offline, with
everything an online policy lacks: it knows all share pods that arrive before 100 % (same
shuffle and inflation as the replay, per seed), packs them largest first (best fit
decreasing, within a few tenths of a percent of optimal for such item mixes) and ignores host
CPU, memory and GPU models altogether. Its waste — the GPU-milli left in the cards the share
pods use — is what even that packer would leave idle, as a % of the cluster's GPUs.

Not a strict lower bound (an online policy may fail some share pods after the whole cards run
out, which changes the set to pack), but a policy near it is close to what packing can give.

``--lp`` answers the sharper question for one policy: given exactly the slices it placed by
100 % arrived (the replay of :mod:`.anatomy`), how few cards could hold them? The configuration
LP of bin packing (:func:`configuration_lp_cards`) bounds every packing of those slices, online
or offline, from below; what the policy leaves idle on its slice cards above that bound is what
better packing of the same slices could still win. Host CPU and memory are ignored (they only
constrain packing more), and a policy that placed other pods (refusing a slice that fits, say)
packs another set, so the bound speaks of the same slices only. It needs scipy (HiGHS).

``python -m benchmarks.binpack.bound [--trace default ...] [--seeds 10] [--lp [--policy stowage]]``
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from packing.registry import PLACERS

from ..entry import run_command
from ..cliargs import HelpFormatter, one_name, parse_seeds
from .replay import SEEDS, arrival_order
from .trace import DEFAULT_TRACE, Nodes, Pods, TraceError, available_traces, data_dir, load_nodes
from .variants import load_trace

CARD = 1000


def best_fit_decreasing_waste(shares: np.ndarray, card: int = CARD) -> int:
    """Idle milli left in the cards used when ``shares`` (each < card) are packed largest first,
    each into the fullest card it still fits (a new card when none fits)."""
    gaps = np.zeros(card + 1, np.int64)          # gaps[g]: cards with exactly g milli free
    for s in np.sort(np.asarray(shares, np.int64))[::-1]:
        fit = np.flatnonzero(gaps[s:])
        g = card if not len(fit) else s + int(fit[0])
        if len(fit):
            gaps[g] -= 1
        gaps[g - s] += 1
    return int((gaps * np.arange(card + 1)).sum())


def share_waste_pct(nodes: Nodes, pods: Pods, seed: int) -> float:
    """Best-fit-decreasing waste (% of the cluster's GPU-milli) of the share pods that arrive
    before the arrived workload reaches 100 % in this seed's replay order."""
    cap = nodes.total_gpu_milli
    order = arrival_order(pods, cap, seed)
    order = order[np.cumsum(pods.milli[order]) <= cap]
    g, m = pods.num_gpu[order], pods.gpu_milli[order]
    shares = m[(g == 1) & (m > 0) & (m < CARD)]
    return 100.0 * best_fit_decreasing_waste(shares) / cap


def _knapsack(sizes: np.ndarray, values: np.ndarray, card: int) -> tuple[float, np.ndarray]:
    """The most value one card can hold (any number of slices of each size, their sum <= card),
    and how many of each size that takes: the pricing step of :func:`configuration_lp_cards`."""
    best = np.zeros(card + 1)
    last = np.full(card + 1, -1, np.int64)       # the size added last at this capacity (-1: none)
    for cap in range(1, card + 1):
        best[cap], last[cap] = best[cap - 1], -1
        fits = np.flatnonzero(sizes <= cap)
        if len(fits):
            cand = best[cap - sizes[fits]] + values[fits]
            i = int(np.argmax(cand))
            if cand[i] > best[cap]:
                best[cap], last[cap] = cand[i], fits[i]
    column = np.zeros(len(sizes))
    cap = card
    while cap > 0:
        i = last[cap]
        if i < 0:
            cap -= 1
        else:
            column[i] += 1
            cap -= int(sizes[i])
    return float(best[card]), column


def configuration_lp_cards(slices: Sequence[int] | np.ndarray, card: int = CARD, max_columns: int = 10_000) -> float:
    """A lower bound on the cards of ``card`` milli any packing of ``slices`` needs: the
    configuration LP of bin packing (Gilmore-Gomory), min sum_c x_c over the card contents c
    ("configurations": how many slices of each size one card holds, their sum <= card) such that
    every size s is covered, sum_c a_sc x_c >= n_s, with x_c >= 0 fractional.

    Column generation: the LP over the configurations found so far (scipy's HiGHS) gives a price
    y_s per size; the configuration worth most at those prices (an unbounded knapsack) is added
    while it is worth more than one card. Returned is the Farley bound sum_s n_s y_s / max(1,
    worth): y / worth is a feasible dual of the full LP, so this is a lower bound even if a solver
    answer is off in its last digits, and equals the LP's optimum once no configuration is worth
    more than one card. ``ValueError`` for a slice outside (0, card]."""
    from scipy.optimize import linprog   # only here: the rest of the benchmarks does not need scipy

    sizes, counts = np.unique(np.asarray(slices, np.int64), return_counts=True)
    if not len(sizes):
        return 0.0
    if sizes[0] <= 0 or sizes[-1] > card:
        raise ValueError(f"slices must be in (0, {card}] milli, got {int(sizes[0])}..{int(sizes[-1])}")
    columns = [np.eye(len(sizes))[i] * (card // s) for i, s in enumerate(sizes)]   # one size per card
    bound = 0.0
    for _ in range(max_columns):
        a = np.array(columns).T
        res = linprog(np.ones(a.shape[1]), A_ub=-a, b_ub=-counts.astype(float), bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"configuration LP: {res.message}")
        prices = np.maximum(-np.asarray(res.ineqlin.marginals, float), 0.0)
        worth, column = _knapsack(sizes, prices, card)
        bound = max(bound, float(counts @ prices) / max(1.0, worth))
        if worth <= 1.0 + 1e-9 or any(np.array_equal(column, c) for c in columns):
            return bound
        columns.append(column)
    raise RuntimeError(f"configuration LP: no optimum after {max_columns} configurations")


def lp_waste_pct(slices: Sequence[int] | np.ndarray, capacity_milli: int, card: int = CARD) -> float:
    """The least idle GPU, % of ``capacity_milli``, that the cards holding ``slices`` can have:
    the configuration LP's cards times ``card`` less the slices' sum."""
    return 100.0 * (configuration_lp_cards(slices, card) * card - float(np.sum(slices))) / capacity_milli


def lp_report(nodes: Nodes, pods: Pods, policy: str, seeds: Sequence[int], progress: bool = True) -> str:
    """Per seed: what ``policy`` leaves idle at 100 % arrived, of it on its slice cards, and the
    LP bound for the same slices; then the medians (one line per seed and a median line)."""
    from ..progress import progress_bar
    from .anatomy import anatomy

    lines, rows = [], []
    for seed in progress_bar(list(seeds), desc=f"{pods.name} {policy}", unit="seed", disable=not progress, leave=False):
        an = anatomy(nodes, pods, policy, seed)
        bound = lp_waste_pct(an.slices, an.capacity_milli)
        rows.append((an.pct(an.idle_milli), an.pct(an.gap_milli), bound))
        lines.append(f"  seed {seed}: {policy} idle {rows[-1][0]:.3f} % (on its slice cards {rows[-1][1]:.3f} %), "
                     f"LP bound for the same {len(an.slices):,} slices {bound:.3f} %")
    med = np.median(np.array(rows), axis=0)
    lines.append(f"{pods.name:<12} at 100 % arrived, median of {len(rows)} seeds: {policy} {med[0]:.3f} % idle, "
                 f"{med[1]:.3f} % on its slice cards; no packing of the same slices leaves less than {med[2]:.3f} %")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.binpack.bound``, apart from ``main`` so that
    tests/test_doc_commands.py can check the documented command lines against it without running them."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.binpack.bound", description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
        epilog="examples:\n"
               "  python -m benchmarks.binpack.bound                          # best fit decreasing, every openb trace\n"
               "  python -m benchmarks.binpack.bound --lp --trace default multigpu40   # the LP bound of Stowage's slices, 10 seeds")
    p.add_argument("--trace", nargs="+", default=None, help="trace names, generated variants (spec25, multigpu40, ...) "
                   "or CSV paths (default: every openb trace file)")
    p.add_argument("--seeds", type=parse_seeds, default=SEEDS, help="10 (= 42..51), 42 (that seed), 42,43 or 42-51 (default: 10)")
    p.add_argument("--data-dir", default=None, help="folder with the openb CSVs")
    p.add_argument("--lp", action="store_true", help="replay --policy to 100 %% arrived per seed and bound the "
                   "idle GPU of the slices it placed with the configuration LP (needs scipy; ~25 s a seed on a 2-core VM)")
    p.add_argument("--policy", type=one_name(PLACERS, "placement policy"), default="stowage", help="the policy whose slices --lp bounds (default: stowage)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.lp:
        try:
            import scipy.optimize  # noqa: F401
        except ImportError:
            print("error: --lp needs scipy (pip install scipy; `make test` installs it)", file=sys.stderr)
            return 2
    directory = data_dir(args.data_dir)
    try:
        nodes = load_nodes(directory)
        traces = args.trace or available_traces(directory) or [DEFAULT_TRACE]
        for t in traces:
            pods = load_trace(t, Path(directory))
            if args.lp:
                print(lp_report(nodes, pods, args.policy, args.seeds, not args.no_progress), flush=True)
                continue
            w = [share_waste_pct(nodes, pods, s) for s in args.seeds]
            print(f"{pods.name:<12} offline share-packing waste at 100 % arrived: median {np.median(w):.2f} %, "
                  f"mean {np.mean(w):.2f} %, seeds {min(w):.2f}..{max(w):.2f} %")
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    run_command(main, "python -m benchmarks.binpack.bound")
