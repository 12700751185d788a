"""stowage.io/min-card-memory with a vanishingly small size: the pod author's error says what is
wrong with it (found by parse_policy on "1e-300": it was "more than any card could ever hold")."""
from __future__ import annotations

import pytest

from packing.pod_policy import MIN_CARD_MEMORY, PolicyError, parse_policy


@pytest.mark.parametrize("value", ["1e-300", "8E-41"])
def test_a_size_too_small_to_mean_anything_is_not_called_too_big(value):
    with pytest.raises(PolicyError) as exc:
        parse_policy({MIN_CARD_MEMORY: value})
    said = str(exc.value)
    assert said.startswith(f"annotation {MIN_CARD_MEMORY}: '{value}' ") and "more than" not in said
    assert "too small" in said


def test_a_size_too_big_is_still_called_too_big():
    with pytest.raises(PolicyError, match="more than any card could ever hold"):
        parse_policy({MIN_CARD_MEMORY: "1e400"})
