"""The decision-CPU shortcuts keep every answer: each incremental or cached structure is compared
with computing it afresh, on seeded random clusters that change between calls (binds,
releases, re-inventoried and removed nodes, and calls with nothing changed).

- the SS term from per-pair keys cached with the local pair scores (``pair_keys`` /
  ``global_of_keys``, tables kept between calls) vs the term from the arrays and a fresh
  histogram (``ss_delta``);
- ``ClusterModel.row_tick`` shortcuts in the row cache, the content ids and the fragmentation
  index vs a fresh fit, fresh ids and an index synced by comparing arrays;
- ``reasons()`` on a few rows (dict) vs many rows (``np.unique``) vs one ``reason()`` per row;
- the share card choice over distinct cards vs the argmax over every usable card;
- ranking one value per row content vs ranking every row.
"""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from extender.fastreasons import SMALL_SETTLE, reasons
from packing.decide import to_extender_scores
from packing.fit import card_mask, fit, reason
from packing.registry import placer_for
from packing.model import ClusterModel
from packing.frag import FragIndex, MILLI, card_left
from packing.strategies.stowage_frag import CHURN_COST
from packing.strategies.stowage import ss_delta
from packing.pod_policy import PodPolicy
from extender.rowcache import RowCache
from stowage.resources import GpuRequest

from test_latency_equivalence import random_model, upsert_random

_UIDS = itertools.count()
SHARES = [GpuRequest(mem_mib=m, core_milli=c) for m, c in
          ((4096, 200), (10240, 300), (20480, 0), (2048, 100), (30720, 500), (8192, 250))]


def tracked_placer(model: ClusterModel, rng: random.Random):
    """The default ``pack`` placer wired to the model as the service wires it, having seen a mix."""
    placer = placer_for("pack")
    placer.track_rows(lambda a: model.row_gen if a is model.a else None, None,
                      lambda a: model.row_tick if a is model.a else None)
    placer.watch_releases(lambda: model.gpu_releases)
    placer.bind_models(model.models)
    for _ in range(40):
        placer.observe(rng.choice(SHARES) if rng.random() < 0.7 else GpuRequest(gpus=rng.choice([1, 2])))
    return placer


def change(model: ClusterModel, rng: random.Random, live: list[str], step: int) -> None:
    """One random change (or none): bind a share or a whole card, release, re-inventory, remove."""
    r = rng.random()
    names = model.node_names()
    if r < 0.45:
        req = rng.choice(SHARES) if rng.random() < 0.7 else GpuRequest(gpus=1)
        a = model.a
        f = fit(a, req, card_mask(a, model.models, PodPolicy(), req))
        ok = np.flatnonzero(f.ok)
        if len(ok):
            i = int(rng.choice(ok.tolist()))
            cards = np.flatnonzero(f.usable[i])[: max(req.gpus, 1)].tolist()
            uid = f"u{step}-{next(_UIDS)}"
            model.assign(uid, f"default/{uid}", model.names[i], cards, req, check=True)
            live.append(uid)
    elif r < 0.65 and live:
        model.release(live.pop(rng.randrange(len(live))))
    elif r < 0.72:
        upsert_random(model, rng, rng.choice(names + [f"new-{step}"]))
    elif r < 0.76 and len(names) > 10:
        model.remove_node(rng.choice(names))
    # else: nothing changes (the tick shortcuts must then return what they had)


def reference_ss(placer, model: ClusterModel, req: GpuRequest, ii: np.ndarray, kk: np.ndarray) -> np.ndarray:
    """-w * dSS computed the obvious way: gaps from the arrays, a fresh histogram, ss_delta."""
    a = model.a
    left = card_left(a, slice(None))
    hist = np.bincount(np.clip(left, 0, MILLI).ravel(), minlength=MILLI + 1)
    g0 = left[ii, kk]
    g1 = FragIndex.left_after_share(a, ii, kk, req)
    out = np.empty(len(ii))
    card = a.mem_total[ii, kk]
    for size in np.unique(card):
        sel = card == size
        out[sel] = -placer.ss_weight * ss_delta(hist, placer.live_gaps(float(size)), g0[sel], g1[sel],
                                                  waste_weight=placer.waste_weight)
    if placer.churn:
        out = np.clip(out, -CHURN_COST / 4, CHURN_COST / 4)
    return out


@pytest.mark.parametrize("seed", range(3))
def test_ss_term_from_cached_pair_keys_equals_the_term_from_the_arrays(seed):
    rng = random.Random(seed)
    model = random_model(rng, 60)
    placer = tracked_placer(model, rng)
    kept: dict[int, tuple] = {}  # req index -> (row_gen snapshot, ii, kk, keys) from an earlier step
    live: list[str] = []
    checked = 0
    for step in range(80):
        j = rng.randrange(len(SHARES))
        req = SHARES[j]
        a = model.a
        f = fit(a, req, card_mask(a, model.models, PodPolicy(), req))
        ok = np.flatnonzero(f.ok)
        if len(ok):
            rows, kk = np.nonzero(f.usable[ok])
            ii = ok[rows]
            keys = placer.pair_keys(a, req, ii, kk)
            want = reference_ss(placer, model, req, ii, kk)
            assert np.array_equal(placer.global_of_keys(a, req, keys), want), step
            assert np.array_equal(placer.global_pairs(a, req, ii, kk), want), step
            old = kept.get(j)
            if old is not None and old[0].shape == model.row_gen.shape:
                # keys made at an earlier step, for rows that did not change since: still exact
                same = old[0][old[1]] == model.row_gen[old[1]]
                if same.any():
                    got = placer.global_of_keys(a, req, old[3][same])
                    assert np.array_equal(got, reference_ss(placer, model, req, old[1][same], old[2][same])), step
                    checked += 1
            kept[j] = (model.row_gen.copy(), ii, kk, keys)
        if step == 50:
            placer.note_release()  # churn mode: the term is clipped, from the keys as from the arrays
        for _ in range(rng.randrange(3)):
            change(model, rng, live, step)
            if rng.random() < 0.3:
                placer.observe(rng.choice(SHARES))  # the live gaps move with the learned mix
    assert checked > 10


@pytest.mark.parametrize("seed", range(3))
def test_row_tick_shortcuts_equal_fresh_fits_ids_and_index(seed):
    rng = random.Random(10 + seed)
    model = random_model(rng, 50)
    cache = RowCache()
    placer = tracked_placer(model, random.Random(seed))     # index synced by row_gen + row_tick
    untracked = tracked_placer(model, random.Random(seed))  # the same learned mix
    untracked.track_rows(lambda a: None)           # ... vs by comparing the arrays
    live: list[str] = []
    policies = [PodPolicy(), PodPolicy(models_include=("H100", "L40S")), PodPolicy(models_exclude=("A10",))]
    for step in range(120):
        req = rng.choice(SHARES + [GpuRequest(gpus=1), GpuRequest(gpus=2), GpuRequest(gpus=8)])
        policy = rng.choice(policies)
        a = model.a
        e = cache.fit(model, req, policy)
        mask = card_mask(a, model.models, policy, req)
        f = fit(a, req, mask)
        assert (e.mask == mask).all() and (e.usable == f.usable).all(), step
        assert (e.ok == f.ok).all() and (e.unres == f.unresolvable).all(), step
        sig = cache.signatures(model)
        fresh = RowCache().signatures(model)
        # the same partition of rows into equal contents
        assert len(np.unique(np.stack([sig, fresh], axis=1), axis=0)) == len(np.unique(sig)) == len(np.unique(fresh))
        ix, ref = placer._index(a), untracked._index(a)
        for name in ("left", "idle", "cnt", "big", "gap_hist"):
            assert np.array_equal(getattr(ix, name), getattr(ref, name)), (step, name)
        assert np.allclose(ix.frag, ref.frag, rtol=0, atol=1e-6), step
        if rng.random() < 0.7:  # sometimes nothing changes before the next call
            change(model, rng, live, step)


@pytest.mark.parametrize("seed", range(2))
def test_reasons_of_few_rows_equal_reasons_of_many_and_of_one(seed):
    rng = random.Random(20 + seed)
    model = random_model(rng, 400)
    live: list[str] = []
    for step in range(600):  # fill the cluster so that most nodes fail most pods, for many reasons
        change(model, random.Random(step), live, step)
    a = model.a
    names = model.node_names()
    rows = np.array([model.index[n] for n in names])
    for req in SHARES + [GpuRequest(gpus=1), GpuRequest(gpus=4), GpuRequest(mem_mib=81920)]:
        for policy in (PodPolicy(), PodPolicy(models_include=("H100",))):
            mask = card_mask(a, model.models, policy, req)
            fail = rows[~fit(a, req, mask).ok[rows]]
            many = reasons(a, fail, req, mask)
            few = [t for c in range(0, len(fail), 7) for t in reasons(a, fail[c:c + 7], req, mask)]
            one = [reason(a, int(i), req, mask, detail=False) for i in fail]
            assert many == few == one
    assert len(fail) > SMALL_SETTLE  # the np.unique path ran too


@pytest.mark.parametrize("seed", range(3))
def test_share_card_choice_over_distinct_cards_equals_argmax_over_every_card(seed):
    rng = random.Random(30 + seed)
    model = random_model(rng, 40)
    placer = tracked_placer(model, rng)
    live: list[str] = []
    choices = 0
    for step in range(100):
        req = rng.choice(SHARES)
        a = model.a
        f = fit(a, req, card_mask(a, model.models, PodPolicy(), req))
        for i in np.flatnonzero(f.ok)[:5].tolist():
            u = np.zeros(a.shape, bool)
            u[i] = f.usable[i]
            s, _, kk = placer._pair_scores(a, req, np.array([i]), u)   # every usable card
            assert placer.choose_cards(a, i, req, f.usable[i], PodPolicy()) == [int(kk[int(np.argmax(s))])]
            choices += 1
        change(model, rng, live, step)
    assert choices > 100


@pytest.mark.parametrize("seed", range(3))
def test_ranking_one_value_per_content_equals_ranking_every_row(seed):
    rng = random.Random(40 + seed)
    model = random_model(rng, 80)
    placer = tracked_placer(model, rng)
    cache = RowCache()
    live: list[str] = []
    for step in range(60):
        req = rng.choice(SHARES)
        e = cache.fit(model, req, PodPolicy())
        rows = np.flatnonzero(e.ok)
        if len(rows) > 1:
            rows = np.concatenate([rows, rows[::3]])  # any order, repeats allowed
            values, inverse = cache.score_values(e, placer, model, req, rows)
            assert inverse is not None and len(values) <= len(set(rows.tolist()))
            per_row = values[inverse]
            fresh = placer.score(model.a, req, rows, e.usable)
            assert np.allclose(per_row, fresh, rtol=0, atol=1e-6), step
            assert (to_extender_scores(values)[inverse] == to_extender_scores(per_row)).all()
        change(model, rng, live, step)
