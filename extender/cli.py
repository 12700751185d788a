"""`stowage extender`: serve filter/prioritize/bind for kube-scheduler under gunicorn.

Two ways to feed the model: ``--simulated [FILE]`` (an embedded cluster, no Kubernetes;
what `stowage demo` runs) or ``--kubeconfig FILE`` / ``--in-cluster`` (list+watch of nodes and
pods through the Kubernetes API, binding through ``pods/binding``).
"""
from __future__ import annotations

import ipaddress
import logging
import os
import socket
import ssl
from dataclasses import dataclass
from typing import Any, Callable

import click
from flask import Flask

from stowage import logtext
from stowage.allocation import RecordTrust
from stowage.bounded import WholeRange
from stowage.clickcheck import CheckedCommand, after_parsing, check_can_listen, parse_host_port
from stowage.finite import seconds
from stowage.trust_options import load_trust, record_key_file_option, scheduler_name_option
from stowage.resources import DEFAULT_MEMORY_UNIT_MIB, MAX_CARD_MEMORY_MIB

from .app import DEFAULT_MAX_BODY_BYTES, create_app
from .gunicorn_conf import ExtenderServer, TLSFiles, gunicorn_options, register_exit
from .learned_store import DEFAULT_NAME as DEFAULT_PAST_NAME
from .learned_store import DEFAULT_NAMESPACE as DEFAULT_PAST_NAMESPACE
from .learned_store import parse_location
from .intake import DEFAULT_CLIENT_TIMEOUT_S, check_gunicorn, return_big_buffers_to_the_system, set_client_timeout
from .kube_objects import LIST_LEARN_BYTES
from .learned_uids import LEARNED_BYTES
from .pending_pods import PENDING_BYTES
from packing.model import ClusterModel
from packing.pod_policy import PACK, SPREAD, PodPolicy
from .service import FILTER_KEEPS, FILTER_KEEPS_BEST, POD_CACHE_BYTES, UNKNOWN_OUTCOME_HOLD_S, ExtenderService
from .simcluster import BUILTIN, SimCluster, SimClusterError, describe, load_cluster

log = logging.getLogger("stowage.extender")

# The pod's loopback: in the sidecar layout kube-scheduler reaches the extender there, nothing else can.
DEFAULT_BIND = "127.0.0.1:8888"
# Options that only a kube-mode extender reads (parameter -> flag): refused with --simulated, where
# they would be ignored without a word.
KUBE_ONLY_OPTIONS = {"record_key_file": "--record-key-file", "scheduler_names": "--scheduler-name",
                     "stale_after_s": "--stale-after", "learned_configmap": "--learned-configmap",
                     "learned_interval_s": "--learned-interval", "pending_pods_mib": "--pending-pods-mib",
                     "list_learn_mib": "--list-learn-mib", "bind_outcome_hold_s": "--bind-outcome-hold"}
# The largest memory bound a flag sets (16 GiB; the shipped extender container has 1 GiB in all):
# a bigger number is a typo (MiB taken for bytes), not a cluster.
MAX_BOUND_MIB = 16384
# The longest --timeout (an hour): gunicorn restarts a worker whose event loop has not beaten for
# this long; past it a stuck worker is never restarted, and a number past a float's range crashed
# gunicorn's master.
MAX_WORKER_TIMEOUT_S = 3600


@dataclass
class ServeConfig:
    """Everything the worker needs to build the app (plain data: it is created before fork)."""

    url_prefix: str = ""
    cluster: SimCluster | None = None       # simulated mode
    kubeconfig: str | None = None           # kube mode
    in_cluster: bool = False
    default_policy: PodPolicy = PodPolicy()
    memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    metrics_bind: str | None = None         # HOST:PORT serving /metrics only
    record_key_file: str | None = None      # kube mode: sign records (and honour only signed ones)
    scheduler_names: tuple[str, ...] = ()   # kube mode: honour records only on these schedulers' pods (none: any)
    stale_after_s: float = 60.0             # kube mode: a watch failing this long makes the model stale
    filter_keeps: str = FILTER_KEEPS_BEST   # filter answers the best nodes, or every node that fits
    # kube mode: how long a Binding answered 5xx (or lost) keeps its cards while the pod reads unbound
    bind_outcome_hold_s: float = UNKNOWN_OUTCOME_HOLD_S
    learned_configmap: tuple[str, str] | None = None  # kube mode: (namespace, name) keeping the departed pods' past
    learned_interval_s: float = 60.0        # kube mode: how often that ConfigMap is written (when changed)
    # The memory bounds (extender/bounds.py: what passing each costs), in bytes.
    pod_cache_bytes: int = POD_CACHE_BYTES  # the pods parsed at filter, kept for bind
    learned_bytes: int = LEARNED_BYTES      # the pods the placers learned from, by uid
    pending_bytes: int = PENDING_BYTES      # kube mode: the pending pods' copies kept for bind
    list_learn_bytes: int = LIST_LEARN_BYTES  # kube mode: a pod list's learn copies until its end

    def trust(self) -> RecordTrust:
        """Which records count (kube mode), from the options every record reader shares
        (stowage/trust_options.py); an unusable key file is a bad ``--record-key-file``."""
        return load_trust(self.record_key_file, self.memory_unit_mib, self.scheduler_names)


def serve_metrics(app: Flask, bind: str) -> None:
    """Serve the app's Prometheus registry alone on ``bind`` (a thread of this worker).

    Why a second listener: in the sidecar layout the extender's verbs listen on the pod's
    loopback only (nothing but kube-scheduler may call bind), so Prometheus could not reach
    /metrics there; this port serves nothing but the metrics. It is open to the pod network, so
    it is served by the bounded server of :mod:`stowage.metrics_http`, not prometheus_client's
    ``start_http_server`` (a thread for ever per silent connection, in the process that holds
    the model)."""
    from stowage.metrics_http import serve

    host, port = parse_host_port(bind)
    server, _thread = serve(app.extensions["stowage"]["metrics"].registry, port, host)

    def stop() -> None:
        server.shutdown()
        server.server_close()
    register_exit(stop)
    log.info("metrics on http://%s:%d/metrics", host, port)


def build_app(cfg: ServeConfig) -> Flask:
    """The extender app for ``cfg`` (with its metrics listener, if asked for)."""
    app = _build_app(cfg)
    if cfg.metrics_bind:
        serve_metrics(app, cfg.metrics_bind)
    return app


def connect_feed(feeder: Any, service: ExtenderService) -> None:
    """What the Kubernetes feed (:class:`extender.kube.KubeFeeder`) tells the service besides the
    model they share: the pods it shows and those deleted, and every pod's priority and
    nomination. One place, so that tests wire a feed to a service exactly as the extender does."""
    feeder.on_pod_seen = service.learn_pod            # what the placers learn, rebuilt from the cluster
    feeder.learning_in_bulk = service.learning_in_bulk  # a list's pods: the learned table built once
    feeder.on_pod_deleted = service.pod_deleted        # learned as departed; a late bind of it refused
    feeder.marks = service.marks  # pod priorities and nominations: preempt, nominated pods' cards


def _build_app(cfg: ServeConfig) -> Flask:
    """The extender app for ``cfg``, with its model fed (simulated) or being fed (kube)."""
    model = ClusterModel()
    if cfg.cluster is not None:
        cfg.cluster.populate(model)
        service = ExtenderService(model, memory_unit_mib=cfg.memory_unit_mib, default_policy=cfg.default_policy,
                                  filter_keeps=cfg.filter_keeps, pod_cache_bytes=cfg.pod_cache_bytes,
                                  learned_bytes=cfg.learned_bytes)
        message = f"simulated cluster {cfg.cluster.source}: {describe(cfg.cluster)}"
        log.info("model fed from %s", message)
        return create_app(service, url_prefix=cfg.url_prefix, ready=lambda: (True, message),
                          max_body_bytes=cfg.max_body_bytes)
    # Kube mode: imported lazily so simulated mode never needs the Kubernetes client set up.
    from .kube import KubeFeeder, load_api_client
    from .kube_binder import MERGE_PATCH, KubeBinder
    from .kube_post import bound_client
    from .requeue import Requeuer

    api_client = load_api_client(kubeconfig=cfg.kubeconfig, in_cluster=cfg.in_cluster)
    trust = cfg.trust()
    feeder = KubeFeeder(model, api_client, memory_unit_mib=cfg.memory_unit_mib, trust=trust,
                        stale_after_s=cfg.stale_after_s, pending_bytes=cfg.pending_bytes,
                        list_learn_bytes=cfg.list_learn_bytes, list_learn_flag="--list-learn-mib")
    service = ExtenderService(model, binder=KubeBinder(api_client, trust=trust), pod_source=feeder,
                              memory_unit_mib=cfg.memory_unit_mib, default_policy=cfg.default_policy,
                              filter_keeps=cfg.filter_keeps, pod_cache_bytes=cfg.pod_cache_bytes,
                              learned_bytes=cfg.learned_bytes, unknown_outcome_hold_s=cfg.bind_outcome_hold_s)
    # Pods refused on a model the watch has since given room are tried again (extender/requeue.py).
    # Its PATCH is bounded whole (extender.kube_post.whole_request) on this client, which the
    # binder hooked (bound_client; said again here so the dependency reads where it is used).
    bound_client(api_client)
    requeuer = Requeuer(lambda ns, name, body: feeder.core.patch_namespaced_pod(
        name, ns, body, _content_type=MERGE_PATCH, _request_timeout=10), feeder.pending_uid).start()
    feeder.on_cards_freed = requeuer.cards_freed
    connect_feed(feeder, service)
    service.on_refused = requeuer.refused
    service.start_hold_timer()   # ends "bind outcome unknown" holds whose time is up (extender/hold_timer.py)
    keeper = None
    if cfg.learned_configmap is not None:
        # What the placers learned from pods deleted before this start (extender/learned_past.py):
        # learned before the first list shows the pods that still exist, kept while running.
        from .learned_store import PastKeeper, PastStore
        store = PastStore(feeder.core, *cfg.learned_configmap)
        past = store.load()
        if past.counts:
            log.info("learned %d departed pods (%d shapes) from the %s", service.learn_departed(past),
                     len(past), store.where)
        keeper = PastKeeper(store, service.departed_snapshot, cfg.learned_interval_s).start()
        service.past_keeper = keeper
    feeder.start()
    register_exit(feeder.stop)
    if keeper is not None:
        register_exit(keeper.stop)   # runs first (last registered): one last write of the past
    register_exit(requeuer.stop)
    register_exit(service.stop_hold_timer)
    return create_app(service, url_prefix=cfg.url_prefix, ready=feeder.ready, max_body_bytes=cfg.max_body_bytes,
                      feed_bounds=feeder.bounds, feed_health=feeder.health)


def run_server(cfg: ServeConfig, bind: str, threads: int, log_level: str,
               factory: Callable[[ServeConfig], Flask] = build_app, workers: int = 1, **extra: Any) -> None:
    """Run gunicorn in this process until SIGTERM/SIGINT: one worker holding the model, or with
    ``workers`` > 1 the split layout (HTTP workers in front of one decision process)."""
    try:
        check_gunicorn()   # said here in one line; ExtenderServer checks too, for every other host
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    if workers > 1:
        from .split import run_split

        run_split(lambda: factory(cfg), bind=bind, workers=workers, threads=threads, log_level=log_level,
                  url_prefix=cfg.url_prefix, max_body_bytes=cfg.max_body_bytes, **extra)
        return
    options = gunicorn_options(bind=bind, threads=threads, log_level=log_level, **extra)
    ExtenderServer(lambda: factory(cfg), options).run()


def bind_is_local(bind: str) -> bool:
    """Whether only this machine (this pod) can reach ``bind``: a loopback address, a unix socket,
    or an inherited socket (``fd://N``) bound to either."""
    if bind.startswith("unix:"):
        return True
    if bind.startswith("fd://"):
        try:
            s = socket.socket(fileno=int(bind[5:]))
        except (ValueError, OSError):
            return False
        try:
            if s.family == socket.AF_UNIX:
                return True
            host = s.getsockname()[0]
        except OSError:
            return False
        finally:
            s.detach()
    else:
        try:
            host, _ = parse_host_port(bind)
        except ValueError:
            return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_bind(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--bind: unix:PATH, fd://FD or HOST:PORT, told apart from a mistake before anything else."""
    if value.startswith("unix:") or value.startswith("fd://"):
        return value
    try:
        parse_host_port(value)
    except ValueError as exc:
        raise click.BadParameter(f"{exc}, unix:PATH or fd://FD") from None
    return value


def _check_metrics_bind(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            parse_host_port(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


def _bound_mib_option(flag: str, default_bytes: int, help_text: str) -> Callable[[Callable], Callable]:
    """A memory bound's flag, in MiB: 1 to MAX_BOUND_MIB, its library default shown."""
    return click.option(flag, type=WholeRange(1, MAX_BOUND_MIB), default=default_bytes >> 20, show_default=True,
                        help=f"{help_text} Raising it raises the memory the extender may use: raise its "
                             "container's limit with it.")


TLS_FLAGS = {"tls_cert": "--tls-cert", "tls_key": "--tls-key", "tls_client_ca": "--tls-client-ca"}


def _check_serve(ctx: click.Context) -> None:
    """The rules of ``stowage extender`` about several options at once, made while parsing
    (:class:`~stowage.clickcheck.CheckedCommand`): one model source; the TLS flags all or none;
    no address other machines reach without TLS (unless --allow-unauthenticated); no kube-only
    option with --simulated, where it would be ignored without a word."""
    p = ctx.params
    given = [flag for param, flag in TLS_FLAGS.items() if p.get(param)]
    if 0 < len(given) < len(TLS_FLAGS):
        missing = sorted(set(TLS_FLAGS.values()) - set(given))
        raise click.UsageError(f"{', '.join(given)} also needs {', '.join(missing)}: HTTPS is served only with "
                               "client-certificate verification", ctx)
    if not given and not p.get("allow_unauthenticated") and not bind_is_local(p["bind"]):
        raise click.UsageError(
            f"--bind {p['bind']} can be reached from other machines, and the extender's verbs are not "
            "authenticated without TLS: anyone reaching it could bind any pod to any node. Use a loopback "
            "address (the sidecar layout), or --tls-cert/--tls-key/--tls-client-ca (kube-scheduler's extender "
            "tlsConfig), or --allow-unauthenticated if you really mean it", ctx)
    simulated, kube = bool(p.get("simulated")), bool(p.get("kubeconfig") or p.get("in_cluster"))
    if simulated + kube != 1:
        raise click.UsageError("choose one model source: --simulated [FILE], or --kubeconfig FILE / "
                               "--in-cluster", ctx)
    if p.get("kubeconfig") and p.get("in_cluster"):
        raise click.UsageError("--kubeconfig and --in-cluster are exclusive", ctx)
    if simulated:
        kube_only = [flag for param, flag in KUBE_ONLY_OPTIONS.items()
                     if ctx.get_parameter_source(param) == click.core.ParameterSource.COMMANDLINE]
        if kube_only:   # they would be silently ignored: a simulated cluster has no API server, records or watch
            raise click.UsageError(f"{', '.join(kube_only)} {'is' if len(kube_only) == 1 else 'are'} for kube mode "
                                   "(--kubeconfig / --in-cluster); a simulated cluster has no API server", ctx)


def _learned_configmap(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, str] | None:
    """--learned-configmap, read while parsing: its (namespace, name), or None for off."""
    try:
        return parse_location(value, os.environ.get("POD_NAMESPACE") or DEFAULT_PAST_NAMESPACE)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command("extender", cls=CheckedCommand)
@click.option("--bind", default=DEFAULT_BIND, show_default=True, callback=_check_bind,
              help="Address to listen on: HOST:PORT, unix:PATH or fd://FD. Anyone who reaches it can bind "
                   "pods: an address other machines can reach needs --tls-cert/--tls-key/--tls-client-ca "
                   "(or --allow-unauthenticated, which you should not use).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False),
              help="Serve HTTPS with this certificate (PEM); needs --tls-key and --tls-client-ca.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="The private key of --tls-cert (PEM).")
@click.option("--tls-client-ca", type=click.Path(exists=True, dir_okay=False),
              help="Accept only clients with a certificate signed by this CA (PEM): kube-scheduler's "
                   "extender tlsConfig certFile/keyFile. Every route (/state too) is behind it.")
@click.option("--allow-unauthenticated", is_flag=True,
              help="Serve plain HTTP on an address other machines can reach. Anyone reaching it can bind "
                   "any pod to any node and read every allocation: only for isolated test setups.")
@click.option("--workers", type=WholeRange(1, 64), default=1, show_default=True,
              help="HTTP worker processes. 1: one process holds the model and serves the HTTP. "
                   "More: the split layout, N HTTP-only workers in front of ONE decision process that "
                   "holds the model (the HTTP work then uses several cores; answers are the same).")
@click.option("--threads", type=WholeRange(1, 256), default=8, show_default=True,
              help="Request threads per worker process.")
@click.option("--url-prefix", default="", show_default=True,
              help="Path prefix of the verbs, e.g. /stowage for /stowage/filter (the scheduler's urlPrefix path).")
@click.option("--simulated", is_flag=False, flag_value=BUILTIN, default=None, metavar="[FILE]",
              help="Feed the model from the built-in simulated cluster, or the cluster described in FILE "
                   "(YAML), instead of Kubernetes (as stowage inspect/plan --simulated; --simulated builtin "
                   "names the built-in one too).")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False),
              help="Kubeconfig for the API server (kube mode).")
@click.option("--in-cluster", is_flag=True, help="Use the pod's service account (kube mode).")
@click.option("--default-node-policy", type=click.Choice([PACK, SPREAD]), default=PACK, show_default=True,
              help="Node-level policy for pods without the stowage.io/node-policy annotation.")
@click.option("--default-card-policy", type=click.Choice([PACK, SPREAD]), default=PACK, show_default=True,
              help="Card-level policy for pods without the stowage.io/card-policy annotation.")
@click.option("--filter-keeps", type=click.Choice(list(FILTER_KEEPS)), default=FILTER_KEEPS_BEST, show_default=True,
              help="What filter answers. best: only the nodes Stowage ranks best (the decision in one round trip; "
                   "kube-scheduler's own scores choose among equal ones; the shipped scheduler config has no "
                   "prioritizeVerb). fitting: every node that fits, for a scheduler config with prioritizeVerb "
                   "that blends Stowage's ranking with kube-scheduler's scores (weight).")
@click.option("--memory-unit-mib", type=WholeRange(1, MAX_CARD_MEMORY_MIB), default=DEFAULT_MEMORY_UNIT_MIB, show_default=True,
              help="MiB per unit of nvidia.com/gpu-memory (must match the device plugin).")
@click.option("--max-body-mib", type=WholeRange(1, MAX_BOUND_MIB), default=DEFAULT_MAX_BODY_BYTES // (1 << 20),
              show_default=True, help="Largest request body accepted (HTTP 413 above).")
@click.option("--metrics-bind", metavar="HOST:PORT", default=None, callback=_check_metrics_bind,
              help="Also serve /metrics (only) on this address, e.g. 0.0.0.0:9888: for Prometheus when "
                   "--bind is the pod's loopback (the sidecar layout). Default: /metrics on --bind only.")
@record_key_file_option("Kube mode: sign every allocation record with this key (a Secret only the extender and "
                        "the device plugin can read) and honour only records signed for their pod. Without it, "
                        "records are honoured when they match the pod's request, node and scheduler "
                        "(docs/security.md).")
@scheduler_name_option("Kube mode: the schedulerName(s) of Stowage's profile(s); records on other schedulers' "
                       "pods are not honoured (the device plugin's --scheduler-name must be the same).")
@click.option("--stale-after", "stale_after_s", type=seconds(1, 3600), default=60.0, show_default=True,
              help="Kube mode: seconds a failing node or pod watch may go on before the model counts as stale: "
                   "/readyz answers 503 and every verb refuses until the watch is back.")
@click.option("--bind-outcome-hold", "bind_outcome_hold_s", type=seconds(1, 3600),
              default=UNKNOWN_OUTCOME_HOLD_S, show_default=True,
              help="Kube mode: seconds a bind whose Binding was answered 5xx (or whose answer was lost) keeps "
                   "its cards while the pod reads unbound, since the API server may still apply it; the pod is "
                   "not bound elsewhere meanwhile. At least twice kube-apiserver's --request-timeout (60 s by "
                   "default).")
@click.option("--client-timeout", type=seconds(1, 600), default=DEFAULT_CLIENT_TIMEOUT_S, show_default=True,
              help="Seconds a client has to send a whole request (TLS handshake, head, body) once it started, "
                   "and again to take the answer; past it: 408, and the thread serves others.")
@click.option("--timeout", type=WholeRange(5, MAX_WORKER_TIMEOUT_S), default=60, show_default=True,
              help="Seconds a worker's event loop may go without a heartbeat before gunicorn restarts the "
                   "worker (gunicorn's --timeout). A request stuck in its thread does not stop the heartbeat; "
                   "in the split layout the relay's 120 s deadline ends it.")
@click.option("--learned-configmap", default=DEFAULT_PAST_NAME, show_default=True, metavar="[NAMESPACE/]NAME|off",
              callback=_learned_configmap,
              help="Kube mode: the ConfigMap that keeps what the placers learned from deleted pods, so a "
                   "restart of every replica does not lose it (read at start, written while running). "
                   "Namespace: $POD_NAMESPACE, else stowage-system. The extender's RBAC must allow get, "
                   "create and update of it. off: keep nothing (a restart then learns only the pods that "
                   "still exist).")
@click.option("--learned-interval", "learned_interval_s", type=seconds(1, 3600), default=60.0,
              show_default=True, help="Kube mode: seconds between writes of --learned-configmap (only when "
                                      "pods were deleted since; once more at shutdown).")
@_bound_mib_option("--pod-cache-mib", POD_CACHE_BYTES,
                   "MiB (estimated) of the pods parsed at filter, kept for prioritize and bind (100,000 pods at "
                   "most). Past it the least recently used go: a pod bound after its entry went is parsed again at "
                   "bind, from the pending pod's copy or a GET (with --simulated its bind is refused).")
@_bound_mib_option("--learned-pods-mib", LEARNED_BYTES,
                   "MiB (estimated) of the pods the placers learned from, kept by uid so that none is learned twice "
                   "(as many pods as the pod cache at most). Past it the least recently used go, those with long GPU "
                   "model lists first: one seen again is learned twice, and its deletion is not counted in the "
                   "departed pods' past.")
@_bound_mib_option("--pending-pods-mib", PENDING_BYTES,
                   "Kube mode: MiB of the copies of the pending pods of Stowage's schedulers kept for bind (100,000 "
                   "pods at most). Past it the oldest copies go: such a pod, if not seen at filter, is read with a "
                   "GET at bind, and is not requeued when the model gains room.")
@_bound_mib_option("--list-learn-mib", LIST_LEARN_BYTES,
                   "Kube mode: MiB of what a pod list keeps of each pod until its end, to show its pods to the "
                   "placers in creation order. Past it they are shown in batches, in creation order only within "
                   "each: what the placers learned may differ from the running extender's until its next rebuild.")
@click.option("--log-level", envvar="STOWAGE_LOG_LEVEL", show_envvar=True,
              type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False), default="info",
              show_default=True, help="info: the model's source at start, one line per bind (pod, node, cards), "
                                      "feed and refusal warnings; warning: only what went wrong.")
@after_parsing(_check_serve)
def serve(bind: str, tls_cert: str | None, tls_key: str | None, tls_client_ca: str | None,
          allow_unauthenticated: bool, workers: int, threads: int, url_prefix: str, simulated: str | None,
          kubeconfig: str | None, in_cluster: bool, default_node_policy: str, default_card_policy: str,
          memory_unit_mib: int, max_body_mib: int, metrics_bind: str | None, record_key_file: str | None,
          scheduler_names: tuple[str, ...], stale_after_s: float, bind_outcome_hold_s: float,
          client_timeout: float, timeout: int,
          log_level: str, filter_keeps: str, learned_configmap: tuple[str, str] | None, learned_interval_s: float,
          pod_cache_mib: int, learned_pods_mib: int, pending_pods_mib: int, list_learn_mib: int) -> None:
    """Run the kube-scheduler extender (filter, prioritize, bind, /healthz, /readyz, /metrics).

    The card model lives in ONE process (several would each hand out the same cards): the one
    gunicorn worker, or with --workers N > 1 a decision process behind N HTTP-only workers.

    \b
    Examples:
      stowage extender --simulated builtin          # the embedded 36-node cluster, no Kubernetes
      curl -s localhost:8888/readyz                 # then filter/bind by hand: docs/extender.md "Run it"
      stowage extender --simulated my-cluster.yaml --bind 127.0.0.1:9999
      stowage extender --in-cluster --workers 2 --metrics-bind 0.0.0.0:9888   # as scheduler-config/ runs it
    """
    logtext.log_to_stderr(log_level)   # one line per message, whatever it quotes
    tls = tls_files(tls_cert, tls_key, tls_client_ca)   # all or none: checked while parsing
    cluster = None
    if simulated:
        try:
            cluster = load_cluster(simulated)
        except SimClusterError as exc:
            raise click.ClickException(str(exc)) from None
        src = click.get_current_context().get_parameter_source("memory_unit_mib")
        if src == click.core.ParameterSource.DEFAULT:
            memory_unit_mib = cluster.memory_unit_mib  # the simulated "device plugin" advertises in this unit
    if kubeconfig or in_cluster:
        # Fail here, with a clear message, rather than in a worker that gunicorn would restart.
        from .errors import KubeConfigError
        from .kube import load_api_client
        try:
            load_api_client(kubeconfig=kubeconfig, in_cluster=in_cluster).close()
        except KubeConfigError as exc:
            raise click.ClickException(str(exc)) from None
        except Exception as exc:  # e.g. a kubeconfig that is not YAML
            raise click.ClickException(f"cannot load the Kubernetes configuration: {exc}") from None
        load_trust(record_key_file, memory_unit_mib, scheduler_names)   # an unusable key file: here, one line
    cfg = ServeConfig(url_prefix=url_prefix, cluster=cluster, kubeconfig=kubeconfig, in_cluster=in_cluster,
                      default_policy=PodPolicy(node=default_node_policy, card=default_card_policy),
                      memory_unit_mib=memory_unit_mib, max_body_bytes=max_body_mib << 20,
                      metrics_bind=metrics_bind, record_key_file=record_key_file,
                      scheduler_names=tuple(scheduler_names), stale_after_s=stale_after_s,
                      filter_keeps=filter_keeps, bind_outcome_hold_s=bind_outcome_hold_s,
                      learned_configmap=learned_configmap,
                      learned_interval_s=learned_interval_s,
                      pod_cache_bytes=pod_cache_mib << 20, learned_bytes=learned_pods_mib << 20,
                      pending_bytes=pending_pods_mib << 20, list_learn_bytes=list_learn_mib << 20)
    for address, flag in ((bind, "--bind"), (metrics_bind, "--metrics-bind")):
        if address and not address.startswith(("unix:", "fd://")):
            check_can_listen(address, flag, hint="another extender or demo? ")   # one line now, not gunicorn's retries or a worker's traceback
    set_client_timeout(client_timeout)  # the workers fork from this process and inherit it
    return_big_buffers_to_the_system()
    run_server(cfg, bind=bind, threads=threads, log_level=log_level, timeout=timeout, workers=workers, tls=tls)


def tls_files(cert: str | None, key: str | None, client_ca: str | None) -> TLSFiles | None:
    """The TLS settings of the three flags, given all or none (:func:`_check_serve`: HTTPS without
    client verification would still let anyone call bind, so it is not offered), their files
    loaded once here so that unusable ones fail with a message, not on every connection."""
    if not (cert and key and client_ca):
        return None   # none given (serve's parser refuses some without the others)
    try:  # unusable files fail here, with a message, not on every connection in a worker
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=client_ca)
        ctx.load_cert_chain(certfile=cert, keyfile=key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise click.ClickException(f"cannot use --tls-cert {cert} / --tls-key {key} / --tls-client-ca "
                                   f"{client_ca}: {exc}") from None
    return TLSFiles(cert=cert, key=key, client_ca=client_ca)


if __name__ == "__main__":
    serve()
