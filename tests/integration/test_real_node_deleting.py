"""Nodes going away, against the REAL kube-scheduler (v1.28.7) and API server, with the extender:
what the peer does decides what the extender (and ``stowage plan``, which reads the cluster as the
extender does) must do.

- A node with only a ``deletionTimestamp`` (a finalizer holds it; no taint): kube-scheduler's
  own filters pass it and it asks the extender, which offers it: the pod is bound there, with the
  extender's record. (``stowage plan`` used to read such a node as cordoned, "kube-scheduler sends
  the extender no such node": it does.)
- A node with the cluster autoscaler's ``ToBeDeletedByClusterAutoscaler`` taint (NoSchedule):
  kube-scheduler filters it out itself, so no pod goes there (``plan`` reads it as cordoned).

Control plane only (no kubelet): ``STOWAGE_IT_PORT_BASE`` keeps it apart from other sessions.
"""
from __future__ import annotations

from realk8s import wait_until
from schedbed import Pool, PodSpec, SchedBed, cards, record_of

A100 = "NVIDIA A100-SXM4-80GB"
FINALIZER = "example.com/stowage-test-hold"


def test_kube_scheduler_and_the_extender_place_pods_on_a_node_being_deleted_not_on_one_being_scaled_down(
        sched: SchedBed, pool: Pool) -> None:
    core = pool.k8s.core
    going = pool.node("going", lambda n: cards(n, A100, 1, 80))
    scaling = pool.node("scaling", lambda n: cards(n, A100, 1, 80))
    pool.wait_extender_knows(sched)
    core.patch_node(going, {"metadata": {"finalizers": [FINALIZER]}})
    try:
        core.delete_node(going)
        assert core.read_node(going).metadata.deletion_timestamp is not None
        core.patch_node(scaling, {"spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler",
                                                       "value": "1700000000", "effect": "NoSchedule"}]}})

        def seen() -> bool:   # both changes have reached the extender's watch
            st = {n["name"]: n for n in sched.extender.state()["nodes"]}
            return going in st and st[going]["schedulable"] and scaling in st
        wait_until(seen, 30, "the extender to see both nodes' changes")

        pod, rec = pool.place(PodSpec("p1", gpus=1))
        assert pod.spec.node_name == going and rec is not None and rec.node == going
        pool.create(PodSpec("p2", gpus=1))
        wait_until(lambda: any("untolerated taint" in m for m in pool.failed_scheduling("p2")), 30,
                   "p2's FailedScheduling to name the autoscaler's taint")
        p2 = pool.pod("p2")
        assert not p2.spec.node_name and record_of(p2) is None
    finally:
        core.patch_node(going, {"metadata": {"finalizers": None}})
