"""The binpack policies of the GPU-sharing schedulers people deploy today, from their docs.

- ``gpushare-binpack`` (AliyunContainerService/gpushare-scheduler-extender): a pod goes where a
  card with the *least* free GPU memory that still fits is, and on that card. Whole-GPU pods:
  the node with the least idle GPU that still has the cards. It has no opinion on CPU-only pods.
- ``hami-binpack`` (Project-HAMi, node and GPU scheduler policy ``binpack``): node score
  ``(requested + used) / allocatable`` summed over devices, cores and memory — the fuller node
  wins; card score ``(req.core + used.core)/core + (req.mem + used.mem)/mem`` — the fuller card wins.
"""
from __future__ import annotations

import numpy as np

from extender.model import CardArrays
from extender.policy import PodPolicy
from stowage.resources import GpuRequest

from .frag import MILLI, card_left
from .reference import best_fit_card, first_free_cards


class GpushareBinpackPlacer:
    name = "gpushare-binpack"
    version = 0  # no learned state: scores depend on the node's row only (cacheable per row)

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        left = card_left(a, idx)
        if req.is_shared:
            mem = np.where(usable[idx], a.mem_free[idx], np.iinfo(np.int64).max)
            return -mem.min(axis=1).astype(float)
        if req.is_whole:
            return -left.sum(axis=1).astype(float)
        return np.zeros(len(idx))

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        if req.is_whole:
            return first_free_cards(a, i, req, usable_row)
        cand = np.flatnonzero(usable_row)
        return [int(cand[int(np.argmin(a.mem_free[i, cand]))])] if len(cand) else []

    def observe(self, req: GpuRequest) -> None:
        return None


def _card_usage(a: CardArrays, rows) -> tuple[np.ndarray, np.ndarray]:
    """(core used fraction, memory used fraction) per card."""
    valid = a.exists[rows] & a.healthy[rows]
    core = np.where(valid, (MILLI - a.core_free[rows]) / MILLI, 0.0)
    mem = np.where(valid, (a.mem_total[rows] - a.mem_free[rows]) / np.maximum(a.mem_total[rows], 1), 0.0)
    return core, mem


class HamiBinpackPlacer:
    name = "hami-binpack"
    version = 0  # no learned state: scores depend on the node's row only (cacheable per row)

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        valid = a.exists[idx] & a.healthy[idx]
        n = np.maximum(valid.sum(axis=1), 1)
        core, mem = _card_usage(a, idx)
        used_dev = (valid & (a.pods[idx] > 0)).sum(axis=1)
        mem_total = np.maximum(np.where(valid, a.mem_total[idx], 0).sum(axis=1), 1)
        if req.is_whole:
            r_dev, r_core, r_mem = req.gpus, req.gpus * MILLI, req.gpus * a.mem_total[idx].max(axis=1)
        elif req.is_shared:
            r_dev, r_core, r_mem = 1, req.core_milli, req.mem_mib
        else:
            r_dev, r_core, r_mem = 0, 0, 0
        return ((used_dev + r_dev) / n + (core.sum(axis=1) * MILLI + r_core) / (n * MILLI)
                + ((mem * np.maximum(a.mem_total[idx], 1)).sum(axis=1) + r_mem) / mem_total)

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        if req.is_whole:
            return first_free_cards(a, i, req, usable_row)
        cand = np.flatnonzero(usable_row)
        if not len(cand):
            return []
        core, mem = _card_usage(a, np.array([i]))
        s = core[0, cand] + mem[0, cand]
        return [int(cand[int(np.argmax(s))])]

    def observe(self, req: GpuRequest) -> None:
        return None


__all__ = ["GpushareBinpackPlacer", "HamiBinpackPlacer", "best_fit_card"]
