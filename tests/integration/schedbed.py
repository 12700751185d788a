"""The scheduler test bed: the real kube-scheduler loaded with the deployed
``scheduler-config/scheduler-config.yaml`` calling ``stowage extender`` (kube mode, the deployed
split layout ``--workers 2``) as real processes, on fake GPU nodes of the real API server.

Why a module of its own: the scheduler tests (``test_real_scheduler*.py``) share the processes
(:class:`SchedBed`, one per session, restarted when a test stopped them or another test replaced
kube-scheduler), and each test gets its own node pool and namespace (:class:`Pool`), so that tests
never see each other's cards and the device-plugin tests' real node (``gpu-node-1``) is never a
candidate: every pod selects its pool's label, which only that pool's fake nodes carry.

Everything asserted comes from the API server (``spec.nodeName``, the ``PodScheduled`` condition,
the ``stowage.io/allocation`` record, Events) or from the extender's ``/state``; the helpers that
check a record (:func:`check_record`) and sum card use (:func:`card_usage`) are written from the
README's request table, not from the extender's code, so they can disagree with it.
"""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable

from realk8s import ExtenderProc, LocalK8s, Proc, fake_gpu_node, scheduler_config_for_test, wait_until
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, decode_allocation
from stowage.inventory import Card

SCHEDULER_NAME = "stowage-scheduler"  # the profile of scheduler-config.yaml
POOL_LABEL = "stowage.io/it-pool"     # only this module's fake nodes carry it
GIB = 1024
IMAGE = "example.local/fakegpu-test:1"  # never runs: the fake nodes have no kubelet


class SchedBed:
    """One ``stowage extender`` and one kube-scheduler with the deployed config, per session.

    :meth:`ensure` (called before each test) restarts whichever is not running as this bed left
    it: a test may stop the extender (restart and outage tests), and another test file may have
    started its own kube-scheduler in :attr:`LocalK8s.scheduler`'s single slot.
    """

    def __init__(self, k8s: LocalK8s) -> None:
        self.k8s = k8s
        self.extender = ExtenderProc(k8s, args=("--workers", "2", "--log-level", "info"), name="stowage-extender")
        self._scheduler: Proc | None = None

    def ensure(self) -> "SchedBed":
        if self.extender.proc is None or not self.extender.proc.alive():
            self.extender.start()
        if self._scheduler is None or self.k8s.scheduler is not self._scheduler or not self._scheduler.alive():
            self.start_scheduler()
        return self

    def start_scheduler(self) -> Proc:
        self._scheduler = self.k8s.start_scheduler(scheduler_config_for_test(self.extender.url),
                                                   name="stowage-kube-scheduler")
        return self._scheduler

    def stop_scheduler(self) -> None:
        """Stop this bed's kube-scheduler only (:meth:`ensure` starts it again)."""
        if self._scheduler is not None and self.k8s.scheduler is self._scheduler:
            self._scheduler.stop()
            self.k8s.scheduler = None

    def stop(self) -> None:
        self.extender.stop()
        if self._scheduler is not None and self.k8s.scheduler is self._scheduler:
            self._scheduler.stop()
            self.k8s.scheduler = None

    def scheduler_log(self) -> str:
        return self._scheduler.log_tail(60) if self._scheduler else "(no scheduler)"


def cards(node: str, model: str, n: int, mem_gib: int, *, nvlink: list[list[int]] | None = None,
          numa: list[int] | None = None, unhealthy: Iterable[int] = ()) -> list[Card]:
    """``n`` cards of one model as the device plugin would publish them (uuids unique per node)."""
    bad = set(unhealthy)
    links: dict[int, tuple[int, ...]] = {}
    for group in nvlink or []:
        for k in group:
            links[k] = tuple(j for j in group if j != k)
    return [Card(index=k, uuid=f"GPU-{node}-{k}", model=model, memory_mib=mem_gib * GIB, healthy=k not in bad,
                 numa=(numa[k] if numa else -1), nvlink=links.get(k, ())) for k in range(n)]


@dataclass
class PodSpec:
    """What a test pod asks for, kept beside the pod so the checks know the request."""

    name: str
    gpus: int = 0
    mem_gib: int = 0
    core_pct: int = 0
    annotations: dict[str, str] = field(default_factory=dict)
    init_gpus: int = 0          # an init container asking for this many whole GPUs
    init_sidecar: bool = False  # ... with restartPolicy: Always (a KEP-753 sidecar)
    cpu: str = ""               # host CPU the pod asks for ("" none)
    tolerations: list[dict] = field(default_factory=list)   # spec.tolerations

    @property
    def whole(self) -> bool:
        return self.effective_gpus > 0

    @property
    def effective_gpus(self) -> int:
        """Kubernetes' effective request for plain init containers: max(app, each init)."""
        return max(self.gpus, self.init_gpus)

    def limits(self) -> dict[str, str]:
        out = {}
        if self.gpus:
            out["nvidia.com/gpu"] = str(self.gpus)
        if self.mem_gib:
            out["nvidia.com/gpu-memory"] = str(self.mem_gib)
        if self.core_pct:
            out["nvidia.com/gpu-core"] = str(self.core_pct)
        if self.cpu:
            out["cpu"] = self.cpu
        return out


def dns_name(text: str, limit: int = 40) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-")


class Pool:
    """A test's own fake GPU nodes (labelled ``POOL_LABEL=<name>``), namespace and pods.

    Pods select the pool's label and use the stowage-scheduler profile. :meth:`cleanup` deletes
    the pods (grace period 0: no kubelet will ever confirm a graceful deletion) and the nodes;
    the namespace stays (a deleted Namespace would stay Terminating: no controller-manager).
    """

    def __init__(self, k8s: LocalK8s, name: str) -> None:
        self.k8s = k8s
        self.name = dns_name(name)
        self.namespace = "it-" + self.name
        self.nodes: dict[str, list[Card]] = {}
        self.specs: dict[str, PodSpec] = {}
        try:
            k8s.core.create_namespace({"metadata": {"name": self.namespace}})
        except Exception as exc:  # noqa: BLE001 - exists from a rerun of the same test in this session
            if getattr(exc, "status", None) != 409:
                raise

    # --- nodes ---------------------------------------------------------------------------------
    def node(self, suffix: str, node_cards_fn: Any, **kw: Any) -> str:
        """Create node ``<pool>-<suffix>``; ``node_cards_fn(name)`` gives its cards."""
        name = f"{self.name}-{suffix}"[:63]
        cs = node_cards_fn(name)
        fake_gpu_node(self.k8s, name, cs, labels={POOL_LABEL: self.name}, **kw)
        self.nodes[name] = cs
        return name

    def wait_extender_knows(self, bed: SchedBed) -> None:
        """Nodes reach the extender through its watch: wait until all are in its model, schedulable.

        Without this a test's first pod could race the watch and meet "node unknown to Stowage"."""
        def known() -> bool:
            st = {n["name"]: n for n in bed.extender.state()["nodes"]}
            return all(name in st and st[name]["schedulable"] and len(st[name]["cards"]) == len(cs)
                       for name, cs in self.nodes.items())
        wait_until(known, 30, f"the extender to see pool {self.name}'s nodes")

    # --- pods ----------------------------------------------------------------------------------
    def body(self, spec: PodSpec) -> dict:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": spec.name, "namespace": self.namespace, "labels": {POOL_LABEL: self.name},
                             "annotations": dict(spec.annotations)},
                "spec": {"schedulerName": SCHEDULER_NAME, "nodeSelector": {POOL_LABEL: self.name},
                         "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "main", "image": IMAGE,
                                         "resources": {"limits": spec.limits()}}],
                         **({"tolerations": spec.tolerations} if spec.tolerations else {}),
                         **({"initContainers": [{
                             "name": "init", "image": IMAGE,
                             "resources": {"limits": {"nvidia.com/gpu": str(spec.init_gpus)}},
                             **({"restartPolicy": "Always"} if spec.init_sidecar else {})}]}
                            if spec.init_gpus else {})}}

    def create(self, spec: PodSpec) -> PodSpec:
        self.specs[spec.name] = spec
        self.k8s.core.create_namespaced_pod(self.namespace, self.body(spec))
        return spec

    def create_many(self, specs: list[PodSpec], threads: int = 8) -> None:
        """Create the pods at once (several API connections), as a burst of users would."""
        for s in specs:
            self.specs[s.name] = s
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda s: self.k8s.core.create_namespaced_pod(self.namespace, self.body(s)), specs))

    def pods(self) -> dict[str, Any]:
        """Every pod of the pool by name (one LIST; V1Pod objects)."""
        items = self.k8s.core.list_namespaced_pod(self.namespace, label_selector=f"{POOL_LABEL}={self.name}").items
        return {p.metadata.name: p for p in items}

    def pod(self, name: str) -> Any:
        return self.k8s.core.read_namespaced_pod(name, self.namespace)

    def wait_bound(self, names: Iterable[str], timeout: float = 30) -> dict[str, Any]:
        """Wait until each pod is bound (nodeName and PodScheduled=True); returns the pods."""
        names = list(names)

        def bound() -> dict[str, Any] | None:
            pods = self.pods()
            if all(n in pods and is_bound(pods[n]) for n in names):
                return {n: pods[n] for n in names}
            return None
        try:
            return wait_until(bound, timeout, f"pods {names[:5]}{'...' if len(names) > 5 else ''} to be bound")
        except AssertionError as exc:
            pods = self.pods()
            left = [n for n in names if not (n in pods and is_bound(pods[n]))]
            msgs = {n: self.failed_scheduling(n)[-1:] for n in left[:3]}
            raise AssertionError(f"{exc}; unbound: {left[:10]}; their last FailedScheduling: {msgs}") from None

    def place(self, spec: PodSpec, timeout: float = 30) -> tuple[Any, AllocationRecord]:
        """Create one pod, wait until it is bound, check its record; returns (pod, record)."""
        self.create(spec)
        pod = self.wait_bound([spec.name], timeout)[spec.name]
        return pod, check_record(pod, spec, self.nodes)

    def failed_scheduling(self, name: str) -> list[str]:
        """The messages of the pod's FailedScheduling Events, oldest first."""
        evs = self.k8s.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name},reason=FailedScheduling").items
        evs.sort(key=lambda e: (e.last_timestamp or e.event_time or e.metadata.creation_timestamp))
        return [e.message or e.note or "" for e in evs]

    def cleanup(self) -> None:
        try:
            self.k8s.core.delete_collection_namespaced_pod(self.namespace, label_selector=f"{POOL_LABEL}={self.name}",
                                                           grace_period_seconds=0)
        finally:
            for name in self.nodes:
                try:
                    self.k8s.core.delete_node(name)
                except Exception:  # noqa: BLE001 - already gone
                    pass


def is_bound(pod: Any) -> bool:
    conds = pod.status.conditions or [] if pod.status else []
    return bool(pod.spec.node_name) and any(c.type == "PodScheduled" and c.status == "True" for c in conds)


def record_of(pod: Any) -> AllocationRecord | None:
    value = (pod.metadata.annotations or {}).get(ALLOCATION_ANNOTATION)
    return decode_allocation(value) if value else None


def check_record(pod: Any, spec: PodSpec, nodes: dict[str, list[Card]]) -> AllocationRecord | None:
    """The pod's allocation record agrees with where it is bound, with its node's cards and with
    what it asked for (the README's request table). Returns the record (None for a pod that asks
    for no GPU, which must have none)."""
    rec = record_of(pod)
    if not spec.limits() and not spec.init_gpus:  # no managed resource: never sent to the extender, nothing recorded
        assert rec is None, f"{spec.name} asks for no GPU but carries {rec}"
        return None
    assert rec is not None, f"{spec.name} is bound to {pod.spec.node_name} without {ALLOCATION_ANNOTATION}"
    assert rec.node == pod.spec.node_name, f"{spec.name}: record says {rec.node}, bound to {pod.spec.node_name}"
    inv = {c.index: c for c in nodes[rec.node]}
    idx = [c.index for c in rec.cards]
    assert len(set(idx)) == len(idx), f"{spec.name}: a card twice in {idx}"
    for share in rec.cards:
        card = inv.get(share.index)
        assert card is not None, f"{spec.name}: card {share.index} is not on {rec.node}"
        assert card.healthy, f"{spec.name}: got unhealthy card {share.index}"
        assert share.uuid == card.uuid, f"{spec.name}: card {share.index} uuid {share.uuid} != {card.uuid}"
    if spec.whole:
        assert rec.whole and len(rec.cards) == spec.effective_gpus, \
            f"{spec.name}: {rec} for {spec.effective_gpus} whole GPUs"
        for share in rec.cards:
            card = inv[share.index]
            assert share.memory_mib == card.memory_mib and share.core_milli == 1000, f"{spec.name}: {share}"
            # nvidia.com/gpu: N + nvidia.com/gpu-memory: M = N whole cards of at least M GiB each
            assert card.memory_mib >= spec.mem_gib * GIB, f"{spec.name}: card {card} smaller than {spec.mem_gib} GiB"
    else:
        assert not rec.whole and len(rec.cards) == 1, f"{spec.name}: a shared pod got {rec}"
        assert rec.cards[0].memory_mib == spec.mem_gib * GIB, f"{spec.name}: {rec.cards[0]}"
        assert rec.cards[0].core_milli == spec.core_pct * 10, f"{spec.name}: {rec.cards[0]}"
    return rec


@dataclass
class CardUse:
    holders: list[str] = field(default_factory=list)
    whole_holders: list[str] = field(default_factory=list)
    mem_mib: int = 0
    core_milli: int = 0


def card_usage(pods: Iterable[Any]) -> dict[tuple[str, int], CardUse]:
    """Per (node, card index): who holds it and how much, summed over every bound pod's record."""
    use: dict[tuple[str, int], CardUse] = {}
    for p in pods:
        rec = record_of(p)
        if rec is None or p.metadata.deletion_timestamp:
            continue
        for share in rec.cards:
            u = use.setdefault((rec.node, share.index), CardUse())
            u.holders.append(p.metadata.name)
            if rec.whole:
                u.whole_holders.append(p.metadata.name)
            u.mem_mib += share.memory_mib
            u.core_milli += share.core_milli
    return use


def assert_no_overcommit(use: dict[tuple[str, int], CardUse], nodes: dict[str, list[Card]]) -> None:
    """No card is promised beyond its memory or compute, and a whole card has exactly one holder."""
    for (node, k), u in use.items():
        card = {c.index: c for c in nodes[node]}[k]
        assert u.mem_mib <= card.memory_mib, f"{node} card {k}: {u.mem_mib} MiB promised of {card.memory_mib}: {u.holders}"
        assert u.core_milli <= 1000, f"{node} card {k}: {u.core_milli} milli-cards promised: {u.holders}"
        if u.whole_holders:
            assert len(u.holders) == 1, f"{node} card {k} is whole for {u.whole_holders} but also held by {u.holders}"


def fits_somewhere(spec: PodSpec, use: dict[tuple[str, int], CardUse], nodes: dict[str, list[Card]],
                   pods_per_node: dict[str, int], max_pods: int = 110) -> str | None:
    """A node (and why) where ``spec`` would fit given ``use``, or None: "every pod that fits gets bound"."""
    for node, cs in nodes.items():
        if pods_per_node.get(node, 0) >= max_pods:
            continue
        healthy = [c for c in cs if c.healthy]
        if spec.whole:
            free = [c for c in healthy if (node, c.index) not in use and c.memory_mib >= spec.mem_gib * GIB]
            if len(free) >= spec.effective_gpus:
                return f"{node}: {len(free)} free cards"
        else:
            for c in healthy:
                u = use.get((node, c.index), CardUse())
                if not u.whole_holders and c.memory_mib - u.mem_mib >= spec.mem_gib * GIB \
                        and 1000 - u.core_milli >= spec.core_pct * 10:
                    return f"{node} card {c.index}: {c.memory_mib - u.mem_mib} MiB, {1000 - u.core_milli} milli free"
    return None


def settle_and_check(bed: SchedBed, pool: Pool, timeout: float) -> tuple[dict[str, Any], list[str]]:
    """Wait until every pod of the pool is bound or fits nowhere, then check the whole pool.

    Capacity only shrinks while pods arrive (nothing leaves), so a pod that fits nowhere now will
    never fit: "bound or hopeless" is the end state. Asserted: each bound pod's record matches its
    node and request; no card is over-committed and a whole card has one holder; every unbound pod
    fits nowhere; the extender's model holds exactly the bound pods' allocations.
    Returns (bound pods by name, unbound names).
    """
    def settled() -> bool:
        pods = pool.pods()
        use = card_usage(pods.values())
        per_node: dict[str, int] = {}
        for p in pods.values():
            if p.spec.node_name:
                per_node[p.spec.node_name] = per_node.get(p.spec.node_name, 0) + 1
        waiting = [n for n in pool.specs if not (n in pods and is_bound(pods[n]))]
        settled.why = [(n, fits_somewhere(pool.specs[n], use, pool.nodes, per_node)) for n in waiting]
        return all(where is None for _, where in settled.why)
    settled.why = []
    try:
        wait_until(settled, timeout, f"pool {pool.name} to settle", interval=0.5)
    except AssertionError as exc:
        fit = [(n, w) for n, w in settled.why if w]
        raise AssertionError(f"{exc}: {len(fit)} unbound pods fit somewhere, e.g. {fit[:5]}; "
                             f"their events: {[pool.failed_scheduling(n)[-1:] for n, _ in fit[:2]]}") from None
    pods = pool.pods()
    bound = {n: p for n, p in pods.items() if is_bound(p)}
    for n, p in bound.items():
        check_record(p, pool.specs[n], pool.nodes)
    assert_no_overcommit(card_usage(bound.values()), pool.nodes)
    unbound = sorted(set(pool.specs) - set(bound))
    for n in unbound:
        assert record_of(pods[n]) is None and not pods[n].spec.node_name, f"{n} has a record but is not bound"
    allocs = bed.extender.state()["allocations"]
    for n, p in bound.items():
        if not pool.specs[n].limits() and not pool.specs[n].init_gpus:
            continue  # no GPU asked for: not in the extender's model (checked above: no record)
        mine = allocs.get(p.metadata.uid)
        assert mine is not None, f"the extender's model lacks {n}"
        assert mine["node"] == p.spec.node_name and sorted(mine["cards"]) == sorted(c.index for c in record_of(p).cards)
    assert not {pods[n].metadata.uid for n in unbound} & set(allocs), "the extender holds cards for unbound pods"
    return bound, unbound


def node_reasons(message: str) -> dict[str, int]:
    """kube-scheduler's FailedScheduling message split into {reason: number of nodes}.

    1.28 writes ``0/N nodes are available: <n1> <reason1>, <n2> <reason2>. preemption: ...``.
    Asserted here, as a reader of the event must be able to: each part is "<count> <reason>"
    with a reason that does not start with a digit, and the counts add up to N (a reason with
    ", " inside would split into parts that do not)."""
    m = re.match(r"0/(\d+) nodes are available: (.*?)\. preemption: ", message)
    assert m, f"not a FailedScheduling message of kube-scheduler 1.28: {message!r}"
    counts: dict[str, int] = {}
    for part in m.group(2).split(", "):
        pm = re.fullmatch(r"(\d+) (\D.*)", part)
        assert pm, f"{part!r} does not read as '<count> <reason>' in {message!r}"
        counts[pm.group(2)] = counts.get(pm.group(2), 0) + int(pm.group(1))
    assert sum(counts.values()) == int(m.group(1)), f"the counts do not add up to {m.group(1)} nodes: {message!r}"
    return counts
