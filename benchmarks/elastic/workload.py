"""The elastic scenario's workload, derived from the openb trace's real creation/deletion times.

- **Deployments**: the trace's single-GPU pods grouped by shape (GPU share, model constraint);
  the K groups with the most GPU-time in the window become deployments (inference services).
  A deployment's load at time t is the number of its trace pods alive at t (creation <= t <
  deletion), times the scenario's scale factor: the replicas it needs at the HPA target.
- **Jobs**: every other pod of the trace (multi-GPU and less common shapes, CPU-only pods)
  arrives at its creation time and leaves at its deletion time, as a batch job: it waits in
  the scheduling queue when it does not fit. Jobs keep the cluster as busy as the trace says.
- **Scale**: the trace's 1213-node cluster ran at about 1 % GPU load, so the scenario uses a
  node subset (every ``stride``-th node, same model mix) and multiplies the workload so its peak
  GPU demand is ``peak`` x the subset's GPU capacity. Each trace pod becomes ``scale`` pods
  (a fractional part is drawn with the seed).

Loading reuses the binpack benchmark's trace reader (:mod:`benchmarks.binpack.trace`) for
nodes and requests; only the two time columns are read here.
"""
from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.binpack.trace import DEFAULT_TRACE, Nodes, Pods, TraceError, trace_path
from benchmarks.binpack.variants import source_rows
from stowage.resources import GpuRequest

DAY = 86400


def load_times(trace: str, directory: Path) -> tuple[np.ndarray, np.ndarray]:
    """[P] creation and deletion times (seconds) of the trace's pods, in file order. A generated
    variant (``spec33``, ``multigpu40``: benchmarks/binpack/variants.py) has the times of the
    ``default`` pods it is made of; a resampled multi-GPU pod arrives and leaves with the pod it
    repeats."""
    rows = source_rows(trace, directory)
    if rows is not None:
        created, deleted = load_times(DEFAULT_TRACE, directory)
        return created[rows], deleted[rows]
    path = trace_path(trace, directory)
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            if not {"creation_time", "deletion_time"} <= set(reader.fieldnames or ()):
                raise TraceError(f"{path}: the elastic scenario needs creation_time and deletion_time columns "
                                 "(the default, gpushare40, gpuspec10 and cpu100 traces have them; multigpu20 does not)")
            rows = [(r["creation_time"], r["deletion_time"]) for r in reader]
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc}") from exc
    try:
        c = np.array([int(float(a or 0)) for a, _ in rows], np.int64)
        d = np.array([int(float(b)) if b else -1 for _, b in rows], np.int64)
    except ValueError as exc:
        raise TraceError(f"{path}: a creation/deletion time is not a number ({exc})") from exc
    end = int(max(c.max(initial=0), d.max(initial=0)))
    d = np.where(d < 0, end, d)  # still running at the end of the trace
    return c, np.maximum(d, c)


@dataclass(frozen=True)
class Deployment:
    """One elastic service: its replica shape and its load curve (replicas needed per step)."""

    name: str
    req: GpuRequest
    models: tuple[str, ...]
    demand: np.ndarray      # [S] replicas needed at the HPA target, per step (float)
    trace_pods: int

    @property
    def peak(self) -> float:
        return float(self.demand.max(initial=0.0))


@dataclass(frozen=True)
class Job:
    req: GpuRequest
    models: tuple[str, ...]
    start: int              # step it arrives
    end: int                # step it leaves (exclusive)


@dataclass(frozen=True)
class Scenario:
    deployments: tuple[Deployment, ...]
    jobs: tuple[Job, ...]
    t0: int
    step_s: int
    steps: int
    scale: float
    capacity_milli: int
    dropped_short: int      # trace pods shorter than a step between two syncs (never seen)
    # The trace's pods that came and went before the window (created and deleted before t0),
    # in creation order, each ``scale`` times as the window's pods are: what an extender that
    # ran before the window had seen (``--learn-before``). Past only, never the window's.
    history: tuple[tuple[GpuRequest, tuple[str, ...]], ...] = ()


def _group_key(pods: Pods, j: int) -> tuple[int, str]:
    return int(pods.gpu_milli[j]), pods.gpu_spec[j]


def _mode_request(pods: Pods, rows: np.ndarray) -> GpuRequest:
    """The group's replica request: its GPU shape with the most common CPU/memory pair."""
    pair = Counter((int(pods.cpu_milli[j]), int(pods.memory_mib[j])) for j in rows).most_common(1)[0][0]
    base = pods.request(int(rows[0]))
    return GpuRequest(gpus=base.gpus, mem_mib=base.mem_mib, core_milli=base.core_milli,
                      cpu_milli=pair[0], host_mem_mib=pair[1])


def build(nodes: Nodes, pods: Pods, created: np.ndarray, deleted: np.ndarray, *, days: float, step_s: int,
          deployments: int, peak: float, seed: int, end_day: float | None = None) -> Scenario:
    """The scenario for the ``days`` ending at ``end_day`` (default: the end of the trace)."""
    if len(created) != len(pods):
        raise TraceError("creation times and pod rows differ in length")
    end = int(deleted.max()) if end_day is None else int(end_day * DAY)
    t0 = max(end - int(days * DAY), 0)
    steps = max(int((end - t0) // step_s), 1)
    alive_any = (created < end) & (deleted > t0)
    # Steps at which each pod is seen alive: the sync at or after creation up to before deletion.
    start = np.clip(np.ceil((created - t0) / step_s), 0, steps).astype(np.int64)
    stop = np.clip(np.ceil((deleted - t0) / step_s), 0, steps).astype(np.int64)
    seen = alive_any & (stop > start)
    dropped_short = int((alive_any & ~seen).sum())

    # Deployments: single-GPU shapes with the most GPU-time in the window.
    single = seen & (pods.num_gpu == 1)
    gpu_time = Counter()
    members: dict[tuple[int, str], list[int]] = {}
    for j in np.flatnonzero(single):
        key = _group_key(pods, int(j))
        gpu_time[key] += int(pods.gpu_milli[j]) * int(stop[j] - start[j])
        members.setdefault(key, []).append(int(j))
    chosen = [k for k, _ in gpu_time.most_common(deployments)]
    in_dep = np.zeros(len(pods), bool)
    # Concurrency per step from start/stop step indices: +1 at start, -1 at stop, cumulative sum.
    counts: dict[tuple[int, str], np.ndarray] = {}
    for key in chosen:
        rows = np.array(members[key], np.int64)
        in_dep[rows] = True
        delta = np.bincount(start[rows], minlength=steps + 1) - np.bincount(stop[rows], minlength=steps + 1)
        counts[key] = np.cumsum(delta)[:steps].astype(float)

    # Peak GPU demand of everything (deployments + jobs), to size the scale factor.
    milli = (pods.num_gpu * pods.gpu_milli).astype(np.int64)
    delta = (np.bincount(start[seen], weights=milli[seen], minlength=steps + 1)
             - np.bincount(stop[seen], weights=milli[seen], minlength=steps + 1))
    demand_milli = np.cumsum(delta)[:steps]
    capacity = nodes.total_gpu_milli
    trace_peak = float(demand_milli.max(initial=0.0))
    scale = peak * capacity / trace_peak if trace_peak > 0 else 1.0

    deps = []
    for n, key in enumerate(chosen):
        rows = np.array(members[key], np.int64)
        milli_k, spec = key
        shape = f"{milli_k / 10:g}pct" if milli_k < 1000 else "1gpu"
        deps.append(Deployment(name=f"svc{n + 1}-{shape}" + (f"-{spec.replace('|', '+')}" if spec else ""),
                               req=_mode_request(pods, rows), models=pods.models(int(rows[0])),
                               demand=counts[key] * scale, trace_pods=len(rows)))

    rng = np.random.default_rng([seed, 11])
    jobs: list[Job] = []
    whole, frac = int(scale), scale - int(scale)
    for j in np.flatnonzero(seen & ~in_dep):
        j = int(j)
        copies = whole + int(rng.random() < frac)
        if copies:
            job = Job(req=pods.request(j), models=pods.models(j), start=int(start[j]), end=int(stop[j]))
            jobs.extend([job] * copies)
    jobs.sort(key=lambda jb: jb.start)
    # History: every pod that finished before the window, in creation order (its own draw of the
    # fractional copies, so the window's jobs are the same with or without it).
    hist_rng = np.random.default_rng([seed, 12])
    history: list[tuple[GpuRequest, tuple[str, ...]]] = []
    before = np.flatnonzero((created < t0) & (deleted <= t0))
    for j in before[np.argsort(created[before], kind="stable")]:
        j = int(j)
        copies = whole + int(hist_rng.random() < frac)
        if copies:
            history.extend([(pods.request(j), pods.models(j))] * copies)
    return Scenario(deployments=tuple(deps), jobs=tuple(jobs), t0=t0, step_s=step_s, steps=steps, scale=scale,
                    capacity_milli=capacity, dropped_short=dropped_short, history=tuple(history))
