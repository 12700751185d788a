"""The benchmark's simulated cluster and pods: pure, seeded data, no I/O beyond writing the file.

The cluster is a ``stowage extender --simulated`` file (the format of
``extender/data/default-cluster.yaml``), so the extender under test loads it through its own
deployed code path. Pods are ``v1.Pod`` JSON objects shaped like the ones a real
kube-scheduler sends (metadata with managedFields and the last-applied annotation, defaulted
spec, tolerations, status), because the request body's size and shape are part of what is
being measured.
"""
from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY

CARDS_PER_NODE = 8
_NS = uuid.UUID("0b5e7a4e-7f3c-4f4e-9c59-3d2f1e0c9a11")


@dataclass(frozen=True)
class NodeType:
    prefix: str
    model: str
    memory_gib: int
    share: float          # fraction of the cluster's nodes
    nvlink: Any = None    # simcluster "nvlink" value


NODE_TYPES = (
    NodeType("h100", "NVIDIA H100-SXM5-80GB", 80, 0.20, "all"),
    NodeType("a100-80g", "NVIDIA A100-SXM4-80GB", 80, 0.30, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    NodeType("a100-40g", "NVIDIA A100-SXM4-40GB", 40, 0.20, "all"),
    NodeType("l40s", "NVIDIA L40S", 48, 0.15),
    NodeType("a10", "NVIDIA A10", 24, 0.15),
)


def node_counts(n: int) -> list[tuple[NodeType, int]]:
    """How many nodes of each type a cluster of ``n`` nodes has (they add up to ``n``)."""
    counts = [int(n * t.share) for t in NODE_TYPES]
    counts[0] += n - sum(counts)
    return [(t, c) for t, c in zip(NODE_TYPES, counts) if c > 0]


def cluster_doc(n: int) -> dict[str, Any]:
    """A simulated-cluster document of ``n`` GPU nodes with 8 cards each, mixed models."""
    nodes = []
    for t, count in node_counts(n):
        gpus: dict[str, Any] = {"model": t.model, "count": CARDS_PER_NODE, "memory": f"{t.memory_gib}Gi",
                                "numa": [0, 0, 0, 0, 1, 1, 1, 1]}
        if t.nvlink is not None:
            gpus["nvlink"] = t.nvlink
        nodes.append({"name": f"{t.prefix}-{{i:05d}}", "count": count, "cpu": 128, "memory": "1Ti", "gpus": gpus})
    return {"memoryUnitMiB": 1024, "nodes": nodes}


def node_names(n: int) -> list[str]:
    """The node names of :func:`cluster_doc` ``(n)``, in file order (what NodeNames lists)."""
    return [f"{t.prefix}-{i:05d}" for t, count in node_counts(n) for i in range(1, count + 1)]


def write_cluster(n: int, directory: Path) -> Path:
    path = Path(directory) / f"cluster-{n}.yaml"
    path.write_text(yaml.safe_dump(cluster_doc(n), sort_keys=False))
    return path


# ------------------------------------------------------------------------------------ pods
def _managed_fields(limits: dict[str, str]) -> list[dict[str, Any]]:
    res = {f"f:{k}": {} for k in limits}
    return [{
        "manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "v1",
        "time": "2026-11-29T15:41:13Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}}},
                     "f:spec": {"f:containers": {'k:{"name":"c"}': {
                         ".": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {},
                         "f:resources": {".": {}, "f:limits": {".": {}, **res}, "f:requests": {".": {}, **res}},
                         "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}}},
                         "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {},
                         "f:schedulerName": {}, "f:securityContext": {}, "f:terminationGracePeriodSeconds": {}}},
    }]


def pod_object(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None,
               namespace: str = "bench") -> dict[str, Any]:
    """A ``v1.Pod`` as kube-scheduler sends it (requests defaulted from limits)."""
    uid = str(uuid.uuid5(_NS, f"{namespace}/{name}"))
    ann = {"kubectl.kubernetes.io/last-applied-configuration":
           '{"apiVersion":"v1","kind":"Pod","metadata":{"annotations":{},"name":"%s","namespace":"%s"},'
           '"spec":{"containers":[{"image":"busybox","name":"c","resources":{"limits":%s}}]}}\n'
           % (name, namespace, str(limits).replace("'", '"').replace(" ", "")),
           **(annotations or {})}
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "80",
                     "creationTimestamp": "2026-11-29T15:41:13Z", "annotations": ann,
                     "managedFields": _managed_fields(limits)},
        "spec": {"containers": [{"name": "c", "image": "busybox",
                                 "resources": {"limits": dict(limits), "requests": dict(limits)},
                                 "terminationMessagePath": "/dev/termination-log",
                                 "terminationMessagePolicy": "File", "imagePullPolicy": "Always"}],
                 "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
                 "securityContext": {}, "schedulerName": "default-scheduler",
                 "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                  "effect": "NoExecute", "tolerationSeconds": 300},
                                 {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                                  "effect": "NoExecute", "tolerationSeconds": 300}],
                 "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority"},
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }


def random_limits(rng: random.Random) -> dict[str, str]:
    """A GPU request from a mix like production: mostly shares and single cards, some multi-card."""
    r = rng.random()
    if r < 0.45:   # a share of one card: memory (GiB) and compute (%)
        mem = rng.choice([2, 4, 8, 10, 16, 20])
        return {RESOURCE_GPU_MEMORY: str(mem), RESOURCE_GPU_CORE: str(rng.choice([10, 20, 25, 30, 50]))}
    if r < 0.50:   # memory only
        return {RESOURCE_GPU_MEMORY: str(rng.choice([4, 8, 12]))}
    if r < 0.80:
        return {RESOURCE_GPU: "1"}
    if r < 0.93:
        return {RESOURCE_GPU: "2"}
    return {RESOURCE_GPU: rng.choice(["4", "8"])}


def random_annotations(rng: random.Random) -> dict[str, str]:
    """Policy annotations on some pods (model choice, spread): exercises every scoring branch."""
    r = rng.random()
    if r < 0.08:
        return {"stowage.io/gpu-model": rng.choice(["H100", "A100-SXM4-80GB", "L40S"])}
    if r < 0.12:
        return {"stowage.io/gpu-model-exclude": "A10"}
    if r < 0.20:
        return {"stowage.io/node-policy": "spread"}
    return {}


def pods(count: int, seed: int, prefix: str = "pod") -> list[dict[str, Any]]:
    """``count`` seeded pods of mixed shapes and policies."""
    rng = random.Random(seed)
    return [pod_object(f"{prefix}-{seed}-{j}", random_limits(rng), random_annotations(rng)) for j in range(count)]


def prefill_plan(n: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    """(node, pod) pairs leaving half the nodes partly used: one or two pods on each, no full node."""
    rng = random.Random(seed)
    names = node_names(n)
    plan = []
    for j, node in enumerate(rng.sample(names, n // 2)):
        for m in range(rng.choice([1, 1, 2])):
            r = rng.random()
            if r < 0.5:
                limits = {RESOURCE_GPU: str(rng.choice([1, 1, 2, 3]))}
            else:
                limits = {RESOURCE_GPU_MEMORY: str(rng.choice([4, 8, 10, 16])),
                          RESOURCE_GPU_CORE: str(rng.choice([20, 25, 50]))}
            plan.append((node, pod_object(f"fill-{j}-{m}", limits)))
    return plan


# ------------------------------------------------------------------------- full Node objects
def _bloat(name: str, j: int) -> dict[str, Any]:
    """What makes a real v1.Node 5-25 KB: images, managedFields, nodeInfo, addresses (~8 KB here)."""
    images = [{"names": [f"registry.example.com/team-{k % 7}/image-{k}@sha256:{(j * 31 + k):064x}",
                         f"registry.example.com/team-{k % 7}/image-{k}:v1.{k}.0"], "sizeBytes": 100_000_000 + k * 7919}
              for k in range(30)]
    return {
        "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                           "time": "2026-11-29T15:00:00Z", "fieldsType": "FieldsV1", "subresource": "status",
                           "fieldsV1": {"f:status": {"f:allocatable": {"f:nvidia.com/gpu": {}},
                                                     "f:capacity": {"f:nvidia.com/gpu": {}},
                                                     "f:conditions": {'k:{"type":"Ready"}': {
                                                         "f:lastHeartbeatTime": {}}}}}}],
        "status": {"images": images,
                   "addresses": [{"type": "InternalIP", "address": f"10.{j // 65536 % 256}.{j // 256 % 256}.{j % 256}"},
                                 {"type": "Hostname", "address": name}],
                   "nodeInfo": {"machineID": f"{j:032x}", "systemUUID": str(uuid.uuid5(_NS, name)),
                                "bootID": str(uuid.uuid5(_NS, name + "/boot")), "kernelVersion": "6.5.0-1018",
                                "osImage": "Ubuntu 22.04.4 LTS", "containerRuntimeVersion": "containerd://1.7.12",
                                "kubeletVersion": "v1.28.7", "kubeProxyVersion": "v1.28.7",
                                "operatingSystem": "linux", "architecture": "amd64"},
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}},
    }


def node_items(n: int) -> dict[str, bytes]:
    """Every node of :func:`cluster_doc` ``(n)`` as the JSON of a realistic ``v1.Node`` (name -> bytes).

    Built by :func:`extender.simcluster.node_objects` (so it carries the inventory annotation the
    device plugin would publish) plus the images/managedFields that real nodes carry.
    """
    import orjson

    from extender.simcluster import node_objects, parse_cluster

    out = {}
    for j, node in enumerate(node_objects(parse_cluster(cluster_doc(n), "bench"))):
        name = node["metadata"]["name"]
        extra = _bloat(name, j)
        node["metadata"]["managedFields"] = extra["managedFields"]
        node["status"].update(extra["status"])
        out[name] = orjson.dumps(node)
    return out
