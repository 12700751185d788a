"""Where the idle GPUs are: one policy, one seed, stopped when the arrived workload reaches X %.

The bin-packing table says how much GPU a policy leaves unallocated; this says where it is, so
that a policy change can aim at it (and so that a target can be judged against what the trace
allows). The replay is the benchmark's own (:func:`.replay.replay`, through the extender's
service), stopped at the last pod that keeps the arrived GPU request at or under X % of the
cluster; then every card of the cluster is looked at:

- **gaps on partly used cards**, by gap size, with what the cards of each gap hold (the slice
  sizes, in milli-cards): on openb's default trace most of the idle GPU at 100 % is the
  190-milli gap beside an 810-milli slice, which only the rare slices of <= 190 milli can fill;
- **whole free cards**, split by whether their node still has the host CPU and memory for the
  smallest whole-GPU pod seen (a free card on a node without them is stranded by the host, not
  by the packing);
- the pods that failed before X %, by kind.

``python -m benchmarks.binpack.anatomy --trace default --policy stowage --seed 42``
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stowage.resources import GpuRequest

from packing.registry import PLACERS

from ..entry import run_command
from ..cliargs import HelpFormatter, one_name, positive_number, whole_number
from .replay import INFLATE, arrival_order, build_cluster, replay
from .trace import Nodes, Pods, TraceError, data_dir, load_nodes
from .variants import load_trace

MILLI = 1000


def pod_kind(req: GpuRequest) -> str:
    """``cpu-only``, ``share`` (part of one card) or ``N-gpu`` (N whole cards), as the extender
    reads the pod's request (:meth:`.trace.Pods.request`)."""
    if req.is_shared:
        return "share"
    if req.is_whole:
        return f"{req.gpus}-gpu"
    return "cpu-only"


@dataclass
class GapRow:
    """The partly used cards whose idle share is ``gap`` milli."""

    gap: int
    cards: int
    holds: Counter = field(default_factory=Counter)  # "810" or "470+470": cards holding those slices

    @property
    def milli(self) -> int:
        return self.gap * self.cards


@dataclass
class Anatomy:
    trace: str
    policy: str
    seed: int
    arrived_pct: float
    capacity_milli: int
    idle_milli: int
    gaps: list[GapRow]                 # largest total first
    free_cards_fed: int                # whole free cards whose node has host room for a 1-GPU pod
    free_cards_starved: int            # ... whose node has not
    failed: Counter                    # kind -> pods
    failed_milli: Counter              # kind -> GPU-milli
    # the share pods' slices in place at that point, in milli-cards of their card (input of the
    # configuration-LP bound, :func:`.bound.configuration_lp_cards`)
    slices: list[int] = field(default_factory=list)

    @property
    def gap_milli(self) -> int:
        """Idle milli beside the slices: the gaps on partly used cards."""
        return sum(r.milli for r in self.gaps)

    def pct(self, milli: float) -> float:
        return 100.0 * milli / self.capacity_milli

    def format(self, top: int = 12) -> str:
        gap_milli = self.gap_milli
        free = self.free_cards_fed + self.free_cards_starved
        lines = [f"{self.trace}, {self.policy}, seed {self.seed}, arrived {self.arrived_pct:.1f} %: "
                 f"{self.pct(self.idle_milli):.3f} % of the GPUs idle ({self.idle_milli:,} milli)",
                 f"  gaps on partly used cards: {self.pct(gap_milli):.3f} % ({sum(r.cards for r in self.gaps):,} cards)",
                 "     gap   cards      milli  % of GPUs  the cards hold (most common)"]
        for r in self.gaps[:top]:
            holds = ", ".join(f"{k} ({n})" for k, n in r.holds.most_common(3))
            lines.append(f"    {r.gap:4d} {r.cards:7,d} {r.milli:10,d} {self.pct(r.milli):10.3f}  {holds}")
        rest = self.gaps[top:]
        if rest:
            lines.append(f"    (other gap sizes: {sum(r.cards for r in rest):,} cards, "
                         f"{self.pct(sum(r.milli for r in rest)):.3f} %)")
        lines.append(f"  whole free cards: {self.pct(free * MILLI):.3f} % ({free} cards: {self.free_cards_fed} on nodes "
                     f"with host CPU and memory for the smallest 1-GPU pod seen, {self.free_cards_starved} without)")
        failed = ", ".join(f"{k} {n} ({self.pct(self.failed_milli[k]):.3f} %)" for k, n in sorted(self.failed.items()))
        lines.append(f"  pods failed before this point: {failed or 'none'}")
        return "\n".join(lines)


def anatomy(nodes: Nodes, pods: Pods, policy: str, seed: int, arrived_pct: float = 100.0,
            inflate: float = INFLATE) -> Anatomy:
    """Replay ``policy`` on ``seed`` until the arrived GPU request is at most ``arrived_pct`` %
    of the cluster, then take the idle GPU apart (module doc)."""
    cap = nodes.total_gpu_milli
    order = arrival_order(pods, cap, seed, inflate)
    limit = int(np.searchsorted(np.cumsum(pods.milli[order]), arrived_pct / 100.0 * cap, side="right"))
    model = build_cluster(nodes)
    placements: list = []
    replay(nodes, pods, policy, seed, limit=limit, inflate=inflate, placements=placements, model=model)
    came = order[:limit]   # the pods that arrived, in arrival order
    failed: Counter = Counter()
    failed_milli: Counter = Counter()
    arrived = 0
    for j, placed in zip(came.tolist(), placements):
        arrived += int(pods.milli[j])
        if placed is None:
            kind = pod_kind(pods.request(j))
            failed[kind] += 1
            failed_milli[kind] += int(pods.milli[j])
    # What each card holds: the slices (memory units = milli-cards of a trace card) of share pods.
    holds: dict[tuple[str, int], list[int]] = {}
    for alloc in model.allocations.values():
        if alloc.cards and not alloc.whole:
            for k, mem in zip(alloc.cards, alloc.mem_mib):
                holds.setdefault((alloc.node, int(k)), []).append(int(mem))
    a = model.a
    slices = [s for v in holds.values() for s in v]
    rows: dict[int, GapRow] = {}
    free_fed = free_starved = 0
    seen = came[(pods.num_gpu[came] == 1) & (pods.gpu_milli[came] >= MILLI)]   # 1-GPU pods
    min_cpu = float(pods.cpu_milli[seen].min()) if len(seen) else 0.0
    min_mem = float(pods.memory_mib[seen].min()) if len(seen) else 0.0
    for i, name in enumerate(model.names):
        if name is None:
            continue
        for k in np.flatnonzero(a.exists[i]).tolist():
            free = int(round(a.mem_free[i, k] * MILLI / max(a.mem_total[i, k], 1)))
            if free <= 0:
                continue
            if a.pods[i, k] == 0 and free >= MILLI:
                if a.cpu_free[i] >= min_cpu and a.hmem_free[i] >= min_mem:
                    free_fed += 1
                else:
                    free_starved += 1
                continue
            row = rows.setdefault(free, GapRow(free, 0))
            row.cards += 1
            row.holds["+".join(map(str, sorted(holds.get((name, k), []), reverse=True))) or "?"] += 1
    gaps = sorted(rows.values(), key=lambda r: (-r.milli, r.gap))
    idle = sum(r.milli for r in gaps) + (free_fed + free_starved) * MILLI
    return Anatomy(trace=pods.name, policy=policy, seed=seed, arrived_pct=100.0 * arrived / cap,
                   capacity_milli=cap, idle_milli=idle, gaps=gaps, free_cards_fed=free_fed,
                   free_cards_starved=free_starved, failed=failed, failed_milli=failed_milli, slices=slices)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.binpack.anatomy``, apart from ``main`` so that
    tests/test_doc_commands.py can check the documented command lines against it without running them."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.binpack.anatomy", formatter_class=HelpFormatter, description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default="default", help="trace name, generated variant or CSV path (default: default)")
    p.add_argument("--policy", type=one_name(PLACERS, "placement policy"), default="stowage",
                   help="placer name (default: stowage)")
    p.add_argument("--seed", type=int, default=42, help="seed (default: 42)")
    p.add_argument("--arrived", type=positive_number, default=100.0, help="stop when the arrived GPU request reaches this %% "
                   "of the cluster (default: 100)")
    p.add_argument("--top", type=whole_number(1, 10_000), default=12, help="gap sizes to list (default: 12)")
    p.add_argument("--data-dir", default=None, help="folder with the openb CSVs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        d = data_dir(args.data_dir)
        nodes, pods = load_nodes(d), load_trace(args.trace, Path(d))
    except (TraceError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = anatomy(nodes, pods, args.policy, args.seed, args.arrived)   # the policy: checked while parsing
    print(result.format(args.top))
    return 0


if __name__ == "__main__":
    run_command(main, "python -m benchmarks.binpack.anatomy")
