"""The install (scheduler-config/): kustomization, RBAC, scheduler + extender wiring, exporter, image.

These check what a field-by-field schema cannot: that the pieces agree with each other and with
the code they run (the extender's real routes, the real `stowage` CLI options, the resource names
in stowage/resources.py).
"""
from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from manifest_validation import Doc, load_docs, load_text_docs, validate
from extender.learned_store import DEFAULT_NAME as DEFAULT_PAST_NAME

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "scheduler-config"
NAMESPACE = "stowage-system"


def docs(rel: str) -> list[Doc]:
    return load_docs(CONFIG / rel)


def one(rel: str, kind: str, name: str | None = None) -> dict:
    found = [d.body for d in docs(rel) if d.kind == kind and (name is None or d.name == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''} in {rel}, found {len(found)}"
    return found[0]


def kustomization() -> dict:
    return one("kustomization.yaml", "Kustomization")


def installed_docs() -> list[Doc]:
    """The objects `kubectl apply -k scheduler-config/` creates, read from the listed files."""
    return [d for rel in kustomization()["resources"] for d in docs(rel)]


def scheduler_config() -> dict:
    return one("scheduler-config.yaml", "KubeSchedulerConfiguration")


def scheduler_deployment() -> dict:
    return one("scheduler.yaml", "Deployment", "stowage-scheduler")


def container(pod_spec: dict, name: str) -> dict:
    (c,) = [c for c in pod_spec["containers"] if c["name"] == name]
    return c


# ------------------------------------------------------------------------------ kustomize


def test_kustomization_lists_the_device_plugin():
    assert "device-plugin.yaml" in kustomization()["resources"]


def test_kustomization_lists_only_existing_files_and_every_install_file():
    k = kustomization()
    for rel in k["resources"]:
        assert (CONFIG / rel).is_file(), f"kustomization.yaml lists {rel}, which does not exist"
    for gen in k.get("configMapGenerator", []):
        for f in gen.get("files", []):
            assert (CONFIG / f.split("=")[-1]).is_file(), f"configMapGenerator file {f} does not exist"
    # Each top-level manifest of Kubernetes objects is part of the install (a forgotten file would
    # silently not be applied); the config file is included through the generator instead.
    top = {p.name for p in CONFIG.glob("*.yaml")} - {"kustomization.yaml", "scheduler-config.yaml"}
    assert top <= set(k["resources"]), f"not in kustomization.yaml: {sorted(top - set(k['resources']))}"


def _kustomize_cmd() -> list[str] | None:
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    return None


@pytest.mark.skipif(_kustomize_cmd() is None, reason="neither kubectl nor kustomize is installed")
def test_kustomize_build_renders_valid_objects_with_the_generated_config():
    out = subprocess.run([*_kustomize_cmd(), str(CONFIG)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rendered = load_text_docs(out.stdout, "kustomize-build")
    problems = [e for d in rendered for e in validate(d)]
    assert not problems, "\n".join(problems)
    (cm,) = [d.body for d in rendered if d.kind == "ConfigMap" and d.name.startswith("stowage-scheduler-config-")]
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert cm["data"]["scheduler-config.yaml"] == (CONFIG / "scheduler-config.yaml").read_text()
    (dep,) = [d.body for d in rendered if d.kind == "Deployment" and d.name == "stowage-scheduler"]
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["scheduler-config"]["configMap"]["name"] == cm["metadata"]["name"], "hash suffix not propagated"
    kinds = {d.kind for d in rendered}
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
            "Deployment", "DaemonSet", "Service", "ConfigMap"} <= kinds


def test_everything_but_one_rolebinding_lives_in_our_namespace():
    for d in installed_docs():
        if d.kind in ("Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding"):
            assert "namespace" not in d.body["metadata"], f"{d.where}: cluster-scoped object with a namespace"
            continue
        ns = d.body["metadata"].get("namespace")
        if d.kind == "RoleBinding" and d.body["roleRef"]["name"] == "extension-apiserver-authentication-reader":
            assert ns == "kube-system"
        else:
            assert ns == NAMESPACE, f"{d.where} {d.kind}/{d.name} is in namespace {ns!r}"


# ---------------------------------------------------------------------------------- RBAC

KNOWN_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
KNOWN_RESOURCES = {  # group -> resources (and subresources) of the Kubernetes API that we may refer to
    "": {"pods", "pods/binding", "pods/status", "pods/eviction", "pods/log", "nodes", "nodes/status",
         "events", "configmaps", "secrets", "services", "endpoints", "namespaces", "serviceaccounts",
         "persistentvolumes", "persistentvolumeclaims"},
    "events.k8s.io": {"events"},
    "coordination.k8s.io": {"leases"},
    "apps": {"deployments", "daemonsets", "replicasets", "statefulsets"},
    "storage.k8s.io": {"csinodes", "csidrivers", "storageclasses"},
}
BUILTIN_CLUSTER_ROLES = {"system:kube-scheduler", "system:volume-scheduler"}
BUILTIN_ROLES = {("kube-system", "extension-apiserver-authentication-reader")}


def rbac_docs() -> list[Doc]:
    return [d for d in installed_docs() if d.kind in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding",
                                                       "ServiceAccount")]


def test_rbac_names_only_real_verbs_and_resources_and_no_wildcards():
    roles = [d for d in rbac_docs() if d.kind in ("Role", "ClusterRole")]
    assert roles
    for d in roles:
        for i, rule in enumerate(d.body["rules"]):
            where = f"{d.kind}/{d.name} rule {i}"
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), f"{where}: wildcard in {field}"
            assert set(rule["verbs"]) <= KNOWN_VERBS, f"{where}: unknown verbs {set(rule['verbs']) - KNOWN_VERBS}"
            for group in rule["apiGroups"]:
                assert group in KNOWN_RESOURCES, f"{where}: unknown API group {group!r}"
                unknown = set(rule["resources"]) - KNOWN_RESOURCES[group]
                assert not unknown, f"{where}: {unknown} are not resources of group {group!r}"
            if rule.get("resourceNames"):
                # RBAC cannot restrict create/list/watch/deletecollection by name: such a rule grants nothing.
                assert not set(rule["verbs"]) & {"create", "list", "watch", "deletecollection"}, where


def test_bindings_point_at_existing_roles_and_service_accounts():
    ds = rbac_docs()
    cluster_roles = {d.name for d in ds if d.kind == "ClusterRole"} | BUILTIN_CLUSTER_ROLES
    roles = {(d.body["metadata"]["namespace"], d.name) for d in ds if d.kind == "Role"} | BUILTIN_ROLES
    accounts = {(d.body["metadata"]["namespace"], d.name) for d in ds if d.kind == "ServiceAccount"}
    for d in ds:
        if d.kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = d.body["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        if ref["kind"] == "ClusterRole":
            assert ref["name"] in cluster_roles, f"{d.name}: no ClusterRole {ref['name']}"
        else:
            assert d.kind == "RoleBinding", f"{d.name}: a ClusterRoleBinding cannot bind a Role"
            assert (d.body["metadata"]["namespace"], ref["name"]) in roles, f"{d.name}: no Role {ref['name']} there"
        for s in d.body["subjects"]:
            assert s["kind"] == "ServiceAccount"
            assert (s["namespace"], s["name"]) in accounts, f"{d.name}: no ServiceAccount {s['namespace']}/{s['name']}"


def _grants(sa: str) -> dict[tuple[str, str], set[str]]:
    """(group, resource) -> verbs that OUR roles give the service account (built-in roles excluded)."""
    ds = rbac_docs()
    roles = {(d.kind, d.name): d.body for d in ds if d.kind in ("Role", "ClusterRole")}
    out: dict[tuple[str, str], set[str]] = {}
    for d in ds:
        if d.kind in ("RoleBinding", "ClusterRoleBinding") and any(s["name"] == sa for s in d.body["subjects"]):
            role = roles.get((d.body["roleRef"]["kind"], d.body["roleRef"]["name"]))
            for rule in (role or {}).get("rules", []):
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        out.setdefault((g, r), set()).update(rule["verbs"])
    return out


def test_extender_role_is_exactly_what_the_extender_does():
    role = one("rbac.yaml", "ClusterRole", "stowage-extender")
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                granted.setdefault((g, r), set()).update(rule["verbs"])
    assert granted == {
        ("", "nodes"): {"get", "list", "watch"},              # inventory annotation, GFD labels, allocatable
        ("", "pods"): {"get", "list", "watch", "patch"},      # allocations; record the card choice at bind
        ("", "pods/binding"): {"create"},                     # the Binding itself
    }
    # ...held by the extender's own account, not by kube-scheduler's (the pod's): issue 12 item 7.
    # Plus, in its own namespace only, the one ConfigMap that keeps the departed pods' past
    # (get/update by name; create cannot be limited by name).
    past = one("rbac.yaml", "Role", "stowage-extender-learned-past")
    assert past["metadata"]["namespace"] == "stowage-system"
    assert sorted((r["verbs"], r.get("resourceNames")) for r in past["rules"]) == [
        (["create"], None), (["get", "update"], [DEFAULT_PAST_NAME])]
    assert all(r["apiGroups"] == [""] and r["resources"] == ["configmaps"] for r in past["rules"])
    assert _grants("stowage-extender") == {**granted, ("", "configmaps"): {"create", "get", "update"}}
    assert ("", "pods") not in _grants("stowage-scheduler")
    assert ("", "configmaps") not in _grants("stowage-scheduler")
    # The name the extender writes by default is the one granted, in the namespace it runs in.
    env = {e["name"]: e for e in next(c for c in scheduler_deployment()["spec"]["template"]["spec"]["containers"]
                                      if c["name"] == "extender")["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_exporter_holds_no_grants_and_no_token():
    assert _grants("stowage-exporter") == {}
    assert one("rbac.yaml", "ServiceAccount", "stowage-exporter")["automountServiceAccountToken"] is False
    pod = one("exporter.yaml", "DaemonSet", "stowage-exporter")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False


def test_device_plugin_role_is_what_it_calls():
    assert _grants("stowage-device-plugin") == {("", "nodes"): {"patch"}, ("", "pods"): {"list", "patch"}}


def test_each_scheduler_pod_container_holds_only_its_own_account():
    pod = scheduler_deployment()["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "stowage-scheduler" and pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {c["name"]: {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])} for c in pod["containers"]}
    path = "/var/run/secrets/kubernetes.io/serviceaccount"
    sched_vol = volumes[mounts["kube-scheduler"][path]]
    assert any("serviceAccountToken" in src for src in sched_vol["projected"]["sources"])
    ext_vol = volumes[mounts["extender"][path]]
    secret = one("rbac.yaml", "Secret", ext_vol["secret"]["secretName"])
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == "stowage-extender"


def test_leader_election_lease_is_granted_where_the_config_puts_it():
    le = scheduler_config()["leaderElection"]
    assert le["leaderElect"] is True and le["resourceLock"] == "leases"
    assert le["resourceNamespace"] == NAMESPACE
    role = one("rbac.yaml", "Role", "stowage-scheduler-leader-election")
    assert role["metadata"]["namespace"] == le["resourceNamespace"]
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert any(le["resourceName"] in r["resourceNames"] and {"get", "update"} <= set(r["verbs"])
               and r["resources"] == ["leases"] for r in named)
    assert any(r["verbs"] == ["create"] and r["resources"] == ["leases"] for r in role["rules"])
    assert _grants("stowage-scheduler")[("coordination.k8s.io", "leases")] == {"create", "get", "update"}
    # HA only makes sense with leader election, and leader election only with more than one replica.
    assert scheduler_deployment()["spec"]["replicas"] >= 2


def test_scheduler_service_account_gets_the_builtin_scheduler_roles():
    bound = {d.body["roleRef"]["name"] for d in rbac_docs()
             if d.kind in ("RoleBinding", "ClusterRoleBinding")
             and any(s["name"] == "stowage-scheduler" for s in d.body["subjects"])}
    assert {"system:kube-scheduler", "system:volume-scheduler",
            "extension-apiserver-authentication-reader"} <= bound and "stowage-extender" not in bound


def test_pods_run_under_service_accounts_that_exist():
    accounts = {d.name for d in rbac_docs() if d.kind == "ServiceAccount"}
    for d in installed_docs():
        if d.kind in ("Deployment", "DaemonSet"):
            sa = d.body["spec"]["template"]["spec"].get("serviceAccountName")
            assert sa in accounts, f"{d.kind}/{d.name} runs as {sa!r}"


# ------------------------------------------------------------- scheduler <-> extender


def extender_entry() -> dict:
    (ext,) = scheduler_config()["extenders"]
    return ext


def test_profile_and_extender_settings_are_the_documented_choices():
    cfg = scheduler_config()
    (profile,) = cfg["profiles"]
    assert profile["schedulerName"] == "stowage-scheduler"
    ext = extender_entry()
    assert (ext["filterVerb"], ext["bindVerb"]) == ("filter", "bind")
    # Filter answers only the best nodes (the extender's --filter-keeps best, its default): a
    # prioritize call would score nodes all equal to Stowage, one round trip per pod for nothing.
    assert "prioritizeVerb" not in ext and "weight" not in ext
    cmd = container(scheduler_deployment()["spec"]["template"]["spec"], "extender")["command"]
    assert "--filter-keeps" not in cmd or cmd[cmd.index("--filter-keeps") + 1] == "best"
    assert ext["nodeCacheCapable"] is True      # only NodeNames on the wire: scales to 5,000 nodes
    assert ext["ignorable"] is False            # never place GPU pods without a card choice
    assert ext["enableHTTPS"] is False          # loopback sidecar
    assert ext["preemptVerb"] == "preempt"    # card-aware victims (docs/extender.md)
    # No managedResources: kube-scheduler then sends every pod of the profile, CPU-only ones too
    # (they must not strand GPUs; see the comments in scheduler-config.yaml), and counts the GPU
    # resources itself (none is ignoredByScheduler).
    assert "managedResources" not in ext


def test_http_timeout_is_seconds_not_minutes():
    t = extender_entry()["httpTimeout"]
    assert t.endswith("s") and not t.endswith("ms")
    assert 1 <= float(t[:-1]) <= 10


def test_extender_sidecar_listens_where_the_scheduler_calls_it():
    url = urlsplit(extender_entry()["urlPrefix"])
    assert url.scheme == "http" and url.hostname == "127.0.0.1"
    spec = scheduler_deployment()["spec"]["template"]["spec"]
    cmd = container(spec, "extender")["command"]
    assert cmd[:2] == ["stowage", "extender"] and "--in-cluster" in cmd
    assert cmd[cmd.index("--bind") + 1] == f"{url.hostname}:{url.port}"
    # The verbs' port is not exposed: nothing outside the pod is meant to reach /bind. The one
    # container port is the metrics-only listener.
    (port,) = container(spec, "extender")["ports"]
    host, mport = cmd[cmd.index("--metrics-bind") + 1].rsplit(":", 1)
    assert (port["name"], port["containerPort"]) == ("metrics", int(mport)) and host == "0.0.0.0"
    assert int(mport) != url.port
    # The command is one the real CLI accepts; the split layout gets a core to use.
    from extender.cli import serve
    ctx = serve.make_context("extender", list(cmd[2:]))
    if ctx.params["workers"] > 1:
        cpu = str(container(spec, "extender")["resources"]["requests"]["cpu"])
        assert (float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)) >= 1


def test_service_and_servicemonitor_reach_the_extender_metrics():
    dep = scheduler_deployment()
    svc = one("scheduler.yaml", "Service", "stowage-scheduler-metrics")
    sm = one("monitoring/servicemonitor.yaml", "ServiceMonitor", "stowage-extender")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["clusterIP"] == "None"  # every replica, not a load-balanced one
    (sp,) = svc["spec"]["ports"]
    (cp,) = container(dep["spec"]["template"]["spec"], "extender")["ports"]
    assert sp["targetPort"] == cp["name"] and sp["port"] == cp["containerPort"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # ... and no other Service of ours (e.g. the exporter's) matches it
    others = [d for rel in ("exporter.yaml", "device-plugin.yaml", "scheduler.yaml") for d in docs(rel)
              if d.kind == "Service" and d.name != "stowage-scheduler-metrics"]
    assert not any(sm["spec"]["selector"]["matchLabels"].items() <= d.body["metadata"].get("labels", {}).items()
                   for d in others)
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] == sp["name"] and ep["path"] == "/metrics"


def test_scheduler_reads_the_config_file_we_ship():
    spec = scheduler_deployment()["spec"]["template"]["spec"]
    ks = container(spec, "kube-scheduler")
    assert ks["image"].startswith("registry.k8s.io/kube-scheduler:v1.28.")
    (config_arg,) = [a for a in ks["command"] if a.startswith("--config=")]
    (mount,) = [m for m in ks["volumeMounts"] if m["name"] == "scheduler-config"]
    (gen,) = kustomization()["configMapGenerator"]
    assert gen["files"] == ["scheduler-config.yaml"] and gen["namespace"] == NAMESPACE
    assert config_arg == f"--config={mount['mountPath']}/scheduler-config.yaml"
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["scheduler-config"]["configMap"]["name"] == gen["name"]


def test_extender_probes_hit_healthz_and_readyz_inside_the_pod():
    ext = container(scheduler_deployment()["spec"]["template"]["spec"], "extender")
    port = urlsplit(extender_entry()["urlPrefix"]).port
    assert f"127.0.0.1:{port}/healthz" in " ".join(ext["livenessProbe"]["exec"]["command"])
    assert f"127.0.0.1:{port}/readyz" in " ".join(ext["readinessProbe"]["exec"]["command"])


def _extender_app(url_prefix: str):
    app_mod = pytest.importorskip("extender.app", reason="extender/app.py not present")
    from packing.model import ClusterModel
    from extender.service import ExtenderService
    return app_mod.create_app(ExtenderService(ClusterModel()), url_prefix=url_prefix)


def test_scheduler_config_urls_are_the_extender_routes(wire):
    """kube-scheduler POSTs to urlPrefix + "/" + verb; the real app must answer there, in the wire
    format that nodeCacheCapable selects (node-cache bodies: NodeNames, no Nodes)."""
    ext = extender_entry()
    app = _extender_app(urlsplit(ext["urlPrefix"]).path)
    routes = {(r.rule, m) for r in app.url_map.iter_rules() for m in r.methods}
    base = urlsplit(ext["urlPrefix"]).path.rstrip("/")
    for verb in (ext["filterVerb"], ext.get("prioritizeVerb", "prioritize"), ext["bindVerb"]):
        assert (f"{base}/{verb}", "POST") in routes
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (path, "GET") in routes
    mode = "node-cache" if ext["nodeCacheCapable"] else "full-nodes"
    client = app.test_client()
    filt = client.post(f"{base}/{ext['filterVerb']}", json=wire(mode, "01-filter"))
    assert filt.status_code == 200
    answer = filt.get_json()
    # Nodes the (empty) model does not know are failed with a reason, never an error.
    assert not answer.get("Error") and set(answer["FailedNodes"]) == {"node-a", "node-b", "node-c"}
    # prioritize is still served (for a config with --filter-keeps fitting and prioritizeVerb)
    prio = client.post(f"{base}/{ext.get('prioritizeVerb', 'prioritize')}", json=wire(mode, "02-prioritize"))
    assert prio.status_code == 200 and isinstance(prio.get_json(), list)
    bind = client.post(f"{base}/{ext['bindVerb']}", json=wire(mode, "03-bind"))
    assert bind.status_code == 200 and "Error" in bind.get_json()


def _stowage_containers() -> list[tuple[str, dict]]:
    out = []
    for d in installed_docs():
        if d.kind in ("Deployment", "DaemonSet"):
            for c in d.body["spec"]["template"]["spec"]["containers"]:
                cmd = c.get("command") or []
                if cmd[:1] == ["stowage"]:
                    out.append((f"{d.kind}/{d.name}/{c['name']}", c))
    return out


@pytest.mark.parametrize("where,c", _stowage_containers(), ids=[w for w, _ in _stowage_containers()])
def test_stowage_command_lines_parse_with_the_real_cli(where: str, c: dict):
    import importlib

    from stowage.cli import SUBCOMMANDS

    cmd = c["command"] + c.get("args", [])
    assert cmd[1] in SUBCOMMANDS, f"{where}: `stowage {cmd[1]}` is not a subcommand"
    module, attr = SUBCOMMANDS[cmd[1]][0].split(":")
    try:
        command = getattr(importlib.import_module(module), attr)
    except ImportError as exc:
        pytest.skip(f"{module} not present yet: {exc}")
    # Parses options exactly as at container start, without running the command.
    command.make_context(cmd[1], list(cmd[2:]))


@pytest.mark.parametrize("where,c", _stowage_containers(), ids=[w for w, _ in _stowage_containers()])
def test_every_stowage_env_var_a_container_sets_is_read_by_its_command(where: str, c: dict):
    """An env entry the command does not read configures nothing, silently (a renamed or dropped
    envvar would turn a shipped setting off): each STOWAGE_* / NODE_NAME entry must be some option's
    envvar, and the command must parse with the manifest's plain values set."""
    import importlib

    from stowage.cli import SUBCOMMANDS

    cmd = c["command"] + c.get("args", [])
    module, attr = SUBCOMMANDS[cmd[1]][0].split(":")
    command = getattr(importlib.import_module(module), attr)
    read: set[str] = set()
    for p in command.params:
        read.update([p.envvar] if isinstance(p.envvar, str) else (p.envvar or []))
    ours = {e["name"]: e.get("value") for e in c.get("env") or []
            if e["name"].startswith("STOWAGE_") or e["name"] == "NODE_NAME"}
    assert set(ours) <= read, f"{where}: env {sorted(set(ours) - read)} is read by no option of `stowage {cmd[1]}`"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in ours.items():
            mp.setenv(name, value if value is not None else "node-from-the-downward-api")
        command.make_context(cmd[1], list(cmd[2:]))


def test_stowage_images_are_the_one_kustomize_rewrites():
    (img,) = kustomization()["images"]
    for where, c in _stowage_containers():
        assert c["image"].split(":")[0] == img["name"], where


# ------------------------------------------------------------------------------ exporter


def test_exporter_daemonset_matches_the_metrics_contract():
    ds = one("exporter.yaml", "DaemonSet", "stowage-exporter")
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["command"] == ["stowage", "exporter"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    (port,) = c["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", 9400)
    vols = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    pr = [n for n, v in vols.items() if v.get("hostPath", {}).get("path") == "/var/lib/kubelet/pod-resources"]
    assert len(pr) == 1 and mounts[pr[0]]["mountPath"] == "/var/lib/kubelet/pod-resources"
    assert spec["hostPID"] is True  # per-process attribution of shared cards
    caps = c["securityContext"]["capabilities"]["drop"]
    assert caps == ["ALL"] and c["securityContext"]["allowPrivilegeEscalation"] is False
    contract = (ROOT / "docs" / "metrics-contract.md").read_text()
    assert "`:9400`" in contract and "`NODE_NAME`" in contract and "/var/lib/kubelet/pod-resources/kubelet.sock" in contract


def test_service_and_servicemonitor_reach_the_exporter_pods():
    ds = one("exporter.yaml", "DaemonSet", "stowage-exporter")
    svc = one("exporter.yaml", "Service", "stowage-exporter")
    sm = one("monitoring/servicemonitor.yaml", "ServiceMonitor", "stowage-exporter")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["clusterIP"] == "None"
    (sp,) = svc["spec"]["ports"]
    assert (sp["port"], sp["targetPort"]) == (9400, "metrics")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert svc["metadata"]["namespace"] in sm["spec"]["namespaceSelector"]["matchNames"]
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] == sp["name"] and ep["path"] == "/metrics"
    # The exporter's pod/namespace labels name the GPU workload: Prometheus must keep them.
    assert ep["honorLabels"] is True


def test_service_and_servicemonitor_reach_the_device_plugins_metrics():
    """The plugin's record-reconciler metrics are on in the shipped DaemonSet (the alerts of
    monitoring/prometheusrule.yaml read them): the env the CLI reads, the container port, the
    headless Service and the ServiceMonitor agree, and the ServiceMonitor matches no other Service."""
    ds = one("device-plugin.yaml", "DaemonSet", "stowage-device-plugin")
    svc = one("device-plugin.yaml", "Service", "stowage-device-plugin")
    sm = one("monitoring/servicemonitor.yaml", "ServiceMonitor", "stowage-device-plugin")
    spec = ds["spec"]["template"]["spec"]
    c = container(spec, "device-plugin")
    env = {e["name"]: e.get("value") for e in c["env"]}
    (cp,) = c["ports"]
    assert (cp["name"], cp["containerPort"]) == ("metrics", int(env["STOWAGE_METRICS_PORT"]))
    assert not spec.get("hostNetwork")     # the pod's own IP: no port to collide with on the node
    from deviceplugin.cli import main as plugin_main
    assert any(getattr(o, "envvar", None) == "STOWAGE_METRICS_PORT" for o in plugin_main.params)
    assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["clusterIP"] == "None"
    (sp,) = svc["spec"]["ports"]
    assert sp["targetPort"] == cp["name"] and sp["port"] == cp["containerPort"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert svc["metadata"]["namespace"] in sm["spec"]["namespaceSelector"]["matchNames"]
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] == sp["name"] and ep["path"] == "/metrics"
    others = [d for rel in ("exporter.yaml", "device-plugin.yaml", "scheduler.yaml") for d in docs(rel)
              if d.kind == "Service" and d.name != "stowage-device-plugin"]
    assert not any(sm["spec"]["selector"]["matchLabels"].items() <= d.body["metadata"].get("labels", {}).items()
                   for d in others)


# ------------------------------------------------------------------------------- image


def test_dockerfile_builds_the_stowage_entrypoint_as_non_root():
    text = (ROOT / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    assert any("pip install ." in ln for ln in lines)
    assert any("python -m stowage.genprotos" in ln for ln in lines), "stubs must be generated at build time"
    (user,) = [ln for ln in lines if ln.startswith("USER ")]
    assert user.split()[1].split(":")[0] not in ("0", "root")
    (entry,) = [ln for ln in lines if ln.startswith("ENTRYPOINT")]
    assert entry == 'ENTRYPOINT ["stowage"]'
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "stowage" in scripts
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignore and ".git" in ignore


def test_the_exporters_liveness_probe_asks_the_process_not_its_peers():
    """The exporter's liveness probe hit /metrics, which takes a reading: PodResources' List
    (5 s timeout, the probe's own timeout too) and NVML. A kubelet slow for two minutes failed
    four probes in a row and got the exporter restarted, which cures nothing. Liveness asks
    /healthz (answered by the server itself, tests/test_exporter_hostile.py); readiness still
    asks /metrics, so a node whose readings fail is out of the Service without a restart."""
    (c,) = one("exporter.yaml", "DaemonSet", "stowage-exporter")["spec"]["template"]["spec"]["containers"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/metrics"
