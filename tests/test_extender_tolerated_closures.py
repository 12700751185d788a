"""A pod that tolerates why a node is closed may go there, as kube-scheduler lets it.

kube-scheduler v1.28 sends a cordoned node to a pod that tolerates
``node.kubernetes.io/unschedulable:NoSchedule`` (every DaemonSet's pod does), and a node the node
lifecycle controller tainted not-ready / unreachable to a pod that tolerates that taint. The
extender refused all such nodes for every pod (one schedulable flag per node), so a GPU DaemonSet
pod (a burn-in or diagnostics job on a node cordoned for maintenance) stayed Pending where
kube-scheduler alone would bind it. Here: the toleration rules against the Kubernetes API's
``ToleratesTaint``, then filter and bind through the fake API server's watch (the copy of the
pending pod bind reads keeps what the tolerations open), with and without the speed-ups.
"""
from __future__ import annotations

import orjson
import pytest
from extender_kube_helpers import feeders, inv_node, kube, make_node, make_pod, started  # noqa: F401

from extender.kube_binder import KubeBinder
from extender.kube_objects import node_view, pod_for_bind
from extender.service import ExtenderService
from extender.wire import BindingArgs, encode, parse_extender_args
from stowage.allocation import ALLOCATION_ANNOTATION, decode_allocation
from stowage.taints import NodeClosure, tolerated_closures, tolerates_taint

CORDON = "node.kubernetes.io/unschedulable"
NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
# What the DaemonSet controller adds to every DaemonSet pod (v1.28), and a blanket toleration.
DAEMONSET = [{"key": NOT_READY, "operator": "Exists", "effect": "NoExecute"},
             {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute"},
             {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
             {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
             {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
             {"key": CORDON, "operator": "Exists", "effect": "NoSchedule"}]
BLANKET = [{"operator": "Exists"}]


@pytest.mark.parametrize("toleration, key, tolerated", [
    ({"operator": "Exists"}, CORDON, True),                                   # any key, any effect
    ({"key": CORDON, "operator": "Exists"}, CORDON, True),                    # any effect
    ({"key": CORDON, "operator": "Exists", "effect": "NoSchedule"}, CORDON, True),
    ({"key": CORDON, "operator": "Exists", "effect": "NoExecute"}, CORDON, False),
    ({"key": CORDON, "operator": "Exists", "effect": "PreferNoSchedule"}, CORDON, False),
    ({"key": CORDON}, CORDON, True),                                          # no operator: Equal, value ""
    ({"key": CORDON, "operator": "Equal", "value": ""}, CORDON, True),
    ({"key": CORDON, "operator": "Equal", "value": "true"}, CORDON, False),
    ({"key": NOT_READY, "operator": "Exists"}, CORDON, False),
    ({"key": "node.kubernetes.io/Unschedulable", "operator": "Exists"}, CORDON, False),   # keys are exact
    ({"key": CORDON, "operator": "exists"}, CORDON, False),                    # so are operators
    ({"key": CORDON, "operator": "Gt", "value": "1"}, CORDON, False),
    ({"key": CORDON, "operator": ["Exists"]}, CORDON, False),                  # shapes no API server sends
    ({"key": [CORDON], "operator": "Exists"}, CORDON, False),
    ({"effect": {"NoSchedule": 1}, "operator": "Exists"}, CORDON, False),
    ("Exists", CORDON, False), (None, CORDON, False),
])
def test_a_toleration_tolerates_a_taint_as_the_api_defines(toleration, key, tolerated):
    assert tolerates_taint(toleration, key) is tolerated


@pytest.mark.parametrize("pod, opens", [
    ({"spec": {"tolerations": DAEMONSET}}, NodeClosure.CORDONED),
    ({"spec": {"tolerations": BLANKET}}, NodeClosure.CORDONED | NodeClosure.NOT_READY | NodeClosure.UNREACHABLE),
    ({"spec": {"tolerations": [{"key": NOT_READY, "operator": "Exists", "effect": "NoSchedule"},
                               {"key": UNREACHABLE, "operator": "Exists"}]}},
     NodeClosure.NOT_READY | NodeClosure.UNREACHABLE),
    ({"spec": {}}, 0), ({"spec": {"tolerations": None}}, 0), ({"spec": {"tolerations": {"operator": "Exists"}}}, 0),
    ({"spec": "odd"}, 0), ({}, 0),
])
def test_the_closures_a_pod_opens(pod, opens):
    assert tolerated_closures(pod) == opens


@pytest.mark.parametrize("node, closed", [
    (make_node("n", gpus=1), 0),
    (make_node("n", gpus=1, unschedulable=True), NodeClosure.CORDONED),
    (make_node("n", gpus=1, ready=False), NodeClosure.NOT_READY),
    (make_node("n", gpus=1, ready=False, unschedulable=True), NodeClosure.CORDONED | NodeClosure.NOT_READY),
    ({**make_node("n", gpus=1), "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}},
     NodeClosure.UNREACHABLE),
    ({**make_node("n", gpus=1), "status": {"conditions": []}}, NodeClosure.NOT_READY),   # not reported yet
])
def test_why_a_node_is_closed(node, closed):
    assert node_view(node).closed == closed


def test_the_copy_bind_reads_opens_what_the_pod_opens_and_stays_small():
    many = [{"key": f"example.com/t{i}", "operator": "Exists"} for i in range(20_000)] + DAEMONSET + BLANKET
    for tolerations in (DAEMONSET, BLANKET, many, [{"key": NOT_READY, "operator": "Exists", "effect": "NoExecute"}]):
        pod = make_pod("p", gpus=1)
        pod["spec"]["tolerations"] = tolerations
        copy = pod_for_bind(pod)
        assert tolerated_closures(copy) == tolerated_closures(pod)
        assert len(copy["spec"].get("tolerations", [])) <= 3


def unknown_node(name: str) -> dict:
    node = inv_node(name, [80, 80])
    node["status"]["conditions"] = [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]
    return node


NODES = {"open": lambda: inv_node("open", [80, 80]),
         "cordoned": lambda: inv_node("cordoned", [80, 80], unschedulable=True),
         "notready": lambda: inv_node("notready", [80, 80], ready=False),
         "unknown": lambda: unknown_node("unknown"),
         "both": lambda: inv_node("both", [80, 80], ready=False, unschedulable=True)}
# Why each closed node is refused, in filter's words (kube-scheduler counts nodes per reason).
WHY = {"cordoned": "node is cordoned", "notready": "node is not Ready", "unknown": "node is unreachable (Ready Unknown)",
       "both": "node is cordoned and not Ready"}
# Which nodes kube-scheduler's NodeUnschedulable and TaintToleration filters let each pod reach
# (with the node lifecycle controller's NoSchedule taints on the not-Ready ones).
REACHES = {"plain": (None, {"open"}),
           "daemonset": (DAEMONSET, {"open", "cordoned"}),
           "blanket": (BLANKET, set(NODES)),
           "ready-only": ([{"key": NOT_READY, "operator": "Exists", "effect": "NoSchedule"}], {"open", "notready"})}


@pytest.mark.parametrize("speedups", [True, False], ids=["fast", "reference"])
def test_filter_and_bind_open_closed_nodes_to_the_pods_that_tolerate_them(kube, feeders, speedups):
    for make in NODES.values():
        kube.create_node(make())
    pods = {}
    for name, (tolerations, _) in REACHES.items():
        pod = make_pod(name, gpus=1)
        pod["spec"]["schedulerName"] = "stowage-scheduler"
        if tolerations is not None:
            pod["spec"]["tolerations"] = tolerations
        pods[name] = kube.create_pod(pod)
    f = started(kube, feeders)
    kube.wait_for(lambda: all(f.pending_uid(f"default/{n}") for n in pods))
    svc = ExtenderService(f.model, binder=KubeBinder(kube.api_client()), pod_source=f, speedups=speedups,
                          filter_keeps="fitting")
    for name, (_, reach) in REACHES.items():
        body = encode({"Pod": pods[name], "Nodes": None, "NodeNames": sorted(NODES)})
        answer = orjson.loads(encode(svc.filter(parse_extender_args(body)).to_json()))
        assert set(answer["NodeNames"]) == reach, name
        refused = {**answer["FailedNodes"], **answer.get("FailedAndUnresolvableNodes", {})}
        assert refused == {n: WHY[n] for n in set(NODES) - reach}, name
    # Bind reads the watch's copy of the pending pod: the DaemonSet's pod is bound to the cordoned
    # node with its card recorded; the plain pod is refused there, saying why.
    uid = pods["daemonset"]["metadata"]["uid"]
    assert svc.bind(BindingArgs("daemonset", "default", uid, "cordoned")) == ""
    bound = kube.get_pod("default", "daemonset")
    assert bound["spec"]["nodeName"] == "cordoned"
    assert decode_allocation(bound["metadata"]["annotations"][ALLOCATION_ANNOTATION]).node == "cordoned"
    why = svc.bind(BindingArgs("plain", "default", pods["plain"]["metadata"]["uid"], "cordoned"))
    assert why.endswith("node is cordoned") and not kube.get_pod("default", "plain")["spec"].get("nodeName")
    assert svc.bind(BindingArgs("ready-only", "default", pods["ready-only"]["metadata"]["uid"], "both")).endswith(
        "node is cordoned and not Ready")


def test_every_closure_reads_well_after_kube_schedulers_count_prefix():
    """kube-scheduler prefixes each reason with its count of nodes and joins them with ", "."""
    from packing.fit import msg_closed
    texts = {msg_closed(bits) for bits in range(16)}
    assert len(texts) == 16 and all(t.startswith("node is ") and ", " not in t for t in texts)
