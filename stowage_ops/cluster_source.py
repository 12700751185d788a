"""Where `stowage inspect` and `stowage plan` get their cluster from: one set of click options
and one loader, shared by both commands.

- live: ``--kubeconfig`` / ``--context`` / ``--in-cluster`` — one list of nodes and pods through
  the extender's own feeder (:class:`extender.kube.KubeFeeder`) with the extender's own record
  trust (:meth:`stowage.allocation.RecordTrust.from_options` of ``--record-key-file``,
  ``--scheduler-name`` and ``--memory-unit-mib``, with the extender's defaults), so given the
  options the extender runs with, the picture is exactly what it would rebuild from the pods'
  allocation annotations;
- simulated: ``--simulated [FILE]`` — the embedded cluster (or a YAML file of the same format,
  see ``extender/data/default-cluster.yaml``), optionally with ``--fill N`` seeded random pods
  placed by the pack policy so there is something to look at.

Errors (unreadable kubeconfig, unreachable API server, bad cluster file) become one
:class:`click.ClickException` line, never a traceback.

Every check of the command line alone (options that exclude each other, an option that needs
another, a value of the wrong form) is made while click parses it (:class:`OperatorCommand`,
option callbacks), so tests/test_doc_commands.py, which parses each documented command line
without running it, refuses what the command refuses. Checks that need more (a key file's
content, the cluster) are made when the command runs.

What the commands print may carry what pod authors and node owners wrote (names, model names,
the errors of their annotations): it reaches the terminal through :func:`say`, and the
components' log lines through :class:`OperatorLog`, both with control characters (terminal escape
sequences) made printable.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import click

from packing.model import ClusterModel
from stowage.allocation import DEFAULT_SCHEDULER_NAMES, RecordTrust
from stowage.bounded import WholeRange
from stowage.clickcheck import CheckedCommand, after_parsing, checked_while_parsing
from stowage.textable import printable
from stowage.trust_options import load_trust, record_key_file_option, scheduler_name_option
from stowage.resources import DEFAULT_MEMORY_UNIT_MIB, MAX_CARD_MEMORY_MIB

LIVE_TIMEOUT_S = 20   # per API request of inspect/plan (the extender's own feed waits longer)
READ_PROGRESS_EVERY = 10_000   # pods: a line on stderr while a big cluster is read (~2 s per 10,000)
FILL_PROGRESS_EVERY = 10_000   # --fill: a line on stderr every this many random pods tried (~20 s on 5,000 nodes)
LIVE_RETRIES = 1      # a server that does not answer costs the operator at most ~2 x LIVE_TIMEOUT_S a list

# The most random pods --fill places (as `stowage demo --pods`): each is scheduled through the
# extender's code, whether or not it fits, so --fill 10**30 never ended.
MAX_FILL = 100_000
SOURCE_OPTIONS = ("kubeconfig", "context", "in_cluster", "simulated", "fill", "seed", "memory_unit_mib",
                  "scheduler_names", "record_key_file")

class OperatorCommand(CheckedCommand):
    """An operator command (``inspect``, ``plan``): its :func:`after_parsing` checks run while
    parsing (:class:`~stowage.clickcheck.CheckedCommand`), and it runs with :func:`operator_log`."""

    def invoke(self, ctx: click.Context) -> Any:
        with operator_log():
            return super().invoke(ctx)


# ``-o/--output`` of the operator commands: the same two forms, said alike.
output_option = click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True,
                             help="table: for people; json: the same facts for scripts (per-pod and per-node errors "
                                  "included).")


def say(text: str = "", err: bool = False) -> None:
    """``click.echo`` for text that may carry what pod authors and node owners wrote: its control
    and format characters (escape sequences, carriage returns, bidi overrides) and lone surrogates
    are shown as '?' (:func:`~stowage.textable.printable`), its new lines kept."""
    click.echo("\n".join(printable(line) for line in text.split("\n")), err=err)


class OperatorLog(logging.Handler):
    """The components' warnings and errors (the feed's per-pod and per-node errors) as the
    operator's terminal shows them: one line each on stderr (:func:`say`), an exception as its
    one-line summary rather than a traceback that reads as the command's own crash."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                text += f" ({type(exc).__name__}: {exc})"
            say(text, err=True)
        except Exception:   # logging must never stop the command
            self.handleError(record)


@contextlib.contextmanager
def operator_log() -> Any:
    """While the command runs, the ``stowage.*`` loggers' warnings and errors go to
    :class:`OperatorLog`. Without it they reached the terminal raw through Python's last-resort
    handler (used while no handler is configured, as in these commands): a pod named with an
    escape sequence and a malformed record wrote that sequence to the operator's terminal. (They
    still propagate to handlers someone configured on the root logger.)"""
    logger = logging.getLogger("stowage")
    handler = OperatorLog(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def shapes_option(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[Any]:
    """Click callback of a repeatable SHAPE option (``plan --shape``, ``inspect --typical``): the
    shapes parsed (:class:`stowage_ops.planning.Shape`); a bad one is refused with the grammar."""
    from stowage_ops.planning import SHAPE_GRAMMAR, ShapeError, parse_shape
    try:
        return [parse_shape(s) for s in value]
    except ShapeError as exc:
        raise click.BadParameter(f"{exc}\nShape grammar:\n{SHAPE_GRAMMAR}", ctx, param) from None


def _source_of(params: Mapping[str, Any]) -> "Source":
    return Source(**{k: params[k] for k in SOURCE_OPTIONS})


def _check_source(ctx: click.Context) -> None:
    src = _source_of(ctx.params)
    if src.fill and src.live:
        raise click.UsageError("--fill only applies to --simulated clusters (a live cluster has its own pods)", ctx)
    if not src.fill and ctx.get_parameter_source("seed") == click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--seed only applies with --fill (it seeds the random pods --fill places)", ctx)
    if src.simulated is not None and (src.kubeconfig or src.context or src.in_cluster):
        raise click.UsageError("--simulated cannot be combined with --kubeconfig/--context/--in-cluster", ctx)
    if src.in_cluster and (src.kubeconfig or src.context):
        raise click.UsageError("--kubeconfig and --in-cluster are exclusive (--context picks a kubeconfig "
                               "context)", ctx)
    _refuse_on_simulated(ctx, src, {"scheduler_names": "--scheduler-name", "record_key_file": "--record-key-file"})


@dataclass(frozen=True)
class Source:
    """What the user asked for, as parsed from the options."""

    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False
    simulated: str | None = None   # None: live cluster; "builtin" or a file path
    fill: int = 0
    seed: int = 0
    memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB
    scheduler_names: tuple[str, ...] = DEFAULT_SCHEDULER_NAMES   # live: the extender's --scheduler-name
    record_key_file: str | None = None                            # live: the extender's --record-key-file

    @property
    def live(self) -> bool:
        return self.simulated is None

    def trust(self) -> RecordTrust:
        """Which allocation records count: the extender's trust for the same options (built by
        the same function), so a live cluster reads as that extender rebuilds it. A key file that
        cannot be used is a bad parameter (exit 2), as it is for the extender."""
        return load_trust(self.record_key_file, self.memory_unit_mib, self.scheduler_names)


def cluster_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add the cluster-source options to a click command; it receives ``source: Source``."""
    opts = [
        click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None,
                     help="Kubeconfig of a live cluster (default: $KUBECONFIG or ~/.kube/config)."),
        click.option("--context", default=None, help="Kubeconfig context to use."),
        click.option("--in-cluster", is_flag=True, help="Use the pod's service account (when run inside the cluster)."),
        click.option("--simulated", is_flag=False, flag_value="builtin", default=None, metavar="[FILE]",
                     help="Use the embedded simulated cluster, or the cluster described in FILE (YAML), "
                          "instead of a live one."),
        click.option("--fill", type=WholeRange(0, MAX_FILL), default=0, show_default=True,
                     help="With --simulated: first place N pods of a seeded random mix (whole GPUs and slices)."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed for --fill."),
        click.option("--memory-unit-mib", type=WholeRange(1, MAX_CARD_MEMORY_MIB), default=DEFAULT_MEMORY_UNIT_MIB,
                     show_default=True, help="MiB per nvidia.com/gpu-memory unit (as configured for the extender)."),
        scheduler_name_option("Live cluster: the extender's --scheduler-name, the schedulerName(s) of Stowage's "
                              "profile(s): only these pods' allocation records count (and their shapes are what "
                              "its placer learns)."),
        record_key_file_option("Live cluster: the extender's --record-key-file, where the cluster signs records: "
                               "only records signed for their pod count, as in the extender. Without it, unsigned "
                               "records count too (docs/security.md)."),
    ]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not checked_while_parsing(click.get_current_context()):
            raise RuntimeError("cluster_options needs an OperatorCommand: its checks run while parsing")
        src = Source(**{k: kwargs.pop(k) for k in SOURCE_OPTIONS})
        if src.live:
            src.trust()   # an unusable key file is refused before the cluster is read
        return fn(*args, source=src, **kwargs)

    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return after_parsing(_check_source)(wrapper)


@dataclass
class LearnFrom:
    """What to read of a live cluster so that a what-if's placer knows what the live extender's
    knows (issue 13: ``stowage plan`` may never know more or less): the pods of Stowage's
    schedulers (``scheduler_names``, the extender's ``--scheduler-name``: :attr:`Source.scheduler_names`),
    in creation order as its first list shows them, and the departed pods' past its ConfigMap keeps
    (``configmap``, ``(namespace, name)`` or None). :func:`load` fills ``scheduler_names``,
    ``pods``, ``past`` and ``note``."""

    scheduler_names: tuple[str, ...] = DEFAULT_SCHEDULER_NAMES
    configmap: tuple[str, str] | None = None
    pods: list[dict] = field(default_factory=list)
    past: Any = None                # extender.learned_past.DepartedPods once loaded
    note: str = ""                  # why the past could not be read, if it could not

    def describe(self) -> str:
        departed = self.past.pods if self.past is not None else 0
        where = f"ConfigMap {self.configmap[0]}/{self.configmap[1]}" if self.configmap else "no ConfigMap"
        text = (f"the placer learned what the live extender has: {len(self.pods)} pods of "
                f"{', '.join(self.scheduler_names)} and {departed} departed pods ({where})")
        return text + (f"; {self.note}" if self.note else "")


def learn_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--learned-configmap`` (as given to the extender) to a click command below
    :func:`cluster_options`; it receives ``learn: LearnFrom`` (for :func:`load`; it reads the
    ConfigMap, and the pods of ``--scheduler-name``, only on a live cluster)."""
    from extender.learned_store import DEFAULT_NAME, DEFAULT_NAMESPACE

    def location(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, str] | None:
        from extender.learned_store import parse_location
        try:
            return parse_location(value, os.environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None

    opts = [
        click.option("--learned-configmap", default=DEFAULT_NAME, show_default=True, callback=location,
                     metavar="[NAMESPACE/]NAME|off",
                     help="Live cluster: the extender's --learned-configmap (namespace: $POD_NAMESPACE, else "
                          f"{DEFAULT_NAMESPACE}), which keeps what its placer learned from deleted pods. "
                          "off: leave it out."),
    ]

    def check(ctx: click.Context) -> None:
        if "simulated" in ctx.params:   # with cluster_options
            _refuse_on_simulated(ctx, _source_of(ctx.params), {"learned_configmap": "--learned-configmap"})

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, learn=LearnFrom(configmap=kwargs.pop("learned_configmap")), **kwargs)

    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return after_parsing(check)(wrapper)


def _refuse_on_simulated(ctx: click.Context, src: Source, flags: Mapping[str, str]) -> None:
    """A usage error when options that describe a live cluster's extender (``flags``: parameter
    -> option) were given on the command line (not a default or the environment) for a
    simulated cluster, which has none: they would be ignored."""
    given = [flag for param, flag in flags.items()
             if ctx.get_parameter_source(param) == click.core.ParameterSource.COMMANDLINE]
    if given and not src.live:
        verb = "describes" if len(given) == 1 else "describe"
        raise click.UsageError(f"{' and '.join(given)} {verb} a live cluster's extender; a simulated cluster has none",
                               ctx)


UNRECORDED_SHOWN = 5   # pods the WARNING line names; JSON lists them all


@dataclass
class LiveFacts:
    """What a live cluster's pods say beyond the model (filled in by :func:`load`):
    ``daemon_pods``, the uids of pods a DaemonSet owns (they stay with their node when it is
    drained); ``unrecorded``, GPU pods bound without Stowage's record (uid -> node: Stowage does
    not know their cards and does not count them); ``pod_errors`` and ``node_errors``, the pods
    whose record and the nodes whose inventory the feed could not honour, each with why (the
    extender reads them the same way: their cards are not counted)."""

    daemon_pods: set[str] = field(default_factory=set)
    unrecorded: dict[str, str] = field(default_factory=dict)
    pod_errors: list[dict[str, str]] = field(default_factory=list)    # {"pod", "uid", "error"}
    node_errors: list[dict[str, str]] = field(default_factory=list)   # {"node", "error"}
    names: dict[str, str] = field(default_factory=dict)               # uid -> namespace/name, of every pod seen
    node_notes: dict[str, list[str]] = field(default_factory=dict)    # node -> what the operator should know
    gpu_allocatable: dict[str, int | None] = field(default_factory=dict)   # node -> stated_gpus() of it
    pods_read: int = 0

    def errors_from(self, status: Mapping[str, Any]) -> None:
        """The feed's per-pod and per-node errors (``KubeFeeder.status()``), by name."""
        pods = status.get("pod_errors") or {}
        self.pod_errors = sorted(({"pod": self.names.get(uid, "?"), "uid": uid, "error": str(err)}
                                  for uid, err in pods.items()), key=lambda e: (e["pod"], e["uid"]))
        self.node_errors = [{"node": n, "error": str(err)} for n, err in sorted((status.get("node_errors") or {}).items())]

    def warning(self) -> str:
        """One line for the operator when GPU pods were bound without Stowage ('' otherwise)."""
        if not self.unrecorded:
            return ""
        pods = self.unrecorded_pods()
        shown = ", ".join(f"{p['pod']} on {p['node']}" for p in pods[:UNRECORDED_SHOWN])
        more = f" and {len(pods) - UNRECORDED_SHOWN} more" if len(pods) > UNRECORDED_SHOWN else ""
        return (f"WARNING: {len(self.unrecorded)} GPU pod(s) on {len(set(self.unrecorded.values()))} node(s) were "
                "bound without Stowage's record (another scheduler?): Stowage does not know their cards, which "
                f"count as free here and in the extender (docs/kube.md): {shown}{more}")

    def unrecorded_pods(self) -> list[dict[str, str]]:
        """The GPU pods bound without Stowage's record, named as ``pod_errors`` are (a uid alone
        sent the operator to look each one up): ``{"pod", "uid", "node"}``, by pod name."""
        return sorted(({"pod": self.names.get(uid, "?"), "uid": uid, "node": node}
                       for uid, node in self.unrecorded.items()), key=lambda e: (e["pod"], e["uid"]))

    def note_inventories(self, model: ClusterModel) -> None:
        """Add :func:`inventory_note` of every node read to its notes, after the other notes."""
        for name, stated in self.gpu_allocatable.items():
            text = inventory_note(model, name, stated)
            if text:
                self.node_notes.setdefault(name, []).append(text)

    def note(self, pod: Mapping[str, Any], gone: bool = False) -> None:
        m = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
        uid = m.get("uid")
        owners = m.get("ownerReferences") if isinstance(m.get("ownerReferences"), list) else []
        self.pods_read += 1
        if self.pods_read % READ_PROGRESS_EVERY == 0:
            say(f"{self.pods_read} pods read...", err=True)
        if not isinstance(uid, str):
            return
        from extender.kube_objects import pod_key
        self.names[uid] = pod_key(pod)
        if gone:
            self.daemon_pods.discard(uid)
        elif any(isinstance(o, Mapping) and o.get("kind") == "DaemonSet" and o.get("controller") for o in owners):
            self.daemon_pods.add(uid)


# The taint the cluster autoscaler puts on a node it is about to delete (NoSchedule).
TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler"


def node_going_away(node: Mapping[str, Any]) -> str:
    """Why ``node`` is going away although it is listed ('' when it is not): it is being deleted
    (``metadata.deletionTimestamp``: a finalizer holds it), or the cluster autoscaler is removing
    it (its ``ToBeDeletedByClusterAutoscaler`` taint). Only the second keeps new pods off it
    (:func:`node_takes_no_pods`)."""
    m = node.get("metadata") if isinstance(node.get("metadata"), Mapping) else {}
    if m.get("deletionTimestamp"):
        return "being deleted"
    if node_takes_no_pods(node):
        return "being removed by the cluster autoscaler"
    return ""


def node_takes_no_pods(node: Mapping[str, Any]) -> bool:
    """Whether kube-scheduler sends ``node`` no new pod for a reason the feed does not read itself
    (cordons and the Ready condition it does): the cluster autoscaler's
    ``ToBeDeletedByClusterAutoscaler`` taint (NoSchedule). A pod tolerating every taint
    (``operator: Exists``, no key) would still be sent there, but a plan that moves a pod onto a
    node about to be deleted frees nothing, so the node is closed to every pod of a plan.
    Not a ``deletionTimestamp`` alone: kube-scheduler v1.28.7 still places pods on such a node,
    and so does the extender (tests/integration/test_real_node_deleting.py)."""
    spec = node.get("spec") if isinstance(node.get("spec"), Mapping) else {}
    taints = spec.get("taints") if isinstance(spec.get("taints"), list) else []
    return any(isinstance(t, Mapping) and t.get("key") == TO_BE_DELETED_TAINT for t in taints)


def node_notes(node: Mapping[str, Any]) -> list[str]:
    """What an operator should know of a node that its row's figures do not say and that the
    Node object alone tells: why it takes no pods (cordoned, not Ready, going away). What its
    inventory says against its allocatable ``nvidia.com/gpu`` is :func:`inventory_note`, made
    from the model the feed built, so the inventory is parsed once (by the feed)."""
    from extender.kube_objects import node_cordoned, node_ready

    notes = []
    if node_cordoned(node):
        notes.append("cordoned")
    if not node_ready(node):
        notes.append("not Ready")
    going = node_going_away(node)
    if going:
        notes.append(going)
    return notes


def stated_gpus(node: Mapping[str, Any]) -> int | None:
    """The node's ``status.allocatable["nvidia.com/gpu"]`` as kube-scheduler counts it (a missing
    one is 0: kube-scheduler then admits no pod asking for a GPU; a fraction is rounded up, as
    its ``Quantity.Value()`` does: 1500m is 2), or None when it is not a quantity (the feed's
    node error says so, if it matters)."""
    from decimal import ROUND_CEILING

    from stowage.resources import parse_quantity

    status = node.get("status") if isinstance(node.get("status"), Mapping) else {}
    alloc = status.get("allocatable") if isinstance(status.get("allocatable"), Mapping) else {}
    try:
        return int(parse_quantity(alloc.get("nvidia.com/gpu", "0")).to_integral_value(rounding=ROUND_CEILING))
    except Exception:   # a malformed quantity
        return None


def inventory_note(model: ClusterModel, name: str, stated: int | None) -> str:
    """'' or the note for a node whose allocatable ``nvidia.com/gpu`` (``stated``) is not the
    number of healthy cards its inventory annotation lists, as the feed put them in ``model``
    (the device plugin advertises one per healthy card; kube-scheduler admits GPU pods by the
    allocatable count, Stowage by the inventory, so the two disagree on what fits there). Only
    for an inventory read from the annotation: the other sources are made from that count."""
    meta = model.meta.get(name)
    if stated is None or meta is None or meta.source != "annotation":
        return ""
    i = model.index[name]
    healthy = int((model.a.exists[i] & model.a.healthy[i]).sum())
    if stated == healthy:
        return ""
    return f"allocatable nvidia.com/gpu is {stated}, its inventory has {healthy} healthy cards"


def _note_nodes(feeder: Any, facts: LiveFacts) -> None:
    """Make ``feeder`` (the extender's) tell ``facts`` of every node it applies (:func:`node_notes`,
    and its allocatable ``nvidia.com/gpu`` for :func:`inventory_note` once the model is built),
    and read a node the cluster autoscaler is removing (:func:`node_takes_no_pods`) as cordoned:
    kube-scheduler sends the extender no such node for any pod that does not tolerate every
    taint, and a plan that moves a pod onto a node about to be deleted frees nothing, so
    ``plan`` places nothing there. Through the feeder's ``node_closed`` hook (which logs what it
    raises, and reads the node as it is)."""
    def closed(node: Mapping[str, Any]) -> bool:
        m = node.get("metadata") if isinstance(node.get("metadata"), Mapping) else {}
        if isinstance(m.get("name"), str):
            notes = node_notes(node)
            if notes:
                facts.node_notes[m["name"]] = notes
            else:   # (a node listed twice: the model keeps the last one applied)
                facts.node_notes.pop(m["name"], None)
            facts.gpu_allocatable[m["name"]] = stated_gpus(node)
        return node_takes_no_pods(node)

    feeder.node_closed = closed


class _NoteBoth:
    """Tells two pod observers of each pod the feeder reads (its ``marks`` hook)."""

    def __init__(self, *observers: Any) -> None:
        self.observers = [o for o in observers if o is not None]

    def note(self, pod: Mapping[str, Any], gone: bool = False) -> None:
        for o in self.observers:
            o.note(pod, gone=gone)

    def keep_only(self, uids: Any) -> None:
        for o in self.observers:
            if hasattr(o, "keep_only"):
                o.keep_only(uids)


def load(src: Source, marks: Any = None, learn: LearnFrom | None = None,
         facts: LiveFacts | None = None) -> tuple[ClusterModel, str]:
    """The cluster as a model, and one line saying where it came from. ``marks``: an
    :class:`extender.nominated.PodMarks` told of every pod of a live cluster (their priorities).
    ``learn``: for a live cluster, also read what the live extender's placer learned (filled in).
    ``facts``: for a live cluster, its DaemonSet pods and unrecorded GPU pods (filled in)."""
    return _simulated(src) if not src.live else _live(src, marks, learn, facts)


def _simulated(src: Source) -> tuple[ClusterModel, str]:
    from extender.simcluster import SimClusterError, describe, load_cluster
    from stowage_ops.planning import fill_random

    try:
        cluster = load_cluster(src.simulated)
    except SimClusterError as exc:
        raise click.ClickException(str(exc)) from None
    model = ClusterModel()
    cluster.populate(model)
    what = f"simulated cluster {cluster.source}: {describe(cluster)}"
    if src.fill:
        placed = fill_random(model, src.fill, seed=src.seed, progress=_fill_progress)
        what += f"; filled with {placed} of {src.fill} random pods (seed {src.seed})"
    return model, what


def _fill_progress(tried: int, total: int) -> None:
    """--fill says how far it is on stderr (50,000 pods on 5,000 nodes took 100 s without a word)."""
    if tried % FILL_PROGRESS_EVERY == 0 and tried < total:
        say(f"fill: {tried} of {total} random pods tried...", err=True)


def _live(src: Source, marks: Any = None, learn: LearnFrom | None = None,
          facts: LiveFacts | None = None) -> tuple[ClusterModel, str]:
    try:
        from extender.kube import KubeFeeder, load_api_client
    except ImportError as exc:
        raise click.ClickException(f"live clusters need the extender's Kubernetes feeder: {exc}") from None
    trust = src.trust()
    try:
        api = load_api_client(src.kubeconfig, src.in_cluster, src.context, retries=LIVE_RETRIES)
    except Exception as exc:  # kubernetes.config raises several unrelated types
        raise click.ClickException(f"cannot load Kubernetes credentials: {exc} "
                                   "Or use --simulated to look at the embedded cluster.") from None
    host = getattr(getattr(api, "configuration", None), "host", "") or "the cluster"
    say(f"reading nodes and pods from {host} (each request waits up to {LIVE_TIMEOUT_S} s, "
        f"{LIVE_RETRIES} retry)...", err=True)
    model = ClusterModel()
    try:
        feeder = KubeFeeder(model, api, src.memory_unit_mib, request_timeout_s=LIVE_TIMEOUT_S, trust=trust)
        if facts is not None:
            _note_nodes(feeder, facts)
        feeder.marks = _NoteBoth(marks, facts) if facts is not None else marks
        if learn is not None:
            learn.scheduler_names, learn.pods = src.scheduler_names, []
            # The feed shows it the pods of the trust's schedulers only, as the extender's placer
            # learns them, in creation order as its first list shows them.
            feeder.on_pod_seen = learn.pods.append
        feeder.sync_once()
        if facts is not None:
            facts.note_inventories(model)
            status = feeder.status()
            facts.unrecorded = dict(status.get("unrecorded_gpu_pods") or {})
            facts.errors_from(status)
    except Exception as exc:  # urllib3/ApiException/timeouts: one line for the operator
        from extender.kube import api_message
        hint = ""
        if getattr(exc, "status", None) in (401, 403):
            hint = ("; the account needs get, list and watch on nodes and pods in all namespaces "
                    "(the extender's ClusterRole, docs/kube.md)")
        raise click.ClickException(f"cannot read nodes and pods from the API server {host}: "
                                   f"{api_message(exc)}{hint}") from None
    if learn is not None:
        from extender.learned_past import DepartedPods
        from extender.learned_store import PastStore
        learn.past, learn.note = DepartedPods(), ""
        if learn.configmap is not None:
            store = PastStore(feeder.core, *learn.configmap)
            learn.past = store.load()
            learn.note = store.last_error
    gpu_pods = sum(1 for al in model.allocations.values() if al.cards)
    what = (f"live cluster {host}: {len(model.node_names())} nodes, {gpu_pods} GPU pods, "
            f"{len(model.allocations) - gpu_pods} other pods bound")
    return model, what
