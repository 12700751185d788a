"""The device plugin with the REAL kubelet (v1.28.7, containerd): registration, Allocate, restarts, health.

NVML is faked at the pynvml layer (``tests/fakenvml.py``); everything above it is the plugin's own
code, in this process, on the kubelet's real device-plugin directory. Pods run the image
``example.local/fakegpu-test:1 env``, which prints its environment: what the kubelet put in the
container from our Allocate answer is read back from the container's log. Pods are bound as the
extender binds them (its ``KubeBinder``: one Binding that carries the record), without a scheduler, so each test
controls exactly which card a pod is recorded on and when it is bound.

The node, the plugin and the pod helpers are ``kubeletbed.py``'s (fixtures ``gpu_node`` and
``clean`` in ``conftest.py``), shared with the exporter's real-kubelet tests.

The two bugs of issue 11 are pinned here: a pod bound while the kubelet is down must get ITS
recorded card during the restarted kubelet's re-admission (not a running pod's card that the
PodResources API does not list yet), and the plugin must re-register within 200 ms of the
kubelet's registration server coming back even while it was backing off.
"""
from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Callable

import pytest

from kubeletbed import NODE, NS, GpuNode, create_and_bind, gpu_container, whole_and_shared_pods
from realk8s import LocalK8s, wait_until

from stowage.allocation import ALLOCATION_ANNOTATION, decode_allocation
from stowage.inventory import INVENTORY_ANNOTATION, decode_inventory
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY

pytestmark = pytest.mark.timeout(300)


def test_registers_three_resources_and_the_node_shows_them(gpu_node: GpuNode) -> None:
    cards = gpu_node.nvml.cards
    want = {RESOURCE_GPU: str(len(cards)), RESOURCE_GPU_MEMORY: str(sum(c.memory_mib // 1024 for c in cards)),
            RESOURCE_GPU_CORE: str(100 * len(cards))}

    def shown() -> bool:
        cap, alloc = gpu_node.node_resources()
        return all(cap.get(r) == v and alloc.get(r) == v for r, v in want.items())
    wait_until(shown, 30, f"node {NODE} capacity and allocatable {want}")
    ann = gpu_node.k8s.core.read_node(NODE).metadata.annotations or {}
    inv = decode_inventory(ann[INVENTORY_ANNOTATION])
    assert [c.uuid for c in inv.cards] == [c.uuid for c in cards]


def test_each_container_gets_exactly_its_recorded_cards(clean: GpuNode) -> None:
    n = clean
    pods = whole_and_shared_pods(n)
    create_and_bind(n, pods)
    for name in pods:
        n.wait_running(name)

    env = n.container_env("whole-two", "main")
    assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted([n.uuid(0), n.uuid(1)])
    assert env["STOWAGE_POD"] == f"{NS}/whole-two"
    for cont in ("prep", "main"):
        env = n.container_env("whole-init", cont)
        assert env["NVIDIA_VISIBLE_DEVICES"] == n.uuid(2), cont
        assert env["STOWAGE_POD"] == f"{NS}/whole-init"
    for name, mem, core in (("slice-a", 4, 25), ("slice-b", 2, 10)):
        env = n.container_env(name, "main")
        assert env["NVIDIA_VISIBLE_DEVICES"] == n.uuid(3)
        assert env["STOWAGE_POD"] == f"{NS}/{name}"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={mem * 1024}M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(core)

    # The exporter's PodResources client reads the real kubelet's API: every container above is
    # listed with device IDs on its recorded card(s), in the counts it asked for.
    from gpunode.podresources.client import list_devices
    table = n.plugin.state.table
    ids: dict[tuple[str, str, str], list[str]] = {}
    for r in list_devices():   # the kubelet lists a resource's devices in one row per NUMA node
        if r.namespace == NS:
            ids.setdefault((r.pod, r.container, r.resource), []).extend(r.device_ids)
    got = {k: sorted({table.card_of(k[2], i).uuid for i in v}) for k, v in ids.items()}
    counts = {k: len(v) for k, v in ids.items()}
    assert got[("whole-two", "main", RESOURCE_GPU)] == sorted([n.uuid(0), n.uuid(1)])
    assert got[("whole-init", "main", RESOURCE_GPU)] == [n.uuid(2)]
    assert got[("slice-a", "main", RESOURCE_GPU_MEMORY)] == [n.uuid(3)]
    assert counts[("slice-a", "main", RESOURCE_GPU_MEMORY)] == 4
    assert counts[("slice-a", "main", RESOURCE_GPU_CORE)] == 25
    assert counts[("slice-b", "main", RESOURCE_GPU_CORE)] == 10
    # no record had to be corrected: the kubelet was steered to exactly the recorded cards
    for name, (_, _, rec) in pods.items():
        assert decode_allocation(n.pod(name)["metadata"]["annotations"][ALLOCATION_ANNOTATION]) == rec


def _kubelet_log_of(k8s: LocalK8s, pid: int, needle: str) -> list[str]:
    """The log lines of kubelet process ``pid`` that contain ``needle`` (klog's header:
    ``I1201 13:50:20.702962   19270 file.go:79] ...``; earlier kubelets append to the same log)."""
    out = []
    for line in k8s.kubelet_log().splitlines():
        fields = line.split(None, 3)
        if needle in line and len(fields) > 2 and fields[2] == str(pid):
            out.append(line)
    return out


def _kubelet_lines(k8s: LocalK8s, pid: int, needle: str) -> list[float]:
    """Wall times of the log lines of kubelet process ``pid`` that contain ``needle``."""
    return [_kubelet_log_time(line) for line in _kubelet_log_of(k8s, pid, needle)]


def _kubelet_registration_server_started(k8s: LocalK8s, pid: int) -> float | None:
    """Wall time of the "Starting device plugin registration server" line of kubelet ``pid``."""
    times = _kubelet_lines(k8s, pid, "Starting device plugin registration server")
    return times[0] if times else None


def test_pod_bound_while_the_kubelet_is_down_gets_its_own_card(clean: GpuNode) -> None:
    """Issue 11, bug 1. The restarted kubelet re-admits pods one at a time in creation order, and
    its PodResources API lists only those re-added so far. The new pod was created before the
    running one, so it is re-admitted first: the running pod is not listed yet, but it has
    ``status.startTime`` and must not be taken for the pod waiting for devices."""
    n = clean
    # Slices: the running pod's card still has free memory/core devices, so the kubelet offers them.
    newer = n.create_pod("bound-while-down", [gpu_container("main", mem=4, core=10)])   # created first
    running = n.create_pod("running", [gpu_container("main", mem=4, core=10)])
    n.bind(running, n.record([0], whole=False, mem_gib=4, core_pct=10))
    n.wait_running("running")
    assert n.container_env("running", "main")["NVIDIA_VISIBLE_DEVICES"] == n.uuid(0)
    n.restart_plugin()              # a plugin that did not itself answer the running pod's Allocate
    n.k8s.stop_kubelet()
    n.bind(newer, n.record([1], whole=False, mem_gib=4, core_pct=10))
    n.k8s.start_kubelet_again()
    n.wait_running("bound-while-down")
    env = n.container_env("bound-while-down", "main")
    assert env["STOWAGE_POD"] == f"{NS}/bound-while-down"
    assert env["NVIDIA_VISIBLE_DEVICES"] == n.uuid(1)
    rec = decode_allocation(n.pod("bound-while-down")["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    assert rec.uuids == [n.uuid(1)], "the record was 'corrected' to another pod's card"
    # the running pod was not lost and still holds its card
    time.sleep(2 * n.plugin.cfg.reconcile_interval_s)   # a reconciliation round that would mis-correct
    p = n.pod("running")
    assert p["status"]["phase"] == "Running"
    assert all(cs.get("restartCount", 0) == 0 for cs in p["status"].get("containerStatuses", []))
    assert decode_allocation(p["metadata"]["annotations"][ALLOCATION_ANNOTATION]).uuids == [n.uuid(0)]
    assert not n.plugin.reconciler.applied, [c.why for c in n.plugin.reconciler.applied]


# --- pods bound, while the kubelet is down, on cards its checkpoint still gives to pods gone since ---
#
# A restarted kubelet admits the pods of its first list from the API server BEFORE its device
# manager drops the checkpoint allocations of pods that are gone (deleted while it was down) or
# finished: for that first batch those devices are neither free nor listed for a live pod. The
# extender, which saw the pod go, may already have bound a new pod on its card.

def _restart_kubelet(n: GpuNode, while_down: Callable[[], None]) -> int:
    """Stop the kubelet, do ``while_down``, start it again; the new kubelet's pid."""
    n.k8s.stop_kubelet()
    while_down()
    n.k8s.start_kubelet_again()
    pid = n.k8s.kubelet_pid()
    assert pid is not None
    return pid


def _first_batch(k8s: LocalK8s, pid: int) -> list[str]:
    """The pods (namespace/name, sorted) of kubelet ``pid``'s first "SyncLoop ADD" from the API
    server (the line lists them as received, in no fixed order; the kubelet admits them by
    creation time, pods created in the same second in either order)."""
    line = wait_until(lambda: next(iter(_kubelet_log_of(k8s, pid, '"SyncLoop ADD" source="api"')), None), 30,
                      "the kubelet's first SyncLoop ADD")
    m = re.search(r"pods=\[(.*?)\]", line)
    assert m, line
    return sorted(p.strip('"') for p in m.group(1).split(",") if p)


def _read_stale_entry(k8s: LocalK8s, pid: int, uid: str) -> bool:
    """Whether kubelet ``pid`` read a device allocation of pod ``uid`` from its checkpoint at start."""
    return bool(_kubelet_log_of(k8s, pid, f'"Get checkpoint entry" podUID="{uid}"'))


def _record_of(n: GpuNode, name: str) -> list[str]:
    return decode_allocation(n.pod(name)["metadata"]["annotations"][ALLOCATION_ANNOTATION]).uuids


def _extender_cards(n: GpuNode) -> dict[str, tuple[int, ...]]:
    """The extender's model of this node, read afresh from the API server by its own feeder:
    namespace/name -> card indices of every pod it counts there."""
    from extender.kube import KubeFeeder
    from packing.model import ClusterModel
    f = KubeFeeder(ClusterModel(), n.k8s.api_client())
    f.sync_once()
    return {a.name: a.cards for a in f.model.allocations.values() if a.node == NODE and a.cards}


def _corrections_of(n: GpuNode, name: str) -> list[tuple[list[str], list[str]]]:
    return [(c.old.uuids, c.new.uuids) for c in n.plugin.reconciler.applied if c.ref == f"{NS}/{name}"]


def test_pod_bound_on_the_card_of_a_pod_deleted_while_the_kubelet_was_down_runs_on_a_free_card(clean: GpuNode) -> None:
    """Variant (a), other cards free. The force-deleted pod's card 0 is still "held" in the
    restarted kubelet's checkpoint when it admits the pod bound there, so it offers cards 1-3 only.
    The plugin used to refuse (the pod failed admission: UnexpectedAdmissionError, "no pod waiting
    on this node matches a request for 1 device(s) among the 3 offered"); it now gives the pod a
    free offered card that no other pod is recorded on, and the reconciler corrects the record.
    Card 0 is not lost: the kubelet drops the stale allocation at its next admission."""
    n = clean
    gone = n.create_pod("deleted-while-down", [gpu_container("main", gpus=1)])
    n.bind(gone, n.record([0], whole=True))
    n.wait_running("deleted-while-down")
    newer = n.create_pod("bound-on-its-card", [gpu_container("main", gpus=1)])

    def while_down() -> None:
        n.k8s.core.delete_namespaced_pod("deleted-while-down", NS, grace_period_seconds=0)  # gone from the API at once
        n.bind(newer, n.record([0], whole=True))       # the extender saw card 0 freed
    pid = _restart_kubelet(n, while_down)
    n.wait_running("bound-on-its-card")
    assert _read_stale_entry(n.k8s, pid, gone["metadata"]["uid"])
    assert _first_batch(n.k8s, pid) == [f"{NS}/bound-on-its-card"]
    env = n.container_env("bound-on-its-card", "main")
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["STOWAGE_POD"]) == (n.uuid(1), f"{NS}/bound-on-its-card")
    wait_until(lambda: _record_of(n, "bound-on-its-card") == [n.uuid(1)], 30, "the record corrected to card 1")
    assert _corrections_of(n, "bound-on-its-card") == [([n.uuid(0)], [n.uuid(1)])]
    # card 0 is free again, for the kubelet as for the extender
    nxt = n.create_pod("next-on-card-0", [gpu_container("main", gpus=1)])
    n.bind(nxt, n.record([0], whole=True))
    n.wait_running("next-on-card-0")
    assert n.container_env("next-on-card-0", "main")["NVIDIA_VISIBLE_DEVICES"] == n.uuid(0)
    assert _extender_cards(n) == {f"{NS}/bound-on-its-card": (1,), f"{NS}/next-on-card-0": (0,)}


def test_pod_bound_on_the_card_of_a_deleted_pod_fails_admission_when_no_card_is_free(clean: GpuNode) -> None:
    """Variant (b), every other card held. The restarted kubelet counts no free device for the
    pod bound on the deleted pod's card and fails it without calling the plugin: unavoidable
    kubelet behaviour (docs/deviceplugin.md). What must hold around it: the extender frees the
    failed pod's card, the running pods keep theirs, and a replacement (what a controller creates)
    bound on that card runs there, the failed pod's record on the same card not honoured."""
    n = clean
    for i in range(4):
        n.bind(n.create_pod(f"running-{i}", [gpu_container("main", gpus=1)]), n.record([i], whole=True))
    for i in range(4):
        n.wait_running(f"running-{i}")
    newer = n.create_pod("bound-on-its-card", [gpu_container("main", gpus=1)])

    def while_down() -> None:
        n.k8s.core.delete_namespaced_pod("running-0", NS, grace_period_seconds=0)
        n.bind(newer, n.record([0], whole=True))
    pid = _restart_kubelet(n, while_down)
    st = n.wait_phase("bound-on-its-card", "Failed")["status"]
    assert st.get("reason") == "UnexpectedAdmissionError", st
    assert ("requested number of devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0"
            in st.get("message", "")), st
    assert _first_batch(n.k8s, pid) == [f"{NS}/bound-on-its-card"] + [f"{NS}/running-{i}" for i in (1, 2, 3)]
    assert not n.plugin.allocs.ledger.count(newer["metadata"]["uid"], RESOURCE_GPU)   # the plugin was not asked
    assert _extender_cards(n) == {f"{NS}/running-{i}": (i,) for i in (1, 2, 3)}
    for i in (1, 2, 3):
        p = n.pod(f"running-{i}")
        assert p["status"]["phase"] == "Running"
        assert all(cs.get("restartCount", 0) == 0 for cs in p["status"].get("containerStatuses", []))
    rep = n.create_pod("replacement", [gpu_container("main", gpus=1)])
    n.bind(rep, n.record([0], whole=True))
    n.wait_running("replacement")
    env = n.container_env("replacement", "main")
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["STOWAGE_POD"]) == (n.uuid(0), f"{NS}/replacement")
    assert _record_of(n, "bound-on-its-card") == [n.uuid(0)]    # the failed pod's record is left as it was


def test_pods_bound_on_cards_of_whole_pods_gone_while_the_kubelet_was_down(clean: GpuNode) -> None:
    """Variant (c): shares recorded on cards whole pods held, one that finished before the kubelet
    went down (the API keeps it, Succeeded), one force-deleted while it was down. The whole pods
    held only ``nvidia.com/gpu``, so the restarted kubelet offers the cards' memory and compute
    devices, but its PodResources lists the finished pod with card 0 until it drops the stale
    allocation. The plugin took that for the card's holder and refused the share on card 0 (the
    pod failed admission: "which pod dp-it/finished already holds whole"): a finished pod holds
    nothing. And a whole pod recorded on the A10 of another deleted pod has no equal card to move to
    (the A100s are the shares', the T4 is another model): the plugin refuses it, saying why."""
    n = clean
    fin = n.create_pod("finished", [gpu_container("main", gpus=1, exit_after=True)], restart_policy="Never")
    n.bind(fin, n.record([0], whole=True))
    gone = [n.create_pod(f"deleted-while-down-{i}", [gpu_container("main", gpus=1)]) for i in (1, 2)]
    for i, p in zip((1, 2), gone):
        n.bind(p, n.record([i], whole=True))
    n.wait_phase("finished", "Succeeded")
    for i in (1, 2):
        n.wait_running(f"deleted-while-down-{i}")
    shares = [n.create_pod(f"share-{i}", [gpu_container("main", mem=4, core=10)]) for i in (0, 1)]
    on_a10 = n.create_pod("whole-on-a10", [gpu_container("main", gpus=1)])

    def while_down() -> None:
        for i in (1, 2):
            n.k8s.core.delete_namespaced_pod(f"deleted-while-down-{i}", NS, grace_period_seconds=0)
        for i, p in enumerate(shares):
            n.bind(p, n.record([i], whole=False, mem_gib=4, core_pct=10))
        n.bind(on_a10, n.record([2], whole=True))
    pid = _restart_kubelet(n, while_down)
    for i in (0, 1):
        n.wait_running(f"share-{i}")
    for p in [fin] + gone:
        assert _read_stale_entry(n.k8s, pid, p["metadata"]["uid"])
    assert _first_batch(n.k8s, pid) == [f"{NS}/finished", f"{NS}/share-0", f"{NS}/share-1", f"{NS}/whole-on-a10"]
    for i in (0, 1):
        env = n.container_env(f"share-{i}", "main")
        assert (env["NVIDIA_VISIBLE_DEVICES"], env["STOWAGE_POD"]) == (n.uuid(i), f"{NS}/share-{i}")
        assert _record_of(n, f"share-{i}") == [n.uuid(i)]
        assert not _corrections_of(n, f"share-{i}")
    st = n.wait_phase("whole-on-a10", "Failed")["status"]
    assert st.get("reason") == "UnexpectedAdmissionError", st
    assert f"the recorded card(s) of {NS}/whole-on-a10" in st.get("message", ""), st
    assert "no equal card" in st.get("message", ""), st
    assert _record_of(n, "whole-on-a10") == [n.uuid(2)]

def test_reregisters_within_200ms_of_the_kubelets_return(clean: GpuNode) -> None:
    """Issue 11, bug 2. While the kubelet is down its stale kubelet.sock makes Register fail every
    try; when the kubelet's registration server is back the plugin must register at once, not
    after its retry delay, or the kubelet re-admits pods before the plugin is there and fails
    them ("no healthy devices present")."""
    n = clean
    init_pod = n.create_pod("with-gpu-init", [gpu_container("main", gpus=1)],
                            init=[gpu_container("prep", gpus=1, exit_after=True)])
    n.bind(init_pod, n.record([0], whole=True))
    n.wait_running("with-gpu-init")
    # Two pods of the same shape, created (not yet bound) in different seconds: the restarted
    # kubelet re-admits pods sorted by creationTimestamp, with an unstable sort, so two created in
    # the same second may come in either order, and the plugin (which never sees the pod in a
    # kubelet call) would steer by the other order; the reconciler then swaps their records.
    pending = [n.create_pod("pending-1", [gpu_container("main", gpus=1)])]
    time.sleep(1.1)
    pending.append(n.create_pod("pending-2", [gpu_container("main", gpus=1)]))
    n.k8s.stop_kubelet()
    n.restart_plugin(wait_registered=False)   # e.g. a DaemonSet upgrade while the kubelet is down
    wait_until(lambda: any(ep.next_try > time.monotonic() for ep in n.plugin.endpoints), 10,
               "the plugin to fail a registration against the stale kubelet.sock")
    time.sleep(0.6)                           # into its back-off
    for p, card in zip(pending, (1, 2)):
        n.bind(p, n.record([card], whole=True))
    before = n.plugin.endpoints[0].registrations
    n.k8s.start_kubelet_again()
    registered_at = wait_until(lambda: time.time() if all(
        ep.registrations > 0 and ep.registered_with == n.plugin._kubelet_ino() for ep in n.plugin.endpoints)
        and n.plugin.endpoints[0].registrations >= before else None, 20, "re-registration", interval=0.005)
    pid = n.k8s.kubelet_pid()
    server_at = wait_until(lambda: _kubelet_registration_server_started(n.k8s, pid), 20,
                           "the kubelet's registration server line in its log")
    print(f"re-registered {(registered_at - server_at) * 1000:.0f} ms after the kubelet's registration server started")
    assert registered_at - server_at <= 0.2, (f"registered {registered_at - server_at:.3f}s after the kubelet's "
                                              "registration server started")
    for name in ("pending-1", "pending-2"):
        n.wait_running(name)
        assert n.container_env(name, "main")["NVIDIA_VISIBLE_DEVICES"] == n.uuid(int(name[-1]))
    p = n.pod("with-gpu-init")
    assert p["status"]["phase"] == "Running", p["status"]


def _kubelet_log_time(line: str) -> float:
    m = re.match(r"[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)", line)
    assert m, line
    mo, d, h, mi, s, frac = m.groups()
    return datetime(datetime.now(timezone.utc).year, int(mo), int(d), int(h), int(mi), int(s),
                    int(frac[:6].ljust(6, "0")), tzinfo=timezone.utc).timestamp()


def test_kubelet_restart_reregisters_before_readmission_and_loses_no_pod(clean: GpuNode) -> None:
    n = clean
    running = n.create_pod("keeps-running", [gpu_container("main", gpus=1)])
    n.bind(running, n.record([2], whole=True))
    n.wait_running("keeps-running")
    registrations = [ep.registrations for ep in n.plugin.endpoints]
    n.k8s.stop_kubelet()
    late = n.create_pod("bound-during-restart", [gpu_container("main", mem=3, core=20)])
    n.bind(late, n.record([3], whole=False, mem_gib=3, core_pct=20))
    n.k8s.start_kubelet_again()
    registered_at = wait_until(lambda: time.time() if all(
        ep.registrations > before for ep, before in zip(n.plugin.endpoints, registrations)) else None,
        20, "re-registration after the kubelet restart", interval=0.005)
    n.wait_running("bound-during-restart")
    readmitted = [t for t in _kubelet_lines(n.k8s, n.k8s.kubelet_pid(), '"SyncLoop ADD" source="api"')]
    assert readmitted, "no re-admission in the kubelet's log"
    assert registered_at < min(readmitted), "registered after the kubelet re-admitted the pods"
    assert n.container_env("bound-during-restart", "main")["NVIDIA_VISIBLE_DEVICES"] == n.uuid(3)
    p = n.pod("keeps-running")
    assert p["status"]["phase"] == "Running"
    assert all(cs.get("restartCount", 0) == 0 for cs in p["status"].get("containerStatuses", []))


def test_plugin_restart_keeps_pods_and_places_the_next_one_on_its_card(clean: GpuNode) -> None:
    n = clean
    first = n.create_pod("before-restart", [gpu_container("main", mem=8, core=30)])
    n.bind(first, n.record([0], whole=False, mem_gib=8, core_pct=30))
    n.wait_running("before-restart")
    n.restart_plugin()     # fresh process memory: what was given is learned from PodResources
    second = n.create_pod("after-restart", [gpu_container("main", mem=8, core=30)])
    n.bind(second, n.record([1], whole=False, mem_gib=8, core_pct=30))
    n.wait_running("after-restart")
    env = n.container_env("after-restart", "main")
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["STOWAGE_POD"]) == (n.uuid(1), f"{NS}/after-restart")
    assert n.pod("before-restart")["status"]["phase"] == "Running"
    # while the plugin was away the kubelet counted its devices unhealthy; they come back with it
    wait_until(lambda: n.node_resources()[1].get(RESOURCE_GPU) == str(len(n.nvml.cards)), 30,
               "all cards allocatable again after the plugin restart")


def test_xid_marks_a_card_unhealthy_on_the_node_and_it_recovers(clean: GpuNode) -> None:
    n = clean
    total = len(n.nvml.cards)
    wait_until(lambda: n.node_resources()[1].get(RESOURCE_GPU) == str(total), 30, "all cards allocatable")
    n.nvml.lose(n.uuid(1))       # fallen off the bus: XID 79, and probes fail until it is back
    n.nvml.xid(n.uuid(1), 79)
    wait_until(lambda: n.node_resources()[1].get(RESOURCE_GPU) == str(total - 1), 40,
               "the kubelet to show one card fewer allocatable")
    cap, alloc = n.node_resources()
    assert cap.get(RESOURCE_GPU) == str(total)          # capacity keeps the card, allocatable drops it
    assert int(alloc[RESOURCE_GPU_MEMORY]) == int(cap[RESOURCE_GPU_MEMORY]) - n.nvml.cards[1].memory_mib // 1024
    inv = decode_inventory((n.k8s.core.read_node(NODE).metadata.annotations or {})[INVENTORY_ANNOTATION])
    assert [c.healthy for c in inv.cards] == [True, False, True, True]
    # back on the bus, quiet for recovery_quiet_s and probing fine: healthy, allocatable again
    n.nvml.restore(n.uuid(1))
    wait_until(lambda: n.node_resources()[1].get(RESOURCE_GPU) == str(total), 60, "the card to come back")
    inv = decode_inventory((n.k8s.core.read_node(NODE).metadata.annotations or {})[INVENTORY_ANNOTATION])
    assert all(c.healthy for c in inv.cards)


def test_forged_record_on_a_pod_created_on_the_node_gets_no_card(clean: GpuNode) -> None:
    """Issue 12, item 1: a pod author creates a pod with spec.nodeName and a hand-written record
    naming the card another pod holds whole; it used to start with that card in its environment.
    The plugin refuses, so the kubelet fails the pod at admission; the owner is untouched."""
    n = clean
    owner = n.create_pod("owner", [gpu_container("main", gpus=1)])
    n.bind(owner, n.record([0], whole=True))
    n.wait_running("owner")
    from stowage.allocation import encode_allocation
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "thief", "namespace": NS, "annotations": {
                ALLOCATION_ANNOTATION: encode_allocation(n.record([0], whole=False, mem_gib=4, core_pct=10))}},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                     "containers": [gpu_container("main", mem=4, core=10)]}}
    n.k8s.core.create_namespaced_pod(NS, body)

    def failed() -> dict | None:
        p = n.pod("thief")
        return p if p["status"].get("phase") == "Failed" else None
    p = wait_until(failed, 60, "the kubelet to refuse the pod with the forged record")
    assert p["status"].get("reason") == "UnexpectedAdmissionError", p["status"]
    assert "already holds" in p["status"].get("message", ""), p["status"]
    assert n.pod("owner")["status"]["phase"] == "Running"
    assert n.container_env("owner", "main")["NVIDIA_VISIBLE_DEVICES"] == n.uuid(0)
