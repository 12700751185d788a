"""``gpushare-binpack``: the binpack of AliyunContainerService/gpushare-scheduler-extender, from
its docs. A share pod goes where a card with the *least* free GPU memory that still fits is, and
on that card; whole-GPU pods go to the node with the least idle GPU that still has the cards::

    score(node) = -min(mem_free of a usable card)       share pod
    score(node) = -sum(idle milli-cards)                whole-GPU pod
    score(node) = 0                                     CPU-only pod (no opinion)
"""
from __future__ import annotations

import numpy as np

from stowage.resources import GpuRequest

from ..frag import card_left
from ..model import CardArrays
from ..placer import PlacerBase, first_free_cards
from ..pod_policy import PodPolicy


class GpushareBinpackPlacer(PlacerBase):
    name = "gpushare-binpack"

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
