"""Issue 12, item 5: crafted NodeNames cannot make the extender's memos of recent node lists keep
memory. The memos exist for kube-scheduler's node lists (~150 KB of names at 10,000 nodes); a
list of a million made-up names, or a few huge names, must not be kept, and what stays after
any number of crafted requests is bounded in bytes."""
from __future__ import annotations

import gc
import tracemalloc

import orjson

from extender.app import create_app
from extender_harness import gpus, model_from
from extender.service import ExtenderService
from extender.wirememo import MAX_NAMES

POD = {"metadata": {"name": "p", "namespace": "default", "uid": "uid-1"},
       "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def test_crafted_node_lists_do_not_stay_in_memory():
    model = model_from({"nodes": [{"name": f"node-{i}", "gpus": gpus("Tesla T4", 4, "16Gi")} for i in range(100)]})
    app = create_app(ExtenderService(model))
    verbs = app.extensions["stowage"]["verbs"]
    real = orjson.dumps({"Pod": POD, "NodeNames": [f"node-{i}" for i in range(100)]})
    assert verbs.handle("filter", real).status == 200
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for k in range(6):
            if k % 2:   # many short names: more list entries than a memo keeps (MAX_NAMES)
                names = [f"{k}-{i}" for i in range(MAX_NAMES + 10_000)]
            else:       # few huge names (4 MiB of JSON)
                names = [f"{k}-{i}-" + "x" * (1 << 20) for i in range(4)]
            body = orjson.dumps({"Pod": POD, "NodeNames": names})
            del names
            reply = verbs.handle("filter", body)
            assert reply.status == 200 and b"node unknown to Stowage" in reply.body
            for _ in range(2):  # and again, as kube-scheduler would repeat a list
                assert verbs.handle("filter", body).status == 200
            del body, reply
        gc.collect()
        kept_mib = (tracemalloc.get_traced_memory()[0] - base) / (1 << 20)
    finally:
        tracemalloc.stop()
    print(f"memory kept after 6 crafted node lists: {kept_mib:.1f} MiB")
    assert kept_mib < 8, f"{kept_mib:.0f} MiB kept"
    # kube-scheduler's own lists are still remembered.
    assert verbs.handle("filter", real).status == 200
