"""Field-level validation of the YAML users apply, for the manifest tests (tests/test_manifests_*.py).

Why this exists: `kubectl apply` of a misspelled field is often silently accepted (client-side
pruning, or the API server dropping unknown fields with only a warning), and the object then does
something else than its author meant: a probe that never runs, a scale-down window that is the
default. So every object is checked field by field:

- built-in kinds against the `kubernetes` python client's model classes (``openapi_types`` and
  ``attribute_map`` are generated from the API server's OpenAPI schema), recursively, then
  deserialised by the client to catch missing required fields and bad enum values;
- kinds without client models (KubeSchedulerConfiguration, Kustomization, ServiceMonitor,
  PrometheusRule, ScaledObject, prometheus-adapter's config) against small closed schemas written
  below from the upstream type definitions.

Unknown fields and wrong scalar types are errors, reported with their path in the document.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import kubernetes.client as k8s
import yaml

# --------------------------------------------------------------------------------- loading


@dataclass(frozen=True)
class Doc:
    """One YAML document of a file (files may hold several, separated by ---)."""

    path: Path
    index: int
    body: Any

    @property
    def where(self) -> str:
        return f"{self.path.name}[{self.index}]"

    @property
    def kind(self) -> str:
        return self.body.get("kind", "") if isinstance(self.body, dict) else ""

    @property
    def name(self) -> str:
        meta = self.body.get("metadata") if isinstance(self.body, dict) else None
        return (meta or {}).get("name", "") if isinstance(meta, dict) else ""


def load_docs(path: Path) -> list[Doc]:
    """All non-empty documents of a YAML file (raises yaml.YAMLError on a syntax error)."""
    with path.open() as fh:
        return [Doc(path, i, d) for i, d in enumerate(yaml.safe_load_all(fh)) if d is not None]


def load_text_docs(text: str, name: str = "<text>") -> list[Doc]:
    return [Doc(Path(name), i, d) for i, d in enumerate(yaml.safe_load_all(text)) if d is not None]


# ---------------------------------------------------------------------- built-in kinds

# kind -> API group ("" = core). A kind is built in only with its own group: `apps/v1 Job` is an error.
BUILTIN_GROUPS: dict[str, str] = {
    "Namespace": "", "ServiceAccount": "", "Service": "", "ConfigMap": "", "Secret": "", "Pod": "",
    "Deployment": "apps", "DaemonSet": "apps", "StatefulSet": "apps",
    "Job": "batch", "CronJob": "batch",
    "HorizontalPodAutoscaler": "autoscaling",
    "ClusterRole": "rbac.authorization.k8s.io", "ClusterRoleBinding": "rbac.authorization.k8s.io",
    "Role": "rbac.authorization.k8s.io", "RoleBinding": "rbac.authorization.k8s.io",
    "PriorityClass": "scheduling.k8s.io", "RuntimeClass": "node.k8s.io",
    "NetworkPolicy": "networking.k8s.io", "PodDisruptionBudget": "policy",
    "ValidatingAdmissionPolicy": "admissionregistration.k8s.io",
    "ValidatingAdmissionPolicyBinding": "admissionregistration.k8s.io",
}
# Beta versions whose fields the GA version kept unchanged, checked against the GA models (the
# client has only those): ValidatingAdmissionPolicy v1beta1 (Kubernetes 1.28-1.29) = v1 (1.30).
SAME_FIELDS_AS = {("admissionregistration.k8s.io", "v1beta1"): "v1"}

# Fields the client types as `str` that the API server accepts as numbers too (resource.Quantity).
QUANTITY_FIELDS = {
    ("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
    ("V1EmptyDirVolumeSource", "size_limit"),
    ("V2MetricTarget", "value"), ("V2MetricTarget", "average_value"),
}


# String fields whose values the API server restricts (the client models do not know enums).
ENUM_FIELDS: dict[tuple[str, str], frozenset[str]] = {
    ("V1Container", "image_pull_policy"): frozenset({"Always", "IfNotPresent", "Never"}),
    ("V1PodSpec", "restart_policy"): frozenset({"Always", "OnFailure", "Never"}),
    ("V1PodSpec", "dns_policy"): frozenset({"ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"}),
    ("V1ContainerPort", "protocol"): frozenset({"TCP", "UDP", "SCTP"}),
    ("V1ServicePort", "protocol"): frozenset({"TCP", "UDP", "SCTP"}),
    ("V1ServiceSpec", "type"): frozenset({"ClusterIP", "NodePort", "LoadBalancer", "ExternalName"}),
    ("V1HostPathVolumeSource", "type"): frozenset({"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File",
                                                   "Socket", "CharDevice", "BlockDevice"}),
    ("V1EmptyDirVolumeSource", "medium"): frozenset({"", "Memory", "HugePages"}),
    ("V1HTTPGetAction", "scheme"): frozenset({"HTTP", "HTTPS"}),
    ("V1Toleration", "operator"): frozenset({"Exists", "Equal"}),
    ("V1Toleration", "effect"): frozenset({"", "NoSchedule", "PreferNoSchedule", "NoExecute"}),
    ("V1NodeSelectorRequirement", "operator"): frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}),
    ("V1LabelSelectorRequirement", "operator"): frozenset({"In", "NotIn", "Exists", "DoesNotExist"}),
    ("V1DeploymentStrategy", "type"): frozenset({"Recreate", "RollingUpdate"}),
    ("V1DaemonSetUpdateStrategy", "type"): frozenset({"RollingUpdate", "OnDelete"}),
    ("V1SeccompProfile", "type"): frozenset({"RuntimeDefault", "Unconfined", "Localhost"}),
    ("V2MetricSpec", "type"): frozenset({"ContainerResource", "External", "Object", "Pods", "Resource"}),
    ("V2MetricTarget", "type"): frozenset({"Utilization", "Value", "AverageValue"}),
    ("V2HPAScalingRules", "select_policy"): frozenset({"Max", "Min", "Disabled"}),
    ("V2HPAScalingPolicy", "type"): frozenset({"Pods", "Percent"}),
    ("RbacV1Subject", "kind"): frozenset({"ServiceAccount", "User", "Group"}),
    ("V1RoleRef", "kind"): frozenset({"Role", "ClusterRole"}),
}


def split_api_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def model_class(api_version: str, kind: str) -> type | None:
    """The client model class of a built-in apiVersion/kind, e.g. ('apps/v1', 'Deployment') -> V1Deployment."""
    group, version = split_api_version(api_version)
    if BUILTIN_GROUPS.get(kind) != group or not version:
        return None
    version = SAME_FIELDS_AS.get((group, version), version)
    return getattr(k8s, version[0].upper() + version[1:] + kind, None)


# Client versions spell containers differently: "list[V1Container]" / "List[V1Container]",
# "dict(str, str)" / "Dict[str, str]".
_LIST = re.compile(r"[Ll]ist\[(.+)\]")
_DICT = re.compile(r"[Dd]ict[(\[]str, (.+)[)\]]")


def _check_scalar(value: Any, typ: str, path: str, errors: list[str], quantity: bool) -> bool:
    """Check a primitive client type; False if `typ` is not primitive."""
    if typ == "str":
        ok = isinstance(value, str) or (quantity and isinstance(value, (int, float)) and not isinstance(value, bool))
        if not ok:
            errors.append(f"{path}: expected a string, got {type(value).__name__} {value!r}")
    elif typ == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append(f"{path}: expected an integer, got {type(value).__name__} {value!r}")
    elif typ == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            errors.append(f"{path}: expected a number, got {type(value).__name__} {value!r}")
    elif typ == "bool":
        if not isinstance(value, bool):
            errors.append(f"{path}: expected true/false, got {type(value).__name__} {value!r}")
    elif typ in ("datetime", "date"):
        if not isinstance(value, str):
            errors.append(f"{path}: expected a timestamp string, got {value!r}")
    elif typ == "object":
        pass  # IntOrString, RawExtension, free-form JSON
    else:
        return False
    return True


def check_client_type(value: Any, typ: str, path: str, errors: list[str], quantity: bool = False) -> None:
    if value is None:
        return  # null means "not set"
    m = _LIST.fullmatch(typ)
    if m:
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            check_client_type(item, m.group(1), f"{path}[{i}]", errors, quantity)
        return
    m = _DICT.fullmatch(typ)
    if m:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map, got {type(value).__name__}")
            return
        for k, v in value.items():
            if not isinstance(k, str):
                errors.append(f"{path}: map key {k!r} must be a string")
            check_client_type(v, m.group(1), f"{path}.{k}", errors, quantity)
        return
    if _check_scalar(value, typ, path, errors, quantity):
        return
    cls = getattr(k8s, typ, None)
    if cls is None:
        errors.append(f"{path}: validator does not know client type {typ}")
        return
    check_client_model(value, cls, path, errors)


def check_client_model(value: Any, cls: type, path: str, errors: list[str]) -> None:
    """Every key must be a field of `cls` (by its JSON name), recursively."""
    if not isinstance(value, dict):
        errors.append(f"{path}: expected an object ({cls.__name__}), got {type(value).__name__}")
        return
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    for key, item in value.items():
        attr = by_json.get(key)
        if attr is None:
            errors.append(f"{path}.{key}: unknown field of {cls.__name__} (known: {', '.join(sorted(by_json))})")
            continue
        check_client_type(item, cls.openapi_types[attr], f"{path}.{key}", errors,
                          quantity=(cls.__name__, attr) in QUANTITY_FIELDS)
        allowed = ENUM_FIELDS.get((cls.__name__, attr))
        if allowed is not None and isinstance(item, str) and item not in allowed:
            errors.append(f"{path}.{key}: {item!r} is not one of {', '.join(sorted(allowed))}")


def quantities_as_strings(value: Any, typ: str, quantity: bool = False) -> Any:
    """A copy with numeric quantities as strings: YAML `nvidia.com/gpu: 1` is valid for the API server
    (resource.Quantity accepts numbers) while the client's models insist on strings."""
    if value is None:
        return None
    m = _LIST.fullmatch(typ)
    if m and isinstance(value, list):
        return [quantities_as_strings(v, m.group(1), quantity) for v in value]
    m = _DICT.fullmatch(typ)
    if m and isinstance(value, dict):
        return {k: quantities_as_strings(v, m.group(1), quantity) for k, v in value.items()}
    if typ == "str" and quantity and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    cls = getattr(k8s, typ, None)
    if cls is not None and isinstance(value, dict):
        by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
        return {k: quantities_as_strings(v, cls.openapi_types[by_json[k]], (cls.__name__, by_json[k]) in QUANTITY_FIELDS)
                if k in by_json else v for k, v in value.items()}
    return value


_api_client: k8s.ApiClient | None = None


def _deserialize_errors(body: dict, cls: type, where: str) -> list[str]:
    """Let the client build the object: it rejects missing required fields and bad enum values."""
    global _api_client
    if _api_client is None:
        _api_client = k8s.ApiClient()
    try:
        # the client's own JSON -> model path
        _api_client._ApiClient__deserialize(quantities_as_strings(body, cls.__name__), cls.__name__)
    except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
        return [f"{where}: {exc}"]
    return []


# ------------------------------------------------------------------ schemas for other kinds

Checker = Callable[[Any, str, list[str]], None]
ANY: Checker = lambda value, path, errors: None  # noqa: E731  (free-form by design)


def scalar(typ: str) -> Checker:
    return lambda value, path, errors: _check_scalar(value, typ, path, errors, False) and None


STR, INT, BOOL, FLOAT = scalar("str"), scalar("int"), scalar("bool"), scalar("float")


def pattern(regex: str, what: str) -> Checker:
    rx = re.compile(regex)

    def check(value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, str) or not rx.fullmatch(value):
            errors.append(f"{path}: {value!r} is not {what}")
    return check


# Go's time.ParseDuration (metav1.Duration) and Prometheus' model.Duration.
GO_DURATION = pattern(r"(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+", "a duration like 5s or 1m30s")
PROM_DURATION = pattern(r"(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?", "a Prometheus duration like 15s")


def enum(*values: str) -> Checker:
    def check(value: Any, path: str, errors: list[str]) -> None:
        if value not in values:
            errors.append(f"{path}: {value!r} is not one of {', '.join(values)}")
    return check


def list_of(item: Checker) -> Checker:
    def check(value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            item(v, f"{path}[{i}]", errors)
    return check


def map_of(item: Checker) -> Checker:
    def check(value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map, got {type(value).__name__}")
            return
        for k, v in value.items():
            item(v, f"{path}.{k}", errors)
    return check


def client_model(name: str) -> Checker:
    """A built-in Kubernetes type used inside a custom kind (ObjectMeta, LabelSelector, HPA behavior)."""
    cls = getattr(k8s, name)
    return lambda value, path, errors: check_client_model(value, cls, path, errors)


@dataclass
class Obj:
    """A closed object schema: only these fields, `required` ones must be present."""

    fields: dict[str, Checker]
    required: tuple[str, ...] = ()

    def __call__(self, value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected an object, got {type(value).__name__}")
            return
        for key in self.required:
            if key not in value:
                errors.append(f"{path}: missing required field {key}")
        for key, item in value.items():
            check = self.fields.get(key)
            if check is None:
                errors.append(f"{path}.{key}: unknown field (known: {', '.join(sorted(self.fields))})")
            elif item is not None:
                check(item, f"{path}.{key}", errors)


TYPE_META = {"apiVersion": STR, "kind": STR}
META = client_model("V1ObjectMeta")

# --- kubescheduler.config.k8s.io/v1 (k8s.io/kube-scheduler/config/v1/types.go, component-base config)
_PLUGIN = Obj({"name": STR, "weight": INT}, required=("name",))
_PLUGIN_SET = Obj({"enabled": list_of(_PLUGIN), "disabled": list_of(_PLUGIN)})
_EXTENSION_POINTS = ("preEnqueue", "queueSort", "preFilter", "filter", "postFilter", "preScore", "score",
                     "reserve", "permit", "preBind", "bind", "postBind", "multiPoint")
_RESOURCE_SPEC = Obj({"name": STR, "weight": INT}, required=("name",))
PLUGIN_ARGS: dict[str, Checker] = {
    "NodeResourcesFit": Obj({**TYPE_META, "ignoredResources": list_of(STR), "ignoredResourceGroups": list_of(STR),
                             "scoringStrategy": Obj({
                                 "type": enum("LeastAllocated", "MostAllocated", "RequestedToCapacityRatio"),
                                 "resources": list_of(_RESOURCE_SPEC),
                                 "requestedToCapacityRatio": Obj({"shape": list_of(Obj({"utilization": INT, "score": INT}))}),
                             })}),
    "PodTopologySpread": Obj({**TYPE_META, "defaultingType": enum("System", "List"),
                              "defaultConstraints": list_of(client_model("V1TopologySpreadConstraint"))}),
}


def _plugin_config(value: Any, path: str, errors: list[str]) -> None:
    Obj({"name": STR, "args": ANY}, required=("name",))(value, path, errors)
    if isinstance(value, dict) and value.get("name") in PLUGIN_ARGS and value.get("args") is not None:
        PLUGIN_ARGS[value["name"]](value["args"], f"{path}.args", errors)


_EXTENDER = Obj({
    "urlPrefix": STR, "filterVerb": STR, "preemptVerb": STR, "prioritizeVerb": STR, "bindVerb": STR,
    "weight": INT, "enableHTTPS": BOOL,
    "tlsConfig": Obj({"insecure": BOOL, "serverName": STR, "certFile": STR, "keyFile": STR, "caFile": STR,
                      "certData": STR, "keyData": STR, "caData": STR}),
    "httpTimeout": GO_DURATION, "nodeCacheCapable": BOOL,
    "managedResources": list_of(Obj({"name": STR, "ignoredByScheduler": BOOL}, required=("name",))),
    "ignorable": BOOL,
}, required=("urlPrefix",))

KUBE_SCHEDULER_CONFIGURATION = Obj({
    **TYPE_META,
    "parallelism": INT,
    "leaderElection": Obj({"leaderElect": BOOL, "leaseDuration": GO_DURATION, "renewDeadline": GO_DURATION,
                           "retryPeriod": GO_DURATION, "resourceLock": enum("leases"), "resourceName": STR,
                           "resourceNamespace": STR}),
    "clientConnection": Obj({"kubeconfig": STR, "acceptContentTypes": STR, "contentType": STR, "qps": FLOAT,
                             "burst": INT}),
    "enableProfiling": BOOL, "enableContentionProfiling": BOOL,
    "percentageOfNodesToScore": INT, "podInitialBackoffSeconds": INT, "podMaxBackoffSeconds": INT,
    "profiles": list_of(Obj({"schedulerName": STR, "percentageOfNodesToScore": INT,
                             "plugins": Obj({ep: _PLUGIN_SET for ep in _EXTENSION_POINTS}),
                             "pluginConfig": list_of(_plugin_config)})),
    "extenders": list_of(_EXTENDER),
    "delayCacheUntilActive": BOOL,
}, required=("apiVersion", "kind"))

# --- kustomize.config.k8s.io/v1beta1 (sigs.k8s.io/kustomize/api/types/kustomization.go)
_GEN_OPTIONS = Obj({"labels": map_of(STR), "annotations": map_of(STR), "disableNameSuffixHash": BOOL, "immutable": BOOL})
_GENERATOR = Obj({"name": STR, "namespace": STR, "behavior": enum("create", "replace", "merge"),
                  "files": list_of(STR), "literals": list_of(STR), "envs": list_of(STR), "options": _GEN_OPTIONS},
                 required=("name",))
KUSTOMIZATION = Obj({
    **TYPE_META, "metadata": META,
    "resources": list_of(STR), "components": list_of(STR), "crds": list_of(STR),
    "namespace": STR, "namePrefix": STR, "nameSuffix": STR,
    "commonLabels": map_of(STR), "commonAnnotations": map_of(STR),
    "labels": list_of(Obj({"pairs": map_of(STR), "includeSelectors": BOOL, "includeTemplates": BOOL, "fields": ANY})),
    "configMapGenerator": list_of(_GENERATOR),
    "secretGenerator": list_of(Obj({**_GENERATOR.fields, "type": STR}, required=("name",))),
    "generatorOptions": _GEN_OPTIONS,
    "images": list_of(Obj({"name": STR, "newName": STR, "newTag": STR, "digest": STR}, required=("name",))),
    "patches": list_of(Obj({"path": STR, "patch": STR, "target": ANY, "options": ANY})),
    "replicas": list_of(Obj({"name": STR, "count": INT}, required=("name", "count"))),
    "buildMetadata": list_of(STR), "configurations": list_of(STR), "openapi": ANY,
})

# --- monitoring.coreos.com/v1 ServiceMonitor (prometheus-operator API reference)
_RELABEL = Obj({"sourceLabels": list_of(STR), "separator": STR, "targetLabel": STR, "regex": STR, "modulus": INT,
                "replacement": STR, "action": STR})
_SM_ENDPOINT = Obj({
    "port": STR, "targetPort": ANY, "path": STR, "scheme": enum("http", "https", "HTTP", "HTTPS"),
    "params": map_of(list_of(STR)), "interval": PROM_DURATION, "scrapeTimeout": PROM_DURATION,
    "tlsConfig": ANY, "bearerTokenFile": STR, "bearerTokenSecret": ANY, "authorization": ANY,
    "honorLabels": BOOL, "honorTimestamps": BOOL, "trackTimestampsStaleness": BOOL, "basicAuth": ANY,
    "oauth2": ANY, "metricRelabelings": list_of(_RELABEL), "relabelings": list_of(_RELABEL), "proxyUrl": STR,
    "followRedirects": BOOL, "enableHttp2": BOOL, "filterRunning": BOOL,
})
SERVICE_MONITOR = Obj({
    **TYPE_META, "metadata": META,
    "spec": Obj({
        "jobLabel": STR, "targetLabels": list_of(STR), "podTargetLabels": list_of(STR),
        "endpoints": list_of(_SM_ENDPOINT), "selector": client_model("V1LabelSelector"),
        "namespaceSelector": Obj({"any": BOOL, "matchNames": list_of(STR)}),
        "sampleLimit": INT, "targetLimit": INT, "labelLimit": INT, "labelNameLengthLimit": INT,
        "labelValueLengthLimit": INT, "keepDroppedTargets": INT, "attachMetadata": Obj({"node": BOOL}),
        "scrapeProtocols": list_of(STR), "scrapeClass": STR, "bodySizeLimit": STR,
    }, required=("selector",)),
}, required=("apiVersion", "kind", "metadata", "spec"))

# --- monitoring.coreos.com/v1 PrometheusRule (prometheus-operator API reference: RuleGroup, Rule;
# the group and rule fields are spelt as in a Prometheus rules file, snake_case)
def _int_or_string(value: Any, path: str, errors: list[str]) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        errors.append(f"{path}: expected a string or an integer, got {type(value).__name__} {value!r}")


def _rule(value: Any, path: str, errors: list[str]) -> None:
    Obj({"record": STR, "alert": STR, "expr": _int_or_string, "for": PROM_DURATION,
         "keep_firing_for": PROM_DURATION, "labels": map_of(STR), "annotations": map_of(STR)},
        required=("expr",))(value, path, errors)
    if isinstance(value, dict) and ("alert" in value) == ("record" in value):
        errors.append(f"{path}: a rule is either an alert or a record (exactly one of the two)")
    if isinstance(value, dict) and "record" in value and ("for" in value or "annotations" in value):
        errors.append(f"{path}: a recording rule takes no for/annotations")


_RULE_GROUP = Obj({"name": STR, "labels": map_of(STR), "interval": PROM_DURATION, "query_offset": PROM_DURATION,
                   "rules": list_of(_rule), "partial_response_strategy": STR, "limit": INT},
                  required=("name", "rules"))
PROMETHEUS_RULE = Obj({
    **TYPE_META, "metadata": META,
    "spec": Obj({"groups": list_of(_RULE_GROUP)}),
}, required=("apiVersion", "kind", "metadata", "spec"))

# --- keda.sh/v1alpha1 ScaledObject (KEDA's ScaledObject specification) and its prometheus trigger
PROMETHEUS_TRIGGER_METADATA = {"serverAddress", "query", "threshold", "activationThreshold", "namespace",
                               "customHeaders", "ignoreNullValues", "unsafeSsl", "queryParameters", "timeout",
                               "metricName"}
PROMETHEUS_TRIGGER_REQUIRED = ("serverAddress", "query", "threshold")


def _trigger(value: Any, path: str, errors: list[str]) -> None:
    Obj({"type": STR, "name": STR, "metadata": map_of(STR),  # KEDA trigger metadata values are strings
         "authenticationRef": Obj({"name": STR, "kind": STR}, required=("name",)),
         "metricType": enum("AverageValue", "Value", "Utilization"), "useCachedMetrics": BOOL},
        required=("type", "metadata"))(value, path, errors)
    if isinstance(value, dict) and value.get("type") == "prometheus" and isinstance(value.get("metadata"), dict):
        md = value["metadata"]
        for key in md:
            if key not in PROMETHEUS_TRIGGER_METADATA:
                errors.append(f"{path}.metadata.{key}: unknown prometheus trigger parameter "
                              f"(known: {', '.join(sorted(PROMETHEUS_TRIGGER_METADATA))})")
        for key in PROMETHEUS_TRIGGER_REQUIRED:
            if key not in md:
                errors.append(f"{path}.metadata: missing required prometheus trigger parameter {key}")


SCALED_OBJECT = Obj({
    **TYPE_META, "metadata": META,
    "spec": Obj({
        "scaleTargetRef": Obj({"apiVersion": STR, "kind": STR, "name": STR, "envSourceContainerName": STR},
                              required=("name",)),
        "pollingInterval": INT, "cooldownPeriod": INT, "initialCooldownPeriod": INT, "idleReplicaCount": INT,
        "minReplicaCount": INT, "maxReplicaCount": INT,
        "fallback": Obj({"failureThreshold": INT, "replicas": INT, "behavior": STR},
                        required=("failureThreshold", "replicas")),
        "advanced": Obj({"restoreToOriginalReplicaCount": BOOL,
                         "horizontalPodAutoscalerConfig": Obj({"name": STR,
                                                               "behavior": client_model("V2HorizontalPodAutoscalerBehavior")}),
                         "scalingModifiers": Obj({"formula": STR, "target": STR, "activationTarget": STR,
                                                  "metricType": STR})}),
        "triggers": list_of(_trigger),
    }, required=("scaleTargetRef", "triggers")),
}, required=("apiVersion", "kind", "metadata", "spec"))

# --- prometheus-adapter config.yaml (kubernetes-sigs/prometheus-adapter docs/config.md)
_ADAPTER_RULE = Obj({
    "seriesQuery": STR,
    "seriesFilters": list_of(Obj({"is": STR, "isNot": STR})),
    "resources": Obj({"overrides": map_of(Obj({"group": STR, "resource": STR}, required=("resource",))),
                      "template": STR, "namespaced": BOOL}),
    "name": Obj({"matches": STR, "as": STR}),
    "metricsQuery": STR,
}, required=("seriesQuery", "metricsQuery"))
PROMETHEUS_ADAPTER_CONFIG = Obj({"rules": list_of(_ADAPTER_RULE), "externalRules": list_of(_ADAPTER_RULE),
                                 "resourceRules": ANY})

CUSTOM_KINDS: dict[tuple[str, str], Checker] = {
    ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration"): KUBE_SCHEDULER_CONFIGURATION,
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"): KUSTOMIZATION,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
    ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT,
}


def is_adapter_config(doc: Doc) -> bool:
    """prometheus-adapter's config has no apiVersion/kind; recognised by its file name."""
    return doc.path.name.startswith("prometheus-adapter") and isinstance(doc.body, dict) and "kind" not in doc.body


# --------------------------------------------------------------------------------- entry


def validate(doc: Doc) -> list[str]:
    """All problems of one document; [] when it names only real fields with the right types."""
    body, where = doc.body, doc.where
    if not isinstance(body, dict):
        return [f"{where}: a manifest must be a mapping, got {type(body).__name__}"]
    if is_adapter_config(doc):
        errors: list[str] = []
        PROMETHEUS_ADAPTER_CONFIG(body, where, errors)
        return errors
    api_version, kind = body.get("apiVersion"), body.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return [f"{where}: missing apiVersion/kind"]
    errors = []
    schema = CUSTOM_KINDS.get((api_version, kind))
    if schema is not None:
        schema(body, where, errors)
        return errors
    cls = model_class(api_version, kind)
    if cls is None:
        return [f"{where}: unknown apiVersion/kind {api_version} {kind} (neither a built-in kind in its group "
                f"nor one of {sorted(CUSTOM_KINDS)})"]
    check_client_model(body, cls, where, errors)
    if not doc.name:
        errors.append(f"{where}: metadata.name is required")
    if not errors:
        errors.extend(_deserialize_errors(body, cls, where))
    return errors


def iter_yaml_files(root: Path) -> Iterator[Path]:
    yield from sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
