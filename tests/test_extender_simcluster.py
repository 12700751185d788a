"""The embedded cluster: the built-in file, user files, clear errors, Node objects."""
from __future__ import annotations

import pytest

from packing.model import ClusterModel
from extender.simcluster import SimClusterError, load_cluster, node_objects, parse_cluster
from stowage.inventory import inventory_from_node, model_matches
from stowage.resources import quantity_to_int


def test_builtin_cluster():
    c = load_cluster()
    assert len(c.nodes) == 36 and c.card_count == 204
    names = [n.name for n in c.nodes]
    assert len(set(names)) == len(names)
    by = {n.name: n for n in c.nodes}
    h = by["h100-01"]
    assert [card.numa for card in h.cards] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert h.cards[0].nvlink == (1, 2, 3) and h.cards[5].nvlink == (4, 6, 7)
    assert not by["t4-06"].cards[3].healthy and all(card.healthy for card in by["t4-05"].cards)
    models = {card.model for n in c.nodes for card in n.cards}
    assert any(model_matches("A10", m) for m in models) and any(model_matches("A100", m) for m in models)
    assert len({card.uuid for n in c.nodes for card in n.cards}) == 204
    m = ClusterModel()
    c.populate(m)
    assert len(m.index) == 36 and int(m.a.exists.sum()) == 204 and int(m.a.healthy.sum()) == 203


def test_node_objects_carry_the_inventory():
    c = load_cluster()
    objs = node_objects(c)
    assert [o["metadata"]["name"] for o in objs] == [n.name for n in c.nodes]
    for o, n in zip(objs, c.nodes):
        inv = inventory_from_node(o)
        assert inv.source == "annotation" and inv.cards == n.cards
        alloc = o["status"]["allocatable"]
        assert quantity_to_int(alloc["nvidia.com/gpu"], "gpu") == sum(card.healthy for card in n.cards)
        assert o["status"]["conditions"][0]["type"] == "Ready"


def test_user_file_with_explicit_names(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("memoryUnitMiB: 512\nnodes:\n- name: solo\n  gpus: {model: NVIDIA L4, count: 2, memory: 24576}\n"
                 "- name: 'x-{i}'\n  count: 3\n")
    c = load_cluster(p)
    assert [n.name for n in c.nodes] == ["solo", "x-1", "x-2", "x-3"]
    assert c.memory_unit_mib == 512 and c.nodes[0].cards[1].memory_mib == 24576
    assert c.nodes[1].cards == ()


@pytest.mark.parametrize("doc,msg", [
    ([], "expected a mapping with a 'nodes' list"),
    ({"nodes": []}, "'nodes' must be a non-empty list"),
    ({"nodes": [{"name": "a"}], "extra": 1}, "unknown top-level key(s) extra"),
    ({"nodes": [{"name": "a", "gpu": {}}]}, "nodes[0]: unknown key(s) gpu"),
    ({"nodes": [{"name": "a-{i}", "count": 0}]}, "nodes[0].count: 0 is out of range"),
    ({"nodes": [{"name": "a", "count": 2}]}, "the name needs {i}"),
    ({"nodes": [{"name": "a"}, {"name": "a"}]}, "duplicate node name 'a'"),
    ({"nodes": [{"name": "a", "gpus": {"model": "L4", "count": 2}}]}, "nodes[0].gpus.memory: missing"),
    ({"nodes": [{"name": "a", "gpus": {"model": "L4", "count": 2, "memory": "lots"}}]}, "invalid quantity"),
    ({"nodes": [{"name": "a", "gpus": {"model": "L4", "count": "2", "memory": "1Gi"}}]},
     "nodes[0].gpus.count: expected a whole number"),
    ({"nodes": [{"name": "a", "gpus": {"model": "L4", "count": 2, "memory": "1Gi", "numa": [0]}}]},
     "expected one int or a list of 2 ints"),
    ({"nodes": [{"name": "a", "gpus": {"model": "L4", "count": 2, "memory": "1Gi", "nvlink": [[0, 5]]}}]},
     "nodes[0].gpus.nvlink[0]: 5 is out of range"),
    ({"nodes": [{"name": "a", "gpus": {"model": "L4", "count": 2, "memory": "1Gi", "unhealthy": 1}}]},
     "unhealthy: expected a list"),
    ({"nodes": [{"name": "a", "cpu": "many"}]}, "nodes[0].cpu: invalid quantity"),
    ({"nodes": [{"name": "a", "gpus": {"count": 1, "memory": "1Gi"}}]}, "gpus.model: expected a GPU model"),
    # digits to str.isdigit(), not to int(): a ValueError's traceback before, not the file's error
    ({"nodes": [{"name": "a", "gpus": {"model": "L4", "count": 1, "memory": "\u00b2"}}]}, "nodes[0].gpus.memory"),
    ({"nodes": [{"name": "a", "gpus": {"model": "L4", "count": 1, "memory": "8\u0663"}}]}, "nodes[0].gpus.memory"),    # a bare number float() reads as infinity, and YAML's .inf / .nan: int() raised (OverflowError)
    ({"nodes": [{"name": "a", "gpus": {"model": "L4", "count": 1, "memory": "9" * 400}}]}, "nodes[0].gpus.memory"),
    ({"nodes": [{"name": "a", "gpus": {"model": "L4", "count": 1, "memory": float("inf")}}]}, "nodes[0].gpus.memory"),
    ({"nodes": [{"name": "a", "gpus": {"model": "L4", "count": 1, "memory": float("nan")}}]}, "nodes[0].gpus.memory"),
    ({"nodes": [{"name": "a", "gpus": {"model": "L4", "count": 1, "memory": 10**30}}]}, "nodes[0].gpus.memory"),
])
def test_bad_cluster_documents(doc, msg):
    with pytest.raises(SimClusterError) as exc:
        parse_cluster(doc, "my.yaml")
    assert msg in str(exc.value) and str(exc.value).startswith("my.yaml")


def test_bad_files(tmp_path):
    with pytest.raises(SimClusterError, match="cannot read cluster file"):
        load_cluster(tmp_path / "missing.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text("nodes: [unclosed")
    with pytest.raises(SimClusterError, match="not valid YAML"):
        load_cluster(p)
