"""Helpers for the extender tests: small models, the real app served over real HTTP."""
from __future__ import annotations

import contextlib
import gc
import socket

import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable, Iterable

import requests
from werkzeug.serving import make_server

from extender.app import create_app
from extender.relay import RelayClient, RelayServer
from extender.split import flask_other
from packing.model import ClusterModel
from extender.service import ExtenderService
from extender.simcluster import parse_cluster
from stowage.resources import GpuRequest


def model_from(doc: dict[str, Any]) -> ClusterModel:
    """A model holding the nodes of a simulated-cluster document (same format as the YAML)."""
    model = ClusterModel()
    parse_cluster(doc, "test").populate(model)
    return model


def start_process(cluster_arg: str | None, log_dir: str, *extra_args: str, threads: int = 4):
    """`stowage extender` as a real process (gunicorn), ready to answer; (process, session).
    Stopped again if it never gets ready."""
    from extender.demo import ExtenderProcess

    proc = ExtenderProcess(cluster_arg, threads=threads, extra_args=tuple(extra_args), log_dir=log_dir)
    http = requests.Session()
    workers = int(extra_args[extra_args.index("--workers") + 1]) if "--workers" in extra_args else 1
    try:
        proc.wait_ready(http, timeout=60)
        # Ready means one worker answers; wait for the others too. A worker still booting when
        # SIGTERM comes has not installed its handlers yet, so gunicorn waits its whole
        # graceful_timeout for it: a test stopping the server that fast would see a SIGKILL.
        deadline = time.monotonic() + 30
        while Path(proc.log.name).read_text().count("Booting worker") < workers:
            if time.monotonic() > deadline:
                raise AssertionError(f"only some of {workers} workers booted:\n{proc.log_tail()}")
            time.sleep(0.02)
    except BaseException:
        http.close()
        proc.stop()
        raise
    return proc, http


def gpus(model: str, count: int, memory: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "count": count, "memory": memory, **extra}


def take_whole(model: ClusterModel, node: str, cards: list[int], uid: str) -> None:
    model.assign(uid, f"default/{uid}", node, cards, GpuRequest(gpus=len(cards)), check=True)


def take_shared(model: ClusterModel, node: str, card: int, mem_mib: int, uid: str, core_milli: int = 0) -> None:
    model.assign(uid, f"default/{uid}", node, [card], GpuRequest(mem_mib=mem_mib, core_milli=core_milli), check=True)


class Server:
    """The real Flask app on a werkzeug server in a thread, on a free loopback port."""

    def __init__(self, service: ExtenderService, **app_kwargs: Any) -> None:
        self.service = service
        self.app = create_app(service, **app_kwargs)
        self.httpd = make_server("127.0.0.1", 0, self.app, threaded=True)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()
        self.http = requests.Session()

    def post(self, path: str, body: Any = None, *, data: bytes | str | None = None, **kw: Any) -> requests.Response:
        if data is None:
            return self.http.post(self.url + path, json=body, timeout=30, **kw)
        return self.http.post(self.url + path, data=data, timeout=30, **kw)

    def get(self, path: str) -> requests.Response:
        return self.http.get(self.url + path, timeout=30)

    def close(self) -> None:
        self.http.close()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# The simple kube-scheduler-like placers, so tests that assert a ranking do not depend on which
# policy module currently serves "pack" (see packing.registry.POLICY_PLACER).
SIMPLE_PLACERS = {"pack": "most-allocated", "spread": "least-allocated"}


def simple_placers(policy_value: str):
    from packing.registry import get_placer
    return get_placer(SIMPLE_PLACERS[policy_value])


def stop_with_clients(proc: Any, http: requests.Session, clients: Iterable[socket.socket] = ()) -> None:
    """Close the raw client sockets a test opened, then its session and the extender."""
    for s in clients:
        s.close()
    http.close()
    proc.stop()


def timed_post(url: str, data: bytes, timeout: float = 60) -> tuple[requests.Response, float]:
    """POST ``data`` on a new connection: (the answer, seconds it took), for tests that bound
    how long a client such as kube-scheduler waits while others misbehave."""
    t0 = time.monotonic()
    r = requests.post(url, data=data, timeout=timeout)
    return r, time.monotonic() - t0


def bytes_kept(feed: Callable[[Any], Any], items: Iterable[Any]) -> int:
    """Bytes still allocated (tracemalloc) after ``feed`` of each item and a collection: what
    feeding them made stay (what ``feed`` returns is dropped)."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for item in items:
            feed(item)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


@contextlib.contextmanager
def relay_to(app, tmp_path: Path, pool_threads: int = 4):
    """A RelayServer on a real unix socket (``tmp_path / "relay.sock"``) serving ``app``'s verbs
    and routes (binds and other requests on ``pool_threads`` threads), and a client."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = str(tmp_path / "relay.sock")
    listener.bind(path)
    listener.listen(8)
    server = RelayServer(listener, app.extensions["stowage"]["verbs"], flask_other(app), pool_threads=pool_threads)
    server.start()
    client = RelayClient(path, timeout=10)
    try:
        yield server, client
    finally:
        client.drop()
        server.stop()
