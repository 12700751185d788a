"""``python -m benchmarks.latency.inproc``: the extender's own cost per pod, without HTTP.

Why: the HTTP benchmark's figures mix three costs — the HTTP server and client, Flask/WSGI,
and Stowage's decisions — on a shared 2-core machine. This builds the same cluster, prefill
and pods as :mod:`benchmarks.latency.cli` in ONE process and replays the client's sequence
(filter with every node, prioritize with the passing ones, bind to the best) three ways:

- ``service``: :class:`~extender.service.ExtenderService` calls only (bodies parsed beforehand);
- ``wire``: parse the pre-encoded body + service + encode the answer (what a view does);
- ``wsgi``: the Flask app called as gunicorn calls it (``app(environ, start_response)``),
  i.e. everything but the socket and gunicorn's HTTP parsing.

Each pod is placed once per mode on a fresh model so the three see the same requests.
Prints p50/p99 per verb and mean ms per pod. Optional ``--profile FILE`` writes a cProfile of
the last mode's run (read it with ``python -m pstats``).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import time
from typing import Any, Callable

import numpy as np
import orjson

from extender.app import create_app
from packing.model import ClusterModel
from extender.service import ExtenderService
from extender.simcluster import parse_cluster
from extender.wire import (binding_result, encode, parse_binding_args, parse_extender_args)

from ..cliargs import MAX_NODES, MAX_PODS, HelpFormatter, name_list, whole_number
from . import cluster


def _service(n: int) -> ExtenderService:
    sim = parse_cluster(cluster.cluster_doc(n), "<bench>")
    model = ClusterModel()
    sim.populate(model)
    return ExtenderService(model, memory_unit_mib=sim.memory_unit_mib)


def _prefill(svc: ExtenderService, n: int, seed: int) -> None:
    for node, pod in cluster.prefill_plan(n, seed):
        svc.filter(parse_extender_args({"Pod": pod, "NodeNames": [node]}))
        m = pod["metadata"]
        svc.bind(parse_binding_args({"PodName": m["name"], "PodNamespace": m["namespace"],
                                     "PodUID": m["uid"], "Node": node}))


def _args_body(pod_json: bytes, names_json: bytes) -> bytes:
    return b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + names_json + b"}"


def _wsgi_caller(app) -> Callable[[str, bytes], bytes]:
    def call(path: str, body: bytes) -> bytes:
        env = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
               "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8888", "SERVER_PROTOCOL": "HTTP/1.1",
               "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
               "wsgi.input": io.BytesIO(body), "wsgi.url_scheme": "http", "wsgi.errors": io.StringIO(),
               "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
               "wsgi.version": (1, 0), "REMOTE_ADDR": "127.0.0.1"}
        status: list[str] = []
        out = b"".join(app(env, lambda s, h, exc=None: status.append(s)))
        if not status[0].startswith("200"):
            raise RuntimeError(f"{path}: {status[0]} {out[:200]!r}")
        return out
    return call


MODES = ("service", "wire", "wsgi")   # what a verb's time includes (build_parser's --modes)


def run(n: int, pods_n: int, seed: int, mode: str, profile: str | None = None) -> dict[str, Any]:
    svc = _service(n)
    _prefill(svc, n, seed)
    names = cluster.node_names(n)
    names_json = orjson.dumps(names)
    pods = cluster.pods(pods_n, seed=seed)
    pod_json = [orjson.dumps(p) for p in pods]
    app = create_app(svc)
    wsgi = _wsgi_caller(app)

    def post(path: str, body: bytes) -> bytes:
        if mode == "wsgi":
            return wsgi(path, body)
        if path == "/bind":
            args = parse_binding_args(body)
            return encode(binding_result(svc.bind(args)))
        args = parse_extender_args(body)
        if path == "/filter":
            return encode(svc.filter(args).to_json())
        return svc.prioritize(args, as_json=True)  # type: ignore[return-value]

    times: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}
    placed: dict[str, str] = {}
    prof = cProfile.Profile() if profile else None
    clock = time.perf_counter
    t_start = clock()
    if prof:
        prof.enable()
    for j, pod in enumerate(pods):
        meta = pod["metadata"]
        for _attempt in range(3):
            body = _args_body(pod_json[j], names_json)
            if mode == "service":
                args = parse_extender_args(body)
                t0 = clock()
                res = svc.filter(args)
                times["filter"].append(clock() - t0)
                passing = res.node_names or []
            else:
                t0 = clock()
                ans = post("/filter", body)
                times["filter"].append(clock() - t0)
                passing = orjson.loads(ans)["NodeNames"] or []
            if not passing:
                break
            node = passing[0]
            if len(passing) > 1:
                body = _args_body(pod_json[j], orjson.dumps(passing))
                if mode == "service":
                    args = parse_extender_args(body)
                    t0 = clock()
                    hosts, scores = svc.prioritize_scores(args)
                    times["prioritize"].append(clock() - t0)
                    node = hosts[int(np.argmax(scores))]
                else:
                    t0 = clock()
                    ans = post("/prioritize", body)
                    times["prioritize"].append(clock() - t0)
                    sc = orjson.loads(ans)
                    node = max(sc, key=lambda s: s["Score"])["Host"]
            bind = orjson.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                 "PodUID": meta["uid"], "Node": node})
            if mode == "service":
                args = parse_binding_args(bind)
                t0 = clock()
                err = svc.bind(args)
                times["bind"].append(clock() - t0)
            else:
                t0 = clock()
                err = orjson.loads(post("/bind", bind))["Error"]
                times["bind"].append(clock() - t0)
            if not err:
                placed[meta["name"]] = node
                break
    if prof:
        prof.disable()
        prof.dump_stats(profile)
    total = clock() - t_start
    out: dict[str, Any] = {"mode": mode, "nodes": n, "pods": pods_n, "placed": placed}
    for verb, ts in times.items():
        ms = np.array(ts) * 1e3
        out[verb] = (float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), float(ms.mean())) if len(ms) else None
    out["ms_per_pod_decisions"] = sum(sum(ts) for ts in times.values()) * 1e3 / pods_n
    out["ms_per_pod_total"] = total * 1e3 / pods_n
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.latency.inproc``, apart from ``main`` so that
    tests/test_doc_commands.py can check the documented command lines against it without running them."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.latency.inproc", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--nodes", type=whole_number(1, MAX_NODES), default=5000, help="nodes of the simulated cluster")
    p.add_argument("--pods", type=whole_number(1, MAX_PODS), default=300, help="pods scheduled, one at a time")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--modes", type=name_list(MODES, "mode"), default=",".join(MODES),
                   help="service: the service's calls on parsed arguments; wire: the same with the wire's "
                        "decode and encode; wsgi: the whole Flask app through WSGI")
    p.add_argument("--profile", help="cProfile of the last mode's run to this file")
    return p


def main(argv: list[str] | None = None) -> None:
    a = build_parser().parse_args(argv)
    modes = a.modes
    for mode in modes:
        r = run(a.nodes, a.pods, a.seed, mode, a.profile if mode == modes[-1] else None)
        verbs = "  ".join(f"{v} p50/p99/mean {r[v][0]:.2f}/{r[v][1]:.2f}/{r[v][2]:.2f}"
                          for v in ("filter", "prioritize", "bind") if r[v])
        print(f"{mode:<8} {r['nodes']} nodes: {verbs} ms; {r['ms_per_pod_decisions']:.2f} ms/pod in verbs "
              f"({r['ms_per_pod_total']:.2f} incl. client-side work)", flush=True)


if __name__ == "__main__":
    main()
