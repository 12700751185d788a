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

``python -m benchmarks.binpack.bound [--trace default ...] [--seeds 10]``
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .replay import SEEDS, arrival_order
from .trace import DEFAULT_TRACE, Nodes, Pods, TraceError, available_traces, data_dir, load_nodes, load_pods

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.binpack.bound", description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", nargs="+", default=None, help="trace names or CSV paths (default: every trace)")
    p.add_argument("--seeds", type=int, default=len(SEEDS), help="number of seeds from 42")
    p.add_argument("--data-dir", default=None, help="folder with the openb CSVs")
    args = p.parse_args(argv)
    directory = data_dir(args.data_dir)
    try:
        nodes = load_nodes(directory)
        traces = args.trace or available_traces(directory) or [DEFAULT_TRACE]
        for t in traces:
            pods = load_pods(t, directory)
            w = [share_waste_pct(nodes, pods, s) for s in range(42, 42 + args.seeds)]
            print(f"{pods.name:<12} offline share-packing waste at 100 % arrived: median {np.median(w):.2f} %, "
                  f"mean {np.mean(w):.2f} %, seeds {min(w):.2f}..{max(w):.2f} %")
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
