"""Why a node takes no new pods, and which pods may go there anyway: the taints kube-scheduler tests.

kube-scheduler (v1.28) keeps a cordoned node (``spec.unschedulable``) from every pod *except* one
that tolerates the taint ``node.kubernetes.io/unschedulable:NoSchedule`` (its NodeUnschedulable
filter); the node lifecycle controller taints a node whose Ready condition is False with
``node.kubernetes.io/not-ready:NoSchedule`` and one whose Ready condition is Unknown with
``node.kubernetes.io/unreachable:NoSchedule`` (and a new node starts with the not-ready taint, put
there by the kubelet that registers it), which its TaintToleration filter lets only tolerating
pods past. DaemonSet pods tolerate the cordon; a pod with a blanket ``operator: Exists``
toleration tolerates all three.

The extender closes such nodes itself (it cannot trust an inventory a NotReady node's device
plugin no longer refreshes to pods that did not ask for it), so it keeps *why* a node is closed
(:class:`NodeClosure`, one bit per reason) and opens it to a pod whose tolerations cover every
reason, as kube-scheduler does: otherwise a tolerating GPU pod (a burn-in DaemonSet on a node
cordoned for maintenance) stays Pending where kube-scheduler alone would bind it.

Matching follows the Kubernetes API's ``Toleration.ToleratesTaint`` exactly: an effect, when
given, must equal the taint's; a key, when given, must equal the taint's; operator ``Exists``
matches any value, ``Equal`` (or none) only an equal value (these taints carry none). Anything
a pod author writes is read defensively: a toleration of another shape tolerates nothing.
"""
from __future__ import annotations

import enum
from typing import Any, Mapping


class NodeClosure(enum.IntFlag):
    """Why a node takes no new pods: 0 is open; each bit one reason."""

    CORDONED = 1      # spec.unschedulable: taint node.kubernetes.io/unschedulable
    NOT_READY = 2     # Ready condition False (or none yet): node.kubernetes.io/not-ready
    UNREACHABLE = 4   # Ready condition Unknown: node.kubernetes.io/unreachable
    OTHER = 8         # closed for a reason no toleration opens (a reader's own; see KubeFeeder.node_closed)


# The NoSchedule taint behind each reason a toleration can open.
TAINT_KEYS: dict[NodeClosure, str] = {
    NodeClosure.CORDONED: "node.kubernetes.io/unschedulable",
    NodeClosure.NOT_READY: "node.kubernetes.io/not-ready",
    NodeClosure.UNREACHABLE: "node.kubernetes.io/unreachable",
}
NO_SCHEDULE = "NoSchedule"


def tolerates_taint(toleration: Any, key: str, value: str = "", effect: str = NO_SCHEDULE) -> bool:
    """``Toleration.ToleratesTaint`` of the Kubernetes API for one toleration (a Pod's
    ``spec.tolerations`` item) and the taint ``key=value:effect``; False for anything that is
    not a toleration object."""
    if not isinstance(toleration, Mapping):
        return False
    t_effect, t_key = toleration.get("effect") or "", toleration.get("key") or ""
    if not isinstance(t_effect, str) or not isinstance(t_key, str):
        return False
    if t_effect and t_effect != effect:
        return False
    if t_key and t_key != key:
        return False
    operator = toleration.get("operator") or ""
    if operator in ("", "Equal"):
        return (toleration.get("value") or "") == value
    return operator == "Exists"


def tolerated_closures(pod: Mapping[str, Any]) -> NodeClosure:
    """The reasons a node is closed that the pod's ``spec.tolerations`` open (0: none)."""
    spec = pod.get("spec")
    tolerations = spec.get("tolerations") if isinstance(spec, Mapping) else None
    if not isinstance(tolerations, list):
        return NodeClosure(0)
    out = NodeClosure(0)
    for reason, key in TAINT_KEYS.items():
        if any(tolerates_taint(t, key) for t in tolerations):
            out |= reason
    return out


def tolerations_for(closures: int) -> list[dict[str, str]]:
    """The fewest tolerations that open exactly ``closures`` (what a bounded copy of a pod keeps
    of its own, however many it wrote)."""
    return [{"key": key, "operator": "Exists", "effect": NO_SCHEDULE}
            for reason, key in TAINT_KEYS.items() if closures & reason]


# A closure in the words of a filter reason (no ", ": kube-scheduler joins reasons with it).
_WORDS = {NodeClosure.CORDONED: "cordoned", NodeClosure.NOT_READY: "not Ready",
          NodeClosure.UNREACHABLE: "unreachable (Ready Unknown)", NodeClosure.OTHER: "closed"}


def closure_words(closures: int) -> str:
    """``closures`` in words, e.g. "cordoned and not Ready" ("" for none)."""
    return " and ".join(w for reason, w in _WORDS.items() if closures & reason)
