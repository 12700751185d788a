"""Every Stowage metrics port (the exporter's, the device plugin's ``--metrics-port``, the
extender's ``--metrics-bind``) is open to the pod network, so its clients need not be Prometheus:
a client that sends its request a byte at a time, one that sends megabytes of headers, one that
asks while a collection fails. Each gets a clear error or is dropped; none holds a thread past
the request timeout, memory past a small bound per connection, or the scrape of another.
The server is stowage/metrics_http.py (tests/test_exporter_connections.py: silent connections);
here it serves a small registry of its own, and the exporter once for Prometheus' own request."""
from __future__ import annotations

import gzip
import logging
import re
import socket
import threading
import time
from typing import Iterator

import pynvml
import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

from exporter_harness import GpuNode, Scrape, make_node
from stowage import metrics_http
from stowage.metrics_http import MetricsServer

# What Prometheus (2.x and 3.x) sends with every scrape: OpenMetrics first, gzip.
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
                     "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


class Flaky:
    """A collector that counts its collections and raises while ``error`` is set (an NVML error, a bug)."""

    def __init__(self) -> None:
        self.error: Exception | None = None
        self.calls = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        yield GaugeMetricFamily("probe_up", "1", value=1)


@pytest.fixture
def served(monkeypatch) -> Iterator[tuple[MetricsServer, Flaky]]:
    monkeypatch.setattr(metrics_http, "REQUEST_TIMEOUT_S", 1.0)
    collector = Flaky()
    registry = CollectorRegistry()
    registry.register(collector)   # type: ignore[arg-type]
    server, thread = metrics_http.serve(registry, 0, "127.0.0.1")
    try:
        yield server, collector
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _url(server: MetricsServer) -> str:
    return f"http://127.0.0.1:{server.server_port}/metrics"


def _answer(s: socket.socket) -> bytes:
    """Everything the server sends until it closes (the socket's timeout is the ceiling for a hang)."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def test_a_request_sent_a_byte_at_a_time_is_closed_at_the_request_timeout_and_not_answered(served):
    """The socket's timeout bounds each read, and a client that sends one byte of its headers
    before each read times out (slowloris) passed every one: it held its thread for as long as it
    kept sending (until 64 newer ones shed it). A connection's request must be in within
    REQUEST_TIMEOUT_S of its arrival, as the docs say, and a connection closed for it is not
    answered (no collection is run for a client that is gone)."""
    server, collector = served
    s = socket.create_connection(("127.0.0.1", server.server_port), timeout=30)
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000   # 10,000 reads at one a byte
    closed = threading.Event()

    def drip() -> None:
        for byte in head:
            try:
                s.sendall(bytes([byte]))
            except OSError:
                break
            if closed.wait(0.1):   # ten times within the timeout: each read gets its byte
                break
    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    try:
        deadline = time.monotonic() + 60    # a ceiling for a hang only
        while not server.handlers:          # accepted
            assert time.monotonic() < deadline
            time.sleep(0.05)
        while server.handlers:
            assert time.monotonic() < deadline, f"a request sent a byte at a time still held its thread ({s})"
            assert requests.get(_url(server), timeout=10).status_code == 200   # the others are answered meanwhile
            time.sleep(0.2)
        calls = collector.calls
        s.settimeout(10)
        assert _answer(s) == b""            # closed, with no answer
        assert collector.calls == calls and server.timed_out == 1
    finally:
        closed.set()
        s.close()
        dripper.join(timeout=10)


def test_request_headers_past_the_bound_get_431_before_the_rest_is_sent(served, monkeypatch):
    """http.server reads up to 100 header lines of 64 KiB each: 6.4 MB a connection, held while
    the request waits for its end. 64 connections (the most that may wait) sending that much and
    never the blank line held 424 MiB in a probe, past the exporter's and the device plugin's 256 MiB.
    Headers past MAX_HEADER_BYTES are refused with 431 as soon as they pass it, not read on."""
    monkeypatch.setattr(metrics_http, "REQUEST_TIMEOUT_S", 120.0)   # a 431 here is no timeout
    server, collector = served
    line = b"X-Big: " + b"a" * 4000 + b"\r\n"
    headers = line * (metrics_http.MAX_HEADER_BYTES // len(line) + 1)   # just past the bound; no end
    with socket.create_connection(("127.0.0.1", server.server_port), timeout=30) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + headers)
        answer = _answer(s)
    assert answer.startswith(b"HTTP/1.0 431 "), answer[:200]
    assert f"over {metrics_http.MAX_HEADER_BYTES} bytes".encode() in answer
    assert collector.calls == 0
    assert requests.get(_url(server), timeout=10).status_code == 200


def test_headers_within_the_bound_are_answered(served):
    """What browsers and curl send (a few hundred bytes, some KiB with cookies) stays well within."""
    server, _ = served
    r = requests.get(_url(server), timeout=10, headers={"Cookie": "c" * 8000, "User-Agent": "curl/8.5.0"})
    assert r.status_code == 200 and "probe_up 1.0" in r.text


def test_a_collection_that_raises_is_a_short_500_logged_once_and_the_next_scrape_works(served, caplog):
    """wsgiref answered a collection that raised with its generic 500 ("A server error occurred.
    Please contact the administrator.") and printed the traceback on stderr, past the process's
    logging, on every scrape (two Prometheus replicas: 8 tracebacks a minute). The 500 names what
    failed; the log says it once (through the logger), and again only when the error changes."""
    caplog.set_level(logging.DEBUG, logger="stowage.metrics")
    server, collector = served
    collector.error = RuntimeError("NVML: GPU is lost")
    for _ in range(3):
        r = requests.get(_url(server), timeout=10)
        assert r.status_code == 500 and r.headers["Content-Type"].startswith("text/plain")
        assert r.text == "collecting the metrics failed (RuntimeError); the process's log has the error\n"
    loud = [m for m in caplog.records if m.name == "stowage.metrics" and m.levelno >= logging.WARNING]
    assert len(loud) == 1 and loud[0].exc_info is not None and "NVML: GPU is lost" in str(loud[0].exc_info[1])
    collector.error = None
    r = requests.get(_url(server), timeout=10)
    assert r.status_code == 200 and "probe_up 1.0" in r.text
    collector.error = RuntimeError("NVML: GPU is lost")     # again, after working: said again
    assert requests.get(_url(server), timeout=10).status_code == 500
    assert len([m for m in caplog.records if m.name == "stowage.metrics" and m.levelno >= logging.WARNING]) == 2


@pytest.mark.parametrize("method", ["HEAD", "POST", "PUT", "DELETE", "BREW"])
def test_other_methods_get_405_without_a_collection(served, method):
    server, collector = served
    r = requests.request(method, _url(server), timeout=10, data=b"x" * 100)
    assert r.status_code == 405 and collector.calls == 0


def test_odd_requests_get_an_error_or_are_dropped_and_scrapes_go_on(served):
    """Each of these gets a 4xx/5xx or is closed (a TLS hello is no HTTP request line: it waits for
    the end of a line and is closed at the timeout); none runs a collection."""
    server, collector = served
    odd = [b"GET " + b"a" * 70_000 + b" HTTP/1.0\r\n\r\n",              # request line over 64 KiB: 414
           b"GET /metrics HTTP/1.0\r\n" + b"X: y\r\n" * 200 + b"\r\n",  # too many headers: 431
           b"GET /metrics HTTP/9.9\r\n\r\n",                            # 505
           b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(64),   # a TLS ClientHello
           b"\x00\xff\r\n\r\n"]
    for request in odd:
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=30) as s:
            s.sendall(request)
            answer = _answer(s)
        code = re.search(rb"^HTTP/1\.[01] (\d{3}) |Error code: (\d{3})", answer)
        # an error (HTTP/0.9's have no status line), or closed
        assert answer == b"" or (code and int(code[1] or code[2]) >= 400), answer[:100]
    assert collector.calls == 0
    assert requests.get(_url(server), timeout=10).status_code == 200


# ------------------------------------------------------------------------------- the exporter


@pytest.fixture
def node(monkeypatch, tmp_path):
    yield from make_node(monkeypatch, tmp_path)


def test_prometheus_own_request_gets_valid_openmetrics_gzipped(node: GpuNode):
    """Prometheus asks for OpenMetrics first, gzipped: the exporter's series (with a pod whose names
    need escaping) must be valid OpenMetrics, not only the text format the other tests parse."""
    node.kubelet.add('ns"\\', 'pod\nname', "0f6c3b1e-8d2a-4c5e-9b7f-000000000001",
                     {"c": {"nvidia.com/gpu": [node.nvml.cards[0].uuid]}})
    r = requests.get(node.url, timeout=30, headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/openmetrics-text")
    assert r.headers["Content-Encoding"] == "gzip"   # requests unzips r.text; the header says it came zipped
    families = {f.name: f for f in openmetrics_families(r.text)}
    pods = [s.labels for s in families["stowage_pod_gpu_memory_used_bytes"].samples]
    assert [(p["namespace"], p["pod"]) for p in pods] == [('ns"\\', "pod\nname")]
    raw = requests.get(node.url, timeout=30, headers={"Accept-Encoding": "gzip"}, stream=True).raw.read()
    assert "stowage_gpu_memory_total_bytes" in gzip.decompress(raw).decode()


def test_nvml_that_stops_answering_is_a_series_not_a_500_and_the_next_scrape_reads_it_again(node: GpuNode):
    """An NVML error in a scrape is no failed scrape: the per-card series go and
    stowage_exporter_up{source="nvml"} says 0 (an alert can tell it from a dead exporter); the next
    scrape initialises NVML again and the cards are back."""
    assert len(node.scrape().samples("stowage_gpu_healthy")) == len(node.nvml.cards)
    node.nvml.count_error = pynvml.NVML_ERROR_GPU_IS_LOST
    s = node.scrape()
    assert s.up("nvml") == 0 and s.samples("stowage_gpu_memory_total_bytes") == []
    node.nvml.count_error = None
    s = Scrape(requests.get(node.url, timeout=30).text)
    assert s.up("nvml") == 1 and len(s.samples("stowage_gpu_memory_total_bytes")) == len(node.nvml.cards)
