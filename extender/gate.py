"""No decision from a model that is not complete and current (issue 12, item 2).

The Kubernetes feeder lists nodes and pods in two threads and keeps them current by watching;
``/readyz`` says when that is not (yet) so. The verbs used to answer regardless: right after a
start, with the nodes listed and the pods not yet, a node whose every card another pod held
looked empty, and bind handed its cards out a second time. :class:`GatedVerbs` asks the same
readiness check before every filter, prioritize, bind and preempt, in both serving layouts (the
one-process app and the split layout's decision process use the same object):

- filter: every node fails (``FailedNodes``, so kube-scheduler retries the pod once the model is
  whole) with ``Stowage's model of the cluster is not complete and current: <why>``;
- prioritize: every node scores 0;
- bind: ``Error`` with the same message, nothing reserved or written;
- preempt: no node (``{"NodeNameToMetaVictims": {}}``): no eviction from an incomplete model;
- a request that is not an extender request at all still gets its 400, an oversized one its 413;
- a readiness check that raises counts as "not ready": when we cannot tell, we refuse.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from .verbs import Reply, Verbs, json_reply
from .wire import (WireError, binding_result, filter_answer, parse_binding_args, parse_preemption_args,
                   preemption_result, priority_list)

log = logging.getLogger("stowage.extender")

ReadyFn = Callable[[], tuple[bool, str]]
NOT_READY = "Stowage's model of the cluster is not complete and current"


class GatedVerbs:
    """:class:`~extender.verbs.Verbs` that answer only from a complete and current model."""

    def __init__(self, verbs: Verbs, ready: ReadyFn) -> None:
        self.verbs = verbs
        self.ready = ready
        self._last_log = 0.0

    def __getattr__(self, name: str) -> Any:  # names_memo, metrics, too_large, ...
        return getattr(self.verbs, name)

    def state(self) -> tuple[bool, str]:
        try:
            ok, why = self.ready()
        except Exception as exc:  # cannot tell: refuse
            return False, f"readiness check failed: {exc!r}"
        return bool(ok), why

    def bind_begin(self, body: bytes) -> "Reply | Callable[[], Reply]":
        """:meth:`Verbs.bind_begin` from a complete and current model; the refusal otherwise."""
        ok, _ = self.state()
        return self.verbs.bind_begin(body) if ok else self.handle("bind", body)

    def handle(self, verb: str, body: bytes | None) -> Reply:
        ok, why = self.state()
        if ok or body is None:
            return self.verbs.handle(verb, body)
        msg = f"{NOT_READY}: {why}; will retry"
        try:
            if verb == "bind":
                args = parse_binding_args(body)
                reply = json_reply(binding_result(msg), outcome="not_ready")
                what = f"bind {args.key} -> {args.node}"
            elif verb == "preempt":
                parse_preemption_args(body)
                reply = json_reply(preemption_result({}), outcome="not_ready")  # no eviction
                what = verb
            else:
                ext = self.verbs.names_memo.parse(body)
                if verb == "filter":
                    reply = json_reply(filter_answer(ext, failed={n: msg for n in ext.names}).to_json(),
                                       outcome="not_ready")
                else:
                    reply = json_reply(priority_list(ext.names, [0] * len(ext.names)), outcome="not_ready")
                what = verb
        except WireError:
            return self.verbs.handle(verb, body)  # its 400, as always
        now = time.monotonic()
        if now - self._last_log > 10:  # one line per 10 s, not one per request
            self._last_log = now
            log.warning("%s refused: %s", what, msg)
        self.verbs.metrics.requests.labels(verb, reply.outcome).inc()
        return reply
