"""``random``: one uniformly random feasible node; a share pod goes on a random card that fits
(the FGD paper's Random baseline, for calibrating the benchmark).

Its ``version`` is None: its scores are draws from a stream, not a function of the node, so
hosts never cache them.
"""
from __future__ import annotations

import numpy as np

from stowage.resources import GpuRequest

from ..model import CardArrays
from ..placer import PlacerBase, first_free_cards
from ..pod_policy import PodPolicy


class RandomPlacer(PlacerBase):
    """Uniformly random feasible node; random card for a share pod."""

    name = "random"
    version = None

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def reseed(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        return self.rng.random(len(idx))

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        if req.is_whole:
            return first_free_cards(a, i, req, usable_row)
        cand = np.flatnonzero(usable_row)
        return [int(cand[self.rng.integers(len(cand))])] if len(cand) else []
