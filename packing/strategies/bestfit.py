"""``bestfit``: the FGD paper's BestFit, from the score plugin of its simulator, including its
integer quantisation (which decides ties)::

    score(node) = trunc(100 * (1 - (0.5 * (cpu_free - cpu) / 128000 + 0.5 * (gpu_free - gpu) / 8000)))

with ``gpu_free`` the node's idle milli-cards: the least left over wins. A share pod goes on the
usable card with the least idle share (lowest index on ties); whole-GPU pods take the first free
cards.
"""
from __future__ import annotations

import numpy as np

from stowage.resources import GpuRequest

from ..frag import MILLI, card_left
from ..model import CardArrays
from ..placer import PlacerBase, first_free_cards
from ..pod_policy import PodPolicy

MAX_SPEC_CPU = 128000.0   # the simulator's normalisers (largest node: 128 CPUs, 8 GPUs)
MAX_SPEC_GPU = 8000.0


def _pod_milli(req: GpuRequest) -> float:
    if req.is_whole:
        return float(req.gpus * MILLI)
    return float(max(req.core_milli, req.mem_mib)) if req.is_shared else 0.0


def best_fit_card(a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray) -> list[int]:
    """The usable card with the least idle share (lowest index on ties)."""
    if req.is_whole:
        return first_free_cards(a, i, req, usable_row)
    cand = np.flatnonzero(usable_row)
    if not len(cand):
        return []
    left = card_left(a, np.array([i]))[0, cand]
    return [int(cand[int(np.argmin(left))])]


class BestFitPlacer(PlacerBase):
    """The paper's BestFit: least weighted CPU+GPU left over after placing, integer score."""

    name = "bestfit"

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        gpu_free = card_left(a, idx).sum(axis=1).astype(float)
        cpu_free = a.cpu_free[idx].astype(float)
        # Host CPU not modelled (the extender: inf): no CPU term, rank on the GPU alone.
        cpu_free = np.where(np.isfinite(cpu_free), cpu_free, float(req.cpu_milli))
        s = (cpu_free - req.cpu_milli) / MAX_SPEC_CPU * 0.5 + (gpu_free - _pod_milli(req)) / MAX_SPEC_GPU * 0.5
        return np.trunc((1.0 - s) * 100.0)

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        return best_fit_card(a, i, req, usable_row)
