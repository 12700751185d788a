"""FragTable's cell budget: the 2-D lookup of W (groups x CPU thresholds x host-memory thresholds)
grows as classes^3 when pods differ in GPU shape, CPU and memory at once (a pod's author chooses
all three), so past ``max_cells`` the rarest thresholds are merged. Hostile tables stay under the
budget; merged weights never count a class as fitting where it does not and are off by less than
one quantile per axis; a table under the budget is exactly the unbounded one; the extender says
once that the bound engaged."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from packing.frag import MAX_TABLE_CELLS, FragTable, PodClass
from stowage.resources import GpuRequest


def hostile(n: int, groups: bool = True) -> list[tuple[PodClass, float]]:
    """``n`` equally frequent classes each with its own CPU and host memory request and (with
    ``groups``) its own card share: every axis of the lookup ~ n."""
    out = []
    for s in range(n):
        req = GpuRequest(mem_mib=(1 + s % 79) * 1024 if groups else 8192, core_milli=10 + (s // 79) if groups else 100,
                         cpu_milli=100 + s, host_mem_mib=100 + s)
        out.append((PodClass.of(req, (), host_memory=True), 1.0 / n))
    return out


def realistic(n: int, seed: int) -> list[tuple[PodClass, float]]:
    """A mix like the openb traces': a few CPU and memory sizes, a few shapes and model lists."""
    rng = np.random.default_rng(seed)
    classes = []
    for _ in range(n):
        cpu = int(rng.choice([0, 1000, 2000, 4000, 8000, 16000, 32000, 64000]))
        mem = int(rng.choice([0, 2000, 4000, 16000, 32000, 64000, 128000]))
        models = [(), ("T4",), ("G2", "T4"), ("V100M16", "V100M32")][int(rng.integers(4))]
        if rng.random() < 0.5:
            req = GpuRequest(gpus=int(rng.choice([1, 2, 4, 8])), cpu_milli=cpu, host_mem_mib=mem)
        else:
            m = int(rng.choice([100, 250, 500, 750]))
            req = GpuRequest(mem_mib=m, core_milli=m, cpu_milli=cpu, host_mem_mib=mem)
        classes.append((PodClass.of(req, models, host_memory=True), float(rng.random())))
    return classes


def direct_weight(t: FragTable, classes, cpu: np.ndarray, mem: np.ndarray) -> np.ndarray:
    """W summed over the classes themselves: the exact, unmerged measure."""
    out = np.zeros((t.size, len(cpu)))
    for g, key in enumerate(t.keys):
        for cls, p in classes:
            if (cls.gpus, cls.mem_mib, cls.core_milli, cls.models, cls.min_card_mem_mib) == key:
                out[g] += p * ((cls.cpu_milli <= cpu) & (cls.host_mem_mib <= mem))
    return out


@pytest.mark.parametrize("n", [300, 1024])
def test_hostile_classes_stay_under_the_cell_budget(n):
    classes = hostile(n)
    # Unbounded this would be n x (n+1) x (n+1) float64 cells: 216 MiB at 300, 8.6 GiB at 1,024.
    t = FragTable(classes)
    assert t.size == n and len(t.thresholds) == n
    assert t.cum_w2.size <= MAX_TABLE_CELLS
    assert t.bound is not None and t.bound.cells == t.cum_w2.size
    assert t.bound.cells_wanted == n * (n + 1) * (n + 1)
    assert "fragmentation table" in t.bound.describe()
    # The 1-D CPU table (used without host memory) keeps every threshold: it is groups x CPU.
    assert t.cum_w.shape == (n, n + 1)


def test_merged_weights_are_conservative_and_within_a_quantile():
    classes = hostile(200) + realistic(60, seed=3)
    budget = 6000
    t = FragTable(classes, max_cells=budget)
    assert t.bound is not None and t.cum_w2.size <= budget
    kc, km = len(t.cpu_thresholds2), len(t.mem_thresholds)
    assert kc < len(t.thresholds)
    rng = np.random.default_rng(1)
    cpu = np.concatenate([t.thresholds, rng.uniform(0, 70000, 300), [0.0, 1e9, np.inf]])
    mem = np.concatenate([rng.permutation(np.resize(np.unique([c.host_mem_mib for c, _ in classes]), len(t.thresholds))),
                          rng.uniform(0, 130000, 300), [0.0, 1e9, np.inf]])
    exact = direct_weight(t, classes, cpu, mem)
    merged = t.weight(cpu, mem)
    # Never counts a class as fitting where it does not (a merged class needs a little more) ...
    assert (merged <= exact + 1e-12).all()
    # ... and moves less than one quantile of the frequency per axis past any point.
    total = sum(p for c, p in classes if c.is_gpu)
    assert (exact.sum(axis=0) - merged.sum(axis=0) <= total / kc + total / km + 1e-9).all()
    # With room for everything, nothing is lost.
    assert np.allclose(merged[:, -1], exact[:, -1], rtol=0, atol=1e-12)
    # A threshold that carries a quantile of the frequency on its own (here half of it) is kept.
    heavy = [(PodClass.of(GpuRequest(gpus=1, cpu_milli=12345, host_mem_mib=999), (), host_memory=True), total)]
    t2 = FragTable(classes + heavy, max_cells=budget)
    assert 12345.0 in t2.cpu_thresholds2 and 999.0 in t2.mem_thresholds


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_table_under_the_budget_is_the_unbounded_table(seed):
    classes = realistic(400, seed)
    t, ref = FragTable(classes), FragTable(classes, max_cells=None)
    assert t.cum_w2.size <= MAX_TABLE_CELLS and t.bound is None
    assert np.array_equal(t.cpu_thresholds2, ref.thresholds) and np.array_equal(t.mem_thresholds, ref.mem_thresholds)
    assert np.array_equal(t.cum_w2, ref.cum_w2) and np.array_equal(t.cum_w, ref.cum_w)
    rng = np.random.default_rng(seed)
    cpu = np.concatenate([t.thresholds, t.thresholds - 1, rng.uniform(0, 70000, 200)])
    mem = rng.permutation(np.resize(np.concatenate([t.mem_thresholds, t.mem_thresholds + 1, [np.inf]]), len(cpu)))
    assert np.array_equal(t.weight(cpu, mem), ref.weight(cpu, mem))


def test_extender_logs_once_when_the_bound_engages(caplog):
    from extender.service import ExtenderService
    from packing.model import ClusterModel

    svc = ExtenderService(ClusterModel())
    shapes = [(GpuRequest(mem_mib=(1 + s % 79) * 1024, core_milli=10 + s // 79, cpu_milli=100 + s,
                          host_mem_mib=100 + s), (), 1) for s in range(400)]
    with caplog.at_level(logging.WARNING, logger="stowage.extender"):
        svc.learn_shapes(shapes[:100])       # 100 x 101 x 101 cells: under the budget
        assert not [r for r in caplog.records if "fragmentation table" in r.getMessage()]
        svc.learn_shapes(shapes[100:])       # rebuilt at 128, 256, 384 pods: over it
    said = [r.getMessage() for r in caplog.records if "fragmentation table" in r.getMessage()]
    assert len(said) == 1 and "merging the rarest" in said[0]
    tables = [p.table for p in svc._distinct_placers() if getattr(p, "table", None) is not None]
    assert tables and all(t.cum_w2.size <= MAX_TABLE_CELLS for t in tables)
