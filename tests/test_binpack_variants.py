"""The generated trace variants (benchmarks/binpack/variants.py): deterministic, of the stated
strength, made by the published generator's method, and chosen by name on the command line."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from benchmarks.binpack import cli
from benchmarks.binpack.trace import TraceError, data_dir, load_nodes, load_pods
from benchmarks.binpack.variants import (DEFAULT_VARIANTS, default_traces, is_variant, load_trace,
                                         make_variant)

DATA = data_dir()
needs_trace = pytest.mark.skipif(not (DATA / "openb_pod_list_gpuspec10.csv").is_file(),
                                 reason="openb trace files not present")


def test_variant_names():
    assert is_variant("spec25") and is_variant("multigpu40") and is_variant("spec1")
    assert not is_variant("spec0") and not is_variant("spec91") and not is_variant("default")
    assert not is_variant("gpuspec10") and not is_variant("spec")


@needs_trace
@pytest.mark.parametrize("pct", [10, 25, 33, 40])
def test_spec_variant_limits_that_share_of_gpu_pods_to_listed_models(pct):
    base = load_pods("default", DATA)
    v = make_variant(f"spec{pct}", DATA)
    gpu = (base.num_gpu > 0) & (base.gpu_milli > 0)
    has = np.array([bool(s) for s in v.gpu_spec])
    assert not has[~gpu].any()                                     # CPU-only pods stay free
    assert abs(has.sum() / gpu.sum() - pct / 100) < 0.001
    # only the model lists changed
    for col in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli"):
        assert np.array_equal(getattr(v, col), getattr(base, col))
    # every list comes from the production mix, and some node of a listed model has the cards
    mix = Counter(s for s in load_pods("gpuspec10", DATA).gpu_spec if s)
    nodes = load_nodes(DATA)
    most = Counter()
    for m, g in zip(nodes.model, nodes.gpus.tolist()):
        most[m] = max(most[m], g)
    for j in np.flatnonzero(has):
        assert v.gpu_spec[j] in mix
        assert any(most[m] >= v.num_gpu[j] for m in v.models(j)), (v.gpu_spec[j], v.num_gpu[j])
    # the mix follows the production one: its most common list is the most common here
    assert Counter(s for s in v.gpu_spec if s).most_common(1)[0][0] == mix.most_common(1)[0][0]


@needs_trace
def test_variants_are_deterministic():
    a, b = make_variant("spec33", DATA), make_variant("spec33", DATA)
    assert a.gpu_spec == b.gpu_spec
    c, d = make_variant("multigpu40", DATA), make_variant("multigpu40", DATA)
    assert np.array_equal(c.num_gpu, d.num_gpu) and np.array_equal(c.cpu_milli, d.cpu_milli)
    assert make_variant("spec25", DATA).gpu_spec != a.gpu_spec


@needs_trace
@pytest.mark.parametrize("pct", [20, 40])
def test_multigpu_variant_resamples_multi_gpu_pods_to_that_share(pct):
    base = load_pods("default", DATA)
    v = make_variant(f"multigpu{pct}", DATA)
    n = len(base)
    assert np.array_equal(v.num_gpu[:n], base.num_gpu)            # the trace itself, then additions
    assert (v.num_gpu[n:] > 1).all()
    share = v.milli[v.num_gpu > 1].sum() / v.milli.sum()
    assert pct / 100 <= share < pct / 100 + 0.01
    if pct == 20 and (DATA / "openb_pod_list_multigpu20.csv").is_file():
        # the method is the published generator's: its multigpu20 has the same size and GPU
        # request, to within the draw (a few pods, 1 % of the GPU request)
        pub = load_pods("multigpu20", DATA)
        assert abs(len(pub) - len(v)) <= 5 and abs(int(pub.milli.sum()) - int(v.milli.sum())) <= 0.01 * pub.milli.sum()


@needs_trace
def test_plain_run_includes_the_variants_and_a_file_wins_over_a_name():
    files = ["default", "gpuspec10"]
    assert default_traces(files, DATA) == files + list(DEFAULT_VARIANTS)
    assert default_traces(["default"], DATA) == ["default", "multigpu40"]   # no model mix at hand
    assert load_trace("multigpu20", DATA).name == "multigpu20"              # the file, not generated
    assert len(load_trace("multigpu20", DATA)) == len(load_pods("multigpu20", DATA))


def test_unknown_variant_is_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match="not found"):
        load_trace("spec25", tmp_path)                 # no default trace to build it from
    with pytest.raises(TraceError, match="unknown trace variant"):
        make_variant("spec99", tmp_path)


@needs_trace
def test_cli_replays_a_variant_by_name(tmp_path, capsys):
    rc = cli.main(["--trace", "spec25", "--policies", "stowage", "--quick", "--out", str(tmp_path)])
    assert rc == 0
    assert "spec25" in capsys.readouterr().out


@needs_trace
@pytest.mark.parametrize("trace", ["spec33", "multigpu40", "gpushare40"])
def test_the_real_scheduler_mode_loads_what_the_simulated_mode_replays(trace):
    """`benchmarks.binpack.real --trace spec33` must replay the same pods as the simulated table's
    spec33 row: the real mode is the check of that row, so a variant it cannot load is a row it
    cannot check (it used to read files only: 'trace file not found ... spec33.csv')."""
    from benchmarks.binpack import real

    args = real.build_parser().parse_args(["--trace", trace, "--node-stride", "3", "--data-dir", str(DATA)])
    nodes, pods = real.load_inputs(args)
    sim_nodes, sim_pods = cli.load_replay(str(DATA), trace, 3)
    assert nodes.names == sim_nodes.names and len(nodes.names) == len(load_nodes(DATA).names[::3])
    assert pods.name == trace and len(pods) == len(sim_pods)
    for col in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli"):
        assert np.array_equal(getattr(pods, col), getattr(sim_pods, col))
    assert list(pods.gpu_spec) == list(sim_pods.gpu_spec)


def test_seeds_42_means_seed_42_not_42_seeds():
    """`--seeds 42` asked for 42 seeds (42..83: half a day through the real scheduler) where
    `benchmarks.elastic --seeds 42` and every doc mean the seed 42; a count stays a count."""
    assert cli.parse_seeds("42") == (42,) and cli.parse_seeds("51") == (51,)
    assert cli.parse_seeds("10") == tuple(range(42, 52)) and cli.parse_seeds("3") == (42, 43, 44)
    assert cli.parse_seeds("42-44") == (42, 43, 44) and cli.parse_seeds("42,45") == (42, 45)
    import argparse
    for bad in ("0", "-3", "x", "44-42"):
        with pytest.raises(argparse.ArgumentTypeError, match="bad --seeds"):
            cli.parse_seeds(bad)


# ------------------------------------------------------------------ the elastic scenario's timeline
@needs_trace
def test_a_variant_has_the_creation_and_deletion_times_of_the_default_pods_it_is_made_of():
    from benchmarks.elastic.workload import load_times
    c0, d0 = load_times("default", DATA)
    c, d = load_times("spec33", DATA)              # the same pods, some with a model list
    assert len(c) == len(load_trace("spec33", DATA)) and (c == c0).all() and (d == d0).all()
    multi = load_trace("multigpu40", DATA)
    c, d = load_times("multigpu40", DATA)
    assert len(c) == len(d) == len(multi) > len(c0)
    assert (c[:len(c0)] == c0).all() and (d[:len(d0)] == d0).all()
    base = load_pods("default", DATA)
    for k in range(len(c0), len(multi)):          # each resampled pod lives when the pod it repeats did
        same = np.flatnonzero((c0 == c[k]) & (d0 == d[k]))
        assert any(base.num_gpu[j] == multi.num_gpu[k] and base.cpu_milli[j] == multi.cpu_milli[k] for j in same)


@needs_trace
def test_the_elastic_scenario_runs_a_variant(tmp_path, capsys):
    from benchmarks.elastic.cli import main
    rc = main(["--quick", "--trace", "multigpu40", "--policies", "most-allocated", "--jobs", "1",
               "--out", str(tmp_path / "e")])
    assert rc == 0, capsys.readouterr().err
    assert "multigpu40 trace" in capsys.readouterr().out
