"""The do-nothing extender: the floor of the HTTP + JSON path, served exactly like Stowage's.

Same gunicorn settings (:func:`extender.gunicorn_conf.gunicorn_options`, ``gthread`` workers:
one, or as many as the split layout's HTTP workers), same Flask, same request parsing (:mod:`extender.wire`) and the same answer encoding;
it only skips the decisions: filter passes every node it was sent (names, or the Node objects
themselves with ``nodeCacheCapable: false``), prioritize gives every node 0, bind says yes.
Whatever Stowage costs above this is the cost of its decisions.
"""
from __future__ import annotations

import argparse

import numpy as np
from flask import Flask, Response, request

from extender.gunicorn_conf import ExtenderServer, gunicorn_options
from extender.wire import (binding_result, encode, encode_priority_list, filter_answer, parse_binding_args,
                           parse_extender_args)


def create_floor_app() -> Flask:
    app = Flask("stowage.floor")

    def answer(doc) -> Response:
        return Response(encode(doc), mimetype="application/json")

    @app.post("/filter")
    def filter_view() -> Response:
        args = parse_extender_args(request.get_data(cache=False))
        return answer(filter_answer(args, passing=args.names, passing_nodes=args.nodes).to_json())

    @app.post("/prioritize")
    def prioritize_view() -> Response:
        args = parse_extender_args(request.get_data(cache=False))
        return Response(encode_priority_list(args.names, np.zeros(len(args.names), np.int64)),
                        mimetype="application/json")

    @app.post("/bind")
    def bind_view() -> Response:
        parse_binding_args(request.get_data(cache=False))
        return answer(binding_result(""))

    @app.get("/healthz")
    def healthz() -> Response:
        return answer({"ok": True})

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.latency.floor", description=__doc__)
    p.add_argument("--bind", default="127.0.0.1:8889")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--workers", type=int, default=1, help="gunicorn worker processes (the floor holds no state)")
    args = p.parse_args(argv)
    ExtenderServer(create_floor_app, gunicorn_options(bind=args.bind, threads=args.threads, log_level="warning",
                                                      workers=args.workers)).run()


if __name__ == "__main__":
    main()
