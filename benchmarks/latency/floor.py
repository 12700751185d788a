"""The do-nothing extender: the floor of the HTTP + JSON path, served exactly like Stowage's.

Same gunicorn settings (:func:`extender.gunicorn_conf.gunicorn_options`, ``gthread`` workers:
one, or as many as the split layout's HTTP workers), same Flask, same request parsing (:mod:`extender.wire`) and the same answer encoding;
it only skips the decisions: filter passes every node it was sent (names, or the Node objects
themselves with ``nodeCacheCapable: false``), prioritize gives every node 0, bind says yes.
Whatever Stowage costs above this is the cost of its decisions.

Two options make it the floor of a burst through a real kube-scheduler
(``python -m benchmarks.binpack.real --burst N --burst-floor``), where pods must really be bound:

- ``--keep-first``: filter passes only the first node it was sent, as Stowage's filter passes
  only its best (so kube-scheduler skips its own scoring in both);
- ``--kubeconfig``: bind creates the pod's Binding on that API server with the extender's own
  write (:class:`extender.kube_binder.KubeBinder`, no allocation record); without it bind only
  says yes.

It keeps no model and watches nothing: what a burst through it costs above plain kube-scheduler
is the cost of having an extender at all, served this way.
"""
from __future__ import annotations

import argparse
from typing import Callable

import numpy as np
from flask import Flask, Response, request

from benchmarks.cliargs import HelpFormatter, whole_number
from extender.gunicorn_conf import ExtenderServer, gunicorn_options
from extender.wire import (binding_result, encode, encode_priority_list, filter_answer, parse_binding_args,
                           parse_extender_args)

# (namespace, name, uid, node) -> None, or raises with the reason bind answers
BindFn = Callable[[str, str, str, str], None]


def kube_bind_fn(kubeconfig: str) -> BindFn:
    """Bind through the extender's own Binding write (:class:`extender.kube_binder.KubeBinder`,
    its fast path). Called in the gunicorn worker (after the fork), so that the client is made,
    and the ``kubernetes`` package imported, before the first request rather than in it."""
    import kubernetes.config

    from extender.kube_binder import KubeBinder
    binder = KubeBinder(kubernetes.config.new_client_from_config(config_file=kubeconfig))

    def bind(namespace: str, name: str, uid: str, node: str) -> None:
        binder.bind(namespace, name, uid, node, None)
    return bind


def create_floor_app(keep_first: bool = False, bind_fn: BindFn | None = None) -> Flask:
    app = Flask("stowage.floor")

    def answer(doc) -> Response:
        return Response(encode(doc), mimetype="application/json")

    @app.post("/filter")
    def filter_view() -> Response:
        args = parse_extender_args(request.get_data(cache=False))
        names, nodes = args.names, args.nodes
        if keep_first:
            names = names[:1]
            nodes = None if nodes is None else nodes[:1]
        return answer(filter_answer(args, passing=names, passing_nodes=nodes).to_json())

    @app.post("/prioritize")
    def prioritize_view() -> Response:
        args = parse_extender_args(request.get_data(cache=False))
        return Response(encode_priority_list(args.names, np.zeros(len(args.names), np.int64)),
                        mimetype="application/json")

    @app.post("/bind")
    def bind_view() -> Response:
        args = parse_binding_args(request.get_data(cache=False))
        error = ""
        if bind_fn is not None:
            try:
                bind_fn(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
            except Exception as exc:  # noqa: BLE001 - kube-scheduler gets the reason, as from Stowage
                error = f"binding {args.pod_namespace}/{args.pod_name} to {args.node} failed: {exc}"
        return answer(binding_result(error))

    @app.get("/healthz")
    @app.get("/readyz")
    def healthz() -> Response:
        return answer({"ok": True})

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.latency.floor", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--bind", default="127.0.0.1:8889")
    p.add_argument("--threads", type=whole_number(1, 256), default=8)
    p.add_argument("--workers", type=whole_number(1, 64), default=1, help="gunicorn worker processes (the floor holds no state)")
    p.add_argument("--keep-first", action="store_true", help="filter passes only the first node it was sent")
    p.add_argument("--kubeconfig", default=None,
                   help="bind creates the pod's Binding on this cluster (default: bind only says yes)")
    args = p.parse_args(argv)
    ExtenderServer(lambda: create_floor_app(args.keep_first,
                                            kube_bind_fn(args.kubeconfig) if args.kubeconfig else None),
                   gunicorn_options(bind=args.bind, threads=args.threads, log_level="warning",
                                    workers=args.workers)).run()


if __name__ == "__main__":
    main()
