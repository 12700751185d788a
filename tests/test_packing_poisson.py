"""``poisson_at_least``: the chance that at least c pods of a class come when lam are expected,
which sets how much a scarce class's place is worth (the capability pressure's scarcity now).

It summed the Poisson terms from exp(-lam), which is 0.0 in floating point past lam ~ 745: every
term was 0 and the answer 1 whatever c, so on a large cluster a class with many pods to come
had every place valued as certain to be needed (P(X >= 1,100) at lam = 1,000 came out 1.0, not
0.0009). The reference here sums the terms in log space.
"""
from __future__ import annotations

import math

import pytest

from packing.strategies.stowage_frag import poisson_at_least


def reference(lam: float, c: int) -> float:
    """P(X >= c), X ~ Poisson(lam), from log-space terms (slow, exact to ~1e-12)."""
    if c <= 0:
        return 1.0
    below = sum(math.exp(k * math.log(lam) - lam - math.lgamma(k + 1)) for k in range(c))
    return max(0.0, 1.0 - below)


@pytest.mark.parametrize("lam,c", [
    (0.4, 1), (3.0, 2), (50.0, 60), (300.0, 280), (700.0, 720),
    (746.0, 700), (800.0, 850), (1000.0, 1000), (1000.0, 1100), (1000.0, 950), (5000.0, 5150), (20000.0, 19800),
])
def test_matches_the_log_space_sum(lam, c):
    assert poisson_at_least(lam, c) == pytest.approx(reference(lam, c), abs=0.01)


def test_large_lam_is_not_certainty():
    assert poisson_at_least(1000.0, 1100) < 0.01
    assert poisson_at_least(800.0, 850) < 0.1
    assert poisson_at_least(1000.0, 900) > 0.99


def test_edges():
    assert poisson_at_least(5.0, 0) == 1.0 and poisson_at_least(0.0, 1) == 0.0
    assert poisson_at_least(10.0, 10_000) == 0.0
