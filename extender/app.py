"""The HTTP face of the extender: a Flask app with the verbs kube-scheduler calls.

All decisions are in :class:`extender.service.ExtenderService`; this module decodes bodies,
encodes answers, counts and times requests, and makes sure nothing ever answers with a 500
and a traceback. Why the answers on errors are what they are (observed on kube-scheduler
v1.28.7, see ``../shared/wire/README.md``):

- filter: ANY error (5xx, bad JSON, ``Error`` set, timeout) parks the pod for up to 5 minutes,
  so filter always answers 200 with an ``ExtenderFilterResult``; an internal failure puts every
  node in ``FailedNodes`` with a message (the pod is retried on the next cluster event). Only a
  body that is not an extender request at all gets a 400 (and an oversized one a 413).
- prioritize: errors are ignored by the scheduler; on an internal failure we answer ``[]``.
- bind: an ``Error`` makes the scheduler retry within seconds, the right answer to a lost race.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from flask import Blueprint, Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from .service import ExtenderService
from .wire import WireError, binding_result, encode, encode_filter_result, filter_answer, parse_binding_args
from .wirememo import NodeNamesMemo

log = logging.getLogger("stowage.extender")

# A full v1.Node object is typically 5-25 KB (status.images dominates); 10,000 of them in one
# nodeCacheCapable:false filter body fit comfortably in 256 MiB.
DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024

ReadyFn = Callable[[], tuple[bool, str]]


def _json(doc: Any, status: int = 200) -> Response:
    return Response(encode(doc), status=status, mimetype="application/json")


class _ModelCollector:
    """Gauges read from the model at scrape time (never stale, no bookkeeping on the hot path)."""

    def __init__(self, service: ExtenderService) -> None:
        self.service = service

    def collect(self):
        s = self.service.stats()
        for key, help_text in (("nodes", "GPU nodes in the model"),
                               ("cards", "GPU cards on schedulable nodes"),
                               ("healthy_cards", "healthy GPU cards on schedulable nodes"),
                               ("free_whole_cards", "healthy cards with no pod on them"),
                               ("allocations", "GPU pods holding cards")):
            yield GaugeMetricFamily(f"stowage_extender_{key}", help_text, value=s[key])


class Metrics:
    """Per-app Prometheus registry (one per app, so several apps can live in one test process)."""

    def __init__(self, service: ExtenderService) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("stowage_extender_requests", "Extender requests by verb and outcome",
                                ["verb", "outcome"], registry=self.registry)
        self.latency = Histogram("stowage_extender_request_duration_seconds", "Extender request latency by verb",
                                 ["verb"], registry=self.registry,
                                 buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
        self.registry.register(_ModelCollector(service))  # type: ignore[arg-type]


def create_app(service: ExtenderService, *, url_prefix: str = "", ready: ReadyFn | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Flask:
    """The Flask app serving ``service`` at ``{url_prefix}/filter``, ``/prioritize``, ``/bind``.

    ``ready`` reports whether the model is being kept up to date (the Kubernetes feeder says
    so); ``/readyz`` answers 503 with its message otherwise.
    """
    app = Flask("stowage.extender")
    # One byte more than allowed: a chunked body (no Content-Length) is cut at this limit by
    # werkzeug without an error, so reading limit+1 bytes is how we see that it was too long.
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes + 1
    metrics = Metrics(service)
    names_memo = NodeNamesMemo()  # NodeNames arrays decoded before: recognised by their bytes
    app.extensions["stowage"] = {"service": service, "metrics": metrics, "names_memo": names_memo}
    ready_fn: ReadyFn = ready or (lambda: (True, "ready"))
    prefix = "/" + url_prefix.strip("/") if url_prefix.strip("/") else ""
    bp = Blueprint("extender", __name__, url_prefix=prefix or None)

    def body() -> bytes:
        env = request.environ
        length = env.get("CONTENT_LENGTH") or ""
        if length.isdigit() and "HTTP_TRANSFER_ENCODING" not in env:
            # The length is known: read exactly that from the server's input, without
            # werkzeug's stream wrappers (a measurable share of a small request's cost).
            if int(length) > max_body_bytes:
                raise RequestEntityTooLarge()
            return env["wsgi.input"].read(int(length)) if length != "0" else b""
        data = request.get_data(cache=False)
        if len(data) > max_body_bytes:
            raise RequestEntityTooLarge()
        return data

    def too_large() -> Response:
        return _json({"Error": f"request body larger than {max_body_bytes} bytes "
                               "(raise the extender's --max-body-mib)"}, 413)

    latency = {v: metrics.latency.labels(v) for v in ("filter", "prioritize", "bind")}  # looked up once

    def timed(verb: str, fn: Callable[[], tuple[Response, str]]) -> Response:
        t0 = time.perf_counter()
        try:
            resp, outcome = fn()
        except RequestEntityTooLarge:
            resp, outcome = too_large(), "too_large"
        latency[verb].observe(time.perf_counter() - t0)
        metrics.requests.labels(verb, outcome).inc()
        return resp

    @bp.post("/filter")
    def filter_view() -> Response:
        def run() -> tuple[Response, str]:
            try:
                args = names_memo.parse(body())
            except WireError as exc:
                log.warning("filter: bad request: %s", exc)
                return _json({"Error": str(exc)}, 400), "bad_request"
            try:
                res = service.filter(args)
                data, names_json = encode_filter_result(res)
                if names_json is not None and res.node_names:  # what this pod's prioritize will send
                    names_memo.remember(names_json, res.node_names)
                return Response(data, mimetype="application/json"), "ok"
            except Exception:
                log.exception("filter: internal error; answering every node as failed")
                msg = "Stowage extender internal error (see extender logs); will retry"
                return _json(filter_answer(args, failed={n: msg for n in args.names}).to_json()), "internal_error"
        return timed("filter", run)

    @bp.post("/prioritize")
    def prioritize_view() -> Response:
        def run() -> tuple[Response, str]:
            try:
                args = names_memo.parse(body())
            except WireError as exc:
                log.warning("prioritize: bad request: %s", exc)
                return _json({"Error": str(exc)}, 400), "bad_request"
            try:
                return Response(service.prioritize(args, as_json=True), mimetype="application/json"), "ok"
            except Exception:
                log.exception("prioritize: internal error; answering no scores")
                return _json([]), "internal_error"
        return timed("prioritize", run)

    @bp.post("/bind")
    def bind_view() -> Response:
        def run() -> tuple[Response, str]:
            try:
                args = parse_binding_args(body())
            except WireError as exc:
                log.warning("bind: bad request: %s", exc)
                return _json(binding_result(str(exc)), 400), "bad_request"
            try:
                err = service.bind(args)
            except Exception as exc:
                log.exception("bind: internal error for %s -> %s", args.key, args.node)
                return _json(binding_result(f"Stowage extender internal error: {exc!r}")), "internal_error"
            return _json(binding_result(err)), ("refused" if err else "bound")
        return timed("bind", run)

    @bp.get("/state")
    def state_view() -> Response:
        """The model as JSON (nodes, cards, allocations): for `stowage demo` and people."""
        return _json(service.state())

    @bp.get("/allocations/<uid>")
    def allocation_view(uid: str) -> Response:
        al = service.allocation(uid)
        return _json(al) if al is not None else _json({"Error": f"no allocation for pod uid {uid}"}, 404)

    app.register_blueprint(bp)

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"ok": True})

    @app.get("/readyz")
    def readyz() -> Response:
        try:
            ok, message = ready_fn()
        except Exception as exc:
            log.exception("readiness check failed")
            ok, message = False, f"readiness check failed: {exc!r}"
        return _json({"ready": bool(ok), "message": message}, 200 if ok else 503)

    @app.get("/metrics")
    def metrics_view() -> Response:
        return Response(generate_latest(metrics.registry), mimetype=CONTENT_TYPE_LATEST)

    @app.errorhandler(RequestEntityTooLarge)
    def handle_413(exc: RequestEntityTooLarge) -> Response:
        return too_large()

    @app.errorhandler(HTTPException)
    def handle_http(exc: HTTPException) -> Response:
        return _json({"Error": f"{exc.code} {exc.name}: {exc.description}"}, exc.code or 500)

    @app.errorhandler(Exception)
    def handle_any(exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _json({"Error": f"Stowage extender internal error: {exc!r}"}, 500)

    return app
