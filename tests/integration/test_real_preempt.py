"""Card-aware preemption under the REAL kube-scheduler (v1.28.7) with PriorityClasses.

kube-scheduler picks victims by its node-wide count of ``nvidia.com/gpu-memory`` and asks the
extender's ``preempt`` verb (scheduler-config.yaml: ``preemptVerb: preempt``) about each
candidate node. The layouts here are forced by the pods' sizes (two 14 GiB pods cannot share a
24 GiB card), and pinned to their node, so what the scheduler proposes follows from the
priorities alone:

- node ``r`` (2 x 24 GiB): card X holds rA (14, lowest) + rC (10, mid), card Y rB (14, lowest) +
  rD (10, mid). For a 20 GiB pod the scheduler proposes rA + rB: 28 GiB node-wide, but 14 GiB on
  each card, so nothing the pod can use. Its lower victim priority makes ``r`` kube-scheduler's
  own first choice.
- node ``g`` (2 x 24 GiB): card X holds gA (20, low), card Y gB + gC (12 each, mid). The
  scheduler proposes gA: the whole card X comes free.

With the preempt verb the pod evicts gA only and binds on g; ``r`` keeps its pods. gA has a
grace period, so it stays Terminating (no kubelet confirms it): meanwhile the preemptor waits,
nominated to g, with gA's card still counted, and nothing else is evicted. Once gA is gone its
card is held for the preemptor against pods of lower priority (asked of the extender directly,
with kube-scheduler stopped so that the moment lasts), and the preemptor binds there. A pod that
asks for an H100 evicts on the H100 node only, never on the A100 node that kube-scheduler prefers.
The contrast: the same scheduler config without ``preemptVerb`` (the same extender otherwise)
evicts rA + rB, and the A100 pods, and the preemptor stays Pending.

Other pods have terminationGracePeriodSeconds 0 (no kubelet would ever confirm a graceful
deletion), so such a victim is gone as soon as kube-scheduler deletes it.
"""
from __future__ import annotations

import time
from typing import Any, Iterator

import pytest
import kubernetes

from realk8s import LocalK8s, scheduler_config_for_test, wait_until
from schedbed import Pool, PodSpec, SchedBed, cards, record_of

L4 = "NVIDIA L4"
CLASSES = {"it-preempt-lowest": 100, "it-preempt-low": 200, "it-preempt-mid": 500, "it-preempt-high": 10_000}


@pytest.fixture(scope="module", autouse=True)
def priority_classes(k8s: LocalK8s) -> Iterator[None]:
    api = kubernetes.client.SchedulingV1Api(k8s.api_client())
    for name, value in CLASSES.items():
        try:
            api.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                       "metadata": {"name": name}, "value": value})
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:
                raise
    yield


def create(pool: Pool, spec: PodSpec, cls: str, node: str | None = None, grace: int = 0) -> None:
    """The pool's pod with a PriorityClass, pinned to ``node`` when given; ``grace``: its
    terminationGracePeriodSeconds (above 0 it stays Terminating once deleted: no kubelet)."""
    body = pool.body(spec)
    body["spec"]["priorityClassName"] = cls
    body["spec"]["terminationGracePeriodSeconds"] = grace
    if node:
        body["spec"]["nodeSelector"]["kubernetes.io/hostname"] = node
    pool.specs[spec.name] = spec
    pool.k8s.core.create_namespaced_pod(pool.namespace, body)


def place(pool: Pool, name: str, gib: int, cls: str, node: str, grace: int = 0) -> int:
    """Create and wait until bound on ``node``; returns its card."""
    create(pool, PodSpec(name, mem_gib=gib), cls, node, grace)
    pod = pool.wait_bound([name])[name]
    rec = record_of(pod)
    assert rec is not None and rec.node == node, (name, rec)
    return rec.cards[0].index


def layout_r(pool: Pool) -> str:
    r = pool.node("r", lambda n: cards(n, L4, 2, 24))
    return r


def fill_r(pool: Pool, r: str) -> None:
    a, b = place(pool, "ra", 14, "it-preempt-lowest", r), place(pool, "rb", 14, "it-preempt-lowest", r)
    assert a != b  # 28 GiB cannot share a 24 GiB card
    place(pool, "rc", 10, "it-preempt-mid", r)
    place(pool, "rd", 10, "it-preempt-mid", r)


def fill_g(pool: Pool, g: str, grace: int = 0) -> int:
    x = place(pool, "ga", 20, "it-preempt-low", g, grace)
    assert place(pool, "gb", 12, "it-preempt-mid", g) != x
    place(pool, "gc", 12, "it-preempt-mid", g)
    return x


def fill_a100(pool: Pool, node: str) -> None:
    place(pool, "xa", 20, "it-preempt-lowest", node)
    place(pool, "xb", 20, "it-preempt-lowest", node)


def names(pool: Pool) -> set[str]:
    return set(pool.pods())


def preempt_calls(bed: SchedBed) -> float:
    with bed.extender.session() as s:
        text = s.get(bed.extender.url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("stowage_extender_requests_total{") and 'verb="preempt"' in line)


def pending_for(pool: Pool, name: str, seconds: float) -> Any:
    """The pod stays unbound for ``seconds`` (checked every 0.5 s); returns it."""
    end = time.monotonic() + seconds
    while True:
        pod = pool.pod(name)
        assert not pod.spec.node_name, f"{name} was bound to {pod.spec.node_name}"
        if time.monotonic() > end:
            return pod
        time.sleep(0.5)


def test_shared_pod_evicts_only_the_pod_whose_card_it_can_use(sched: SchedBed, pool: Pool, k8s: LocalK8s) -> None:
    """... and waits for it: the victim (30 s grace period, no kubelet) stays Terminating, still
    holding its card for kube-scheduler and the extender alike, until it is really gone."""
    r = layout_r(pool)
    g = pool.node("g", lambda n: cards(n, L4, 2, 24))
    pool.wait_extender_knows(sched)
    fill_r(pool, r)
    freed = fill_g(pool, g, grace=30)
    calls = preempt_calls(sched)
    create(pool, PodSpec("hi", mem_gib=20), "it-preempt-high")
    ga = wait_until(lambda: (p := pool.pod("ga")).metadata.deletion_timestamp and p, 40,
                    "kube-scheduler to delete ga")
    hi = pending_for(pool, "hi", 3)
    assert hi.status.nominated_node_name == g
    assert ga.metadata.uid in sched.extender.state()["allocations"]  # still counted while Terminating
    assert names(pool) == {"ra", "rb", "rc", "rd", "ga", "gb", "gc", "hi"}  # nothing else evicted meanwhile
    # The freed card is held for the nominated pod against pods of lower priority. kube-scheduler is
    # stopped for this, so that the moment between "ga gone" and "hi bound" lasts: the extender's
    # filter, fed by its watch (hi's nominatedNodeName, ga's deletion), is asked directly.
    sched.stop_scheduler()
    k8s.core.delete_namespaced_pod("ga", pool.namespace, grace_period_seconds=0)  # what a kubelet would confirm
    wait_until(lambda: ga.metadata.uid not in sched.extender.state()["allocations"], 20, "the extender to free ga's card")
    low = pool.body(PodSpec("lo", mem_gib=8))
    low["metadata"]["uid"] = "uid-lo"
    low["spec"]["priority"] = CLASSES["it-preempt-mid"]
    with sched.extender.session() as s:
        ans = s.post(sched.extender.url + "/filter", json={"Pod": low, "NodeNames": [g]}, timeout=10).json()
        assert ans["NodeNames"] == [] and f"cards held for {pool.namespace}/hi" in ans["FailedNodes"][g], ans
        mine = k8s.api_client().sanitize_for_serialization(pool.pod("hi"))
        assert s.post(sched.extender.url + "/filter", json={"Pod": mine, "NodeNames": [g]},
                      timeout=10).json()["NodeNames"] == [g]
    sched.ensure()
    pod = pool.wait_bound(["hi"], timeout=40)["hi"]
    rec = record_of(pod)
    assert rec is not None and rec.node == g and rec.cards[0].index == freed
    assert names(pool) == {"ra", "rb", "rc", "rd", "gb", "gc", "hi"}  # ga alone was evicted
    assert preempt_calls(sched) > calls


def test_model_constrained_pod_never_evicts_on_another_model(sched: SchedBed, pool: Pool) -> None:
    a100 = pool.node("a100", lambda n: cards(n, "NVIDIA A100-PCIE-40GB", 1, 40))
    h100 = pool.node("h100", lambda n: cards(n, "NVIDIA H100 80GB HBM3", 1, 80))
    pool.wait_extender_knows(sched)
    fill_a100(pool, a100)
    place(pool, "ha", 70, "it-preempt-low", h100)
    create(pool, PodSpec("hi", mem_gib=20, annotations={"stowage.io/gpu-model": "H100"}), "it-preempt-high")
    pod = pool.wait_bound(["hi"], timeout=40)["hi"]
    assert record_of(pod).node == h100
    assert names(pool) == {"xa", "xb", "hi"}


def test_contrast_plain_preemption_evicts_and_the_pod_stays_pending(sched: SchedBed, pool: Pool,
                                                                    k8s: LocalK8s) -> None:
    """The same layouts under kube-scheduler's own preemption (no preemptVerb, same extender)."""
    def no_preempt_verb(cfg: dict) -> None:
        del cfg["extenders"][0]["preemptVerb"]

    plain = k8s.start_scheduler(scheduler_config_for_test(sched.extender.url, no_preempt_verb),
                                name="plain-kube-scheduler")
    model_pool = Pool(k8s, "preempt-contrast-model")
    try:
        r = layout_r(pool)
        a100 = model_pool.node("a100", lambda n: cards(n, "NVIDIA A100-PCIE-40GB", 1, 40))
        pool.wait_extender_knows(sched)
        model_pool.wait_extender_knows(sched)
        fill_r(pool, r)
        fill_a100(model_pool, a100)
        create(pool, PodSpec("hi", mem_gib=20), "it-preempt-high")
        create(model_pool, PodSpec("hi", mem_gib=20, annotations={"stowage.io/gpu-model": "H100"}), "it-preempt-high")
        # kube-scheduler evicts rA + rB (14 GiB free on each card) and one A100 pod ...
        wait_until(lambda: names(pool) == {"rc", "rd", "hi"}, 40, "plain preemption to evict ra and rb")
        wait_until(lambda: len(names(model_pool)) == 2, 40, "plain preemption to evict an A100 pod")
        # ... and the preemptors still do not fit: no card has 20 GiB, no card is an H100
        hi = pending_for(pool, "hi", 4)
        pending_for(model_pool, "hi", 0)
        assert hi.status.nominated_node_name in (r, None)
        last = pool.failed_scheduling("hi")[-1]
        assert "no card with 20 GiB GPU memory free" in last, last
        assert "excluded by model/size policy" in " ".join(model_pool.failed_scheduling("hi")[-1:])
    finally:
        model_pool.cleanup()
        plain.stop()
        if k8s.scheduler is plain:
            k8s.scheduler = None
