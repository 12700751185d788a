"""The exporter's scrape path: one snapshot (NVML, PodResources, checkpoint, /proc) -> gauges.

A Prometheus scrape calls :meth:`GpuCollector.collect`; it reuses a snapshot younger than
``cache_s`` (several Prometheus replicas, or a scrape plus a liveness probe, cost one NVML pass),
otherwise takes a new one under a lock (concurrent scrapes never read NVML twice at once, and those
that waited for a reading share it). Every
source may be missing: the snapshot records which ones answered and the series say so
(``stowage_exporter_up{source=...}``); nothing here raises into the HTTP handler.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from . import checkpoint as ckpt
from . import podlogs
from .attribution import MAX_NAME, CardSplit, Owner, holders_by_card, nameable, split_card
from .cgroups import ProcessGone, pod_of_pid
from .checkpoint import PodKey, UidMap
from .nvmlreader import CardSample, NvmlReader
from gpunode.health import DEFAULT_IGNORED_XIDS
from gpunode.podresources.client import ContainerDevices, PodResourcesError, list_devices

log = logging.getLogger("stowage.exporter")

SOURCES = ("nvml", "xid", "podresources", "attribution", "podlogs", "checkpoint", "proc")
CARD_LABELS = ["node", "gpu", "model"]
POD_LABELS = ["node", "gpu", "model", "pod", "namespace", "container"]


@dataclass
class ExporterConfig:
    node: str = ""
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    checkpoint_path: str = ckpt.DEFAULT_CHECKPOINT
    pod_logs_dir: str = podlogs.DEFAULT_POD_LOGS
    proc_root: str = "/proc"
    cache_s: float = 2.0
    kubelet_timeout_s: float = 5.0
    # How long a scrape waits for a reading another scrape is taking, before it answers without one
    # (a reading that hangs in NVML must not hang every scrape). Past the kubelet's timeout (a
    # reading waits that long on a slow kubelet), within Prometheus' 10 s scrape timeout.
    reading_wait_s: float = 8.0
    # the device plugin's health rules (its --ignored-xids / --recovery-quiet-seconds)
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    health_disabled: bool = False
    recovery_quiet_s: float = 120.0


def reader_for(cfg: ExporterConfig, **extra: Any) -> NvmlReader:
    """The NVML reader the config asks for; ``extra``: reader options no flag sets (tests)."""
    return NvmlReader(ignored_xids=cfg.ignored_xids, health_disabled=cfg.health_disabled,
                      recovery_quiet_s=cfg.recovery_quiet_s, **extra)


@dataclass
class Snapshot:
    cards: list[CardSample] = field(default_factory=list)
    splits: dict[str, CardSplit] = field(default_factory=dict)     # uuid -> per-container shares
    up: dict[str, bool] = field(default_factory=dict)
    taken_at: float = 0.0       # monotonic time the reading started
    finished_at: float = 0.0    # ... and ended


class _Status:
    """Logs a source going down (with the reason) and coming back, once per change, not per scrape."""

    def __init__(self) -> None:
        self.state: dict[str, tuple[bool, str]] = {}

    def set(self, source: str, ok: bool, why: str = "", level: int = logging.WARNING, detail: str = "",
            exc_info: BaseException | None = None) -> bool:
        """Record one reading of ``source``; a new ``why`` is logged, a new ``detail`` alone is not
        (e.g. which PIDs: they change with every short-lived process, the cause does not).
        ``exc_info``: a failure nothing expected (a bug), whose traceback goes with that one line."""
        prev = self.state.get(source)
        if prev is None or prev[0] != ok or (not ok and prev[1] != why):
            if ok:
                if prev is not None:
                    log.info("%s: available again", source)
            else:
                log.log(level, "%s: %s%s", source, why, detail, exc_info=exc_info)
        self.state[source] = (ok, why)
        return ok


def _not_there(exc: BaseException) -> bool:
    """Whether a name source failed only because its path does not exist (not mounted), rather
    than being there and unreadable (a FIFO, too large, not the kubelet's format, no permission)."""
    return isinstance(exc.__cause__, FileNotFoundError)


def _short(name: str, keep: int = 40) -> str:
    """A name for a log line: quoted, cut to ``keep`` characters with its length said."""
    return repr(name) if len(name) <= keep else f"{name[:keep]!r}...({len(name)} characters)"


class Snapshotter:
    """Takes snapshots; each source is read at most once per snapshot."""

    def __init__(self, cfg: ExporterConfig, nvml: NvmlReader | None = None,
                 list_fn: Callable[[str, float], list[ContainerDevices]] = list_devices) -> None:
        self.cfg = cfg
        self.nvml = nvml or reader_for(cfg)
        self._list = list_fn
        self.status = _Status()
        self._unnamed = 0        # containers left out for their names on the last listing (logged on change)

    def take(self) -> Snapshot:
        """NVML's cards, then who holds them (:meth:`_attribute`). Attribution failing any way costs
        the per-pod series, never the card series read before it."""
        snap = Snapshot(taken_at=time.monotonic())
        cards = self.nvml.read()
        snap.up["nvml"] = self.status.set("nvml", cards is not None, self.nvml.error or "NVML unavailable")
        snap.cards = cards if cards is not None else self.nvml.known_unreachable()
        if self.nvml.xid_watched is not None:   # its failures are logged by the XID watcher itself
            snap.up["xid"] = self.nvml.xid_watched
        try:
            assignments = self._list(self.cfg.pod_resources_socket, self.cfg.kubelet_timeout_s)
            snap.up["podresources"] = self.status.set("podresources", True)
        except PodResourcesError as exc:
            assignments = None
            snap.up["podresources"] = self.status.set(
                "podresources", False, f"{exc}; serving per-card metrics without pod attribution")
        except Exception as exc:   # the listing broke where nothing expected it (below the client, or a bug)
            assignments = None
            snap.up["podresources"] = self.status.set(
                "podresources", False, f"listing the kubelet's PodResources raised {type(exc).__name__}",
                detail=f" ({exc}); serving per-card metrics without pod attribution", exc_info=exc)
        if assignments is not None:
            self._attribute(snap, assignments)
        return snap

    def _attribute(self, snap: Snapshot, assignments: list[ContainerDevices]) -> None:
        """Split each held card between its holders into ``snap.splits``.

        A step that raises on odd data (a bug: nothing here expects to) costs what depends on it:
        decoding the holders, every per-pod series; matching processes to pods, the shared cards'
        splits (a card with one holder needs no process); splitting one card, that card's. Before,
        the exception left :meth:`take` and the scrape lost every series, the card series NVML had
        already answered included, logged anew on every scrape. Now ``stowage_exporter_up
        {source="attribution"}`` is 0 and the failure is logged once (with its traceback) until it
        changes or attribution works again.
        """
        failed: tuple[str, BaseException] | None = None
        # An unreachable card has nothing measured to split: its holders get no series for it.
        live = [c for c in snap.cards if c.reachable]
        try:
            assignments = self._nameable(assignments)
            holders = holders_by_card(assignments, [c.uuid for c in live])
        except Exception as exc:
            failed, holders = ("decoding which containers hold which card", exc), {}
        shared = [c for c in live if len(holders.get(c.uuid, {})) > 1]
        owners: dict[int, PodKey | Owner] = {}
        if shared:
            try:
                owners = self._owners(shared, assignments, snap)
            except Exception as exc:
                failed = failed or ("matching the shared cards' processes to pods", exc)
                shared_uuids = {c.uuid for c in shared}
                live = [c for c in live if c.uuid not in shared_uuids]
        for c in live:
            if holders.get(c.uuid):
                try:
                    snap.splits[c.uuid] = split_card(c, holders[c.uuid], owners)
                except Exception as exc:
                    failed = failed or (f"splitting card {c.uuid} between its holders", exc)
        why, exc = failed if failed is not None else ("", None)
        snap.up["attribution"] = self.status.set(
            "attribution", failed is None, f"{why} raised {type(exc).__name__}",
            detail=f" ({exc}); the per-pod series it concerns are left out", exc_info=exc)

    def _nameable(self, assignments: list[ContainerDevices]) -> list[ContainerDevices]:
        """The rows whose names can be served as label values (:func:`attribution.nameable`); the
        others are left out, logged when their number changes, not on every scrape."""
        good: list[ContainerDevices] = []
        bad: list[ContainerDevices] = []
        for a in assignments:
            (good if nameable(a) else bad).append(a)
        count = len({(a.namespace, a.pod, a.container) for a in bad})
        if count != self._unnamed:
            if count:
                a = bad[0]
                log.warning("PodResources lists %d container(s) whose namespace, pod or container name no Kubernetes "
                            "object can have (empty, or over %d characters), e.g. %s/%s/%s; their series are left out",
                            count, MAX_NAME, _short(a.namespace), _short(a.pod), _short(a.container))
            else:
                log.info("PodResources lists no container with an impossible name any more")
            self._unnamed = count
        return good

    def _owners(self, shared: list[CardSample], assignments: list[ContainerDevices],
                snap: Snapshot) -> dict[int, PodKey | Owner]:
        """PID -> pod for the processes on shared cards: cgroup -> pod UID -> namespace/name, the
        UID named by the pod log directories and/or the kubelet checkpoint joined with PodResources."""
        pods: dict[str, PodKey] = {}
        logs_absent = ckpt_absent = False
        try:
            pods.update(podlogs.read(self.cfg.pod_logs_dir))
            logs_ok = True
        except podlogs.PodLogsError as exc:
            logs_ok, logs_why, logs_absent = False, str(exc), _not_there(exc)
        try:
            uid_map: UidMap | None = ckpt.join(assignments, ckpt.read(self.cfg.checkpoint_path))
            ckpt_why = ""
        except ckpt.CheckpointError as exc:
            uid_map, ckpt_why, ckpt_absent = None, str(exc), _not_there(exc)
        if uid_map is not None:
            for uid, key in uid_map.pods.items():
                pods.setdefault(uid, key)
        # Either source suffices; only both missing is worth a warning.
        neither = not logs_ok and uid_map is None
        hint = "; processes cannot be matched to pods, shared cards are split by units held (estimated)"
        level = logging.WARNING if neither else logging.DEBUG
        # A source that is not there at all while the other names the pods is the deployment's
        # choice (the shipped DaemonSet mounts /var/log/pods, not the checkpoint), not a missing
        # source: it gets no series. Before, it was served as 0 for ever and the shipped alert
        # StowageExporterSourceDown (stowage_exporter_up == 0) fired on every node with a shared card.
        if not (logs_absent and uid_map is not None):
            snap.up["podlogs"] = self.status.set(
                "podlogs", logs_ok, "" if logs_ok else logs_why + (hint if neither else ""), level)
        if not (ckpt_absent and logs_ok):
            snap.up["checkpoint"] = self.status.set("checkpoint", uid_map is not None,
                                                    ckpt_why + (hint if neither else ""), level)
        owners: dict[int, PodKey | Owner] = {}
        unreadable = []
        for c in shared:
            for p in c.processes:
                if p.pid in owners:
                    continue
                try:
                    cg = pod_of_pid(p.pid, self.cfg.proc_root)
                except ProcessGone:
                    unreadable.append(p.pid)
                    owners[p.pid] = Owner.UNKNOWN
                    continue
                if cg is None:
                    owners[p.pid] = Owner.FOREIGN
                elif cg.pod_uid in pods:
                    owners[p.pid] = pods[cg.pod_uid]
                elif uid_map is not None and cg.pod_uid not in uid_map.known_uids:
                    owners[p.pid] = Owner.FOREIGN      # holds no device at all on this node
                else:
                    owners[p.pid] = Owner.UNKNOWN
        snap.up["proc"] = self.status.set(
            "proc", not unreadable,
            f"cannot read the cgroup of GPU processes under {self.cfg.proc_root} "
            "(does the exporter run with hostPID?); their shares are estimated",
            detail=f" (PIDs {sorted(unreadable)[:5]})")
        return owners

    def close(self) -> None:
        self.nvml.close()


class GpuCollector(Collector):
    """prometheus_client collector: per-card and per-pod gauges from a (briefly cached) snapshot."""

    def __init__(self, snapshotter: Snapshotter, node: str, cache_s: float = 2.0, wait_s: float = 8.0) -> None:
        self.snapshotter = snapshotter
        self.node = node
        self.cache_s = cache_s
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._snap: Snapshot | None = None
        self._reading_since: float | None = None   # monotonic start of the reading in progress
        self._stalled: float | None = None         # start of the reading said not to end (logged once)

    def snapshot(self) -> Snapshot:
        """A snapshot younger than ``cache_s``, or one finished while this call waited for the lock
        (a reading slower than the cache window is shared by the scrapes queued behind it, not
        taken again by each in turn: they would wait one slow reading per scrape ahead of them).

        The lock is waited for at most ``wait_s``: a reading that hangs (an NVML call a wedged
        driver never answers) held it for ever, and every scrape waited behind it, one more thread
        each, while Prometheus saw only timeouts. Past ``wait_s`` a scrape answers without a reading
        (every source down), said once per such reading; only the scrape taking it waits with it."""
        arrived = time.monotonic()
        if not self._lock.acquire(timeout=self.wait_s):
            return self._without_reading()
        try:
            s = self._snap
            if s is None or (s.finished_at < arrived and time.monotonic() - s.taken_at >= self.cache_s):
                started = self._reading_since = time.monotonic()
                try:
                    s = self.snapshotter.take()
                except Exception:  # a bug must cost one scrape, not the process
                    log.exception("taking a snapshot failed")
                    s = Snapshot(up={k: False for k in SOURCES}, taken_at=time.monotonic())
                s.finished_at = time.monotonic()
                self._snap, self._reading_since = s, None
                if self._stalled == started:
                    log.warning("the reading that had not ended ended after %.0f s", s.finished_at - started)
            return s
        finally:
            self._lock.release()

    def _without_reading(self) -> Snapshot:
        """What a scrape answers while a reading has not ended within ``wait_s``: every source down."""
        since = self._reading_since
        if since is not None and self._stalled != since:
            self._stalled = since
            log.warning("a reading has not ended after %.0f s (NVML or the kubelet not answering?); scrapes answer "
                        "without one (stowage_exporter_up 0) until it ends", time.monotonic() - since)
        return Snapshot(up={k: False for k in SOURCES}, taken_at=time.monotonic(), finished_at=time.monotonic())

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fams = self._families()
        s = self.snapshot()
        util, used, total, power, temp, healthy, pod_util, pod_mem, estimated, up = fams
        n = self.node
        for c in s.cards:
            labels = [n, c.uuid, c.model]
            healthy.add_metric(labels, 1.0 if c.healthy else 0.0)
            if not c.reachable:
                continue                     # known, but nothing can be measured: health only
            if c.utilization is not None:
                util.add_metric(labels, c.utilization)
            used.add_metric(labels, c.memory_used_bytes)
            total.add_metric(labels, c.memory_total_bytes)
            if c.power_watts is not None:
                power.add_metric(labels, c.power_watts)
            if c.temperature_c is not None:
                temp.add_metric(labels, c.temperature_c)
            split = s.splits.get(c.uuid)
            if split is None:
                continue
            estimated.add_metric(labels, 1.0 if split.estimated else 0.0)
            for ref, share in sorted(split.shares.items()):
                pl = [n, c.uuid, c.model, ref.pod, ref.namespace, ref.container]
                if share.utilization is not None:
                    pod_util.add_metric(pl, share.utilization)
                pod_mem.add_metric(pl, round(share.memory_bytes))
        for src in SOURCES:
            if src in s.up:
                up.add_metric([n, src], 1.0 if s.up[src] else 0.0)
        return iter(fams)

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        g = GaugeMetricFamily
        return [
            g("stowage_gpu_utilization_ratio", "Share of time the card was busy (NVML utilisation), 0..1.", labels=CARD_LABELS),
            g("stowage_gpu_memory_used_bytes", "Card memory in use, bytes.", labels=CARD_LABELS),
            g("stowage_gpu_memory_total_bytes", "Card memory in total, bytes.", labels=CARD_LABELS),
            g("stowage_gpu_power_watts", "Card power draw, watts.", labels=CARD_LABELS),
            g("stowage_gpu_temperature_celsius", "Card core temperature, degrees Celsius.", labels=CARD_LABELS),
            g("stowage_gpu_healthy", "1 while the device plugin would advertise the card Healthy, else 0: 0 after a "
              "critical XID, on a failing probe (pending retired pages or row remaps, volatile uncorrectable ECC, "
              "MIG mode), while XID events cannot be watched, or while NVML cannot read the card.",
              labels=CARD_LABELS),
            g("stowage_pod_gpu_utilization_ratio",
              "Share of the card's time this container's processes kept it busy, 0..1.", labels=POD_LABELS),
            g("stowage_pod_gpu_memory_used_bytes",
              "Card memory used by this container's processes on this card, bytes.", labels=POD_LABELS),
            g("stowage_gpu_attribution_estimated",
              "1 when this card's per-pod split is estimated from units held rather than measured per process.",
              labels=CARD_LABELS),
            g("stowage_exporter_up", "1 when this data source answered on the last snapshot, 0 when it is missing.",
              labels=["node", "source"]),
        ]
