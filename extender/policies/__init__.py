"""Placement policies beyond the two built into :mod:`extender.scoring`.

Importing this package registers them by name with :func:`extender.scoring.register_placer`
(``extender.scoring`` imports it lazily on the first ``get_placer``/``placer_for``):

- ``stowage``: Stowage's own policy, and what ``pack`` means: the fragmentation score of
  :mod:`.stowage` plus the Sum-of-Squares share packing of :mod:`.sumsq`;
- ``stowage-frag``: the fragmentation score alone (the previous default; kept for comparison);
- ``fgd``, ``bestfit``, ``random``: the published reference policies (:mod:`.reference`);
- ``gpushare-binpack``, ``hami-binpack``: other GPU-sharing schedulers' binpack (:mod:`.vendors`).
"""
from __future__ import annotations

from extender.scoring import register_placer

from .reference import BestFitPlacer, FgdPlacer, RandomPlacer
from .stowage import StowagePlacer
from .vendors import GpushareBinpackPlacer, HamiBinpackPlacer
from .sumsq import SumOfSquaresPlacer

register_placer("random", RandomPlacer)
register_placer("bestfit", BestFitPlacer)
register_placer("fgd", FgdPlacer)
register_placer("gpushare-binpack", GpushareBinpackPlacer)
register_placer("hami-binpack", HamiBinpackPlacer)
register_placer("stowage", SumOfSquaresPlacer, as_pack_default=True)
register_placer("stowage-frag", StowagePlacer)

__all__ = ["BestFitPlacer", "FgdPlacer", "RandomPlacer", "StowagePlacer", "SumOfSquaresPlacer",
           "GpushareBinpackPlacer", "HamiBinpackPlacer"]
