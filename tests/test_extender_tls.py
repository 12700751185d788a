"""Issue 12, item 3 ("an open door"): the extender listens on the loopback by default, refuses an
address other machines can reach unless it serves HTTPS with client-certificate verification, and
with --tls-cert/--tls-key/--tls-client-ca only a client holding a certificate from the client CA
gets any answer (verbs, /state, /allocations), in both serving layouts."""
from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests
import yaml
from click.testing import CliRunner

from extender.cli import serve
from tlsutil import TLSSet, make_tls_set

CLUSTER = {"nodes": [{"name": "node-b", "gpus": {"model": "Tesla T4", "count": 4, "memory": "16Gi"}}]}


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TLSSet:
    return make_tls_set(tmp_path_factory.mktemp("tls"))


class TLSExtender:
    """`stowage extender --simulated FILE` under gunicorn with TLS flags, on a socket bound here."""

    def __init__(self, tmp: Path, args: list[str], host: str = "127.0.0.1") -> None:
        cluster = tmp / "cluster.yaml"
        cluster.write_text(yaml.safe_dump(CLUSTER))
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.log = tempfile.NamedTemporaryFile(prefix="stowage-tls-", suffix=".log", delete=False, dir=tmp)
        fd = self.sock.fileno()
        self.proc = subprocess.Popen([sys.executable, "-m", "extender.cli", "--simulated", str(cluster),
                                      "--bind", f"fd://{fd}", "--threads", "2", *args],
                                     pass_fds=(fd,), stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    def log_text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def wait(self, get) -> requests.Response:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the extender exited ({self.proc.returncode}):\n{self.log_text()}")
            try:
                r = get()
                if r.status_code == 200:
                    return r
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the extender never answered:\n{self.log_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.sock.close()
        self.log.close()


def test_default_bind_is_the_loopback():
    bind = next(p for p in serve.params if p.name == "bind")
    assert bind.default == "127.0.0.1:8888"


@pytest.mark.parametrize("bind", ["0.0.0.0:18888", "[::]:18888", "10.1.2.3:18888"])
def test_a_reachable_address_without_tls_is_refused(bind):
    r = CliRunner().invoke(serve, ["--simulated", "builtin", "--bind", bind])
    assert r.exit_code == 2 and "can be reached from other machines" in r.output and "--tls-client-ca" in r.output


def test_an_inherited_socket_on_all_interfaces_without_tls_is_refused(tmp_path):
    ext = TLSExtender(tmp_path, [], host="0.0.0.0")
    try:
        assert ext.proc.wait(60) == 2
        assert "can be reached from other machines" in ext.log_text()
    finally:
        ext.stop()


def test_tls_flags_come_together(tls):
    r = CliRunner().invoke(serve, ["--simulated", "builtin", "--tls-cert", str(tls.server.cert),
                                   "--tls-key", str(tls.server.key)])
    assert r.exit_code == 2 and "also needs --tls-client-ca" in r.output
    r = CliRunner().invoke(serve, ["--simulated", "builtin", "--tls-cert", str(tls.server.cert),
                                   "--tls-key", str(tls.client.key), "--tls-client-ca", str(tls.client_ca.cert)])
    assert r.exit_code == 1 and "cannot use --tls-cert" in r.output  # key of another certificate


def _refused(url: str, **kw) -> str:
    """The error a client gets; fails the test if it got an HTTP answer instead."""
    try:
        r = requests.get(url, timeout=10, **kw)
    except requests.exceptions.RequestException as exc:
        return type(exc).__name__
    raise AssertionError(f"{url} answered {r.status_code} {r.text[:200]!r} to a client without a valid certificate")


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "split"])
def test_only_clients_with_a_certificate_from_the_client_ca_get_answers(tmp_path, tls, workers, wire):
    # On all interfaces: with TLS that is allowed, and the certificate is the only door.
    ext = TLSExtender(tmp_path, [*tls.server_args(), "--workers", str(workers)], host="0.0.0.0")
    https = f"https://127.0.0.1:{ext.port}"
    ok = requests.Session()
    ok.trust_env = False  # REQUESTS_CA_BUNDLE would override ok.verify
    ok.verify, ok.cert = str(tls.ca.cert), (str(tls.client.cert), str(tls.client.key))
    try:
        ext.wait(lambda: ok.get(https + "/readyz", timeout=5))
        # The caller with kube-scheduler's certificate: every verb and view works.
        pod = {"metadata": {"name": "p", "namespace": "default", "uid": "uid-1"},
               "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        ans = ok.post(https + "/filter", json={"Pod": pod, "NodeNames": ["node-b"]}, timeout=10).json()
        assert ans["NodeNames"] == ["node-b"]
        bind = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-1", "Node": "node-b"}
        assert ok.post(https + "/bind", json=bind, timeout=10).json() == {"Error": ""}
        assert ok.get(https + "/allocations/uid-1", timeout=10).json()["node"] == "node-b"
        assert "uid-1" in ok.get(https + "/state", timeout=10).json()["allocations"]
        # Everyone else: no certificate, a certificate from another CA, plain HTTP.
        for path in ("/state", "/allocations/uid-1", "/readyz"):
            _refused(https + path, verify=str(tls.ca.cert))
            _refused(https + path, verify=str(tls.ca.cert), cert=(str(tls.stranger.cert), str(tls.stranger.key)))
            _refused(f"http://127.0.0.1:{ext.port}" + path)
        for verb, body in (("bind", dict(bind, PodUID="uid-2", PodName="q")),
                           ("filter", {"Pod": pod, "NodeNames": ["node-b"]})):
            with pytest.raises(requests.exceptions.RequestException):
                requests.post(https + "/" + verb, json=body, verify=str(tls.ca.cert), timeout=10)
        # A raw TLS handshake without a certificate is refused by the server (not just ignored).
        ctx = ssl.create_default_context(cafile=str(tls.ca.cert))
        with socket.create_connection(("127.0.0.1", ext.port), timeout=10) as raw:
            with pytest.raises((ssl.SSLError, ConnectionResetError)):
                with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as t:
                    t.sendall(b"GET /state HTTP/1.1\r\nHost: x\r\n\r\n")
                    assert not t.recv(100)  # TLS 1.3: the refusal arrives on the first read
                    raise ssl.SSLError("closed without an answer")
        # Nothing the strangers sent was acted upon, and the server still serves its client.
        state = ok.get(https + "/state", timeout=10).json()
        assert list(state["allocations"]) == ["uid-1"]
        assert ext.proc.poll() is None
    finally:
        ok.close()
        ext.stop()


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "split"])
def test_a_stalled_tls_handshake_does_not_hold_a_thread(tmp_path, tls, workers):
    """Clients that start a TLS handshake and stop (more of them than request threads) are cut off
    after --client-timeout; kube-scheduler's requests are served meanwhile and after."""
    ext = TLSExtender(tmp_path, [*tls.server_args(), "--workers", str(workers), "--client-timeout", "3"])
    https = f"https://127.0.0.1:{ext.port}"
    ok = requests.Session()
    ok.trust_env = False
    ok.verify, ok.cert = str(tls.ca.cert), (str(tls.client.cert), str(tls.client.key))
    stalled = []
    try:
        ext.wait(lambda: ok.get(https + "/readyz", timeout=5))
        for _ in range(4 * 2 * workers):  # --threads 2 per worker
            s = socket.create_connection(("127.0.0.1", ext.port), timeout=60)
            s.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # the start of a ClientHello
            stalled.append(s)
        time.sleep(1.0)
        assert ok.get(https + "/state", timeout=60).status_code == 200
        for s in stalled:
            try:
                assert s.recv(65536) == b""  # closed by the server, not left hanging
            except ConnectionResetError:
                pass
        assert ok.get(https + "/readyz", timeout=60).status_code == 200
    finally:
        for s in stalled:
            s.close()
        ok.close()
        ext.stop()
