"""``python -m benchmarks.latency``: the extender at kube-scheduler speed on 1,000-10,000 GPU nodes.

For each cluster size it starts, one after the other, as subprocesses on loopback ports:

- the do-nothing floor (:mod:`.floor`: same gunicorn setup, same parsing, no decisions);
- ``stowage extender --simulated <cluster file>`` exactly as deployed, pre-filled over HTTP so
  half the nodes are partly used, then driven like kube-scheduler (filter, prioritize, bind per
  pod, several concurrent keep-alive clients), with ``NodeNames`` (``nodeCacheCapable: true``)
  and, for the smaller sizes, with full Node objects (``nodeCacheCapable: false``);
- the same extender with pod-watch churn (pods bound and deleted through the Kubernetes
  feeder's event handler at ``--churn-rate`` per second) to show updates do not stall serving.

It prints one table (each figure with its ratio to the floor of the same size and mode) and
writes ``latency.csv`` / ``latency.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..cliargs import MAX_NODES, MAX_PODS, HelpFormatter, number_at_least, number_list, whole_number
from . import cluster, procs
from .client import Workload, prefill, schedule
from .memory import measure_in_subprocess
from .report import add_ratios, format_table, summarise, write_outputs

DEFAULTS = {"sizes": [1000, 5000, 10000], "pods": 600, "full_pods": 30, "full_max": 5000, "memory_nodes": 10000,
            "clients": 4}
QUICK = {"sizes": [200], "pods": 40, "full_pods": 6, "full_max": 200, "memory_nodes": 1000, "clients": 2}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.latency", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--sizes", type=number_list(1, MAX_NODES), default=None, help="comma-separated cluster sizes (GPU nodes, 8 cards each; default 1000,5000,10000)")
    p.add_argument("--pods", type=whole_number(1, MAX_PODS), default=None, help="pods scheduled per size and variant (default 600)")
    p.add_argument("--clients", type=whole_number(1, 256), default=None, help="concurrent client processes (one keep-alive connection each; default 4)")
    p.add_argument("--threads", type=whole_number(1, 256), default=8, help="request threads per gunicorn worker (as deployed)")
    p.add_argument("--workers", type=number_list(1, 64, example="1,2"), default="1,2",
                   help="comma-separated gunicorn worker counts to run: 1 = the one-process layout, N > 1 = the "
                        "split layout (N HTTP workers + one decision process); the floor runs with the same count")
    p.add_argument("--full-pods", type=whole_number(0, MAX_PODS), default=None, help="pods scheduled with full Node objects (nodeCacheCapable: false; default 30)")
    p.add_argument("--full-max", type=whole_number(0, MAX_NODES), default=None, help="largest size also run with full Node objects (default 5000)")
    p.add_argument("--churn-rate", type=number_at_least(0), default=300.0, help="pod watch events per second in the churn variant (0: skip)")
    p.add_argument("--memory-nodes", type=whole_number(0, MAX_NODES), default=None, help="cluster size of the model memory measurement (0: skip it; default 10000)")
    p.add_argument("--seed", type=int, default=7,
                   help="random seed of the simulated cluster's pods (their sizes, models and order)")
    p.add_argument("--out", default="results/latency", help="output folder (CSV, JSON)")
    p.add_argument("--quick", action="store_true", help="smoke run: 200 nodes, a few dozen pods (seconds); a flag given "
                   "beside it stands")
    return p


def _warm(host: str, port: int, n: int, names: list[str], items: dict[str, bytes] | None, tag: str) -> None:
    """A few pods first, unrecorded: the first requests pay for imports and caches, once per process."""
    schedule(Workload(host, port, cluster.pods(3, seed=999, prefix=f"warm-{tag}"), names, items), 1)


def _measure(srv: procs.Server, n: int, variant: str, mode: str, pods: list[dict[str, Any]], names: list[str],
             items: dict[str, bytes] | None, clients: int, extra_fn=None, workers: int = 1) -> dict[str, Any]:
    _warm(srv.host, srv.port, n, names, items, f"{variant}-{mode}")
    before = extra_fn() if extra_fn else None
    per0 = srv.cpu_by_process()
    results = schedule(Workload(srv.host, srv.port, pods, names, items), clients)
    per = [b - a for a, b in zip(per0, srv.cpu_by_process())]
    cpu = sum(per)
    extra = extra_fn(before) if extra_fn else None
    row = summarise(n, variant, mode, results, cpu, srv.peak_mib(), extra)
    row["workers"] = workers
    row["cpu_ms_per_pod_by_process"] = [round(c * 1e3 / max(row["placed"], 1), 2) for c in per]
    if row["errors"]:
        print(f"  ! {variant}/{mode}: {row['errors'][:3]}", file=sys.stderr)
    print(f"  {n:>6} w{workers} {variant:<16} {mode:<10} filter p99 {row['filter_p99_ms']:.2f} ms, "
          f"f+p p99 {row['fp_p99_ms']:.2f} ms, {row['pods_per_s']:.0f} pods/s, "
          f"{row['placed']} placed, server CPU {cpu:.2f} s (ms/pod by process {row['cpu_ms_per_pod_by_process']}, "
          f"clients {row['client_cpu_ms_per_pod']:.2f})"
          + (f", churn {row['churn_events_per_s']:.0f} events/s" if row.get("churn_events_per_s") else ""), flush=True)
    return row


def run_size(n: int, a: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cluster_file = cluster.write_cluster(n, tmp)
    names = cluster.node_names(n)
    pods = cluster.pods(a.pods, seed=a.seed)
    full = n <= a.full_max and a.full_pods > 0
    items = cluster.node_items(n) if full else None
    full_pods = cluster.pods(a.full_pods, seed=a.seed, prefix="full") if full else []
    plan = cluster.prefill_plan(n, seed=a.seed)
    data = SizeInputs(cluster_file, names, pods, full, items, full_pods, plan)
    for w in a.workers:
        rows += run_layout(n, w, a, tmp, data)
    return rows


class SizeInputs(NamedTuple):
    """What every layout of one cluster size is run with (built once per size)."""

    cluster_file: Path
    names: list[str]
    pods: list[dict[str, Any]]
    full: bool
    items: dict[str, bytes] | None
    full_pods: list[dict[str, Any]]
    plan: list[tuple[str, dict[str, Any]]]


def run_layout(n: int, w: int, a: argparse.Namespace, tmp: Path, data: SizeInputs) -> list[dict[str, Any]]:
    """The floor, Stowage, and Stowage with churn, all with ``w`` gunicorn workers."""
    rows: list[dict[str, Any]] = []
    served = procs.extender_processes(w)
    tag = f"{n}-w{w}"
    cluster_file, names, pods, full, items, full_pods, plan = data

    port = procs.free_port()
    with procs.start(f"floor-{tag}", procs.floor_cmd(port, a.threads, w), port, tmp, children=w) as srv:
        srv.wait_ready()
        rows.append(_measure(srv, n, "floor", "names", pods, names, None, a.clients, workers=w))
        if full:
            rows.append(_measure(srv, n, "floor", "full-nodes", full_pods, names, items, a.clients, workers=w))

    port = procs.free_port()
    with procs.start(f"stowage-{tag}", procs.extender_cmd(cluster_file, port, a.threads, workers=w), port, tmp,
                     children=served) as srv:
        srv.wait_ready()
        t0 = time.monotonic()
        bound, refused = prefill(srv.host, srv.port, plan, a.clients)
        print(f"  {n:>6} prefill: {bound} pods bound on {n // 2} nodes ({refused} refused) in "
              f"{time.monotonic() - t0:.1f} s", flush=True)
        rows.append(_measure(srv, n, "stowage", "names", pods, names, None, a.clients, workers=w))
        if full:
            rows.append(_measure(srv, n, "stowage", "full-nodes", full_pods, names, items, a.clients, workers=w))

    if a.churn_rate > 0:
        port = procs.free_port()
        stats = tmp / f"churn-{tag}.json"
        cmd = procs.extender_cmd(cluster_file, port, a.threads, churn_rate=a.churn_rate, churn_stats=stats, workers=w)
        with procs.start(f"stowage-churn-{tag}", cmd, port, tmp, children=served) as srv:
            srv.wait_ready()
            prefill(srv.host, srv.port, plan, a.clients)

            def churn_stats(before=None):
                doc = json.loads(stats.read_text()) if stats.exists() else {"events": 0, "time": time.monotonic()}
                if before is None:
                    return doc
                dt = doc["time"] - before["time"]
                return {"churn_events_per_s": (doc["events"] - before["events"]) / dt if dt > 0 else None}

            row = _measure(srv, n, f"stowage+churn{a.churn_rate:g}", "names", pods, names, None, a.clients,
                           churn_stats, workers=w)
            row["mode"] = "names"
            rows.append(row)
    return rows


def settle_quick(a: argparse.Namespace) -> argparse.Namespace:
    """What the user did not give: ``--quick``'s smoke values or the full run's. A value given on
    the command line always stands (``--quick --sizes 500`` measures 500 nodes)."""
    for key, value in (QUICK if a.quick else DEFAULTS).items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    return a


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    settle_quick(a)
    sizes = a.sizes
    meta = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(a)}
    print(f"Stowage extender latency: {meta['cores']} cores ({meta['cpu']}), sizes {sizes}, {a.pods} pods, "
          f"{a.clients} clients, {a.threads} threads per worker, workers {a.workers}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stowage-latency-") as tmpdir:
        for n in sizes:
            rows += run_size(n, a, Path(tmpdir))
    add_ratios(rows)
    mem = measure_in_subprocess(a.memory_nodes) if a.memory_nodes > 0 else None
    meta["model_memory"] = mem
    print()
    print(format_table(rows))
    if mem is not None:
        print(f"\nModel memory for {mem['nodes']} nodes / {mem['cards']} cards: {mem['model_mib']:.1f} MiB "
              f"(card arrays {mem['arrays_mib']:.1f} MiB; peak while loading {mem['peak_while_building_mib']:.1f} MiB)")
    paths = write_outputs(rows, meta, Path(a.out))
    print("wrote " + ", ".join(str(p) for p in paths))
    errors = [e for r in rows for e in r["errors"]]
    return 1 if errors else 0
