"""The real kube-apiserver (v1.28.7) accepts what we ship: ``kubectl apply --dry-run=server -k
scheduler-config/``, the ServiceMonitors, the prometheus-adapter ConfigMap as docs/autoscaling.md
creates it, and every example in ``scheduler-config/examples/``.

``--dry-run=server`` runs the whole admission chain and the API server's own validation and
defaulting without persisting anything; kubectl (>= 1.27) asks for strict field validation, so an
unknown or misspelled field is an error, not a silently dropped line. The offline validator
(tests/manifest_validation.py) checks the same files against the client's models; this is the
authority those models stand in for.

Kinds of CRDs that a plain API server does not know (the Prometheus operator's ServiceMonitor,
KEDA's ScaledObject) get a CRD installed here, with a structural schema written from the upstream
CRDs for the fields our manifests use (see each schema's comment for what it does and does not
validate). Without those CRDs the API server would answer "no matches for kind".
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from realk8s import REPO, LocalK8s, wait_until

CONFIG = REPO / "scheduler-config"
EXAMPLES = sorted((CONFIG / "examples").glob("*.yaml"))
EXAMPLES_NS = "it-manifest-examples"

_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_LABEL_SELECTOR = {"type": "object", "properties": {
    "matchLabels": _STRING_MAP,
    "matchExpressions": {"type": "array", "items": {"type": "object", "required": ["key", "operator"], "properties": {
        "key": {"type": "string"}, "operator": {"type": "string"},
        "values": {"type": "array", "items": {"type": "string"}}}}}}}
_FREE = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}  # not validated

# monitoring.coreos.com/v1 ServiceMonitor, after prometheus-operator's CRD (v0.7x).
# Validated: spec.selector required; selector, namespaceSelector and every endpoint field we use
# (port, targetPort, path, scheme, interval/scrapeTimeout with the operator's duration pattern,
# honorLabels, honorTimestamps) and the top-level spec fields typed; unknown fields in spec, in
# endpoints and in namespaceSelector are rejected (strict validation).
# Not validated: relabelings, metricRelabelings, tlsConfig, params, basicAuth, authorization and
# oauth2 bodies (accepted as any object/list), and the operator's cross-field rules.
SERVICE_MONITOR_SCHEMA = {"type": "object", "required": ["spec"], "properties": {
    "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
    "spec": {"type": "object", "required": ["selector"], "properties": {
        "selector": _LABEL_SELECTOR,
        "namespaceSelector": {"type": "object", "properties": {
            "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
        "jobLabel": {"type": "string"},
        "targetLabels": {"type": "array", "items": {"type": "string"}},
        "podTargetLabels": {"type": "array", "items": {"type": "string"}},
        "sampleLimit": {"type": "integer", "format": "int64"},
        "endpoints": {"type": "array", "items": {"type": "object", "properties": {
            "port": {"type": "string"},
            "targetPort": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True},
            "path": {"type": "string"}, "scheme": {"type": "string", "enum": ["http", "https"]},
            "interval": {"type": "string", "pattern": _DURATION},
            "scrapeTimeout": {"type": "string", "pattern": _DURATION},
            "honorLabels": {"type": "boolean"}, "honorTimestamps": {"type": "boolean"},
            "params": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
            "relabelings": {"type": "array", "items": _FREE},
            "metricRelabelings": {"type": "array", "items": _FREE},
            "tlsConfig": _FREE, "basicAuth": _FREE, "authorization": _FREE, "oauth2": _FREE,
            "bearerTokenSecret": _FREE}}}}}}}

# keda.sh/v1alpha1 ScaledObject, after KEDA's CRD (v2.1x).
# Validated: spec.scaleTargetRef (name required) and spec.triggers (type and metadata required)
# are required; trigger metadata is a map of STRINGS (a bare number such as `threshold: 0.6` is
# rejected, as real KEDA rejects it); metricType is one of KEDA's three; the replica counts,
# intervals and fallback are int32 with fallback's two fields required; unknown fields anywhere
# in spec except inside behavior are rejected.
# Not validated: the HPA behavior body (any object), scalingModifiers, and what only KEDA's
# admission webhook checks (e.g. one autoscaler per Deployment, trigger-specific metadata keys).
_INT32 = {"type": "integer", "format": "int32"}
SCALED_OBJECT_SCHEMA = {"type": "object", "required": ["spec"], "properties": {
    "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
    "spec": {"type": "object", "required": ["scaleTargetRef", "triggers"], "properties": {
        "scaleTargetRef": {"type": "object", "required": ["name"], "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "name": {"type": "string"},
            "envSourceContainerName": {"type": "string"}}},
        "minReplicaCount": _INT32, "maxReplicaCount": _INT32, "idleReplicaCount": _INT32,
        "pollingInterval": _INT32, "cooldownPeriod": _INT32,
        "fallback": {"type": "object", "required": ["failureThreshold", "replicas"], "properties": {
            "failureThreshold": _INT32, "replicas": _INT32}},
        "advanced": {"type": "object", "properties": {
            "restoreToOriginalReplicaCount": {"type": "boolean"},
            "horizontalPodAutoscalerConfig": {"type": "object", "properties": {
                "name": {"type": "string"}, "behavior": _FREE}},
            "scalingModifiers": _FREE}},
        "triggers": {"type": "array", "items": {"type": "object", "required": ["type", "metadata"], "properties": {
            "type": {"type": "string"}, "name": {"type": "string"}, "useCachedMetrics": {"type": "boolean"},
            "metadata": _STRING_MAP,
            "metricType": {"type": "string", "enum": ["AverageValue", "Value", "Utilization"]},
            "authenticationRef": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "kind": {"type": "string"}}}}}}}}}}


def crd(group: str, version: str, kind: str, plural: str, schema: dict) -> dict:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": kind + "List"},
                     "versions": [{"name": version, "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": schema}}]}}


CRDS = [crd("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors", SERVICE_MONITOR_SCHEMA),
        crd("keda.sh", "v1alpha1", "ScaledObject", "scaledobjects", SCALED_OBJECT_SCHEMA)]


def ensure_namespace(k8s: LocalK8s, name: str) -> None:
    """Dry-run objects need their namespace to exist for real (a dry-run Namespace is not created)."""
    try:
        k8s.core.create_namespace({"metadata": {"name": name}})
    except Exception as exc:  # noqa: BLE001 - already there (another test, or a rerun)
        if getattr(exc, "status", None) != 409:
            raise


@pytest.fixture(scope="module")
def api(k8s: LocalK8s) -> LocalK8s:
    """The control plane with the CRDs installed (Established) and the namespaces created."""
    k8s.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(CRDS))
    for c in CRDS:
        k8s.kubectl("wait", "--for=condition=Established", "--timeout=30s", f"crd/{c['metadata']['name']}")
    for c in CRDS:  # discovery knows the kind once the CRD is Established; wait for kubectl too
        wait_until(lambda: k8s.kubectl("get", c["spec"]["names"]["plural"], "-A", check=False).returncode == 0,
                   20, f"{c['spec']['names']['plural']} to be served")
    ensure_namespace(k8s, "stowage-system")
    ensure_namespace(k8s, EXAMPLES_NS)
    return k8s


def dry_run(k8s: LocalK8s, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    return k8s.kubectl("apply", "--dry-run=server", *args, input=input, check=False)


def accepted(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, f"the API server rejected it:\n{r.stderr}\n{r.stdout}"
    assert "(server dry run)" in r.stdout, r.stdout


def test_kustomization_is_accepted_by_the_api_server(rbac_k8s: LocalK8s) -> None:
    # The kustomization includes admission-policy.yaml (ValidatingAdmissionPolicy v1beta1), which
    # Kubernetes 1.28 serves only with the API switched on: the --rbac control plane.
    api = rbac_k8s
    ensure_namespace(api, "stowage-system")
    r = dry_run(api, "-k", str(CONFIG))
    accepted(r)
    # every object of the kustomization went through the server (not one skipped)
    built = [d for d in yaml.safe_load_all(api.kubectl("kustomize", str(CONFIG)).stdout) if d]
    assert r.stdout.count("(server dry run)") == len(built), r.stdout
    assert {d["kind"] for d in built} >= {"Namespace", "Deployment", "DaemonSet", "ConfigMap", "ClusterRole",
                                          "ServiceAccount", "Service"}


def test_service_monitors_are_accepted_with_the_crd(api: LocalK8s) -> None:
    r = dry_run(api, "-f", str(CONFIG / "monitoring" / "servicemonitor.yaml"))
    accepted(r)
    assert {line.split()[0] for line in r.stdout.splitlines()} == {
        f"servicemonitor.monitoring.coreos.com/stowage-{name}" for name in ("exporter", "extender", "device-plugin")}


def test_prometheus_adapter_config_map_is_accepted(api: LocalK8s) -> None:
    """docs/autoscaling.md's `kubectl create configmap --from-file` of the adapter's rules."""
    ensure_namespace(api, "monitoring")
    cm = api.kubectl("-n", "monitoring", "create", "configmap", "adapter-config", "--dry-run=client", "-o", "yaml",
                     f"--from-file=config.yaml={CONFIG / 'autoscaling' / 'prometheus-adapter-config.yaml'}").stdout
    accepted(dry_run(api, "-f", "-", input=cm))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_accepted_by_the_api_server(api: LocalK8s, path: Path) -> None:
    r = dry_run(api, "-n", EXAMPLES_NS, "-f", str(path))
    accepted(r)
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert r.stdout.count("(server dry run)") == len(docs), r.stdout


def test_the_dry_run_rejects_what_the_real_peers_would(api: LocalK8s) -> None:
    """The check can fail: a misspelled field, a KEDA trigger value that is not a string, and a
    ServiceMonitor without its selector are each refused by the API server."""
    whole = (CONFIG / "examples" / "model-serving-whole-gpu.yaml").read_text()
    assert "containers:" in whole
    typo = whole.replace("containers:", "containres:", 1)
    r = dry_run(api, "-n", EXAMPLES_NS, "-f", "-", input=typo)
    assert r.returncode != 0 and "containres" in r.stderr, r.stderr

    keda = yaml.safe_load((CONFIG / "examples" / "model-serving-keda.yaml").read_text())
    keda["spec"]["triggers"][0]["metadata"]["threshold"] = 0.6
    r = dry_run(api, "-n", EXAMPLES_NS, "-f", "-", input=yaml.safe_dump(keda))
    assert r.returncode != 0 and "threshold" in r.stderr, r.stderr

    sm = list(yaml.safe_load_all((CONFIG / "monitoring" / "servicemonitor.yaml").read_text()))[0]
    del sm["spec"]["selector"]
    r = dry_run(api, "-f", "-", input=yaml.safe_dump(sm))
    assert r.returncode != 0 and "selector" in r.stderr, r.stderr
