"""The device-plugins directory vanishing, or our socket path unusable: quiet retries, then back.

Before: the watcher tried to serve again every 20 ms poll, and each try logged a warning plus an
exception with its traceback (194 records in 2 s, and gRPC's own error line each time). Now a
missing directory is logged once and waited for (a cheap stat per poll, so the plugin serves and
registers as soon as it is back); a socket that cannot be served for another reason is retried with
back-off, its error logged once.
"""
from __future__ import annotations

import logging
import os
import shutil
from typing import Any

from dp_harness import count_syncs, rig

from stowage.resources import RESOURCE_GPU


def _records(caplog: Any) -> list[logging.LogRecord]:
    return [x for x in caplog.records if x.name.startswith("stowage.deviceplugin") and x.levelno >= logging.INFO]


def test_a_vanished_plugin_dir_is_logged_once_and_served_again_when_back(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    with rig(monkeypatch) as r:
        assert r.registered()
        syncs = count_syncs(r.plugin)
        r.kubelet.stop()
        shutil.rmtree(r.dir)
        caplog.clear()
        start = syncs[0]
        assert r.kube.wait_for(lambda: syncs[0] >= start + 50)   # 50 polls with the directory gone
        recs = _records(caplog)
        assert not any(x.exc_info for x in recs), [x.getMessage() for x in recs]
        assert len(recs) == 1 and "directory" in recs[0].getMessage() and r.dir in recs[0].getMessage(), \
            [x.getMessage() for x in recs]
        caplog.clear()
        os.makedirs(r.dir)
        r.kubelet.start()
        assert r.registered()
        assert len(r.kubelet.devices(RESOURCE_GPU)) == 4
        msgs = [x.getMessage() for x in _records(caplog)]
        assert sum("is back" in m for m in msgs) == 1, msgs
        assert not any(x.exc_info for x in _records(caplog))


def test_a_socket_that_cannot_be_served_is_retried_with_back_off(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    with rig(monkeypatch, serve_retry_first_s=60.0, serve_retry_max_s=60.0) as r:
        assert r.registered()
        ep = next(e for e in r.plugin.endpoints if e.resource == RESOURCE_GPU)
        tries = [0]
        real = ep.serve

        def serve() -> None:
            tries[0] += 1
            real()
        monkeypatch.setattr(ep, "serve", serve)
        syncs = count_syncs(r.plugin)
        os.unlink(ep.path)
        os.mkdir(ep.path)          # something in the way: unlinking it fails, so does binding
        start = syncs[0]
        assert r.kube.wait_for(lambda: syncs[0] >= start + 50)
        assert tries[0] == 1       # the next try is 60 s away
        loud = [x for x in _records(caplog) if x.levelno >= logging.WARNING]
        assert not any(x.exc_info for x in loud)
        assert sum(ep.path in x.getMessage() for x in loud) == 2, [x.getMessage() for x in loud]  # gone; cannot serve
        # the other resources are untouched
        assert all(e.socket_intact() for e in r.plugin.endpoints if e is not ep)


def test_a_socket_path_blocked_at_start_is_retried_like_one_blocked_later(monkeypatch, caplog):
    """Before: a directory in the way of one resource's socket when the plugin started ended the
    start with IsADirectoryError and a traceback, though the same thing later is retried quietly,
    and the other resources could have been served. Now the start goes on and the path is retried."""
    from deviceplugin.server import socket_name
    caplog.set_level(logging.INFO)
    blocked: list[str] = []

    def block(plugin_dir: str) -> None:
        blocked.append(os.path.join(plugin_dir, socket_name(RESOURCE_GPU)))
        os.makedirs(blocked[0])
    with rig(monkeypatch, before_start=block, serve_retry_first_s=0.2, serve_retry_max_s=0.2) as r:
        others = set(r.plugin.cfg.resources) - {RESOURCE_GPU}
        assert r.kubelet.wait_for(lambda: set(r.kubelet.plugins) == others)
        loud = [x for x in _records(caplog) if x.levelno >= logging.WARNING and blocked[0] in x.getMessage()]
        assert loud and not any(x.exc_info for x in loud), [x.getMessage() for x in loud]
        os.rmdir(blocked[0])
        assert r.registered()
        assert len(r.kubelet.devices(RESOURCE_GPU)) == 4
