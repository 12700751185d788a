"""How the extender's Kubernetes feed is doing, in numbers: what ``KubeFeeder.health()`` gives
``/metrics`` (:mod:`extender.verbs` renders it).

Why a record of its own, besides ``KubeFeeder.status()``: ``status()`` holds names (the nodes and
pods the feed cannot read, by name and uid: for ``stowage inspect``, the log and people) and raw
clock readings (``failing_since``), neither of which belongs on a Prometheus label or value. This is
the same state as counts and ages in seconds, read under the feeder's lock at the scrape: an
operator sees a stream failing before ``/readyz`` turns false, the 410s that force relists, and
the pods whose cards Stowage does not count. A module of its own so that the metrics read it
without loading the Kubernetes client (simulated mode has no feed, and none of these series).

The series (:class:`FeedCollector`), named as kube-scheduler's and client-go's are: counters end in
``_total``, state is a gauge, ages are in seconds; per stream by the ``kind`` label (``nodes``,
``pods``: two values, whatever the cluster), the rest without labels.
"""
from __future__ import annotations

from typing import Callable, Iterator, TypedDict

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class StreamHealth(TypedDict):
    """One list+watch loop (nodes or pods): counters since start, and its state now."""

    lists: int              # complete lists applied (the first, after a 410 Gone, each resync)
    watches: int            # watch requests made (each resumed from the last resourceVersion)
    events: int             # watch events applied (BOOKMARK included)
    errors: int             # failed lists and watches (backed off); a 410 Gone is not one
    gone_relists: int       # watches answered 410 Gone, each followed by a relist
    synced: bool            # its first list is applied (stays so)
    failing_s: float        # how long its failure streak has lasted (0: healthy)
    list_age_s: float | None  # since its last complete list (None: none yet)
    silent_s: float | None    # since the API server last said anything on it (None: before its first list)


class FeedHealth(TypedDict):
    """The feed: each stream by kind, the staleness bound ``/readyz`` applies, and how many nodes
    and pods the feed cannot read or count now (counts only: the names are in ``status()``)."""

    streams: dict[str, StreamHealth]
    stale_after_s: float
    silent_after_s: float      # how long a stream not failing may be silent before /readyz calls it stale
    node_errors: int           # nodes whose GPU inventory cannot be read (no schedulable cards)
    pod_errors: int            # pods whose allocation record cannot be read or is not trusted, or under a held uid
    unrecorded_gpu_pods: int   # GPU pods bound without Stowage's record (their cards not counted)


ReadHealth = Callable[[], FeedHealth]

PREFIX = "stowage_extender_feed_"
# Each stream's counters (StreamHealth keys; the series add _total) and what each says.
_STREAM_COUNTERS = (
    ("lists", "Complete lists of the kind (nodes, pods) applied since start: the first, one after each 410 Gone, "
              "one at each resync (every 10 minutes, once the watch then open ends). A list that fails part-way "
              "is not counted (errors_total is)."),
    ("watches", "Watch requests of the kind made since start, each resumed from the last resourceVersion seen. A "
                "healthy stream makes one per watch timeout (5 to 10 minutes); one rising fast with errors_total "
                "is a watch failing as it opens (backed off up to 30 s)."),
    ("events", "Watch events of the kind applied since start (ADDED, MODIFIED, DELETED, BOOKMARK): how the model "
               "follows the cluster between lists."),
    ("errors", "Failed lists and watches of the kind since start (an HTTP or connection error, an ERROR watch "
               "event other than 410, a watch the server ended at once without an event), each backed off. A 410 "
               "Gone is not one (gone_relists_total). Errors alone are blips: failing_seconds says whether the "
               "stream is down."),
    ("gone_relists", "Watches of the kind the API server answered 410 Gone since start (the resourceVersion "
                     "resumed from was compacted away), each followed by a full relist of the kind. One after a "
                     "watch was down is normal; a steady rate means the watch keeps falling behind the API "
                     "server's history, and every relist reads every object of the kind."),
)
_SYNCED = ("1 once the first complete list of the kind is applied (it stays 1). /readyz is false, and every verb "
           "refuses, while either kind is 0: alert on 0 for more than a few minutes after start (the API server "
           "refuses or times out the list: errors_total and the log say why).")
_FAILING = ("Seconds the kind's list or watch has been failing, with no success since the first failure (0 when "
            "healthy). Past stowage_extender_feed_stale_after_seconds (--stale-after) /readyz is false and every "
            "verb refuses: the model may be stale. Alert on failing_seconds > stale_after_seconds.")
_LIST_AGE = ("Seconds since the last complete list of the kind (absent before the first). Lists come after a 410 "
             "Gone and at each resync (every 10 minutes, once the watch then open ends: up to ~20 minutes apart); "
             "far past that with failing_seconds above 0, the lists are failing.")
_SILENT = ("Seconds since the API server last said anything on the kind's stream: a watch event or bookmark, a "
           "watch opened or ended, a list (absent before the first list). A healthy watch ends at least every "
           "2 x its timeout, so this stays below that on a quiet cluster. Past "
           "stowage_extender_feed_silent_after_seconds, while failing_seconds is 0, /readyz is false and every "
           "verb refuses: the connection hangs somewhere between (a proxy, a half-open TCP connection) without an "
           "error to count. Alert on silent_seconds > silent_after_seconds.")
_SILENT_AFTER = ("How long a stream that is not failing may be silent (stowage_extender_feed_silent_seconds) "
                 "before /readyz turns false and every verb refuses: 2 x the watch timeout + 60 s + --stale-after.")
_STALE_AFTER = ("--stale-after: how long a stream may fail (stowage_extender_feed_failing_seconds) before /readyz "
                "turns false and every verb refuses.")
# The feed's counts now (FeedHealth keys; gauges: they fall when the objects are fixed or gone).
_COUNTS = (
    ("node_errors", "Nodes whose GPU inventory the extender cannot read now (their stowage.io/gpu-inventory "
                    "annotation or GPU labels): they get no schedulable cards until fixed. Names and why: the "
                    "extender's log. Alert on > 0."),
    ("pod_errors", "Pods whose stowage.io/allocation record cannot be read or is not honoured now (malformed, or "
                   "not what the extender writes for that pod: e.g. unsigned under --record-key-file): their "
                   "cards are not counted (an earlier valid record is kept), so they may be given to another "
                   "pod; and objects that came with the uid of another pod the model holds (a peer that lies), "
                   "ignored. Names and why: the extender's log. Alert on > 0."),
    ("unrecorded_gpu_pods", "GPU pods bound without Stowage's allocation record now (by another scheduler, or "
                            "by hand): Stowage does not count their cards and may give them to other pods. Names: "
                            "the extender's log and stowage inspect (unrecordedGpuPods). Alert on > 0."),
)


class FeedCollector:
    """The feed's series, read from ``health`` (``KubeFeeder.health``) at each scrape."""

    def __init__(self, health: ReadHealth) -> None:
        self.health = health

    def collect(self) -> Iterator[Metric]:
        h = self.health()
        streams = sorted(h["streams"].items())
        for key, help_text in _STREAM_COUNTERS:
            counter = CounterMetricFamily(PREFIX + key, help_text, labels=["kind"])
            for kind, st in streams:
                counter.add_metric([kind], st[key])  # type: ignore[literal-required]
            yield counter
        synced = GaugeMetricFamily(PREFIX + "synced", _SYNCED, labels=["kind"])
        failing = GaugeMetricFamily(PREFIX + "failing_seconds", _FAILING, labels=["kind"])
        list_age = GaugeMetricFamily(PREFIX + "last_list_age_seconds", _LIST_AGE, labels=["kind"])
        silent = GaugeMetricFamily(PREFIX + "silent_seconds", _SILENT, labels=["kind"])
        for kind, st in streams:
            synced.add_metric([kind], int(st["synced"]))
            failing.add_metric([kind], st["failing_s"])
            if st["list_age_s"] is not None:   # unknown before the first list: absent, not 0
                list_age.add_metric([kind], st["list_age_s"])
            if st["silent_s"] is not None:     # likewise
                silent.add_metric([kind], st["silent_s"])
        yield from (synced, failing, list_age, silent)
        yield GaugeMetricFamily(PREFIX + "stale_after_seconds", _STALE_AFTER, value=h["stale_after_s"])
        yield GaugeMetricFamily(PREFIX + "silent_after_seconds", _SILENT_AFTER, value=h["silent_after_s"])
        for key, help_text in _COUNTS:
            yield GaugeMetricFamily(PREFIX + key, help_text, value=h[key])  # type: ignore[literal-required]
