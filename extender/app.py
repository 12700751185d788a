"""The HTTP face of the extender: a Flask app with the verbs kube-scheduler calls.

The verbs themselves (decode, decide, encode, count; and why each error gets the answer it
gets) are in :mod:`extender.verbs`, shared with the split layout's decision process; this
module reads bodies off the request (refusing oversized ones with a 413 before reading them),
serves the read-only endpoints (/state, /allocations, /healthz, /readyz, /metrics) and makes
sure nothing ever answers with a 500 and a traceback.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from flask import Blueprint, Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from .feed_health import ReadHealth
from .gate import GatedVerbs
from .intake import BigBodyLane, BodyReader, Refusal, refusal_reply
from .service import ExtenderService
from .verbs import FeedBounds, Metrics, Reply, Verbs, verb_prefix
from .wire import encode

log = logging.getLogger("stowage.extender")

# A full v1.Node object is typically 5-25 KB (status.images dominates); 10,000 of them in one
# nodeCacheCapable:false filter body fit comfortably in 256 MiB.
DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024

ReadyFn = Callable[[], tuple[bool, str]]


def _json(doc: Any, status: int = 200) -> Response:
    return Response(encode(doc), status=status, mimetype="application/json")


def create_app(service: ExtenderService, *, url_prefix: str = "", ready: ReadyFn | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, lane: BigBodyLane | None = None,
               feed_bounds: FeedBounds | None = None, feed_health: ReadHealth | None = None) -> Flask:
    """The Flask app serving ``service`` at ``{url_prefix}/filter``, ``/prioritize``, ``/bind``,
    ``/preempt``.

    ``ready`` reports whether the model is being kept up to date (the Kubernetes feeder says
    so); ``/readyz`` answers 503 with its message otherwise. ``feed_bounds``: what the feeder's
    memory bounds hold and dropped (``KubeFeeder.bounds``), on /metrics with the service's own;
    ``feed_health``: how its list+watch streams are doing and what it cannot read
    (``KubeFeeder.health``), on /metrics too. Both are None with a simulated cluster (no feed).
    """
    app = Flask("stowage.extender")
    # The verbs read their bodies with intake.BodyReader (limit checked there); this bounds any
    # other route's body read through werkzeug (413 via the handler below).
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes + 1
    metrics = Metrics(service, feed_bounds, feed_health)
    ready_fn: ReadyFn = ready or (lambda: (True, "ready"))
    # Every verb asks ready_fn first: no decision from a model that is not complete and current
    # (extender.gate). The split layout's decision process serves these very verbs.
    verbs = GatedVerbs(Verbs(service, metrics, max_body_bytes), ready_fn)
    app.extensions["stowage"] = {"service": service, "metrics": metrics, "names_memo": verbs.names_memo,
                                 "verbs": verbs}
    prefix = verb_prefix(url_prefix)
    bp = Blueprint("extender", __name__, url_prefix=prefix or None)

    reader = BodyReader(max_body_bytes, lane)

    def respond(reply: Reply) -> Response:
        return Response(reply.body, status=reply.status, content_type=reply.content_type)

    def run_verb(verb: str) -> Response:
        """Read the body within the time and memory bounds (extender.intake), then decide."""
        body, held = reader.read(request.environ)
        try:
            if isinstance(body, Refusal):
                if body.status == 413:
                    return respond(verbs.handle(verb, None))  # counted as too_large there
                metrics.requests.labels(verb, body.outcome).inc()
                return respond(refusal_reply(verb, body))
            return respond(verbs.handle(verb, body))
        finally:
            reader.done(held)

    @bp.post("/filter")
    def filter_view() -> Response:
        return run_verb("filter")

    @bp.post("/prioritize")
    def prioritize_view() -> Response:
        return run_verb("prioritize")

    @bp.post("/bind")
    def bind_view() -> Response:
        return run_verb("bind")

    @bp.post("/preempt")
    def preempt_view() -> Response:
        return run_verb("preempt")

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
        return respond(verbs.too_large())

    @app.errorhandler(HTTPException)
    def handle_http(exc: HTTPException) -> Response:
        return _json({"Error": f"{exc.code} {exc.name}: {exc.description}"}, exc.code or 500)

    @app.errorhandler(Exception)
    def handle_any(exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return _json({"Error": f"Stowage extender internal error: {exc!r}"}, 500)

    return app
