"""`stowage extender`: serve filter/prioritize/bind for kube-scheduler under gunicorn.

Two ways to feed the model: ``--simulated FILE|builtin`` (an embedded cluster, no Kubernetes;
what `stowage demo` runs) or ``--kubeconfig FILE`` / ``--in-cluster`` (list+watch of nodes and
pods through the Kubernetes API, binding through ``pods/binding``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import click
from flask import Flask

from stowage.resources import DEFAULT_MEMORY_UNIT_MIB

from .app import DEFAULT_MAX_BODY_BYTES, create_app
from .gunicorn_conf import ExtenderServer, gunicorn_options, register_exit
from .model import ClusterModel
from .policy import PACK, SPREAD, PodPolicy
from .service import ExtenderService
from .simcluster import SimCluster, SimClusterError, describe, load_cluster

log = logging.getLogger("stowage.extender")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


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


def parse_host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::]:9888`` for IPv6) -> (host, port); ValueError with a clear message."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT (e.g. 0.0.0.0:9888), got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve_metrics(app: Flask, bind: str) -> None:
    """Serve the app's Prometheus registry alone on ``bind`` (a thread of this worker).

    Why a second listener: in the sidecar layout the extender's verbs listen on the pod's
    loopback only (nothing but kube-scheduler may call bind), so Prometheus could not reach
    /metrics there; this port serves nothing but the metrics."""
    from prometheus_client import start_http_server

    host, port = parse_host_port(bind)
    server, _thread = start_http_server(port, addr=host, registry=app.extensions["stowage"]["metrics"].registry)
    register_exit(server.shutdown)
    log.info("metrics on http://%s:%d/metrics", host, port)


def build_app(cfg: ServeConfig) -> Flask:
    """The extender app for ``cfg`` (with its metrics listener, if asked for)."""
    app = _build_app(cfg)
    if cfg.metrics_bind:
        serve_metrics(app, cfg.metrics_bind)
    return app


def _build_app(cfg: ServeConfig) -> Flask:
    """The extender app for ``cfg``, with its model fed (simulated) or being fed (kube)."""
    model = ClusterModel()
    if cfg.cluster is not None:
        cfg.cluster.populate(model)
        service = ExtenderService(model, memory_unit_mib=cfg.memory_unit_mib, default_policy=cfg.default_policy)
        message = f"simulated cluster {cfg.cluster.source}: {describe(cfg.cluster)}"
        log.info("model fed from %s", message)
        return create_app(service, url_prefix=cfg.url_prefix, ready=lambda: (True, message),
                          max_body_bytes=cfg.max_body_bytes)
    # Kube mode: imported lazily so simulated mode never needs the Kubernetes client set up.
    from .kube import KubeFeeder, load_api_client
    from .kube_binder import KubeBinder

    api_client = load_api_client(kubeconfig=cfg.kubeconfig, in_cluster=cfg.in_cluster)
    feeder = KubeFeeder(model, api_client, memory_unit_mib=cfg.memory_unit_mib)
    service = ExtenderService(model, binder=KubeBinder(api_client), pod_source=feeder,
                              memory_unit_mib=cfg.memory_unit_mib, default_policy=cfg.default_policy)
    feeder.start()
    register_exit(feeder.stop)
    return create_app(service, url_prefix=cfg.url_prefix, ready=feeder.ready, max_body_bytes=cfg.max_body_bytes)


def run_server(cfg: ServeConfig, bind: str, threads: int, log_level: str,
               factory: Callable[[ServeConfig], Flask] = build_app, workers: int = 1, **extra: Any) -> None:
    """Run gunicorn in this process until SIGTERM/SIGINT: one worker holding the model, or with
    ``workers`` > 1 the split layout (HTTP workers in front of one decision process)."""
    if workers > 1:
        from .split import run_split

        run_split(lambda: factory(cfg), bind=bind, workers=workers, threads=threads, log_level=log_level,
                  url_prefix=cfg.url_prefix, max_body_bytes=cfg.max_body_bytes, **extra)
        return
    options = gunicorn_options(bind=bind, threads=threads, log_level=log_level, **extra)
    ExtenderServer(lambda: factory(cfg), options).run()


def _check_metrics_bind(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            parse_host_port(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


@click.command("extender")
@click.option("--bind", default="0.0.0.0:8888", show_default=True,
              help="Address to listen on: HOST:PORT, unix:PATH or fd://FD.")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="HTTP worker processes. 1: one process holds the model and serves the HTTP. "
                   "More: the split layout, N HTTP-only workers in front of ONE decision process that "
                   "holds the model (the HTTP work then uses several cores; answers are the same).")
@click.option("--threads", type=click.IntRange(1, 256), default=8, show_default=True,
              help="Request threads per worker process.")
@click.option("--url-prefix", default="", show_default=True,
              help="Path prefix of the verbs, e.g. /stowage for /stowage/filter (the scheduler's urlPrefix path).")
@click.option("--simulated", metavar="FILE|builtin",
              help="Feed the model from a simulated cluster file (or the built-in one) instead of Kubernetes.")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False),
              help="Kubeconfig for the API server (kube mode).")
@click.option("--in-cluster", is_flag=True, help="Use the pod's service account (kube mode).")
@click.option("--default-node-policy", type=click.Choice([PACK, SPREAD]), default=PACK, show_default=True,
              help="Node-level policy for pods without the stowage.io/node-policy annotation.")
@click.option("--default-card-policy", type=click.Choice([PACK, SPREAD]), default=PACK, show_default=True,
              help="Card-level policy for pods without the stowage.io/card-policy annotation.")
@click.option("--memory-unit-mib", type=click.IntRange(1), default=DEFAULT_MEMORY_UNIT_MIB, show_default=True,
              help="MiB per unit of nvidia.com/gpu-memory (must match the device plugin).")
@click.option("--max-body-mib", type=click.IntRange(1), default=DEFAULT_MAX_BODY_BYTES // (1 << 20),
              show_default=True, help="Largest request body accepted (HTTP 413 above).")
@click.option("--metrics-bind", metavar="HOST:PORT", default=None, callback=_check_metrics_bind,
              help="Also serve /metrics (only) on this address, e.g. 0.0.0.0:9888: for Prometheus when "
                   "--bind is the pod's loopback (the sidecar layout). Default: /metrics on --bind only.")
@click.option("--timeout", type=click.IntRange(5), default=60, show_default=True,
              help="Seconds a request may run before gunicorn restarts the worker.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def serve(bind: str, workers: int, threads: int, url_prefix: str, simulated: str | None, kubeconfig: str | None,
          in_cluster: bool, default_node_policy: str, default_card_policy: str, memory_unit_mib: int,
          max_body_mib: int, metrics_bind: str | None, timeout: int, log_level: str) -> None:
    """Run the kube-scheduler extender (filter, prioritize, bind, /healthz, /readyz, /metrics).

    The card model lives in ONE process (several would each hand out the same cards): the one
    gunicorn worker, or with --workers N > 1 a decision process behind N HTTP-only workers.
    """
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
    modes = sum(bool(x) for x in (simulated, kubeconfig or in_cluster))
    if modes != 1:
        raise click.UsageError("choose one model source: --simulated FILE|builtin, or --kubeconfig FILE / --in-cluster")
    if kubeconfig and in_cluster:
        raise click.UsageError("--kubeconfig and --in-cluster are exclusive")
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
    cfg = ServeConfig(url_prefix=url_prefix, cluster=cluster, kubeconfig=kubeconfig, in_cluster=in_cluster,
                      default_policy=PodPolicy(node=default_node_policy, card=default_card_policy),
                      memory_unit_mib=memory_unit_mib, max_body_bytes=max_body_mib << 20,
                      metrics_bind=metrics_bind)
    run_server(cfg, bind=bind, threads=threads, log_level=log_level, timeout=timeout, workers=workers)


if __name__ == "__main__":
    serve()
