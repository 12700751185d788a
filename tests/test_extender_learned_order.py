"""Issue 13: a restarted extender learns the departed pods first, then the pods that exist, so
its learned classes arrive in another order than the running extender's. What it decides must
not depend on that order.

Found by experiment: the typical-pod table (``Workload.typical``) ranked classes by count and a
sort key that leaves out the minimum card size (and tells a share's compute from its memory
only by their larger), so two such classes with equal counts kept the order they were first
seen in; where the 95 % cut fell between them, the running extender's table held one and the
restarted one's the other, and prioritize answered differently on the same learned counts."""
from __future__ import annotations

import random

from extender.learned_past import DepartedPods
from extender.service import ExtenderService
from extender.wire import ExtenderArgs
from packing.frag import PodClass, Workload
from test_extender_learned_past import learned
from test_extender_learned_rebuild import NODES, cluster, pod, schedule


def test_a_restart_that_learns_tied_classes_in_another_order_answers_the_same():
    big = pod(0, {"nvidia.com/gpu": "1", "nvidia.com/gpu-memory": "80"})    # 1 card of >= 80 GiB
    anyc = pod(1, {"nvidia.com/gpu": "1"})                                  # 1 card, any size
    small = [pod(2 + i, {"nvidia.com/gpu-memory": "5"}) for i in range(30)]  # 32 pods: a rebuild point
    running = ExtenderService(cluster(), filter_keeps="fitting")
    for p in [big, anyc, *small]:
        schedule(running, p)
    uid = anyc["metadata"]["uid"]
    running.model.release(uid, departed=True)
    running.pod_deleted(uid)
    back = ExtenderService(running.model, filter_keeps="fitting")     # departed first, then the rest
    back.learn_departed(DepartedPods.from_json(running.departed_snapshot().to_json()))
    for p in [big, *small]:
        back.learn_pod(p)
    assert learned(back) == learned(running)
    assert back.placers["pack"].workload.typical() == running.placers["pack"].workload.typical()
    probe = [pod(900, {"nvidia.com/gpu": "1"}), pod(901, {"nvidia.com/gpu-memory": "14"})]
    ask = [ExtenderArgs(pod=p, node_names=NODES, nodes=None, names=NODES) for p in probe]
    assert [back.prioritize(a) for a in ask] == [running.prioritize(a) for a in ask]


def test_typical_does_not_depend_on_the_order_classes_were_first_seen():
    classes = [PodClass(0, gpus=1), PodClass(0, gpus=1, min_card_mem_mib=81920),
               PodClass(0, mem_mib=500), PodClass(0, core_milli=500),
               PodClass(0, gpus=1, models=("A|B",)), PodClass(0, gpus=1, models=("A", "B"))]
    tables = set()
    for seed in range(20):
        order = classes[:]
        random.Random(seed).shuffle(order)
        w = Workload()
        for c in order:
            w.add(c, 1.0)
        w.add(PodClass(0, mem_mib=5120), 10.0)
        # coverages whose cut falls after each of the tied classes in turn
        tables.add(tuple(tuple(w.typical(cov)) for cov in (0.7, 0.75, 0.8, 0.85, 0.9, 0.95)))
    assert len(tables) == 1
