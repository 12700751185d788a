"""One placement path for callers that place pods one after another without kube-scheduler:
the bin-packing replay, the elastic simulation and ``stowage plan``.

They all place through the extender's own service (:class:`extender.service.ExtenderService`),
in kube-scheduler's order (:func:`schedule`): ``filter`` over the candidate nodes,
``prioritize`` over those that pass (when more than one does, and only when the service's filter
answers every node that fits: by default it answers only the best, as the shipped scheduler
config expects, and kube-scheduler calls no prioritize), the best-scored node by the one
choice rule (:func:`packing.decide.best_node`), ``bind``. Each pod is a Pod object
(:func:`request_pod` writes one for a request and a policy), parsed by the service's own code,
learned by the placers when the service first sees it, and booked by bind. So no caller can
know more, or less, than the live extender: there is no second copy of "decide a pod" to drift
(``tests/test_one_placement_path.py``).

A what-if (``stowage plan``) runs the service over a copy of the model
(:meth:`packing.model.ClusterModel.copy`), never over the live one.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from packing.decide import best_node
from packing.model import ClusterModel
from packing.placer import Placer
from packing.pod_policy import GPU_MODEL, GPU_MODEL_EXCLUDE, MIN_CARD_MEMORY, PodPolicy
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY, GpuRequest

from .service import FILTER_KEEPS_BEST, ExtenderService
from .wire import BindingArgs, ExtenderArgs

# What-if pods state GPU memory in MiB: the service then reads a request back to the MiB, what
# the model's cards hold, whatever unit the cluster's extender is configured with.
WHATIF_MEMORY_UNIT_MIB = 1
SCHEDULER_NAME = "stowage-scheduler"


def request_pod(name: str, req: GpuRequest, policy: PodPolicy | None = None, *, namespace: str = "default",
                uid: str | None = None, memory_unit_mib: int = WHATIF_MEMORY_UNIT_MIB) -> dict[str, Any]:
    """A pending Pod object that the service parses back to exactly ``req`` (GPU share, cards,
    host CPU and memory) and ``policy``'s card constraints (models, minimum card memory): one
    container whose limits are the request. Only the constraints are written; the node and card
    policies come from the service's default, as for a pod that does not set them.
    ``req.mem_mib`` must be a whole number of ``memory_unit_mib``."""
    limits: dict[str, str] = {}
    if req.cpu_milli:
        limits["cpu"] = f"{int(req.cpu_milli)}m"
    if req.host_mem_mib:
        limits["memory"] = str(int(round(req.host_mem_mib * (1 << 20))))   # bytes: exact for MiB/2**20
    if req.is_whole:
        limits[RESOURCE_GPU] = str(req.gpus)
        if req.min_card_mem_mib:
            limits[RESOURCE_GPU_MEMORY] = str(_units(req.min_card_mem_mib, memory_unit_mib))
    elif req.mem_mib:
        limits[RESOURCE_GPU_MEMORY] = str(_units(req.mem_mib, memory_unit_mib))
        if req.core_milli:
            limits[RESOURCE_GPU_CORE] = str(-(-req.core_milli // 10))
    ann: dict[str, str] = {}
    if policy is not None:
        if policy.models_include:
            ann[GPU_MODEL] = ",".join(policy.models_include)
        if policy.models_exclude:
            ann[GPU_MODEL_EXCLUDE] = ",".join(policy.models_exclude)
        if policy.min_card_mem_mib:
            ann[MIN_CARD_MEMORY] = f"{policy.min_card_mem_mib}Mi"
    uid = uid or f"{namespace}/{name}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1",
                         "annotations": ann},
            "spec": {"schedulerName": SCHEDULER_NAME,
                     "containers": [{"name": "main", "resources": {"limits": limits}}]},
            "status": {"phase": "Pending"}}


def _units(mib: int, unit: int) -> int:
    if mib % unit:
        raise ValueError(f"{mib} MiB is not a whole number of {unit} MiB units")
    return mib // unit


def serve(model: ClusterModel, placer: Placer, *, default_policy: PodPolicy | None = None,
          memory_unit_mib: int = WHATIF_MEMORY_UNIT_MIB) -> ExtenderService:
    """The extender's service over ``model``, serving every pod with ``placer`` (both node
    policies: the caller chose the placement policy), binding into the model only."""
    return ExtenderService(model, memory_unit_mib=memory_unit_mib, default_policy=default_policy,
                           placer_factory=lambda _value: placer)


def choose(model: ClusterModel, names: Sequence[str], scores: np.ndarray, tie: np.ndarray | None = None) -> str:
    """kube-scheduler's pick among the prioritized ``names`` (its own plugins left out): the best
    score, ties by ``tie`` (per model slot) or the lowest slot — :func:`packing.decide.best_node`."""
    rows = np.fromiter((model.index[n] for n in names), np.int64, len(names))
    return model.names[best_node(np.asarray(scores), rows, tie)] or ""


def schedule(service: ExtenderService, pod: dict[str, Any], names: list[str], tie: np.ndarray | None = None,
             refusals: dict[str, str] | None = None) -> str | None:
    """One pod as kube-scheduler takes it through the extender: filter, prioritize (only when
    more than one node passes and the filter answers every node that fits), :func:`choose`, bind.
    Returns the node, or None when no node passes (the pod stays pending; ``refusals`` then gets
    each node's reason) or bind refuses."""
    res = service.filter(ExtenderArgs(pod=pod, node_names=names, nodes=None, names=names))
    passing = res.node_names or []
    if not passing:
        if refusals is not None:
            refusals.update(res.failed)
            refusals.update(res.unresolvable)
        return None
    if len(passing) == 1:
        node = passing[0]
    elif service.filter_keeps == FILTER_KEEPS_BEST:
        # Equal to 1e-9 by the placer (filter kept only those): kube-scheduler's pick among them
        node = choose(service.model, passing, np.zeros(len(passing)), tie)
    else:
        got, scores = service.prioritize_scores(ExtenderArgs(pod=pod, node_names=passing, nodes=None,
                                                             names=passing))
        node = choose(service.model, got, scores, tie)
    m = pod["metadata"]
    err = service.bind(BindingArgs(m["name"], m["namespace"], m["uid"], node))
    return None if err else node
