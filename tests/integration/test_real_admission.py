"""Issue 12, items 1 and 7, on the real kube-apiserver v1.28.7 with RBAC and the
ValidatingAdmissionPolicy API switched on (``local-k8s up --rbac``): the shipped manifests
(``kubectl apply -k scheduler-config/``) make allocation records writable by Stowage alone, limit
what Stowage's own writes may change, and grant each component only what it uses. The extender
then schedules a pod with the real kube-scheduler under its own service account."""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from realk8s import REPO, ExtenderProc, LocalK8s, fake_gpu_node, scheduler_config_for_test, wait_until
from stowage.inventory import Card

NS = "stowage-system"
ALLOC = "stowage.io/allocation"
INVENTORY = "stowage.io/gpu-inventory"
RECORD = '{"cards":[{"coreMilli":1000,"index":0,"memoryMiB":81920,"uuid":"GPU-0"}],"node":"%s","version":1,"whole":true}'


@pytest.fixture(scope="module")
def policy_k8s(rbac_k8s: LocalK8s) -> LocalK8s:
    """The --rbac control plane with scheduler-config/ applied for real, and a pod author."""
    k8s = rbac_k8s
    k8s.kubectl("apply", "-k", str(REPO / "scheduler-config"))
    for ns in ("team-a",):
        k8s.kubectl("create", "namespace", ns, check=False)
        k8s.kubectl("create", "serviceaccount", "default", "-n", ns, check=False)
    # A pod author: may do anything with pods in team-a (as namespace admins usually can).
    k8s.kubectl("create", "serviceaccount", "author", "-n", "team-a", check=False)
    k8s.kubectl("create", "role", "pod-author", "-n", "team-a", "--verb=*", "--resource=pods", check=False)
    k8s.kubectl("create", "rolebinding", "pod-author", "-n", "team-a", "--role=pod-author",
                "--serviceaccount=team-a:author", check=False)
    wait_until(lambda: _policies_in_force(k8s), 60, "the three admission policies to be in force")
    return k8s


def _policies_in_force(k8s: LocalK8s) -> bool:
    """Whether each of the three policies refuses a write it exists to refuse (server-side dry runs).

    The API server's admission plugin learns policies through its own informer, some time after
    ``kubectl apply`` returned: on a loaded machine a write made at once was let through (a fresh-
    clone CI saw the author's forged record created)."""
    import kubernetes

    def refused_as(user: str, write: Callable[[kubernetes.client.CoreV1Api], Any], policy: str) -> bool:
        client = k8s.api_client()
        client.set_default_header("Impersonate-User", user)
        try:
            write(kubernetes.client.CoreV1Api(client))
        except kubernetes.client.ApiException as exc:
            return exc.status in (403, 422) and policy in str(exc.body)
        return False

    probe = "admission-probe"
    k8s.kubectl("create", "-n", "team-a", "-f", "-", input=_pod(probe), check=False)
    label = {"metadata": {"labels": {"probe": "1"}}}
    return (refused_as("system:serviceaccount:team-a:author",
                       lambda core: core.create_namespaced_pod("team-a", json.loads(
                           _pod(f"{probe}-forged", {ALLOC: RECORD % "n1"})), dry_run="All"),
                       "stowage-allocation-record")
            and refused_as(f"system:serviceaccount:{NS}:stowage-extender",
                           lambda core: core.patch_namespaced_pod(probe, "team-a", label, dry_run="All"),
                           "stowage-extender-pod-writes")
            and refused_as(f"system:serviceaccount:{NS}:stowage-device-plugin",
                           lambda core: core.patch_namespaced_pod(probe, "team-a", label, dry_run="All"),
                           "stowage-device-plugin-writes"))


class As:
    """kubectl as a service account (its token from the TokenRequest API)."""

    def __init__(self, k8s: LocalK8s, sa: str, namespace: str) -> None:
        self.k8s = k8s
        self.token = k8s.token(sa, namespace)
        self.user = f"system:serviceaccount:{namespace}:{sa}"

    def kubectl(self, *args: str, input: str | None = None):
        return self.k8s.kubectl("--token", self.token, *args, input=input, check=False)

    def core(self, tmp: Path):
        """The Python client as this account (what our components use; no GET before a PATCH)."""
        import kubernetes
        cfg = self.kubeconfig(tmp / f"{self.user.rsplit(':', 1)[1]}.kubeconfig")
        return kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(config_file=str(cfg)))

    def kubeconfig(self, path: Path) -> Path:
        cfg = yaml.safe_load(self.k8s.kubeconfig.read_text())
        cfg["users"] = [{"name": "admin", "user": {"token": self.token}}]
        path.write_text(yaml.safe_dump(cfg))
        return path


def _pod(name: str, annotations: dict | None = None, node: str | None = None, gpus: int = 1,
         scheduler: str = "default-scheduler") -> str:
    spec = {"schedulerName": scheduler, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9",
                                                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "annotations": annotations or {}}, "spec": spec})


def _denied(r, *words: str) -> None:
    assert r.returncode != 0, f"allowed: {r.stdout}"
    for w in words:
        assert w in r.stderr, r.stderr


def _ok(r) -> None:
    assert r.returncode == 0, r.stderr


def test_pod_authors_cannot_write_allocation_records(policy_k8s: LocalK8s) -> None:
    author = As(policy_k8s, "author", "team-a")
    extender = As(policy_k8s, "stowage-extender", NS)
    name = f"p-{uuid.uuid4().hex[:6]}"
    # create with a forged record: denied, with the reason
    _denied(author.kubectl("create", "-n", "team-a", "-f", "-", input=_pod(name, {ALLOC: RECORD % "n1"})),
            "stowage-allocation-record", "cannot be created with it")
    _ok(author.kubectl("create", "-n", "team-a", "-f", "-", input=_pod(name)))
    # add one later: denied (merge patch, and a full update)
    patch = json.dumps({"metadata": {"annotations": {ALLOC: RECORD % "n1"}}})
    _denied(author.kubectl("patch", "pod", name, "-n", "team-a", "--type=merge", "-p", patch),
            "only the Stowage extender may set, change or remove stowage.io/allocation")
    _denied(author.kubectl("annotate", "pod", name, "-n", "team-a", f"{ALLOC}={RECORD % 'n1'}"), "Stowage extender")
    # the extender writes it
    _ok(extender.kubectl("patch", "pod", name, "-n", "team-a", "--type=merge", "-p", patch))
    # the author can neither change it nor remove it, but may change anything else of theirs
    _denied(author.kubectl("annotate", "--overwrite", "pod", name, "-n", "team-a", f"{ALLOC}={RECORD % 'n2'}"),
            "Stowage extender")
    _denied(author.kubectl("annotate", "pod", name, "-n", "team-a", f"{ALLOC}-"), "Stowage extender")
    _ok(author.kubectl("annotate", "pod", name, "-n", "team-a", "team.example/owner=alice"))
    _ok(author.kubectl("label", "pod", name, "-n", "team-a", "tier=gpu"))
    got = json.loads(policy_k8s.kubectl("get", "pod", name, "-n", "team-a", "-o", "json").stdout)
    assert got["metadata"]["annotations"][ALLOC] == RECORD % "n1"
    # cluster admins are held to it too (the admin user of local-k8s is in system:masters)
    r = policy_k8s.kubectl("annotate", "--overwrite", "pod", name, "-n", "team-a", f"{ALLOC}={RECORD % 'n3'}",
                         check=False)
    _denied(r, "Stowage extender")


def test_the_extender_may_change_the_record_and_nothing_else(policy_k8s: LocalK8s) -> None:
    extender = As(policy_k8s, "stowage-extender", NS)
    name = f"q-{uuid.uuid4().hex[:6]}"
    _ok(policy_k8s.kubectl("create", "-n", "team-a", "-f", "-", input=_pod(name, {"team.example/owner": "bob"}),
                         check=False))
    rec = json.dumps({"metadata": {"annotations": {ALLOC: RECORD % "n1"}}})
    _ok(extender.kubectl("patch", "pod", name, "-n", "team-a", "--type=merge", "-p", rec))
    for patch in ({"metadata": {"labels": {"x": "y"}}},
                  {"metadata": {"annotations": {"team.example/owner": "mallory"}}},
                  {"metadata": {"annotations": {"team.example/owner": None}}},
                  {"metadata": {"annotations": {"other": "x", ALLOC: RECORD % "n2"}}},
                  {"spec": {"activeDeadlineSeconds": 5}}):
        _denied(extender.kubectl("patch", "pod", name, "-n", "team-a", "--type=merge", "-p", json.dumps(patch)),
                "stowage-extender-pod-writes")
    # The requeue stamp (extender/requeue.py) on a pending pod: allowed; with anything else: denied.
    stamp = {"metadata": {"annotations": {"stowage.io/requeued-at": "1764590000.000"}}}
    _ok(extender.kubectl("patch", "pod", name, "-n", "team-a", "--type=merge", "-p", json.dumps(stamp)))
    stamp["metadata"]["annotations"]["team.example/owner"] = "mallory"
    _denied(extender.kubectl("patch", "pod", name, "-n", "team-a", "--type=merge", "-p", json.dumps(stamp)),
            "stowage-extender-pod-writes")
    # A JSON patch that tests the uid and the record, then removes it (the binder's roll-back before
    # it bound in one write; removing a stale record): allowed.
    uid = json.loads(policy_k8s.kubectl("get", "pod", name, "-n", "team-a", "-o", "json").stdout)["metadata"]["uid"]
    ops = [{"op": "test", "path": "/metadata/uid", "value": uid},
           {"op": "test", "path": "/metadata/annotations/stowage.io~1allocation", "value": RECORD % "n1"},
           {"op": "remove", "path": "/metadata/annotations/stowage.io~1allocation"}]
    _ok(extender.kubectl("patch", "pod", name, "-n", "team-a", "--type=json", "-p", json.dumps(ops)))
    # RBAC: what it does, and nothing more.
    def can(*args: str) -> bool:
        return extender.kubectl("auth", "can-i", *args).stdout.strip() == "yes"
    assert can("list", "pods", "-A") and can("watch", "nodes") and can("create", "pods", "--subresource=binding", "-n", "team-a")
    assert not can("create", "pods", "-n", "team-a") and not can("delete", "pods", "-n", "team-a")
    assert not can("patch", "nodes") and not can("get", "secrets", "-n", NS) and not can("create", "events")
    assert not can("update", "pods", "--subresource=status", "-n", "team-a")


def test_the_device_plugin_may_change_only_its_two_annotations(policy_k8s: LocalK8s, tmp_path: Path) -> None:
    dp = As(policy_k8s, "stowage-device-plugin", NS)
    node = f"dp-node-{uuid.uuid4().hex[:6]}"
    fake_gpu_node(policy_k8s, node, [Card(index=0, uuid="GPU-0", model="NVIDIA A100-SXM4-80GB", memory_mib=81920)])
    import kubernetes
    core = dp.core(tmp_path)

    def patch_node(body: dict) -> str:
        """What the device plugin does (kubectl would GET first, which it may not): '' or the refusal."""
        try:
            core.patch_node(node, body, _content_type="application/merge-patch+json")
            return ""
        except kubernetes.client.ApiException as exc:
            assert exc.status in (403, 422), exc
            return str(exc.body)
    assert patch_node({"metadata": {"annotations": {INVENTORY: '{"version":1,"cards":[]}'}}}) == ""
    for body in ({"metadata": {"labels": {"evil": "1"}}}, {"metadata": {"annotations": {"other": "1"}}},
                 {"spec": {"unschedulable": True}}):
        assert "stowage-device-plugin-writes" in patch_node(body), body
    bound, unbound = f"b-{uuid.uuid4().hex[:6]}", f"u-{uuid.uuid4().hex[:6]}"
    _ok(policy_k8s.kubectl("create", "-n", "team-a", "-f", "-", input=_pod(bound, node=node), check=False))
    _ok(policy_k8s.kubectl("create", "-n", "team-a", "-f", "-", input=_pod(unbound), check=False))
    def patch_pod(pod: str, body: dict) -> str:
        try:
            core.patch_namespaced_pod(pod, "team-a", body, _content_type="application/merge-patch+json")
            return ""
        except kubernetes.client.ApiException as exc:
            assert exc.status in (403, 422), exc
            return str(exc.body)
    fix = {"metadata": {"annotations": {ALLOC: RECORD % node}}}
    assert patch_pod(bound, fix) == ""
    assert "bound to a node" in patch_pod(unbound, fix)
    assert "must name that node" in patch_pod(bound, {"metadata": {"annotations": {ALLOC: RECORD % "elsewhere"}}})
    assert "stowage-device-plugin-writes" in patch_pod(bound, {"metadata": {"labels": {"x": "y"}}})
    def can(*args: str) -> bool:
        return dp.kubectl("auth", "can-i", *args).stdout.strip() == "yes"
    assert can("list", "pods", "-A") and can("patch", "nodes") and can("patch", "pods", "-n", "team-a")
    assert not can("get", "secrets", "-n", NS) and not can("delete", "pods", "-n", "team-a")
    assert not can("watch", "pods", "-A") and not can("update", "nodes", "--subresource=status")


def test_a_device_plugin_whose_token_names_its_node_writes_only_that_node(policy_k8s: LocalK8s) -> None:
    """From Kubernetes 1.30 a pod's service account token says which node the pod runs on (the
    user's extra ``authentication.kubernetes.io/node-name``): the device plugin of one node may then
    write neither another node's inventory nor the record of a pod bound elsewhere. v1.28 tokens do
    not carry it, so the request comes as the API server would see such a token: the admin
    impersonates the account with that extra (real authentication, RBAC and admission)."""
    import kubernetes
    mine, other = (f"dp-{w}-{uuid.uuid4().hex[:6]}" for w in ("mine", "other"))
    for node in (mine, other):
        fake_gpu_node(policy_k8s, node, [Card(index=0, uuid="GPU-0", model="NVIDIA A100-SXM4-80GB", memory_mib=81920)])
    client = policy_k8s.api_client()
    client.set_default_header("Impersonate-User", f"system:serviceaccount:{NS}:stowage-device-plugin")
    client.set_default_header("Impersonate-Extra-authentication.kubernetes.io%2Fnode-name", mine)
    core = kubernetes.client.CoreV1Api(client)

    def refusal(call, *args) -> str:
        try:
            call(*args, _content_type="application/merge-patch+json")
            return ""
        except kubernetes.client.ApiException as exc:
            assert exc.status in (403, 422), exc
            return str(exc.body)
    inv = {"metadata": {"annotations": {INVENTORY: '{"version":1,"cards":[]}'}}}
    assert refusal(core.patch_node, mine, inv) == ""
    assert "only its own node" in refusal(core.patch_node, other, inv)
    on_mine, on_other = f"m-{uuid.uuid4().hex[:6]}", f"o-{uuid.uuid4().hex[:6]}"
    _ok(policy_k8s.kubectl("create", "-n", "team-a", "-f", "-", input=_pod(on_mine, node=mine), check=False))
    _ok(policy_k8s.kubectl("create", "-n", "team-a", "-f", "-", input=_pod(on_other, node=other), check=False))
    assert refusal(core.patch_namespaced_pod, on_mine, "team-a",
                   {"metadata": {"annotations": {ALLOC: RECORD % mine}}}) == ""
    assert "only its own node" in refusal(core.patch_namespaced_pod, on_other, "team-a",
                                          {"metadata": {"annotations": {ALLOC: RECORD % other}}})
    # The account itself is unchanged: a token without the extra (v1.28's) still writes any node.
    client.default_headers.pop("Impersonate-Extra-authentication.kubernetes.io%2Fnode-name")
    assert refusal(core.patch_node, other, inv) == ""


def test_exporter_and_kube_scheduler_accounts_hold_no_stowage_writes(policy_k8s: LocalK8s) -> None:
    exporter = As(policy_k8s, "stowage-exporter", NS)
    assert exporter.kubectl("auth", "can-i", "get", "nodes").stdout.strip() == "no"
    sched = As(policy_k8s, "stowage-scheduler", NS)
    # kube-scheduler's account (the pod's) cannot write allocation records: it has no pods patch.
    assert sched.kubectl("auth", "can-i", "patch", "pods", "-n", "team-a").stdout.strip() == "no"
    assert sched.kubectl("auth", "can-i", "create", "pods", "--subresource=binding", "-n", "team-a").stdout.strip() == "yes"


def test_only_the_extender_may_bind_with_a_record(policy_k8s: LocalK8s, tmp_path: Path) -> None:
    """The API server copies a Binding's annotations onto the pod (that is how the extender
    records and binds in one write), so a Binding carrying stowage.io/allocation is a record
    write: refused from anyone but the extender, e.g. kube-scheduler's own account, which may
    create bindings. A plain Binding from it is still fine (kube-scheduler binds pods that way)."""
    import kubernetes
    node = f"bind-node-{uuid.uuid4().hex[:6]}"
    fake_gpu_node(policy_k8s, node, [Card(index=0, uuid="GPU-0", model="NVIDIA A100-SXM4-80GB", memory_mib=81920)])

    def bind(who: As, pod: str, record: str | None) -> str:
        uid = json.loads(policy_k8s.kubectl("get", "pod", pod, "-n", "team-a", "-o", "json").stdout)["metadata"]["uid"]
        body = kubernetes.client.V1Binding(
            metadata=kubernetes.client.V1ObjectMeta(name=pod, uid=uid, annotations={ALLOC: record} if record else None),
            target=kubernetes.client.V1ObjectReference(api_version="v1", kind="Node", name=node))
        try:
            who.core(tmp_path).create_namespaced_pod_binding(pod, "team-a", body, _preload_content=False)
            return ""
        except kubernetes.client.ApiException as exc:
            assert exc.status in (403, 422), exc
            return str(exc.body)

    sched, extender = As(policy_k8s, "stowage-scheduler", NS), As(policy_k8s, "stowage-extender", NS)
    forged, plain, ours = (f"{w}-{uuid.uuid4().hex[:6]}" for w in ("forged", "plain", "ours"))
    for name in (forged, plain, ours):
        _ok(policy_k8s.kubectl("create", "-n", "team-a", "-f", "-", input=_pod(name), check=False))
    assert "only the Stowage extender may bind a pod with" in bind(sched, forged, RECORD % node)
    got = json.loads(policy_k8s.kubectl("get", "pod", forged, "-n", "team-a", "-o", "json").stdout)
    assert not got["spec"].get("nodeName") and ALLOC not in (got["metadata"].get("annotations") or {})
    assert bind(sched, plain, None) == ""
    assert bind(extender, ours, RECORD % node) == ""
    got = json.loads(policy_k8s.kubectl("get", "pod", ours, "-n", "team-a", "-o", "json").stdout)
    assert got["spec"]["nodeName"] == node and got["metadata"]["annotations"][ALLOC] == RECORD % node


def test_server_side_dry_run_of_the_manifests(policy_k8s: LocalK8s) -> None:
    r = policy_k8s.kubectl("apply", "--dry-run=server", "-k", str(REPO / "scheduler-config"))
    assert "validatingadmissionpolicy.admissionregistration.k8s.io/stowage-allocation-record" in r.stdout


def test_the_extender_schedules_under_its_own_account(policy_k8s: LocalK8s, tmp_path: Path) -> None:
    """kube-scheduler + the extender running as stowage-extender: RBAC and the policies let it do
    its whole job (list/watch, record, bind)."""
    extender = As(policy_k8s, "stowage-extender", NS)
    node = f"gpu-{uuid.uuid4().hex[:6]}"
    fake_gpu_node(policy_k8s, node, [Card(index=i, uuid=f"GPU-{node}-{i}", model="NVIDIA A100-SXM4-80GB",
                                        memory_mib=81920) for i in range(2)])
    kcfg = extender.kubeconfig(tmp_path / "extender.kubeconfig")
    proc = _ExtenderAs(policy_k8s, kcfg, name="extender-rbac")
    proc.start()
    try:
        policy_k8s.start_scheduler(scheduler_config_for_test(proc.url), name="kube-scheduler-rbac")
        name = f"s-{uuid.uuid4().hex[:6]}"
        _ok(policy_k8s.kubectl("create", "-n", "team-a", "-f", "-", input=_pod(name, scheduler="stowage-scheduler"),
                             check=False))
        pod = wait_until(lambda: (p := policy_k8s.core.read_namespaced_pod(name, "team-a")).spec.node_name and p, 60,
                         f"{name} bound through the extender running as stowage-extender")
        assert pod.spec.node_name == node and f'"node":"{node}"' in pod.metadata.annotations[ALLOC]
    finally:
        proc.stop()
        if policy_k8s.scheduler is not None:
            policy_k8s.scheduler.stop()
            policy_k8s.scheduler = None


def test_the_extender_keeps_what_it_learned_from_deleted_pods_across_a_restart(policy_k8s: LocalK8s,
                                                                               tmp_path: Path) -> None:
    """The departed pods' past (extender/learned_store.py) under the shipped RBAC, in the shipped
    layout (--workers 2): the extender, as stowage-extender, learns pods of Stowage's scheduler
    from its watch; they are deleted; at SIGTERM it writes their shapes to its ConfigMap (the
    interval is an hour here: the write at shutdown is the one tested), and the next extender
    learns them before its first list: the same learned workload as before the restart. Without
    the ConfigMap (``off``), a restart learns only the pods that still exist. The account may
    read no other ConfigMap."""
    from extender.learned_past import DepartedPods
    from extender.learned_store import DATA_KEY, DEFAULT_NAME
    from stowage.resources import GpuRequest

    extender = As(policy_k8s, "stowage-extender", NS)
    kcfg = extender.kubeconfig(tmp_path / "extender.kubeconfig")
    tag = uuid.uuid4().hex[:6]

    def pod(name: str, gpus: int) -> str:
        limits = {"cpu": "1234m", "memory": "77Mi", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
        return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                           "spec": {"schedulerName": "stowage-scheduler",   # no kube-scheduler runs: they wait
                                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9",
                                                    "resources": {"limits": limits}}]}})

    def learned(proc: ExtenderProc) -> dict:
        return proc.state()["learned"]

    args = ("--workers", "2", "--learned-interval", "3600")
    first = _ExtenderAs(policy_k8s, kcfg, name="extender-past-1", args=args).start()
    try:
        start = learned(first)
        names = [f"past-{tag}-{i}" for i in range(5)]
        for i, name in enumerate(names):
            _ok(policy_k8s.kubectl("create", "-n", "team-a", "-f", "-", input=pod(name, gpus=1 if i < 3 else 0),
                                   check=False))
        wait_until(lambda: learned(first)["pods"] == start["pods"] + 5, 30, "the extender to learn the 5 pods")
        for name in names:
            _ok(policy_k8s.kubectl("delete", "pod", "-n", "team-a", name, "--wait=false", check=False))
        wait_until(lambda: learned(first)["departedPods"] == start["departedPods"] + 5, 30,
                   "the extender to see the 5 pods deleted")
        before = learned(first)
    finally:
        first.stop()                                   # SIGTERM: the last write
    cm = policy_k8s.core.read_namespaced_config_map(DEFAULT_NAME, NS)
    past = DepartedPods.from_json(cm.data[DATA_KEY])
    assert past.counts[(GpuRequest(gpus=1, cpu_milli=1234, host_mem_mib=77.0), ())] >= 3
    assert past.counts[(GpuRequest(cpu_milli=1234, host_mem_mib=77.0), ())] >= 2
    assert past.pods == before["departedPods"]

    second = _ExtenderAs(policy_k8s, kcfg, name="extender-past-2", args=args).start()
    try:
        after = learned(second)
    finally:
        second.stop()
    assert after == before, "a restart must hold what the running extender had learned"
    blind = _ExtenderAs(policy_k8s, kcfg, name="extender-past-off", args=("--learned-configmap", "off")).start()
    try:
        off = learned(blind)
    finally:
        blind.stop()
    assert off["pods"] == before["pods"] - before["departedPods"] and off["workload"] != before["workload"]
    _denied(extender.kubectl("get", "configmaps", "-n", NS), "Forbidden")
    _denied(extender.kubectl("get", "configmap", "-n", "kube-system", "extension-apiserver-authentication"),
            "Forbidden")


def test_two_replicas_writing_the_past_never_count_a_pod_twice(policy_k8s: LocalK8s, tmp_path: Path) -> None:
    """The HA pair: two extenders (both as stowage-extender, writing every second) see the same
    pods come and go and both write the ConfigMap; the real API server's resourceVersion
    precondition and the per-shape merge leave each deleted pod counted once."""
    from extender.learned_past import DepartedPods
    from extender.learned_store import DATA_KEY, DEFAULT_NAME
    from stowage.resources import GpuRequest

    extender = As(policy_k8s, "stowage-extender", NS)
    kcfg = extender.kubeconfig(tmp_path / "extender.kubeconfig")
    tag = uuid.uuid4().hex[:6]
    shape = (GpuRequest(gpus=2, cpu_milli=4321, host_mem_mib=99.0), ())

    def stored() -> DepartedPods:
        try:
            cm = policy_k8s.core.read_namespaced_config_map(DEFAULT_NAME, NS)
        except Exception:  # noqa: BLE001 (not written yet)
            return DepartedPods()
        return DepartedPods.from_json(cm.data[DATA_KEY])

    before = stored().counts.get(shape, 0)
    args = ("--learned-interval", "1")
    pair = [_ExtenderAs(policy_k8s, kcfg, name=f"extender-ha-{i}", args=args).start() for i in range(2)]
    try:
        names = [f"ha-{tag}-{i}" for i in range(4)]
        for name in names:
            body = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                               "spec": {"schedulerName": "stowage-scheduler",
                                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9",
                                                        "resources": {"limits": {"cpu": "4321m", "memory": "99Mi",
                                                                                 "nvidia.com/gpu": "2"}}}]}})
            _ok(policy_k8s.kubectl("create", "-n", "team-a", "-f", "-", input=body, check=False))
        wait_until(lambda: all(p.state()["learned"]["pods"] >= 4 for p in pair), 30, "both to learn the pods")
        for name in names:
            _ok(policy_k8s.kubectl("delete", "pod", "-n", "team-a", name, "--wait=false", check=False))
        wait_until(lambda: all(p.state()["learned"]["departedPods"] >= 4 for p in pair), 30, "both to see the deletes")
        wait_until(lambda: stored().counts.get(shape, 0) >= before + 4, 30, "the ConfigMap to count the 4 pods")
    finally:
        for proc in pair:
            proc.stop()                    # both write once more at SIGTERM
    assert stored().counts.get(shape, 0) == before + 4


class _ExtenderAs(ExtenderProc):
    """The extender with another kubeconfig than the admin's."""

    def __init__(self, k8s: LocalK8s, kubeconfig: Path, name: str, args: tuple[str, ...] = ()) -> None:
        super().__init__(k8s, name=name, args=args)
        self._kubeconfig = kubeconfig

    def start(self, wait_ready: bool = True) -> "ExtenderProc":
        real = self.k8s
        shim = _KubeconfigShim(real, self._kubeconfig)
        self.k8s = shim  # type: ignore[assignment]
        try:
            return super().start(wait_ready)
        finally:
            self.k8s = real


class _KubeconfigShim:
    def __init__(self, k8s: LocalK8s, kubeconfig: Path) -> None:
        self._k8s, self.kubeconfig = k8s, kubeconfig

    def __getattr__(self, name: str):
        return getattr(self._k8s, name)
