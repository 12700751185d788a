"""What the exporter serves against docs/metrics-contract.md, read from the document itself: every
family it lists and no other, each a gauge, with exactly the labels the contract gives it, and a
HELP text that says what the contract's meaning column says (a user reading HELP in Prometheus'
UI or a dashboard's tooltip sees only that)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporter_harness import GpuNode, make_node
from fakenvml import default_cards
from gpunode.devices import card_key

CONTRACT = Path(__file__).resolve().parent.parent / "docs" / "metrics-contract.md"
U0, U1 = (c.uuid for c in default_cards()[:2])
MEM, GPU = "nvidia.com/gpu-memory", "nvidia.com/gpu"


def contract_tables() -> dict[str, tuple[set[str], str]]:
    """Series name -> (its labels, its meaning) from the contract's three tables of series."""
    out: dict[str, tuple[set[str], str]] = {}
    for part in re.split(r"^## ", CONTRACT.read_text(), flags=re.M)[1:]:
        title = part.splitlines()[0]
        if not (title.startswith(("Per-pod series", "Per-card series", "About the exporter"))):
            continue                                # e.g. the adapter's metrics, named after ours
        by_title = re.search(r"\(labels: ([a-z, ]+)\)", title)
        for row in re.findall(r"^\|\s*`(stowage_[a-z_]+)`\s*\|(.*)\|\s*$", part, flags=re.M):
            name, cells = row[0], [c.strip() for c in row[1].split("|")]
            if by_title:
                labels = {x.strip() for x in by_title.group(1).split(",")}
                meaning = cells[-1]
            else:                                   # "About the exporter": name | labels | meaning
                labels = set(re.findall(r"`([a-z]+)`", cells[0]))
                meaning = cells[1]
            out[name] = (labels, meaning)
    return out


@pytest.fixture
def node(monkeypatch, tmp_path):
    yield from make_node(monkeypatch, tmp_path)


def test_the_contract_is_read_whole():
    tables = contract_tables()
    assert len(tables) == 10 and tables["stowage_exporter_up"][0] == {"node", "source"}
    assert tables["stowage_pod_gpu_memory_used_bytes"][0] == {"node", "gpu", "model", "pod", "namespace", "container"}


def test_served_families_types_labels_and_help_are_the_contracts(node: GpuNode):
    node.kubelet.add("ns", "whole", "0f6c3b1e-8d2a-4c5e-9b7f-000000000001", {"c": {GPU: [U1]}})
    node.kubelet.add("ns", "a", "0f6c3b1e-8d2a-4c5e-9b7f-000000000002",
                     {"c": {MEM: [f"{card_key(U0)}::{n}" for n in range(10)]}})
    node.kubelet.add("ns", "b", "0f6c3b1e-8d2a-4c5e-9b7f-000000000003",
                     {"c": {MEM: [f"{card_key(U0)}::{n}" for n in range(10, 20)]}})
    s = node.scrape()
    contract = contract_tables()
    assert set(s.families) == set(contract)
    for name, (labels, meaning) in contract.items():
        fam = s.families[name]
        assert fam.type == "gauge", name
        assert fam.samples, f"{name}: the scrape must show it to check its labels"
        assert all(set(x.labels) == labels for x in fam.samples), (name, fam.samples[0].labels, labels)
        if name != "stowage_exporter_up" and name != "stowage_gpu_attribution_estimated":
            # the per-card and per-pod meanings are one clause: HELP says it (cross-references aside)
            said = re.sub(r"\s*\(see below\)", "", meaning).lower()
            assert said in fam.documentation.lower(), f"{name}: HELP {fam.documentation!r} does not say {said!r}"
