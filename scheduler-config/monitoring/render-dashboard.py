#!/usr/bin/env python3
"""Write grafana-dashboard.yaml (the ConfigMap Grafana's sidecar loads) from grafana-dashboard.json.

grafana-dashboard.json is the one source of truth: edit it (or export it from Grafana after
editing there), then run `python3 scheduler-config/monitoring/render-dashboard.py`. The JSON is
kept as its own file so that it can be read, diffed and imported into Grafana by hand
(Dashboards > New > Import); the ConfigMap only wraps it. `--check` exits 1 when the YAML is not
what the JSON gives (tests/test_monitoring_rules.py runs it), so the two cannot drift apart.

Standard library only: it runs wherever Python 3 does, without the project installed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "grafana-dashboard.json"
TARGET = HERE / "grafana-dashboard.yaml"
NAME = "stowage-grafana-dashboard"
KEY = "stowage-gpu-packing.json"

HEADER = """\
# GENERATED from grafana-dashboard.json by render-dashboard.py: edit the JSON, then run
#   python3 scheduler-config/monitoring/render-dashboard.py
#
# The Stowage Grafana dashboard as a ConfigMap for kube-prometheus-stack's Grafana sidecar, which
# loads every ConfigMap labelled grafana_dashboard: "1" in the namespaces it searches (by default
# Grafana's own namespace only: sidecar.dashboards.searchNamespace). So it names no namespace:
# apply it into Grafana's, e.g.
#   kubectl apply -n monitoring -f scheduler-config/monitoring/grafana-dashboard.yaml
# Without the sidecar, import grafana-dashboard.json in Grafana (Dashboards > New > Import).
# It reads the series of the extender, the exporter and the device plugin that servicemonitor.yaml
# has Prometheus scrape; docs/deploy.md#dashboard says what each row shows.
"""


def render(dashboard_json: str) -> str:
    """The ConfigMap's YAML text for the dashboard JSON (checked to parse; key order kept)."""
    dashboard = json.loads(dashboard_json)
    body = json.dumps(dashboard, indent=2, ensure_ascii=False)
    indented = "\n".join(("    " + line) if line else "" for line in body.splitlines())
    return (HEADER
            + "apiVersion: v1\n"
            + "kind: ConfigMap\n"
            + "metadata:\n"
            + f"  name: {NAME}\n"
            + "  labels:\n"
            + '    grafana_dashboard: "1"\n'
            + "    app.kubernetes.io/name: stowage\n"
            + "    app.kubernetes.io/part-of: stowage\n"
            + "data:\n"
            + f"  {KEY}: |\n"
            + indented + "\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if grafana-dashboard.yaml differs from what the JSON gives")
    args = parser.parse_args(argv)
    text = render(SOURCE.read_text(encoding="utf-8"))
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET.name} is not what {SOURCE.name} gives: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
