"""Issue 13: a pod seen again after the watch showed it deleted (a scheduling cycle that began
before the deletion reaches filter or prioritize after it) teaches the placers nothing more.

Found by experiment: such a late filter learned the pod a second time, and its uid stayed among
the learned pods for good (no second deletion ever comes), so the running extender counted one
pod more than a restarted one, which learns it once (as departed, from the ConfigMap)."""
from __future__ import annotations

from extender.learned_past import DepartedPods
from extender.service import ExtenderService
from extender.wire import ExtenderArgs
from test_extender_learned_past import learned
from test_extender_learned_rebuild import NODES, cluster, pod, schedule


def late_cycle(svc: ExtenderService, p: dict) -> None:
    """kube-scheduler's filter and prioritize of ``p``, arriving after its deletion."""
    args = ExtenderArgs(pod=p, node_names=NODES, nodes=None, names=NODES)
    svc.filter(args)
    svc.prioritize(args)


def test_a_pod_filtered_after_its_deletion_is_not_learned_again_and_a_restart_agrees():
    pods = [pod(i, limits) for i, limits in enumerate(
        [{"nvidia.com/gpu": "1", "cpu": "4"}, {"nvidia.com/gpu-memory": "10"}, {"nvidia.com/gpu-memory": "10"}])]
    running = ExtenderService(cluster(), filter_keeps="fitting")
    for p in pods:
        schedule(running, p)
    gone = pods[0]
    uid = gone["metadata"]["uid"]
    running.model.release(uid, departed=True)     # the watch shows it deleted
    running.pod_deleted(uid)
    late_cycle(running, gone)
    assert learned(running)["seen"] == 3
    assert uid not in running._learned             # nothing kept for a pod that cannot come back
    assert running.departed_snapshot().pods == 1

    back = ExtenderService(running.model, filter_keeps="fitting")
    back.learn_departed(DepartedPods.from_json(running.departed_snapshot().to_json()))
    for p in pods[1:]:
        back.learn_pod(p)
    assert learned(back) == learned(running)


def test_the_watch_showing_a_deleted_pod_again_teaches_nothing():
    p = pod(7, {"nvidia.com/gpu-memory": "5"})
    svc = ExtenderService(cluster())
    svc.learn_pod(p)
    svc.pod_deleted(p["metadata"]["uid"])
    svc.learn_pod(p)                               # a late echo of the same object
    assert learned(svc)["seen"] == 1 and len(svc._learned) == 0
