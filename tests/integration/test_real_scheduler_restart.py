"""The extender's lifecycle under the real kube-scheduler: a restart rebuilds the same model from
the API server and keeps placing correctly; while it is down GPU pods wait (``ignorable: false``
in the deployed config) and are placed once it is back, while pods without GPUs are unaffected.
"""
from __future__ import annotations

from typing import Any

import pytest

from realk8s import wait_until
from schedbed import Pool, PodSpec, SchedBed, card_usage, cards, record_of, settle_and_check

A100 = "NVIDIA A100-SXM4-80GB"


def pool_view(state: dict[str, Any], pool: Pool, uids: set[str]) -> dict[str, Any]:
    """The part of /state that belongs to this pool (other tests' and the kubelet tests' nodes
    live in the same model). Nothing is dropped as volatile: every field is rebuilt from the API."""
    return {"nodes": [n for n in state["nodes"] if n["name"] in pool.nodes],
            "allocations": {u: a for u, a in state["allocations"].items() if u in uids}}


@pytest.mark.timeout(180)
def test_restart_rebuilds_the_same_model_and_places_the_next_pods(sched: SchedBed, pool: Pool) -> None:
    for i in range(2):
        pool.node(f"n{i}", lambda n: cards(n, A100, 4, 80, nvlink=[[0, 1], [2, 3]], numa=[0, 0, 1, 1]))
    pool.wait_extender_knows(sched)
    first = [PodSpec("w2", gpus=2), PodSpec("s60", mem_gib=60), PodSpec("s30c40", mem_gib=30, core_pct=40),
             PodSpec("w1", gpus=1), PodSpec("s10c70", mem_gib=10, core_pct=70),
             PodSpec("wm", gpus=1, mem_gib=80)]
    pool.create_many(first)
    pods = pool.wait_bound([s.name for s in first])
    uids = {p.metadata.uid for p in pods.values()}
    before = pool_view(sched.extender.state(), pool, uids)
    assert len(before["allocations"]) == len(first)

    sched.extender.stop()
    sched.extender.start()  # same port: kube-scheduler's config still points at it
    after = pool_view(sched.extender.state(), pool, uids)
    assert after == before

    # The next pods need exactly what the restarted model must know is taken: one 1-GPU pod per
    # free whole card plus one more (which must not fit), and slices that fit only in what the
    # shared cards have left. A model that forgot a record would hand a taken card out again.
    use = card_usage(pool.pods().values())
    free_whole = sum(1 for n, cs in pool.nodes.items() for c in cs if (n, c.index) not in use)
    assert free_whole >= 1, use
    nxt = [PodSpec(f"next-w{i}", gpus=1) for i in range(free_whole + 1)]
    nxt += [PodSpec("next-s15", mem_gib=15), PodSpec("next-s15c20", mem_gib=15, core_pct=20),
            PodSpec("next-s70", mem_gib=70)]
    pool.create_many(nxt)
    bound, unbound = settle_and_check(sched, pool, timeout=60)
    assert unbound, "more was asked for than the pool has: something must be left over"
    assert {p.metadata.uid for p in bound.values()} >= uids  # the first pods kept their cards


@pytest.mark.timeout(120)
def test_extender_down_keeps_gpu_pods_pending_until_it_is_back(sched: SchedBed, pool: Pool) -> None:
    """``ignorable: false``: without the extender no pod of the profile is bound (kube-scheduler's
    own count would happily place the GPU pods), a CPU-only one included: the profile sends every
    pod to the extender (no managedResources), which places CPU-only pods too so that they do
    not strand GPUs, and it decides only from its own model. Once it is back they are placed.

    What "once it is back" means with kube-scheduler 1.28 (found here, documented in
    docs/extender.md): a pod whose filter call failed goes to the unschedulable queue, and the
    extender coming back is no event kube-scheduler sees; it retries such pods on the next
    cluster event that moves every pod (a pod deleted, a node added or changed) or after at most
    5 minutes. The test waits on that: a bound pod leaves, as pods do."""
    pool.node("n", lambda n: cards(n, A100, 4, 80))
    pool.wait_extender_knows(sched)
    leaver = pool.place(PodSpec("leaver", gpus=1))[0]
    sched.extender.stop()
    waiting = [PodSpec("gpu-1", gpus=1), PodSpec("slice", mem_gib=10, core_pct=20), PodSpec("no-gpu")]
    for s in waiting:
        pool.create(s)
    for s in waiting:
        msgs = wait_until(lambda: pool.failed_scheduling(s.name), 30, f"{s.name}'s FailedScheduling")
        assert "connect: connection refused" in msgs[-1], msgs
        p = pool.pod(s.name)
        assert not p.spec.node_name and record_of(p) is None, f"{s.name} was bound without the extender"

    sched.extender.start()
    pool.k8s.core.delete_namespaced_pod(leaver.metadata.name, pool.namespace, grace_period_seconds=0)
    del pool.specs[leaver.metadata.name]
    pods = pool.wait_bound([s.name for s in waiting], timeout=30)
    assert all(record_of(pods[s.name]) is not None for s in waiting if s.name != "no-gpu")
    assert record_of(pods["no-gpu"]) is None  # a CPU-only pod holds no card
    settle_and_check(sched, pool, timeout=10)
