"""The model's own memory for a big cluster, measured with tracemalloc in a fresh process.

tracemalloc sees numpy's array buffers as well as Python objects, so "traced memory still held
after the cluster description is dropped" is exactly what the :class:`ClusterModel` keeps:
card arrays, the node index, per-node metadata (card UUIDs and model names).
"""
from __future__ import annotations

import gc
import json
import subprocess
import sys
import tracemalloc


def measure(nodes: int) -> dict[str, float]:
    from packing.model import ClusterModel
    from extender.simcluster import parse_cluster

    from .cluster import cluster_doc

    tracemalloc.start()
    cluster = parse_cluster(cluster_doc(nodes), "bench")
    model = ClusterModel()
    cluster.populate(model)
    cards = cluster.card_count
    del cluster
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    arrays = sum(getattr(model.a, f).nbytes for f in model.a.__dataclass_fields__)
    return {"nodes": nodes, "cards": cards, "model_mib": current / 2**20, "arrays_mib": arrays / 2**20,
            "peak_while_building_mib": peak / 2**20}


def measure_in_subprocess(nodes: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "benchmarks.latency.memory", str(nodes)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]))))
