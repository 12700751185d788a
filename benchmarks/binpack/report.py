"""Aggregating seed runs into the published format, and writing tables, CSV/JSON and the plot.

Per policy and trace: each seed's per-bin mean allocation, then the median over seeds — the
paper's statistic — reported at arrived 90/95/100/110/120/130 % beside the paper's own figure.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPORT_POINTS = (90, 95, 100, 110, 120, 130)
TABLE_POINTS = (90, 95, 100, 110, 130)
# Our placer name -> the label of the same policy in published_fgd_results.csv.
PUBLISHED_LABEL = {"random": "01-Random", "bestfit": "05-BestFit", "fgd": "06-FGD"}
CALIBRATION_TOLERANCE = 0.5


@dataclass
class PolicyResult:
    trace: str
    policy: str
    curves: np.ndarray             # [S, B] per-seed binned allocation %
    seconds: float                 # total replay time over all seeds
    failed: list[int] = field(default_factory=list)

    @property
    def median(self) -> np.ndarray:
        with np.errstate(all="ignore"):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                return np.nanmedian(self.curves, axis=0)

    def at(self, pct: int) -> float:
        m = self.median
        return float(m[pct]) if pct < len(m) else float("nan")


def load_published(path: Path) -> dict[tuple[str, str, int], float]:
    """(workload, label, arrived %) -> published median allocation %; empty if the file is absent."""
    if not path.is_file():
        return {}
    out = {}
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            try:
                out[(r["workload"], r["policy"], int(r["arrived_pct"]))] = float(r["alloc_median"])
            except (KeyError, ValueError):
                continue
    return out


def published_for(pub: dict, trace: str, policy: str, pct: int) -> float | None:
    label = PUBLISHED_LABEL.get(policy)
    return pub.get((trace, label, pct)) if label else None


def rows(results: list[PolicyResult], pub: dict) -> list[dict]:
    out = []
    for r in results:
        for pct in REPORT_POINTS:
            ours = r.at(pct)
            p = published_for(pub, r.trace, r.policy, pct)
            out.append({"trace": r.trace, "policy": r.policy, "arrived_pct": pct,
                        "alloc_pct": round(ours, 3), "unalloc_pct": round(100 - ours, 3),
                        "published_alloc_pct": p, "diff_vs_published": None if p is None else round(ours - p, 3),
                        "seeds": int(r.curves.shape[0]), "seconds": round(r.seconds, 2),
                        "failed_pods_mean": float(np.mean(r.failed)) if r.failed else 0.0})
    return out


def calibration(results: list[PolicyResult], pub: dict) -> list[tuple[str, str, int, float, float, bool]]:
    """(trace, policy, pct, ours, published, within tolerance) for every reference figure we have."""
    out = []
    for r in results:
        for pct in REPORT_POINTS:
            p = published_for(pub, r.trace, r.policy, pct)
            if p is not None:
                ours = r.at(pct)
                out.append((r.trace, r.policy, pct, ours, p, abs(ours - p) <= CALIBRATION_TOLERANCE))
    return out


def format_table(results: list[PolicyResult], pub: dict, note: str = "[published]") -> str:
    """One block per trace: allocation % (unallocated %) per policy, published figure beside;
    ``note`` ends each block's heading (what the brackets hold, or why there are none)."""
    lines = []
    for trace in dict.fromkeys(r.trace for r in results):
        lines.append(f"\n== trace {trace}: GPU allocation % (unallocated %) at arrived %; {note} ==")
        head = f"{'policy':<18}" + "".join(f"{p:>24}" for p in TABLE_POINTS) + f"{'runtime':>10}"
        lines.append(head)
        for r in sorted((r for r in results if r.trace == trace), key=lambda r: -r.at(100)):
            cells = []
            for pct in TABLE_POINTS:
                v = r.at(pct)
                p = published_for(pub, trace, r.policy, pct)
                cell = f"{v:6.2f} ({100 - v:5.2f})" + (f" [{p:6.2f}]" if p is not None else " " * 9)
                cells.append(f"{cell:>24}")
            lines.append(f"{r.policy:<18}" + "".join(cells) + f"{r.seconds:>9.1f}s")
    return "\n".join(lines)


def write_outputs(results: list[PolicyResult], pub: dict, out: Path, meta: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    table = rows(results, pub)
    csv_path = out / "binpack_results.csv"
    with csv_path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    curves = {f"{r.trace}/{r.policy}": [None if np.isnan(x) else round(float(x), 3) for x in r.median]
              for r in results}
    json_path = out / "binpack_results.json"
    json_path.write_text(json.dumps({"meta": meta, "rows": table, "median_curves": curves,
                                     "calibration": [dict(zip(("trace", "policy", "arrived_pct", "ours", "published", "ok"),
                                                              (t, p, pc, round(o, 3), pb, ok)))
                                                     for t, p, pc, o, pb, ok in calibration(results, pub)]},
                                    indent=1))
    png_path = out / "binpack_unallocated.png"
    plot(results, png_path)
    return [csv_path, json_path, png_path]


def plot(results: list[PolicyResult], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(r.trace for r in results))
    fig, axes = plt.subplots(1, len(traces), figsize=(5.2 * len(traces), 4.2), squeeze=False, sharey=True)
    for ax, trace in zip(axes[0], traces):
        for r in sorted((r for r in results if r.trace == trace), key=lambda r: r.policy):
            m = r.median
            x = np.arange(len(m))
            keep = (x >= 80) & ~np.isnan(m)
            style = dict(lw=2.4, color="black") if r.policy == "stowage" else dict(lw=1.2)
            ax.plot(x[keep], 100 - m[keep], label=r.policy, **style)
        ax.set_title(f"openb {trace}")
        ax.set_xlabel("arrived workload (% of GPU capacity)")
        ax.set_ylim(0, 20)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("GPUs unallocated (%)")
    axes[0][-1].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
