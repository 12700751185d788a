"""The alerts (monitoring/prometheusrule.yaml) and the Grafana dashboard (monitoring/grafana-dashboard.*)
read only series our processes really serve, with the labels they really carry.

Why: Prometheus evaluates an alert on a misspelt metric or label to nothing, silently, forever;
Grafana draws "No data". So nothing here is a hand-written list of names: the extender runs as
the shipped command does (`stowage extender`, kube mode, split layout, --metrics-bind) against the
fake API server, the exporter over fake NVML and a fake kubelet, the device plugin against a fake
kubelet; each one's /metrics is scraped after every verb and source has been used, and every
expression is parsed with a real PromQL parser and checked against what came back
(tests/promql_check.py says how).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from extender_harness import start_process
from exporter_harness import make_node
from fakekube import FakeKube, kubeconfig_file, make_pod
from fakenvml import default_cards
from manifest_validation import load_docs, validate
from promql_check import (annotation_labels, check_expr, grafana_to_promql, legend_labels,
                          parse_label_values, result_labels)

from benchmarks.latency.procs import free_port
from extender.simcluster import node_objects, parse_cluster
from gpunode.devices import card_key

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "scheduler-config"
MONITORING = CONFIG / "monitoring"
RULES = MONITORING / "prometheusrule.yaml"
DASHBOARD_JSON = MONITORING / "grafana-dashboard.json"
DASHBOARD_YAML = MONITORING / "grafana-dashboard.yaml"
SEVERITIES = {"critical", "warning", "info"}

Series = dict[str, frozenset[str]]

CLUSTER = {"nodes": [
    {"name": "gpu-1", "gpus": {"model": "NVIDIA A100-SXM4-80GB", "count": 4, "memory": "80Gi"}},
    {"name": "gpu-2", "gpus": {"model": "Tesla T4", "count": 2, "memory": "16Gi"}},
]}


def series_of(text: str) -> Series:
    """Sample name -> its label names, from a /metrics answer (``_total``, ``_bucket``... as served)."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in out.items()}


def merge(*scrapes: Series) -> Series:
    out: dict[str, frozenset[str]] = {}
    for s in scrapes:
        for name, labels in s.items():
            out[name] = out.get(name, frozenset()) | labels
    return out


def _extender_series(tmp: Path) -> Series:
    """The real extender, wired as scheduler.yaml runs it, after each verb was called once."""
    with FakeKube() as kube:
        for node in node_objects(parse_cluster(CLUSTER, "test")):
            kube.create_node(dict(node, apiVersion="v1", kind="Node"))
        pod = make_pod("train", gpus=1)
        pod["spec"]["schedulerName"] = "stowage-scheduler"
        pod = kube.create_pod(pod)
        mport = free_port()
        proc, http = start_process(None, str(tmp), "--kubeconfig", kubeconfig_file(tmp, kube.url),
                                   "--workers", "2", "--metrics-bind", f"127.0.0.1:{mport}")
        try:
            names = ["gpu-1", "gpu-2"]
            m = pod["metadata"]
            for verb, body in (("filter", {"Pod": pod, "NodeNames": names}),
                               ("prioritize", {"Pod": pod, "NodeNames": names}),
                               ("preempt", {"Pod": pod, "NodeNameToMetaVictims": {}}),
                               ("bind", {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"],
                                         "Node": "gpu-1"})):
                assert http.post(f"{proc.url}/{verb}", json=body, timeout=30).status_code < 500
            text = kube.wait_for(lambda: (lambda t: t if "stowage_extender_feed_silent_seconds{" in t else None)(
                http.get(f"http://127.0.0.1:{mport}/metrics", timeout=30).text))
        finally:
            http.close()
            proc.stop()
    return series_of(text)


def _exporter_series(tmp: Path) -> Series:
    """The real exporter over fake NVML, one card held by a pod (the per-pod series exist)."""
    with pytest.MonkeyPatch.context() as mp:
        gen = make_node(mp, tmp)
        node = next(gen)
        try:
            uuid = default_cards()[0].uuid
            node.kubelet.add("ml", "train-0", "0f6c3b1e-8d2a-4c5e-9b7f-1a2b3c4d5e01",
                             {"trainer": {"nvidia.com/gpu": [card_key(uuid)]}})
            text = node.scrape().text
        finally:
            gen.close()
    return series_of(text)


def _device_plugin_series() -> Series:
    """The device plugin's registry, as its --metrics-port serves it (deviceplugin/cli.py)."""
    from dp_harness import rig

    with pytest.MonkeyPatch.context() as mp, rig(mp) as r:
        assert r.registered()
        return series_of(generate_latest(r.plugin.reconciler.registry).decode())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Series:
    """Every series the extender, the exporter and the device plugin serve, with their label names."""
    return merge(_extender_series(tmp_path_factory.mktemp("extender")),
                 _exporter_series(tmp_path_factory.mktemp("exporter")),
                 _device_plugin_series())


def _alerts() -> list[dict[str, Any]]:
    (doc,) = load_docs(RULES)
    return [dict(rule, group=g["name"]) for g in doc.body["spec"]["groups"] for rule in g["rules"]]


ALERTS = _alerts()


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_JSON.read_text())


def _panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])   # a collapsed row keeps its panels inside


def _targets() -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in _panels(_dashboard()) for t in p.get("targets", [])]


TARGETS = _targets()


def _problems(expr: str, served: Series) -> list[str]:
    return check_expr(expr, served).problems


# ------------------------------------------------------------------------------ the scrape itself


def test_the_scrape_holds_each_process_and_each_labelled_family(served: Series):
    """Labelled families appear only once used: the fixture must have used them, or a rule on
    them could not be checked."""
    assert served["stowage_extender_requests_total"] == {"verb", "outcome"}
    assert served["stowage_extender_request_duration_seconds_bucket"] == {"verb", "le"}
    assert served["stowage_extender_feed_failing_seconds"] == {"kind"}
    assert "stowage_extender_learned_past_unwritten_seconds" in served      # kube mode keeps a past
    assert served["stowage_extender_bound_dropped_total"] == {"bound"}
    assert served["stowage_gpu_healthy"] == {"node", "gpu", "model"}
    assert served["stowage_pod_gpu_memory_used_bytes"] == {"node", "gpu", "model", "namespace", "pod", "container"}
    assert served["stowage_exporter_up"] == {"node", "source"}
    assert "stowage_deviceplugin_record_mismatches" in served
    assert "stowage_deviceplugin_record_corrections_total" in served


# ------------------------------------------------------------------------------------ the alerts


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: a["alert"])
def test_every_alert_reads_only_served_series_and_labels(alert: dict[str, Any], served: Series):
    problems = _problems(alert["expr"], served)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: a["alert"])
def test_every_alert_annotation_names_labels_its_result_has(alert: dict[str, Any], served: Series):
    have = result_labels(alert["expr"], served)
    assert have is not None, f"{alert['alert']}: its expression's result labels cannot be worked out"
    for key, text in alert["annotations"].items():
        missing = annotation_labels(text) - have
        assert not missing, f"{alert['alert']} {key}: $labels.{missing} not on the result ({sorted(have)})"


def _doc_links(text: str) -> list[tuple[str, str]]:
    return re.findall(r"docs/([\w-]+\.md)(?:#([\w-]+))?", text)


def _anchors(md: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+\s+(.+?)\s*$", md.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("alert", ALERTS, ids=lambda a: a["alert"])
def test_every_alert_says_what_happened_and_what_to_do(alert: dict[str, Any]):
    assert re.fullmatch(r"Stowage[A-Z][A-Za-z]+", alert["alert"])
    assert alert.get("for"), "an alert without for: fires on one evaluation's blip"
    assert alert["labels"]["severity"] in SEVERITIES
    assert set(alert["annotations"]) == {"summary", "description"}
    assert len(alert["annotations"]["description"]) > len(alert["annotations"]["summary"])
    links = _doc_links(alert["annotations"]["description"])
    assert links, f"{alert['alert']}: the description points at no docs section"
    for md, anchor in links:
        path = ROOT / "docs" / md
        assert path.is_file(), f"{alert['alert']}: docs/{md} does not exist"
        assert not anchor or anchor in _anchors(path), f"{alert['alert']}: no section #{anchor} in docs/{md}"


def test_alert_and_group_names_are_unique_and_every_alert_is_documented():
    names = [a["alert"] for a in ALERTS]
    assert len(names) == len(set(names))
    (doc,) = load_docs(RULES)
    groups = [g["name"] for g in doc.body["spec"]["groups"]]
    assert len(groups) == len(set(groups))
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    section = deploy[deploy.index("\n### Alerts"):]
    section = section[:section.index("\n### ", 1)]
    undocumented = [n for n in names if f"`{n}`" not in section]
    assert not undocumented, f"docs/deploy.md#alerts does not explain {undocumented}"


def test_alert_names_and_deploy_sections_the_docs_mention_exist():
    """Docs elsewhere name alerts and link to deploy.md's monitoring sections: a renamed alert or
    heading must not leave them pointing at nothing."""
    names = {a["alert"] for a in ALERTS}
    anchors = _anchors(ROOT / "docs" / "deploy.md")
    texts = {md.name: md.read_text() for md in (ROOT / "docs").glob("*.md")}
    texts["README.md"] = (ROOT / "README.md").read_text()
    mentioned = set()
    for name, text in texts.items():
        for alert in re.findall(r"`(Stowage[A-Z][A-Za-z]+)`", text):
            mentioned.add(alert)
            assert alert in names, f"{name} names an alert {alert} that prometheusrule.yaml does not have"
        for link in re.findall(r"deploy\.md#([\w-]+)", text):
            assert link in anchors, f"{name} links to deploy.md#{link}, no such section"
    assert {"StowageLearnedPastUnwritten", "StowageExtenderBoundDropping", "StowageGpuUnhealthy"} <= mentioned


# ----------------------------------------------------------------------------------- the dashboard


@pytest.mark.parametrize("title,target", TARGETS, ids=[f"{t}/{q['refId']}" for t, q in TARGETS])
def test_every_dashboard_query_reads_only_served_series_and_labels(title: str, target: dict[str, Any],
                                                                   served: Series):
    expr = grafana_to_promql(target["expr"])
    problems = _problems(expr, served)
    assert not problems, f"{title}: " + "\n".join(problems)
    have = result_labels(expr, served)
    missing = legend_labels(target.get("legendFormat", "")) - (have or frozenset())
    assert not missing, f"{title}: the legend names {missing}, not on the result ({sorted(have or ())})"


def test_dashboard_variables_read_served_series(served: Series):
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for v in variables.values():
        if v["type"] != "query":
            continue
        query = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        parsed = parse_label_values(query)
        assert parsed, f"${v['name']}: {query!r} is not label_values(metric, label)"
        selector, label = parsed
        assert not _problems(selector, served)
        assert label in (result_labels(selector, served) or ())
    # Every $variable a query uses is defined.
    used = {m for _, t in TARGETS for m in re.findall(r"\$(\w+)", t["expr"]) if not m.startswith("__")}
    assert used <= set(variables), used - set(variables)


def test_dashboard_covers_what_an_operator_looks_at():
    """Packing, per card, per pod, the extender's requests, feed health and bounds each have a panel."""
    exprs = " ".join(t["expr"] for _, t in TARGETS)
    for needed in ("stowage_extender_free_whole_cards", "stowage_extender_healthy_cards",
                   "stowage_gpu_utilization_ratio", "stowage_gpu_memory_used_bytes",
                   "stowage_pod_gpu_utilization_ratio", "stowage_pod_gpu_memory_used_bytes",
                   "stowage_extender_requests_total", "stowage_extender_request_duration_seconds_bucket",
                   "stowage_extender_feed_failing_seconds", "stowage_extender_feed_silent_seconds",
                   "stowage_extender_bound_bytes", "stowage_extender_bound_dropped_total"):
        assert needed in exprs, needed
    dash = _dashboard()
    ids = [p["id"] for p in _panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    assert dash["uid"] and len(dash["uid"]) <= 40
    for p in _panels(dash):
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p.get("description"), f"{p['title']}: say what the panel shows"


def test_dashboard_configmap_is_rendered_from_the_json():
    """One source of truth: the ConfigMap is what render-dashboard.py makes of the JSON."""
    r = subprocess.run([sys.executable, str(MONITORING / "render-dashboard.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (doc,) = load_docs(DASHBOARD_YAML)
    assert validate(doc) == []
    body = doc.body
    assert (body["apiVersion"], body["kind"]) == ("v1", "ConfigMap")
    assert body["metadata"]["labels"]["grafana_dashboard"] == "1"    # kube-prometheus-stack's sidecar
    assert "namespace" not in body["metadata"], "applied into Grafana's namespace (-n), which differs per install"
    (data,) = body["data"].values()
    assert json.loads(data) == _dashboard()


def test_render_check_fails_when_the_yaml_lags_the_json(tmp_path: Path):
    for name in ("render-dashboard.py", "grafana-dashboard.json", "grafana-dashboard.yaml"):
        (tmp_path / name).write_bytes((MONITORING / name).read_bytes())
    dash = _dashboard()
    dash["title"] = "edited in the JSON only"
    (tmp_path / "grafana-dashboard.json").write_text(json.dumps(dash, indent=2))
    script = [sys.executable, str(tmp_path / "render-dashboard.py")]
    assert subprocess.run(script + ["--check"], capture_output=True, timeout=60).returncode == 1
    assert subprocess.run(script, capture_output=True, timeout=60).returncode == 0
    assert subprocess.run(script + ["--check"], capture_output=True, timeout=60).returncode == 0
    assert "edited in the JSON only" in (tmp_path / "grafana-dashboard.yaml").read_text()


# ------------------------------------------------------------------------------- how to apply them


def test_monitoring_objects_stay_out_of_the_base_install_and_say_how_to_apply():
    """They need the Prometheus operator's CRDs (the rule) or a Grafana sidecar (the ConfigMap): the
    base kustomization must not include them, and its comments and docs/deploy.md say how."""
    kust_text = (CONFIG / "kustomization.yaml").read_text()
    (kust,) = load_docs(CONFIG / "kustomization.yaml")
    assert not any(r.startswith("monitoring") for r in kust.body["resources"])
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    for f in ("monitoring/prometheusrule.yaml", "monitoring/grafana-dashboard.yaml"):
        assert f in kust_text, f"kustomization.yaml's comments do not mention {f}"
        assert f"kubectl apply -f scheduler-config/{f}" in deploy or \
            f"kubectl apply -n monitoring -f scheduler-config/{f}" in deploy, f
    assert "grafana-dashboard.json" in deploy


def test_the_rule_validator_catches_rule_typos():
    (doc,) = load_docs(RULES)
    rule = doc.body["spec"]["groups"][0]["rules"][0]
    rule["for_"] = rule.pop("for")
    errs = validate(doc)
    assert any("rules[0].for_: unknown field" in e for e in errs), errs
    (doc,) = load_docs(RULES)
    doc.body["spec"]["groups"][0]["rules"][0]["record"] = "x"
    assert any("exactly one of the two" in e for e in validate(doc))
    (doc,) = load_docs(RULES)
    doc.body["spec"]["groups"][0]["rules"][0]["labels"]["severity"] = 3
    assert any("labels.severity: expected a string" in e for e in validate(doc))


# ---------------------------------------------------------------------------- the checker can fail

TOY: Series = {
    "req_total": frozenset({"verb", "outcome"}),
    "lat_bucket": frozenset({"verb", "le"}),
    "failing_seconds": frozenset({"kind"}),
    "stale_after_seconds": frozenset(),
    "card_healthy": frozenset({"node", "gpu"}),
    "pod_mem": frozenset({"node", "gpu", "pod"}),
}


@pytest.mark.parametrize("expr,fragment", [
    ("card_healty == 0", "metric 'card_healty' is not served"),
    ('req_total{outcom="ok"}', "label 'outcom' (matcher of req_total)"),
    ("sum by (verb) (rate(req_total[5m])) / on (outcome) sum by (verb) (rate(req_total[5m]))",
     "label 'outcome' (/ on(...), left side)"),
    ("sum by (nodes) (card_healthy)", "label 'nodes' (sum by)"),
    ("count without (gpus) (card_healthy)", "label 'gpus' (count without)"),
    ("histogram_quantile(0.99, sum by (verb) (rate(lat_bucket[5m])))", "histogram_quantile needs the buckets' le"),
    ("failing_seconds > stale_after_seconds", "matches on labels the two sides do not share"),
    ("failing_seconds > ignoring(kind) group_left(kind) stale_after_seconds", "group_left(...), the right side"),
    ("card_healthy unless on (gpu, pod) pod_mem", "label 'pod' (unless on(...), left side)"),
    ("sum(rate(req_total[5m]) by (verb)", "does not parse as PromQL"),
    ('{outcome="ok"}', "names no metric"),
])
def test_the_checker_reports_what_would_silently_match_nothing(expr: str, fragment: str):
    problems = check_expr(expr, TOY).problems
    assert any(fragment in p for p in problems), problems


@pytest.mark.parametrize("expr,labels", [
    ("failing_seconds > ignoring(kind) group_left stale_after_seconds", {"kind", "instance", "job"}),
    ('sum by (verb) (rate(req_total{outcome!="ok"}[5m])) / sum by (verb) (rate(req_total[5m])) > 0.05', {"verb"}),
    ("histogram_quantile(0.99, sum by (verb, le) (rate(lat_bucket[5m])))", {"verb"}),
    ("count by (node) (card_healthy == 1 unless on (gpu) pod_mem)", {"node"}),
    ("absent(card_healthy)", set()),
    ('label_replace(card_healthy, "host", "$1", "node", "(.*)")', {"node", "gpu", "host", "instance", "job"}),
])
def test_the_checker_passes_sound_expressions_and_knows_their_labels(expr: str, labels: set[str]):
    assert check_expr(expr, TOY).problems == []
    assert result_labels(expr, TOY) == labels


def test_a_misspelt_series_in_our_own_rules_is_caught(served: Series):
    """The same check the rule tests make, on a copy of a shipped alert with one letter gone."""
    (expr,) = [a["expr"] for a in ALERTS if a["alert"] == "StowageGpuUnhealthy"]
    assert _problems(expr, served) == []
    broken = expr.replace("stowage_gpu_healthy", "stowage_gpu_health")
    assert any("'stowage_gpu_health' is not served" in p for p in _problems(broken, served))
    (expr,) = [a["expr"] for a in ALERTS if a["alert"] == "StowageExtenderFeedStale"]
    assert any("matches on labels" in p for p in _problems(expr.replace("ignoring(kind) group_left", ""), served))
