"""`stowage extender` with watch-like model churn inside its worker: pods bound and deleted at a set rate.

Run as ``python -m benchmarks.latency.churn --rate 300 --stats FILE -- <stowage extender args>``.
It runs the very same ``stowage extender`` command (same click entry, same gunicorn setup); the
only difference is that the worker, once its app is built, also starts a thread that feeds pod
events through the Kubernetes feeder's own event handler (``KubeFeeder._apply_pod``): a pod
bound elsewhere (its allocation annotation and ``spec.nodeName`` set) and, later, the same pod
deleted. That is exactly what the model sees from the pod watch in production, so it shows
whether 300 updates a second stall filter/prioritize/bind (they share the model lock).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import threading
import time
from collections import deque
from typing import Any

from benchmarks.cliargs import HelpFormatter, positive_number
from stowage.allocation import ALLOCATION_ANNOTATION, AllocationRecord, CardShare, encode_allocation
from stowage.resources import DEFAULT_MEMORY_UNIT_MIB


def _pod(j: int, node: str, card: int, uuid: str, mem_mib: int, core_milli: int) -> dict[str, Any]:
    """A running pod with the slice it asks for booked on ``card`` of ``node``. Its request must be
    what the record books (``mem_mib`` in whole units of DEFAULT_MEMORY_UNIT_MIB, ``core_milli`` in
    tenths of a percent): the feeder refuses a record that does not match its pod's request, and
    the event would then change no card."""
    assert mem_mib % DEFAULT_MEMORY_UNIT_MIB == 0 and core_milli % 10 == 0
    rec = AllocationRecord(node=node, whole=False,
                           cards=(CardShare(index=card, uuid=uuid, memory_mib=mem_mib, core_milli=core_milli),))
    limits = {"nvidia.com/gpu-memory": str(mem_mib // DEFAULT_MEMORY_UNIT_MIB),
              "nvidia.com/gpu-core": str(core_milli // 10)}
    return {"metadata": {"name": f"churn-{j}", "namespace": "churn", "uid": f"churn-uid-{j}",
                         "annotations": {ALLOCATION_ANNOTATION: encode_allocation(rec)}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"}}


class Churn:
    """Alternates 'pod bound' and 'pod deleted' events at ``rate`` per second, keeping ~``pool`` pods."""

    def __init__(self, model, rate: float, stats_path: str, pool: int = 500, seed: int = 1) -> None:
        import kubernetes.client

        from extender.kube import KubeFeeder
        self.model = model
        self.feeder = KubeFeeder(model, kubernetes.client.ApiClient())  # never started: no API calls
        self.rate = rate
        self.stats_path = stats_path
        self.pool = pool
        self.rng = random.Random(seed)
        self.live: deque[dict[str, Any]] = deque()
        self.events = 0
        self.stop = threading.Event()

    def _bind_one(self, j: int) -> None:
        with self.model.lock:
            names = self.model.node_names()
            node = self.rng.choice(names)
            i = self.model.index[node]
            a = self.model.a
            room = [k for k in range(a.shape[1]) if a.exists[i, k] and a.mem_free[i, k] >= 2048
                    and a.core_free[i, k] >= 100]
            if not room:
                return
            k = self.rng.choice(room)
            uuid = self.model.card_uuid(node, k)
        pod = _pod(j, node, k, uuid, 2048, 100)
        self.feeder._apply_pod(pod)
        self.live.append(pod)

    def run(self) -> None:
        period = 1.0 / self.rate
        next_t = time.monotonic()
        last_write = 0.0
        j = 0
        while not self.stop.is_set():
            if len(self.live) >= self.pool or (self.live and j % 2):
                self.feeder._apply_pod(self.live.popleft(), deleted=True)
            else:
                self._bind_one(j)
            j += 1
            self.events += 1
            now = time.monotonic()
            if now - last_write > 0.2:
                self._write()
                last_write = now
            next_t += period
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -1.0:          # fell behind by a second: do not try to catch up in a burst
                next_t = time.monotonic()

    def _write(self) -> None:
        tmp = self.stats_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"events": self.events, "time": time.monotonic(), "pid": os.getpid()}, f)
        os.replace(tmp, self.stats_path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.latency.churn", formatter_class=HelpFormatter,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=positive_number, default=300.0, help="pod events per second (binds and deletes)")
    p.add_argument("--stats", required=True, help="file the churn thread writes its event count to")
    p.add_argument("extender_args", nargs=argparse.REMAINDER, help="-- then the `stowage extender` arguments")
    args = p.parse_args(argv)
    rest = args.extender_args[1:] if args.extender_args[:1] == ["--"] else args.extender_args

    from extender import cli

    def factory(cfg):
        app = cli.build_app(cfg)
        churn = Churn(app.extensions["stowage"]["service"].model, args.rate, args.stats)
        threading.Thread(target=churn.run, name="churn", daemon=True).start()
        return app

    cli.run_server = functools.partial(cli.run_server, factory=factory)
    cli.serve.main(rest, prog_name="stowage extender")


if __name__ == "__main__":
    main()
