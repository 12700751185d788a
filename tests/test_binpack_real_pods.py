"""The real-scheduler mode's Pod objects ask what the simulated replay's ask: the extender parses
the same request from both, for every share size a trace row can have (1-999 milli of a card,
not only the multiples of 10 the openb traces happen to use), whole GPUs and CPU-only pods."""
from __future__ import annotations

import numpy as np

from benchmarks.binpack.real import pod_body
from benchmarks.binpack.replay import MEMORY_UNIT_MIB
from benchmarks.binpack.trace import Pods
from extender.placing import request_pod
from stowage.resources import pod_request


def test_every_share_size_asks_the_same_in_real_and_simulated_mode():
    milli = list(range(1, 1000)) + [1000, 1000, 0]
    gpus = [1] * 999 + [1, 4, 0]
    n = len(milli)
    pods = Pods(name="t", cpu_milli=np.full(n, 4000), memory_mib=np.full(n, 8192), num_gpu=np.array(gpus),
                gpu_milli=np.array(milli), gpu_spec=("",) * n)
    differ = []
    for j in range(n):
        real = pod_request(pod_body(pods, j, f"p{j}", "stowage", "stowage-scheduler", "default-scheduler"),
                           MEMORY_UNIT_MIB)
        sim = pod_request(request_pod(f"p{j}", pods.request(j), memory_unit_mib=MEMORY_UNIT_MIB), MEMORY_UNIT_MIB)
        if real != sim:
            differ.append((milli[j], real, sim))
    assert not differ, differ[:5]
    assert pod_request(pod_body(pods, 254, "p", "stowage", "s", "d"), MEMORY_UNIT_MIB).core_milli == 260  # 255 milli: 26 %
