"""`stowage exporter`: serve per-card and per-pod GPU metrics for Prometheus until SIGTERM."""
from __future__ import annotations

import logging
import signal
import threading

import click

from gpunode.health import DEFAULT_IGNORED_XIDS, ignored_xids_option
from stowage import logtext
from stowage.bounded import WholeRange
from stowage.finite import seconds

from .checkpoint import DEFAULT_CHECKPOINT
from .podlogs import DEFAULT_POD_LOGS

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


@click.command(name="exporter", context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--port", envvar="STOWAGE_EXPORTER_PORT", type=WholeRange(0, 65535), default=9400,
              help="Port serving GET /metrics (Prometheus text format).")
@click.option("--listen-address", envvar="STOWAGE_EXPORTER_ADDRESS", default="0.0.0.0",
              help="Address to listen on.")
@click.option("--node-name", envvar="NODE_NAME", default="",
              help="This node's name (env NODE_NAME, from the downward API): the `node` label of every series.")
@click.option("--pod-resources-socket", envvar="STOWAGE_POD_RESOURCES_SOCKET", default=DEFAULT_SOCKET,
              help="The kubelet's PodResources API (v1) socket: which device IDs each container holds.")
@click.option("--pod-logs-dir", envvar="STOWAGE_POD_LOGS_DIR", default=DEFAULT_POD_LOGS,
              help="The kubelet's pod log directory (<namespace>_<pod>_<uid>/): maps the pod UIDs found in "
                   "/proc/<pid>/cgroup to pod names, for splitting shared cards by process. Only listed, never read.")
@click.option("--kubelet-checkpoint", envvar="STOWAGE_KUBELET_CHECKPOINT", default=DEFAULT_CHECKPOINT,
              help="The kubelet's device-manager checkpoint: a second way to map pod UIDs to names (joined with "
                   "PodResources by device ID). With neither this nor --pod-logs-dir, shared cards are estimated.")
@click.option("--proc-root", envvar="STOWAGE_PROC_ROOT", default="/proc",
              help="Where the host's /proc is visible (needs hostPID: NVML reports host PIDs).")
@click.option("--cache-seconds", envvar="STOWAGE_EXPORTER_CACHE_SECONDS", type=seconds(0, 3600), default=2.0,
              help="Scrapes within this many seconds of the last reading reuse it (NVML is read at most once).")
@click.option("--ignored-xids", envvar="STOWAGE_IGNORED_XIDS", default=None, callback=ignored_xids_option,
              help="XIDs that do not mark a card unhealthy, comma separated; replaces the default "
                   f"{','.join(map(str, sorted(DEFAULT_IGNORED_XIDS)))} (application faults). 'all' disables the "
                   "XID and probe checks (a card NVML cannot read, or one in MIG mode, is still unhealthy). Env STOWAGE_IGNORED_XIDS, "
                   "as for the device plugin: give both the same value and stowage_gpu_healthy says what the "
                   "plugin advertises.")
@click.option("--recovery-quiet-seconds", envvar="STOWAGE_RECOVERY_QUIET_SECONDS", type=seconds(0),
              default=120.0, help="An unhealthy card quiet this long and passing its probe is healthy again "
                                  "(env STOWAGE_RECOVERY_QUIET_SECONDS, as for the device plugin).")
@click.option("--log-level", envvar="STOWAGE_LOG_LEVEL", show_envvar=True, default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="INFO: start, and each source or card that fails (once) and answers again; "
                   "WARNING: only what went wrong.")
def main(port: int, listen_address: str, node_name: str, pod_resources_socket: str, pod_logs_dir: str,
         kubelet_checkpoint: str, proc_root: str, cache_seconds: float, ignored_xids: tuple[frozenset[int], bool],
         recovery_quiet_seconds: float, log_level: str) -> None:
    """Serve this node's GPU metrics on :PORT/metrics: per card (utilisation, memory used/total,
    power, temperature, health) and per pod (utilisation and memory of each container on each
    card, shared cards split by process), labelled node/gpu/model and pod/namespace/container.
    Names and labels: docs/metrics-contract.md.

    Runs without a GPU or without the kubelet socket: it then serves what it can,
    stowage_exporter_up{source=...} says what is missing, and the log says why (once).
    """
    ignored, disabled = ignored_xids   # read while parsing (gpunode.health.ignored_xids_option)
    logtext.log_to_stderr(log_level)   # one line per message, whatever it quotes
    log = logging.getLogger("stowage.exporter")
    from .collector import ExporterConfig  # pynvml/grpc/stubs: only when actually running
    from .server import Exporter

    cfg = ExporterConfig(node=node_name, pod_resources_socket=pod_resources_socket,
                         checkpoint_path=kubelet_checkpoint, pod_logs_dir=pod_logs_dir, proc_root=proc_root,
                         cache_s=cache_seconds, ignored_xids=ignored, health_disabled=disabled,
                         recovery_quiet_s=recovery_quiet_seconds)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    exporter = Exporter(cfg)
    try:
        exporter.start(port, listen_address)
    except OSError as exc:
        exporter.stop()
        raise click.ClickException(f"cannot listen on {listen_address}:{port}: {exc}") from exc
    exporter.collector.snapshot()  # log what is missing at start, not at the first scrape
    while not done.wait(1.0):
        pass
    log.info("shutting down")
    exporter.stop()
