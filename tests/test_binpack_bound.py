"""The offline share-packing reference: best fit decreasing on hand-made item sets with known answers."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.binpack.bound import CARD, best_fit_decreasing_waste, share_waste_pct
from benchmarks.binpack.trace import Nodes, Pods


def test_perfect_pairs_leave_nothing():
    assert best_fit_decreasing_waste(np.array([300, 600, 400, 700, 500, 500])) == 0


def test_big_shares_leave_gaps_only_small_ones_fill():
    # 810s each open a card (190 free); the 160 goes into one of those gaps, not a new card.
    assert best_fit_decreasing_waste(np.array([810, 160, 810])) == 190 + 30


def test_fullest_card_that_fits_is_chosen():
    # Largest first: 700 | 600 | 500; then 300 -> the 700-card (0 left), 250 -> the 600-card (150 left).
    assert best_fit_decreasing_waste(np.array([250, 500, 300, 600, 700])) == 150 + 500


def test_only_shares_arriving_before_100_percent_count():
    nodes = Nodes(names=("n0",), cpu_milli=np.array([64000]), memory_mib=np.array([64000]),
                  gpus=np.array([2]), model=("T4",))
    # One whole GPU and one 810 share fill 1810 of 2000 milli; the extra copies arrive later.
    pods = Pods(name="t", cpu_milli=np.array([1000, 1000]), memory_mib=np.array([1, 1]),
                num_gpu=np.array([1, 1]), gpu_milli=np.array([1000, 810]), gpu_spec=("", ""))
    # Both pods arrive before 100 % (1810 milli); no resampled copy fits under 130 % of 2000.
    assert share_waste_pct(nodes, pods, seed=42) == 100 * 190 / 2000
    # A cluster of one card: the share arrives after the whole GPU (or is not counted) in some seed.
    one = Nodes(names=("n0",), cpu_milli=np.array([64000]), memory_mib=np.array([64000]),
                gpus=np.array([1]), model=("T4",))
    got = {share_waste_pct(one, pods, seed=s) for s in range(42, 52)}
    assert got <= {0.0, 19.0} and 0.0 in got      # only when the 810 comes first is it packed


# ------------------------------------------------------------------ the configuration LP (--lp)
from benchmarks.binpack.bound import configuration_lp_cards, lp_report, lp_waste_pct, main  # noqa: E402


def test_lp_known_optima():
    assert configuration_lp_cards([500] * 4) == 2.0
    assert configuration_lp_cards([810, 190, 810, 190]) == 2.0
    # Each size alone needs 1 + 3 = 4 cards; only a generated configuration {700, 300} finds 3.
    assert abs(configuration_lp_cards([300] * 3 + [700] * 3) - 3.0) < 1e-9
    # Fractional: two 400s per card, so three need 1.5 cards (any real packing needs 2).
    assert abs(configuration_lp_cards([400] * 3) - 1.5) < 1e-9
    assert configuration_lp_cards([]) == 0.0
    assert configuration_lp_cards([1000, 1000]) == 2.0


def test_lp_refuses_slices_that_are_not_part_of_a_card():
    for bad in ([0, 500], [500, 1001], [-5]):
        with pytest.raises(ValueError, match=r"slices must be in \(0, 1000\]"):
            configuration_lp_cards(bad)


def test_lp_bound_lies_between_the_volume_bound_and_best_fit_decreasing():
    rng = np.random.default_rng(7)
    mix = np.array([50, 110, 160, 190, 250, 320, 460, 470, 500, 590, 650, 810])   # openb-like slice sizes
    for _ in range(25):
        sl = rng.choice(mix, size=int(rng.integers(5, 120)))
        cards = configuration_lp_cards(sl)
        assert cards >= sl.sum() / CARD - 1e-9                      # no card holds more than 1000
        assert cards * CARD - sl.sum() <= best_fit_decreasing_waste(sl) + 1e-6   # BFD is a packing


def test_lp_waste_is_the_idle_beside_the_slices_in_percent_of_the_cluster():
    assert lp_waste_pct([810, 810], capacity_milli=4000) == 100 * (2000 - 1620) / 4000
    assert lp_waste_pct([600, 400], capacity_milli=2000) == 0.0


def test_lp_report_on_a_hand_made_cluster():
    # 3 cards; an 810, two 470s and a whole GPU (2,750 milli: nothing else fits under 100 %),
    # packed 810 | 470+470 | whole: the bound is tight, 2 cards for the slices, 250 milli idle.
    nodes = Nodes(names=("n0",), cpu_milli=np.array([64000]), memory_mib=np.array([64000]),
                  gpus=np.array([3]), model=("T4",))
    pods = Pods(name="hand", cpu_milli=np.full(4, 1000), memory_mib=np.ones(4, np.int64),
                num_gpu=np.ones(4, np.int64), gpu_milli=np.array([810, 470, 470, 1000]), gpu_spec=("",) * 4)
    text = lp_report(nodes, pods, "stowage", [42, 43, 44], progress=False)
    assert text.count("LP bound for the same 3 slices 8.333 %") == 3, text
    assert text.count("on its slice cards 8.333 %") == 3
    assert "median of 3 seeds: stowage 8.333 % idle" in text
    assert "no packing of the same slices leaves less than 8.333 %" in text


def test_lp_cli_names_an_unknown_policy(capsys):
    """While parsing, before any trace is loaded (exit 2)."""
    with pytest.raises(SystemExit) as exc:
        main(["--lp", "--policy", "no-such-policy", "--trace", "default", "--seeds", "1", "--no-progress"])
    assert exc.value.code == 2
    assert "argument --policy: unknown placement policy 'no-such-policy'" in capsys.readouterr().err
