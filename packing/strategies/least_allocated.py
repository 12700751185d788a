"""``least-allocated``: kube-scheduler's LeastAllocated strategy (its default spread) on
``nvidia.com/gpu``; what ``stowage.io/node-policy: spread`` means.

    score(node) = (allocatable - allocated - requested) / allocatable

in milli-cards over the node's healthy cards. The emptier node wins.
"""
from __future__ import annotations

import numpy as np

from stowage.resources import GpuRequest

from ..model import CardArrays
from ..placer import SimplePlacer, gpu_utilisation, request_milli


def least_allocated(a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """(allocatable - allocated - requested) / allocatable per node in ``idx``."""
    used, cap = gpu_utilisation(a, idx)
    return (cap - used - request_milli(req, a, idx)) / np.maximum(cap, 1)


def placer() -> SimplePlacer:
    return SimplePlacer("least-allocated", least_allocated)
