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
