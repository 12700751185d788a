"""The elastic scenario: workload derivation from trace times, the simulation's counters on tiny
clusters worked out by hand, and a --quick smoke run of the CLI."""
from __future__ import annotations

import csv
import json
import re

from pathlib import Path

import numpy as np
import pytest
import yaml

from benchmarks.binpack.trace import Nodes, Pods
from benchmarks.elastic.cli import default_policies, main
from benchmarks.elastic.sim import HpaSettings, run
from benchmarks.elastic.workload import Deployment, Scenario, build
from packing.registry import POLICY_PLACER
from stowage.resources import GpuRequest

from shared_paths import SHARED

ADAPTER = Path(__file__).resolve().parent.parent / "scheduler-config" / "autoscaling" / "prometheus-adapter-config.yaml"


def nodes(n: int, gpus: int = 4) -> Nodes:
    return Nodes(names=tuple(f"n{i}" for i in range(n)), cpu_milli=np.full(n, 64000), memory_mib=np.full(n, 262144),
                 gpus=np.full(n, gpus), model=("V100M16",) * n)


def pods(rows: list[tuple[int, int, str]]) -> Pods:
    """rows of (num_gpu, gpu_milli, gpu_spec)"""
    return Pods(name="t", cpu_milli=np.full(len(rows), 1000), memory_mib=np.full(len(rows), 1024),
                num_gpu=np.array([r[0] for r in rows]), gpu_milli=np.array([r[1] for r in rows]),
                gpu_spec=tuple(r[2] for r in rows))


def test_build_derives_demand_jobs_and_scale_from_times():
    p = pods([(1, 1000, ""), (1, 1000, ""), (1, 500, ""), (2, 1000, ""), (1, 1000, "")])
    created = np.array([0, 120, 0, 60, 130])
    deleted = np.array([600, 300, 600, 180, 170])   # the last pod lives between two syncs
    sc = build(nodes(2), p, created, deleted, days=600 / 86400, end_day=600 / 86400, step_s=60,
               deployments=1, peak=0.9, seed=1)
    assert sc.steps == 10 and sc.t0 == 0 and sc.dropped_short == 1
    # peak demand 4500 milli at step 2 (1 + 1 whole, a half share, a 2-GPU pod): 0.9 * 8000 / 4500
    assert sc.scale == pytest.approx(1.6)
    (dep,) = sc.deployments
    assert dep.req.gpus == 1 and dep.trace_pods == 2
    assert np.allclose(dep.demand, 1.6 * np.array([1, 1, 2, 2, 2, 1, 1, 1, 1, 1]))
    # the share pod and the 2-GPU pod are jobs, each copied 1 or 2 times (scale 1.6)
    starts = sorted({(j.start, j.end, j.req.gpus) for j in sc.jobs})
    assert starts == [(0, 10, 0), (1, 3, 2)]
    assert 2 <= len(sc.jobs) <= 4


def scenario(demand: list[float], req: GpuRequest = GpuRequest(gpus=1)) -> Scenario:
    dep = Deployment(name="svc", req=req, models=(), demand=np.array(demand, float), trace_pods=1)
    return Scenario(deployments=(dep,), jobs=(), t0=0, step_s=60, steps=len(demand), scale=1.0,
                    capacity_milli=4000, dropped_short=0)


def test_scale_out_without_room_stays_pending_and_is_scaled_away_first():
    # 1 node x 4 GPUs. Demand 6 replicas: the HPA grows 1 -> 2 -> 4 -> 6 (per-pod metric capped
    # at 100 % against a 60 % target); the last 2 find no card; demand drops and the scale-in
    # removes those 2 Pending replicas before any running one.
    # (the instant metric, metric_window_s=0: the arithmetic below; the adapter's 2-minute
    # average is worked out in test_the_hpa_reads_the_adapters_two_minute_average_...)
    sc = scenario([1, 6, 6, 6, 1, 1, 1, 1, 1, 1])
    r = run(sc, nodes(1), "most-allocated", 42, HpaSettings(scale_down_window_s=0, metric_window_s=0))
    assert (r.scale_outs, r.scale_outs_placed, r.scale_outs_pending) == (3, 2, 1)
    assert (r.replicas_created, r.replicas_immediate, r.replicas_delayed, r.replicas_never) == (5, 3, 0, 2)
    assert r.pending_replica_hours == pytest.approx(2 * 60 / 3600)
    assert r.scale_ins == 1


def test_scale_down_waits_for_the_stabilisation_window():
    sc = scenario([1, 6, 6, 6, 1, 1, 1, 1, 1, 1])
    r = run(sc, nodes(1), "most-allocated", 42, HpaSettings(scale_down_window_s=300, metric_window_s=0))
    # the 2 Pending replicas live from step 3 until the recommendation of step 3 (t=180 s)
    # leaves the 300 s window at step 8 (t=480 s): steps 3..7
    assert r.pending_replica_hours == pytest.approx(5 * 2 * 60 / 3600)
    assert r.replicas_never == 2


def test_packing_leaves_whole_nodes_empty_for_the_autoscaler():
    sc = scenario([2] * 30)
    packed = run(sc, nodes(3), "most-allocated", 42, unneeded_s=600)
    spread = run(sc, nodes(3), "least-allocated", 42, unneeded_s=600)
    # empty from t=0, releasable from t=600 s: steps 10..29 = 20 steps of 60 s per empty node
    assert packed.releasable_node_hours == pytest.approx(2 * 20 * 60 / 3600)
    assert spread.releasable_node_hours == pytest.approx(1 * 20 * 60 / 3600)
    assert packed.gpu_node_hours == pytest.approx(3 * 30 * 60 / 3600)
    assert packed.scale_outs == spread.scale_outs == 0   # demand met by the initial replicas


def test_releasable_gpu_hours_weigh_an_empty_node_by_its_gpus():
    # A 2-GPU and an 8-GPU node, 2 one-GPU replicas. Both policies leave one node empty (the same
    # node-hours), but packing empties the 8-GPU node and spreading the 2-GPU one.
    two_sizes = Nodes(names=("small", "big"), cpu_milli=np.full(2, 64000), memory_mib=np.full(2, 262144),
                      gpus=np.array([2, 8]), model=("V100M16",) * 2)
    dep = Deployment(name="svc", req=GpuRequest(gpus=1), models=(), demand=np.full(30, 2.0), trace_pods=1)
    sc = Scenario(deployments=(dep,), jobs=(), t0=0, step_s=60, steps=30, scale=1.0, capacity_milli=10000,
                  dropped_short=0)
    packed = run(sc, two_sizes, "most-allocated", 42, unneeded_s=600)
    spread = run(sc, two_sizes, "least-allocated", 42, unneeded_s=600)
    hours = 20 * 60 / 3600                  # releasable from t=600 s: steps 10..29
    assert packed.releasable_node_hours == spread.releasable_node_hours == pytest.approx(hours)
    assert packed.releasable_gpu_hours == pytest.approx(8 * hours)
    assert spread.releasable_gpu_hours == pytest.approx(2 * hours)
    assert packed.gpu_hours == pytest.approx(10 * 30 * 60 / 3600)
    assert packed.summary()["releasable_pct_of_gpu_hours"] == pytest.approx(100 * 8 * 20 / (10 * 30), abs=0.01)


def test_default_policies_put_the_pack_default_first():
    pols = default_policies()
    assert pols[0] == POLICY_PLACER["pack"]
    assert {"most-allocated", "least-allocated"} <= set(pols)


@pytest.mark.skipif(not (SHARED / "openb" / "openb_pod_list_default.csv").exists(), reason="needs ../shared/openb")
def test_quick_smoke_run_writes_table_csv_json_png(tmp_path, capsys):
    out = tmp_path / "elastic"
    rc = main(["--quick", "--policies", "most-allocated,least-allocated", "--jobs", "1", "--out", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "scale-outs found room" in text and "releasable node-h" in text and "releasable GPU-h" in text
    rows = list(csv.DictReader((out / "elastic.csv").open()))
    assert [r["policy"] for r in rows] == ["most-allocated", "least-allocated"]
    for r in rows:
        assert int(r["scale_outs"]) == int(r["scale_outs_found_room"]) + int(r["scale_outs_stayed_pending"]) > 0
        assert 0 <= float(r["releasable_gpu_hours"]) and 0 <= float(r["releasable_pct_of_gpu_hours"]) <= 100
        assert int(r["replicas_created"]) == (int(r["replicas_placed_at_once"]) + int(r["replicas_placed_later"])
                                              + int(r["replicas_never_placed"]) + int(r["replicas_pending_at_end"]))
    doc = json.loads((out / "elastic.json").read_text())
    assert doc["meta"]["deployments"] == 8 and len(doc["results"]) == 2
    assert all("releasable_gpu_hours" in res for res in doc["results"])
    assert (out / "elastic.png").stat().st_size > 10_000


def test_missing_trace_and_bad_arguments_are_clear(tmp_path, capsys):
    assert main(["--quick", "--data-dir", str(tmp_path), "--policies", "most-allocated"]) == 1
    assert "trace file not found" in capsys.readouterr().err
    for argv, said in ((["--quick", "--policies", "nope"], "argument --policies: unknown policy 'nope'"),
                       (["--quick", "--days", "0"], "argument --days: must be a number above 0")):
        with pytest.raises(SystemExit) as exc:   # refused while parsing
            main(argv)
        assert exc.value.code == 2 and said in capsys.readouterr().err


def test_jobs_wait_in_the_queue_and_leave_at_their_deletion_time():
    from benchmarks.elastic.workload import Job
    dep = Deployment(name="svc", req=GpuRequest(gpus=1), models=(), demand=np.full(12, 2.0), trace_pods=1)
    jobs = (Job(req=GpuRequest(gpus=8), models=(), start=1, end=6),     # never fits a 4-GPU node
            Job(req=GpuRequest(gpus=2), models=(), start=2, end=12),    # fits at once
            Job(req=GpuRequest(gpus=2), models=(), start=3, end=12))    # room left beside the replicas
    sc = Scenario(deployments=(dep,), jobs=jobs, t0=0, step_s=60, steps=12, scale=1.0, capacity_milli=8000,
                  dropped_short=0)
    r = run(sc, nodes(2), "most-allocated", 42, timeline_every=1)
    assert (r.jobs, r.jobs_placed, r.jobs_never) == (3, 2, 1)
    assert r.timeline["pending_jobs"] == [0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    assert r.job_wait_s == [0, 0]


def test_each_pod_is_learned_once_as_the_extender_learns_it(monkeypatch):
    """The simulation places through the extender's service, so its placer learns what the
    live extender's does: every pod the first time the service sees it
    (``ExtenderService.pod_info``/``learn_pod``), with its model list — CPU-only pods too, as
    the service learns every pod it can parse — and Pending pods retried step after step, or
    waiting behind a queue head that does not fit, never again. (The simulation once observed
    GPU pods only, without their model lists: it knew less than the extender.)"""
    from benchmarks.elastic import sim
    from benchmarks.elastic.workload import Job

    seen: list[GpuRequest] = []
    real_get = sim.get_placer

    def counting(name):
        placer = real_get(name)
        inner = placer.observe

        def observe(req, models=()):
            seen.append(req)
            inner(req, models)
        placer.observe = observe
        return placer

    monkeypatch.setattr(sim, "get_placer", counting)
    dep = Deployment(name="svc", req=GpuRequest(gpus=1), models=(), demand=np.array([1, 6, 6, 6, 6, 6, 6, 6, 1, 1], float),
                     trace_pods=1)
    jobs = (Job(req=GpuRequest(gpus=8), models=(), start=1, end=8),           # Pending 7 steps, never fits
            Job(req=GpuRequest(gpus=8), models=(), start=1, end=9),           # behind it in the same queue
            Job(req=GpuRequest(cpu_milli=500), models=(), start=2, end=9))    # CPU-only: learned once too
    sc = Scenario(deployments=(dep,), jobs=jobs, t0=0, step_s=60, steps=10, scale=1.0, capacity_milli=4000,
                  dropped_short=0)
    r = run(sc, nodes(1), "stowage", 42, HpaSettings(scale_down_window_s=0))
    assert r.replicas_delayed + r.replicas_never > 0 and r.pending_replica_hours > 0   # pods were retried
    pods = 1 + r.replicas_created + 3      # the initial replica, every scale-out replica, the three jobs
    assert len(seen) == pods
    assert sum(req.gpus == 8 for req in seen) == 2
    assert sum(not req.is_gpu for req in seen) == 1


def test_stowage_switches_to_churn_mode_when_a_gpu_pod_leaves(monkeypatch):
    from benchmarks.elastic import sim
    from benchmarks.elastic.workload import Job

    made = []
    real_get = sim.get_placer
    monkeypatch.setattr(sim, "get_placer", lambda name: made.append(real_get(name)) or made[-1])
    steady = scenario([2] * 6)
    run(steady, nodes(2), "stowage", 42)
    assert not made[-1].churn                       # nothing left: the static behaviour
    jobs = (Job(req=GpuRequest(gpus=2), models=(), start=1, end=3),)
    leaving = Scenario(deployments=steady.deployments, jobs=jobs, t0=0, step_s=60, steps=6, scale=1.0,
                       capacity_milli=8000, dropped_short=0)
    run(leaving, nodes(2), "stowage", 42)
    assert made[-1].churn


def test_pods_are_learned_when_created_before_any_of_them_is_placed(monkeypatch):
    """The live extender learns a pending pod when its watch shows it (``on_pod_seen`` =
    ``learn_pod``), long before kube-scheduler, working through a burst at tens of pods per
    second, reaches it. So in the simulation every pod created in a step (the first step's
    replicas of every deployment, the jobs that arrive, a scale-out) is learned before the
    first pod of that step is placed. (It once learned a pod at its first scheduling attempt:
    on the first step a deployment that may use any GPU was placed before the placer had seen
    the T4-only deployments created with it, and took the T4 cards they needed.)"""
    from benchmarks.elastic import sim
    from benchmarks.elastic.workload import Job

    log: list[tuple[str, int]] = []
    real_get, real_schedule = sim.get_placer, sim.schedule

    def counting(name):
        placer = real_get(name)
        inner = placer.observe

        def observe(req, models=()):
            log.append(("learn", 0))
            inner(req, models)
        placer.observe = observe
        return placer

    def scheduling(service, pod, names, tie=None, refusals=None):
        log.append(("place", 0))
        return real_schedule(service, pod, names, tie, refusals)

    monkeypatch.setattr(sim, "get_placer", counting)
    monkeypatch.setattr(sim, "schedule", scheduling)
    a = Deployment(name="any", req=GpuRequest(gpus=1), models=(), demand=np.array([3, 3, 3], float), trace_pods=1)
    b = Deployment(name="only-t4", req=GpuRequest(gpus=1), models=("T4",), demand=np.array([2, 2, 2], float),
                   trace_pods=1)
    jobs = (Job(req=GpuRequest(gpus=0, core_milli=500, mem_mib=500), models=(), start=0, end=3),
            Job(req=GpuRequest(gpus=2), models=(), start=2, end=3))
    sc = Scenario(deployments=(a, b), jobs=jobs, t0=0, step_s=60, steps=3, scale=1.0, capacity_milli=16000,
                  dropped_short=0)
    run(sc, nodes(4), "stowage", 42, HpaSettings(scale_down_window_s=0))
    kinds = [k for k, _ in log]
    first_place = kinds.index("place")
    assert kinds[:first_place] == ["learn"] * 6          # 3 + 2 replicas and the first job
    assert kinds.count("learn") == 7                      # the later job once, when it arrived
    assert kinds.index("learn", first_place) < len(kinds) - 1 and kinds[-1] == "place"


def test_history_is_the_pods_that_came_and_went_before_the_window():
    """``Scenario.history``: the trace pods created and deleted before the window starts, in
    creation order, each ``scale`` times (2 here: the window's peak, 1,250 milli at 700 s, is
    scaled to 0.625 of the 4 GPUs); none of the window's pods."""
    p = pods([(1, 1000, "T4"), (2, 1000, ""), (1, 500, "P100"), (1, 1000, ""), (1, 250, "")])
    created = np.array([50, 10, 30, 700, 650])
    deleted = np.array([100, 90, 610, 900, 1000])     # the P100 share is still running at t0 = 600
    sc = build(nodes(1, gpus=4), p, created, deleted, days=600 / 86400, end_day=1200 / 86400, step_s=60,
               deployments=1, peak=0.625, seed=1)
    assert sc.t0 == 600 and sc.scale == pytest.approx(2.0)
    assert [(r.gpus, models) for r, models in sc.history] == [(2, ()), (2, ()), (1, ("T4",)), (1, ("T4",))]
    assert all(j.req.gpus != 2 for j in sc.jobs)          # the 2-GPU pod is history, not a job


def test_learn_before_teaches_the_placer_the_history_before_the_first_step(monkeypatch):
    """With ``learn_before`` the service learns every history pod (through ``learn_pod``, as
    the watch of an extender that ran before the window would have), before any pod of the
    window is placed; without it, none."""
    from benchmarks.elastic import sim

    log: list[str] = []
    real_get, real_schedule = sim.get_placer, sim.schedule

    def counting(name):
        placer = real_get(name)
        inner = placer.observe

        def observe(req, models=()):
            log.append(f"learn {req.gpus} {'|'.join(models)}")
            inner(req, models)
        placer.observe = observe
        return placer

    def scheduling(service, pod, names, tie=None, refusals=None):
        log.append("place")
        return real_schedule(service, pod, names, tie, refusals)

    monkeypatch.setattr(sim, "get_placer", counting)
    monkeypatch.setattr(sim, "schedule", scheduling)
    history = ((GpuRequest(gpus=4), ("T4",)), (GpuRequest(gpus=2), ()))
    base = scenario([1, 1, 1])
    sc = Scenario(deployments=base.deployments, jobs=(), t0=0, step_s=60, steps=3, scale=1.0, capacity_milli=4000,
                  dropped_short=0, history=history)
    run(sc, nodes(1), "stowage", 42, learn_before=True)
    assert log[:3] == ["learn 4 T4", "learn 2 ", "learn 1 "] and log[3] == "place"
    log.clear()
    run(sc, nodes(1), "stowage", 42)
    assert log[0] == "learn 1 " and not any(e.startswith(("learn 4", "learn 2")) for e in log)


def test_a_restart_with_the_kept_past_learns_what_the_running_extender_had(tmp_path, capsys):
    """``--restart-at``: the extender is replaced half-way through the window. With the departed
    pods' past (the product's ConfigMap, here its document) the new one ends the window with the
    learned workload the uninterrupted one has (the same pods learned, the same class counts,
    the same departed pods kept); without it (``--restart-lose-past``) it has learned only the
    pods that existed at the restart and since."""
    from benchmarks.elastic.cli import main

    figures: dict[str, list] = {}

    def learned(*extra: str) -> dict:
        out = tmp_path / "-".join(extra or ("plain",))
        assert main(["--quick", "--policies", "stowage", "--jobs", "1", "--out", str(out), *extra]) == 0
        with open(out / "elastic.csv") as f:
            figures[" ".join(extra)] = [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(f)]
        return json.loads((out / "elastic.json").read_text())["learned"]["stowage/42"]

    plain = learned()
    kept = learned("--restart-at", "0.5")
    lost = learned("--restart-at", "0.5", "--restart-lose-past")
    assert plain["departedPods"] > 0 and plain["pods"] > plain["departedPods"]
    assert kept == plain
    assert figures["--restart-at 0.5"] == figures[""]      # every figure: the restart is invisible
    assert lost["pods"] < plain["pods"] and lost["workload"] != plain["workload"]
    assert "restarts at day 0.5 with the departed pods' past" in capsys.readouterr().out
    for argv, said in ((["--quick", "--restart-lose-past"], "--restart-lose-past needs --restart-at"),
                       (["--quick", "--restart-at", "5"], "--restart-at must lie inside the window (0 to 1 days)")):
        with pytest.raises(SystemExit) as exc:   # refused while parsing; 5 is past the quick run's 1-day window
            main(argv)
        assert exc.value.code == 2 and said in capsys.readouterr().err


def test_the_hpa_reads_the_adapters_two_minute_average_not_the_instant_load():
    """The shipped adapter rule serves avg_over_time(...[2m]): at a sync the HPA sees the mean
    of each replica's last two minutes, so a step in load is answered in two syncs and
    overshoots, as on a cluster. Worked by hand (target 60 %, one-minute syncs, 2 nodes x 4
    GPUs, demand 2 -> 4 replicas at step 2):

    - instant (0, and a 60 s window, which holds one sync's sample): step 2 reads 100 % on both
      replicas, asks ceil(2 x 100/60) = 4; step 3 reads 60 % on 4: done. One scale-out of 2.
    - 120 s: step 2 reads (60 + 100)/2 = 80 % each, asks ceil(160/60) = 3; step 3 reads 90 %
      on the two old replicas and 80 % on the new one, asks ceil(260/60) = 5; step 4 reads
      64 + 64 + 64 + 48 + 48 = 288 against 300 (within tolerance); step 5 reads 48 % on all
      five, asks 4: one scale-in. Before, the simulation gave the HPA the instant load, which
      no cluster's metric pipeline gives it."""
    sc = scenario([2, 2, 4, 4, 4, 4, 4, 4])
    for window in (0.0, 60.0):
        r = run(sc, nodes(2), "most-allocated", 42, HpaSettings(scale_down_window_s=0, metric_window_s=window))
        assert (r.scale_outs, r.replicas_created, r.scale_ins) == (1, 2, 0), window
    r = run(sc, nodes(2), "most-allocated", 42, HpaSettings(scale_down_window_s=0, metric_window_s=120))
    assert (r.scale_outs, r.replicas_created, r.scale_ins) == (2, 3, 1)
    # the default is the shipped rule's window
    (rule,) = [r for r in yaml.safe_load(ADAPTER.read_text())["rules"]
               if r["seriesQuery"].startswith("stowage_pod_gpu_utilization_ratio{")]
    (minutes,) = re.findall(r"avg_over_time\(<<\.Series>>\{<<\.LabelMatchers>>\}\[(\d+)m\]\)", rule["metricsQuery"])
    assert HpaSettings().metric_window_s == int(minutes) * 60
