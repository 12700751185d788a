"""The split layout's gunicorn workers: HTTP in, bytes to the decision process, bytes out.

A plain WSGI callable, not a Flask app, on purpose: a worker decides nothing and parses nothing
in the normal case (the decision process does both, with the one-process layout's code), so the
only work here is the HTTP that gunicorn already did and one unix-socket round trip
(:mod:`extender.relay`). It keeps the contract of :mod:`extender.app` where it has to answer on
its own: a body over the size limit is refused with a 413 without being read, and when the
decision process cannot be reached each verb answers the way kube-scheduler handles best
(filter: every node failed with the reason, so the pod is retried; prioritize: no scores; bind:
an ``Error``, retried within seconds; anything else, /healthz included: 503, so a liveness
probe restarts the pod).
"""
from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any, Callable, Iterable

from .intake import BigBodyLane, BodyReader, Refusal, refusal_reply
from .relay import OP_OTHER, OPS, TOO_LARGE, RelayClient, RelayError
from .verbs import Reply, json_reply, too_large_reply, verb_prefix
from .wire import WireError, binding_result, filter_answer, parse_extender_args

log = logging.getLogger("stowage.extender")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _status_line(code: int) -> str:
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return f"{code} Unknown"


def unavailable_reply(verb: str | None, body: bytes | None, reason: str) -> Reply:
    """The answer when the decision process cannot be asked (see the module docstring)."""
    msg = f"Stowage extender decision process unavailable: {reason}; will retry"
    if verb == "filter" and body is not None:
        try:
            args = parse_extender_args(body)
        except WireError as exc:
            return json_reply({"Error": str(exc)}, 400, "bad_request")
        return json_reply(filter_answer(args, failed={n: msg for n in args.names}).to_json(), outcome="unavailable")
    if verb == "prioritize":
        return json_reply([], outcome="unavailable")
    if verb == "bind":
        return json_reply(binding_result(msg), outcome="unavailable")
    return json_reply({"Error": msg}, 503, "unavailable")


def create_frontend(socket_path: str, *, url_prefix: str = "", max_body_bytes: int,
                    lane: BigBodyLane | None = None) -> WSGIApp:
    """The WSGI app of a split-layout worker, relaying to the decision process at ``socket_path``.

    ``lane``: the big-body lane shared by every worker of this extender (:mod:`extender.intake`);
    a worker holds it until the decision process has answered, so that process too works on
    at most one big body at a time."""
    relay = RelayClient(socket_path)
    reader = BodyReader(max_body_bytes, lane)
    routes = {f"{verb_prefix(url_prefix)}/{verb}": (verb, op) for verb, op in OPS.items()}
    too_large = too_large_reply(max_body_bytes)  # made once: not on every request

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO") or "/"
        verb, op = routes.get(path, (None, OP_OTHER)) if method == "POST" else (None, OP_OTHER)
        got, held = reader.read(environ)
        body = None if isinstance(got, Refusal) else got
        try:
            if isinstance(got, Refusal) and got.status != 413:
                reply = refusal_reply(verb, got)  # (not counted: the decision process never saw it)
            elif op != OP_OTHER:  # an oversized verb body is refused there too, so that it is counted
                reply = relay.call(op, body or b"", flags=TOO_LARGE if body is None else 0)
            elif body is None:
                reply = too_large
            else:
                query = environ.get("QUERY_STRING") or ""
                reply = relay.call(OP_OTHER, body, f"{method} {path}{'?' + query if query else ''}")
        except RelayError as exc:
            log.error("%s %s: %s", method, path, exc)
            reply = too_large if body is None else unavailable_reply(verb, body, str(exc))
        finally:
            reader.done(held)
        start_response(_status_line(reply.status), [("Content-Type", reply.content_type),
                                                    ("Content-Length", str(len(reply.body)))])
        return [reply.body]

    return app
