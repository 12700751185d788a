"""``python -m benchmarks.elastic``: HPA-scaled GPU deployments on the openb trace's real
creation/deletion times, under every placement policy side by side.

Reports per policy: scale-outs that found room at once vs stayed Pending, time-to-place of
new replicas (Pending ones are retried every HPA sync), and the GPU-node-hours a cluster
autoscaler could have released because nodes stood empty.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from functools import lru_cache
from pathlib import Path

from benchmarks.binpack.cli import subset
from benchmarks.binpack.trace import DEFAULT_TRACE, REPO_ROOT, TraceError, data_dir, load_nodes, trace_name
from benchmarks.binpack.variants import load_trace
from benchmarks.cliargs import MAX_JOBS, MAX_NODES, CheckedParser, HelpFormatter, name_list, number_at_least, parse_seeds, positive_number, whole_number
from benchmarks.entry import worker_pool
from benchmarks.progress import progress_bar
from packing.registry import PLACERS, POLICY_PLACER

from .report import format_table, write_outputs
from .sim import HpaSettings, run
from .workload import build, load_times

QUICK = {"days": 1.0, "node_stride": 20}


def default_policies() -> list[str]:
    """The two kube-scheduler strategies and every registered placer, Stowage's pack default first."""
    pack = POLICY_PLACER["pack"]
    return [pack] + sorted(n for n in PLACERS if n != pack)


def _shape(req) -> str:
    """Trace cards are 1000 units, so a share is a percentage of one GPU (memory and compute)."""
    return req.describe() if req.is_whole else f"{req.core_milli / 10:g}% of one GPU"


def settle_quick(args: argparse.Namespace) -> argparse.Namespace:
    """``--quick``: at most a day's window on at most every 20th node (what the user gave stands
    when it is smaller)."""
    if args.quick:
        args.days, args.node_stride = min(args.days, QUICK["days"]), max(args.node_stride, QUICK["node_stride"])
    return args


def _restart(args: argparse.Namespace) -> str | None:
    """``--restart-at`` inside the window that will run (``--quick`` shortens it), and
    ``--restart-lose-past`` only with it: refused while parsing, before the scenario is built."""
    if args.restart_at is not None:
        days = settle_quick(argparse.Namespace(**vars(args))).days
        if not 0 < args.restart_at < days:
            return f"--restart-at must lie inside the window (0 to {days:g} days)"
    elif args.restart_lose_past:
        return "--restart-lose-past needs --restart-at"
    return None


def build_parser() -> argparse.ArgumentParser:
    p = CheckedParser(prog="python -m benchmarks.elastic", description=__doc__,
                      formatter_class=HelpFormatter, checks=[_restart])
    p.add_argument("--trace", default=DEFAULT_TRACE,
                   help="trace name (default, gpushare40, gpuspec10, cpu100), a generated variant (spec33, "
                        "multigpu40: the default pods' times, benchmarks/binpack/variants.py) or CSV path")
    p.add_argument("--data-dir", default=None, help="folder with the openb CSVs (default ../shared/openb, or $STOWAGE_OPENB)")
    p.add_argument("--policies", type=name_list(PLACERS, "policy"), default=None, help="comma-separated placer names (default: all registered)")
    p.add_argument("--seeds", type=parse_seeds, default="42", help="seeds (tie-break order, fractional copies): 42 (that seed), 42,43, 42-44 or a count (3 = 42..44)")
    p.add_argument("--days", type=positive_number, default=14.0, help="length of the window, ending at the trace's end")
    p.add_argument("--step", type=whole_number(1, 86_400), default=60, help="seconds between HPA syncs / scheduling rounds")
    p.add_argument("--deployments", type=whole_number(1, 10_000), default=8, help="single-GPU shapes turned into HPA deployments")
    p.add_argument("--peak", type=positive_number, default=1.0, help="peak GPU demand as a fraction of the cluster's GPUs")
    p.add_argument("--node-stride", type=whole_number(1, MAX_NODES), default=10, help="use every N-th trace node (the trace ran at ~1%% load)")
    p.add_argument("--target", type=positive_number, default=60.0, help="HPA target: average GPU utilisation per replica, %%")
    p.add_argument("--tolerance", type=number_at_least(0), default=0.1, help="HPA tolerance")
    p.add_argument("--window", type=number_at_least(0), default=300.0, help="HPA scale-down stabilisation window, s")
    p.add_argument("--metric-window", type=number_at_least(0), default=120.0,
                   help="seconds the HPA's metric is averaged over (the shipped adapter rule: 120); 0: the "
                        "instant load")
    p.add_argument("--learn-before", action="store_true",
                   help="the extender ran before the window: it learned every trace pod that came and went "
                        "before it (the past only), as a long-running extender's watch would have; default: "
                        "it starts with the window, knowing only the pods that exist then")
    p.add_argument("--restart-at", type=number_at_least(0), default=None, metavar="DAY",
                   help="restart the extender this many days into the window (a rollout replacing every "
                        "replica): the new one reads the departed pods' past the old one kept "
                        "(--learned-configmap) and learns the pods that exist")
    p.add_argument("--restart-lose-past", action="store_true",
                   help="with --restart-at: the new extender learns only the pods that exist "
                        "(--learned-configmap off)")
    p.add_argument("--unneeded", type=number_at_least(0), default=600.0, help="how long a node must stand empty before it counts as releasable, s")
    p.add_argument("--out", default="results/elastic", help="output folder (CSV, JSON, PNG)")
    p.add_argument("--jobs", type=whole_number(1, MAX_JOBS), default=min(2, os.cpu_count() or 1), help="worker processes")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 day on a 1/20 node subset")
    return p


@lru_cache(maxsize=4)
def _scenario(directory: str, trace: str, stride: int, days: float, step: int, deployments: int, peak: float, seed: int):
    d = Path(directory)
    nodes = load_nodes(d)
    if stride > 1:
        nodes = subset(nodes, stride)
    pods = load_trace(trace, d)
    created, deleted = load_times(trace, d)
    return nodes, build(nodes, pods, created, deleted, days=days, step_s=step, deployments=deployments,
                        peak=peak, seed=seed)


def _task(args: tuple):
    (directory, trace, stride, days, step, deployments, peak, seed, policy, hpa, unneeded, learn_before,
     restart_day, keeps_past) = args
    nodes, sc = _scenario(directory, trace, stride, days, step, deployments, peak, seed)
    restart_at = None if restart_day is None else int(round(restart_day * 86400 / sc.step_s))
    return run(sc, nodes, policy, seed, hpa, unneeded_s=unneeded, learn_before=learn_before,
               restart_at=restart_at, restart_keeps_past=keeps_past)


def main(argv: list[str] | None = None) -> int:
    args = settle_quick(build_parser().parse_args(argv))
    seeds = args.seeds
    policies = args.policies or default_policies()
    directory = str(data_dir(args.data_dir))
    hpa = HpaSettings(target=args.target, tolerance=args.tolerance, scale_down_window_s=args.window,
                      metric_window_s=args.metric_window)
    try:
        nodes, sc = _scenario(directory, args.trace, args.node_stride, args.days, args.step, args.deployments,
                              args.peak, seeds[0])
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{trace_name(args.trace)} trace, last {args.days:g} days ({sc.steps} HPA syncs of {args.step} s); "
          f"{len(nodes.names)} nodes / {nodes.total_gpu_milli // 1000} GPUs (every {args.node_stride}th trace node); "
          f"workload x{sc.scale:.2f} so its peak is {args.peak:.0%} of the GPUs")
    for d in sc.deployments:
        print(f"  {d.name:<22} {_shape(d.req):<18} {d.trace_pods:>5} trace pods, "
              f"replicas needed {d.demand.min():.0f}..{d.peak:.0f}")
    print(f"  + {len(sc.jobs)} trace jobs (other shapes, multi-GPU, CPU-only); {sc.dropped_short} pods shorter than a sync skipped")
    if args.learn_before:
        print(f"  the extender learned {len(sc.history)} pods that came and went before the window (--learn-before)")
    if args.restart_at is not None:
        print(f"  the extender restarts at day {args.restart_at:g} "
              + ("learning only the pods that exist (--restart-lose-past)" if args.restart_lose_past
                 else "with the departed pods' past it kept"))
    tasks = [(directory, args.trace, args.node_stride, args.days, args.step, args.deployments, args.peak, seed,
              policy, hpa, args.unneeded, args.learn_before, args.restart_at, not args.restart_lose_past)
             for seed in seeds for policy in policies]
    t0 = time.perf_counter()
    results = []
    with progress_bar(total=len(tasks), desc="elastic", unit="run") as bar:   # closed on Ctrl-C too
        if args.jobs > 1 and len(tasks) > 1:
            with worker_pool(min(args.jobs, len(tasks)), "fork" if hasattr(os, "fork") else "spawn") as pool:
                for r in pool.imap_unordered(_task, tasks):
                    results.append(r)
                    bar.update()
        else:
            for t in tasks:
                results.append(_task(t))
                bar.update()
    order = {p: i for i, p in enumerate(policies)}
    results.sort(key=lambda r: (order[r.policy], r.seed))
    print()
    print(format_table([r.summary() for r in results]))
    meta = {"trace": trace_name(args.trace), "days": args.days, "step_s": args.step, "syncs": sc.steps,
            "nodes": len(nodes.names), "gpus": nodes.total_gpu_milli // 1000, "node_stride": args.node_stride,
            "scale": round(sc.scale, 3), "peak": args.peak, "deployments": len(sc.deployments),
            "deployment_shapes": [{"name": d.name, "request": _shape(d.req), "trace_pods": d.trace_pods,
                                   "peak_replicas": round(d.peak, 1)} for d in sc.deployments],
            "jobs": len(sc.jobs), "hpa": {"target_pct": hpa.target, "tolerance": hpa.tolerance,
                                           "scale_down_window_s": hpa.scale_down_window_s,
                                           "min_replicas": hpa.min_replicas, "max_factor": hpa.max_factor},
            "unneeded_s": args.unneeded, "learn_before": args.learn_before, "history_pods": len(sc.history),
            "restart_at_day": args.restart_at,
            "restart_keeps_past": None if args.restart_at is None else not args.restart_lose_past,
            "seeds": seeds, "wall_s": round(time.perf_counter() - t0, 1)}
    out = Path(args.out)
    if not out.is_absolute():
        out = Path.cwd() / out
    paths = write_outputs(results, meta, out)
    print(f"\nwrote {', '.join(str(p.relative_to(REPO_ROOT) if p.is_relative_to(REPO_ROOT) else p) for p in paths)} "
          f"in {meta['wall_s']} s")
    return 0
