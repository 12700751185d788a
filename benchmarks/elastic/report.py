"""Tables, CSV/JSON and the plot of the elastic scenario."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from .sim import ElasticResult

COLUMNS = [
    ("policy", "policy"),
    ("scale-outs found room", lambda s: f"{s['scale_outs_found_room']}/{s['scale_outs']} ({s['scale_outs_found_room_pct']:.1f}%)"),
    ("stayed Pending", "scale_outs_stayed_pending"),
    ("replicas late/never", lambda s: f"{s['replicas_placed_later']}/{s['replicas_never_placed']}"),
    ("time-to-place mean/p95/max s", lambda s: f"{s['time_to_place_mean_s']:.0f}/{s['time_to_place_p95_s']:.0f}/{s['time_to_place_max_s']:.0f}"),
    ("pending replica-h", "pending_replica_hours"),
    ("jobs never placed", "jobs_never_placed"),
    ("releasable node-h", lambda s: f"{s['releasable_node_hours']:.0f} ({s['releasable_pct_of_node_hours']:.1f}%)"),
    ("releasable GPU-h", lambda s: f"{s['releasable_gpu_hours']:.0f} ({s['releasable_pct_of_gpu_hours']:.1f}%)"),
    ("GPU alloc %", "mean_gpu_alloc_pct"),
    ("run s", "seconds"),
]


def format_table(summaries: list[dict]) -> str:
    head = [c for c, _ in COLUMNS]
    rows = [[(f(s) if callable(f) else str(s[f])) for _, f in COLUMNS] for s in summaries]
    widths = [max(len(h), *(len(r[j]) for r in rows)) if rows else len(h) for j, h in enumerate(head)]
    line = lambda vals: "  ".join(v.ljust(widths[j]) if j == 0 else v.rjust(widths[j]) for j, v in enumerate(vals))
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def write_outputs(results: list[ElasticResult], meta: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    summaries = [r.summary() for r in results]
    paths = []
    p = out / "elastic.csv"
    with p.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(summaries[0]))
        w.writeheader()
        w.writerows(summaries)
    paths.append(p)
    p = out / "elastic.json"
    p.write_text(json.dumps({"meta": meta, "results": summaries,
                             "timelines": {f"{r.policy}/{r.seed}": r.timeline for r in results},
                             "learned": {f"{r.policy}/{r.seed}": r.learned for r in results}}, indent=1))
    paths.append(p)
    p = out / "elastic.png"
    plot(results, meta, p)
    paths.append(p)
    return paths


def plot(results: list[ElasticResult], meta: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    results = list(results[1:]) + list(results[:1])  # the first policy (the pack default) drawn last, on top
    for r in results:
        t = r.timeline
        label = r.policy if len({x.seed for x in results}) == 1 else f"{r.policy} (seed {r.seed})"
        axes[0].plot(t["hour"], t["alloc_pct"], lw=0.8, label=label)
        pending = [r + j for r, j in zip(t["pending_replicas"], t.get("pending_jobs", [0.0] * len(t["hour"])))]
        axes[1].plot(t["hour"], pending, lw=0.8, label=label)
        axes[2].plot(t["hour"], t.get("releasable_gpus", t["releasable_nodes"]), lw=0.8, label=label)
    axes[0].set_ylabel("GPU allocated %")
    axes[1].set_ylabel("Pending pods\n(replicas + trace jobs)")
    axes[2].set_ylabel("GPUs on nodes\nempty >= 10 min")
    axes[2].set_xlabel("hours into the window")
    axes[0].set_title(f"Elastic scenario: {meta.get('deployments')} HPA deployments + trace jobs on "
                      f"{meta.get('nodes')} nodes / {meta.get('gpus')} GPUs ({meta.get('trace')} trace, "
                      f"{meta.get('days')} days)")
    axes[0].legend(fontsize=7, ncol=4, loc="lower right")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
