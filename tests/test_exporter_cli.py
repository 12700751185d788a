"""`stowage exporter` as a process: starts with whatever the node lacks, serves /metrics, stops on SIGTERM."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import requests
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from stowage.cli import main as stowage_main


def test_help_names_every_flag():
    out = CliRunner().invoke(stowage_main, ["exporter", "--help"])
    assert out.exit_code == 0, out.output
    for flag in ("--port", "--node-name", "--pod-resources-socket", "--proc-root", "--kubelet-checkpoint",
                 "--log-level", "9400", "NODE_NAME", "--ignored-xids", "13,31,43,45,68,109", "STOWAGE_IGNORED_XIDS",
                 "--recovery-quiet-seconds", "STOWAGE_RECOVERY_QUIET_SECONDS"):
        assert flag in out.output


def test_bad_flag_values_are_refused_before_starting():
    out = CliRunner().invoke(stowage_main, ["exporter", "--port", "70000"])
    assert out.exit_code == 2 and "--port" in out.output
    # the device plugin's parser and message: one rule for both agents
    out = CliRunner().invoke(stowage_main, ["exporter", "--ignored-xids", "13,x"])
    assert out.exit_code == 2 and "--ignored-xids" in out.output and "'x'" in out.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_runs_without_kubelet_serves_and_stops_on_sigterm(tmp_path):
    port = _free_port()
    env = dict(os.environ, NODE_NAME="node-x", STOWAGE_IGNORED_XIDS="13 79")
    proc = subprocess.Popen([sys.executable, "-m", "stowage.cli", "exporter", "--port", str(port),
                             "--listen-address", "127.0.0.1", "--pod-resources-socket", str(tmp_path / "none.sock"),
                             "--proc-root", str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        text = None
        deadline = time.monotonic() + 60
        while text is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except requests.ConnectionError:
                time.sleep(0.1)
        assert text is not None, proc.stdout.read() if proc.poll() is not None else "no answer"
        up = {s.labels["source"]: (s.labels["node"], s.value)
              for f in text_string_to_metric_families(text) if f.name == "stowage_exporter_up" for s in f.samples}
        assert up["podresources"] == ("node-x", 0.0)
        assert "nvml" in up   # 0 on a machine without a GPU driver, 1 with one: either way it serves
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        log = proc.stdout.read()
        assert "no kubelet PodResources socket" in log and "shutting down" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_seconds_that_are_no_number_are_refused_before_starting():
    """Found by experiment (session 14): click's FloatRange lets ``nan`` through (every comparison
    with it is false). ``--cache-seconds nan`` or ``inf`` made the first reading the only one:
    ``time since it >= nan`` is never true, so every scrape served it, stale and with every source
    up, for the process' life; ``--recovery-quiet-seconds nan`` left an unhealthy card 0 for ever."""
    for flag, value in (("--cache-seconds", "nan"), ("--cache-seconds", "inf"), ("--cache-seconds", "1e400"),
                        ("--recovery-quiet-seconds", "nan")):
        out = CliRunner().invoke(stowage_main, ["exporter", flag, value])
        assert out.exit_code == 2 and flag in out.output, (flag, value, out.output)
