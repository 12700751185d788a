"""The extender under the REAL kube-scheduler (v1.28.7) loaded with the deployed
``scheduler-config/scheduler-config.yaml``: every request kind of the README's "What a pod asks
for" table and every placement annotation ends up bound where the extender chose, with a record
that matches the node, the request and the policy; rejected pods carry our reason in their
FailedScheduling event.

The nodes are fake (no kubelet, see ``realk8s.fake_gpu_node``); everything else is real: the
scheduler's own filters and scores run, then it calls the extender over HTTP (filter, prioritize,
bind), and the extender binds through the API server. Each test has its own pool of nodes
(``schedbed.Pool``), so the expected placement follows from that test's pods alone.
"""
from __future__ import annotations

import re
import time

from realk8s import wait_until
from schedbed import Pool, PodSpec, SchedBed, assert_no_overcommit, card_usage, cards, node_reasons, record_of

A100 = "NVIDIA A100-SXM4-80GB"
NVLINK_2X4 = [[0, 1, 2, 3], [4, 5, 6, 7]]
NUMA_2X4 = [0, 0, 0, 0, 1, 1, 1, 1]
BACKOFF_PAST_S = 2.5  # longer than kube-scheduler's back-off after a pod's first two attempts (1 s, 2 s)
WAKE_S = 10           # a requeued pod is retried at once; without a requeue it would wait minutes


def a100x8(name: str) -> list:
    return cards(name, A100, 8, 80, nvlink=NVLINK_2X4, numa=NUMA_2X4)


def test_every_request_kind_is_bound_with_a_matching_record(sched: SchedBed, pool: Pool) -> None:
    """N whole GPUs; M GiB of one shared card; M GiB + C % compute; N whole cards of >= M GiB."""
    big = pool.node("a100", a100x8)
    pool.node("t4", lambda n: cards(n, "Tesla T4", 4, 16, numa=[0, 0, 1, 1]))
    pool.wait_extender_knows(sched)

    # N whole cards of at least 40 GiB: the T4 node passes kube-scheduler's own count check
    # (64 units of nvidia.com/gpu-memory allocatable >= 40) and only the extender knows that no
    # T4 card is that big.
    _, rec = pool.place(PodSpec("whole-big", gpus=2, mem_gib=40))
    assert rec.node == big
    pool.place(PodSpec("whole-2", gpus=2))
    pool.place(PodSpec("slice-10", mem_gib=10))
    pool.place(PodSpec("slice-8-core-30", mem_gib=8, core_pct=30))
    # a slice bigger than any T4 card: only the A100 node
    _, rec = pool.place(PodSpec("slice-20-core-50", mem_gib=20, core_pct=50))
    assert rec.node == big
    # an init container's GPUs count by Kubernetes' effective-request rule: max(app, init) = 3
    _, rec = pool.place(PodSpec("init-3", gpus=1, init_gpus=3))
    assert len(rec.cards) == 3
    # kube-apiserver 1.28 drops an init container's restartPolicy (the SidecarContainers gate is
    # alpha, off): the "sidecar" is a plain init container for the scheduler and the extender alike
    pod, rec = pool.place(PodSpec("sidecar", gpus=1, init_gpus=1, init_sidecar=True))
    assert pod.spec.init_containers[0].restart_policy is None and len(rec.cards) == 1
    assert_no_overcommit(card_usage(pool.pods().values()), pool.nodes)
    # the extender's own view agrees with every record on the API server
    state = sched.extender.state()["allocations"]
    for name, p in pool.pods().items():
        mine = state[p.metadata.uid]
        assert mine["node"] == p.spec.node_name, name
        assert sorted(mine["cards"]) == sorted(c.index for c in record_of(p).cards), name


def test_node_policy_pack_fills_the_busy_node_and_spread_the_empty_one(sched: SchedBed, pool: Pool) -> None:
    """stowage.io/node-policy: pack goes where GPUs are already used, spread where none are.

    kube-scheduler adds its own scores (the config's MostAllocated favours the busy node): the
    extender's prioritize (weight 5) must still decide for a spread pod."""
    nodes = [pool.node(f"n{i}", lambda n: cards(n, A100, 4, 80)) for i in range(3)]
    pool.wait_extender_knows(sched)
    _, first = pool.place(PodSpec("first", gpus=1))
    _, packed = pool.place(PodSpec("packed", gpus=1, annotations={"stowage.io/node-policy": "pack"}))
    assert packed.node == first.node
    _, spread = pool.place(PodSpec("spread", gpus=1, annotations={"stowage.io/node-policy": "spread"}))
    assert spread.node != first.node
    # the next spread pod avoids both used nodes: the third is empty
    _, spread2 = pool.place(PodSpec("spread-2", mem_gib=10, annotations={"stowage.io/node-policy": "spread"}))
    assert spread2.node not in (first.node, spread.node), (spread2.node, nodes)
    # and the default (pack) fills the busiest node: first's, with 2 of 4 cards used
    _, default = pool.place(PodSpec("default", gpus=2))
    assert default.node == first.node


def test_card_policy_pack_shares_a_used_card_and_spread_takes_an_empty_one(sched: SchedBed, pool: Pool) -> None:
    """stowage.io/card-policy: pack fills a card already shared; spread takes the emptiest card."""
    pool.node("n", lambda n: cards(n, A100, 4, 80))
    pool.wait_extender_knows(sched)
    _, s0 = pool.place(PodSpec("s0", mem_gib=20))
    _, packed = pool.place(PodSpec("packed", mem_gib=20, annotations={"stowage.io/card-policy": "pack"}))
    assert packed.cards[0].index == s0.cards[0].index
    _, spread = pool.place(PodSpec("spread", mem_gib=20, annotations={"stowage.io/card-policy": "spread"}))
    assert spread.cards[0].index != s0.cards[0].index
    _, spread2 = pool.place(PodSpec("spread-2", mem_gib=20, annotations={"stowage.io/card-policy": "spread"}))
    assert spread2.cards[0].index not in (s0.cards[0].index, spread.cards[0].index)


def test_gpu_model_and_exclude_match_whole_tokens(sched: SchedBed, pool: Pool) -> None:
    """stowage.io/gpu-model(-exclude): exact whole-token match; `A10` never selects an A100.

    The A100 node is made the busiest first, so that a pack pod which the filter wrongly let
    onto it would go there (packing prefers busy nodes): only the filter keeps it off."""
    a100 = pool.node("a100", lambda n: cards(n, A100, 8, 80))
    a10 = pool.node("a10", lambda n: cards(n, "NVIDIA A10", 4, 24))
    a10g = pool.node("a10g", lambda n: cards(n, "NVIDIA A10G", 4, 24))
    pool.wait_extender_knows(sched)
    models = {a100: A100, a10: "NVIDIA A10", a10g: "NVIDIA A10G"}
    _, busy = pool.place(PodSpec("busy", gpus=4, annotations={"stowage.io/gpu-model": "A100"}))
    assert busy.node == a100
    cases = [  # (annotations, request, allowed nodes)
        ({"stowage.io/gpu-model": "A10"}, dict(gpus=1), {a10}),
        ({"stowage.io/gpu-model": "A10"}, dict(mem_gib=4), {a10}),
        ({"stowage.io/gpu-model": "A10G"}, dict(gpus=1), {a10g}),
        ({"stowage.io/gpu-model": "NVIDIA A10, A10G"}, dict(gpus=1), {a10, a10g}),
        ({"stowage.io/gpu-model-exclude": "A100"}, dict(gpus=1), {a10, a10g}),
        ({"stowage.io/gpu-model-exclude": "A10"}, dict(mem_gib=4), {a100, a10g}),
        # excluding A10 and A10G leaves the A100: "A10" did not exclude it
        ({"stowage.io/gpu-model-exclude": "A10,A10G"}, dict(gpus=1), {a100}),
        ({"stowage.io/gpu-model": "A100-SXM4", "stowage.io/gpu-model-exclude": "A10"}, dict(gpus=1), {a100}),
    ]
    for i, (ann, req, allowed) in enumerate(cases):
        _, rec = pool.place(PodSpec(f"m{i}", annotations=ann, **req))
        assert rec.node in allowed, (ann, req, rec.node, models[rec.node])


def test_min_card_memory_keeps_whole_gpu_pods_off_small_cards(sched: SchedBed, pool: Pool) -> None:
    """stowage.io/min-card-memory: `80Gi` and a bare `40` (GiB) only on cards that big."""
    t4 = pool.node("t4", lambda n: cards(n, "Tesla T4", 4, 16))
    a40 = pool.node("a100-40", lambda n: cards(n, "NVIDIA A100-SXM4-40GB", 4, 40))
    a80 = pool.node("a100-80", lambda n: cards(n, A100, 4, 80))
    pool.wait_extender_knows(sched)
    # fill the T4 node a little so that packing would prefer it
    _, t = pool.place(PodSpec("t", gpus=1, annotations={"stowage.io/gpu-model": "T4"}))
    assert t.node == t4
    _, r80 = pool.place(PodSpec("min80", gpus=2, annotations={"stowage.io/min-card-memory": "80Gi"}))
    assert r80.node == a80
    _, r40 = pool.place(PodSpec("min40", gpus=1, annotations={"stowage.io/min-card-memory": "40"}))
    assert r40.node in (a40, a80)
    _, r40b = pool.place(PodSpec("min40-b", gpus=3, annotations={"stowage.io/min-card-memory": "40Gi"}))
    assert r40b.node in (a40, a80)
    _, anysize = pool.place(PodSpec("any", gpus=2))
    assert anysize.node == t4  # without the annotation, the busy T4 node packs (it has 3 free)


def nvlink_group(k: int) -> int:
    return next(g for g, grp in enumerate(NVLINK_2X4) if k in grp)


def test_prefer_local_keeps_multi_gpu_pods_inside_one_nvlink_group(sched: SchedBed, pool: Pool) -> None:
    """stowage.io/gpu-topology: prefer-local (the default) puts a multi-GPU pod inside one NVLink
    group whenever one has enough free cards, even when the lowest free cards straddle two."""
    node = pool.node("h100", lambda n: cards(n, "NVIDIA H100-SXM5-80GB", 8, 80, nvlink=NVLINK_2X4, numa=NUMA_2X4))
    pool.wait_extender_knows(sched)
    held: set[int] = set()

    def free_in_groups() -> list[int]:
        return [sum(1 for k in grp if k not in held) for grp in NVLINK_2X4]

    # After "one" takes a card of one group, the four lowest free cards straddle both groups,
    # yet the other group is whole: "four" must get exactly that group.
    steps = [PodSpec("one", gpus=1), PodSpec("four", gpus=4),
             PodSpec("two", gpus=2, annotations={"stowage.io/gpu-topology": "prefer-local"}),
             PodSpec("one-b", gpus=1, annotations={"stowage.io/gpu-topology": "any"})]
    for spec in steps:
        # every multi-GPU step is chosen so that one group can hold it: the check never goes vacuous
        assert spec.gpus == 1 or any(f >= spec.gpus for f in free_in_groups()), (spec.name, held)
        _, rec = pool.place(spec)
        got = [c.index for c in rec.cards]
        assert rec.node == node and not held & set(got), (spec.name, got, held)
        assert len({nvlink_group(k) for k in got}) == 1, f"{spec.name} straddles NVLink groups: {got}"
        held |= set(got)
    assert len(held) == 8
    assert all(len(u.holders) == 1 for u in card_usage(pool.pods().values()).values())


def test_rejected_pods_show_our_reason_in_failed_scheduling(sched: SchedBed, pool: Pool) -> None:
    """Pods the extender rejects stay unbound, and the FailedScheduling Event kube-scheduler writes
    carries the extender's reason text (what a user reads in `kubectl describe pod`); a rejection
    nothing can cure (FailedAndUnresolvableNodes) tells kube-scheduler that preemption cannot help."""
    pool.node("a100", lambda n: cards(n, A100, 8, 80))
    pool.node("t4", lambda n: cards(n, "Tesla T4", 4, 16))
    pool.wait_extender_knows(sched)
    cases = [  # (pod, our reason for the A100 node, preemption can help nowhere)
        (PodSpec("no-such-model", gpus=1, annotations={"stowage.io/gpu-model": "B200"}),
         "too few free cards for 1 GPU: 0 free (8 excluded by model/size policy)", True),
        # bigger than any card: kube-scheduler's own count rejects the T4 node (64 units < 100),
        # the A100 node (640 units) passes it and only the extender knows no card is that big
        (PodSpec("slice-too-big", mem_gib=100), "no card with 100 GiB GPU memory free", False),
        (PodSpec("bad-policy", gpus=1, annotations={"stowage.io/node-policy": "tight"}),
         "Stowage cannot schedule this pod: annotation stowage.io/node-policy: unknown value 'tight' "
         "(expected pack or spread)", True),
    ]
    for spec, _, _ in cases:
        pool.create(spec)
    for spec, want, hopeless in cases:
        msg = wait_until(lambda: pool.failed_scheduling(spec.name), 30, f"a FailedScheduling event of {spec.name}")[-1]
        assert want in node_reasons(msg), msg  # our reason, whole, as one of the event's reasons
        if hopeless:
            assert re.search(r"preemption: 0/(\d+) nodes are available: \1 Preemption is not helpful", msg), msg
    for spec, _, _ in cases:
        p = pool.pod(spec.name)
        assert not p.spec.node_name and record_of(p) is None, spec.name
        assert any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                   for c in p.status.conditions or []), spec.name


def test_nodes_refused_for_one_cause_count_as_one_reason(sched: SchedBed, pool: Pool) -> None:
    """kube-scheduler's message counts nodes per distinct reason text ("2 no card with ..."). Our
    texts once held each node's best card ("best is 30 GiB on card 0"), so every node was its own
    "1 ..." entry: on the 1,213-node openb cluster up to 78 of them in one pod's event. Two nodes
    with different free memory, both short for the same cause, must read as one entry of 2."""
    pool.node("n1", lambda n: cards(n, A100, 2, 80))
    pool.wait_extender_knows(sched)
    for name in ("a", "b"):                          # n1's two cards: 30 GiB free on each
        pool.place(PodSpec(name, mem_gib=50))
    n2 = pool.node("n2", lambda n: cards(n, A100, 2, 80))
    pool.wait_extender_knows(sched)
    for name in ("c", "d"):                          # too big for n1 now: n2's cards, 20 GiB free on each
        assert pool.place(PodSpec(name, mem_gib=60))[0].spec.node_name == n2
    # 40 GiB: kube-scheduler's own count passes both nodes (60 and 40 units free), no card has it
    pool.create(PodSpec("slice", mem_gib=40))
    msg = wait_until(lambda: pool.failed_scheduling("slice"), 30, "slice's FailedScheduling")[-1]
    # (nodes of other tests, e.g. a not-ready one, are counted too, with kube-scheduler's reasons)
    ours = {r: n for r, n in node_reasons(msg).items() if r.startswith("no card")}
    assert ours == {"no card with 40 GiB GPU memory free": 2}, msg


def test_a_pod_waiting_for_cards_gets_them_when_a_pod_leaves(sched: SchedBed, pool: Pool) -> None:
    """Pods leave: the pods waiting for their cards get exactly those cards, at once.

    The race this holds down (found here): kube-scheduler retries a waiting pod on the deletion
    it sees through its own informer and may call filter before the extender's watch has
    delivered the same deletion; refused on that stale view, the pod waited for the next cluster
    event (up to 5 minutes). Within the pod's back-off (1 s, doubling) the retry came late enough
    to hide it, so each pod here waits past its back-off before the departure. The extender now
    requeues the pods it refused when its watch frees cards (extender/requeue.py)."""
    node = pool.node("n", lambda n: cards(n, A100, 2, 80))
    pool.wait_extender_knows(sched)
    a = pool.place(PodSpec("a", mem_gib=50))
    b = pool.place(PodSpec("b", mem_gib=50))
    assert a[1].cards[0].index != b[1].cards[0].index

    def wait_then_leave(waiting: str, leaver) -> None:  # noqa: ANN001 - a V1Pod
        wait_until(lambda: pool.failed_scheduling(waiting), 30, f"{waiting}'s FailedScheduling")
        time.sleep(BACKOFF_PAST_S)  # the scenario itself: a pod that has waited past its back-off
        pool.k8s.core.delete_namespaced_pod(leaver.metadata.name, pool.namespace, grace_period_seconds=0)
        del pool.specs[leaver.metadata.name]

    # 40 GiB fits on neither card (30 GiB free on each), though the node's gpu-memory count
    # (160 - 100 = 60 units) lets kube-scheduler's own filter pass: the extender refuses it
    pool.create(PodSpec("slice", mem_gib=40))
    wait_until(lambda: pool.failed_scheduling("slice"), 30, "slice's FailedScheduling")
    ours = {r: n for r, n in node_reasons(pool.failed_scheduling("slice")[-1]).items() if r.startswith("no card")}
    assert ours == {"no card with 40 GiB GPU memory free": 1}
    wait_then_leave("slice", a[0])
    pool.wait_bound(["slice"], timeout=WAKE_S)
    assert record_of(pool.pod("slice")).cards[0].index == a[1].cards[0].index
    # both cards are shared now: a whole GPU waits until b's card is empty again
    pool.create(PodSpec("whole", gpus=1))
    wait_then_leave("whole", b[0])
    pool.wait_bound(["whole"], timeout=WAKE_S)
    rec = record_of(pool.pod("whole"))
    assert rec.node == node and rec.cards[0].index == b[1].cards[0].index
    assert_no_overcommit(card_usage(pool.pods().values()), pool.nodes)


def test_pods_without_gpus_go_through_the_extender_and_hold_host_room(sched: SchedBed, pool: Pool) -> None:
    """The profile lists no managedResources, so kube-scheduler sends CPU-only pods to the extender
    too (an invalid Stowage annotation on one shows our message); one bound holds its CPU and a
    pod slot in the extender's model (no card), and a GPU pod that needs that CPU goes elsewhere."""
    a = pool.node("a", lambda n: cards(n, A100, 2, 80), cpu="8")
    b = pool.node("b", lambda n: cards(n, A100, 2, 80), cpu="8")
    pool.wait_extender_knows(sched)
    pool.create(PodSpec("cpu-bad-policy", cpu="1", annotations={"stowage.io/node-policy": "tightest"}))
    wait_until(lambda: any("Stowage cannot schedule this pod" in m for m in pool.failed_scheduling("cpu-bad-policy")),
               30, "the extender's reason for the CPU-only pod")
    pool.create(PodSpec("cpu-only", cpu="6"))
    pod = pool.wait_bound(["cpu-only"])["cpu-only"]
    held = sched.extender.state()["allocations"][pod.metadata.uid]
    assert held["node"] == pod.spec.node_name and held["cards"] == []
    # 8 CPUs per node, 6 taken on one: a GPU pod asking for 4 must take the other node's cards.
    gpu, rec = pool.place(PodSpec("gpu-4cpu", gpus=1, cpu="4"))
    assert rec.node == ({a, b} - {pod.spec.node_name}).pop()


def stranded_on_metrics(sched: SchedBed) -> float:
    """``stowage_extender_stranded_whole_cards`` as the extender serves it now."""
    with sched.extender.session() as s:
        text = s.get(sched.extender.url + "/metrics", timeout=10).text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("stowage_extender_stranded_whole_cards ")]
    return float(line.split()[1])


def test_free_cards_on_a_node_whose_cpu_a_pod_bound_by_hand_took_are_counted_stranded(sched: SchedBed,
                                                                                      pool: Pool) -> None:
    """The live model's host figures come from the real API server (node allocatable, every bound
    pod's requests, any scheduler's): a pod bound by hand (``spec.nodeName``, no scheduler) that
    takes a node's last CPUs strands that node's free cards, and /metrics says how many.

    The gauge is cluster-wide and measured against the running 1-GPU pods' median request, so
    other nodes of the shared cluster move with that median: the test places three 1-GPU pods of
    4 CPUs (the median from then on, whatever else runs) and counts only what the hand-bound pod
    changes."""
    a = pool.node("a", lambda n: cards(n, A100, 6, 80), cpu="16")
    pool.wait_extender_knows(sched)
    for k in range(3):
        pool.place(PodSpec(f"gpu-4cpu-{k}", gpus=1, cpu="4"))   # 12 of 16 CPUs, 3 of 6 cards
    before = stranded_on_metrics(sched)                      # 4 CPUs left: the 3 free cards usable
    hog = pool.body(PodSpec("cpu-hog", cpu="2"))
    hog["spec"].pop("schedulerName")
    hog["spec"]["nodeName"] = a                               # bound by hand: 2 CPUs left < 4
    pool.k8s.core.create_namespaced_pod(pool.namespace, hog)
    wait_until(lambda: stranded_on_metrics(sched) == before + 3, 30, "the 3 free cards of the node counted stranded")
    pool.k8s.core.delete_namespaced_pod("cpu-hog", pool.namespace, grace_period_seconds=0)
    wait_until(lambda: stranded_on_metrics(sched) == before, 30, "the cards usable again once the pod left")
