"""FragTable.weight with host memory: the 2-D cumulative lookup gives, for every node, the total
frequency of each group's classes whose CPU and host memory both fit what is left — the same
as summing over the classes directly, at thresholds, between them, and at the extremes, both
for a small table (a matrix product) and a large one (a 2-D cumulative lookup)."""
from __future__ import annotations

import numpy as np
import pytest

from packing.frag import FragTable, PodClass
from stowage.resources import GpuRequest


@pytest.mark.parametrize("n", [40, 120], ids=["summed", "looked-up"])
def test_weight_lookup_equals_the_sum_over_classes(n):
    rng = np.random.default_rng(5)
    classes = []
    for _ in range(n):
        cpu, mem = int(rng.choice([0, 1000, 4000, 8000, 16000])), int(rng.choice([0, 2000, 16000, 64000]))
        models = [(), ("T4",), ("G2", "T4")][int(rng.integers(3))]
        if rng.random() < 0.5:
            req = GpuRequest(gpus=int(rng.choice([1, 2, 8])), cpu_milli=cpu, host_mem_mib=mem)
        else:
            m = int(rng.choice([100, 250, 500]))
            req = GpuRequest(mem_mib=m, core_milli=m, cpu_milli=cpu, host_mem_mib=mem)
        classes.append((PodClass.of(req, models, host_memory=True), float(rng.random())))
    t = FragTable(classes)
    assert t.uses_mem
    cpu = np.concatenate([t.thresholds, t.thresholds - 1, [np.inf, -1.0, 0.0, 1e9], rng.uniform(0, 20000, 40)])
    mem = rng.permutation(np.resize(np.concatenate([t.mem_thresholds, t.mem_thresholds + 1, [np.inf, -5.0]]),
                                    len(cpu)))
    direct = np.zeros((t.size, len(cpu)))
    for g, key in enumerate(t.keys):
        for cls, p in classes:
            if (cls.gpus, cls.mem_mib, cls.core_milli, cls.models, cls.min_card_mem_mib) == key:
                direct[g] += p * ((cls.cpu_milli <= cpu) & (cls.host_mem_mib <= mem))
    assert np.allclose(t.weight(cpu, mem), direct, rtol=0, atol=1e-9)
