"""The split serving layout: N gunicorn workers for the HTTP, ONE decision process for the model.

Why: with one process, the extender's throughput is bounded by one GIL doing both gunicorn's
HTTP handling and the decisions (docs/latency.md: ~1/(CPU per pod)). The decisions must stay in
one process: one model of the cards, and bind's "re-check, then reserve" atomic, so two binds
can never hand out the same card. The HTTP need not: here it runs in ``workers`` gunicorn
worker processes (:mod:`extender.frontend`) that pass each request to the decision process over
a unix socket (:mod:`extender.relay`) — the same model, the same code, the same answers, while
the HTTP work of several requests proceeds on several cores.

The process tree (what ``stowage extender --workers N`` runs)::

    stowage extender (gunicorn master, the pod's main process: signals, worker restarts)
    ├── decision process   forked first, before any thread exists; builds the model, runs the
    │                      Kubernetes watch, the binder, /metrics on --metrics-bind
    └── N gunicorn workers HTTP only; stateless (a restarted worker loses nothing)

Lifecycle: the master stops the decision process when it exits (SIGTERM, then SIGKILL after
10 s); the decision process exits when the master is gone; and if the decision process dies,
the master shuts down with exit status 1 (the model is gone, so the pod must restart — the
same outcome as the one-process layout's worker dying, where gunicorn would restart it and it
would rebuild the model from the API server).
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
from typing import Any, Callable

from flask import Flask

from . import gunicorn_conf
from .frontend import create_frontend
from .gunicorn_conf import ExtenderServer, gunicorn_options
from .intake import BigBodyLane
from .relay import OtherFn, RelayServer
from .verbs import Reply

log = logging.getLogger("stowage.extender")

STOP_GRACE_S = 10.0
# Process names (Linux's comm, what ps, top and /proc show) of the layout's two kinds of process,
# so that an operator — and the burst benchmark, which reports each one's CPU — tells them apart:
# all of them run the same command line.
DECIDER_NAME = "stowage-decide"
HTTP_WORKER_NAME = "stowage-http"


def name_process(name: str) -> None:
    """Set this process's name as ``ps -o comm`` shows it (at most 15 bytes); nothing where
    /proc is not Linux's. Only the name changes: the command line stays the one started."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass


def flask_other(app: Flask) -> OtherFn:
    """Requests other than the verbs (/state, /readyz, /metrics, ...) answered by the Flask
    app itself, through WSGI: the same routes and error handling as the one-process layout."""
    from werkzeug.test import EnvironBuilder, run_wsgi_app

    def other(method: str, target: str, body: bytes) -> Reply:
        path, _, query = target.partition("?")
        builder = EnvironBuilder(path=path, method=method, query_string=query, data=body or None,
                                 content_type="application/json" if body else None)
        try:
            env = builder.get_environ()
        finally:
            builder.close()
        app_iter, status, headers = run_wsgi_app(app, env, buffered=True)
        try:
            data = b"".join(app_iter)
        finally:
            getattr(app_iter, "close", lambda: None)()
        return Reply(int(status.split(" ", 1)[0]), data, content_type=headers.get("Content-Type", "application/json"))

    return other


def _decider_main(app_factory: Callable[[], Flask], listener: socket.socket, master: int) -> None:
    """The decision process: build the app (model, feeder), serve frames until told to stop."""
    code = 1
    name_process(DECIDER_NAME)
    try:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        app = app_factory()
        ext = app.extensions["stowage"]
        server = RelayServer(listener, ext["verbs"], flask_other(app))
        server.start()
        log.info("decision process %d serving the model to the HTTP workers", os.getpid())
        while not stop.wait(1.0):
            if os.getppid() != master:
                log.error("decision process: the extender's master process is gone; exiting")
                break
        server.stop()
        gunicorn_conf.run_exit_callbacks()
        code = 0
    except BaseException:  # noqa: BLE001 - whatever it was, say so and exit non-zero
        log.exception("decision process failed")
    finally:
        logging.shutdown()
        os._exit(code)


def run_split(app_factory: Callable[[], Flask], *, bind: str, workers: int, threads: int, log_level: str,
              url_prefix: str, max_body_bytes: int, **extra: Any) -> None:
    """Run the split layout in this process (it becomes the gunicorn master) until SIGTERM/SIGINT.

    ``app_factory`` is called once, in the decision process, after the fork.
    """
    sock_dir = tempfile.mkdtemp(prefix="stowage-decider-")
    path = os.path.join(sock_dir, "decider.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1024)
    gone_r, gone_w = os.pipe()  # the decision process holds the write end: EOF = it is gone
    master = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(gone_r)
        if bind.startswith("fd://") and bind[5:].isdigit():
            # A listening socket handed over by the caller is the HTTP workers' business: the
            # decision process must not keep the port open should the master die.
            try:
                os.close(int(bind[5:]))
            except OSError:
                pass
        _decider_main(app_factory, listener, master)  # never returns
    os.close(gone_w)
    listener.close()

    died = threading.Event()      # the decision process exited on its own
    gone = threading.Event()      # ... or at all
    stopping = threading.Event()  # the master is shutting down (so an exit is expected)

    def watch() -> None:
        os.read(gone_r, 1)  # blocks until the decision process's end of the pipe closes
        gone.set()
        if not stopping.is_set():
            log.error("the decision process (pid %d) exited: stopping the extender", pid)
            died.set()
            os.kill(master, signal.SIGTERM)

    def when_ready(arbiter: Any) -> None:
        threading.Thread(target=watch, name="decider-watch", daemon=True).start()
        log.info("split layout: %d HTTP workers, decision process %d", workers, pid)

    def on_exit(arbiter: Any) -> None:
        stopping.set()
        try:
            os.kill(pid, signal.SIGTERM)
            if not gone.wait(STOP_GRACE_S):
                log.warning("the decision process did not stop in %.0f s: killing it", STOP_GRACE_S)
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(sock_dir, ignore_errors=True)

    options = gunicorn_options(bind=bind, threads=threads, log_level=log_level, workers=workers, **extra)
    options.update(when_ready=when_ready, on_exit=on_exit,
                   post_fork=lambda _arbiter, _worker: name_process(HTTP_WORKER_NAME))
    lane = BigBodyLane()  # made before the workers fork: one lane for all of them
    try:
        ExtenderServer(lambda: create_frontend(path, url_prefix=url_prefix, max_body_bytes=max_body_bytes,
                                               lane=lane), options).run()
    except SystemExit as exc:
        if died.is_set() and not exc.code:
            raise SystemExit(1) from None
        raise
    if died.is_set():
        raise SystemExit(1)
