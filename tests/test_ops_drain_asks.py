"""`stowage plan --drain` on a live cluster moves each pod as what it asks, not as what it holds.

Before, a moved pod asked for what its record holds plus a guess at its constraints: by default
the GPU model it runs on (so a pod that accepts any model was kept off other models: the plan
said a node could not be emptied when the extender would move its pods), with ``--any-model`` no
model at all and (whole GPUs) a card at least the size of its current one (so a pod that asks for
``stowage.io/gpu-model: A100`` was moved to a T4: the plan emptied a node whose pod the extender
would refuse to place elsewhere; and a whole-GPU pod that takes any card was kept off smaller
cards). On a live cluster the Pod objects are read anyway (the placer learns them), so each move
now asks what the pod itself asks, parsed as the extender parses it; the held shape and the guess
remain for pods whose ask is unknown (a simulated cluster, a pod of another scheduler)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fakekube import FakeKube, kubeconfig_file, make_node
from test_inspect_plan_live import alloc, stowage_pod

from stowage.cli import main
from stowage.inventory import INVENTORY_ANNOTATION, Card, encode_inventory

GiB = 1024


def inv(node: str, model: str, mem_gib: int, n: int = 1) -> dict[str, str]:
    return {INVENTORY_ANNOTATION: encode_inventory(
        [Card(index=k, uuid=f"GPU-{node}-{k}", model=model, memory_mib=mem_gib * GiB) for k in range(n)])}


def drain(cfg: str, *flags: str) -> dict:
    r = CliRunner().invoke(main, ["plan", "--drain", "-o", "json", "--kubeconfig", cfg, *flags])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["drain"]


def emptied(plan: dict) -> dict[str, list[tuple[str, str]]]:
    return {d["node"]: [(m["pod"], m["to"]) for m in d["moves"]] for d in plan["drained"]}


@pytest.fixture(scope="module")
def slices(tmp_path_factory):
    """a100: one 40 GiB A100 holding ``ml/pinned`` (10 GiB / 30 %, asks gpu-model A100).
    t4: one 16 GiB T4 holding ``ml/free`` (4 GiB / 50 %, no model asked), heavier, so tried second.
    Right answers: ``pinned`` cannot leave the A100 (no other A100); ``free`` fits the A100."""
    with FakeKube() as kube:
        kube.create_node(make_node("a100", gpus=1, annotations=inv("a100", "NVIDIA A100-SXM4-40GB", 40)))
        kube.create_node(make_node("t4", gpus=1, annotations=inv("t4", "Tesla T4", 16)))
        kube.create_pod(stowage_pod("pinned", namespace="ml", gpu_memory=10, gpu_core=30, node="a100",
                                    phase="Running",
                                    annotations={**alloc("a100", [(0, 10 * GiB, 300)], False),
                                                 "stowage.io/gpu-model": "A100"}))
        kube.create_pod(stowage_pod("free", namespace="ml", gpu_memory=4, gpu_core=50, node="t4", phase="Running",
                                    annotations=alloc("t4", [(0, 4 * GiB, 500)], False)))
        yield kubeconfig_file(tmp_path_factory.mktemp("asks"), kube.url)


def test_a_pod_pinned_to_a_model_is_not_moved_off_it_with_any_model(slices):
    plan = drain(slices, "--any-model")
    assert "a100" not in emptied(plan), plan
    assert "ml/pinned" in plan["kept"]["a100"]


def test_a_pod_that_takes_any_model_moves_to_another_model_by_default(slices):
    for flags in ((), ("--any-model",)):
        assert emptied(drain(slices, *flags)).get("t4") == [("ml/free", "a100")]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """big: one 80 GiB A100 holding ``ml/any-card`` (1 whole GPU, no card size or model asked);
    small: three 40 GiB A100-40GB, two held by ``ml/a`` and ``ml/b`` (so it is tried second).
    Right answer: ``any-card`` moves to small's free card."""
    with FakeKube() as kube:
        kube.create_node(make_node("big", gpus=1, annotations=inv("big", "NVIDIA A100-SXM4-80GB", 80)))
        kube.create_node(make_node("small", gpus=3, annotations=inv("small", "NVIDIA A100-SXM4-40GB", 40, 3)))
        kube.create_pod(stowage_pod("any-card", namespace="ml", gpus=1, node="big", phase="Running",
                                    annotations=alloc("big", [(0, 80 * GiB, 1000)], True)))
        for k, n in enumerate(("a", "b")):
            kube.create_pod(stowage_pod(n, namespace="ml", gpus=1, node="small", phase="Running",
                                        annotations=alloc("small", [(k, 40 * GiB, 1000)], True)))
        yield kubeconfig_file(tmp_path_factory.mktemp("whole"), kube.url)


def test_a_whole_gpu_pod_that_takes_any_card_moves_to_a_smaller_one(whole):
    """It asked 1 GPU of any size and any model: the extender places it on a 40 GiB card."""
    for flags in ((), ("--any-model",)):
        assert emptied(drain(whole, *flags)).get("big") == [("ml/any-card", "small")]


def test_the_drain_text_says_what_it_checks_not_that_only_gpu_pods_count(tmp_path):
    """A live cluster's CPU-only pods are moved like the rest (``no GPU; 1 CPU ...``); the closing
    line said "Only GPU pods are modelled: CPU-only pods ... must also be movable"."""
    from test_inspect_plan_live import bound

    with FakeKube() as kube:
        kube.create_node(make_node("gpu-a", gpus=1, annotations=inv("gpu-a", "Tesla T4", 16)))
        kube.create_node(make_node("gpu-b", gpus=1, annotations=inv("gpu-b", "Tesla T4", 16)))
        kube.create_pod(stowage_pod("held", namespace="ml", gpus=1, node="gpu-a", phase="Running",
                                    annotations=alloc("gpu-a", [(0, 16 * GiB, 1000)], True)))
        kube.create_pod(bound("web", "gpu-b"))
        r = CliRunner().invoke(main, ["plan", "--drain", "--kubeconfig", kubeconfig_file(tmp_path, kube.url)])
    assert r.exit_code == 0, r.output
    assert "no GPU; 1 CPU" in r.stdout          # the CPU-only pod moves, as a GPU pod does
    assert "Only GPU pods are modelled" not in r.stdout
    assert "DaemonSet pods stay with their node" in r.stdout
