"""Every YAML under scheduler-config/ parses and names only real fields; the validator catches typos.

The validator itself (tests/manifest_validation.py) is tested here against broken copies of our
own manifests: a test suite that cannot fail on a misspelled field would prove nothing.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from manifest_validation import CUSTOM_KINDS, Doc, iter_yaml_files, load_docs, load_text_docs, model_class, validate

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "scheduler-config"
YAML_FILES = list(iter_yaml_files(CONFIG))


def _rel(p: Path) -> str:
    return str(p.relative_to(CONFIG))


def test_scheduler_config_dir_has_the_expected_files():
    names = {_rel(p) for p in YAML_FILES}
    for expected in ("kustomization.yaml", "scheduler-config.yaml", "rbac.yaml", "scheduler.yaml", "exporter.yaml",
                     "namespace.yaml", "monitoring/servicemonitor.yaml",
                     "monitoring/prometheusrule.yaml", "monitoring/grafana-dashboard.yaml",
                     "autoscaling/prometheus-adapter-config.yaml", "examples/model-serving-whole-gpu.yaml",
                     "examples/model-serving-shared-gpu.yaml", "examples/model-serving-keda.yaml",
                     "examples/training-job-4gpu.yaml"):
        assert expected in names


@pytest.mark.parametrize("path", YAML_FILES, ids=_rel)
def test_every_yaml_parses_and_names_only_real_fields(path: Path):
    docs = load_docs(path)
    assert docs, f"{_rel(path)} holds no document"
    problems = [e for d in docs for e in validate(d)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", YAML_FILES, ids=_rel)
def test_no_duplicate_objects_in_a_file(path: Path):
    seen = set()
    for d in load_docs(path):
        if not d.kind:
            continue
        key = (d.body.get("apiVersion"), d.kind, (d.body.get("metadata") or {}).get("namespace"), d.name)
        assert key not in seen, f"{d.where}: {key} defined twice"
        seen.add(key)


def _yaml_blocks(md: Path) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", md.read_text(), flags=re.S)


@pytest.mark.parametrize("md", ["deploy.md", "autoscaling.md"])
def test_yaml_snippets_in_docs_are_valid_too(md: str):
    path = ROOT / "docs" / md
    blocks = _yaml_blocks(path)
    assert blocks, f"docs/{md} shows no yaml"
    problems = []
    for i, block in enumerate(blocks):
        for d in load_text_docs(block, f"docs/{md}#yaml{i}"):
            # A snippet of a file we ship (e.g. part of the adapter config) is checked as that file.
            if "kind" not in d.body and "rules" in d.body:
                d = Doc(Path("prometheus-adapter-snippet.yaml"), d.index, d.body)
            problems += validate(d)
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------- the validator can fail


def _doc(rel: str, kind: str, name: str | None = None) -> Doc:
    for d in load_docs(CONFIG / rel):
        if d.kind == kind and (name is None or d.name == name):
            return Doc(d.path, d.index, copy.deepcopy(d.body))
    raise AssertionError(f"no {kind} {name or ''} in {rel}")


def _errors_after(doc: Doc, mutate) -> list[str]:
    assert validate(doc) == [], "the unmodified document must be valid for this test to mean anything"
    mutate(doc.body)
    return validate(doc)


def test_misspelled_container_field_is_caught():
    d = _doc("scheduler.yaml", "Deployment")
    errs = _errors_after(d, lambda b: b["spec"]["template"]["spec"]["containers"][1].update(
        {"readinesProbe": b["spec"]["template"]["spec"]["containers"][1].pop("readinessProbe")}))
    assert any("containers[1].readinesProbe: unknown field of V1Container" in e for e in errs), errs


def test_misspelled_deep_field_is_caught_with_its_path():
    d = _doc("scheduler.yaml", "Deployment")
    errs = _errors_after(d, lambda b: b["spec"]["template"]["spec"]["volumes"][0]["configMap"].update({"nmae": "x"}))
    assert any("spec.template.spec.volumes[0].configMap.nmae: unknown field of V1ConfigMapVolumeSource" in e
               for e in errs), errs


def test_wrong_scalar_types_are_caught():
    d = _doc("exporter.yaml", "DaemonSet")
    def mutate(b):
        c = b["spec"]["template"]["spec"]["containers"][0]
        c["env"].append({"name": "N", "value": 3})          # env values are strings
        c["ports"][0]["containerPort"] = "9400"             # ports are integers
        b["spec"]["template"]["spec"]["hostPID"] = "yes"    # booleans are booleans
    errs = _errors_after(d, mutate)
    assert any("env[3].value: expected a string" in e for e in errs), errs
    assert any("ports[0].containerPort: expected an integer" in e for e in errs), errs
    assert any("hostPID: expected true/false" in e for e in errs), errs


def test_numeric_quantities_are_accepted_but_numeric_annotations_are_not():
    d = _doc("examples/model-serving-shared-gpu.yaml", "Deployment")
    limits = d.body["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert isinstance(limits["nvidia.com/gpu-memory"], int)  # YAML number: valid for resource.Quantity
    errs = _errors_after(d, lambda b: b["spec"]["template"]["metadata"]["annotations"].update(
        {"stowage.io/min-card-memory": 80}))
    assert any("annotations.stowage.io/min-card-memory: expected a string" in e for e in errs), errs


def test_missing_required_field_and_bad_enum_are_caught():
    d = _doc("scheduler.yaml", "Deployment")
    errs = _errors_after(d, lambda b: b["spec"]["template"]["spec"]["containers"][0].pop("name"))
    assert errs and "name" in errs[0]
    d = _doc("scheduler.yaml", "Deployment")
    errs = _errors_after(d, lambda b: b["spec"]["template"]["spec"]["containers"][1].update(
        {"imagePullPolicy": "Sometimes"}))
    assert any("imagePullPolicy: 'Sometimes' is not one of" in e for e in errs), errs


def test_hpa_typos_are_caught():
    d = _doc("examples/model-serving-whole-gpu.yaml", "HorizontalPodAutoscaler")
    errs = _errors_after(d, lambda b: b["spec"]["behavior"]["scaleDown"].update(
        {"stabilisationWindowSeconds": b["spec"]["behavior"]["scaleDown"].pop("stabilizationWindowSeconds")}))
    assert any("scaleDown.stabilisationWindowSeconds: unknown field of V2HPAScalingRules" in e for e in errs), errs
    d = _doc("examples/model-serving-whole-gpu.yaml", "HorizontalPodAutoscaler")
    errs = _errors_after(d, lambda b: b["spec"]["metrics"][0]["pods"]["target"].update({"type": "AveragValue"}))
    assert any("is not one of AverageValue, Utilization, Value" in e for e in errs), errs


def test_wrong_group_for_a_builtin_kind_is_caught():
    assert model_class("apps/v1", "Deployment").__name__ == "V1Deployment"
    assert model_class("autoscaling/v2", "HorizontalPodAutoscaler").__name__ == "V2HorizontalPodAutoscaler"
    assert model_class("apps/v1", "Job") is None
    d = _doc("examples/training-job-4gpu.yaml", "Job")
    errs = _errors_after(d, lambda b: b.update({"apiVersion": "apps/v1"}))
    assert errs and "unknown apiVersion/kind apps/v1 Job" in errs[0]


def test_scheduler_config_typos_are_caught():
    d = _doc("scheduler-config.yaml", "KubeSchedulerConfiguration")
    errs = _errors_after(d, lambda b: b["extenders"][0].update({"nodeCachCapable": True}))
    assert any("extenders[0].nodeCachCapable: unknown field" in e for e in errs), errs
    d = _doc("scheduler-config.yaml", "KubeSchedulerConfiguration")
    errs = _errors_after(d, lambda b: b["extenders"][0].update(
        {"managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": "no"}]}))
    assert any("ignoredByScheduler: expected true/false" in e for e in errs), errs
    d = _doc("scheduler-config.yaml", "KubeSchedulerConfiguration")
    errs = _errors_after(d, lambda b: b["extenders"][0].update({"httpTimeout": "5 seconds"}))
    assert any("httpTimeout: '5 seconds' is not a duration" in e for e in errs), errs
    d = _doc("scheduler-config.yaml", "KubeSchedulerConfiguration")
    errs = _errors_after(d, lambda b: b["profiles"][0]["pluginConfig"][0]["args"]["scoringStrategy"].update(
        {"type": "MostAlocated"}))
    assert any("scoringStrategy.type: 'MostAlocated' is not one of" in e for e in errs), errs


def test_custom_kind_typos_are_caught():
    d = _doc("monitoring/servicemonitor.yaml", "ServiceMonitor")
    errs = _errors_after(d, lambda b: b["spec"]["endpoints"][0].update({"honourLabels": True}))
    assert any("endpoints[0].honourLabels: unknown field" in e for e in errs), errs
    d = _doc("examples/model-serving-keda.yaml", "ScaledObject")
    errs = _errors_after(d, lambda b: b["spec"]["triggers"][0]["metadata"].update({"serverAdress": "x"}))
    assert any("metadata.serverAdress: unknown prometheus trigger parameter" in e for e in errs), errs
    d = _doc("examples/model-serving-keda.yaml", "ScaledObject")
    errs = _errors_after(d, lambda b: b["spec"]["triggers"][0]["metadata"].update({"threshold": 0.6}))
    assert any("metadata.threshold: expected a string" in e for e in errs), errs
    d = _doc("kustomization.yaml", "Kustomization")
    errs = _errors_after(d, lambda b: b.update({"resource": b["resources"]}))
    assert any(".resource: unknown field" in e for e in errs), errs


def test_adapter_config_typos_are_caught():
    (d,) = load_docs(CONFIG / "autoscaling" / "prometheus-adapter-config.yaml")
    d = Doc(d.path, 0, copy.deepcopy(d.body))
    errs = _errors_after(d, lambda b: b["rules"][0].update({"metricQuery": b["rules"][0].pop("metricsQuery")}))
    assert any("rules[0].metricQuery: unknown field" in e for e in errs), errs
    assert any("rules[0]: missing required field metricsQuery" in e for e in errs), errs


def test_unknown_kinds_and_non_mappings_are_rejected():
    assert validate(Doc(Path("x.yaml"), 0, {"apiVersion": "example.com/v1", "kind": "Widget",
                                            "metadata": {"name": "w"}}))[0].startswith("x.yaml[0]: unknown apiVersion/kind")
    assert "must be a mapping" in validate(Doc(Path("x.yaml"), 0, ["a", "b"]))[0]
    assert "missing apiVersion/kind" in validate(Doc(Path("x.yaml"), 0, {"metadata": {"name": "x"}}))[0]
    assert ("kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration") in CUSTOM_KINDS


def test_yaml_syntax_errors_are_reported(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: [unclosed\n")
    with pytest.raises(yaml.YAMLError):
        load_docs(bad)
