"""The elastic scenario for one placement policy: HPAs scale deployments on a simulated cluster.

Every ``step_s`` seconds (an HPA sync) the simulation:

1. removes the trace jobs whose deletion time passed (a job still waiting is dropped) and
   queues the jobs whose creation time arrived;
2. runs each deployment's HPA (:mod:`.hpa`) on its per-pod metric — the load the trace says
   the service has, shared by its ready replicas, capped at 100 %; scale-outs create Pending
   replicas, scale-ins delete replicas in the ReplicaSet controller's order (pending first,
   then those on the nodes holding most replicas of the deployment, newest first);
3. schedules the queue in creation order, like kube-scheduler's FIFO: each pod is a Pod object
   sent through the extender's own service calls (:func:`extender.placing.schedule`, shared
   with the binpack replay and ``stowage plan``: filter, prioritize, the best-scored node —
   ties: the seed's fixed node order, as in the binpack benchmark — and bind, which books it)
   or stays Pending and is retried next step. The placer learns each pod once, when it is
   created, because the live extender does: its watch shows every pending pod of its
   schedulers as it appears (``KubeFeeder.on_pod_seen`` = ``ExtenderService.learn_pod``),
   while kube-scheduler works through its queue at tens of pods per second, so of a burst of
   new pods (a scale-out, the first step's replicas) the extender knows all before it places
   the first. Retries of a Pending pod are not new pods;
4. counts empty nodes: a node with no pod at all for ``unneeded_s`` (cluster-autoscaler's
   scale-down-unneeded-time, 10 min) is one the autoscaler could have released. Counted in
   node-hours and in GPU-hours (its GPUs x hours): node-hours alone would rate emptying a
   2-GPU node as high as emptying an 8-GPU one.

Only the cluster (Node objects through the watch's object-to-model code,
:func:`benchmarks.binpack.replay.build_cluster`) and the pod source are simulated; placement is
the production code, through the same calls the live extender answers.
"""
from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from benchmarks.binpack.replay import CARD_POLICY, MEMORY_UNIT_MIB, NAMESPACE, build_cluster, node_rank
from benchmarks.binpack.trace import Nodes
from extender.learned_past import DepartedPods
from extender.placing import request_pod, schedule, serve
from extender.service import ExtenderService
from packing.placer import attach_placer
from packing.pod_policy import PodPolicy
from packing.registry import get_placer
from stowage.resources import CORE_MILLI_PER_CARD, GpuRequest

from .hpa import Hpa, HpaSpec
from .workload import Scenario


@dataclass(frozen=True)
class HpaSettings:
    """How every deployment's HPA is configured (Kubernetes defaults where they exist)."""

    target: float = 60.0            # target average GPU utilisation per replica, %
    tolerance: float = 0.1
    scale_down_window_s: float = 300.0
    min_replicas: int = 1
    max_factor: float = 1.5         # maxReplicas = ceil(max_factor * peak demand)
    # The window the metric pipeline averages each replica's utilisation over: the shipped
    # prometheus-adapter rule reads avg_over_time(...[2m]) (scheduler-config/autoscaling), so the
    # HPA sees the mean of the last two minutes' samples, not the load of this instant. 0: the
    # instant value (what the simulation gave the HPA before).
    metric_window_s: float = 120.0


@dataclass(eq=False)
class Item:
    """A pod waiting for or holding a place: a deployment replica or a trace job."""

    seq: int
    req: GpuRequest
    key: tuple
    created: int                    # step
    dep: int = -1                   # deployment index, -1 for a job
    event: int = -1                 # scale-out event id (-1: initial replica or job)
    node: int = -1
    placed: int = -1                # step placed, -1 while pending
    dead: bool = False
    pod: dict | None = None         # the Pod object (made at its first scheduling attempt)

    @property
    def uid(self) -> str:
        return f"p{self.seq}"


@dataclass
class ElasticResult:
    """One policy's figures (see :mod:`.report` for their meaning in the table)."""

    policy: str
    seed: int
    scale_outs: int = 0
    scale_outs_placed: int = 0      # every new replica found room in the step it was created
    scale_ins: int = 0
    replicas_created: int = 0
    replicas_immediate: int = 0
    replicas_delayed: int = 0
    replicas_never: int = 0         # scaled away while still Pending
    replicas_pending_at_end: int = 0
    wait_s: list[float] = field(default_factory=list)   # time-to-place of delayed replicas
    pending_replica_hours: float = 0.0
    jobs: int = 0
    jobs_placed: int = 0
    jobs_never: int = 0
    job_wait_s: list[float] = field(default_factory=list)
    releasable_node_hours: float = 0.0
    gpu_node_hours: float = 0.0
    releasable_gpu_hours: float = 0.0   # GPUs on releasable nodes x hours
    gpu_hours: float = 0.0              # every GPU x the window
    mean_alloc_pct: float = 0.0
    seconds: float = 0.0
    timeline: dict[str, list[float]] = field(default_factory=dict)
    learned: dict = field(default_factory=dict)     # the service's learned summary at the end

    @property
    def scale_outs_pending(self) -> int:
        return self.scale_outs - self.scale_outs_placed

    def time_to_place(self) -> dict[str, float]:
        """Over every replica that got a node: immediate ones count 0 s."""
        n = self.replicas_immediate + self.replicas_delayed
        if not n:
            return {"mean": 0.0, "p95": 0.0, "max": 0.0}
        waits = np.concatenate([np.zeros(self.replicas_immediate), np.asarray(self.wait_s, float)])
        return {"mean": float(waits.mean()), "p95": float(np.percentile(waits, 95)), "max": float(waits.max())}

    def summary(self) -> dict:
        ttp = self.time_to_place()
        return {
            "policy": self.policy, "seed": self.seed,
            "scale_outs": self.scale_outs, "scale_outs_found_room": self.scale_outs_placed,
            "scale_outs_stayed_pending": self.scale_outs_pending,
            "scale_outs_found_room_pct": round(100.0 * self.scale_outs_placed / self.scale_outs, 2) if self.scale_outs else 100.0,
            "scale_ins": self.scale_ins,
            "replicas_created": self.replicas_created, "replicas_placed_at_once": self.replicas_immediate,
            "replicas_placed_later": self.replicas_delayed, "replicas_never_placed": self.replicas_never,
            "replicas_pending_at_end": self.replicas_pending_at_end,
            "time_to_place_mean_s": round(ttp["mean"], 1), "time_to_place_p95_s": round(ttp["p95"], 1),
            "time_to_place_max_s": round(ttp["max"], 1),
            "pending_replica_hours": round(self.pending_replica_hours, 2),
            "jobs": self.jobs, "jobs_placed": self.jobs_placed, "jobs_never_placed": self.jobs_never,
            "job_wait_mean_s": round(float(np.mean(self.job_wait_s)) if self.job_wait_s else 0.0, 1),
            "releasable_node_hours": round(self.releasable_node_hours, 1),
            "releasable_pct_of_node_hours": round(100.0 * self.releasable_node_hours / self.gpu_node_hours, 2)
            if self.gpu_node_hours else 0.0,
            "releasable_gpu_hours": round(self.releasable_gpu_hours, 1),
            "releasable_pct_of_gpu_hours": round(100.0 * self.releasable_gpu_hours / self.gpu_hours, 2)
            if self.gpu_hours else 0.0,
            "mean_gpu_alloc_pct": round(self.mean_alloc_pct, 2),
            "seconds": round(self.seconds, 2),
        }


def _milli(req: GpuRequest) -> int:
    if req.is_whole:
        return req.gpus * CORE_MILLI_PER_CARD
    return req.core_milli if req.is_shared else 0


def restart(old: ExtenderService, new: Callable[[], ExtenderService], existing: list[dict],
            keeps_past: bool = True) -> ExtenderService:
    """A new extender process in place of ``old``: it reads the departed pods' past that ``old``
    wrote (through the stored document, :class:`extender.learned_past.DepartedPods`, as from
    its ConfigMap; not with ``keeps_past`` False, as with ``--learned-configmap off``), then its
    first list shows it the pods that exist, in creation order (``existing``)."""
    svc = new()
    if keeps_past:
        svc.learn_departed(DepartedPods.from_json(old.departed_snapshot().to_json()))
    for pod in existing:
        svc.learn_pod(pod)
    return svc


def run(sc: Scenario, nodes: Nodes, policy: str, seed: int, hpa: HpaSettings = HpaSettings(), *,
        unneeded_s: float = 600.0, timeline_every: int = 10, learn_before: bool = False,
        restart_at: int | None = None, restart_keeps_past: bool = True,
        progress: Callable[[int], None] | None = None) -> ElasticResult:
    """Simulate the scenario under one placement policy.

    ``learn_before``: the extender ran before the window. Its watch showed it every pod of the
    trace that came and went before (``sc.history``), and what the placers learned from them
    stays, as in a process that saw them (``ExtenderService.forget_learned``): they are sent to
    ``service.learn_pod`` as Pod objects, in creation order, before the first step. Without it
    the extender starts with the window, knowing only the pods that exist then.

    ``restart_at``: at that step (before it) the extender is restarted, as a rollout that
    replaces every replica does: a new service and placer over the same cluster, which learns
    what a new extender process learns (:func:`restart`). Every pod that leaves is shown to the
    service as deleted (``forget_learned``, as the watch does), so what it keeps of the departed
    pods is what the live extender keeps."""
    t_start = time.perf_counter()
    res = ElasticResult(policy=policy, seed=seed)
    model = build_cluster(nodes)
    a = model.a
    names = model.names
    n_nodes = len(nodes.names)
    rank = node_rank(len(names), seed)
    copies = max(1, round(sc.scale))
    workload = [(d.req, d.models) for d in sc.deployments for _ in range(d.trace_pods * copies)]
    workload += [(j.req, j.models) for j in sc.jobs]
    placer = attach_placer(get_placer(policy), model, seed=seed, workload=workload)
    service = serve(model, placer, default_policy=CARD_POLICY.get(policy, PodPolicy()),
                    memory_unit_mib=MEMORY_UNIT_MIB)
    node_names = [n for n in names if n is not None]   # slot order, as ``rank`` is
    if learn_before:
        for h, (req, models) in enumerate(sc.history):
            service.learn_pod(request_pod(f"h{h}", req, PodPolicy(models_include=models) if models else None,
                                          namespace=NAMESPACE, uid=f"h{h}", memory_unit_mib=MEMORY_UNIT_MIB))
            service.forget_learned(f"h{h}")   # it left before the window (what was learned stays)

    def pod_of(it: Item) -> dict:
        if it.pod is None:
            models = it.key[1]
            it.pod = request_pod(it.uid, it.req, PodPolicy(models_include=models) if models else None,
                                 namespace=NAMESPACE, uid=it.uid, memory_unit_mib=MEMORY_UNIT_MIB)
        return it.pod

    seq = 0
    queues: dict[tuple, deque[Item]] = {}
    placed_milli = 0
    # ---------------------------------------------------------------- deployments
    hpas: list[Hpa] = []
    reps: list[list[Item]] = []          # every live replica per deployment (pending or placed)
    pend_n = [0] * len(sc.deployments)
    util_hist: list[deque[tuple[int, float]]] = [deque() for _ in sc.deployments]   # (step, per-replica %)
    for d in sc.deployments:
        hpas.append(Hpa(HpaSpec(target=hpa.target, min_replicas=hpa.min_replicas,
                                max_replicas=max(hpa.min_replicas, 1, math.ceil(hpa.max_factor * d.peak)),
                                tolerance=hpa.tolerance, scale_down_window_s=hpa.scale_down_window_s)))
        reps.append([])

    def new_item(req: GpuRequest, models: tuple[str, ...], step: int, dep: int = -1, event: int = -1) -> Item:
        nonlocal seq
        seq += 1
        it = Item(seq=seq, req=req, key=(req, models), created=step, dep=dep, event=event)
        queues.setdefault(it.key, deque()).append(it)
        service.learn_pod(pod_of(it))   # the watch shows the new pending pod: the service learns it
        return it

    events: list[list[int]] = []         # scale-out event -> [created step, replicas, placed at once]

    def scale_out(k: int, n: int, step: int, initial: bool) -> None:
        d = sc.deployments[k]
        ev = -1
        if not initial:
            ev = len(events)
            events.append([step, n, 0])
            res.scale_outs += 1
            res.replicas_created += n
        for _ in range(n):
            reps[k].append(new_item(d.req, d.models, step, dep=k, event=ev))
            pend_n[k] += 1

    def release(it: Item) -> None:
        nonlocal placed_milli
        model.release(it.uid)
        service.forget_learned(it.uid)      # the watch shows it deleted
        placed_milli -= _milli(it.req)

    def scale_in(k: int, n: int, step: int) -> None:
        """ReplicaSet controller order: unscheduled first (newest first), then replicas on the
        nodes with most replicas of this deployment, most recently started first."""
        res.scale_ins += 1
        live = reps[k]
        pending = sorted((r for r in live if r.placed < 0), key=lambda r: -r.seq)
        victims = pending[:n]
        if len(victims) < n:
            per_node: dict[int, int] = {}
            for r in live:
                if r.placed >= 0:
                    per_node[r.node] = per_node.get(r.node, 0) + 1
            running = sorted((r for r in live if r.placed >= 0),
                             key=lambda r: (-per_node[r.node], -r.placed, -r.seq))
            victims += running[: n - len(victims)]
        gone = set(id(v) for v in victims)
        for v in victims:
            if v.placed < 0:
                v.dead = True
                service.forget_learned(v.uid)
                pend_n[k] -= 1
                res.replicas_never += v.event >= 0
            else:
                release(v)
        reps[k] = [r for r in live if id(r) not in gone]

    # ---------------------------------------------------------------- jobs
    jobs_by_start: dict[int, list] = {}
    for jb in sc.jobs:
        jobs_by_start.setdefault(jb.start, []).append(jb)
    ends: dict[int, list[Item]] = {}
    res.jobs = len(sc.jobs)

    # ---------------------------------------------------------------- accounting
    cpu_total = a.cpu_free[:n_nodes].copy()
    empty_since = np.full(n_nodes, -1.0)
    gpu_nodes = a.exists[:n_nodes].any(axis=1)
    node_gpus = a.exists[:n_nodes].sum(axis=1)
    releasable_steps = 0
    releasable_gpu_steps = 0
    alloc_sum = 0.0
    pend_jobs = 0
    tl: dict[str, list[float]] = {"hour": [], "pending_replicas": [], "pending_jobs": [], "releasable_nodes": [],
                                  "releasable_gpus": [], "alloc_pct": []}

    for s in range(sc.steps):
        now = float(s * sc.step_s)
        if s == restart_at:
            live = [r for rs in reps for r in rs] + [it for its in ends.values() for it in its if not it.dead]
            service = restart(service, lambda: serve(
                model, attach_placer(get_placer(policy), model, seed=seed, workload=workload),
                default_policy=CARD_POLICY.get(policy, PodPolicy()), memory_unit_mib=MEMORY_UNIT_MIB),
                [pod_of(it) for it in sorted(live, key=lambda it: it.seq)], restart_keeps_past)
        # 1. jobs leave / arrive
        for it in ends.pop(s, ()):
            if it.placed >= 0:
                release(it)
            elif not it.dead:
                it.dead = True
                service.forget_learned(it.uid)
                res.jobs_never += 1
                pend_jobs -= 1
        for jb in jobs_by_start.get(s, ()):
            it = new_item(jb.req, jb.models, s)
            ends.setdefault(jb.end, []).append(it)
            pend_jobs += 1
        # 2. HPAs
        for k, d in enumerate(sc.deployments):
            cur = len(reps[k])
            need = float(d.demand[s])
            if s == 0:
                want = min(max(math.ceil(need - 1e-9), hpas[k].spec.min_replicas), hpas[k].spec.max_replicas)
                scale_out(k, want, s, initial=True)
                continue
            ready = cur - pend_n[k]
            per_pod = min(100.0, hpa.target * need / ready) if ready > 0 else 0.0
            if hpa.metric_window_s > 0 and ready > 0:
                hist = util_hist[k]
                hist.append((s, per_pod))
                first = s - int(hpa.metric_window_s // sc.step_s) + 1   # samples in (now - window, now]
                while hist and hist[0][0] < first:
                    hist.popleft()
                metric_sum = 0.0
                for r in reps[k]:
                    if r.placed >= 0:   # ready from the step after its placement: its samples since
                        vals = [u for j, u in hist if j > r.placed]
                        metric_sum += sum(vals) / len(vals)
            else:
                metric_sum = per_pod * ready
            new = hpas[k].step(now, cur, ready, metric_sum, pend_n[k])
            if new > cur:
                scale_out(k, new - cur, s, initial=False)
            elif new < cur:
                scale_in(k, cur - new, s)
        # 3. schedule: oldest head first; a shape that does not fit is skipped for this step
        heap = []
        for key, q in queues.items():
            while q and q[0].dead:
                q.popleft()
            if q:
                heap.append((q[0].seq, key))
        heapq.heapify(heap)
        while heap:
            _, key = heapq.heappop(heap)
            q = queues[key]
            it = q[0]
            req = it.req
            node = schedule(service, pod_of(it), node_names, rank)
            if node is None:
                continue
            i = model.index[node]   # bind booked it
            placed_milli += _milli(req)
            it.node, it.placed = i, s
            q.popleft()
            wait = (s - it.created) * sc.step_s
            if it.dep >= 0:
                pend_n[it.dep] -= 1
                if it.event >= 0:
                    if wait == 0:
                        res.replicas_immediate += 1
                        events[it.event][2] += 1
                    else:
                        res.replicas_delayed += 1
                        res.wait_s.append(wait)
            else:
                res.jobs_placed += 1
                res.job_wait_s.append(wait)
                pend_jobs -= 1
            while q and q[0].dead:
                q.popleft()
            if q:
                heapq.heappush(heap, (q[0].seq, key))
        # 4. accounting
        pending_reps = sum(pend_n)
        res.pending_replica_hours += pending_reps * sc.step_s / 3600.0
        empty = gpu_nodes & (a.pods[:n_nodes].sum(axis=1) == 0) & (a.cpu_free[:n_nodes] >= cpu_total)
        empty_since[~empty] = -1.0
        empty_since[empty & (empty_since < 0)] = now
        gone = empty & (now - empty_since >= unneeded_s)
        releasable = int(gone.sum())
        releasable_gpus = int(node_gpus[gone].sum())
        releasable_steps += releasable
        releasable_gpu_steps += releasable_gpus
        alloc_pct = 100.0 * placed_milli / sc.capacity_milli
        alloc_sum += alloc_pct
        if s % timeline_every == 0:
            tl["hour"].append(now / 3600.0)
            tl["pending_replicas"].append(float(pending_reps))
            tl["pending_jobs"].append(float(pend_jobs))
            tl["releasable_nodes"].append(float(releasable))
            tl["releasable_gpus"].append(float(releasable_gpus))
            tl["alloc_pct"].append(alloc_pct)
        if progress is not None:
            progress(s)

    res.scale_outs_placed = sum(1 for ev in events if ev[2] == ev[1])
    res.replicas_pending_at_end = sum(1 for live in reps for r in live if r.placed < 0 and r.event >= 0)
    res.releasable_node_hours = releasable_steps * sc.step_s / 3600.0
    res.gpu_node_hours = int(gpu_nodes.sum()) * sc.steps * sc.step_s / 3600.0
    res.releasable_gpu_hours = releasable_gpu_steps * sc.step_s / 3600.0
    res.gpu_hours = int(node_gpus.sum()) * sc.steps * sc.step_s / 3600.0
    res.mean_alloc_pct = alloc_sum / max(sc.steps, 1)
    res.timeline = tl
    res.learned = service.learned_summary()
    res.seconds = time.perf_counter() - t_start
    return res

