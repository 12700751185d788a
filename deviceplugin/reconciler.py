"""Background reconciler: make every pod's ``stowage.io/allocation`` name the card(s) it really got.

Every ``interval_s`` (5 s) and ``after_allocate_s`` (0.5 s) after each answered Allocate, it reads
the kubelet's PodResources List (which names pod and container for every device ID) and this
node's pods, asks :func:`deviceplugin.corrections.corrections` which records disagree, and rewrites
those with a JSON merge patch of the annotation alone, with the pod's uid as precondition (a
re-created pod of the same name is never touched). The extender's feeder sees the change on its
watch and moves the pod's load in its model. Corrections are logged as warnings and counted in
``stowage_deviceplugin_record_corrections_total``; mismatches it cannot express (a pod on more
cards than recorded) are logged once as errors and counted in
``stowage_deviceplugin_record_mismatches``.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from stowage.allocation import ALLOCATION_ANNOTATION, RecordTrust

from gpunode.devices import DeviceTable
from .podres import KubeletAllocations
from .corrections import Correction, corrections, kubelet_view

log = logging.getLogger("stowage.deviceplugin.reconciler")


class Reconciler:
    def __init__(self, table_of: Callable[[], DeviceTable], node: str, pod_lister: Any,
                 source: KubeletAllocations, core_api: Any,
                 interval_s: float = 5.0, after_allocate_s: float = 0.5,
                 registry: CollectorRegistry | None = None, trust: RecordTrust | None = None) -> None:
        self.trust = trust or RecordTrust()   # reads records as Allocate does; signs the ones it rewrites
        # the plugin's current card table: a card read after start replaces it with a larger one
        self.table_of = table_of
        self.node, self.pod_lister, self.source, self.core_api = node, pod_lister, source, core_api
        self.interval_s, self.after_allocate_s = interval_s, after_allocate_s
        self.registry = registry or CollectorRegistry()
        self.corrected = Counter("stowage_deviceplugin_record_corrections", "Pod allocation records rewritten to "
                                 "the card(s) the kubelet actually allocated", registry=self.registry)
        self.mismatches = Gauge("stowage_deviceplugin_record_mismatches", "Pods whose record disagrees with the "
                                "kubelet's allocation in a way the plugin cannot correct", registry=self.registry)
        self.applied: list[Correction] = []   # every correction written, oldest first (status, tests)
        self.rounds = 0
        self._noted: set[str] = set()
        self._lock = threading.Lock()         # one round at a time
        self._cond = threading.Condition()
        self._due: float | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="record-reconciler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        """An Allocate was answered: reconcile shortly (the kubelet lists the devices once it has them)."""
        with self._cond:
            due = time.monotonic() + self.after_allocate_s
            if self._due is None or due < self._due:
                self._due = due
            self._cond.notify_all()

    def _patch(self, c: Correction) -> None:
        body = {"metadata": {"uid": c.uid, "annotations": {ALLOCATION_ANNOTATION: self.trust.encode(c.new, c.uid)}}}
        self.core_api.patch_namespaced_pod(c.name, c.namespace, body, _content_type="application/merge-patch+json",
                                           _request_timeout=10)

    def run_once(self) -> list[Correction]:
        """One round: read, compare, patch. Returns the corrections written in this round."""
        with self._lock:
            self.rounds += 1
            rows = self.source.rows()
            if rows is None:
                return []
            try:
                pods = self.pod_lister.pods()
            except Exception as exc:
                log.warning("reconciliation skipped: cannot list the pods of node %s (%s)", self.node, exc)
                return []
            table = self.table_of()
            fixes, notes = corrections(pods, kubelet_view(rows, table), self.node, table, self.trust)
            self.mismatches.set(len(notes))
            for note in notes:
                if note not in self._noted:
                    log.error("allocation record mismatch: %s", note)
            self._noted = set(notes)
            done = []
            for c in fixes:
                try:
                    self._patch(c)
                except Exception as exc:  # conflict (pod re-created), API down: the next round retries
                    log.warning("could not correct the allocation record of %s (%s); retrying next round", c.ref, exc)
                    continue
                self.corrected.inc()
                self.applied.append(c)
                done.append(c)
                log.warning("CORRECTED allocation record of %s: card(s) %s -> %s (%s)", c.ref,
                            ", ".join(c.old.uuids), ", ".join(c.new.uuids), c.why)
            return done

    def _run(self) -> None:
        next_round = time.monotonic() + self.interval_s
        while True:
            with self._cond:
                while not self._stop:
                    now = time.monotonic()
                    due = min(next_round, self._due if self._due is not None else next_round)
                    if now >= due:
                        break
                    self._cond.wait(due - now)
                if self._stop:
                    return
                self._due = None
            next_round = time.monotonic() + self.interval_s
            try:
                self.run_once()
            except Exception:  # never let the thread die; the next round tries again
                log.exception("reconciliation round failed")

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
