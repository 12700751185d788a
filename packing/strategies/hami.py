"""``hami-binpack``: Project-HAMi's node and GPU scheduler policy ``binpack``, from its docs.
The fuller node wins, then the fuller card::

    score(node) = (used_devices + req_devices) / devices
                + (used_core + req_core) / core
                + (used_memory + req_memory) / memory
    score(card) = (used_core + req_core) / core + (used_memory + req_memory) / memory

summed over the node's healthy cards (cores in milli-cards, memory in MiB).
"""
from __future__ import annotations

import numpy as np

from stowage.resources import GpuRequest

from ..frag import MILLI
from ..model import CardArrays
from ..placer import PlacerBase, first_free_cards
from ..pod_policy import PodPolicy


def _card_usage(a: CardArrays, rows) -> tuple[np.ndarray, np.ndarray]:
    """(core used fraction, memory used fraction) per card."""
    valid = a.exists[rows] & a.healthy[rows]
    core = np.where(valid, (MILLI - a.core_free[rows]) / MILLI, 0.0)
    mem = np.where(valid, (a.mem_total[rows] - a.mem_free[rows]) / np.maximum(a.mem_total[rows], 1), 0.0)
    return core, mem


class HamiBinpackPlacer(PlacerBase):
    name = "hami-binpack"

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
