"""Running the extender under gunicorn, programmatically: ONE worker process, many threads
(the one-process layout; :mod:`extender.split` runs several HTTP-only workers in front of one
decision process instead, for the same reason given here).

Why exactly one worker process: the extender's decisions are only safe if every filter,
prioritize and bind sees the same model of the cards, and bind's "re-check, then reserve" is
atomic. The model lives in the worker's memory. Two worker processes would each hold their own
copy, fed independently: a bind in worker A would not be seen by worker B, and both could hand
out the same card (double-booking). Threads share the one model and serialise on its lock, so
the ``gthread`` worker gives concurrency for I/O (the binder's API calls, slow clients) without
a second copy of the state. The scoring work is numpy, which releases the GIL in its loops.

Why gunicorn at all (not Flask's dev server): robust HTTP/1.1 keep-alive (kube-scheduler reuses
connections), request/worker timeouts, graceful shutdown on SIGTERM, and a master that restarts
a crashed worker (which then rebuilds the model from the API server).

The app is built in the worker (``load()`` runs after fork), so the Kubernetes watch threads
start in the process that serves the requests.
"""
from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from typing import Any, Callable

from flask import Flask
from gunicorn.app.base import BaseApplication

from .intake import WORKER_CLASS, WORKER_CONNECTIONS, check_gunicorn

log = logging.getLogger("stowage.extender")

# Called (no arguments) when the worker exits, e.g. to stop the Kubernetes watch threads.
_on_exit: list[Callable[[], None]] = []


def register_exit(fn: Callable[[], None]) -> None:
    """Run ``fn`` when the gunicorn worker exits."""
    _on_exit.append(fn)


def run_exit_callbacks() -> None:
    """Run (once) what :func:`register_exit` registered, e.g. when the decision process stops."""
    while _on_exit:
        fn = _on_exit.pop()
        try:
            fn()
        except Exception:  # shutting down: log and carry on
            log.exception("error while stopping the extender")


def _worker_exit(server: Any, worker: Any) -> None:
    run_exit_callbacks()


@dataclass(frozen=True)
class TLSFiles:
    """HTTPS with client-certificate verification: the server's certificate and key, and the CA
    whose client certificates are the only ones accepted (kube-scheduler's extender
    ``tlsConfig.certFile``/``keyFile`` are signed by it). The files are read on every new
    connection, so a rotated certificate takes effect without a restart."""

    cert: str
    key: str
    client_ca: str


def tls_options(tls: TLSFiles | None) -> dict[str, Any]:
    """gunicorn's settings for ``tls``: a client without a certificate signed by the client CA
    fails the TLS handshake, before any byte of HTTP is read (no route, /state included, is
    reachable without one)."""
    if tls is None:
        return {}
    return {"certfile": tls.cert, "keyfile": tls.key, "ca_certs": tls.client_ca, "cert_reqs": ssl.CERT_REQUIRED}


def gunicorn_options(bind: str, threads: int, log_level: str, timeout: int = 60,
                     keepalive: int = 75, workers: int = 1, tls: TLSFiles | None = None) -> dict[str, Any]:
    """The gunicorn settings Stowage runs with (see the module docstring for ``workers: 1``;
    more workers only in the split layout, where the workers hold no state).

    ``keepalive`` exceeds kube-scheduler's idle connection reuse so its connections are not
    cut under it; ``timeout`` is how long the worker's event loop may go without a heartbeat (a
    request stuck in its thread does not stop it); ``tls``: HTTPS that only accepts clients with
    a certificate from the client CA.
    """
    return {**tls_options(tls),
        "bind": bind,
        "workers": max(1, workers),
        # gthread with a deadline on every read of a connection (extender.intake): a client that
        # stops half-way through its request cannot hold a thread for longer than that.
        "worker_class": WORKER_CLASS,
        "worker_connections": WORKER_CONNECTIONS,
        "threads": max(1, threads),
        "timeout": timeout,
        "graceful_timeout": 10,
        "keepalive": keepalive,
        "loglevel": log_level,
        "accesslog": None,
        "errorlog": "-",
        "preload_app": False,
        "worker_exit": _worker_exit,
        "proc_name": "stowage-extender",
        # gunicorn >= 25 opens a control socket at a fixed per-user path by default; two
        # extenders (or an extender and the demo's) would fight over it. We do not use it.
        "control_socket_disable": True,
        # The worker's heartbeat is a utime() on a temp file on every loop turn, i.e. on every
        # request: on a disk-backed /tmp (a container's overlay) that was ~10 % of the worker's
        # busy time under load (py-spy). gunicorn's own advice is a tmpfs such as /dev/shm.
        "worker_tmp_dir": heartbeat_dir(),
    }


def heartbeat_dir() -> str | None:
    """/dev/shm when it is a writable directory (it is in containers and on Linux), else
    gunicorn's default (the system temp dir)."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


class ExtenderServer(BaseApplication):
    """A gunicorn application whose WSGI app comes from ``app_factory`` (called in the worker)."""

    def __init__(self, app_factory: Callable[[], Flask], options: dict[str, Any]) -> None:
        check_gunicorn()   # before anything is served: an older gunicorn fails inside the worker
        self.app_factory = app_factory
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self) -> Flask:
        return self.app_factory()
