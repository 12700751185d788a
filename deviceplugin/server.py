"""The running plugin: one gRPC endpoint per resource, registration, kubelet-restart watch, health.

Order matters and follows the real kubelet (../shared/kubelet/README.md): each endpoint is
serving on its unix socket BEFORE ``Registration.Register`` is called, because the kubelet calls
GetDevicePluginOptions and opens ListAndWatch inside Register; the first ListAndWatch send never
waits on anything. A watcher polls every ``poll_s`` (20 ms, a few stat calls) for our socket vanishing or
``kubelet.sock`` being re-created (a kubelet restart wipes the directory) and then serves again
and re-registers, well within the ~1.2 s after which a restarted kubelet fails pending pods.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import grpc

from stowage import genprotos
from stowage.allocation import AllocationRecord, RecordTrust
from stowage.inventory import Card, encode_inventory
from stowage.resources import DEFAULT_MEMORY_UNIT_MIB, GPU_RESOURCES, RESOURCE_GPU_MEMORY

from gpunode.podresources.client import DEFAULT_SOCKET as DEFAULT_POD_RESOURCES_SOCKET, PodList

from . import allocator, corrections
from gpunode.devices import UNHEALTHY, DeviceTable, id_lengths, units_per_card
from .podres import KubeletAllocations
from gpunode.backoff import Backoff, Heartbeat, RoundGuard
from gpunode.deadline import DeadlineCalls, Stuck
from gpunode.health import DEFAULT_IGNORED_XIDS, HealthTracker, XidLogPacer
from gpunode.nvml import GpuInfo, LateCards, Nvml, NvmlUnavailable, XidEvent, XidWatch

genprotos.ensure("deviceplugin/v1beta1/api.proto")
from deviceplugin.v1beta1 import api_pb2 as pb  # noqa: E402
from deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc  # noqa: E402

log = logging.getLogger("stowage.deviceplugin")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


# A failed Register is retried after this long, or as soon as a kubelet seen down (kubelet.sock
# missing or refusing connections) accepts connections again. A live kubelet that answers Register
# with an error is asked again only after the delay: kubelet.sock accepting says nothing new then.
REGISTER_RETRY_S = 1.0


def kubelet_accepts(path: str) -> bool:
    """Whether something listens on the unix socket ``path`` (one connect, closed at once).

    While the kubelet is down its ``kubelet.sock`` stays behind and refuses connections, so
    Register fails fast on every try. A restarted kubelet re-admits its pods about 0.7-0.9 s after
    its registration server starts (../shared/kubelet/README.md): waiting out a retry delay would
    register too late and those pods fail. One connect per poll while backing off tells the
    moment the server is back, whatever inode the re-created socket got.
    """
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.05)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


# ListAndWatch streams an endpoint serves at once; more are refused (RESOURCE_EXHAUSTED). A stream
# holds one of the endpoint's gRPC workers for as long as it is open, whether its client reads or
# not: uncapped, streams opened by anyone left no worker for the kubelet's Allocate, which then
# waited for ever. The kubelet keeps one stream per registration; the workers beyond the cap
# (UNARY_WORKERS) always answer the unary calls.
MAX_STREAMS = 8
UNARY_WORKERS = 8

# A refusal's gRPC status message is cut to this many characters (the whole text is logged): it
# travels as a trailer, and gRPC clients refuse trailers past 8-16 KiB (grpc-go accepts more, but
# the kubelet then writes it into the pod's status).
MAX_DETAILS = 4096

# Device sets GetPreferredAllocation steered, kept for the Allocate that follows (the kubelet makes
# the two calls back to back, one container at a time); a set no Allocate asks for (a caller other
# than the kubelet) must not stay for ever.
MAX_STEERED = 16

# The largest message the kubelet receives from a plugin: grpc-go's default receive limit (a v1.28
# kubelet dials plugins without MaxCallRecvMsgSize). A larger ListAndWatch fails on its side, it does
# not retry, and the node's capacity for the resource silently stays 0.
KUBELET_MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class PluginDirUnusable(RuntimeError):
    """The device-plugin directory (``--plugin-dir``) does not exist and cannot be created. The
    kubelet makes it when it starts, so this is a flag or a mount to fix, not a wait: the plugin
    exits saying so (once running, a directory that vanishes is waited for instead)."""


class MessageTooLarge(ValueError):
    """The device list of a resource would not fit one kubelet message; ``smallest_unit_mib`` would."""

    def __init__(self, message: str, smallest_unit_mib: int) -> None:
        super().__init__(message)
        self.smallest_unit_mib = smallest_unit_mib


def _varint_len(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def list_response_bytes(cards: list[GpuInfo], resource: str, memory_unit_mib: int) -> int:
    """The serialized size of ``resource``'s ListAndWatchResponse with every device Unhealthy (the
    longest health text, so the largest the list gets), computed from one sample device per ID
    length: exact, and fast for any unit."""
    total = 0
    for c in cards:
        topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=c.numa)]) if c.numa >= 0 else None
        for length, count in id_lengths(resource, c, memory_unit_mib).items():
            size = pb.Device(ID="x" * length, health=UNHEALTHY, topology=topo).ByteSize()
            total += count * (1 + _varint_len(size) + size)   # field tag, length, the device
    return total


def check_message_sizes(cards: list[GpuInfo], resources: Any, memory_unit_mib: int) -> None:
    """Raise :class:`MessageTooLarge` when a resource's device list would not fit one kubelet message.

    Only the memory unit makes lists that long; the error names the smallest unit that fits (the
    size only shrinks as the unit grows, so a bisection finds it).
    """
    for r in resources:
        size = list_response_bytes(cards, r, memory_unit_mib)
        if size <= KUBELET_MAX_MESSAGE_BYTES:
            continue
        lo, hi = memory_unit_mib, max(c.memory_mib for c in cards)   # hi: one device per card, fits
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if list_response_bytes(cards, r, mid) <= KUBELET_MAX_MESSAGE_BYTES else (mid, hi)
        devices = sum(sum(id_lengths(r, c, memory_unit_mib).values()) for c in cards)
        hint = (f"; the smallest unit that fits is --memory-unit-mib {hi} (the extender's --memory-unit-mib "
                "must be the same)") if r == RESOURCE_GPU_MEMORY else ""
        raise MessageTooLarge(
            f"{r}: at --memory-unit-mib {memory_unit_mib} this node's {len(cards)} card(s) make {devices} devices, "
            f"a ListAndWatch message of {size / 2 ** 20:.1f} MiB, over the kubelet's {KUBELET_MAX_MESSAGE_BYTES >> 20} "
            f"MiB gRPC limit: the kubelet would fail ListAndWatch and advertise none{hint}", hi)


def warn_cards_below_unit(cards: list[GpuInfo], resources: Any, memory_unit_mib: int) -> None:
    """Say which cards offer no ``nvidia.com/gpu-memory`` device because ``--memory-unit-mib`` is
    larger than their memory: every shared-GPU pod is refused there ("Insufficient
    nvidia.com/gpu-memory"), and without this line nothing on the node said why."""
    if RESOURCE_GPU_MEMORY not in resources:
        return
    small = [c for c in cards if units_per_card(RESOURCE_GPU_MEMORY, c, memory_unit_mib) == 0]
    if small:
        log.warning("%s: at --memory-unit-mib %d, %d card(s) have less memory than one unit and offer no "
                    "%s device, so no shared-GPU pod can be placed on them: %s (the extender's "
                    "--memory-unit-mib must be the same as this one; a smaller unit gives them devices)",
                    RESOURCE_GPU_MEMORY, memory_unit_mib, len(small), RESOURCE_GPU_MEMORY,
                    ", ".join(f"{c.uuid} ({c.memory_mib} MiB)" for c in small))


def socket_name(resource: str) -> str:
    return "stowage-" + resource.split("/", 1)[-1] + ".sock"


@dataclass
class PluginConfig:
    node: str = ""
    plugin_dir: str = DEFAULT_PLUGIN_DIR
    memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB
    resources: tuple[str, ...] = GPU_RESOURCES
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    health_disabled: bool = False
    recovery_quiet_s: float = 120.0
    probe_interval_s: float = 10.0
    event_wait_ms: int = 1000
    nvml_deadline_s: float = 5.0       # a probe or late-card read NVML has not answered by then: the card is Unhealthy
    health_stall_s: float = 60.0       # the health thread stuck in one NVML call this long: every card is Unhealthy
    event_retry_first_s: float = 0.1   # a failed event wait is retried after this, doubling ...
    event_retry_max_s: float = 5.0     # ... up to this
    event_recreate_after: int = 5      # failed waits in a row before the event set is made anew
    xid_log_every_s: float = 60.0      # XID events of one kind on one card: one warning line per this long
    rediscover_first_s: float = 1.0    # a card unreadable at start is read again after this, doubling ...
    rediscover_max_s: float = 60.0     # ... up to this
    dev_root: str = "/dev"
    poll_s: float = 0.02
    serve_retry_first_s: float = 0.1   # a socket that cannot be served is retried after this, doubling ...
    serve_retry_max_s: float = 5.0     # ... up to this
    register_timeout_s: float = 5.0
    core_api: Any = None          # kubernetes CoreV1Api, or None to run without the API server
    pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET   # "" disables (in-memory fallback)
    reconcile_interval_s: float = 5.0
    reconcile_after_allocate_s: float = 0.5
    record_key_file: str | None = None         # records are signed in this cluster: honour only signed ones
    scheduler_names: tuple[str, ...] = ()      # honour records only on these schedulers' pods (none: any)

    def trust(self) -> RecordTrust:
        """Which records count, built as the extender builds its own from the same options
        (:meth:`RecordTrust.from_options`); an unusable key file raises ``AllocationError``."""
        return RecordTrust.from_options(self.record_key_file, self.memory_unit_mib, self.scheduler_names)


class DeviceState:
    """Cards, their health, and a version counter ListAndWatch streams wait on.

    ``table`` is never changed in place: a card read late replaces it with a larger one
    (:meth:`set_table`), so a reader that takes ``table`` once sees one consistent set of cards.
    """

    def __init__(self, table: DeviceTable) -> None:
        self.table = table
        self.health: dict[str, bool] = {c.uuid: True for c in table.cards}
        self.version = 0
        self.cond = threading.Condition()

    def set_health(self, health: dict[str, bool]) -> None:
        with self.cond:
            if health != self.health:
                self.health = dict(health)
                self.version += 1
                self.cond.notify_all()

    def set_table(self, table: DeviceTable, health: dict[str, bool]) -> None:
        """Advertise ``table``'s cards from now on (cards are only ever added): every ListAndWatch
        stream sends its resource's new full list."""
        with self.cond:
            self.table, self.health = table, dict(health)
            self.version += 1
            self.cond.notify_all()

    def list_response(self, resource: str) -> Any:
        with self.cond:
            entries = self.table.devices(resource, self.health)
        devs = []
        for e in entries:
            topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=e.numa)]) if e.numa >= 0 else None
            devs.append(pb.Device(ID=e.id, health=e.health, topology=topo))
        return pb.ListAndWatchResponse(devices=devs)

    def cards(self) -> list[Card]:
        with self.cond:
            return [Card(index=c.index, uuid=c.uuid, model=c.name, memory_mib=c.memory_mib,
                         healthy=self.health.get(c.uuid, True), numa=c.numa, nvlink=c.nvlink)
                    for c in self.table.cards]


class Allocations:
    """Glue between the kubelet calls and the pure :mod:`allocator`: pod listing, ledger, steering."""

    def __init__(self, state: DeviceState, node: str, pod_lister: Any, dev_root: str,
                 kubelet: KubeletAllocations | None = None, on_allocated: Callable[[], None] | None = None,
                 trust: RecordTrust | None = None) -> None:
        self.state, self.node, self.pod_lister, self.dev_root = state, node, pod_lister, dev_root
        self.trust = trust or RecordTrust()
        self.kubelet, self.on_allocated = kubelet, on_allocated
        self.ledger = allocator.Ledger()
        # (resource, device set) -> (pod uid, the position of the container asked again it was steered for, or
        # None: its next one), newest last
        self._steered: OrderedDict[tuple[str, frozenset[str]], tuple[str, int | None]] = OrderedDict()
        # pod uid -> its record as moved by allocator.relocation, until the kubelet's list says where
        # it is: the kubelet reuses an init container's devices for the app container without a
        # GetPreferredAllocation, and PodResources (v1.28) does not list init containers
        self._moved: dict[str, AllocationRecord] = {}
        self._lock = threading.Lock()  # one decision at a time: two calls must not pick the same pod

    def new_kubelet(self, resource: str) -> None:
        """``resource``'s socket is served anew: a kubelet restarted since may ask again for what was
        answered before (:meth:`allocator.Ledger.kubelet_restarted_since`)."""
        with self._lock:
            self.ledger.new_kubelet(resource)

    def _read(self, resource: str) -> tuple[list[Any], PodList | None]:
        """The node's pods (API server) and the kubelet's PodResources list (None: unavailable).

        Read once per call, whatever its number of container requests: the kubelet sends one, a
        caller that sends thousands must not cost thousands of lists while the lock is held.
        """
        if self.pod_lister is None:
            raise allocator.AllocationRefused(allocator.FAILED_PRECONDITION, f"{resource}: the plugin runs without "
                                              "Kubernetes API access, so it cannot read pod allocation records")
        try:
            pods = self.pod_lister.pods()
        except Exception as exc:
            raise allocator.AllocationRefused("UNAVAILABLE", f"{resource}: cannot list the pods of node "
                                              f"{self.node} from the API server: {exc}") from exc
        return pods, self.kubelet.listing() if self.kubelet is not None else None

    def _survey(self, resource: str, table: DeviceTable, pods: list[Any], listed: PodList | None) -> allocator.PodSurvey:
        self.ledger.forget_except({str((p.get("metadata") or {}).get("uid")) for p in pods})
        view: corrections.KubeletView | None = None   # None: PodResources unreachable, the ledger is all we know
        fixed: dict[str, AllocationRecord] = {}
        if listed is not None:
            view = corrections.kubelet_view(listed.rows, table, listed.pods)
            uid_of = {(str(m.get("namespace") or ""), str(m.get("name") or "")): str(m.get("uid") or "")
                      for m in ((p.get("metadata") or {}) for p in pods)}
            owners = {r: view.owners(r) for r in GPU_RESOURCES}
            self.ledger.reattribute(lambda r, i: uid_of.get(owners[r][i]) if i in owners.get(r, {}) else None)
            fixes, _ = corrections.corrections(pods, view, self.node, table, self.trust)
            fixed = {f.uid: f.new for f in fixes}
        # Moved pods that count as given devices (a moved pod whose answers the kubelet lists under
        # another pod was not the one admitted; one whose answer the kubelet never took up was not
        # moved at all: it is judged afresh from its record when the kubelet asks again).
        given = {uid for p in pods if (uid := str((p.get("metadata") or {}).get("uid"))) in self._moved
                 and allocator.given_any(p, self.ledger, view)}
        self._moved = {u: r for u, r in self._moved.items() if u in given}
        found = allocator.survey(pods, self.node, resource, self.ledger, view, {**self._moved, **fixed},
                                 trust=self.trust, table=table)
        found.unhealthy = frozenset(u for u, ok in self.state.health.items() if not ok)
        return found

    def preferred(self, resource: str, req: Any) -> Any:
        out = []
        with self._lock:
            table = self.state.table   # one decision, one set of cards (a card read late only adds to it)
            found = self._survey(resource, table, *self._read(resource))   # a hint changes nothing: one survey
            for creq in req.container_requests:
                cand, ids = allocator.preferred(table, resource, list(creq.available_deviceIDs),
                                                list(creq.must_include_deviceIDs), int(creq.allocation_size), found)
                key = (resource, frozenset(ids))
                self._steered[key] = (cand.uid, cand.done if cand.retried else None)
                self._steered.move_to_end(key)
                while len(self._steered) > MAX_STEERED:
                    self._steered.popitem(last=False)
                if cand.moved_from is not None:
                    log.warning("%s: the kubelet offers no device on %s's recorded card(s) %s (%s); steering it to the "
                                "equal free card(s) %s", resource, cand.ref, ", ".join(cand.moved_from.uuids),
                                self._why_not_offered(cand.moved_from.uuids), ", ".join(cand.record.uuids))
                log.info("%s: steering %s to %s", resource, cand.ref, ", ".join(ids))
                out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=out)

    def _why_not_offered(self, uuids: list[str]) -> str:
        """Why the kubelet offers no device on these cards, as far as the plugin can tell: it offers
        only Healthy devices (a card that went Unhealthy after its pod was bound), and only those its
        checkpoint gives to no pod."""
        sick = [u for u in uuids if not self.state.health.get(u, True)]
        if sick:
            return f"{', '.join(sick)} {'is' if len(sick) == 1 else 'are'} Unhealthy"
        return "its checkpoint still gives them to another pod, e.g. one gone while it was down"

    def allocate(self, resource: str, req: Any) -> Any:
        out = []
        with self._lock:
            table = self.state.table
            read = self._read(resource)
            # A refused call books nothing: one bad container request among good ones must not leave
            # the good ones' pods counted as served, or their real admission is refused.
            saved_ledger, saved_moved = self.ledger.copy(), dict(self._moved)
            try:
                out = self._allocate(resource, req, table, read)
            except Exception:
                self.ledger, self._moved = saved_ledger, saved_moved
                raise
        if self.on_allocated is not None:
            self.on_allocated()
        return pb.AllocateResponse(container_responses=out)

    def _allocate(self, resource: str, req: Any, table: DeviceTable, read: tuple[list[Any], PodList | None]) -> list[Any]:
        """Answer each container request in turn (the ledger counts the earlier ones); raises on the first refused."""
        out = []
        for creq in req.container_requests:
            ids = list(creq.devices_ids)
            found = self._survey(resource, table, *read)
            steered = self._steered.pop((resource, frozenset(ids)), None)
            cand = allocator.allocate(table, resource, ids, found, steered)
            ans = allocator.container_answer(table, resource, ids, cand)
            self.ledger.add(cand.uid, resource, ids, at=cand.done)
            if cand.moved_from is not None:   # the reconciler corrects the record once the kubelet lists it
                self._moved[cand.uid] = cand.record
                log.warning("%s: %s moved from card(s) %s, which the kubelet did not offer, to %s", resource,
                            cand.ref, ", ".join(cand.moved_from.uuids), ", ".join(cand.record.uuids))
            specs = [pb.DeviceSpec(container_path=f"/dev/{n}", host_path=f"/dev/{n}", permissions="rw")
                     for n in ans.dev_names if os.path.exists(os.path.join(self.dev_root, n))]
            log.info("%s: allocated %s to %s (container %d of %d)", resource, ", ".join(ids), cand.ref,
                     cand.done + 1, len(cand.sizes))
            out.append(pb.ContainerAllocateResponse(envs=ans.envs, devices=specs))
        return out


class ResourceServicer(pb_grpc.DevicePluginServicer):
    """The DevicePlugin service of one resource."""

    def __init__(self, resource: str, state: DeviceState, allocs: Allocations, stop: threading.Event) -> None:
        self.resource, self.state, self.allocs, self.stop = resource, state, allocs, stop
        self._streams = threading.BoundedSemaphore(MAX_STREAMS)
        self._refusing = False   # a refusal was logged loudly; quiet until a stream frees a slot

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Any:
        if not self._streams.acquire(blocking=False):
            log.log(logging.DEBUG if self._refusing else logging.WARNING, "%s: refused a ListAndWatch: %d streams "
                    "are open already (the kubelet keeps one; something else is calling the plugin)",
                    self.resource, MAX_STREAMS)
            self._refusing = True
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self.resource}: {MAX_STREAMS} ListAndWatch "
                          "streams are open already")
        try:
            seen, last = -1, b""
            while not self.stop.is_set() and context.is_active():
                with self.state.cond:
                    if self.state.version == seen:
                        self.state.cond.wait(0.2)
                        continue
                    seen = self.state.version
                # Built after the lock is let go: a change meanwhile is in this list already, and
                # its version would send the same list again (seen in a flapping card's stream).
                # Compared by digest: a list may be 4 MiB, and each open stream would keep one.
                resp = self.state.list_response(self.resource)
                digest = hashlib.sha256(resp.SerializeToString(deterministic=True)).digest()
                if digest != last:
                    last = digest
                    yield resp
        finally:
            self._refusing = False
            self._streams.release()

    def _guard(self, fn: Callable[[], Any], context: Any) -> Any:
        try:
            return fn()
        except allocator.AllocationRefused as exc:
            log.error("refused: %s", exc.message)
            details = exc.message
            if len(details) > MAX_DETAILS:
                details = details[:MAX_DETAILS - 80] + f" ... ({len(details)} characters; the plugin's log has them all)"
            context.abort(getattr(grpc.StatusCode, exc.code), details)

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return self._guard(lambda: self.allocs.preferred(self.resource, request), context)

    def Allocate(self, request: Any, context: Any) -> Any:
        return self._guard(lambda: self.allocs.allocate(self.resource, request), context)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()


@dataclass
class Endpoint:
    """One resource's gRPC server on its unix socket, and its registration with the kubelet."""

    resource: str
    path: str
    state: DeviceState
    allocs: Allocations
    server: Any = None
    stop_streams: threading.Event = field(default_factory=threading.Event)
    sock_ino: int | None = None
    registered_with: int | None = None   # inode of the kubelet.sock we registered with
    next_try: float = 0.0
    kubelet_was_down: bool = False       # kubelet.sock seen missing or refusing since the last failed Register
    register_error: str = ""             # the last failed Register's error, logged loudly once
    registrations: int = 0
    serving: Backoff = field(default_factory=Backoff)   # failed serve() tries in a row

    def serve(self) -> None:
        """Serve on a fresh socket at ``path``. The old server (its socket already deleted by a
        restarting kubelet) is stopped without waiting for its streams: a restarted kubelet
        re-admits pods ~0.7 s after it is back, and registration must come before that."""
        self.stop_streams.set()
        if self.server is not None:
            self.server.stop(grace=None)   # cancels what is left; returns at once
            self.server = None
        self.sock_ino = None
        if os.path.lexists(self.path):
            os.unlink(self.path)  # a stale socket of an earlier run
        self.stop_streams = threading.Event()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_STREAMS + UNARY_WORKERS,
                                                        thread_name_prefix=f"dp-{self.resource}"))
        pb_grpc.add_DevicePluginServicer_to_server(
            ResourceServicer(self.resource, self.state, self.allocs, self.stop_streams), server)
        server.add_insecure_port("unix://" + os.path.abspath(self.path))
        server.start()
        self.server = server
        self.sock_ino = os.stat(self.path).st_ino
        self.allocs.new_kubelet(self.resource)
        self.registered_with = None
        self.next_try = 0.0   # a fresh socket is registered at once, whatever an earlier try left

    def close(self, remove: bool = False) -> None:
        self.stop_streams.set()
        if self.server is not None:
            self.server.stop(grace=0.5).wait(2)
            self.server = None
        if remove and self.sock_ino is not None:
            try:
                if os.stat(self.path).st_ino == self.sock_ino:
                    os.unlink(self.path)
            except FileNotFoundError:
                pass
        self.sock_ino = None

    def socket_intact(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.sock_ino
        except FileNotFoundError:
            return False

    def register(self, kubelet_sock: str, timeout_s: float) -> None:
        opts = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
        with grpc.insecure_channel("unix://" + os.path.abspath(kubelet_sock)) as ch:
            pb_grpc.RegistrationStub(ch).Register(
                pb.RegisterRequest(version=API_VERSION, endpoint=os.path.basename(self.path),
                                   resource_name=self.resource, options=opts), timeout=timeout_s)
        self.registrations += 1


# The key of the late-card reads among the health thread's NVML calls (the probes' are ("probe", UUID)).
LATE_READ = ("late cards",)


class HealthMonitor:
    """Background thread: NVML XID events and periodic probes feed the tracker, then the state.

    It also adds the cards NVML could not read at start once they answer (``late``; every card when
    NVML could not even count them at start): the tracker and the XID watch are this thread's alone,
    so a new card joins both without locks, and the state gets the larger table in one step.
    """

    def __init__(self, nvml: Nvml, state: DeviceState, cfg: PluginConfig, on_change: Callable[[], None],
                 late: LateCards | None = None) -> None:
        self.nvml, self.state, self.cfg, self.on_change, self.late = nvml, state, cfg, on_change, late
        self.tracker = HealthTracker([c.uuid for c in state.table.cards], cfg.ignored_xids, cfg.health_disabled,
                                     cfg.recovery_quiet_s)
        self._stop = threading.Event()
        self._next_probe = 0.0   # monotonic time of the next round of probes (set when the thread starts)
        self._thread = threading.Thread(target=self._run, name="health", daemon=True)
        # Probes and late-card reads are made on workers with a deadline: a call NVML never answers
        # (a card off the bus) blocked this thread for ever before (gpunode.deadline).
        self.calls = DeadlineCalls(cfg.nvml_deadline_s, name="health-nvml")
        # The event wait, the event set's making and a late card's registration are made here, with no
        # deadline; the watchdog notices when one of them does not return (_watch_progress).
        self._beat = Heartbeat("health thread", cfg.health_stall_s, log)   # its rounds, and the call it is in
        self._watchdog = threading.Thread(target=self._watch_progress, name="health-watchdog", daemon=True)

    def start(self) -> None:
        """Probe every card once, then watch in the background. The first probes run here, before
        the plugin registers with the kubelet, so a card unfit at start (in MIG mode, needing a
        reset) is Unhealthy in the first list instead of for one probe interval (10 s by default),
        long enough for the kubelet to give it to a pod. With health checks disabled the probes read
        MIG mode alone (:meth:`gpunode.nvml.Nvml.probe`)."""
        if self._probe_all(time.monotonic()):
            self.state.set_health(self.tracker.snapshot())
            self.on_change()
        self._beat.beat()
        self._thread.start()
        self._watchdog.start()

    def _watch_progress(self) -> None:
        """Say when the health thread has finished no round for ``health_stall_s``, and advertise
        every card Unhealthy until it finishes one again.

        The event wait (``nvmlEventSetWait``), the event set's making and a late card's registration
        for XID events are made on the health thread itself: they return at once or after the wait's
        timeout but in a driver fault, and a worker for each wait (every second) would cost more than
        the fault it guards against. Such a call that never returns stopped the thread silently: no
        XID and no probe was seen again, and every card stayed as last advertised (Healthy). Now its
        cards' health is not known, and is said to be bad: the kubelet admits no new pod to them. The
        thread's own view wins again at the end of its next round (it compares what it last
        advertised with what is advertised). This thread only reads the health thread's progress and
        replaces the advertised health, never the tracker or the XID watch (the health thread's alone).
        """
        stalled = False
        while not self._stop.wait(min(1.0, self.cfg.health_stall_s / 4)):
            try:
                stalled = self._watch_round(stalled)
            except Exception as exc:   # (a bug or a publisher's fault: said, and the next round looks again)
                log.error("health thread's watchdog: a round failed (%s); it goes on watching", exc, exc_info=True)

    def _watch_round(self, stalled: bool) -> bool:
        """One look at the health thread's progress (:meth:`_watch_progress`); returns whether it
        is stalled now. Apart so that a round that raises costs that round only: the thread once
        ended with it, and a hung health thread was never noticed again."""
        cards = sorted(self.state.health)
        judged = not self.cfg.health_disabled   # health checks disabled: no card is judged, this neither
        was, stalled = stalled, self._beat.stalled(
            f"Every card is advertised Unhealthy until it goes on: {', '.join(cards) or 'no card yet'}"
            if judged else "")
        if stalled and not was and judged:
            self.state.set_health({u: False for u in cards})
            self.on_change()
        return stalled

    def _probe_all(self, now: float, uuids: list[str] | None = None) -> set[str]:
        """Probe every tracked card (or ``uuids``) at once, each waited for at most ``nvml_deadline_s``;
        returns those whose health changed (each logged)."""
        uuids = list(self.tracker.cards) if uuids is None else uuids
        checks = not self.cfg.health_disabled
        answers = self.calls.run({("probe", u): functools.partial(self.nvml.probe, u, health_checks=checks)
                                  for u in uuids})
        return {u for u in uuids if self._apply_probe(u, answers[("probe", u)], now)}

    def _apply_probe(self, uuid: str, answer: str | None | Stuck, now: float) -> bool:
        """Apply one probe's answer to the tracker; whether the card's health changed (logged when it did).

        A probe past its deadline is a failed probe (a card NVML cannot answer about is not fit for
        work), said once when it passes the deadline; the card is not probed again until that call
        returns (:class:`gpunode.deadline.DeadlineCalls`), and its quiet period restarts each round
        until then. With health checks disabled a card NVML cannot reach is not judged, nor is one
        whose probe hangs.
        """
        was = self.tracker.cards[uuid].healthy
        stuck = answer if isinstance(answer, Stuck) else None
        problem = answer if stuck is None else None
        if stuck is not None and not self.cfg.health_disabled:
            problem = (f"NVML did not answer a probe within {self.cfg.nvml_deadline_s:g} s (the card may have fallen "
                       "off the bus); it is probed again once that call returns")
        if not self.tracker.on_probe(uuid, problem, now):
            if stuck is not None and stuck.new:
                log.warning("card %s: NVML did not answer a probe within %g s; it is probed again once that call "
                            "returns", uuid, self.cfg.nvml_deadline_s)
            return False
        log.warning("card %s is %s%s", uuid, "healthy again" if not was else "unhealthy",
                    "" if not was else f": {self.tracker.cards[uuid].reason}")
        return True

    def _run(self) -> None:
        """Rounds until stopped: one event wait, the probes when due, the late cards when due.

        A round that raises (a bug, or NVML failing in a way nothing above expected) is logged once
        with its traceback (repeats at debug) and the next one follows after a back-off: before, the
        exception ended the thread, and from then on no XID, probe or late card was ever seen while
        the plugin went on advertising the cards as they were.
        """
        cfg = self.cfg
        watch = None
        if not cfg.health_disabled:   # an event set NVML cannot make yet is retried by the watch
            self._beat.doing = "making the NVML event set (nvmlEventSetCreate, nvmlDeviceRegisterEvents of each card)"
            watch = XidWatch(list(self.tracker.cards), self._stop, cfg.event_retry_first_s,
                             cfg.event_retry_max_s, cfg.event_recreate_after)
        pacer = XidLogPacer(cfg.xid_log_every_s)
        rounds = RoundGuard("health thread", log)
        self._next_probe = time.monotonic() + cfg.probe_interval_s
        try:
            while not self._stop.is_set():
                try:
                    self._round(watch, pacer)
                except Exception as exc:
                    self._stop.wait(rounds.failed(exc))
                    self._beat.beat()
                    continue
                self._beat.beat()
                rounds.succeeded()
        finally:
            if watch is not None:
                watch.close()

    def _round(self, watch: XidWatch | None, pacer: XidLogPacer) -> None:
        """One event wait, then the probes and the late cards when due; advertises what changed."""
        cfg = self.cfg
        changed: set[str] = set()
        if watch is None:
            self._stop.wait(cfg.event_wait_ms / 1000)
            now = time.monotonic()
        else:
            self._beat.doing = (
                "re-making the NVML event set (nvmlEventSetCreate, nvmlDeviceRegisterEvents of each card)"
                if watch.remaking else "the NVML event wait (nvmlEventSetWait)")
            ev = watch.wait(cfg.event_wait_ms)   # backs off by itself while the channel is broken
            self._beat.doing = "the probes or late-card reads"   # each with its deadline
            now = time.monotonic()
            changed = self.tracker.on_wait(ev, watch.watched, watch.broken, now)
            if ev is not None and ev.wait_failed:   # the failure itself is logged by the watch, once
                if changed:
                    log.warning("unhealthy while their XID events cannot be watched: %s", ", ".join(sorted(changed)))
            elif ev is not None:
                self._log_event(ev, changed, pacer)
        for uuid, xid, quiet in pacer.summaries():
            log.warning("NVML events: %d more such events of %s on %s in the %g s after the last one logged, "
                        "logged at debug", quiet, f"XID {xid}" if xid is not None else "an XID event",
                        uuid or "an unknown card", pacer.every_s)
        if now >= self._next_probe:
            self._next_probe = now + cfg.probe_interval_s
            changed |= self._probe_all(now)
        if self.late is not None and not self.calls.busy(LATE_READ) and (
                self.calls.answered(LATE_READ) or self.late.wait_left() <= 0):
            changed |= self._add_late_cards(watch, now)
        # a round that failed half-way may have changed the tracker without saying so: compare
        if changed or self.tracker.snapshot() != self.state.health:
            self.state.set_health(self.tracker.snapshot())
            self.on_change()

    def _log_event(self, ev: XidEvent, changed: set[str], pacer: XidLogPacer) -> None:
        """One line per XID event that changes a card's health; the others paced (:class:`XidLogPacer`)."""
        loud, quiet = pacer.loud(ev.uuid, ev.xid)
        what = f"XID {ev.xid}" if ev.xid is not None else (ev.detail or "an XID event")
        if changed:
            outcome = f" -> unhealthy: {', '.join(sorted(changed))}"
        elif ev.xid is not None and ev.xid in self.tracker.ignored_xids:
            outcome = " (ignored: an application's fault, the card is fine)"
        else:
            outcome = " (already unhealthy)"
        more = f"; {quiet} more such events since the last one logged, logged at debug" if quiet else ""
        log.log(logging.WARNING if (loud or changed) else logging.DEBUG, "NVML event: %s on %s%s%s", what,
                ev.uuid or "an unknown card", outcome, more)

    def _add_late_cards(self, watch: XidWatch | None, now: float) -> set[str]:
        """Read the due cards that were unreadable at start; advertise those that answer. Returns their UUIDs.

        Each new card must keep every resource's ListAndWatch message within the kubelet's limit (the
        startup check did not know it): one that does not is refused, said once, and not read again.
        """
        assert self.late is not None
        read = self.calls.run({LATE_READ: self.late.poll})[LATE_READ]
        if isinstance(read, Stuck):   # not touched again (nor its state read) until the call returns
            if read.new:
                log.warning("reading the GPUs unreadable at start did not return within %g s; read again once "
                            "that call returns", self.cfg.nvml_deadline_s)
            return set()
        if not read:
            return set()
        cfg, table = self.cfg, self.state.table
        indices = {c.index for c in table.cards}
        added: list[GpuInfo] = []
        for index, tries in sorted(read.items()):
            cards = self.nvml.cards(indices | {index})
            card = next(c for c in cards if c.index == index)
            try:
                check_message_sizes(cards, cfg.resources, cfg.memory_unit_mib)
            except MessageTooLarge as exc:
                log.error("GPU %d (%s) can be read now but is not advertised: %s", index, card.uuid, exc)
                continue
            warn_cards_below_unit([card], cfg.resources, cfg.memory_unit_mib)
            indices.add(index)
            added.append(card)
            log.warning("GPU %d can be read now, after %d failed tries: %s %s, %d MiB, NUMA %s; advertised", index,
                        tries, card.uuid, card.name, card.memory_mib, card.numa if card.numa >= 0 else "unknown")
        if not added:
            return set()
        for card in added:
            self.tracker.add(card.uuid)
            if watch is not None:
                self._beat.doing = f"registering {card.uuid} for XID events (nvmlDeviceRegisterEvents)"
                watch.add(card.uuid)
        self._beat.doing = "the probes or late-card reads"
        self._probe_all(now, [c.uuid for c in added])
        self.state.set_table(DeviceTable(self.nvml.cards(indices), cfg.memory_unit_mib), self.tracker.snapshot())
        return {c.uuid for c in added}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class DevicePlugin:
    """The whole node agent. ``start()`` returns once every endpoint is serving."""

    def __init__(self, cfg: PluginConfig, nvml: Nvml | None = None) -> None:
        self.cfg = cfg
        self.nvml = nvml or Nvml()
        self.nvml_ok = False
        self.endpoints: list[Endpoint] = []
        self.publisher: Any = None
        self.reconciler: Any = None
        self.health: HealthMonitor | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.kubelet_sock = os.path.join(cfg.plugin_dir, KUBELET_SOCKET)
        self._dir_present = True
        self._publishing = threading.Lock()   # see _publish

    def _discover(self) -> list[GpuInfo]:
        """The cards to serve from the start. Each NVML call is waited for at most ``nvml_deadline_s``
        (:meth:`gpunode.nvml.Nvml.start_within`): one that hangs (a card off the bus) kept ``start``
        from ever serving before, silently; now it is said, and what it was about is read in the
        background (:class:`~gpunode.nvml.LateCards`) once it returns."""
        try:
            cards = self.nvml.start_within(self.cfg.nvml_deadline_s)
            self.nvml_ok = True   # initialised, or to be by LateCards: what NVML does not answer now is read later
        except NvmlUnavailable as exc:
            log.error("%s -- advertising no GPUs", exc)
            return []
        except Exception as exc:
            log.error("GPU discovery failed (%s) -- advertising no GPUs", exc)
            return []
        if not cards and not self.nvml.unreadable and self.nvml.uncounted is None:
            log.error("NVML reports no GPUs on this node -- advertising none")
        for c in cards:
            log.info("GPU %d: %s %s, %d MiB, NUMA %s, NVLink to %s", c.index, c.uuid, c.name, c.memory_mib,
                     c.numa if c.numa >= 0 else "unknown", list(c.nvlink) or "none")
        return cards

    def start(self) -> None:
        cfg = self.cfg
        trust = cfg.trust()   # the key file first: a plugin that cannot read it must not start serving
        try:
            Path(cfg.plugin_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:   # a file in its way, a read-only mount: the operator's flag, said as such
            raise PluginDirUnusable(f"cannot create the device-plugin directory {cfg.plugin_dir} (--plugin-dir): "
                                    f"{exc.strerror or exc}") from None
        cards = self._discover()
        try:
            check_message_sizes(cards, cfg.resources, cfg.memory_unit_mib)   # before serving anything
        except MessageTooLarge:
            self.nvml.shutdown()
            raise
        warn_cards_below_unit(cards, cfg.resources, cfg.memory_unit_mib)
        self.state = DeviceState(DeviceTable(cards, cfg.memory_unit_mib))
        lister = None
        if cfg.core_api is not None and cfg.node:
            from .kube import InventoryPublisher, PodLister
            lister = PodLister(cfg.core_api, cfg.node)
            self.publisher = InventoryPublisher(cfg.core_api, cfg.node)
            self._publish()
        else:
            log.warning("no Kubernetes API access or node name: inventory not published, Allocate will refuse")
        source = KubeletAllocations(cfg.pod_resources_socket)
        source.rows()  # learn now what the kubelet already allocated (or log, once, that we cannot)
        if lister is not None:
            from .reconciler import Reconciler
            self.reconciler = Reconciler(lambda: self.state.table, cfg.node, lister, source, cfg.core_api,
                                         cfg.reconcile_interval_s, cfg.reconcile_after_allocate_s, trust=trust)
            self.reconciler.start()
        self.allocs = Allocations(self.state, cfg.node, lister, cfg.dev_root, source,
                                  self.reconciler.poke if self.reconciler is not None else None, trust=trust)
        for r in cfg.resources:
            ep = Endpoint(r, os.path.join(cfg.plugin_dir, socket_name(r)), self.state, self.allocs,
                          serving=Backoff(cfg.serve_retry_first_s, cfg.serve_retry_max_s))
            self.endpoints.append(ep)
            self._serve(ep)   # a path that cannot be served now is retried by the watcher, as later
        late = LateCards(self.nvml, cfg.rediscover_first_s, cfg.rediscover_max_s)
        if self.nvml_ok and (self.state.table.cards or late.waiting):   # also for a node whose every card is late
            self.health = HealthMonitor(self.nvml, self.state, cfg, self._publish, late if late.waiting else None)
            self.health.start()
        self._sync()
        self._watcher = threading.Thread(target=self._watch, name="kubelet-watch", daemon=True)
        self._watcher.start()

    def _publish(self) -> None:
        """Hand the publisher the cards as advertised now. Two threads publish (the health thread,
        and its watchdog while it is stalled): each reads the state and hands it over under one
        lock, so the last value handed over was read last. Before, a watchdog held up between the
        two handed its stale "every card Unhealthy" over after the health thread had published the
        cards Healthy again, and the annotation kept it until health changed again."""
        if self.publisher is not None:
            with self._publishing:
                self.publisher.publish(encode_inventory(self.state.cards(), self.cfg.memory_unit_mib))

    def _kubelet_ino(self) -> int | None:
        try:
            return os.stat(self.kubelet_sock).st_ino
        except FileNotFoundError:
            return None

    def _sync(self) -> None:
        """Serve again where our socket vanished; register where kubelet.sock is new to us.

        The endpoints register concurrently: each Register waits for the kubelet to call back
        (GetDevicePluginOptions, the first ListAndWatch), and one after another they took most of
        the ~0.7 s a restarted kubelet leaves before it re-admits pods on a loaded node.
        """
        if not self._plugin_dir_present():
            return
        due = []
        for ep in self.endpoints:
            if self._stop.is_set():
                return
            if not ep.socket_intact() and not self._serve_again(ep):
                continue
            kino = self._kubelet_ino()
            if kino is None:
                ep.kubelet_was_down = True
                continue
            if ep.registered_with == kino:
                continue
            if time.monotonic() < ep.next_try:   # backing off after a failed Register
                if not kubelet_accepts(self.kubelet_sock):
                    ep.kubelet_was_down = True   # the stale socket of a stopped kubelet
                    continue
                if not ep.kubelet_was_down:
                    continue   # the kubelet that refused us is still up: wait out the delay
            due.append((ep, kino))
        if len(due) == 1:
            self._register(*due[0])
        elif due:
            threads = [threading.Thread(target=self._register, args=d, name=f"register-{d[0].resource}")
                       for d in due]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

    def _plugin_dir_present(self) -> bool:
        """Whether the device-plugins directory exists; logs once when it goes and once when it is back.

        Without it nothing can be served or registered; one stat per poll notices its return at
        once (the kubelet re-creates it when it starts, and re-admits pods ~0.7 s later).
        """
        present = os.path.isdir(self.cfg.plugin_dir)
        if present == self._dir_present:
            return present
        self._dir_present = present
        if present:
            log.info("the device-plugin directory %s is back; serving and registering again", self.cfg.plugin_dir)
        else:
            log.warning("the device-plugin directory %s is gone; serving again once it is back", self.cfg.plugin_dir)
        return present

    def _serve_again(self, ep: Endpoint) -> bool:
        """Serve ``ep`` on a fresh socket (a restarting kubelet deleted ours); whether it serves now.

        A try that fails is retried with back-off, its error logged once (repeats at debug): every
        poll would otherwise log a traceback and gRPC its own error line, 50 times a second.
        """
        if ep.serving.wait_left() > 0:
            return False
        if not ep.serving.failing:
            log.warning("%s: socket %s is gone (kubelet restart?); serving again", ep.resource, ep.path)
        return self._serve(ep)

    def _serve(self, ep: Endpoint) -> bool:
        """Serve ``ep`` now; whether it serves. A failure is logged (once while it repeats) and
        backed off, at start as later: a path that cannot be served must not stop the others."""
        try:
            ep.serve()
        except Exception as exc:  # a directory in the way, no permission, ...: the next tries back off
            delay, new = ep.serving.failed(str(exc))
            log.log(logging.WARNING if new else logging.DEBUG, "%s: cannot serve on %s (%s); retrying in %.1f s, "
                    "backing off to %g s", ep.resource, ep.path, exc, delay, ep.serving.max_s)
            return False
        if ep.serving.succeeded():
            log.info("%s: serving on %s again", ep.resource, ep.path)
        return True

    def _register(self, ep: Endpoint, kino: int) -> None:
        try:
            ep.register(self.kubelet_sock, self.cfg.register_timeout_s)
            ep.registered_with = kino
            ep.next_try, ep.register_error = 0.0, ""
            log.info("%s: registered with the kubelet (endpoint %s)", ep.resource, os.path.basename(ep.path))
        except grpc.RpcError as exc:
            ep.next_try, ep.kubelet_was_down = time.monotonic() + REGISTER_RETRY_S, False
            error = str(exc.details() if hasattr(exc, "details") else exc)
            new, ep.register_error = error != ep.register_error, error
            log.log(logging.WARNING if new else logging.DEBUG, "%s: registration failed (%s); retrying in %.0f s, "
                    "or at once if the kubelet is down and comes back", ep.resource, error, REGISTER_RETRY_S)

    def _watch(self) -> None:
        while not self._stop.wait(self.cfg.poll_s):
            try:
                self._sync()
            except Exception:  # keep watching whatever happens; the next poll retries
                log.exception("kubelet watch failed")

    def stop(self) -> None:
        """Clean shutdown: stop watching and serving, remove our sockets, release NVML."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        for ep in self.endpoints:
            ep.close(remove=True)
        if self.health is not None:
            self.health.stop()
        if self.reconciler is not None:
            self.reconciler.stop()
        if self.publisher is not None:
            self.publisher.stop()
        self.nvml.shutdown()
