"""Autoscaling objects and examples: every metric they use exists, and the examples ask Stowage
for what they say they ask for (read through the same code the extender uses)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from packing.pod_policy import parse_policy
from manifest_validation import Doc, load_docs
from stowage.inventory import model_matches
from stowage.resources import pod_gpu_request

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "scheduler-config"
EXAMPLES = CONFIG / "examples"
ADAPTER = CONFIG / "autoscaling" / "prometheus-adapter-config.yaml"
CONTRACT = ROOT / "docs" / "metrics-contract.md"

# What the exporter must serve (the brief agreed with the exporter's engineer).
REQUIRED_POD_SERIES = {"stowage_pod_gpu_utilization_ratio", "stowage_pod_gpu_memory_used_bytes"}
REQUIRED_CARD_SERIES = {"stowage_gpu_utilization_ratio", "stowage_gpu_memory_used_bytes",
                        "stowage_gpu_memory_total_bytes", "stowage_gpu_power_watts",
                        "stowage_gpu_temperature_celsius", "stowage_gpu_healthy"}


def contract_sections() -> dict[str, str]:
    text = CONTRACT.read_text()
    parts = re.split(r"^## ", text, flags=re.M)
    return {p.splitlines()[0].strip(): p for p in parts[1:]}


def contract_series(section_prefix: str) -> set[str]:
    (body,) = [b for title, b in contract_sections().items() if title.startswith(section_prefix)]
    return set(re.findall(r"^\|\s*`(stowage_[a-z_]+)`", body, flags=re.M))


def all_contract_series() -> set[str]:
    return contract_series("Per-pod series") | contract_series("Per-card series")


def example_docs() -> list[Doc]:
    return [d for p in sorted(EXAMPLES.glob("*.yaml")) for d in load_docs(p)]


def adapter_rules() -> list[dict]:
    (doc,) = load_docs(ADAPTER)
    return doc.body["rules"]


def adapter_metric_names() -> dict[str, str]:
    """custom.metrics.k8s.io name -> Prometheus series, computed as the adapter does (name.matches/as)."""
    out = {}
    for rule in adapter_rules():
        (series,) = re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{", rule["seriesQuery"])
        rx = re.compile(rule["name"]["matches"])
        m = rx.search(series)
        assert m, f"rule for {series}: name.matches {rx.pattern!r} does not match its own series"
        # Go's regexp ${1} expansion, as the adapter applies `as`.
        out[re.sub(r"\$\{?(\d+)\}?", lambda g: m.group(int(g.group(1))), rule["name"]["as"])] = series
    return out


# ------------------------------------------------------------------------------- contract


def test_contract_lists_the_agreed_series_with_their_labels():
    assert contract_series("Per-pod series") == REQUIRED_POD_SERIES
    assert contract_series("Per-card series") == REQUIRED_CARD_SERIES
    titles = list(contract_sections())
    assert any(t.startswith("Per-pod series (labels: node, gpu, model, pod, namespace, container)") for t in titles)
    assert any(t.startswith("Per-card series (labels: node, gpu, model)") for t in titles)


def test_exporter_source_serves_the_contract_names():
    src = ROOT / "exporter"
    if not src.is_dir():
        pytest.skip("exporter/ not written yet")
    code = "\n".join(p.read_text() for p in src.rglob("*.py"))
    missing = {n for n in all_contract_series() if n not in code}
    assert not missing, f"exporter/ does not mention {sorted(missing)} (docs/metrics-contract.md)"


# -------------------------------------------------------------------- prometheus-adapter


def test_adapter_rules_turn_contract_series_into_pods_metrics():
    names = adapter_metric_names()
    assert set(names.values()) == REQUIRED_POD_SERIES
    for rule in adapter_rules():
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        q = rule["metricsQuery"]
        for placeholder in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
            assert placeholder in q, f"{rule['seriesQuery']}: metricsQuery lacks {placeholder}"
        assert 'namespace!=""' in rule["seriesQuery"] and 'pod!=""' in rule["seriesQuery"]


def test_adapter_aggregates_per_pod_the_documented_way():
    by_series = {re.match(r"(\w+)\{", r["seriesQuery"]).group(1): r["metricsQuery"] for r in adapter_rules()}
    assert by_series["stowage_pod_gpu_utilization_ratio"].startswith("avg by (<<.GroupBy>>)")
    assert by_series["stowage_pod_gpu_memory_used_bytes"].startswith("sum by (<<.GroupBy>>)")


# ---------------------------------------------------------------------------------- HPAs


def hpas() -> list[Doc]:
    return [d for d in example_docs() if d.kind == "HorizontalPodAutoscaler"]


def test_there_are_hpas_for_whole_and_shared_gpu_serving():
    assert {d.body["spec"]["scaleTargetRef"]["name"] for d in hpas()} == {"llm-server", "llm-server-small"}


@pytest.mark.parametrize("doc", hpas(), ids=lambda d: d.where)
def test_hpa_uses_pods_metrics_the_adapter_serves(doc: Doc):
    metrics = doc.body["spec"]["metrics"]
    served = adapter_metric_names()
    for m in metrics:
        # `Resource` metrics come from metrics.k8s.io, which only knows cpu and memory.
        assert m["type"] == "Pods", f"{doc.where}: {m['type']} metric"
        name = m["pods"]["metric"]["name"]
        assert name in served, f"{doc.where}: {name} is not a custom metric the adapter serves"
        assert served[name] in all_contract_series()
        assert m["pods"]["target"]["type"] == "AverageValue"
        assert m["pods"]["target"]["averageValue"]


@pytest.mark.parametrize("doc", hpas(), ids=lambda d: d.where)
def test_hpa_targets_a_deployment_of_its_file_and_does_not_flap(doc: Doc):
    spec = doc.body["spec"]
    ref = spec["scaleTargetRef"]
    same_file = [d for d in load_docs(doc.path) if d.kind == ref["kind"] and d.name == ref["name"]]
    assert ref["apiVersion"] == "apps/v1" and len(same_file) == 1
    assert 1 <= spec["minReplicas"] < spec["maxReplicas"]
    down, up = spec["behavior"]["scaleDown"], spec["behavior"]["scaleUp"]
    # A GPU replica takes minutes to load a model: scale in only after a long quiet period,
    # one replica at a time, and never faster than it scales out.
    assert down["stabilizationWindowSeconds"] >= 300
    assert down["stabilizationWindowSeconds"] > up["stabilizationWindowSeconds"]
    assert all(p["type"] == "Pods" and p["value"] == 1 for p in down["policies"])
    assert down["selectPolicy"] == "Min"


def test_utilization_targets_are_ratios():
    for d in hpas():
        for m in d.body["spec"]["metrics"]:
            if m["pods"]["metric"]["name"].endswith("_ratio"):
                v = m["pods"]["target"]["averageValue"]
                value = int(v[:-1]) / 1000 if str(v).endswith("m") else float(v)
                assert 0 < value < 1, f"{d.where}: a 0..1 ratio target of {v}"


def test_no_example_or_doc_uses_a_resource_metric_for_gpus():
    texts = [p.read_text() for p in EXAMPLES.glob("*.yaml")] + [(ROOT / "docs" / "autoscaling.md").read_text()]
    for d in hpas():
        assert all(m["type"] != "Resource" for m in d.body["spec"]["metrics"])
    # The explanation of why it cannot work is where users look for it.
    assert any("metrics.k8s.io" in t and "nvidia.com/gpu" in t for t in texts)


# ---------------------------------------------------------------------------------- KEDA


def test_keda_scaled_object_mirrors_the_hpa():
    (so,) = [d for d in example_docs() if d.kind == "ScaledObject"]
    spec = so.body["spec"]
    ref = spec["scaleTargetRef"]["name"]
    (hpa,) = [d.body["spec"] for d in hpas() if d.body["spec"]["scaleTargetRef"]["name"] == ref]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (hpa["minReplicas"], hpa["maxReplicas"])
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["behavior"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger.get("metricType", "AverageValue") == "AverageValue"
    query = trigger["metadata"]["query"]
    used = set(re.findall(r"\b(stowage_[a-z_]+)\{", query))
    assert used and used <= all_contract_series()
    assert query.startswith("sum(")  # AverageValue divides by the replica count: the query is a total
    target = hpa["metrics"][0]["pods"]["target"]["averageValue"]
    assert float(trigger["metadata"]["threshold"]) == int(target[:-1]) / 1000
    assert f'pod=~"{ref}-' in query


# ------------------------------------------------------------------------------ examples


def pod_templates() -> list[tuple[Doc, dict]]:
    return [(d, d.body["spec"]["template"]) for d in example_docs() if d.kind in ("Deployment", "Job")]


@pytest.mark.parametrize("doc,tpl", pod_templates(), ids=[d.where for d, _ in pod_templates()])
def test_examples_use_stowage_and_valid_policy_annotations(doc: Doc, tpl: dict):
    (profile,) = load_docs(CONFIG / "scheduler-config.yaml")[0].body["profiles"]
    assert tpl["spec"]["schedulerName"] == profile["schedulerName"]
    # The extender's own parser: an annotation it would reject must not be in an example.
    parse_policy(tpl["metadata"].get("annotations"))
    assert pod_gpu_request({"spec": tpl["spec"]}).is_gpu


def _request(name: str):
    (tpl,) = [t for d, t in pod_templates() if d.name == name]
    return pod_gpu_request({"spec": tpl["spec"]}), parse_policy(tpl["metadata"].get("annotations")), tpl


def test_whole_gpu_example_asks_for_one_big_card():
    req, pol, tpl = _request("llm-server")
    assert (req.gpus, req.mem_mib, req.core_milli) == (1, 0, 0)
    assert pol.min_card_mem_mib == 40 * 1024
    assert tpl["spec"]["containers"][0]["ports"][0]["containerPort"] == 8000


def test_shared_example_asks_for_a_20_gib_half_card_slice_on_80_gib_cards_only():
    req, pol, tpl = _request("llm-server-small")
    assert req.is_shared and (req.mem_mib, req.core_milli) == (20 * 1024, 500)
    nvml_names = {"NVIDIA A100-SXM4-80GB": True, "NVIDIA A100 80GB PCIe": True, "NVIDIA H100 80GB HBM3": True,
                  "NVIDIA A100-SXM4-40GB": False, "NVIDIA A100-PCIE-40GB": False, "NVIDIA H100 NVL": False,
                  "NVIDIA A10": False, "NVIDIA L40S": False}
    for model, allowed in nvml_names.items():
        assert any(model_matches(p, model) for p in pol.models_include) is allowed, model
    # vLLM's pool is a fraction of the whole card: it must fit the slice on an 80 GiB card.
    args = tpl["spec"]["containers"][0]["args"]
    (frac,) = [float(a.split("=")[1]) for a in args if a.startswith("--gpu-memory-utilization=")]
    assert frac * 80 <= 20
    assert tpl["spec"]["containers"][0]["ports"][0]["containerPort"] == 8000


def test_four_gpu_job_prefers_nvlink_local_cards():
    req, pol, tpl = _request("allreduce-4gpu")
    assert req.gpus == 4
    assert pol.topology == "prefer-local"
    assert "--nproc_per_node=4" in tpl["spec"]["containers"][0]["command"]
    scripts = {v["name"]: v for v in tpl["spec"]["volumes"]}["scripts"]["configMap"]["name"]
    cms = {d.name: d.body for d in example_docs() if d.kind == "ConfigMap"}
    compile(cms[scripts]["data"]["allreduce.py"], "allreduce.py", "exec")  # the script is valid Python


def test_services_front_the_serving_deployments_on_port_8000():
    for name in ("llm-server", "llm-server-small"):
        (svc,) = [d.body for d in example_docs() if d.kind == "Service" and d.name == name]
        (dep,) = [d.body for d in example_docs() if d.kind == "Deployment" and d.name == name]
        assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        assert svc["spec"]["ports"][0]["port"] == 8000


def test_hpas_shown_in_the_docs_use_served_metrics_too():
    from manifest_validation import load_text_docs

    text = (ROOT / "docs" / "autoscaling.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    doc_hpas = [d for b in blocks for d in load_text_docs(b) if d.kind == "HorizontalPodAutoscaler"]
    assert doc_hpas
    served = adapter_metric_names()
    for d in doc_hpas:
        for m in d.body["spec"]["metrics"]:
            assert m["type"] == "Pods" and m["pods"]["metric"]["name"] in served
        assert d.body["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300


# --------------------------------------------------------------------- PromQL that parses
def exporter_series() -> dict[str, frozenset[str]]:
    """Every family the exporter's collector declares, with the labels it declares them with."""
    from exporter.collector import GpuCollector

    return {f.name: frozenset(f._labelnames) for f in GpuCollector._families()}


def test_the_adapter_and_keda_queries_parse_and_read_the_exporters_own_labels():
    """The adapter's queries (its templates filled as the adapter fills them for a namespaced
    ``pods`` request) and the KEDA trigger are parsed by a real PromQL parser and checked against
    the labels the exporter's collector declares: a typo in a label (``pods=~``) or a ``by``
    on a label the series lacks evaluates to nothing, and the HPA or KEDA then never scales."""
    from promql_check import check_expr

    served = exporter_series()
    for rule in adapter_rules():
        (series,) = re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{", rule["seriesQuery"])
        query = (rule["metricsQuery"].replace("<<.Series>>", series)
                 .replace("<<.LabelMatchers>>", 'namespace="default",pod=~"a|b"').replace("<<.GroupBy>>", "pod"))
        for expr in (rule["seriesQuery"], query):
            check = check_expr(expr, served)
            assert not check.problems and check.metrics == {series}, (expr, check)
    (so,) = [d for d in example_docs() if d.kind == "ScaledObject"]
    query = so.body["spec"]["triggers"][0]["metadata"]["query"]
    check = check_expr(query, served)
    assert not check.problems and check.metrics, (query, check)
