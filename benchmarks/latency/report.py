"""Summaries of a run (percentiles, rates, ratios to the do-nothing floor), the table, CSV and JSON."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from stowage.textable import render

from .client import ClientResult

# Figures compared with the floor (higher is worse for all of them except pods/s).
RATIO_KEYS = ("filter_p50_ms", "filter_p99_ms", "prioritize_p50_ms", "prioritize_p99_ms", "bind_p50_ms",
              "bind_p99_ms", "fp_p99_ms", "pods_per_s", "cpu_ms_per_pod", "peak_mib")


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarise(size: int, variant: str, mode: str, results: list[ClientResult], cpu_s: float, peak_mib: float,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One row: client-side latencies, end-to-end rate, the server's CPU and peak memory."""
    cat = lambda name: [v for r in results for v in getattr(r, name)]  # noqa: E731
    placed = sum(r.placed for r in results)
    wall = max(r.end for r in results) - min(r.start for r in results)
    row: dict[str, Any] = {"nodes": size, "variant": variant, "mode": mode, "clients": len(results)}
    for verb in ("filter", "prioritize", "bind"):
        row[f"{verb}_p50_ms"] = _pct(cat(f"{verb}_ms"), 50)
        row[f"{verb}_p99_ms"] = _pct(cat(f"{verb}_ms"), 99)
        row[f"{verb}_n"] = len(cat(f"{verb}_ms"))
    row["fp_p50_ms"] = _pct(cat("fp_ms"), 50)
    row["fp_p99_ms"] = _pct(cat("fp_ms"), 99)
    row["placed"] = placed
    row["unschedulable"] = sum(r.unschedulable for r in results)
    row["bind_refused"] = sum(r.bind_refused for r in results)
    row["wall_s"] = wall
    row["pods_per_s"] = placed / wall if wall > 0 else None
    row["server_cpu_s"] = cpu_s
    row["cpu_ms_per_pod"] = cpu_s * 1e3 / placed if placed else None
    row["peak_mib"] = peak_mib
    row["client_cpu_ms_per_pod"] = sum(r.client_cpu_s for r in results) * 1e3 / max(placed, 1)
    row["errors"] = [e for r in results for e in r.errors]
    row.update(extra or {})
    return row


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """``<key>_x_floor`` on every non-floor row: its figure over the floor's (same size, mode and
    number of gunicorn workers)."""
    key = lambda r: (r["nodes"], r["mode"], r.get("workers", 1))  # noqa: E731
    floors = {key(r): r for r in rows if r["variant"] == "floor"}
    for r in rows:
        f = floors.get(key(r))
        if r["variant"] == "floor" or f is None:
            continue
        for k in RATIO_KEYS:
            if r.get(k) is not None and f.get(k):
                r[f"{k}_x_floor"] = r[k] / f[k]


def _cell(r: dict[str, Any], key: str, fmt: str = "{:.2f}") -> str | None:
    v = r.get(key)
    if v is None:
        return None
    s = fmt.format(v)
    ratio = r.get(f"{key}_x_floor")
    return f"{s} ({ratio:.1f}x)" if ratio is not None else s


COLUMNS = [
    ("filter p50/p99 ms", lambda r: f"{_cell(r, 'filter_p50_ms')} / {_cell(r, 'filter_p99_ms')}"),
    ("prioritize p50/p99 ms", lambda r: f"{_cell(r, 'prioritize_p50_ms')} / {_cell(r, 'prioritize_p99_ms')}"),
    ("bind p50/p99 ms", lambda r: f"{_cell(r, 'bind_p50_ms')} / {_cell(r, 'bind_p99_ms')}"),
    ("filter+prio p99 ms", lambda r: _cell(r, "fp_p99_ms")),
    ("pods/s", lambda r: _cell(r, "pods_per_s", "{:.0f}")),
    ("CPU ms/pod", lambda r: _cell(r, "cpu_ms_per_pod")),
    ("peak MiB", lambda r: _cell(r, "peak_mib", "{:.0f}")),
    ("placed", lambda r: f"{r['placed']}" + (f" ({r['bind_refused']} retried)" if r["bind_refused"] else "")),
]


def format_table(rows: list[dict[str, Any]]) -> str:
    head = ["nodes", "workers", "extender", "mode"] + [c for c, _ in COLUMNS]
    body = [[r["nodes"], r.get("workers", 1), r["variant"], r["mode"]] + [f(r) for _, f in COLUMNS] for r in rows]
    return render(head, body)


def write_outputs(rows: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    p = out / "latency.json"
    p.write_text(json.dumps({"meta": meta, "results": rows}, indent=1, default=str))
    paths.append(p)
    p = out / "latency.csv"
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys and k != "errors"]
    with p.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    paths.append(p)
    return paths
