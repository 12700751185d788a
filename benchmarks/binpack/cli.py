"""``python -m benchmarks.binpack``: replay the openb traces against every policy, side by side."""
from __future__ import annotations

import argparse
import os
import sys
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
from packing.registry import PLACERS

from ..cliargs import MAX_JOBS, HelpFormatter, name_list, parse_seeds, whole_number
from ..entry import worker_pool
from ..progress import progress_bar

from .replay import SEEDS, binned, replay
from . import runstore
from .report import PolicyResult, calibration, format_table, load_published, write_outputs
from .trace import (DEFAULT_TRACE, PUBLISHED_FILE, Nodes, Pods, TraceError, available_traces,
                    data_dir, load_nodes, trace_name)
from .variants import DEFAULT_VARIANTS, default_traces, load_trace

DEFAULT_POLICIES = ("stowage", "fgd", "bestfit", "random", "most-allocated", "least-allocated",
                    "gpushare-binpack", "hami-binpack")
QUICK_NODE_STRIDE = 6     # --quick: every 6th node (a ~200-node cluster of the same mix)
# A smaller cluster packs differently: its figures beside the paper's (the whole cluster) would
# read as a calibration they are not, so --quick shows none of the paper's.
QUICK_NOTE = (f"--quick replays every {QUICK_NODE_STRIDE}th node: the published figures (whole cluster) "
              "are not comparable, not shown")
QUICK_SEEDS = (42,)
BINS = 131                # binned(): one bin per arrived % from 0 to 130


def subset(nodes: Nodes, stride: int) -> Nodes:
    keep = np.arange(0, len(nodes.names), stride)
    return Nodes(names=tuple(nodes.names[i] for i in keep), cpu_milli=nodes.cpu_milli[keep],
                 memory_mib=nodes.memory_mib[keep], gpus=nodes.gpus[keep],
                 model=tuple(nodes.model[i] for i in keep))


@lru_cache(maxsize=16)
def load_replay(directory: str, trace: str, stride: int) -> tuple[Nodes, Pods]:
    """The cluster and the pods one replay runs: the openb nodes (every ``stride``-th) and the trace
    by name or path, generated variants included. The real-scheduler mode loads through this too,
    so its rows check exactly the pods of the simulated rows. Cached: each worker process loads a
    trace once for all its seeds and policies."""
    d = Path(directory)
    nodes = load_nodes(d)
    if stride > 1:
        nodes = subset(nodes, stride)
    return nodes, load_trace(trace, d)


def _task(args: tuple) -> tuple:
    directory, trace, policy, seed, stride = args
    nodes, pods = load_replay(directory, trace, stride)
    run = replay(nodes, pods, policy, seed)
    return trace_name(trace), policy, seed, binned(run, nodes.total_gpu_milli), run.failed, run.seconds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.binpack", formatter_class=HelpFormatter, description=__doc__)
    p.add_argument("--trace", nargs="+", default=None,
                   help="trace names (default, gpushare40, ...), generated variants (specX: X %% of GPU pods "
                        "limited to GPU models; multigpuX: multi-GPU pods X %% of the GPU request; see "
                        "benchmarks/binpack/variants.py) or CSV paths; default: every trace in the data dir, "
                        f"then {', '.join(DEFAULT_VARIANTS)}")
    p.add_argument("--policies", type=name_list(PLACERS, "placement policy"), default=",".join(DEFAULT_POLICIES), help="comma-separated placer names (default: %(default)s)")
    p.add_argument("--seeds", type=parse_seeds, default=None, help="10 (= 42..51), 42 (that seed), 42,43 or 42-51 (default: 10, or 42 with --quick)")
    p.add_argument("--out", default="results/binpack", help="output directory (CSV, JSON, PNG; default: %(default)s)")
    p.add_argument("--data-dir", default=None, help="folder with the openb CSVs (default ../shared/openb, or $STOWAGE_OPENB)")
    p.add_argument("--jobs", type=whole_number(1, MAX_JOBS), default=min(2, os.cpu_count() or 1),
                   help="worker processes (default: %(default)s, the cores here up to 2)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 seed on every 6th node (its tables leave out the paper's published "
                        "figures, which are for the whole cluster)")
    p.add_argument("--runs", default=None, metavar="DIR",
                   help="keep every replayed seed in DIR and reuse the ones already there (resume a long "
                        "run, or re-run only the policies whose code changed: delete their folders). Each "
                        "stored run records the git commit it was produced at; the results list them")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    directory = data_dir(args.data_dir)
    try:
        traces = args.trace or default_traces(available_traces(directory), directory) or [DEFAULT_TRACE]
        stride = QUICK_NODE_STRIDE if args.quick else 1
        seeds = args.seeds if args.seeds is not None else QUICK_SEEDS if args.quick else SEEDS
        policies = args.policies
        for t in traces:
            load_replay(str(directory), t, stride)  # fail fast, with a clear message, on a missing file
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tasks = [(str(directory), t, pol, s, stride) for t in traces for pol in policies for s in seeds]
    got: dict[tuple[str, str], list] = {}
    store = Path(args.runs) if args.runs else None
    version = runstore.code_version()
    reused: dict[str, set[str]] = {}

    def stored_name(trace: str) -> str:
        return trace_name(trace) + (f"@stride{stride}" if stride > 1 else "")

    if store is not None:
        todo = []
        for task in tasks:
            old = runstore.load(store, stored_name(task[1]), task[2], task[3], BINS)
            if old is None:
                todo.append(task)
                continue
            got.setdefault((trace_name(task[1]), task[2]), []).append(
                (trace_name(task[1]), task[2], task[3], old.curve, old.failed, old.seconds))
            reused.setdefault(task[2], set()).add(old.commit)
        if reused:
            print(f"reusing {len(tasks) - len(todo)} stored runs from {store} "
                  f"(commits: {', '.join(f'{p} {sorted(c)}' for p, c in sorted(reused.items()))}); "
                  f"this checkout is {version}", file=sys.stderr)
        tasks = todo

    def keep(r: tuple) -> None:
        got.setdefault((r[0], r[1]), []).append(r)
        if store is not None:
            trace = next(t for t in traces if trace_name(t) == r[0])
            runstore.save(store, runstore.StoredRun(stored_name(trace), r[1], r[2], r[3], r[4], r[5], version))

    t0 = time.perf_counter()
    if args.jobs > 1 and len(tasks) > 1:
        with worker_pool(args.jobs) as pool:   # Ctrl-C: the parent stops it, one line
            for r in progress_bar(pool.imap_unordered(_task, tasks), total=len(tasks), desc="replays", unit="seed"):
                keep(r)
    else:
        for task in progress_bar(tasks, desc="replays", unit="seed"):
            keep(_task(task))
    results = []
    for t in traces:
        for pol in policies:
            runs = sorted(got[(trace_name(t), pol)], key=lambda r: r[2])
            results.append(PolicyResult(trace=trace_name(t), policy=pol, curves=np.stack([r[3] for r in runs]),
                                        seconds=sum(r[5] for r in runs), failed=[r[4] for r in runs]))
    pub = {} if args.quick else load_published(directory / PUBLISHED_FILE)   # also kept out of the CSV/JSON
    print(format_table(results, pub, QUICK_NOTE if args.quick else "[published]"))
    print("\nruntime per policy (all traces, sum over seeds, single core):")
    for pol in policies:
        secs = sum(r.seconds for r in results if r.policy == pol)
        print(f"  {pol:<18} {secs:7.1f}s")
    cal = calibration(results, pub)
    if cal:
        bad = [c for c in cal if not c[5]]
        print(f"\ncalibration vs published medians (tolerance 0.5 points): "
              f"{len(cal) - len(bad)}/{len(cal)} figures within tolerance")
        for t, p, pct, ours, pb, ok in bad:
            print(f"  OFF: {t} {p} @{pct}%: ours {ours:.2f} vs published {pb:.2f} ({ours - pb:+.2f})")
    meta = {"traces": [trace_name(t) for t in traces], "policies": policies, "seeds": list(seeds),
            "quick": args.quick, "wall_seconds": round(time.perf_counter() - t0, 1), "jobs": args.jobs,
            "cpu_count": os.cpu_count(), "code": version,
            "reused_runs": {p: sorted(c) for p, c in sorted(reused.items())}}
    out = Path(args.out)
    if not out.is_absolute():
        out = Path.cwd() / out
    for path in write_outputs(results, pub, out, meta):
        print(f"wrote {path}")
    return 0
