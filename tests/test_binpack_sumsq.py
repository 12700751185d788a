"""Stowage's Sum-of-Squares share packing (extender/policies/sumsq.py) on a hand-made card state.

One node, eight 1000-milli cards: card 0 holds 470 (gap 530), card 1 holds 500 (gap 500),
cards 2-4 hold 470 + 500 (gap 30), cards 5-7 are empty. A 470-milli share arrives. With every
gap live, SS's change of sum N(g)^2 is, by hand (N(30) = 3, N(500) = N(530) = 1):

- card 0: 530 -> 60:   (2*0 + 1) - (2*1 - 1) = 0
- card 1: 500 -> 30:   (2*3 + 1) - (2*1 - 1) = 6
- card 5-7: new -> 530: (2*1 + 1)            = 3

so SS takes card 0, where Best Fit would close the tighter gap of card 1.
"""
from __future__ import annotations

import numpy as np

from benchmarks.binpack.replay import build_cluster
from benchmarks.binpack.trace import Nodes
from packing.strategies.stowage import StowagePlacer, ss_delta
from packing.pod_policy import PodPolicy
from packing.fit import card_mask, fit
from packing.registry import get_placer
from stowage.resources import GpuRequest


def share(m: int) -> GpuRequest:
    return GpuRequest(mem_mib=m, core_milli=m)


def hand_made_cluster():
    nodes = Nodes(names=("n0",), cpu_milli=np.array([96000]), memory_mib=np.array([786432]),
                  gpus=np.array([8]), model=("G2",))
    model = build_cluster(nodes)
    model.assign("a", "a", "n0", [0], share(470))
    model.assign("b", "b", "n0", [1], share(500))
    for k in (2, 3, 4):
        model.assign(f"c{k}", f"c{k}", "n0", [k], share(470))
        model.assign(f"d{k}", f"d{k}", "n0", [k], share(500))
    return model


def learned(name: str, mix: dict[int, int], model):
    placer = get_placer(name)
    placer.bind_models(model.models)
    for size, count in mix.items():
        for _ in range(count):
            placer.observe(share(size))
    return placer


def pair_scores(placer, model, req):
    a = model.a
    f = fit(a, req, card_mask(a, model.models, PodPolicy(), req))
    s, rows, kk = placer._pair_scores(a, req, np.array([0]), f.usable)
    return dict(zip(kk.tolist(), s.tolist())), f


class SsFirst(StowagePlacer):
    ss_weight = 1e9                                     # SS decides, Stowage only breaks its ties


def ss_first(model, mix: dict[int, int]) -> SsFirst:
    """A Stowage placer whose SS term outweighs everything else, having seen ``mix`` (size: count)."""
    first = SsFirst()
    first.bind_models(model.models)
    for size, count in mix.items():
        for _ in range(count):
            first.observe(share(size))
    return first


def test_ss_delta_by_hand():
    n = np.zeros(1001, np.int64)
    n[30], n[500], n[530] = 3, 1, 1
    live = np.ones(1001, bool)
    live[0] = live[1000] = False
    got = ss_delta(n, live, np.array([530, 500, 1000, 30]), np.array([60, 30, 530, 0]))
    assert got.tolist() == [0.0, 6.0, 3.0, -5.0]      # the last: a gap closed exactly
    live[30] = live[60] = False                         # dead gaps count like full cards
    got = ss_delta(n, live, np.array([530, 500]), np.array([60, 30]))
    assert got.tolist() == [-1.0, -1.0]


def test_live_gaps_follow_the_learned_mix():
    placer = StowagePlacer()
    assert placer.live_gaps()[1:1000].all()            # nothing seen: every gap is live
    for size, count in {30: 1, 470: 99, 500: 100}.items():
        for _ in range(count):
            placer.observe(share(size))
    live = placer.live_gaps()
    # 1 share in 200 fits a gap of 30..469: 0.5 % < dead_below (0.7 %) -> dead; 470 and up live.
    assert not live[30:470].any() and live[470:1000].all() and not live[0] and not live[1000]
    placer.observe(share(30))                           # 2 in 201 = 1.0 %: gaps from 30 come alive
    live = placer.live_gaps()
    assert not live[:30].any() and live[30:1000].all()


def test_ss_term_is_the_hand_computed_delta_and_picks_the_balancing_card():
    model = hand_made_cluster()
    mix = {30: 3, 470: 100, 500: 100}                  # 3/203 = 1.5 %: gaps 30 and 60 are live
    ss = learned("stowage", mix, model)
    plain = learned("stowage-frag", mix, model)          # the fragmentation score alone
    req = share(470)
    with_ss, f = pair_scores(ss, model, req)
    without, _ = pair_scores(plain, model, req)
    assert sorted(with_ss) == [0, 1, 5, 6, 7]            # cards that can hold 470
    expected = {0: 0.0, 1: 6.0, 5: 3.0, 6: 3.0, 7: 3.0}
    for k, d in expected.items():
        assert np.isclose(with_ss[k] - without[k], -ss.ss_weight * d), k

    first = ss_first(model, mix)
    assert first.choose_cards(model.a, 0, req, f.usable[0], PodPolicy()) == [0]


def test_local_part_is_row_local_and_the_global_part_follows_the_cluster():
    """What the extender's row cache relies on: ``local_pairs`` of a node depends on its row
    only (cached), ``global_pairs`` on the whole cluster's gaps (computed per request), and
    ``score`` is the per-node max of their sum minus nothing else."""
    nodes = Nodes(names=("n0", "n1"), cpu_milli=np.array([96000, 96000]),
                  memory_mib=np.array([786432, 786432]), gpus=np.array([8, 8]), model=("G2", "G2"))
    model = build_cluster(nodes)
    model.assign("a", "a", "n0", [0], share(470))
    placer = learned("stowage", {470: 10, 500: 10}, model)
    req = share(470)
    a = model.a
    f = fit(a, req, card_mask(a, model.models, PodPolicy(), req))
    both = np.array([0, 1])
    s, rows, kk = placer.local_pairs(a, req, both, f.usable)
    s0, rows0, kk0 = placer.local_pairs(a, req, np.array([0]), f.usable)
    assert np.allclose(s0, s[rows == 0]) and (kk0 == kk[rows == 0]).all()
    g_before = placer.global_pairs(a, req, both[rows], kk)
    raw = placer.score(a, req, both, f.usable)
    for node in (0, 1):
        assert np.isclose(raw[node], (s + g_before)[rows == node].max())
    model.assign("b", "b", "n1", [3], share(470))      # a share elsewhere: n0 row unchanged
    s0_again, _, _ = placer.local_pairs(a, req, np.array([0]), f.usable)
    assert np.allclose(s0_again, s0)
    g_after = placer.global_pairs(a, req, np.zeros(len(kk0), np.int64), kk0)
    assert not np.allclose(g_after, g_before[rows == 0])  # ... but the cluster's gaps moved


def test_the_index_keeps_the_gap_histogram_row_by_row():
    """FragIndex.gap_hist (what the SS term reads) equals a fresh bincount of the per-card gaps
    through binds, releases and re-syncs, with and without the model's row_gen."""
    import random

    from test_latency_equivalence import random_model

    rng = random.Random(5)
    model = random_model(rng, 30)
    placer = get_placer("stowage")
    placer.watch_releases(lambda: model.gpu_releases)
    for _ in range(20):
        placer.observe(share(rng.choice([200, 470, 810])))
    live = []
    for step in range(120):
        req = share(rng.choice([100, 250, 470])) if rng.random() < 0.7 else GpuRequest(gpus=1)
        a = model.a
        f = fit(a, req, card_mask(a, model.models, PodPolicy(), req))
        ok = np.flatnonzero(f.ok)
        if len(ok):
            i = int(rng.choice(ok.tolist()))
            placer.score(a, req, ok, f.usable)                   # syncs the index
            cards = placer.choose_cards(a, i, req, f.usable[i], PodPolicy())
            model.assign(f"u{step}", f"u{step}", model.names[i], cards, req, check=False)
            live.append(f"u{step}")
        if live and rng.random() < 0.3:
            model.release(live.pop(rng.randrange(len(live))))
        ix = placer._index(model.a)
        assert (ix.gap_hist == np.bincount(np.clip(ix.left, 0, 1000).ravel(), minlength=1001)).all(), step


def test_in_churn_mode_a_used_node_still_ranks_above_an_empty_one():
    """The SS term orders nodes within churn mode's tiers, never across them: a used node whose
    only card would join a gap value shared by 600 cards (SS penalty ~1.2e5 > the 1e5 cost of an
    empty node) still ranks above the empty node."""
    n = 77
    nodes = Nodes(names=tuple(f"n{j}" for j in range(n)), cpu_milli=np.full(n, 96000),
                  memory_mib=np.full(n, 786432), gpus=np.full(n, 8), model=("G2",) * n)
    model = build_cluster(nodes)
    model.assign("small", "small", "n0", [0], share(60))                 # n0: gap 940 on card 0
    model.assign("whole", "whole", "n0", [1, 2, 3, 4, 5, 6, 7], GpuRequest(gpus=7))
    for j in range(2, n):                                                 # 600 cards with gap 470
        for k in range(8):
            model.assign(f"s{j}-{k}", "s", f"n{j}", [k], share(530))
    placer = learned("stowage", {60: 5, 470: 50, 530: 50}, model)
    req = share(470)
    a = model.a
    f = fit(a, req, card_mask(a, model.models, PodPolicy(), req))
    two = np.array([0, 1])
    assert f.ok[two].all()
    calm = placer.score(a, req, two, f.usable)
    assert calm[1] > calm[0]                       # without churn mode SS prefers the empty node
    placer.note_release()                          # a GPU pod left: churn mode
    busy = placer.score(a, req, two, f.usable)
    assert busy[0] > busy[1]


def test_dead_waste_breaks_the_tie_between_closing_cards():
    """Gaps under 470 are dead for a mix of 470s and 500s. A 470 closes card 0 (530 -> 60) or
    card 1 (500 -> 30): both move a card out of a live gap of population 1 into a dead gap,
    dSS = -1 for both. The dead-waste term (waste_weight * g) tells them apart: 0.05 * 60 - 1 = 2
    against 0.05 * 30 - 1 = 0.5, so SS closes card 1, leaving 30 milli instead of 60; a fresh
    card (1000 -> 530, N(530) = 1) is 2 * 1 + 1 = 3."""
    model = hand_made_cluster()
    mix = {470: 100, 500: 100}
    ss = learned("stowage", mix, model)
    plain = learned("stowage-frag", mix, model)
    assert not ss.live_gaps()[1:470].any() and ss.live_gaps()[470:1000].all()
    req = share(470)
    with_ss, f = pair_scores(ss, model, req)
    without, _ = pair_scores(plain, model, req)
    w, k = ss.ss_weight, ss.waste_weight
    expected = {0: k * 60 - 1, 1: k * 30 - 1, 5: 3.0}
    for card, d in expected.items():
        assert np.isclose(with_ss[card] - without[card], -w * d), card
    assert ss_delta(np.bincount([530, 500, 30, 30, 30], minlength=1001), ss.live_gaps(),
                    np.array([530, 500]), np.array([60, 30]), waste_weight=k).tolist() == [k * 60 - 1, k * 30 - 1]

    first = ss_first(model, mix)
    assert first.choose_cards(model.a, 0, req, f.usable[0], PodPolicy()) == [1]
