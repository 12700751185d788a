"""The bin-packing benchmark through the real kube-scheduler: ``python -m benchmarks.binpack.real``.

The simulated replay (``python -m benchmarks.binpack``) places each pod with the extender's own
code on a model it builds itself. This mode asks what a cluster gets: the same openb trace, the
same arrival protocol (:func:`~benchmarks.binpack.replay.arrival_order`: shuffle, 130 %
inflation, one pod at a time, nothing leaves) and the same binned curves, but every pod is a
real Pod created on a real kube-apiserver v1.28.7 and placed by a real kube-scheduler from
``../shared/k8s``, started as the integration tests start them (:mod:`benchmarks.localk8s`):

- ``stowage``: kube-scheduler loaded with ``scheduler-config/scheduler-config.yaml`` (only the
  kubeconfig, leader election and the extender's address changed), calling ``stowage extender``
  in kube mode as deployed (``--workers 2``, the split layout of scheduler.yaml);
- ``plain``: the same profile without the extender, and every sharing pod asks for a whole card
  (``nvidia.com/gpu: 1``): what kube-scheduler does on its own.

The cluster is the trace's 1,213 nodes as fake GPU nodes (Node objects, no kubelet): allocatable
``cpu``, ``memory``, ``pods`` (110), ``nvidia.com/gpu`` (cards), ``nvidia.com/gpu-memory`` (1000
per card) and ``nvidia.com/gpu-core`` (100 per card), and Stowage's inventory annotation with
cards of 1000 MiB in units of 1 MiB (the extender runs with ``--memory-unit-mib 1``). So a
sharing pod of the trace asks ``nvidia.com/gpu-memory: <gpu_milli>`` and ``nvidia.com/gpu-core:
<gpu_milli / 10, rounded up>``: its share is its fraction of a card, in the very units the simulated
replay's model uses (cards of 1000 memory units and 1000 milli of compute), and the same Pod
request the simulated replay's Pod object carries (compute in whole percents, rounded up; the
openb traces' shares are all multiples of 10 milli), so the extender's model holds the same
numbers as the simulated one (``tests/test_binpack_real_pods.py``).

A pod counts as placed when the watch shows it bound (``spec.nodeName``), as failed when
kube-scheduler reports it unschedulable (``PodScheduled=False``, reason ``Unschedulable``). Any
other outcome (a scheduler error, no answer within ``--pod-timeout``) is reported apart and
counts as failed, so it can never make a figure look better. After each run every pod is read
back and checked: each bound pod's allocation record names its node and books exactly its
request on cards of that node, no card or node is over-committed, and no pod counted failed was
bound later.

``--burst N`` also times N GPU pods of the trace created at once on a fresh cluster, with the
extender and with plain kube-scheduler in the same run (pods/s from the first create to the
last pod settled). ``--burst-floor`` adds a third: kube-scheduler with the do-nothing extender
(:mod:`benchmarks.latency.floor`: served like Stowage's, no model, filter keeps the first node,
bind creates the Binding), the bound of the extender / plain ratio for any extender served this
way. See docs/binpack.md, "Real-scheduler mode".
"""
from __future__ import annotations

import argparse
import csv
import json
import logging
import multiprocessing as mp
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import yaml

from benchmarks.localk8s import (ApiSession, ExtenderProc, FloorExtenderProc, LocalK8s, SCHEDULER_CONFIG,
                                 free_port, missing_for_control_plane, scheduler_config_for_test, wait_until)
from extender.split import DECIDER_NAME, HTTP_WORKER_NAME
from stowage.allocation import ALLOCATION_ANNOTATION, decode_allocation
from stowage.inventory import INVENTORY_ANNOTATION, Card, encode_inventory

from ..entry import NOT_WRITTEN, interruption, run_command, worker_pool
from ..cliargs import MAX_JOBS, MAX_NODES, MAX_PODS, CheckedParser, HelpFormatter, name_list, parse_seeds, positive_number, whole_number
from ..progress import progress_bar
from .cli import load_replay
from .runstore import code_version
from .replay import CARD_MEMORY, INFLATE, SeedRun, arrival_order, binned, replay
from .report import TABLE_POINTS, PolicyResult, format_table
from .trace import DEFAULT_TRACE, Nodes, Pods, TraceError, data_dir, trace_name

log = logging.getLogger("binpack.real")

PROG = "python -m benchmarks.binpack.real"
MODES = ("stowage", "plain")
# A burst-only mode (--burst-floor): kube-scheduler with the do-nothing extender of
# benchmarks/latency/floor.py; its pods are the stowage mode's.
FLOOR = "floor"
MODE_LABEL = {"stowage": "stowage-real", "plain": "kube-sched-plain", "simulated": "stowage-simulated",
              FLOOR: "floor-extender"}
ROW_ORDER = ["stowage-simulated", "stowage-real", "kube-sched-plain"]
MEMORY_UNIT_MIB = 1               # the fake device plugin's unit: one nvidia.com/gpu-memory = 1 MiB
CORE_PCT_PER_CARD = 100
PODS_PER_NODE = 110               # the kubelet's default maxPods
IMAGE = "example.local/fakegpu-test:1"  # never runs: the nodes have no kubelet
NAMESPACE = "binpack"
MODEL_LABEL = "benchmarks.stowage.io/gpu-model"  # for the plain mode's gpu_spec pods (node affinity)
RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"


def scheduler_name() -> str:
    """The profile GPU pods opt into: the first profile of the deployed scheduler-config.yaml."""
    cfg = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    return cfg["profiles"][0]["schedulerName"]


def cpu_scheduler_name() -> str:
    """The scheduler CPU-only pods use in the replay: the deployed config's profile for them when
    it names one (a profile whose name mentions "cpu"), else the GPU profile, which is what a pod
    landing on a GPU node of this cluster goes through (the cluster has no other scheduler)."""
    cfg = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    names = [p["schedulerName"] for p in cfg.get("profiles") or []]
    return next((n for n in names if "cpu" in n.lower()), names[0])


# --- objects -------------------------------------------------------------------------------------

def node_body(nodes: Nodes, i: int) -> dict:
    """Node ``i`` of the trace as the API server should hold it: Ready, untainted, with the
    allocatable and inventory annotation of a node running Stowage's device plugin."""
    name, n = nodes.names[i], int(nodes.gpus[i])
    cards = [Card(index=k, uuid=f"GPU-{name}-{k}", model=nodes.model[i], memory_mib=CARD_MEMORY) for k in range(n)]
    alloc = {"cpu": f"{int(nodes.cpu_milli[i])}m", "memory": f"{int(nodes.memory_mib[i])}Mi",
             "pods": str(PODS_PER_NODE), "nvidia.com/gpu": str(n),
             "nvidia.com/gpu-memory": str(n * CARD_MEMORY // MEMORY_UNIT_MIB),
             "nvidia.com/gpu-core": str(n * CORE_PCT_PER_CARD)}
    ts = "2026-01-01T00:00:00Z"
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, MODEL_LABEL: nodes.model[i]},
                         "annotations": {INVENTORY_ANNOTATION: encode_inventory(cards, MEMORY_UNIT_MIB)}},
            "spec": {"taints": []},
            "status": {"capacity": dict(alloc), "allocatable": alloc,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Fake", "message": "no kubelet",
                                       "lastHeartbeatTime": ts, "lastTransitionTime": ts}]}}


def gpu_limits(pods: Pods, j: int, mode: str) -> dict[str, str]:
    """What trace row ``j`` asks of the GPU resources. stowage: a share is memory (and compute)
    of one card in the card's own units; plain: a share is a whole card, all kube-scheduler has."""
    g, m = int(pods.num_gpu[j]), int(pods.gpu_milli[j])
    if g == 0 or m == 0:
        return {}
    if g == 1 and m < 1000:
        if mode == "plain":
            return {"nvidia.com/gpu": "1"}
        # Compute rounded up to a whole percent, as the simulated replay's Pod object
        # (extender.placing.request_pod) asks it: a share never asks less than its trace row.
        return {"nvidia.com/gpu-memory": str(m * CARD_MEMORY // 1000 // MEMORY_UNIT_MIB),
                "nvidia.com/gpu-core": str(-(-m * CORE_PCT_PER_CARD // 1000))}
    return {"nvidia.com/gpu": str(g)}


def pod_body(pods: Pods, j: int, name: str, mode: str, gpu_scheduler: str, cpu_scheduler: str) -> dict:
    """Trace row ``j`` as a Pod: its CPU and memory requests, its GPU request (:func:`gpu_limits`),
    the GPU profile's scheduler name, or ``cpu_scheduler`` when it asks for no GPU."""
    limits = gpu_limits(pods, j, mode)
    requests = {"cpu": f"{int(pods.cpu_milli[j])}m"}
    if int(pods.memory_mib[j]) > 0:
        requests["memory"] = f"{int(pods.memory_mib[j])}Mi"
    resources: dict[str, Any] = {"requests": requests}
    if limits:
        resources["limits"] = limits
    spec: dict[str, Any] = {"schedulerName": gpu_scheduler if limits else cpu_scheduler,
                            "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": "main", "image": IMAGE, "resources": resources}]}
    meta: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "labels": {"app": "binpack"}}
    models = pods.models(j)
    if models and limits:
        if mode == "stowage":
            meta["annotations"] = {"stowage.io/gpu-model": ",".join(models)}
        else:
            spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": MODEL_LABEL, "operator": "In",
                                                             "values": list(models)}]}]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


# --- watching outcomes ---------------------------------------------------------------------------

@dataclass
class Outcome:
    """What became of one pod: ``bound`` (node set), ``unschedulable`` (kube-scheduler said so),
    ``error`` (PodScheduled=False for another reason, e.g. an extender error), ``timeout``."""

    state: str
    node: str = ""
    message: str = ""
    at: float = 0.0


def outcome_of(pod: dict) -> Outcome | None:
    """The terminal outcome this pod object shows, or None while it is still being decided."""
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        return Outcome("bound", node=node, at=time.monotonic())
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            state = "unschedulable" if c.get("reason") == "Unschedulable" else "error"
            return Outcome(state, message=f"{c.get('reason')}: {c.get('message') or ''}", at=time.monotonic())
    return None


class PodWatch:
    """One WATCH on the namespace's pods, in a thread: the first terminal outcome of every pod,
    and the binds that come after a pod was already reported unschedulable (which would make
    a failure count wrong). Waiters are woken per event, not by polling."""

    def __init__(self, api: ApiSession, namespace: str) -> None:
        self.api = api
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.first: dict[str, Outcome] = {}
        self.errors: dict[str, str] = {}      # pods that saw a non-Unschedulable failure, last message
        self.late_binds: dict[str, str] = {}  # failed first, bound later
        self.cond = threading.Condition()
        self._stop = threading.Event()
        _, self.rv = api.list_all(self.path)
        self.thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for typ, obj in self.api.watch(self.path, self.rv, timeout_s=1800):
                    if self._stop.is_set():
                        return
                    if typ == "ERROR":
                        _, self.rv = self.api.list_all(self.path)  # 410 Gone: start again from now
                        log.warning("pod watch: %s; resumed from a fresh list", obj.get("message"))
                        break
                    self.rv = (obj.get("metadata") or {}).get("resourceVersion", self.rv)
                    if typ in ("ADDED", "MODIFIED"):
                        self._event(obj)
            except Exception as exc:  # noqa: BLE001 - a dropped stream: resume from the last version
                if not self._stop.is_set():
                    log.warning("pod watch dropped (%s); resuming", exc)
                    time.sleep(0.5)

    def _event(self, pod: dict) -> None:
        name = pod["metadata"]["name"]
        out = outcome_of(pod)
        if out is None:
            return
        with self.cond:
            if out.state == "error":
                self.errors[name] = out.message
                return  # kube-scheduler retries it: not terminal
            prev = self.first.get(name)
            if prev is None:
                self.first[name] = out
                self.cond.notify_all()
            elif prev.state != "bound" and out.state == "bound":
                self.late_binds[name] = out.node

    def wait(self, name: str, timeout: float) -> Outcome:
        deadline = time.monotonic() + timeout
        with self.cond:
            while name not in self.first:
                left = deadline - time.monotonic()
                if left <= 0:
                    return Outcome("timeout", message=self.errors.get(name, "no answer"), at=time.monotonic())
                self.cond.wait(left)
            return self.first[name]

    def wait_all(self, names: list[str], timeout: float) -> dict[str, Outcome]:
        return {n: self.wait(n, max(0.0, timeout)) for n in names}

    def stop(self) -> None:
        self._stop.set()


# --- a cluster ------------------------------------------------------------------------------------

@dataclass
class RunOptions:
    """How each run is set up (one fresh control plane per run)."""

    work_dir: Path
    port_base: int
    workers: int = 2
    threads: int = 16              # for creating nodes (and a burst's pods)
    pod_timeout: float = 120.0
    progress: bool = True
    slot: int = 0                  # which of --jobs parallel runs (its progress bar's line)


class Cluster:
    """A fresh control plane with the trace's nodes, kube-scheduler and (stowage mode) the extender.

    Fresh per run: pods never leave in this protocol, so a second run on the same cluster would
    start full; a new etcd is the only state that is certainly empty."""

    def __init__(self, nodes: Nodes, mode: str, opts: RunOptions) -> None:
        self.nodes, self.mode, self.opts = nodes, mode, opts
        self.k8s = LocalK8s(opts.work_dir, opts.port_base)
        self.extender: ExtenderProc | None = None
        self.api: ApiSession | None = None

    def __enter__(self) -> "Cluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        t0 = time.monotonic()
        self.k8s.up()
        self.api = ApiSession(self.k8s.kubeconfig, pool=self.opts.threads + 4)
        self.api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        t1 = time.monotonic()
        self.create_nodes()
        t2 = time.monotonic()
        if self.mode == "stowage":
            self.extender = ExtenderProc(self.k8s, port=free_port(), name="stowage-extender",
                                         args=("--workers", str(self.opts.workers), "--log-level", "warning",
                                               "--memory-unit-mib", str(MEMORY_UNIT_MIB))).start()
            self.wait_extender_knows_nodes()
            cfg = scheduler_config_for_test(self.extender.url)
        elif self.mode == FLOOR:
            self.extender = FloorExtenderProc(self.k8s, port=free_port(), name="floor-extender",
                                              args=("--workers", str(self.opts.workers))).start()
            cfg = scheduler_config_for_test(self.extender.url)
        else:
            cfg = scheduler_config_for_test("http://127.0.0.1:1", extra=lambda c: c.pop("extenders"))
        # Pods never leave here, so a pod kube-scheduler found unschedulable can never fit later;
        # by default it still retries each one every 5 minutes, and at the end of a seed those
        # retries of thousands of failed pods (full scheduling cycles over every node) outnumber
        # the new pods. A retry cannot change a placement; it only slows the run.
        self.k8s.start_scheduler(cfg, name=f"kube-scheduler-{self.mode}",
                                 extra_args=("--pod-max-in-unschedulable-pods-duration=12h",))
        log.info("%s cluster ready: control plane %.1fs, %d nodes %.1fs, scheduler%s %.1fs", self.mode, t1 - t0,
                 len(self.nodes.names), t2 - t1, " + extender" if self.extender else "", time.monotonic() - t2)

    def create_nodes(self) -> None:
        """Every node in one create each (status included, as a kubelet registers), from a pool
        of threads; admission adds the not-ready taint on create, so each is untainted after."""
        def one(i: int) -> None:
            body = node_body(self.nodes, i)
            got = self.api.post("/api/v1/nodes", body)
            if (got.get("spec") or {}).get("taints") or not (got.get("status") or {}).get("allocatable"):
                self.api.merge_patch(f"/api/v1/nodes/{body['metadata']['name']}", {"spec": {"taints": None}})
                if not (got.get("status") or {}).get("allocatable"):
                    self.api.merge_patch(f"/api/v1/nodes/{body['metadata']['name']}/status", {"status": body["status"]})
        with ThreadPoolExecutor(self.opts.threads) as ex:
            list(progress_bar(ex.map(one, range(len(self.nodes.names))), total=len(self.nodes.names), desc="nodes",
                      unit="node", leave=False, disable=not self.opts.progress))

    def wait_extender_knows_nodes(self) -> None:
        """The extender learns nodes through its watch: start scheduling only once it has them all."""
        want = len(self.nodes.names)

        def known() -> bool:
            st = self.extender.state()
            return sum(1 for n in st["nodes"] if n.get("schedulable")) >= want
        wait_until(known, 120, f"the extender to see all {want} nodes", interval=1.0)

    def stop(self) -> None:
        if self.extender is not None:
            self.extender.stop()
        self.k8s.down()


# --- one replay ------------------------------------------------------------------------------------

@dataclass
class RealRun:
    """One mode, one seed, through the real kube-scheduler."""

    mode: str
    seed: int
    run: SeedRun
    outcomes: dict[str, int]            # bound / unschedulable / timeout counts
    late_binds: int
    problems: list[str]                 # consistency problems found when reading every pod back
    max_pods_on_a_node: int
    seconds_replay: float
    seconds_total: float
    pods_per_s: float
    first_failures: list[str] = field(default_factory=list)


def pod_name(trace: str, seed: int, e: int) -> str:
    return f"{trace}-{seed}-{e:05d}".lower()


def arrivals(pods: Pods, capacity: int, seed: int, limit: int | None = None, until_pct: float | None = None,
             inflate: float = INFLATE) -> np.ndarray:
    """The seed's arrival order (the simulated replay's), cut after ``limit`` pods or once the
    arrived GPU-milli would pass ``until_pct`` % of the cluster's capacity."""
    order = arrival_order(pods, capacity, seed, inflate)
    if until_pct is not None:
        order = order[np.cumsum(pods.milli[order]) <= until_pct / 100.0 * capacity]
    if limit is not None:
        order = order[:limit]
    return order


def replay_real(nodes: Nodes, pods: Pods, mode: str, seed: int, opts: RunOptions, *,
                limit: int | None = None, until_pct: float | None = None, inflate: float = INFLATE) -> RealRun:
    """Replay one seed through the real kube-scheduler in ``mode``; see the module docstring."""
    t_start = time.monotonic()
    capacity = nodes.total_gpu_milli
    order = arrivals(pods, capacity, seed, limit, until_pct, inflate)
    gpu_sched, cpu_sched = scheduler_name(), cpu_scheduler_name()
    arrived = np.zeros(len(order), np.int64)
    allocated = np.zeros(len(order), np.int64)
    counts = {"bound": 0, "unschedulable": 0, "timeout": 0}
    failed = failed_milli = done = got = 0
    first_failures: list[str] = []
    names: dict[str, int] = {}
    with Cluster(nodes, mode, opts) as cl:
        watch = PodWatch(cl.api, NAMESPACE)
        try:
            t0 = time.monotonic()
            bar = progress_bar(total=len(order), desc=f"{mode} seed {seed}", unit="pod", disable=not opts.progress,
                       position=opts.slot, leave=opts.slot == 0)
            for e, j in enumerate(order):
                j = int(j)
                name = pod_name(pods.name, seed, e)
                names[name] = j
                cl.api.post(f"/api/v1/namespaces/{NAMESPACE}/pods", pod_body(pods, j, name, mode, gpu_sched, cpu_sched))
                out = watch.wait(name, opts.pod_timeout)
                milli = int(pods.milli[j])
                done += milli
                counts[out.state] = counts.get(out.state, 0) + 1
                if out.state == "bound":
                    got += milli
                else:
                    failed += 1
                    failed_milli += milli
                    if len(first_failures) < 5 and milli:
                        first_failures.append(f"{name} ({dict(gpu_limits(pods, j, mode))}): {out.message[:300]}")
                    if out.state == "timeout":
                        log.warning("%s: no outcome after %.0fs (%s); counted as failed", name, opts.pod_timeout,
                                    out.message[:200])
                arrived[e], allocated[e] = done, got
                bar.update(1)
                if e % 200 == 0:
                    bar.set_postfix(alloc=f"{100.0 * got / capacity:.1f}%", failed=failed)
            bar.close()
            t_replay = time.monotonic() - t0
            time.sleep(1.0)  # let a late bind (if any) arrive before the read-back
            problems, max_pods = check_cluster(cl.api, nodes, mode, watch, names, pods)
            late = len(watch.late_binds)
        finally:
            watch.stop()
    run = SeedRun(MODE_LABEL[mode], seed, arrived, allocated, failed, failed_milli, t_replay)
    return RealRun(mode, seed, run, counts, late, problems, max_pods, t_replay, time.monotonic() - t_start,
                   len(order) / max(t_replay, 1e-9), first_failures)


def check_cluster(api: ApiSession, nodes: Nodes, mode: str, watch: PodWatch, names: dict[str, int],
                  pods: Pods) -> tuple[list[str], int]:
    """Read every pod back and check the end state against what the replay counted and against
    the nodes' capacity. Returns (problems found, the most pods bound to one node)."""
    problems: list[str] = []
    items, _ = api.list_all(f"/api/v1/namespaces/{NAMESPACE}/pods")
    by_name = {p["metadata"]["name"]: p for p in items}
    missing = set(names) - set(by_name)
    if missing:
        problems.append(f"{len(missing)} pods created but not listed, e.g. {sorted(missing)[:3]}")
    node_index = {n: i for i, n in enumerate(nodes.names)}
    cpu = np.zeros(len(nodes.names), np.int64)
    mem = np.zeros(len(nodes.names), np.int64)
    count = np.zeros(len(nodes.names), np.int64)
    whole = np.zeros(len(nodes.names), np.int64)
    card_mem: dict[tuple[str, int], int] = {}
    card_whole: dict[tuple[str, int], list[str]] = {}
    for name, j in names.items():
        p = by_name.get(name)
        if p is None:
            continue
        node = p["spec"].get("nodeName")
        first = watch.first.get(name)
        counted = first is not None and first.state == "bound"
        if bool(node) != counted or (node and first.node != node):
            problems.append(f"{name}: counted {first.state if first else 'no outcome'}"
                            f"{' on ' + first.node if counted else ''}, but nodeName is {node!r}")
        if not node:
            if ALLOCATION_ANNOTATION in (p["metadata"].get("annotations") or {}):
                problems.append(f"{name}: not bound but carries an allocation record")
            final = outcome_of(p)
            if first is not None and first.state == "unschedulable" and (final is None or final.state != "unschedulable"):
                problems.append(f"{name}: counted unschedulable, but its PodScheduled condition now says "
                                f"{final.message[:120] if final else 'nothing'}")
            continue
        i = node_index.get(node)
        if i is None:
            problems.append(f"{name}: bound to {node}, not a node of the trace")
            continue
        cpu[i] += int(pods.cpu_milli[j])
        mem[i] += int(pods.memory_mib[j])
        count[i] += 1
        limits = gpu_limits(pods, j, mode)
        whole[i] += int(limits.get("nvidia.com/gpu", 0))
        raw = (p["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION)
        if mode != "stowage" or not limits:
            if raw and mode == "stowage" and decode_allocation(raw).node != node:
                problems.append(f"{name}: record names another node than {node}")
            continue
        if not raw:
            problems.append(f"{name}: bound to {node} without {ALLOCATION_ANNOTATION}")
            continue
        rec = decode_allocation(raw)
        if rec.node != node:
            problems.append(f"{name}: record says {rec.node}, bound to {node}")
            continue
        n_cards = int(nodes.gpus[i])
        idx = [c.index for c in rec.cards]
        if len(set(idx)) != len(idx) or any(not 0 <= k < n_cards for k in idx):
            problems.append(f"{name}: record cards {idx} on a node of {n_cards}")
            continue
        if "nvidia.com/gpu" in limits:
            if not rec.whole or len(idx) != int(limits["nvidia.com/gpu"]):
                problems.append(f"{name}: asks {limits} but the record holds {rec}")
            for k in idx:
                card_whole.setdefault((node, k), []).append(name)
        else:
            want = int(limits["nvidia.com/gpu-memory"]) * MEMORY_UNIT_MIB
            if rec.whole or len(idx) != 1 or rec.cards[0].memory_mib != want:
                problems.append(f"{name}: asks {limits} but the record holds {rec}")
            card_mem[(node, idx[0])] = card_mem.get((node, idx[0]), 0) + rec.cards[0].memory_mib
    for key, held in card_whole.items():
        if len(held) > 1 or key in card_mem:
            problems.append(f"{key[0]} card {key[1]} is whole for {held} and shared by others")
    for key, used in card_mem.items():
        if used > CARD_MEMORY:
            problems.append(f"{key[0]} card {key[1]}: {used} of {CARD_MEMORY} memory units promised")
    over = np.flatnonzero((cpu > nodes.cpu_milli) | (mem > nodes.memory_mib) | (count > PODS_PER_NODE)
                          | (whole > nodes.gpus))
    for i in over[:5]:
        problems.append(f"{nodes.names[i]} over-committed: cpu {cpu[i]}/{nodes.cpu_milli[i]}m, memory "
                        f"{mem[i]}/{nodes.memory_mib[i]}Mi, pods {count[i]}/{PODS_PER_NODE}, gpus {whole[i]}/{nodes.gpus[i]}")
    return problems, int(count.max(initial=0))


# --- the burst ---------------------------------------------------------------------------------------

@dataclass
class BurstRun:
    mode: str
    pods: int
    bound: int
    unschedulable: int
    timeout: int
    create_seconds: float
    seconds: float
    # where the time went, from the peers' own /metrics after the burst (seconds summed over
    # calls): the extender's verbs, and kube-scheduler's scheduling algorithm (filter + score,
    # extender calls included) and whole attempts (algorithm + reserve/permit; binds run apart)
    extender_verbs: dict[str, tuple[int, float]] = field(default_factory=dict)
    scheduler: dict[str, float] = field(default_factory=dict)
    bind_retries: int = 0          # "Error scheduling pod; retrying" in kube-scheduler's log (e.g. a refused bind)
    # CPU seconds each peer used from the first create to the last pod's end (user + system, all
    # threads and processes of it): on a shared machine the burst's rate is bounded by the CPU the
    # peers together need per pod, so this says who needs how much of it
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    # the extender's share of it per process name: stowage-decide (the model, the watch, the
    # binds' API writes), stowage-http (the HTTP workers of the split layout), the master
    extender_cpu_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def pods_per_s(self) -> float:
        return self.bound / self.seconds if self.seconds else 0.0

    @property
    def cpu_seconds_per_pod(self) -> float:
        """CPU seconds all peers together needed per pod (0 when nothing was measured)."""
        return sum(self.cpu_seconds.values()) / max(self.pods, 1)

    @property
    def cores_busy(self) -> float:
        """How many cores the peers kept busy on average over the burst: their CPU seconds over
        its wall seconds. Near the machine's core count, the burst is CPU-bound: its rate is
        then about cores / (the peers' CPU per pod), whatever any one peer's latency."""
        return sum(self.cpu_seconds.values()) / self.seconds if self.seconds else 0.0

    def cpu_bound_rate(self, cores: int) -> float:
        """Pods/s the burst would reach if the peers' CPU per pod were the only bound: ``cores``
        divided by the CPU seconds all peers needed per pod (0 when nothing was measured)."""
        per_pod = self.cpu_seconds_per_pod
        return cores / per_pod if per_pod else 0.0


def burst(nodes: Nodes, pods: Pods, mode: str, n: int, seed: int, opts: RunOptions) -> BurstRun:
    """``n`` GPU pods of the trace (the first ones of this seed's arrival order) created at once
    on a fresh cluster; timed from the first create until the last one is bound or refused."""
    order = [int(j) for j in arrival_order(pods, nodes.total_gpu_milli, seed) if pods.milli[int(j)] > 0][:n]
    gpu_sched, cpu_sched = scheduler_name(), cpu_scheduler_name()
    # the floor's pods are Stowage's (the same requests, the same bytes): it only measures the hop
    body_mode = "stowage" if mode == FLOOR else mode
    bodies = [pod_body(pods, j, f"burst-{e:04d}", body_mode, gpu_sched, cpu_sched) for e, j in enumerate(order)]
    with Cluster(nodes, mode, opts) as cl:
        watch = PodWatch(cl.api, NAMESPACE)
        sched_log = cl.k8s.scheduler.log_path
        offset = sched_log.stat().st_size
        try:
            cpu0, ext0 = peer_cpu_seconds(cl)
            t0 = time.monotonic()
            with ThreadPoolExecutor(opts.threads) as ex:
                list(ex.map(lambda b: cl.api.post(f"/api/v1/namespaces/{NAMESPACE}/pods", b), bodies))
            t_created = time.monotonic() - t0
            outs = watch.wait_all([b["metadata"]["name"] for b in bodies], opts.pod_timeout)
            t_end = max(o.at for o in outs.values())
            cpu1, ext1 = peer_cpu_seconds(cl)
            verbs, sched = burst_metrics(cl)
            with sched_log.open("rb") as fh:
                fh.seek(offset)
                retries = fh.read().count(b"Error scheduling pod; retrying")
        finally:
            watch.stop()
    states = [o.state for o in outs.values()]
    return BurstRun(mode, len(bodies), states.count("bound"), states.count("unschedulable"), states.count("timeout"),
                    t_created, t_end - t0, verbs, sched, retries,
                    {k: round(cpu1[k] - cpu0[k], 3) for k in cpu1 if k in cpu0},
                    {k: round(ext1[k] - ext0[k], 3) for k in ext1 if k in ext0})


EXTENDER_PROCESS_LABEL = {DECIDER_NAME: "decision process", HTTP_WORKER_NAME: "HTTP workers",
                          "stowage": "gunicorn master"}
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcStat:
    """What one read of ``/proc/<pid>/stat`` says of a process."""

    name: str           # as ``ps -o comm`` shows it
    pgid: int           # its process group
    cpu_seconds: float  # user + system, all its threads


def proc_stat(pid: int) -> ProcStat | None:
    """The process's :class:`ProcStat`; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The name is in parentheses and may itself hold spaces or ')': the fields follow the last ')'
    fields = stat.rpartition(")")[2].split()
    # pgrp, utime, stime: fields 5, 14 and 15 of stat (the 3rd, 12th and 13th after the name)
    return ProcStat(stat[stat.find("(") + 1:stat.rfind(")")], int(fields[2]),
                    (int(fields[11]) + int(fields[12])) / _TICK)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads) from /proc; 0 when it is gone."""
    st = proc_stat(pid)
    return st.cpu_seconds if st is not None else 0.0


def group_cpu_by_name(pgid: int) -> dict[str, float]:
    """CPU seconds of every live process in process group ``pgid``, summed per process name (the
    extender: gunicorn's master, its decision process ``stowage-decide`` and its HTTP workers
    ``stowage-http``, all started in one session; see :func:`extender.split.name_process`)."""
    out: dict[str, float] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            st = proc_stat(int(d.name))
            if st is not None and st.pgid == pgid:
                out[st.name] = out.get(st.name, 0.0) + st.cpu_seconds
    return out


def peer_cpu_seconds(cl: "Cluster") -> tuple[dict[str, float], dict[str, float]]:
    """CPU seconds so far of each peer of a run: etcd, kube-apiserver, kube-scheduler, the extender
    (all its processes) and this benchmark process (the pod creates and the watch); and the
    extender's per process name (its decision process, HTTP workers, master)."""
    out: dict[str, float] = {}
    extender: dict[str, float] = {}
    for name in ("etcd", "kube-apiserver"):
        try:
            out[name] = process_cpu_seconds(int((cl.k8s.dir / f"{name}.pid").read_text()))
        except (FileNotFoundError, ValueError):
            pass
    if cl.k8s.scheduler is not None and cl.k8s.scheduler.popen is not None:
        out["kube-scheduler"] = process_cpu_seconds(cl.k8s.scheduler.popen.pid)
    if cl.extender is not None and cl.extender.proc is not None and cl.extender.proc.popen is not None:
        extender = group_cpu_by_name(cl.extender.proc.popen.pid)
        out["extender"] = sum(extender.values())
    t = os.times()
    out["benchmark"] = t.user + t.system
    return out, extender


def _metric_sums(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """``name{labels}`` -> value for the named series of a Prometheus text page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(names):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def burst_ratios(bursts: list[BurstRun], mode: str = "stowage") -> list[float]:
    """``mode`` / plain pods/s in %, one per round: the i-th burst of ``mode`` against the i-th
    plain one (the rounds run them back to back)."""
    ext = [b for b in bursts if b.mode == mode]
    plain = [b for b in bursts if b.mode == "plain"]
    return [100 * e.pods_per_s / p.pods_per_s for e, p in zip(ext, plain) if p.pods_per_s]


def burst_metrics(cl: Cluster) -> tuple[dict[str, tuple[int, float]], dict[str, float]]:
    """The extender's per-verb call counts and seconds, and kube-scheduler's time in its
    scheduling algorithm and attempts; empty where a page cannot be read (never fails a run)."""
    import re

    import requests
    verbs: dict[str, tuple[int, float]] = {}
    sched: dict[str, float] = {}
    try:
        if cl.extender is not None:
            with cl.extender.session() as sess:
                text = sess.get(cl.extender.url + "/metrics", timeout=10).text
            m = _metric_sums(text, ("stowage_extender_request_duration_seconds_sum",
                                    "stowage_extender_request_duration_seconds_count"))
            for key, v in m.items():
                verb = re.search(r'verb="([^"]+)"', key)
                if verb:
                    n, t = verbs.get(verb.group(1), (0, 0.0))
                    verbs[verb.group(1)] = (n + int(v), t) if "_count" in key else (n, t + v)
        text = requests.get(f"https://127.0.0.1:{cl.k8s.port_base + 3}/metrics", verify=False, timeout=10,
                            headers={"Authorization": cl.api.session.headers["Authorization"]}).text
        m = _metric_sums(text, ("scheduler_scheduling_algorithm_duration_seconds_sum",
                                "scheduler_scheduling_attempt_duration_seconds_sum",
                                "scheduler_scheduling_attempt_duration_seconds_count"))
        for key, v in m.items():
            name = key.split("{")[0].replace("scheduler_scheduling_", "").replace("_duration_seconds", "")
            sched[name] = sched.get(name, 0.0) + v
    except Exception as exc:  # noqa: BLE001 - the figures are an explanation, not the measurement
        log.warning("could not read the peers' metrics after the burst: %s", exc)
    return verbs, sched


@dataclass
class Reused:
    """A run of an earlier invocation (``--reuse``): its binned curve and its table row."""

    mode: str
    seed: int
    curve: np.ndarray
    row: dict


def load_reused(paths: list[Path], run_now: set[tuple[str, int]], trace: str, nodes: Nodes) -> tuple[list[Reused], dict]:
    """Every run in earlier binpack_real.json files of the same trace and cluster that this
    invocation does not run itself (a (mode, seed) in ``run_now``); the first file that has a
    (mode, seed) gives it. So seeds measured at different times (each run is a quarter of an hour
    of this machine) are shown in one table, each with the file, date and code it came from.
    A run cut at a lower --until or --limit has a shorter curve: the arrival order is the same,
    so what it has is what a longer run has at the same point."""
    out: list[Reused] = []
    files = []
    taken = set(run_now)
    for path in paths:
        doc = json.loads(Path(path).read_text())
        meta = doc.get("meta") or {}
        if meta.get("trace") != trace or meta.get("nodes") != len(nodes.names) or meta.get("gpus") != int(nodes.gpus.sum()):
            raise TraceError(f"--reuse {path}: measured on trace {meta.get('trace')} with {meta.get('nodes')} nodes, "
                             f"not {trace} with {len(nodes.names)}")
        rows = {(r["seed"], r["mode"]): r for r in doc.get("rows") or []}
        mine = []
        for r in doc.get("runs") or []:
            key = (r["mode"], r["seed"])
            if key in taken:
                continue
            taken.add(key)
            row = rows[(r["seed"], MODE_LABEL[r["mode"]])]
            mine.append(Reused(r["mode"], r["seed"], np.array([np.nan if x is None else x for x in r["curve"]], float),
                               {**row, "reused": str(path), "code": r.get("code") or row.get("code") or meta.get("code", "unknown"),
                                "measured": r.get("measured") or meta.get("date")}))
        out += mine
        files.append({"file": str(path), "date": meta.get("date"), "code": meta.get("code", "unknown"),
                      "runs": sorted(f"{r.mode} {r.seed}" for r in mine),
                      "until_arrived_pct": meta.get("until_arrived_pct"), "limit": meta.get("limit"), "jobs": meta.get("jobs")})
    return out, {"files": files, "modes": sorted({r.mode for r in out})}


class Report:
    """The tables and files of a run, rewritten after every finished replay, so that a
    measurement cut short still leaves every run it finished on disk."""

    def __init__(self, args: argparse.Namespace, nodes: Nodes, modes: list[str], t0: float,
                 reused: list[Reused] = (), reused_meta: dict | None = None) -> None:
        self.args, self.nodes, self.modes, self.t0 = args, nodes, modes, t0
        self.reused, self.reused_meta = list(reused), reused_meta
        self.outs = [Path(args.out)] + ([RESULTS_DIR] if args.save else [])
        self.code = code_version()  # the commit the runs of this invocation measure

    def write(self, runs: list[RealRun], sims: dict[int, SeedRun], bursts: list[BurstRun],
              final: bool = False) -> tuple[str, list[str]]:
        args, capacity = self.args, self.nodes.total_gpu_milli
        rows = [{**r, "code": self.code} for r in summary_rows(runs, sims, bursts, capacity)]
        rows = sorted(rows + [r.row for r in self.reused],
                      key=lambda r: (r["seed"], ROW_ORDER.index(r["mode"])))
        results = []
        if sims:
            results.append(PolicyResult(trace_name(args.trace), MODE_LABEL["simulated"],
                                        np.stack([binned(sims[s], capacity) for s in sorted(sims)]),
                                        sum(s.seconds for s in sims.values()), [s.failed for s in sims.values()]))
        for mode in MODES:
            mine = [(r.seed, binned(r.run, capacity), r.seconds_replay, r.run.failed) for r in runs if r.mode == mode]
            mine += [(r.seed, r.curve, r.row["seconds"], r.row["failed"]) for r in self.reused if r.mode == mode]
            if mine:
                mine.sort(key=lambda x: x[0])
                width = max(len(x[1]) for x in mine)
                curves = np.stack([np.pad(c, (0, width - len(c)), constant_values=np.nan) for _, c, _, _ in mine])
                results.append(PolicyResult(trace_name(args.trace), MODE_LABEL[mode], curves,
                                            sum(x[2] for x in mine), [x[3] for x in mine]))
        lines = []
        if results:
            lines.append(format_table(results, {}, f"median of seeds {sorted({r.seed for r in runs} | set(sims))}"))
            lines.append(format_per_seed(rows))
        if bursts:
            lines.append("\n== burst: GPU pods created at once on the cluster ==")
            for b in bursts:
                lines.append(f"  {MODE_LABEL[b.mode]:<18} {b.pods} pods: {b.bound} bound, {b.unschedulable} unschedulable, "
                             f"{b.timeout} no answer, in {b.seconds:.1f}s -> {b.pods_per_s:.1f} pods/s")
                spent = [f"{v} {n} calls {t:.1f}s ({1000 * t / max(n, 1):.1f} ms each)" for v, (n, t) in sorted(b.extender_verbs.items())
                         if n and v in ("filter", "prioritize", "bind")]
                if b.scheduler:
                    spent.append(f"kube-scheduler: algorithm {b.scheduler.get('algorithm_sum', 0):.1f}s, "
                                 f"attempts {b.scheduler.get('attempt_sum', 0):.1f}s over {int(b.scheduler.get('attempt_count', 0))}")
                if spent:
                    lines.append("      time spent: " + "; ".join(spent))
                if b.cpu_seconds:
                    lines.append("      CPU per pod: " + ", ".join(f"{k} {1000 * v / max(b.pods, 1):.1f} ms"
                                                            for k, v in b.cpu_seconds.items())
                                 + f"; all {1000 * b.cpu_seconds_per_pod:.1f} ms")
                    cores = os.cpu_count() or 1
                    lines.append(f"      cores busy: {b.cores_busy:.2f} of {cores}; {cores} cores / all CPU per pod = "
                                 f"{b.cpu_bound_rate(cores):.0f} pods/s (the rate if CPU were the only bound)")
                if len(b.extender_cpu_seconds) > 1:
                    lines.append("      the extender's per process: " + ", ".join(
                        f"{EXTENDER_PROCESS_LABEL.get(k, k)} {1000 * v / max(b.pods, 1):.1f} ms"
                        for k, v in sorted(b.extender_cpu_seconds.items(), key=lambda kv: -kv[1])))
                if b.bind_retries:
                    lines.append(f"      {b.bind_retries} scheduling attempts failed and were retried (kube-scheduler's log: "
                                 f"e.g. a bind refused because the card was taken by a bind in flight)")
            for mode, what in (("stowage", "extender"), (FLOOR, "do-nothing extender")):
                ratios = burst_ratios(bursts, mode)
                if len(ratios) == 1:
                    lines.append(f"  {what} / plain: {ratios[0]:.0f} %")
                elif ratios:
                    lines.append(f"  {what} / plain, {len(ratios)} rounds: median {float(np.median(ratios)):.0f} % "
                                 f"(each round: {', '.join(f'{r:.0f}' for r in ratios)} %)")
        problems = [p for r in runs for p in r.problems]
        if problems:
            lines.append(f"\nCONSISTENCY PROBLEMS ({len(problems)}):\n  " + "\n  ".join(problems[:20]))
        meta = {"trace": trace_name(args.trace), "seeds": list(args.seeds), "modes": self.modes, "limit": args.limit,
                "until_arrived_pct": args.until, "jobs": args.jobs, "complete": final,
                "node_stride": args.node_stride, "nodes": len(self.nodes.names), "gpus": int(self.nodes.gpus.sum()),
                "extender_workers": args.workers, "burst_rounds": args.burst_rounds if args.burst else 0,
                "burst_floor": bool(args.burst and args.burst_floor),
                "wall_seconds": round(time.monotonic() - self.t0, 1),
                "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.processor() or platform.platform()}",
                "kubernetes": "v1.28.7 (../shared/k8s)", "scheduler_config": "scheduler-config/scheduler-config.yaml",
                "gpu_scheduler_name": scheduler_name(), "cpu_only_scheduler_name": cpu_scheduler_name(),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "code": self.code,
                "reused": self.reused_meta}
        doc = {"meta": meta, "rows": rows,
               "bursts": [{**asdict(b), "pods_per_s": round(b.pods_per_s, 1), "cores_busy": round(b.cores_busy, 2)}
                          for b in bursts],
               "median_curves": {r.policy: [None if np.isnan(x) else round(float(x), 3) for x in r.median]
                                 for r in results},
               "problems": problems[:200],
               # each run's own binned curve: what --reuse reads back into a later run's tables
               "runs": [{"mode": r.mode, "seed": r.seed, "code": self.code, "measured": meta["date"],
                         "curve": [None if np.isnan(x) else round(float(x), 4) for x in binned(r.run, capacity)]}
                        for r in runs]
                       + [{"mode": r.mode, "seed": r.seed, "code": r.row["code"], "measured": r.row["measured"],
                           "curve": [None if np.isnan(x) else float(x) for x in r.curve],
                           "reused": True} for r in self.reused]}
        for out in self.outs:
            out.mkdir(parents=True, exist_ok=True)
            (out / "binpack_real.json").write_text(json.dumps(doc, indent=1))
            if rows:
                with (out / "binpack_real.csv").open("w", newline="") as fh:
                    w = csv.DictWriter(fh, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
                    w.writeheader()
                    w.writerows(rows)
            if final:
                lines.append(f"wrote {out / 'binpack_real.json'} and .csv")
        return "\n".join(lines), problems


_SLOT = 0
PORTS_PER_JOB = 10   # job K's control plane: --port-base + PORTS_PER_JOB*K .. +3


def _exit_on_sigterm(in_worker: bool = False) -> None:
    """SIGTERM unwinds like Ctrl-C (each run's control plane is stopped on the way out), also in a
    background job, where SIGINT is ignored.

    In the command's own process it is a KeyboardInterrupt, which :func:`main` reports in one
    line. In a pool worker it comes from the pool's terminate once the parent stops (a worker
    leaves Ctrl-C to the parent, :func:`~benchmarks.entry.worker_pool`): there it is a SystemExit,
    on which a worker process ends without a word, where any other exception gets
    multiprocessing's "Process ForkPoolWorker-N:" and a traceback. Only the first SIGTERM counts:
    a second (``kill`` of the whole process group, then the pool's terminate) would cut the
    clean-up short and leave a control plane running."""
    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if in_worker:
            raise SystemExit(128 + signum)
        raise KeyboardInterrupt(signal.Signals(signum))
    signal.signal(signal.SIGTERM, handler)


def _init_worker(slots: Any) -> None:
    """A worker's own set-up, after :func:`~benchmarks.entry.worker_pool`'s (Ctrl-C is the
    parent's): its slot (work dir and ports), and SIGTERM to unwind its replay."""
    global _SLOT
    _SLOT = slots.get()
    _exit_on_sigterm(in_worker=True)


def _task(job: tuple) -> RealRun:
    nodes, pods, mode, seed, opts, limit, until = job
    mine = RunOptions(**{**asdict(opts), "slot": _SLOT, "work_dir": opts.work_dir / f"slot{_SLOT}",
                         "port_base": opts.port_base + PORTS_PER_JOB * _SLOT})
    return replay_real(nodes, pods, mode, seed, mine, limit=limit, until_pct=until)


def run_tasks(nodes: Nodes, pods: Pods, tasks: list[tuple[str, int]], opts: RunOptions, limit: int | None,
              until: float | None, jobs: int) -> Iterator[RealRun]:
    """The (mode, seed) replays, ``jobs`` at a time, each on its own control plane (work dir
    slotK, ports port_base + 10*K); yields each run as it finishes."""
    if jobs <= 1 or len(tasks) <= 1:
        for mode, seed in tasks:
            yield replay_real(nodes, pods, mode, seed, opts, limit=limit, until_pct=until)
        return
    slots = mp.get_context("fork").Queue()
    for k in range(jobs):
        slots.put(k)
    with worker_pool(jobs, initializer=_init_worker, initargs=(slots,)) as pool:
        yield from pool.imap_unordered(_task, [(nodes, pods, m, s, opts, limit, until) for m, s in tasks])



# --- the command -------------------------------------------------------------------------------------

def _burst_to_time(args: argparse.Namespace) -> str | None:
    """``--no-replay`` leaves only the burst: refused while parsing when there is none (after
    ``--quick`` filled in what the user did not say), rather than once the run is set up."""
    if args.no_replay and not settle_quick(argparse.Namespace(**vars(args))).burst:
        return "--no-replay leaves only the burst, and there is none: give --burst N (e.g. --burst 300)"
    return None


def _ports_fit(args: argparse.Namespace) -> str | None:
    """Job K listens on --port-base + PORTS_PER_JOB*K .. +3: refused while parsing when the last
    job's ports pass 65535 (its etcd failed to bind minutes into the run, the others' results lost)."""
    last = args.port_base + PORTS_PER_JOB * (args.jobs - 1) + 3
    if last > 65535:
        most = (65535 - 3 - args.port_base) // PORTS_PER_JOB + 1
        return (f"--jobs {args.jobs} from --port-base {args.port_base} needs ports up to {last}, past 65535 "
                f"(each job takes {PORTS_PER_JOB}): give at most --jobs {most}, or a lower --port-base")
    return None


def build_parser() -> argparse.ArgumentParser:
    p = CheckedParser(
        prog=PROG,
        formatter_class=HelpFormatter, checks=[_burst_to_time, _ports_fit],
        description="Replay an openb trace through a real kube-apiserver + kube-scheduler v1.28.7 "
                    "(../shared/k8s), with the extender as deployed and with plain kube-scheduler, "
                    "beside the simulated replay of the same seeds; optionally time a burst of GPU pods.",
        epilog="Each run starts a fresh control plane (etcd, kube-apiserver) on 127.0.0.1 from --port-base\n"
               "(N..N+3) in --work-dir, creates the trace's nodes, then creates the pods one at a time.\n"
               "A full seed of the default trace is ~10,800 pods; see docs/binpack.md for wall times.\n\n"
               "examples:\n"
               "  python -m benchmarks.binpack.real --quick                 # smoke: ~200 nodes, 400 pods, seed 42\n"
               "  python -m benchmarks.binpack.real --seeds 42,43,44 --burst 300 --save\n"
               "  python -m benchmarks.binpack.real --no-replay --burst 300 --burst-rounds 3   # the ratio, 3 rounds\n"
               "  python -m benchmarks.binpack.real --seeds 42 --limit 2000 --modes stowage")
    p.add_argument("--trace", default=DEFAULT_TRACE, help="trace name (default, gpushare40, ...) or CSV path")
    p.add_argument("--seeds", type=parse_seeds, default=None, help="42,43,44 (default), 42-44, 42 (that seed) or a count (3 = 42..44)")
    p.add_argument("--modes", type=name_list(MODES, "mode"), default=",".join(MODES),
                   help="comma list of stowage (kube-scheduler + extender) and plain (kube-scheduler alone)")
    p.add_argument("--limit", type=whole_number(1, MAX_PODS), default=None, help="only the first N arriving pods of each seed (smoke runs)")
    p.add_argument("--until", type=positive_number, default=None, metavar="PCT",
                   help="stop each seed once the arrived GPU workload would pass PCT %% of capacity "
                        "(e.g. 101 for the figures up to 100 %%; default: the whole 130 %% protocol)")
    p.add_argument("--jobs", type=whole_number(1, MAX_JOBS), default=1,
                   help="replays run side by side, each on its own control plane (ports +10 per job)")
    p.add_argument("--node-stride", type=whole_number(1, MAX_NODES), default=None, help="every K-th node of the trace (a smaller cluster of the same mix)")
    p.add_argument("--burst", type=whole_number(0, MAX_PODS), default=None, metavar="N",
                   help="also time N GPU pods created at once, with the extender and plain (0: no burst)")
    p.add_argument("--reuse", action="append", default=[], metavar="JSON",
                   help="show the runs (mode, seed) not run now from an earlier binpack_real.json of the same "
                        "trace and cluster in the tables, e.g. plain rows or other seeds measured before; "
                        "repeatable, the first file that has a run gives it")
    p.add_argument("--burst-rounds", type=whole_number(1, 1000), default=1, metavar="K",
                   help="time the burst K times in each mode, alternating which goes first, and report the "
                        "median ratio (one burst's ratio moves by 10 points from run to run on a shared machine)")
    p.add_argument("--burst-floor", action="store_true",
                   help="also time the burst with the do-nothing extender (benchmarks/latency/floor.py: no model, "
                        "filter keeps the first node, bind creates the Binding): the ratio any extender served "
                        "this way could reach")
    p.add_argument("--no-replay", action="store_true", help="only the burst")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: seed 42, every 6th node, the first 400 pods, a burst of 100 "
                        "(a flag given beside it stands: --quick --burst 0 times no burst)")
    p.add_argument("--workers", type=whole_number(1, 64), default=2, help="the extender's --workers (scheduler.yaml runs 2)")
    p.add_argument("--pod-timeout", type=positive_number, default=120.0, help="seconds to wait for one pod's outcome")
    # a string default goes through the type, so a bad $STOWAGE_BENCH_PORT_BASE is refused by name
    p.add_argument("--port-base", type=whole_number(1, 65535 - 3), default=os.environ.get("STOWAGE_BENCH_PORT_BASE", "23950"),
                   help="first of 4 loopback ports for etcd/kube-apiserver/kube-scheduler (default $STOWAGE_BENCH_PORT_BASE or 23950)")
    p.add_argument("--work-dir", default=None, help="control plane files and logs (default: a temporary folder, kept on failure)")
    p.add_argument("--data-dir", default=None, help="folder with the openb CSVs (default ../shared/openb, or $STOWAGE_OPENB)")
    p.add_argument("--out", default="results/binpack_real", help="output folder (binpack_real.json, binpack_real.csv)")
    p.add_argument("--save", action="store_true", help="also write the results to benchmarks/results/")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def summary_rows(runs: list[RealRun], sims: dict[int, SeedRun], bursts: list[BurstRun], capacity: int) -> list[dict]:
    rows = []
    for seed in sorted({r.seed for r in runs} | set(sims)):
        entries: list[tuple[str, SeedRun, RealRun | None]] = []
        if seed in sims:
            entries.append(("simulated", sims[seed], None))
        entries += [(r.mode, r.run, r) for r in runs if r.seed == seed]
        for mode, run, real in entries:
            curve = binned(run, capacity)
            row = {"seed": seed, "mode": MODE_LABEL[mode]}
            for pct in TABLE_POINTS:
                row[f"alloc_at_{pct}"] = None if pct >= len(curve) or np.isnan(curve[pct]) else round(float(curve[pct]), 3)
            row.update({"pods": len(run.arrived), "failed": run.failed,
                        "seconds": round(run.seconds, 1)})
            if real is not None:
                row.update({"seconds_with_setup": round(real.seconds_total, 1), "pods_per_s": round(real.pods_per_s, 1),
                            "unschedulable": real.outcomes.get("unschedulable", 0),
                            "timeout": real.outcomes.get("timeout", 0), "late_binds": real.late_binds,
                            "problems": len(real.problems), "max_pods_on_a_node": real.max_pods_on_a_node})
            rows.append(row)
    return rows


def format_per_seed(rows: list[dict]) -> str:
    head = f"{'seed':>4}  {'mode':<18}" + "".join(f"{'@' + str(p) + '%':>8}" for p in TABLE_POINTS) \
        + f"{'pods':>7}{'failed':>7}  {'checks':<22}{'time':>9}{'pods/s':>8}"
    lines = ["", "== per seed: GPU allocation % at arrived % ==", head]
    for r in rows:
        cells = "".join(f"{'-' if r[f'alloc_at_{p}'] is None else format(r[f'alloc_at_{p}'], '.2f'):>8}" for p in TABLE_POINTS)
        checks = "" if "problems" not in r else ("ok" if r["problems"] == 0 and r["late_binds"] == 0 and r["timeout"] == 0
                                                else f"{r['problems']} bad, {r['late_binds']} late, {r['timeout']} t/o")
        lines.append(f"{r['seed']:>4}  {r['mode']:<18}{cells}{r['pods']:>7}{r['failed']:>7}  {checks:<22}"
                     f"{r['seconds']:>8.1f}s{r.get('pods_per_s', ''):>8}")
    return "\n".join(lines)


def settle_quick(args: argparse.Namespace) -> argparse.Namespace:
    """Fill in what the user left unsaid: ``--quick``'s smoke run (seed 42, every 6th node, the
    first 400 pods, a burst of 100) or the full protocol (seeds 42-44, every node, no burst).
    A value given on the command line always stands, so ``--quick --burst 0`` times no burst."""
    smoke = args.quick
    if args.seeds is None:
        args.seeds = (42,) if smoke else (42, 43, 44)
    if args.node_stride is None:
        args.node_stride = 6 if smoke else 1
    if args.limit is None and smoke:
        args.limit = 400
    if args.burst is None:
        args.burst = 100 if smoke else 0
    return args


def load_inputs(args: argparse.Namespace) -> tuple[Nodes, Pods]:
    """The cluster and pods of the run: what the simulated benchmark replays for the same
    ``--trace`` and ``--node-stride`` (generated variants such as ``spec33`` included), loaded by
    the same function, so the real rows check exactly the simulated ones."""
    return load_replay(str(data_dir(args.data_dir)), args.trace, args.node_stride or 1)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _exit_on_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    # The simulated replay binds ~10,000 pods through the extender's service in this process: its
    # one line per bind would bury this tool's own progress (the real extender runs at warning too).
    logging.getLogger("stowage.extender").setLevel(logging.WARNING)
    settle_quick(args)
    modes = args.modes
    try:                                  # a wrong trace name is said before any peer is needed
        nodes, pods = load_inputs(args)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missing = missing_for_control_plane()
    if missing:
        print("error: the real control plane cannot run here: " + "; ".join(missing)
              + " (see ../shared/k8s/README.md and docs/testing.md)", file=sys.stderr)
        return 2
    own_dir = args.work_dir is None
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="stowage-binpack-real-"))
    opts = RunOptions(work_dir=work, port_base=args.port_base, workers=args.workers, pod_timeout=args.pod_timeout,
                      progress=not args.no_progress)
    log.info("trace %s: %d nodes (%d GPUs), seeds %s, modes %s, limit %s; control plane in %s (ports %d-%d)",
             trace_name(args.trace), len(nodes.names), int(nodes.gpus.sum()), list(args.seeds), modes, args.limit,
             work, args.port_base, args.port_base + 3)
    t_all = time.monotonic()
    runs: list[RealRun] = []
    sims: dict[int, SeedRun] = {}
    bursts: list[BurstRun] = []
    capacity = nodes.total_gpu_milli
    reused, reused_meta = [], None
    if args.reuse:
        try:
            run_now = set() if args.no_replay else {(m, s) for m in modes for s in args.seeds}
            reused, reused_meta = load_reused([Path(p) for p in args.reuse], run_now, trace_name(args.trace), nodes)
        except (OSError, ValueError, KeyError, TraceError) as exc:
            print(f"error: --reuse {args.reuse}: {exc}", file=sys.stderr)
            return 2
        for f in reused_meta["files"]:
            log.info("reusing %s from %s (%s, code %s)", ", ".join(f["runs"]) or "nothing", f["file"], f["date"], f["code"])
    report = Report(args, nodes, modes, t_all, reused, reused_meta)
    try:
        if args.burst:
            # first and alone: a burst timed beside replays would measure the replays too
            burst_modes = modes + [FLOOR] if args.burst_floor else modes
            for rnd in range(args.burst_rounds):
                # Rounds alternate which mode goes first, so that a machine slowly getting busier
                # or quieter does not favour one of them.
                for mode in (burst_modes if rnd % 2 == 0 else burst_modes[::-1]):
                    b = burst(nodes, pods, mode, args.burst, args.seeds[0], opts)
                    bursts.append(b)
                    log.info("burst %s (round %d of %d): %d pods, %d bound, %d unschedulable, %d no answer in %.1fs "
                             "(created in %.1fs): %.1f pods/s", mode, rnd + 1, args.burst_rounds, b.pods, b.bound,
                             b.unschedulable, b.timeout, b.seconds, b.create_seconds, b.pods_per_s)
                report.write(runs, sims, bursts)
        if not args.no_replay:
            # the simulated replay of every seed in the tables, reused real runs' seeds too: it
            # is cheap, and the real-vs-simulated comparison is per seed at this code
            for seed in sorted(set(args.seeds) | {r.seed for r in reused}):
                n = len(arrivals(pods, capacity, seed, args.limit, args.until))
                sims[seed] = replay(nodes, pods, "stowage", seed, limit=n)
                sim_at = binned(sims[seed], capacity)
                log.info("seed %d simulated: %.2f %% allocated at arrived 100 %% (%d pods, %.1fs)", seed,
                         sim_at[100] if len(sim_at) > 100 else float("nan"), n, sims[seed].seconds)
            tasks = [(mode, seed) for mode in modes for seed in args.seeds]
            for r in run_tasks(nodes, pods, tasks, opts, args.limit, args.until, args.jobs):
                runs.append(r)
                at = binned(r.run, capacity)
                log.info("seed %d %s: %.2f %% allocated at arrived 100 %%, %d pods, %d failed (%s), %.0fs "
                         "(%.1f pods/s; %.0fs with setup); checks: %s", r.seed, r.mode,
                         at[100] if len(at) > 100 else float("nan"), len(r.run.arrived), r.run.failed,
                         ", ".join(f"{k} {v}" for k, v in r.outcomes.items() if v), r.seconds_replay,
                         r.pods_per_s, r.seconds_total,
                         "ok" if not r.problems and not r.late_binds else f"{r.problems[:5]} late binds {r.late_binds}")
                for f in r.first_failures[:3]:
                    log.info("  e.g. failed %s", f)
                report.write(runs, sims, bursts)  # after every run: a cut-short measurement keeps what it has
    except KeyboardInterrupt as exc:   # Ctrl-C, or SIGTERM (_exit_on_sigterm); each replay has stopped its control plane
        wrote = (f"the finished runs are in {', '.join(map(str, report.outs))}" if runs or bursts
                 else "no results written (no run had finished)")
        how, status = interruption(exc)
        print(f"\n{PROG}: interrupted ({how}); {wrote}", file=sys.stderr, flush=True)
        return status
    except Exception:
        log.exception("the run failed; logs of the peers are in %s", work)
        return 1
    text, problems = report.write(runs, sims, bursts, final=True)
    print(text)
    if own_dir and not problems:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    run_command(main, PROG, NOT_WRITTEN)
