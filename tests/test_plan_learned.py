"""`stowage plan` on a live cluster knows what the live extender's placer knows (issue 13: one
placement path, never more or less): the pods of Stowage's schedulers, in creation order, and the
departed pods' past in the extender's ConfigMap, parsed by the same code as the watch's. Before,
it learned only the GPU pods holding cards, without their model lists, and nothing that had left."""
from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner
from fakekube import FakeKube, kubeconfig_file, make_node, make_pod

from extender.kube import creation_order
from extender.learned_past import DepartedPods
from extender.learned_store import DATA_KEY
from extender.service import ExtenderService
from extender.wire import ExtenderArgs
from stowage.cli import main
from stowage.inventory import INVENTORY_ANNOTATION, Card, encode_inventory
from stowage.resources import GpuRequest
from stowage_ops.cluster_source import LearnFrom, Source, load
from stowage_ops.planning import Learned, _node_names, _service

GiB = 1024


def past() -> DepartedPods:
    p = DepartedPods()
    p.add(GpuRequest(gpus=4, cpu_milli=32000, host_mem_mib=128 * GiB), (), 40)
    p.add(GpuRequest(mem_mib=5 * GiB, core_milli=200), ("NVIDIA-T4",), 25)
    p.add(GpuRequest(cpu_milli=1000), (), 7)
    return p


@pytest.fixture
def live(tmp_path):
    """Two A100 nodes and a T4 node; pods of stowage-scheduler (bound and pending, one limited to
    T4) and of the default scheduler; the extender's ConfigMap holding its departed pods."""
    rng = random.Random(4)
    with FakeKube() as kube:
        for name, model, n, mem in (("a100-1", "NVIDIA-A100", 4, 80), ("a100-2", "NVIDIA-A100", 8, 80),
                                    ("t4-1", "NVIDIA-T4", 4, 16)):
            cards = [Card(index=k, uuid=f"GPU-{name}-{k}", model=model, memory_mib=mem * GiB) for k in range(n)]
            kube.create_node(make_node(name, gpus=n, annotations={INVENTORY_ANNOTATION: encode_inventory(cards)}))
        for i in range(30):
            kw = rng.choice([{"gpus": 1}, {"gpu_memory": 10, "gpu_core": 30}, {"gpus": 2}, {"gpu_memory": 4}])
            p = make_pod(f"p{i:02d}", **kw, annotations={"stowage.io/gpu-model": "NVIDIA-T4"} if i % 7 == 0 else None)
            p["spec"]["schedulerName"] = "stowage-scheduler" if i % 5 else "default-scheduler"
            p["metadata"]["creationTimestamp"] = f"2026-12-01T00:00:{i:02d}Z"
            kube.create_pod(p)
        kube.create("configmaps", {"metadata": {"name": "stowage-learned-past", "namespace": "stowage-system"},
                                   "data": {DATA_KEY: past().to_json()}})
        yield kube, kubeconfig_file(tmp_path, kube.url)


PROBES = [GpuRequest(gpus=1), GpuRequest(mem_mib=12 * GiB), GpuRequest(gpus=2),
          GpuRequest(mem_mib=4 * GiB, core_milli=200), GpuRequest(gpus=1, cpu_milli=4000)]


def ask(svc: ExtenderService, names: list[str]) -> list:
    """Filter's best nodes for each probe, each probe written in the service's own memory unit."""
    from extender.placing import request_pod
    out = []
    for i, req in enumerate(PROBES):
        pod = request_pod(f"probe{i}", req, uid=f"probe-{i}", memory_unit_mib=svc.memory_unit_mib)
        out.append(svc.filter(ExtenderArgs(pod=pod, node_names=names, nodes=None, names=names)).node_names)
    return out


def test_the_what_if_placer_learns_what_a_live_extender_holds(live):
    kube, cfg = live
    learn = LearnFrom(configmap=("stowage-system", "stowage-learned-past"))
    model, _ = load(Source(kubeconfig=cfg), learn=learn)
    mine = [p for p in kube.objects("pods") if p["spec"]["schedulerName"] == "stowage-scheduler"]
    assert [p["metadata"]["uid"] for p in learn.pods] == [p["metadata"]["uid"] for p in sorted(mine, key=creation_order)]
    assert learn.past.pods == 72 and learn.note == ""
    learned = Learned.of(learn.past, learn.pods, 1024)
    assert learned.pods == 72 + len(mine) and learned.gpu_pods_left
    # The live extender restarted now: its ConfigMap first, then its first list.
    extender = ExtenderService(model.copy())
    extender.learn_departed(DepartedPods.from_json(past().to_json()))
    for p in sorted(mine, key=creation_order):
        extender.learn_pod(p)
    what_if = _service(model.copy(), "pack", learned)
    keys = ("pods", "classes", "workload")
    assert {k: what_if.learned_summary()[k] for k in keys} == {k: extender.learned_summary()[k] for k in keys}
    assert what_if.placers["pack"].churn == extender.placers["pack"].churn is True
    names = _node_names(model)
    assert ask(what_if, names) == ask(extender, names)
    before = _service(model.copy(), "pack")             # what plan learned before: allocations only
    assert before.learned_summary()["workload"] != extender.learned_summary()["workload"]
    assert ask(before, names) != ask(extender, names)


def test_plan_says_what_it_learned_and_can_leave_the_past_out(live):
    _, cfg = live
    r = CliRunner().invoke(main, ["plan", "--kubeconfig", cfg, "--shape", "1"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert ("the placer learned what the live extender has: 24 pods of stowage-scheduler and 72 departed pods "
            "(ConfigMap stowage-system/stowage-learned-past)") in r.output
    r = CliRunner().invoke(main, ["plan", "--kubeconfig", cfg, "--shape", "1", "--learned-configmap", "off",
                                  "-o", "json"], catch_exceptions=False)
    doc = json.loads(r.stdout)
    assert doc["learned"] == {"pods": 24, "departedPods": 0, "configMap": None, "note": ""}
    assert doc["source"].startswith("live cluster ")
    r = CliRunner().invoke(main, ["plan", "--kubeconfig", cfg, "--shape", "1", "--learned-configmap", "other/none",
                                  "-o", "json"], catch_exceptions=False)
    assert json.loads(r.stdout)["learned"]["departedPods"] == 0          # no such ConfigMap: nothing departed
    r = CliRunner().invoke(main, ["plan", "--kubeconfig", cfg, "--shape", "1", "--learned-configmap", "A/B"])
    assert r.exit_code == 2 and "--learned-configmap" in r.output


def test_a_past_plan_may_not_read_is_said_and_plan_goes_on(live):
    kube, cfg = live
    kube.fail_next(1, status=403, path="configmaps")
    r = CliRunner().invoke(main, ["plan", "--kubeconfig", cfg, "--shape", "1"], catch_exceptions=False)
    assert r.exit_code == 0 and "0 departed pods" in r.output and "HTTP 403" in r.output


@pytest.mark.parametrize("placer", ["pack", "spread"])
def test_the_taught_copy_plans_exactly_as_the_plain_path(live, placer):
    """The speed-up (each what-if gets a copy of a placer taught once) against the plain path it
    replaces (each what-if's service learns every shape again): the same learned workload, the
    same filter answers, and the same capacity and drain plans."""
    from dataclasses import replace

    from stowage_ops.planning import capacity, drain_plan, parse_shape

    _, cfg = live
    learn = LearnFrom(configmap=("stowage-system", "stowage-learned-past"))
    model, _ = load(Source(kubeconfig=cfg), learn=learn)
    fast = Learned.of(learn.past, learn.pods, 1024)
    plain = replace(fast, reuse=False)
    names = _node_names(model)
    a, b = _service(model.copy(), placer, fast), _service(model.copy(), placer, plain)
    assert a.placers["pack"] is not b.placers["pack"]
    keys = ("pods", "classes", "workload")
    assert {k: a.learned_summary()[k] for k in keys} == {k: b.learned_summary()[k] for k in keys}
    assert ask(a, names) == ask(b, names)
    assert fast._taught and not plain._taught
    again = _service(model.copy(), placer, fast)          # a second what-if: a fresh copy, untouched
    assert again.placers["pack"] is not a.placers["pack"] and ask(again, names) == ask(b, names)
    for shape in ("1", "10Gi,30%", "2@NVIDIA-A100", "4Gi@NVIDIA-T4"):
        s = parse_shape(shape)
        assert capacity(model, s, placer, learned=fast) == capacity(model, s, placer, learned=plain)
    assert drain_plan(model, placer, learned=fast) == drain_plan(model, placer, learned=plain)


def test_inspect_shows_what_the_extenders_placer_has_learned(live):
    kube, cfg = live
    r = CliRunner().invoke(main, ["inspect", "--kubeconfig", cfg, "--learned", "--no-cards", "-o", "json"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    learned = json.loads(r.stdout)["learned"]
    mine = [p for p in kube.objects("pods") if p["spec"]["schedulerName"] == "stowage-scheduler"]
    assert (learned["pods"], learned["departedPods"]) == (len(mine), 72)
    assert learned["configMap"] == "stowage-system/stowage-learned-past" and learned["note"] == ""
    assert sum(s["now"] for s in learned["shapes"]) == len(mine)
    assert sum(s["departed"] for s in learned["shapes"]) == 72
    totals = [s["now"] + s["departed"] for s in learned["shapes"]]
    assert totals == sorted(totals, reverse=True)
    assert learned["shapes"][0] == {"shape": "4 whole GPUs, 32 CPU, 128 GiB memory", "now": 0, "departed": 40}
    assert any(s["shape"].endswith("@NVIDIA-T4") for s in learned["shapes"])
    table = CliRunner().invoke(main, ["inspect", "--kubeconfig", cfg, "--learned", "--no-cards"]).output
    assert (f"What the extender's placer has learned: {len(mine)} pods of stowage-scheduler now, 72 departed "
            "(ConfigMap stowage-system/stowage-learned-past)") in table
    assert "4 whole GPUs, 32 CPU, 128 GiB memory" in table and "DEPARTED" in table
    plain = CliRunner().invoke(main, ["inspect", "--kubeconfig", cfg, "--no-cards", "-o", "json"]).stdout
    assert "learned" not in json.loads(plain)                   # only when asked: it reads the ConfigMap
    r = CliRunner().invoke(main, ["inspect", "--simulated", "--learned"])
    assert r.exit_code == 2 and "--learned reads a live cluster" in r.output
