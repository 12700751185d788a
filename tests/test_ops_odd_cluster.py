"""`stowage inspect` / `stowage plan` on the odd states an operator meets on a live cluster (not
hostile input: tests/test_ops_hostile_cluster.py): nodes cordoned, not Ready, being deleted or
being removed by the cluster autoscaler; a node whose allocatable ``nvidia.com/gpu`` disagrees
with its inventory; a node without GPUs; a pod whose record names a node the cluster no longer
has. Each is said per node or per pod, the rest reads as usual, and ``plan`` sends no pod to a
node the cluster autoscaler is removing (kube-scheduler would not send the extender that node),
but does to one that only has a deletionTimestamp, as kube-scheduler v1.28.7 does
(tests/integration/test_real_node_deleting.py)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fakekube import FakeKube, kubeconfig_file, make_node, make_pod
from test_inspect_plan_live import alloc, stowage_pod

from stowage.cli import main
from stowage.inventory import INVENTORY_ANNOTATION, Card, encode_inventory

GiB = 1024


def inv(node: str, n: int, unhealthy: int = 0) -> dict[str, str]:
    return {INVENTORY_ANNOTATION: encode_inventory(
        [Card(index=k, uuid=f"GPU-{node}-{k}", model="NVIDIA A100-SXM4-40GB", memory_mib=40 * GiB,
              healthy=k >= unhealthy) for k in range(n)])}


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    with FakeKube() as kube:
        kube.create_node(make_node("ok", gpus=2, annotations=inv("ok", 2)))
        kube.create_node(make_node("cpu"))
        kube.create_node(make_node("disagree", gpus=2, annotations=inv("disagree", 4)))
        kube.create_node(make_node("one-sick", gpus=1, annotations=inv("one-sick", 2, unhealthy=1)))  # agrees
        kube.create_node(make_node("no-plugin", annotations=inv("no-plugin", 2)))
        deleting = make_node("deleting", gpus=2, annotations=inv("deleting", 2))
        deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        kube.create_node(deleting)
        scaling = make_node("ca-removing", gpus=2, annotations=inv("ca-removing", 2))
        scaling["spec"]["taints"] = [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1700000000",
                                      "effect": "NoSchedule"}]
        kube.create_node(scaling)
        kube.create_node(make_node("cordoned", gpus=2, unschedulable=True, annotations=inv("cordoned", 2)))
        kube.create_node(make_node("not-ready", gpus=2, ready=False, annotations=inv("not-ready", 2)))
        kube.create_pod(stowage_pod("on-deleting", namespace="ml", gpus=1, node="deleting", phase="Running",
                                    annotations=alloc("deleting", [(0, 40 * GiB, 1000)], True)))
        kube.create_pod(stowage_pod("ghost", namespace="ml", gpus=1, node="gone", phase="Running",
                                    annotations=alloc("gone", [(0, 40 * GiB, 1000)], True)))
        yield kubeconfig_file(tmp_path_factory.mktemp("odd"), kube.url)


def run(cfg: str, *args: str):
    r = CliRunner().invoke(main, [*args, "--kubeconfig", cfg])
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    return r


def nodes(rep: dict) -> dict[str, dict]:
    return {n["name"]: n for n in rep["nodes"]}


def test_each_node_says_why_it_takes_no_pods_or_what_disagrees(cfg):
    ns = nodes(json.loads(run(cfg, "inspect", "-o", "json").stdout))
    assert ns["ok"]["notes"] == [] and ns["one-sick"]["notes"] == []
    assert ns["cordoned"]["notes"] == ["cordoned"]
    assert ns["not-ready"]["notes"] == ["not Ready"]
    assert ns["deleting"]["notes"] == ["being deleted"]
    assert ns["ca-removing"]["notes"] == ["being removed by the cluster autoscaler"]
    assert ns["disagree"]["notes"] == ["allocatable nvidia.com/gpu is 2, its inventory has 4 healthy cards"]
    assert ns["no-plugin"]["notes"] == ["allocatable nvidia.com/gpu is 0, its inventory has 2 healthy cards"]
    assert ns["deleting"]["schedulable"] and not ns["ca-removing"]["schedulable"]
    table = run(cfg, "inspect", "--no-cards").stdout
    row = {line.split()[0]: line for line in table.splitlines() if line and line.split()[0] in ns}
    assert row["deleting"].rstrip().endswith("ok, being deleted")
    assert row["ca-removing"].rstrip().endswith("unschedulable, being removed by the cluster autoscaler")
    assert row["disagree"].rstrip().endswith("ok, allocatable nvidia.com/gpu is 2, its inventory has 4 healthy cards")
    assert row["not-ready"].rstrip().endswith("unschedulable, not Ready")


def test_a_node_without_gpus_is_not_called_whole_gpus_only(cfg):
    ns = nodes(json.loads(run(cfg, "inspect", "-o", "json").stdout))
    assert not ns["cpu"]["wholeOnly"]
    row = next(line for line in run(cfg, "inspect", "--no-cards").stdout.splitlines() if line.startswith("cpu "))
    assert row.rstrip().endswith(" ok")


def test_a_pod_on_a_node_the_cluster_lacks_is_named(cfg):
    """Its record is honoured (the node may come back), and it holds cards nowhere to be seen:
    before, only the source line's count of GPU pods held it."""
    rep = json.loads(run(cfg, "inspect", "-o", "json").stdout)
    assert [(p["pod"], p["node"], p["cards"]) for p in rep["podsOnUnknownNodes"]] == [("ml/ghost", "gone", [0])]
    table = run(cfg, "inspect").stdout
    assert "pod ml/ghost is bound to node gone, which the cluster does not list" in table


def test_plan_places_pods_where_kube_scheduler_would_on_nodes_going_away(cfg):
    """A node the cluster autoscaler is removing takes no pod (its NoSchedule taint). One that only
    has a deletionTimestamp (a finalizer holds it) was read as cordoned too, "kube-scheduler sends
    the extender no such node": it does (v1.28.7, tests/integration/test_real_node_deleting.py),
    so ``plan`` counts its free card as the live extender does."""
    per_node = json.loads(run(cfg, "plan", "--shape", "1", "-o", "json").stdout)["capacity"][0]["perNode"]
    assert per_node["deleting"] == 1 and "ca-removing" not in per_node
    assert per_node["ok"] == 2 and "cordoned" not in per_node   # as a cordoned node


def test_reading_a_big_cluster_says_how_far_it_is(cfg, monkeypatch):
    """49,000 pods take ~9 s to read and apply: every READ_PROGRESS_EVERY pods (1 here) a line on
    stderr; stdout unchanged."""
    import stowage_ops.cluster_source as cs

    quiet = run(cfg, "inspect", "-o", "json")
    monkeypatch.setattr(cs, "READ_PROGRESS_EVERY", 1)
    r = run(cfg, "inspect", "-o", "json")
    assert r.stdout == quiet.stdout
    assert "1 pods read..." in r.stderr.splitlines() and "2 pods read..." in r.stderr.splitlines()
    assert "pods read..." not in quiet.stderr


@pytest.fixture(scope="module")
def tight_cfg(tmp_path_factory):
    """kube-scheduler admits a GPU pod by the node's allocatable nvidia.com/gpu less the GPUs its
    pods ask, before the extender sees the node. tight: 4 healthy cards but allocatable 2, one
    1-GPU pod (room 1 for kube-scheduler, 3 free cards for Stowage). sick-held: allocatable 1
    = its healthy cards, but its 1-GPU pod sits on the unhealthy card 0 (room 0, 1 free card).
    donor: 2 cards, both held by 1-GPU pods, allocatable 2."""
    with FakeKube() as kube:
        kube.create_node(make_node("tight", gpus=2, annotations=inv("tight", 4)))
        kube.create_node(make_node("sick-held", gpus=1, annotations=inv("sick-held", 2, unhealthy=1)))
        kube.create_node(make_node("donor", gpus=2, annotations=inv("donor", 2)))
        for name, node, card in (("t0", "tight", 0), ("s0", "sick-held", 0), ("d0", "donor", 0), ("d1", "donor", 1)):
            kube.create_pod(stowage_pod(name, namespace="ml", gpus=1, node=node, phase="Running",
                                        annotations=alloc(node, [(card, 40 * GiB, 1000)], True)))
        yield kubeconfig_file(tmp_path_factory.mktemp("tight"), kube.url)


def test_plan_counts_room_kube_scheduler_admits_by_allocatable_gpus(tight_cfg):
    """Found by experiment: on a node with allocatable nvidia.com/gpu 2 and 4 healthy cards in its
    inventory, ``plan`` said 4 more 1-GPU pods and one 4-GPU pod fit there; kube-scheduler sends
    the extender that node for neither (Insufficient nvidia.com/gpu)."""
    doc = json.loads(run(tight_cfg, "plan", "--shape", "1", "--shape", "2", "-o", "json").stdout)
    one, two = doc["capacity"]
    assert one["perNode"] == {"tight": 1}
    assert two["count"] == 0
    assert any("Insufficient nvidia.com/gpu" in why for why in two["whyNotMore"]), two["whyNotMore"]
    assert sum(two["whyNotMore"].values()) == 3   # every node has its reason


def test_drain_moves_no_pod_kube_scheduler_would_refuse(tight_cfg):
    """donor's two pods fit on tight's cards, but kube-scheduler admits only one of them there."""
    drain = json.loads(run(tight_cfg, "plan", "--drain", "-o", "json").stdout)["drain"]
    assert "donor" not in [d["node"] for d in drain["drained"]]
    for d in drain["drained"]:
        assert all(m["to"] != "sick-held" for m in d["moves"])


def test_preempt_does_not_say_fits_now_where_kube_scheduler_refuses(tight_cfg):
    pre = json.loads(run(tight_cfg, "plan", "--preempt", "2", "--priority", "10", "-o", "json").stdout)["preempt"][0]
    assert not pre["fitsNow"]
    assert all(not (o["node"] == "tight" and not o["evict"]) for o in pre["options"])


def test_a_fractional_allocatable_gpu_count_is_read_as_kube_scheduler_reads_it(tmp_path):
    """kube-scheduler counts an extended resource by Quantity.Value(), rounded up: 1500m is 2.
    Read as 1 (int() of 1.5), inspect noted a disagreement with 2 healthy cards that kube-scheduler
    does not see, and plan refused the second 1-GPU pod it admits."""
    with FakeKube() as kube:
        kube.create_node(make_node("milli", annotations=inv("milli", 2), allocatable={"nvidia.com/gpu": "1500m"}))
        cfg = kubeconfig_file(tmp_path, kube.url)
        assert nodes(json.loads(run(cfg, "inspect", "-o", "json").stdout))["milli"]["notes"] == []
        assert json.loads(run(cfg, "plan", "--shape", "1", "-o", "json").stdout)["capacity"][0]["count"] == 2


def test_plan_counts_the_gpus_pods_without_a_record_ask_against_allocatable(tmp_path):
    """kube-scheduler subtracts every bound pod's nvidia.com/gpu from the node's allocatable, also
    a pod another scheduler bound (no record: Stowage sees its card free) and one whose record the
    feed refused. Counted by the model alone, plan promised both nodes' second card."""
    with FakeKube() as kube:
        for node in ("other-sched", "bad-record"):
            kube.create_node(make_node(node, gpus=2, annotations=inv(node, 2)))
        kube.create_pod(make_pod("theirs", namespace="ml", gpus=1, node="other-sched", phase="Running"))
        kube.create_pod(stowage_pod("refused", namespace="ml", gpus=1, node="bad-record", phase="Running",
                                    annotations={"stowage.io/allocation": "{not json"}))
        kube.create_pod(make_pod("done", namespace="ml", gpus=2, node="bad-record", phase="Succeeded"))
        cfg = kubeconfig_file(tmp_path, kube.url)
        one = json.loads(run(cfg, "plan", "--shape", "1", "-o", "json").stdout)["capacity"][0]
        assert one["perNode"] == {"bad-record": 1, "other-sched": 1}


def test_a_node_read_twice_keeps_the_notes_of_what_was_applied_last():
    """A list naming a node twice (a hostile or broken API server: duplicate names) applies it
    twice and the model keeps the last; its notes kept the first's ('cordoned') when the last
    had none."""
    from types import SimpleNamespace

    from stowage_ops.cluster_source import LiveFacts, _note_nodes

    facts, feeder = LiveFacts(), SimpleNamespace(node_closed=None)
    _note_nodes(feeder, facts)
    feeder.node_closed(make_node("twice", gpus=2, unschedulable=True))
    assert facts.node_notes["twice"] == ["cordoned"]
    feeder.node_closed(make_node("twice", gpus=1))
    assert facts.node_notes.get("twice", []) == [] and facts.gpu_allocatable["twice"] == 1
