"""``fgd``: fragmentation gradient descent, as published (Weng et al., "Beware of
Fragmentation", USENIX ATC '23, and the score plugin of its simulator)::

    score(node) = trunc(100 * sigmoid((F_before - F_after) / 1000))

with F the fragmentation measure of :mod:`packing.frag` over the typical workload, which this
reference placer is given up front (``knows_workload``). A share pod goes on the card of the node
with the best such score (first card on ties); whole-GPU pods take the first free cards.

It exists, with ``random`` and ``bestfit``, to calibrate the benchmark: if these three land on
the paper's published figures, the harness replays the experiment faithfully.
"""
from __future__ import annotations

import numpy as np

from stowage.resources import GpuRequest

from ..frag import FragPlacerBase
from ..model import CardArrays
from ..placer import first_free_cards, segment_max
from ..pod_policy import PodPolicy


class FgdPlacer(FragPlacerBase):
    """Fragmentation gradient descent, as published (integer sigmoid score)."""

    name = "fgd"
    knows_workload = True   # the paper's FGD is given the trace's own pod mix up front

    @staticmethod
    def _quantise(delta: np.ndarray) -> np.ndarray:
        return np.trunc(100.0 / (1.0 + np.exp(-delta / 1000.0)))

    def score(self, a: CardArrays, req: GpuRequest, idx: np.ndarray, usable: np.ndarray) -> np.ndarray:
        before, after, rows, kk = self.frag_after(a, req, idx, usable)
        if rows is None:
            return self._quantise(before - after)
        return segment_max(self._quantise(before[rows] - after), rows, len(idx))

    def choose_cards(self, a: CardArrays, i: int, req: GpuRequest, usable_row: np.ndarray,
                     policy: PodPolicy) -> list[int]:
        if not req.is_shared:
            return first_free_cards(a, i, req, usable_row)
        idx = np.array([i])
        u = np.zeros((a.shape[0], a.shape[1]), bool)
        u[i] = usable_row
        before, after, rows, kk = self.frag_after(a, req, idx, u)
        q = self._quantise(before[rows] - after)
        return [int(kk[int(np.argmax(q))])]
