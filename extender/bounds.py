"""What each of the extender's memory bounds holds now and what passing it cost since start.

The extender keeps four things whose size pod authors (or the size of the cluster) decide, each
bounded in bytes (and the first three in entries too), each settable on the command line:

- ``pending_pods``: a copy of each pending pod of Stowage's schedulers, for bind and the requeue
  (:mod:`extender.pending_pods`; ``--pending-pods-mib``);
- ``pod_cache``: the pods parsed at filter, for prioritize and bind (``ExtenderService.pod_info``;
  ``--pod-cache-mib``);
- ``learned_pods``: the uids (and shapes) of the pods the placers learned from
  (:mod:`extender.learned_uids`; ``--learned-pods-mib``);
- ``list_learn``: the learn copies a pod list keeps until its end (``KubeFeeder._relist``;
  ``--list-learn-mib``).

Passing a bound never fails a pod, but it costs something (:data:`COSTS`), and each said so at
most once in the log. Why this record: an operator of a big cluster needs to see a bound coming
(what it holds against its bound) and what passing it has cost (how often), per replica, in
Prometheus (``/metrics``: :mod:`extender.verbs`) and in the feed's ``status()``.
"""
from __future__ import annotations

from typing import TypedDict

# What one entry dropped (or, for list_learn, one batch shown early) costs: the HELP of /metrics.
COSTS = {
    "pending_pods": "the pod, if not seen at filter, is read with a GET at bind, and is not requeued when "
                    "the model gains room (kube-scheduler retries it by itself, at the latest after 5 minutes)",
    "pod_cache": "a pod bound after its entry went is parsed again at bind, from the pending pod's copy or "
                 "a GET (with --simulated, its bind is refused)",
    "learned_pods": "the pod is learned twice if seen again, and its deletion is not counted in the departed "
                    "pods' past (--learned-configmap)",
    "list_learn": "the pods of a list are learned in creation order only within each batch, not across the "
                  "list, so the learned table may differ from the running extender's until its next rebuild",
}


class BoundUse(TypedDict):
    """One bound of entries and bytes: what it holds now, its bounds, and the entries it dropped
    since start (only for a bound: not those bound, deleted or no longer listed)."""

    entries: int
    max_entries: int
    bytes: int       # pending_pods: what the entries hold; pod_cache, learned_pods: an estimate that errs high
    max_bytes: int
    dropped: int


class ListLearnUse(TypedDict):
    """The list's learn copies (held only while a pod list runs): the most a list held at once
    since start, the bound, and the batches shown before a list's end for it."""

    max_bytes: int
    peak_bytes: int
    early_batches: int
