"""``most-allocated``: kube-scheduler's MostAllocated strategy on ``nvidia.com/gpu``.

    score(node) = (allocated + requested) / allocatable

in milli-cards over the node's healthy cards (a shared card counts its larger used share of
memory and compute). The fuller node wins: pods pack onto busy nodes.
"""
from __future__ import annotations

import numpy as np

from stowage.resources import GpuRequest

from ..model import CardArrays
from ..placer import SimplePlacer, gpu_utilisation, request_milli


def most_allocated(a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """(allocated + requested) / allocatable per node in ``idx``."""
    used, cap = gpu_utilisation(a, idx)
    return (used + request_milli(req, a, idx)) / np.maximum(cap, 1)


def placer() -> SimplePlacer:
    return SimplePlacer("most-allocated", most_allocated)
