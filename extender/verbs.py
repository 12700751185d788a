"""The verbs (filter, prioritize, bind, preempt) on raw bytes: decode the request, decide,
encode the answer, count it.

This is everything the HTTP face does for filter, prioritize, bind and preempt except reading the body
off the connection, kept free of any web framework so that the two serving layouts run the very
same code: the one-process layout calls it from the Flask views (:mod:`extender.app`), the
split layout from the decision process's relay server (:mod:`extender.relay`), with the HTTP
handled by the gunicorn workers in front. Why the answers on errors are what they are
(observed on kube-scheduler v1.28.7, see ``../shared/wire/README.md``):

- filter: ANY error (5xx, bad JSON, ``Error`` set, timeout) parks the pod for up to 5 minutes,
  so filter always answers 200 with an ``ExtenderFilterResult``; an internal failure puts every
  node in ``FailedNodes`` with a message (the pod is retried on the next cluster event). Only a
  body that is not an extender request at all gets a 400 (and an oversized one a 413).
- prioritize: errors are ignored by the scheduler; on an internal failure we answer ``[]``.
- bind: an ``Error`` makes the scheduler retry within seconds, the right answer to a lost race.
- preempt: any error (non-200, bad JSON) makes kube-scheduler give up this preemption attempt
  (``ignorable: false``); a body that is not a preempt request gets its 400, and an internal
  failure answers no node at all (``{"NodeNameToMetaVictims": {}}``): no eviction is better
  than one decided without the cards.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .bounds import COSTS
from .feed_health import FeedCollector, ReadHealth
from .service import ExtenderService
from .wire import (BindingArgs, WireError, binding_result, encode, encode_filter_result, filter_answer,
                   parse_binding_args, parse_preemption_args, preemption_result)

log = logging.getLogger("stowage.extender")

JSON = "application/json"
# The Kubernetes feed's memory bounds (KubeFeeder.bounds), read at each scrape.
FeedBounds = Callable[[], Mapping[str, Any]]
VERBS = ("filter", "prioritize", "bind", "preempt")


@dataclass(frozen=True)
class Reply:
    """An HTTP answer, framework-free: status, body bytes, content type, and the metrics outcome."""

    status: int
    body: bytes
    outcome: str = "ok"
    content_type: str = JSON


def json_reply(doc: Any, status: int = 200, outcome: str = "ok") -> Reply:
    return Reply(status, encode(doc), outcome)


def verb_prefix(url_prefix: str) -> str:
    """The verbs' path prefix: '' or '/x[/y]' (no trailing slash), however the flag was written."""
    return "/" + url_prefix.strip("/") if url_prefix.strip("/") else ""


def too_large_reply(max_body_bytes: int) -> Reply:
    """The 413 for a body over the limit (the limit is the extender's --max-body-mib)."""
    return json_reply({"Error": f"request body larger than {max_body_bytes} bytes "
                                "(raise the extender's --max-body-mib)"}, 413, "too_large")


# The memory bounds' series (extender/bounds.py), one per bound by its ``bound`` label, so that
# ``stowage_extender_bound_bytes / stowage_extender_bound_max_bytes`` is each bound's use.
_BOUND_SERIES = (
    ("entries", "Entries each memory bound of the extender holds now: pending_pods (copies of the pending pods "
                "of Stowage's schedulers, for bind), pod_cache (pods parsed at filter, for bind), learned_pods "
                "(the pods the placers learned from)"),
    ("max_entries", "Entries each memory bound holds at most (past it the oldest, or least recently used, go)"),
    ("bytes", "Bytes each memory bound holds now (pod_cache, learned_pods: an estimate that errs high)"),
    ("max_bytes", "Bytes each memory bound holds at most, set by --pending-pods-mib, --pod-cache-mib, "
                  "--learned-pods-mib, --list-learn-mib (past it the oldest, or least recently used, go; the "
                  "newest always stays)"),
)
_DROPPED_HELP = ("Entries each memory bound dropped since start, past its entries or its bytes. What a drop costs: "
                 + "; ".join(f"{name}: {COSTS[name]}" for name in ("pending_pods", "pod_cache", "learned_pods")))


class _ModelCollector:
    """Gauges read from the model at scrape time (never stale, no bookkeeping on the hot path)."""

    def __init__(self, service: ExtenderService, feed_bounds: FeedBounds | None = None) -> None:
        self.service = service
        self.feed_bounds = feed_bounds

    def collect(self):
        s = self.service.stats()
        for key, help_text in (("nodes", "GPU nodes in the model"),
                               ("cards", "GPU cards on schedulable nodes"),
                               ("healthy_cards", "healthy GPU cards on schedulable nodes"),
                               ("free_whole_cards", "healthy cards with no pod on them"),
                               ("stranded_whole_cards", "free whole cards on nodes that cannot take one more 1-GPU "
                                "pod: no pod slot left, or less host CPU or memory free than the running 1-GPU pods' "
                                "median asks for (packing/stranded.py). What packing exists to avoid: paid for, "
                                "unusable until pods leave the node"),
                               ("allocations", "GPU pods holding cards")):
            yield GaugeMetricFamily(f"stowage_extender_{key}", help_text, value=s[key])
        learned = self.service.learned_summary(digest=False)
        yield GaugeMetricFamily("stowage_extender_learned_pods", "pods the placer has learned the workload from "
                                "(those that exist and those deleted, kept across restarts)", value=learned["pods"])
        yield GaugeMetricFamily("stowage_extender_departed_pods_kept", "deleted pods whose shapes are kept for the "
                                "next start (--learned-configmap)", value=learned["departedPods"])
        keeper = self.service.past_keeper
        if keeper is not None:
            writes = CounterMetricFamily("stowage_extender_learned_past_writes", "writes of the --learned-configmap "
                                         "ConfigMap by outcome", labels=["outcome"])
            writes.add_metric(["ok"], keeper.writes)
            writes.add_metric(["failed"], keeper.failures)
            yield writes
            yield GaugeMetricFamily("stowage_extender_learned_past_unwritten_seconds", "seconds since the departed "
                                    "pods changed with the change not yet written (0: all written)",
                                    value=keeper.unwritten_s())
        yield from self._bounds()

    def _bounds(self):
        """Each memory bound's use and drops (extender/bounds.py): the service's, and the feed's in kube mode."""
        uses: dict[str, Any] = dict(self.service.bounds())
        if self.feed_bounds is not None:
            uses.update(self.feed_bounds())
        list_learn = uses.pop("list_learn", None)
        families = {key: GaugeMetricFamily(f"stowage_extender_bound_{key}", help_text, labels=["bound"])
                    for key, help_text in _BOUND_SERIES}
        dropped = CounterMetricFamily("stowage_extender_bound_dropped", _DROPPED_HELP, labels=["bound"])
        for bound, use in uses.items():
            for key, family in families.items():
                family.add_metric([bound], use[key])
            dropped.add_metric([bound], use["dropped"])
        if list_learn is not None:
            families["max_bytes"].add_metric(["list_learn"], list_learn["max_bytes"])
        yield from families.values()
        yield dropped
        if list_learn is not None:
            yield GaugeMetricFamily("stowage_extender_list_learn_peak_bytes", "The most bytes a pod list's learn "
                                    "copies held at once since start (bound: --list-learn-mib; kept until the "
                                    "list's end to show its pods to the placers in creation order)",
                                    value=list_learn["peak_bytes"])
            yield CounterMetricFamily("stowage_extender_list_learn_early_batches", "Batches of a pod list's pods "
                                      "shown to the placers before the list's end since start, its learn copies "
                                      f"past --list-learn-mib. What it costs: {COSTS['list_learn']}",
                                      value=list_learn["early_batches"])


class Metrics:
    """Per-app Prometheus registry (one per app, so several apps can live in one test process)."""

    def __init__(self, service: ExtenderService, feed_bounds: FeedBounds | None = None,
                 feed_health: ReadHealth | None = None) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("stowage_extender_requests", "Extender requests by verb and outcome",
                                ["verb", "outcome"], registry=self.registry)
        self.latency = Histogram("stowage_extender_request_duration_seconds", "Extender request latency by verb",
                                 ["verb"], registry=self.registry,
                                 buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5))
        self.registry.register(_ModelCollector(service, feed_bounds))  # type: ignore[arg-type]
        if feed_health is not None:   # kube mode: the feed's streams and what it cannot read (feed_health.py)
            self.registry.register(FeedCollector(feed_health))  # type: ignore[arg-type]


class Verbs:
    """filter / prioritize / bind / preempt of one service, on request bytes.

    ``handle(verb, None)`` is the answer to a body over ``max_body_bytes`` (the caller decides
    that while reading, so an oversized body is never read whole): a 413, counted like any other
    outcome.
    """

    def __init__(self, service: ExtenderService, metrics: Metrics, max_body_bytes: int) -> None:
        self.service = service
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        # Body decoding from the service's seam: the fast path recognises NodeNames arrays
        # decoded before by their bytes (extender.wirememo).
        self.names_memo = service.path.wire_parser()
        self._latency = {v: metrics.latency.labels(v) for v in VERBS}  # looked up once
        self._run: dict[str, Callable[[bytes], Reply]] = {
            "filter": self._filter, "prioritize": self._prioritize, "bind": self._bind,
            "preempt": self._preempt}

    def too_large(self) -> Reply:
        return too_large_reply(self.max_body_bytes)

    def handle(self, verb: str, body: bytes | None) -> Reply:
        """The answer to ``verb`` with request ``body`` (None: the body was too large)."""
        t0 = time.perf_counter()
        return self._counted(verb, t0, self.too_large() if body is None else self._run[verb](body))

    def _counted(self, verb: str, t0: float, reply: Reply) -> Reply:
        """``reply``, timed from ``t0`` and counted by outcome in the verb's metrics."""
        self._latency[verb].observe(time.perf_counter() - t0)
        self.metrics.requests.labels(verb, reply.outcome).inc()
        return reply

    def _filter(self, body: bytes) -> Reply:
        try:
            args = self.names_memo.parse(body)
        except WireError as exc:
            log.warning("filter: bad request: %s", exc)
            return json_reply({"Error": str(exc)}, 400, "bad_request")
        try:
            res = self.service.filter(args)
            data, names_json = encode_filter_result(res)
            if names_json is not None and res.node_names:  # what this pod's prioritize will send
                self.names_memo.remember(names_json, res.node_names)
            return Reply(200, data)
        except Exception:
            log.exception("filter: internal error; answering every node as failed")
            msg = "Stowage extender internal error (see extender logs); will retry"
            return json_reply(filter_answer(args, failed={n: msg for n in args.names}).to_json(),
                              outcome="internal_error")

    def _prioritize(self, body: bytes) -> Reply:
        try:
            args = self.names_memo.parse(body)
        except WireError as exc:
            log.warning("prioritize: bad request: %s", exc)
            return json_reply({"Error": str(exc)}, 400, "bad_request")
        try:
            return Reply(200, self.service.prioritize(args, as_json=True))  # type: ignore[arg-type]
        except Exception:
            log.exception("prioritize: internal error; answering no scores")
            return json_reply([], outcome="internal_error")

    def _bind(self, body: bytes) -> Reply:
        try:
            args = parse_binding_args(body)
        except WireError as exc:
            log.warning("bind: bad request: %s", exc)
            return json_reply(binding_result(str(exc)), 400, "bad_request")
        return self._bind_reply(args, lambda: self.service.bind(args))

    def _bind_reply(self, args: BindingArgs, run: Callable[[], str]) -> Reply:
        """Bind's answer to what ``run`` (a whole bind, or its API write) returns."""
        try:
            err = run()
        except Exception as exc:
            return self._bind_internal_error(args, exc)
        return self._bind_answer(err)

    @staticmethod
    def _bind_answer(err: str) -> Reply:
        """'' bound, a message refused."""
        return json_reply(binding_result(err), outcome="refused" if err else "bound")

    @staticmethod
    def _bind_internal_error(args: BindingArgs, exc: Exception) -> Reply:
        log.exception("bind: internal error for %s -> %s", args.key, args.node)
        return json_reply(binding_result(f"Stowage extender internal error: {exc!r}"), outcome="internal_error")

    def bind_begin(self, body: bytes) -> "Reply | Callable[[], Reply]":
        """Bind in two halves, for a host that answers filter on one thread in arrival order (the
        split layout's relay): the card choice and reservation now, on the caller's thread, and
        the API write as the returned callable, to run where waiting is fine. The answer (and
        what is counted and timed) is exactly :meth:`handle`'s for ``"bind"``; a bind that would
        wait on the API server before it can reserve (the pod not seen at filter, cards held
        elsewhere) is returned whole as the callable."""
        t0 = time.perf_counter()
        try:
            args = parse_binding_args(body)
        except WireError:
            return self.handle("bind", body)          # its 400, counted as always
        try:
            step = self.service.reserve(args, may_block=False)
        except Exception as exc:
            return self._counted("bind", t0, self._bind_internal_error(args, exc))
        if step is None:                              # it may wait on the API server: all of it there
            return lambda: self.handle("bind", body)
        if isinstance(step, str):                     # refused now
            return self._counted("bind", t0, self._bind_answer(step))
        return lambda: self._counted("bind", t0, self._bind_reply(args, step.write))

    def _preempt(self, body: bytes) -> Reply:
        try:
            args = parse_preemption_args(body)
        except WireError as exc:
            log.warning("preempt: bad request: %s", exc)
            return json_reply({"Error": str(exc)}, 400, "bad_request")
        try:
            return json_reply(preemption_result(self.service.preempt(args)))
        except Exception:
            log.exception("preempt: internal error; answering no node (no eviction)")
            return json_reply(preemption_result({}), outcome="internal_error")
