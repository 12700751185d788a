"""The device plugin's metrics port (``--metrics-port``, on in the shipped DaemonSet) is open to the
pod network, so anyone there can connect: connections that never finish their request must not
pile up. prometheus_client's own server (``start_http_server``, which the plugin used) gives each
connection a thread that waits for its request for ever; the plugin's memory limit is 256 MiB,
and an OOM-killed plugin fails the admission of every GPU pod pending on its node. The exporter
had the same hole (tests/test_exporter_connections.py); both now serve with the bounded server
they share (stowage/metrics_http.py)."""
from __future__ import annotations

import threading

from silent_connections import assert_capped_and_scraped

from deviceplugin.cli import serve_metrics
from dp_harness import rig


def test_silent_connections_to_the_plugins_metrics_port_are_capped_and_a_scrape_is_answered(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        server, thread = serve_metrics(r.plugin.reconciler.registry, 0, "127.0.0.1")
        try:
            assert_capped_and_scraped(server.server_port, "stowage_deviceplugin_record_corrections",
                                      threading.active_count())
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


def test_a_metrics_port_in_use_is_one_line_before_anything_is_served():
    """With hostNetwork another node agent may hold the port. The plugin served and registered,
    then died on the metrics port with a traceback, its sockets left behind for the kubelet."""
    import os
    import socket
    import subprocess
    import sys
    import textwrap

    from dp_harness import NODE, short_tmpdir
    from fakekube import FakeKube, make_node
    from shared_paths import ROOT

    base = short_tmpdir()
    plugin_dir = os.path.join(base, "dp")
    with FakeKube() as kube, socket.socket() as taken:
        kube.create_node(make_node(NODE, gpus=2))
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        script = textwrap.dedent(f"""
            import sys
            sys.path[:0] = [{str(ROOT)!r}, {os.path.join(str(ROOT), 'tests')!r}]
            from fakenvml import FakeNvml
            from dp_harness import default_cards
            FakeNvml(default_cards()).install()
            from deviceplugin.cli import main
            main(["--plugin-dir", {plugin_dir!r}, "--node-name", {NODE!r}, "--kube-api", {kube.url!r},
                  "--dev-root", {base!r}, "--pod-resources-socket", "", "--metrics-port", "{port}"])
        """)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("Error:")]
    assert f":{port}" in line and "--metrics-port" in line and "in use" in line, line
    assert not os.path.exists(plugin_dir) or not [f for f in os.listdir(plugin_dir) if f.endswith(".sock")], \
        os.listdir(plugin_dir)
