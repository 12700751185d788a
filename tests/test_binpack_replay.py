"""Replay mechanics of the bin-packing benchmark on small hand-made clusters with known answers."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.binpack.replay import SeedRun, arrival_order, binned, build_cluster, replay
from packing.decide import best_node
from benchmarks.binpack.trace import Nodes, Pods, TraceError, load_pods, load_nodes


def nodes(*rows: tuple[int, int, int, str]) -> Nodes:
    return Nodes(names=tuple(f"n{i}" for i in range(len(rows))),
                 cpu_milli=np.array([r[0] for r in rows]), memory_mib=np.array([r[1] for r in rows]),
                 gpus=np.array([r[2] for r in rows]), model=tuple(r[3] for r in rows))


def pods(*rows: tuple, name: str = "t") -> Pods:
    """rows: (cpu, mem, num_gpu, gpu_milli[, spec])"""
    return Pods(name=name, cpu_milli=np.array([r[0] for r in rows]), memory_mib=np.array([r[1] for r in rows]),
                num_gpu=np.array([r[2] for r in rows]), gpu_milli=np.array([r[3] for r in rows]),
                gpu_spec=tuple(r[4] if len(r) > 4 else "" for r in rows))


def test_inflation_reaches_but_never_passes_the_target():
    p = pods((1000, 1, 1, 1000), (1000, 1, 1, 500), (1000, 1, 0, 0))
    cap = 10_000
    order = arrival_order(p, cap, seed=42, inflate=1.3)
    assert sorted(order[:3].tolist()) == [0, 1, 2]          # a shuffle of every row first
    total = int(p.milli[order].sum())
    assert total <= 1.3 * cap
    assert total > 1.3 * cap - 1000                          # stopped only when the next draw would pass
    assert np.array_equal(order, arrival_order(p, cap, seed=42, inflate=1.3))
    assert not np.array_equal(order, arrival_order(p, cap, seed=43, inflate=1.3))


def test_failed_pods_are_skipped_but_count_as_arrived():
    n = nodes((8000, 8000, 1, "T4"))
    p = pods((1000, 100, 1, 1000), (1000, 100, 1, 1000))    # two whole-GPU pods, one card
    run = replay(n, p, "bestfit", seed=42, inflate=0)
    assert run.failed == 1 and run.failed_milli == 1000
    assert run.arrived.tolist() == [1000, 2000]
    assert run.allocated.tolist() == [1000, 1000]


def test_cpu_memory_and_model_are_filters():
    n = nodes((4000, 4000, 1, "T4"), (64000, 64000, 1, "V100M16"))
    p = pods((8000, 100, 1, 500),                     # only n1 has the CPU
             (100, 8000, 1, 500),                     # only n1 has the memory
             (100, 100, 1, 500, "T4"),                # only n0 has the model
             (100, 100, 1, 500, "A100|P100"))         # nobody has the model
    for j, want in enumerate(["n1", "n1", "n0", None]):
        model = build_cluster(n)
        from packing.fit import card_mask, fit
        from packing.pod_policy import PodPolicy
        req = p.request(j)
        f = fit(model.a, req, card_mask(model.a, model.models, PodPolicy(models_include=p.models(j)), req))
        ok = [model.names[i] for i in np.flatnonzero(f.ok)]
        assert ok == ([want] if want else [])


def test_share_pods_share_one_card_and_whole_pods_take_whole_cards():
    n = nodes((64000, 64000, 2, "G2"))
    p = pods((100, 100, 1, 600), (100, 100, 1, 400), (100, 100, 1, 1000), (100, 100, 1, 1000))
    run = replay(n, p, "bestfit", seed=1, inflate=0)
    # 600 + 400 fill one card exactly (best fit), one whole pod takes the other, the last fails.
    assert run.allocated[-1] == 2000 and run.failed == 1


def test_binning_is_per_arrived_percent_mean():
    run = SeedRun("x", 1, arrived=np.array([100, 149, 151, 1000]), allocated=np.array([100, 100, 151, 900]),
                  failed=0, failed_milli=0, seconds=0)
    curve = binned(run, capacity_milli=1000, max_bin=100)
    assert curve[10] == pytest.approx(10.0)
    assert curve[15] == pytest.approx((10.0 + 15.1) / 2)    # 14.9 and 15.1 both round to 15
    assert curve[100] == pytest.approx(90.0)
    assert np.isnan(curve[50])


def test_ties_go_to_the_fixed_node_order():
    idx = np.array([0, 1, 2, 3])
    rank = np.array([3, 2, 0, 1])
    assert best_node(np.array([5.0, 7.0, 7.0, 7.0]), idx, rank) == 2
    assert best_node(np.array([9.0, 7.0, 7.0, 7.0]), idx, rank) == 0
    assert best_node(np.array([5.0, 7.0, 7.0, 7.0]), idx) == 1   # no tie order: the lowest slot


def test_missing_trace_is_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match="cluster-trace-gpu-v2023"):
        load_nodes(tmp_path)
    with pytest.raises(TraceError, match="not found"):
        load_pods("default", tmp_path)


def test_trace_without_gpu_spec_column_loads(tmp_path):
    (tmp_path / "openb_pod_list_x.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,2,1000\n")
    p = load_pods("x", tmp_path)
    assert p.request(0).gpus == 2 and p.models(0) == ()


def test_a_trace_given_as_a_folder_or_a_path_is_named_as_given(tmp_path):
    """`--trace /some/dir` said "trace file not found: <data-dir>/openb_pod_list_/some/dir.csv": the
    folder was taken for a trace name (noticed by the command-line helper, session 15)."""
    with pytest.raises(TraceError) as exc:
        load_pods(str(tmp_path), tmp_path)
    assert f"{tmp_path} is a folder, not a trace CSV" in str(exc.value)
    assert "openb_pod_list_" not in str(exc.value)
    missing = tmp_path / "sub" / "mine"
    with pytest.raises(TraceError) as exc:
        load_pods(str(missing), tmp_path)
    assert f"trace file not found: {missing}\n" in str(exc.value)
