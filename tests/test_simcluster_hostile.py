"""Hostile --simulated / --cluster YAML files: each gets the file's own error, quickly and in
bounded memory, never a traceback (found by feeding such files to `stowage inspect --simulated`)."""
from __future__ import annotations

import time

import pytest

from extender.simcluster import SimClusterError, load_cluster, node_objects, parse_cluster
from packing.model import ClusterModel
from stowage.inventory import MAX_MEMORY_UNIT_MIB, MAX_NUMA_NODE, inventory_from_node


def _bomb(levels: int) -> str:
    """A flow list of "billion laughs" anchors: level k holds nine aliases of level k-1, so the
    last one stands for 9**levels strings in a file of a few hundred bytes."""
    s = '[&l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'
    for k in range(1, levels):
        s += f", &l{k} [" + ",".join([f"*l{k - 1}"] * 9) + "]"
    return s + "]"


def _gpus(count: str) -> str:
    return f"nodes:\n  - name: n1\n    gpus:\n      model: A100\n      memory: 80Gi\n      count: {count}\n"


@pytest.mark.parametrize("where", ["count", "labels"])
def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path, where):
    """Before: the error for `count` repr()'d the 4.8 million strings the aliases stand for (a
    full bomb of 9**8 took 1.3 GB and never finished), and `labels` str()'d them."""
    p = tmp_path / "bomb.yaml"
    bomb = _bomb(7)
    p.write_text(_gpus(bomb) if where == "count" else f"nodes:\n  - name: n1\n    labels: {{a: {bomb}}}\n")
    started = time.monotonic()
    with pytest.raises(SimClusterError) as exc:
        load_cluster(p)
    assert str(exc.value).startswith(f"{p}: its aliases stand for more than ")
    assert len(str(exc.value)) < 400 and time.monotonic() - started < 5


def test_an_alias_that_contains_itself_is_refused(tmp_path):
    p = tmp_path / "loop.yaml"
    p.write_text("nodes:\n  - &a {name: n1, labels: *a}\n")
    with pytest.raises(SimClusterError, match=r"^\S+loop\.yaml: an anchor refers to itself \(line 2\)"):
        load_cluster(p)


def test_ordinary_aliases_still_work(tmp_path):
    p = tmp_path / "reuse.yaml"
    p.write_text("nodes:\n  - name: a-{i}\n    count: 2\n    gpus: &g {model: L4, count: 2, memory: 24Gi}\n"
                 "  - name: b\n    gpus: *g\n  - {<<: {name: c}, gpus: *g}\n")
    assert [len(n.cards) for n in load_cluster(p).nodes] == [2, 2, 2, 2]


@pytest.mark.parametrize("depth", [100, 900, 5000])
def test_deep_nesting_is_the_files_error(tmp_path, depth):
    """Before: a RecursionError traceback (PyYAML's pure-Python composer recurses per level)."""
    p = tmp_path / "deep.yaml"
    p.write_text("nodes: " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(SimClusterError) as exc:
        load_cluster(p)
    said = str(exc.value)
    assert said.startswith(f"{p}: ") and "nest" in said[len(str(p)):]


def test_a_file_past_the_size_limit_is_refused_unread(tmp_path, monkeypatch):
    import extender.simcluster as simcluster
    monkeypatch.setattr(simcluster, "MAX_FILE_BYTES", 1000)
    p = tmp_path / "big.yaml"
    p.write_text(_gpus("1") + "#" * 1000 + "\n")
    with pytest.raises(SimClusterError, match="more than 1000 bytes"):
        load_cluster(p)


@pytest.mark.parametrize("text,key", [
    # two files pasted together: the second `nodes:` silently dropped every node of the first
    ("nodes:\n  - name: a\nnodes:\n  - name: b\n", "'nodes'"),
    ("nodes:\n  - name: a\n    gpus: {model: L4, memory: 24Gi, count: 1, count: 2}\n", "'count'"),
])
def test_a_key_written_twice_is_refused(tmp_path, text, key):
    """Before: YAML's last-wins, with nothing said (found: `stowage inspect --simulated` showed
    only node b)."""
    p = tmp_path / "twice.yaml"
    p.write_text(text)
    with pytest.raises(SimClusterError, match=f"found the key {key} a second time"):
        load_cluster(p)


def test_a_merge_key_may_still_be_overridden(tmp_path):
    p = tmp_path / "merge.yaml"
    p.write_text("nodes:\n  - <<: {name: base, cpu: 8}\n    name: mine\n")
    assert [(n.name, n.cpu_milli) for n in load_cluster(p).nodes] == [("mine", 8000)]


def _with_gpus(**gpus) -> dict:
    return {"nodes": [{"name": "n1", "gpus": {"model": "L4", "count": 2, "memory": "24Gi", **gpus}}]}


@pytest.mark.parametrize("doc,said", [
    # numa 2**80 reached the model's int64 array: an OverflowError traceback in stowage inspect
    (_with_gpus(numa=2 ** 80), "nodes[0].gpus.numa: 1208925819614629174706176 is out of range (-1..4095)"),
    (_with_gpus(numa=[0, 2 ** 80]), "nodes[0].gpus.numa[1]: 1208925819614629174706176 is out of range (-1..4095)"),
    (_with_gpus(numa=-7), "nodes[0].gpus.numa: -7 is out of range (-1..4095)"),
    # a unit the inventory annotation of node_objects could not carry (decode_inventory refuses it)
    ({"memoryUnitMiB": 2 ** 80, **_with_gpus()}, "memoryUnitMiB: 1208925819614629174706176 is out of range (1..1048576)"),
])
def test_numbers_beyond_what_an_inventory_holds_are_refused(doc, said):
    with pytest.raises(SimClusterError) as exc:
        parse_cluster(doc, "my.yaml")
    assert str(exc.value) == f"my.yaml: {said}"


def test_the_largest_numbers_allowed_reach_the_model_and_the_node_objects():
    cluster = parse_cluster({"memoryUnitMiB": MAX_MEMORY_UNIT_MIB, **_with_gpus(numa=[MAX_NUMA_NODE, -1])})
    model = ClusterModel()
    cluster.populate(model)
    assert [c.numa for c in inventory_from_node(node_objects(cluster)[0]).cards] == [MAX_NUMA_NODE, -1]


def test_an_integer_of_thousands_of_digits_is_the_files_error(tmp_path):
    """Before: PyYAML's int() raised Python's 4300-digit ValueError as a traceback; and under
    that limit the error quoted all 4000 digits."""
    p = tmp_path / "digits.yaml"
    for digits in (5000, 4000):
        p.write_text(_gpus("9" * digits))
        with pytest.raises(SimClusterError) as exc:
            load_cluster(p)
        assert str(exc.value).startswith(f"{p}: ") and len(str(exc.value)) < 300


def _node(**entry) -> dict:
    return {"nodes": [{"name": "n1", **entry}]}


@pytest.mark.parametrize("doc,said", [
    # each was accepted and served, str()'d, as a label of the node objects (--full-nodes)
    (_node(labels={"zone": [1, 2]}), "nodes[0].labels: the value of 'zone' must be a text, not <list>"),
    (_node(labels={"zone": "x" * 64}), "nodes[0].labels: 'zone' = 'xxxxxxxx"),
    (_node(labels={"a b": "x"}), "nodes[0].labels: 'a b' is not a Kubernetes label key"),
    (_node(labels={"zone": "east west"}), "nodes[0].labels: 'zone' = 'east west' is not a Kubernetes label value"),
    (_node(labels={"k" * 64: "x"}), "nodes[0].labels: 'kkkkkkkk"),
    # a model a pod's stowage.io/gpu-model list can never name (its items are split at commas,
    # and at most 128 characters), or that writes control characters to a terminal
    (_with_gpus(model="A100,H100"), "nodes[0].gpus.model: 'A100,H100' is not a GPU model name"),
    (_with_gpus(model="A100\x1b[31m"), "nodes[0].gpus.model: 'A100\\x1b[31m' is not a GPU model name"),
    (_with_gpus(model="A" * 129), "nodes[0].gpus.model: 'AAAA"),
])
def test_labels_and_models_nothing_could_carry_are_refused(doc, said):
    with pytest.raises(SimClusterError) as exc:
        parse_cluster(doc, "my.yaml")
    assert str(exc.value).startswith(f"my.yaml: {said}")


def test_usual_labels_and_models_still_load():
    doc = _node(labels={"zone": "a", "topology.kubernetes.io/region": "eu-1", "gpu": True, "rack": 7, "empty": None},
                gpus={"model": "NVIDIA A100-SXM4-80GB (rev 2)", "count": 1, "memory": "80Gi"})
    node = parse_cluster(doc).nodes[0]
    assert node.labels == {"zone": "a", "topology.kubernetes.io/region": "eu-1", "gpu": "true", "rack": "7", "empty": ""}
    assert node.cards[0].model == "NVIDIA A100-SXM4-80GB (rev 2)"


def test_a_file_standing_for_too_many_cards_is_refused_before_they_are_built():
    """Before: 100,000 nodes of 64 cards (a 90-byte file) built 6.4 million cards: a minute and
    gigabytes before the extender could start (found: stowage inspect --simulated never ended)."""
    doc = {"nodes": [{"name": "n{i}", "count": 16_000, "gpus": {"model": "L4", "count": 64, "memory": "24Gi"}}]}
    started = time.monotonic()
    with pytest.raises(SimClusterError, match=r"^my\.yaml: nodes\[0\]: 16000 nodes of 64 cards make more than 1000000 "):
        parse_cluster(doc, "my.yaml")
    assert time.monotonic() - started < 1


def test_nvlink_groups_past_every_pair_of_cards_are_refused():
    """Before: 2,000 groups of 64 cards cost 64 x 64 per group for every node of the entry (20,000
    groups: no end); every pair of 64 cards is 4,032 indices."""
    started = time.monotonic()
    with pytest.raises(SimClusterError, match=r"nodes\[0\]\.gpus\.nvlink: more than 4096 card indices"):
        parse_cluster(_with_gpus(count=64, nvlink=[list(range(64))] * 2_000), "my.yaml")
    with pytest.raises(SimClusterError, match=r"nodes\[0\]\.gpus\.unhealthy: more than 64 card indices"):
        parse_cluster(_with_gpus(count=64, unhealthy=[1] * 200_000), "my.yaml")
    assert time.monotonic() - started < 1
