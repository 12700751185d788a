"""Every placement policy by name, and which one serves each node-level pod policy value.

A fixed table, separate from the placer base (:mod:`packing.placer`) the strategies build on,
so nothing registers itself at import time and no module imports the one that imports it:

- ``stowage``: Stowage's own policy, and what ``pack`` means: the fragmentation score of
  :mod:`.strategies.stowage_frag` plus the Sum-of-Squares share packing (:mod:`.strategies.stowage`);
- ``stowage-frag``: the fragmentation score alone (the previous default; kept for comparison);
- ``most-allocated``, ``least-allocated`` (what ``spread`` means): kube-scheduler's strategies;
- ``fgd``, ``bestfit``, ``random``: the FGD paper's reference policies (benchmark calibration);
- ``gpushare-binpack``, ``hami-binpack``: other GPU-sharing schedulers' binpack.
"""
from __future__ import annotations

from typing import Callable

from .placer import Placer
from .pod_policy import PACK, SPREAD
from .strategies import least_allocated, most_allocated
from .strategies.bestfit import BestFitPlacer
from .strategies.fgd import FgdPlacer
from .strategies.gpushare import GpushareBinpackPlacer
from .strategies.hami import HamiBinpackPlacer
from .strategies.random_node import RandomPlacer
from .strategies.stowage import StowagePlacer
from .strategies.stowage_frag import StowageFragPlacer

PLACERS: dict[str, Callable[[], Placer]] = {
    "most-allocated": most_allocated.placer,
    "least-allocated": least_allocated.placer,
    "random": RandomPlacer,
    "bestfit": BestFitPlacer,
    "fgd": FgdPlacer,
    "gpushare-binpack": GpushareBinpackPlacer,
    "hami-binpack": HamiBinpackPlacer,
    "stowage": StowagePlacer,
    "stowage-frag": StowageFragPlacer,
}
# Which placer serves each node-level policy value; "pack" is Stowage's own policy.
POLICY_PLACER: dict[str, str] = {PACK: "stowage", SPREAD: "least-allocated"}


def get_placer(name: str) -> Placer:
    """A fresh placer by name (see :data:`PLACERS`)."""
    try:
        return PLACERS[name]()
    except KeyError:
        raise KeyError(f"unknown placement policy {name!r} (known: {', '.join(sorted(PLACERS))})") from None


def placer_for(policy_value: str) -> Placer:
    """A fresh placer serving a node-level policy value ("pack" or "spread")."""
    return get_placer(POLICY_PLACER[policy_value])
