"""Stowage's placement policy (what ``stowage.io/node-policy: pack`` means). Draft."""
from __future__ import annotations

import numpy as np

from extender.model import CardArrays
from extender.policy import PodPolicy
from stowage.resources import GpuRequest

from .frag import PodClass, card_left
from .reference import FragPlacerBase, first_free_cards, segment_max


class StowagePlacer(FragPlacerBase):
    name = "stowage"

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0
        self._next = 1

    def observe(self, req: GpuRequest) -> None:
        self.workload.add(PodClass.of(req))
        self.seen += 1
        if self.seen >= self._next:
            self._rebuild()
            self._next = self.seen * 2 if self.seen < 256 else self.seen + 128

    def _pair_scores(self, a, req, idx, usable):
        before, after, rows, kk = self.frag_after(a, req, idx, usable)
        ix = self.index
        if rows is None:
            if req.is_whole:
                idle_after = ix.idle[idx] - req.gpus * 1000
            else:
                idle_after = ix.idle[idx]
            return before - after - 1e-6 * idle_after, None, None
        left = ix.left[idx[rows], kk]
        idle_after = ix.idle[idx[rows]] - max(req.core_milli, req.mem_mib)
        return before[rows] - after - 1e-6 * idle_after - 1e-9 * left, rows, kk

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        s, rows, kk = self._pair_scores(a, req, idx, usable)
        if rows is None:
            return s
        return segment_max(s, rows, len(idx))

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        if not req.is_shared:
            return first_free_cards(a, i, req, usable_row)
        u = np.zeros(a.shape, bool)
        u[i] = usable_row
        s, rows, kk = self._pair_scores(a, req, np.array([i]), u)
        return [int(kk[int(np.argmax(s))])]
