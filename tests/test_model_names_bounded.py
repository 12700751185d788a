"""The model's GPU model-name table stays bounded by what the nodes hold now.

Names come from node inventories; a node whose inventory is rewritten with new names on every
update (up to 64 cards each) once grew ``ClusterModel.models`` for the life of the process, and
every gpu-model-restricted filter matched its patterns against all of them. Unused names are
now dropped and the ids renumbered (``ClusterModel.compact_models``); the placers' caches
derived from ids (FragIndex matches, the model pressure) and the row cache follow, so no
decision changes."""
from __future__ import annotations

import random

import numpy as np
import pytest

import packing.model
from extender.service import ExtenderService
from extender.wire import BindingArgs, ExtenderArgs
from extender_harness import gpus, model_from
from packing.model import MODEL_NAMES_SLACK, ClusterModel
from stowage.inventory import MAX_CARDS_PER_NODE, Card, Inventory, model_matches

NODES = ["a100-1", "a100-2", "t4-1", "t4-2", "rot", "junk"]


def cluster() -> ClusterModel:
    return model_from({"nodes": [
        {"name": "a100-1", "gpus": gpus("NVIDIA A100-SXM4-80GB", 4, "80Gi")},
        {"name": "a100-2", "gpus": gpus("NVIDIA A100-SXM4-80GB", 8, "80Gi")},
        {"name": "t4-1", "gpus": gpus("Tesla T4", 2, "16Gi")},
        {"name": "t4-2", "gpus": gpus("Tesla T4", 4, "16Gi")},
    ]})


def rewrite(model: ClusterModel, node: str, prefix: str, rnd: int, count: int, mib: int = 40960) -> None:
    """The node's inventory annotation rewritten with ``count`` cards of names never seen before."""
    cards = tuple(Card(index=k, uuid=f"GPU-{node}-{k}", model=f"{prefix}-REV{rnd:05d}-{k:02d}", memory_mib=mib)
                  for k in range(count))
    model.upsert_node(node, Inventory(cards=cards, source="annotation"))


def test_names_stay_bounded_when_a_node_rewrites_its_inventory_with_new_names():
    model = cluster()
    for rnd in range(100):
        rewrite(model, "rot", "X", rnd, MAX_CARDS_PER_NODE)
        # 3 names in use before (UNKNOWN and the two fixed models), 64 more on the node.
        assert len(model.models) <= 67 + 2 * max(MODEL_NAMES_SLACK, 67) + MAX_CARDS_PER_NODE
    assert model.models_compacted > 0
    # The names in use are all still there, each under the id its cards carry.
    for node in ("a100-1", "t4-2", "rot"):
        i = model.index[node]
        for c in model.cards_of(node):
            assert model.models[int(model.a.model[i, c.index])] == packing.model.normalize_model(c.model)
    model.remove_node("rot")
    rewrite(model, "rot", "Y", 0, 1)   # reuses the row: the removed node's names are in no slot now
    model.compact_models(force=True)
    assert sorted(model.models) == sorted(["UNKNOWN", "A100-SXM4-80GB", "T4", "Y-REV00000-00"])
    assert model.models[0] == "UNKNOWN"


def pod(i: int, limits: dict, annotations: dict | None = None) -> dict:
    return {"metadata": {"name": f"p{i:03d}", "namespace": "default", "uid": f"uid-{i:03d}",
                         "annotations": annotations or {}, "resourceVersion": str(100 + i),
                         "creationTimestamp": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"},
            "spec": {"schedulerName": "stowage-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": limits}}]}}


def names_of(svc: ExtenderService, p: dict) -> list[str]:
    return svc.filter(ExtenderArgs(pod=p, node_names=NODES, nodes=None, names=NODES)).node_names or []


def replay(monkeypatch: pytest.MonkeyPatch, compact: bool, rounds: int = 30) -> tuple[list, ClusterModel]:
    """Pods scheduled (filter, prioritize, bind) while "rot" rewrites its 8 cards with new names
    and "junk" churns 64 throwaway names every round; what each pod got and was scored."""
    monkeypatch.setattr(packing.model, "MODEL_NAMES_SLACK", MODEL_NAMES_SLACK if compact else 10 ** 9)
    model = cluster()
    svc = ExtenderService(model)
    rng = random.Random(11)
    shapes = [({"nvidia.com/gpu": "1"}, {}), ({"nvidia.com/gpu-memory": "10"}, {}),
              ({"nvidia.com/gpu-memory": "6"}, {"stowage.io/gpu-model": "A100"}),
              ({"nvidia.com/gpu": "1"}, {"stowage.io/gpu-model": "ROT"}),
              ({"nvidia.com/gpu-memory": "4", "nvidia.com/gpu-core": "30"}, {"stowage.io/gpu-model-exclude": "T4"}),
              ({"nvidia.com/gpu-memory": "3"}, {"stowage.io/gpu-model": "T4,ROT"}),
              ({"nvidia.com/gpu": "2"}, {"stowage.io/gpu-model": "A100"})]
    out: list = []
    n = 0
    for rnd in range(rounds):
        rewrite(model, "rot", "ROT", rnd, 8)
        rewrite(model, "junk", "JUNK", rnd, MAX_CARDS_PER_NODE, mib=1024)
        if rnd % 3 == 2:
            model.remove_node("junk")
        for _ in range(3):
            limits, ann = rng.choice(shapes)
            p = pod(n, limits, ann)
            n += 1
            names = names_of(svc, p)
            if not names:
                out.append((p["metadata"]["name"], None))
                continue
            got = svc.prioritize(ExtenderArgs(pod=p, node_names=names, nodes=None, names=names))
            best = max(got, key=lambda h: h["Score"])["Host"]
            m = p["metadata"]
            assert svc.bind(BindingArgs(m["name"], m["namespace"], m["uid"], best)) == ""
            al = model.allocations[m["uid"]]
            out.append((m["name"], sorted(names), got, al.node, al.cards))
        if rnd % 5 == 4:   # pods leave too (churn mode), so the learned state keeps moving
            for uid in sorted(model.allocations)[::3]:
                model.release(uid)
    return out, model


def test_compaction_changes_no_decision(monkeypatch):
    kept, kept_model = replay(monkeypatch, compact=False)
    compacted, compacted_model = replay(monkeypatch, compact=True)
    assert kept_model.models_compacted == 0 and len(kept_model.models) > 30 * MAX_CARDS_PER_NODE
    assert compacted_model.models_compacted >= 5
    assert len(compacted_model.models) < 4 * MAX_CARDS_PER_NODE
    assert sum(1 for r in kept if r[1] is not None) > 40   # most pods were placed
    assert compacted == kept


def test_model_restricted_filters_match_after_compaction():
    model = cluster()
    svc = ExtenderService(model, filter_keeps="fitting")   # every node that fits, not only the best
    a100 = pod(1, {"nvidia.com/gpu": "1"}, {"stowage.io/gpu-model": "A100"})
    t4 = pod(2, {"nvidia.com/gpu-memory": "2"}, {"stowage.io/gpu-model": "T4"})
    not_t4 = pod(3, {"nvidia.com/gpu-memory": "2"}, {"stowage.io/gpu-model-exclude": "T4"})
    assert sorted(names_of(svc, a100)) == ["a100-1", "a100-2"]   # filled the caches before
    before = model.models_compacted
    for rnd in range(20):
        rewrite(model, "rot", "H100", rnd, MAX_CARDS_PER_NODE)
    assert model.models_compacted > before
    rot_now = f"H100-REV{19:05d}-07"
    only_rot = pod(4, {"nvidia.com/gpu": "1"}, {"stowage.io/gpu-model": rot_now})
    old_rot = pod(5, {"nvidia.com/gpu": "1"}, {"stowage.io/gpu-model": "H100-REV00000"})
    assert sorted(names_of(svc, a100)) == ["a100-1", "a100-2"]
    assert sorted(names_of(svc, t4)) == ["t4-1", "t4-2"]
    assert sorted(names_of(svc, not_t4)) == ["a100-1", "a100-2", "rot"]
    assert names_of(svc, only_rot) == ["rot"]
    assert names_of(svc, old_rot) == []   # a name no card carries any more matches nothing
    m = only_rot["metadata"]
    got = svc.prioritize(ExtenderArgs(pod=only_rot, node_names=["rot"], nodes=None, names=["rot"]))
    assert [h["Host"] for h in got] == ["rot"]
    assert svc.bind(BindingArgs(m["name"], m["namespace"], m["uid"], "rot")) == ""
    assert model.allocations[m["uid"]].cards == (7,)   # the one card of that model


def test_placer_matches_follow_a_renumbering_to_a_table_of_the_same_length():
    """The FragIndex's per-model matches were kept while the name table kept its length; after a
    renumbering the same length can hold other names (T4 gone, L4 in its id)."""
    model = cluster()
    svc = ExtenderService(model)
    for i, pats in enumerate(["T4", "A100", "T4"]):
        p = pod(i, {"nvidia.com/gpu-memory": "2"}, {"stowage.io/gpu-model": pats})
        names = names_of(svc, p)
        svc.prioritize(ExtenderArgs(pod=p, node_names=names, nodes=None, names=names))
    placer = svc.placers["pack"]
    assert any(pats == ("T4",) for pats in placer.index.t.models)
    before = list(model.models)
    for node, count in (("t4-1", 2), ("t4-2", 4)):
        model.upsert_node(node, Inventory(cards=tuple(
            Card(index=k, uuid=f"GPU-{node}-{k}", model="NVIDIA L4", memory_mib=24576) for k in range(count))))
    assert model.compact_models(force=True)
    assert len(model.models) == len(before) and "L4" in model.models and "T4" not in model.models
    table = placer.table
    p = pod(0, {"nvidia.com/gpu-memory": "2"}, {"stowage.io/gpu-model": "T4"})   # seen: not learned again
    assert names_of(svc, p) == []          # no T4 card any more
    svc.prioritize(ExtenderArgs(pod=p, node_names=NODES[:4], nodes=None, names=NODES[:4]))
    ix = placer.index
    assert ix.t is table                   # the same learned table, its cache kept
    want = np.array([[not pats or any(model_matches(x, m) for x in pats) for m in model.models]
                     for pats in ix.t.models], bool)
    assert (ix.allowed(model.a) == want).all()
