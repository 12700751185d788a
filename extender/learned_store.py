"""The departed pods' past (extender/learned_past.py) kept in a ConfigMap across restarts.

A starting extender reads the ConfigMap before its first list (:meth:`PastStore.load`) and
learns what it holds; while it runs, :class:`PastKeeper` writes what it has learned from pods
deleted since, every ``interval_s`` when something changed and once more when it stops (a
rollout's SIGTERM). Every write merges with what is stored (per shape the larger count,
:meth:`DepartedPods.merged`), with the ConfigMap's resourceVersion as precondition, so the
replicas of an HA pair may both write without losing each other's counts or counting a pod twice.

The past is advice, not the model: the cards, hosts and allocations still come from list+watch
only. So a store that cannot be read (no RBAC, an API error, a document that fails validation)
is logged, with the reason, and the extender starts without a past, deciding as it did before
the store existed; a write that fails is logged and tried again at the next interval.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .learned_past import DepartedPods, PastError

log = logging.getLogger("stowage.extender.learned")

DATA_KEY = "departed-pods.json"
DEFAULT_NAME = "stowage-learned-past"
DEFAULT_NAMESPACE = "stowage-system"
DEFAULT_INTERVAL_S = 60.0


_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def parse_location(value: str, default_namespace: str) -> tuple[str, str] | None:
    """``NAME`` or ``NAMESPACE/NAME`` (``off`` or empty: no store); ValueError if either is not a
    name Kubernetes accepts (a namespace is a DNS label, a ConfigMap name a DNS subdomain)."""
    value = value.strip()
    if value in ("", "off"):
        return None
    namespace, _, name = value.rpartition("/")
    namespace = namespace or default_namespace
    if not _LABEL.fullmatch(namespace):
        raise ValueError(f"namespace {namespace!r} is not a valid namespace name (a DNS label: lower-case "
                         "letters, digits and '-', at most 63)")
    if not _SUBDOMAIN.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid ConfigMap name (a DNS subdomain: lower-case letters, "
                         "digits, '-' and '.', at most 253)")
    return namespace, name


@dataclass
class PastStore:
    """One ConfigMap, ``namespace/name``, holding the departed pods' document under DATA_KEY."""

    core: Any                       # kubernetes.client.CoreV1Api
    namespace: str
    name: str
    request_timeout_s: float = 10.0
    attempts: int = 3               # reads at start, and writes on a conflict
    sleep: Callable[[float], None] = time.sleep
    last_error: str = field(default="", init=False)

    @property
    def where(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    def load(self) -> DepartedPods:
        """What is stored; empty if nothing is (first start) or it cannot be used (logged)."""
        for attempt in range(self.attempts):
            try:
                cm = self._get()
            except Exception as exc:  # noqa: BLE001 (any API or network failure: logged, retried)
                status = getattr(exc, "status", None)
                self.last_error = f"cannot read the {self.where}: {_reason(exc)}"
                if status in (401, 403) or attempt == self.attempts - 1:
                    log.error("%s; starting without the departed pods' past (pods deleted before this "
                              "start are not learned)", self.last_error)
                    return DepartedPods()
                self.sleep(0.5 * 2 ** attempt)
                continue
            if cm is None:
                log.info("no %s yet: nothing learned from departed pods (first start)", self.where)
                return DepartedPods()
            try:
                past = _document(cm)
            except PastError as exc:
                self.last_error = f"the {self.where} cannot be used: {exc}"
                log.error("%s; starting without the departed pods' past (the next write replaces it)",
                          self.last_error)
                return DepartedPods()
            self.last_error = ""
            return past
        return DepartedPods()  # not reached

    def save(self, mine: DepartedPods) -> bool:
        """Merge ``mine`` into what is stored and write it if that changes it; True once stored."""
        from kubernetes.client.rest import ApiException

        for _ in range(self.attempts):
            cm = self._get()
            try:
                stored = _document(cm) if cm is not None else DepartedPods()
            except PastError:
                stored = DepartedPods()     # unusable (logged at load): replaced
            merged = stored.merged(mine)
            if cm is not None and dict(merged.counts) == dict(stored.counts):
                return True                 # nothing new (the other replica wrote the same)
            body = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": self.name, "namespace": self.namespace,
                                 "labels": {"app.kubernetes.io/part-of": "stowage"}},
                    "data": {DATA_KEY: merged.to_json()}}
            try:
                if cm is None:
                    self.core.create_namespaced_config_map(self.namespace, body,
                                                           _request_timeout=self.request_timeout_s)
                else:
                    body["metadata"]["resourceVersion"] = cm["metadata"]["resourceVersion"]
                    self.core.replace_namespaced_config_map(self.name, self.namespace, body,
                                                            _request_timeout=self.request_timeout_s)
                return True
            except ApiException as exc:
                if exc.status == 409:       # written meanwhile (the other replica): merge again
                    continue
                raise
        return False

    def _get(self) -> dict | None:
        """The ConfigMap as JSON, or None if it does not exist."""
        from .kube import read_or_none
        return read_or_none(self.core.read_namespaced_config_map, self.name, self.namespace,
                            _request_timeout=self.request_timeout_s)


def _document(cm: dict) -> DepartedPods:
    data = cm.get("data") or {}
    text = data.get(DATA_KEY) if isinstance(data, dict) else None
    if not isinstance(text, str):
        raise PastError(f"no {DATA_KEY} in its data")
    return DepartedPods.from_json(text)


def _reason(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status in (401, 403):
        return (f"HTTP {status} (the extender's RBAC must allow get, create and update of this ConfigMap: "
                "scheduler-config/rbac.yaml)")
    if status is not None:
        return f"HTTP {status} {getattr(exc, 'reason', '')}".strip()
    return f"{type(exc).__name__}: {exc}"


class PastKeeper:
    """Writes ``snapshot()`` (the service's departed pods) to ``store`` every ``interval_s`` when
    it changed, and once more at :meth:`stop`. Failures are logged (each new reason once, at
    warning; repeats at debug) and retried at the next interval."""

    def __init__(self, store: PastStore, snapshot: Callable[[], DepartedPods],
                 interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.store = store
        self.snapshot = snapshot
        self.interval_s = interval_s
        self.writes = 0
        self.failures = 0
        self.clock = time.monotonic
        self._dirty_since: float | None = None    # when a change not yet written was first seen
        self._written: DepartedPods | None = None
        self._error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "PastKeeper":
        self._thread = threading.Thread(target=self._run, name="learned-past", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop, writing what changed since the last write (a rollout's SIGTERM must not lose it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.write_if_changed()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.write_if_changed()

    def unwritten_s(self) -> float:
        """Seconds since a change of the departed pods was first seen and not written since (0 if
        none): grows while writes fail, so it can be alerted on. Changes seen only between two
        intervals count from the check that saw them."""
        since = self._dirty_since
        return 0.0 if since is None else max(0.0, self.clock() - since)

    def write_if_changed(self) -> bool:
        """Write if the departed pods changed since the last write; True if nothing is left unwritten."""
        snap = self.snapshot()
        if self._written is not None and dict(snap.counts) == dict(self._written.counts):
            return True
        if self._written is None and not snap.counts:
            return True                     # nothing departed yet: nothing to keep
        if self._dirty_since is None:
            self._dirty_since = self.clock()
        try:
            ok = self.store.save(snap)
        except Exception as exc:  # noqa: BLE001 (API or network: logged, retried next interval)
            reason = f"cannot write the {self.store.where}: {_reason(exc)}"
            (log.warning if reason != self._error else log.debug)("%s; will try again", reason)
            self._error = reason
            self.failures += 1
            return False
        if not ok:
            log.debug("the %s kept changing under this write; will try again", self.store.where)
            self.failures += 1
            return False
        if self._error:
            log.info("the %s is written again", self.store.where)
        self._error = ""
        self._written = snap
        self._dirty_since = None
        self.writes += 1
        log.debug("wrote %d departed pods (%d shapes) to the %s", snap.pods, len(snap), self.store.where)
        return True
