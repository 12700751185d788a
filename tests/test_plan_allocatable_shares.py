"""`stowage plan` applies kube-scheduler's allocatable check to ``nvidia.com/gpu-memory`` and
``nvidia.com/gpu-core`` as well as to ``nvidia.com/gpu``: a slice asks those two, and
kube-scheduler (NodeResourcesFit: ``allocatable < request + what the node's pods ask`` is
"Insufficient") sends the extender no node that fails them. Before, ``plan`` checked whole GPUs
only, and promised slices on a node whose allocatable gpu-memory was below its cards' memory.

The cluster, by hand (GiB units of gpu-memory, the default):

- short: 2 x A100 40 GiB; allocatable gpu 2, gpu-memory 45 (below the cards' 80), gpu-core 150
  (below the cards' 200). s0 (10 GiB, 30 %) on card 0. kube-scheduler's room: 35 GiB, 120 %.
  The cards' room: 30 + 40 GiB, 70 + 100 %.
- donor: 1 x A100 40 GiB; allocatable gpu 1, gpu-memory 40, gpu-core 100. d0, d1 (20 GiB each)
  on card 0: full.
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fakekube import FakeKube, kubeconfig_file, make_node
from test_inspect_plan_live import alloc, stowage_pod

from stowage.cli import main
from stowage.inventory import INVENTORY_ANNOTATION, Card, encode_inventory

GiB = 1024


def inv(node: str, n: int) -> dict[str, str]:
    return {INVENTORY_ANNOTATION: encode_inventory(
        [Card(index=k, uuid=f"GPU-{node}-{k}", model="NVIDIA A100-SXM4-40GB", memory_mib=40 * GiB)
         for k in range(n)])}


def share(name: str, node: str, gib: int, pct: int) -> dict:
    return stowage_pod(name, namespace="ml", uid=f"uid-{name}", gpu_memory=gib, gpu_core=pct, node=node,
                       phase="Running", annotations=alloc(node, [(0, gib * GiB, pct * 10)], False))


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    with FakeKube() as kube:
        kube.create_node(make_node("short", gpus=2, annotations=inv("short", 2),
                                   allocatable={"nvidia.com/gpu-memory": "45", "nvidia.com/gpu-core": "150"}))
        kube.create_node(make_node("donor", gpus=1, annotations=inv("donor", 1),
                                   allocatable={"nvidia.com/gpu-memory": "40", "nvidia.com/gpu-core": "100"}))
        kube.create_pod(share("s0", "short", 10, 30))
        kube.create_pod(share("d0", "donor", 20, 0))
        kube.create_pod(share("d1", "donor", 20, 0))
        yield kubeconfig_file(tmp_path_factory.mktemp("short"), kube.url)


def plan(cfg: str, *args: str) -> dict:
    r = CliRunner().invoke(main, ["plan", *args, "-o", "json", "--kubeconfig", cfg])
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    return json.loads(r.stdout)


def test_capacity_of_slices_stops_at_allocatable_gpu_memory(cfg):
    """35 GiB of kube-scheduler's room: three 10 GiB slices (the cards hold seven)."""
    ten = plan(cfg, "--shape", "10Gi")["capacity"][0]
    assert ten["perNode"] == {"short": 3}, ten
    assert any("Insufficient nvidia.com/gpu-memory" in why for why in ten["whyNotMore"]), ten["whyNotMore"]
    assert sum(ten["whyNotMore"].values()) == 2   # every node has its reason


def test_capacity_of_slices_stops_at_allocatable_gpu_core(cfg):
    """120 % of kube-scheduler's room: two 50 % slices (the cards hold three)."""
    half = plan(cfg, "--shape", "1Gi,50%")["capacity"][0]
    assert half["perNode"] == {"short": 2}, half
    assert any("Insufficient nvidia.com/gpu-core" in why for why in half["whyNotMore"]), half["whyNotMore"]


def test_drain_moves_no_slice_past_allocatable_gpu_memory(cfg):
    """donor's two 20 GiB slices fit on short's cards, but kube-scheduler admits one there."""
    drain = plan(cfg, "--drain")["drain"]
    assert drain["drained"] == [], drain
    assert "donor" in drain["kept"]


def test_preempt_evicts_for_allocatable_gpu_memory_where_the_cards_have_room(cfg):
    """A 40 GiB slice: short's card 1 is empty, but kube-scheduler's room there is 35 GiB, so it
    does not fit now; evicting s0 (10 GiB) gives kube-scheduler 45 and the card stays free."""
    pre = plan(cfg, "--preempt", "40Gi", "--priority", "10")["preempt"][0]
    assert not pre["fitsNow"], pre
    by_node = {o["node"]: sorted(e["uid"] for e in o["evict"]) for o in pre["options"]}
    assert by_node == {"short": ["uid-s0"], "donor": ["uid-d0", "uid-d1"]}, pre
