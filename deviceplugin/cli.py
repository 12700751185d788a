"""`stowage device-plugin`: run the kubelet device plugin on this node until SIGTERM."""
from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import click

from stowage import logtext
from stowage.bounded import WholeRange
from stowage.clickcheck import cannot_listen, check_can_listen
from stowage.finite import seconds
from stowage.resources import DEFAULT_MEMORY_UNIT_MIB, GPU_RESOURCES, MAX_CARD_MEMORY_MIB
from stowage.trust_options import load_trust, record_key_file_option, scheduler_name_option

from gpunode.health import DEFAULT_IGNORED_XIDS, ignored_xids_option

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


@click.command(name="device-plugin", context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--node-name", envvar="NODE_NAME", default="",
              help="This node's name (env NODE_NAME, from the downward API): where the inventory is published "
                   "and whose pods' allocation records steer Allocate.")
@click.option("--plugin-dir", envvar="STOWAGE_PLUGIN_DIR", default=DEFAULT_PLUGIN_DIR,
              help="The kubelet's device-plugin directory (kubelet.sock lives there).")
@click.option("--memory-unit-mib", envvar="STOWAGE_MEMORY_UNIT_MIB", type=WholeRange(1, MAX_CARD_MEMORY_MIB),
              default=DEFAULT_MEMORY_UNIT_MIB,
              help="MiB per nvidia.com/gpu-memory device. Must equal the extender's --memory-unit-mib.")
@click.option("--resource", "resources", envvar="STOWAGE_RESOURCES", multiple=True,
              type=click.Choice(GPU_RESOURCES), default=GPU_RESOURCES,
              help="Resources to advertise (repeat the flag; env: space separated).")
@click.option("--ignored-xids", envvar="STOWAGE_IGNORED_XIDS", default=None, callback=ignored_xids_option,
              help="XIDs that do not mark a card unhealthy, comma separated; replaces the default "
                   f"{','.join(map(str, sorted(DEFAULT_IGNORED_XIDS)))} (application faults). 'all' disables "
                   "health checks (a card in MIG mode is still unhealthy).")
@click.option("--recovery-quiet-seconds", envvar="STOWAGE_RECOVERY_QUIET_SECONDS", type=seconds(0),
              default=120.0, help="An unhealthy card quiet this long is probed and, if fine, marked Healthy again.")
@click.option("--probe-interval-seconds", envvar="STOWAGE_PROBE_INTERVAL_SECONDS", type=seconds(0.05),
              default=10.0, help="How often every card is probed (vanished cards, recovery).")
@click.option("--dev-root", envvar="STOWAGE_DEV_ROOT", default="/dev",
              help="Where this container sees the host's /dev (device specs are only sent for nodes that exist).")
@click.option("--pod-resources-socket", envvar="STOWAGE_POD_RESOURCES_SOCKET",
              default="/var/lib/kubelet/pod-resources/kubelet.sock",
              help="The kubelet's PodResources API socket: which devices the kubelet already gave to which pod "
                   "(survives plugin restarts; corrects swapped records). Empty: in-memory count only.")
@click.option("--reconcile-interval-seconds", envvar="STOWAGE_RECONCILE_INTERVAL_SECONDS",
              type=seconds(0.1), default=5.0,
              help="How often pods' allocation records are compared with the kubelet's allocations "
                   "(also 0.5 s after every Allocate).")
@record_key_file_option("The key the extender signs allocation records with (the same Secret): only records "
                        "signed for their pod are honoured, and corrected records are signed. Without it, a record "
                        "is honoured when it matches its pod's request, node and scheduler (docs/security.md).")
@scheduler_name_option("schedulerName(s) of Stowage's profile(s): records on other schedulers' pods are not "
                       "honoured. Must equal the extender's --scheduler-name.")
@click.option("--metrics-port", envvar="STOWAGE_METRICS_PORT", type=WholeRange(0, 65535), default=0,
              help="Serve the plugin's Prometheus metrics (record corrections) on this port; 0: off.")
@click.option("--kube-api", envvar="STOWAGE_KUBE_API", default=None,
              help="API server URL (e.g. kubectl proxy); default: in-cluster config, else kubeconfig.")
@click.option("--no-kube", is_flag=True, help="Run without the API server: no inventory, Allocate refuses.")
@click.option("--log-level", envvar="STOWAGE_LOG_LEVEL", show_envvar=True, default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="INFO: the cards found, registration, one line per Allocate; WARNING: only what went wrong.")
def main(node_name: str, plugin_dir: str, memory_unit_mib: int, resources: tuple[str, ...],
         ignored_xids: tuple[frozenset[int], bool],
         recovery_quiet_seconds: float, probe_interval_seconds: float, dev_root: str, pod_resources_socket: str,
         reconcile_interval_seconds: float, record_key_file: str | None, scheduler_names: tuple[str, ...],
         metrics_port: int, kube_api: str | None, no_kube: bool, log_level: str) -> None:
    """Advertise this node's GPUs to the kubelet as nvidia.com/gpu (whole cards),
    nvidia.com/gpu-memory (one device per memory unit) and nvidia.com/gpu-core (100 per card),
    keep their health current (XID events, probes, recovery), publish the card inventory the
    Stowage extender reads, and give each container exactly the card(s) the extender recorded on
    its pod. Runs until SIGTERM/SIGINT, then removes its sockets.
    """
    logtext.log_to_stderr(log_level)   # one line per message, whatever it quotes
    log = logging.getLogger("stowage.deviceplugin")
    ignored, disabled = ignored_xids   # read while parsing (gpunode.health.ignored_xids_option)
    from .server import DevicePlugin, MessageTooLarge, PluginConfig, PluginDirUnusable  # grpc + stubs: only when actually running
    load_trust(record_key_file, memory_unit_mib, scheduler_names)   # an unusable key file: here, one line

    core_api = None
    if not no_kube:
        if not node_name:
            log.warning("no --node-name / NODE_NAME: running without the Kubernetes API")
        else:
            try:
                from .kube import make_core_api
                core_api = make_core_api(kube_api)
            except Exception as exc:
                log.error("no Kubernetes API configuration (%s): inventory not published, Allocate will refuse", exc)
    cfg = PluginConfig(node=node_name, plugin_dir=plugin_dir, memory_unit_mib=memory_unit_mib,
                       resources=tuple(dict.fromkeys(resources)), ignored_xids=ignored, health_disabled=disabled,
                       recovery_quiet_s=recovery_quiet_seconds, probe_interval_s=probe_interval_seconds,
                       dev_root=dev_root, core_api=core_api, pod_resources_socket=pod_resources_socket,
                       reconcile_interval_s=reconcile_interval_seconds, record_key_file=record_key_file,
                       scheduler_names=tuple(scheduler_names))
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    metrics_at, metrics_hint = f"0.0.0.0:{metrics_port}", "another node agent on the host network? "
    if metrics_port and core_api is not None and node_name:   # the port it will serve, before anything is served
        check_can_listen(metrics_at, "--metrics-port", metrics_hint)
    plugin = DevicePlugin(cfg)
    try:
        plugin.start()
    except MessageTooLarge as exc:   # the kubelet would silently advertise nothing: refuse, saying why
        raise click.BadParameter(str(exc), param_hint="--memory-unit-mib") from None
    except PluginDirUnusable as exc:   # before NVML is opened or anything served
        raise click.ClickException(str(exc)) from None
    if metrics_port and plugin.reconciler is not None:
        try:
            serve_metrics(plugin.reconciler.registry, metrics_port)
        except OSError as exc:   # taken since the check: stop serving the kubelet, say why in one line
            plugin.stop()
            raise cannot_listen(metrics_at, "--metrics-port", exc, metrics_hint) from None
        log.info("metrics on :%d/metrics", metrics_port)
    log.info("device plugin running for %s in %s", ", ".join(cfg.resources), plugin_dir)
    while not done.wait(1.0):
        pass
    log.info("shutting down")
    plugin.stop()


def serve_metrics(registry: Any, port: int, addr: str = "0.0.0.0") -> tuple[Any, Any]:
    """Serve ``registry`` on ``addr:port`` (0: a free port) in a background thread; returns
    (server, thread). On the bounded server every Stowage metrics port uses
    (:mod:`stowage.metrics_http`), not prometheus_client's ``start_http_server``: the port is
    open to the pod network, and that server gives every silent connection a thread for ever
    (the plugin's limit is 256 MiB)."""
    from stowage.metrics_http import serve
    return serve(registry, port, addr)

