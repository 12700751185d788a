"""Closed nodes and the pods that tolerate why, against the REAL kube-scheduler (v1.28.7) and API
server, with the extender.

kube-scheduler's NodeUnschedulable filter lets a pod that tolerates
``node.kubernetes.io/unschedulable:NoSchedule`` (every DaemonSet's pod does) onto a cordoned node,
and its TaintToleration filter lets a pod that tolerates ``node.kubernetes.io/not-ready:NoSchedule``
onto a node the node lifecycle controller tainted for a Ready condition gone False. The extender
used to refuse both nodes for every pod, so such GPU pods stayed Pending where kube-scheduler alone
would have bound them. Now each goes where kube-scheduler lets it, with the extender's record; a pod
that tolerates neither stays Pending.

Control plane only (no kubelet, no controller-manager: the test sets the Ready condition and the
taint the node lifecycle controller would). ``STOWAGE_IT_PORT_BASE`` keeps it apart from other sessions.
"""
from __future__ import annotations

from realk8s import wait_until
from schedbed import Pool, PodSpec, SchedBed, cards, record_of

A100 = "NVIDIA A100-SXM4-80GB"
NOT_READY = "node.kubernetes.io/not-ready"
# The tolerations the DaemonSet controller gives every DaemonSet pod (v1.28; hostNetwork aside).
DAEMONSET = [{"key": NOT_READY, "operator": "Exists", "effect": "NoExecute"},
             {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
             {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
             {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
             {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
             {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]


def test_pods_that_tolerate_a_cordon_or_a_not_ready_taint_are_placed_there_with_a_record(
        sched: SchedBed, pool: Pool) -> None:
    core = pool.k8s.core
    cordoned = pool.node("cordoned", lambda n: cards(n, A100, 1, 80))
    notready = pool.node("notready", lambda n: cards(n, A100, 1, 80))
    pool.wait_extender_knows(sched)
    core.patch_node(cordoned, {"spec": {"unschedulable": True}})
    ts = "2026-01-01T00:00:00Z"
    core.patch_node_status(notready, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "test",
         "lastHeartbeatTime": ts, "lastTransitionTime": ts}]}})
    core.patch_node(notready, {"spec": {"taints": [{"key": NOT_READY, "effect": "NoSchedule"}]}})

    def seen() -> bool:   # both changes have reached the extender's watch
        st = {n["name"]: n for n in sched.extender.state()["nodes"]}
        return all(n in st and not st[n]["schedulable"] for n in (cordoned, notready))
    wait_until(seen, 30, "the extender to see both nodes closed")

    pool.create(PodSpec("plain", gpus=1))
    daemon, rec = pool.place(PodSpec("daemon", gpus=1, tolerations=DAEMONSET))
    assert daemon.spec.node_name == cordoned and rec is not None and rec.node == cordoned
    ready, rec = pool.place(PodSpec("ready", gpus=1, tolerations=[
        {"key": NOT_READY, "operator": "Exists", "effect": "NoSchedule"}]))
    assert ready.spec.node_name == notready and rec is not None and rec.node == notready
    wait_until(lambda: pool.failed_scheduling("plain"), 30, "the plain pod's FailedScheduling")
    plain = pool.pod("plain")
    assert not plain.spec.node_name and record_of(plain) is None
