"""`stowage demo`: the extender under gunicorn on the embedded cluster, driven like kube-scheduler.

What it does, and why this way: it starts the real server (`stowage extender --simulated`) as a
separate process, so what is shown is exactly what a kube-scheduler would get over HTTP. The
listening socket is bound here (port 0: a free loopback port, no race) and handed to gunicorn
as ``fd://N``. Then, pod after pod, it sends the bodies kube-scheduler sends
(``nodeCacheCapable: true`` shape by default, full ``v1.Node`` objects with ``--full-nodes``):
filter (which answers only the nodes Stowage ranks best, as the shipped scheduler config uses
it: no prioritize call), then bind to one of them at random (kube-scheduler's own scores would
choose among them), retrying once on a bind error as the scheduler would.
"""
from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import requests
from tqdm import tqdm

from stowage.bounded import WholeRange
from stowage.finite import seconds
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY, fmt_cards, fmt_mib

from .simcluster import BUILTIN, SimCluster, SimClusterError, describe, load_cluster, node_objects

NAMESPACE = "demo"


# ------------------------------------------------------------------------------------ workload
@dataclass
class DemoPod:
    obj: dict[str, Any]
    what: str  # human description of the request

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    @property
    def uid(self) -> str:
        return self.obj["metadata"]["uid"]


def _pod(rng: random.Random, name: str, limits: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    """A pod shaped like those kube-scheduler sends (requests defaulted from limits)."""
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                     "annotations": dict(annotations)},
        "spec": {"containers": [{"name": "main", "image": "busybox",
                                 "resources": {"limits": dict(limits), "requests": dict(limits)}}],
                 "restartPolicy": "Always", "schedulerName": "default-scheduler"},
        "status": {"phase": "Pending"},
    }


def make_workload(n: int, seed: int) -> list[DemoPod]:
    """A realistic mix: ~55% shared-card pods (inference, notebooks), ~45% whole-GPU pods
    (training), some pinned to a GPU model or a card size, a few spread, one with a typo."""
    rng = random.Random(seed)
    pods: list[DemoPod] = []
    for j in range(n):
        ann: dict[str, str] = {}
        notes: list[str] = []
        if j == n // 2 and n >= 10:  # a user error: shown as a clear per-pod reason
            ann["stowage.io/node-policy"] = "tightest"
            notes.append("typo in node-policy")
        if rng.random() < 0.55:
            mem = rng.choice([2, 4, 4, 8, 8, 10, 12, 16, 16, 20, 24, 40])
            limits = {RESOURCE_GPU_MEMORY: str(mem)}
            what = f"{mem} GiB"
            if rng.random() < 0.4:
                core = rng.choice([10, 20, 25, 30, 50])
                limits[RESOURCE_GPU_CORE] = str(core)
                what += f" + {core}% compute"
            what += " of one GPU"
            kind = "infer"
        else:
            g = rng.choices([1, 2, 4, 8], weights=[55, 25, 14, 6])[0]
            limits = {RESOURCE_GPU: str(g)}
            what = f"{g} whole GPU{'s' if g > 1 else ''}"
            kind = "train"
            r = rng.random()
            if r < 0.10:
                ann["stowage.io/gpu-model"] = rng.choice(["A100", "H100", "A10", "L4"])
                notes.append(f"model {ann['stowage.io/gpu-model']}")
            elif r < 0.20:
                ann["stowage.io/min-card-memory"] = "80Gi"
                notes.append(">= 80 GiB cards")
            elif r < 0.25:
                ann["stowage.io/gpu-model-exclude"] = "T4"
                notes.append("no T4")
        if rng.random() < 0.05:
            ann["stowage.io/node-policy"] = "spread"
            notes.append("spread")
        if notes:
            what += f" [{', '.join(notes)}]"
        pods.append(DemoPod(_pod(rng, f"{kind}-{j:03d}", limits, ann), what))
    return pods


# -------------------------------------------------------------------------------------- server
class ExtenderProcess:
    """`stowage extender --simulated ...` in a child process on a socket bound here."""

    def __init__(self, cluster_arg: str | None, threads: int = 4, extra_args: tuple[str, ...] = (),
                 log_dir: str | None = None) -> None:
        """``cluster_arg``: the --simulated value; None when ``extra_args`` name another source.
        The server's log goes to a file in ``log_dir`` (default: the temp dir), kept for people."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # gunicorn sets TCP_NODELAY on sockets it creates, not on one handed over as fd://.
        # Without it, Nagle + delayed ACK add ~40 ms to every request.
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.log = tempfile.NamedTemporaryFile(prefix="stowage-extender-", suffix=".log", delete=False,
                                               dir=log_dir)
        fd = self.sock.fileno()
        source = ["--simulated", cluster_arg] if cluster_arg is not None else []
        cmd = [sys.executable, "-m", "extender.cli", *source, "--bind", f"fd://{fd}",
               "--threads", str(threads), "--log-level", "info", *extra_args]
        self.proc = subprocess.Popen(cmd, pass_fds=(fd,), stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    def wait_ready(self, http: requests.Session, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise click.ClickException(f"the extender exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = http.get(self.url + "/readyz", timeout=2)
                if r.status_code == 200:
                    return r.json().get("message", "")
                last = r.text
            except requests.RequestException as exc:
                last = str(exc)
            time.sleep(0.1)
        raise click.ClickException(f"the extender was not ready after {timeout:g}s ({last}):\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(Path(self.log.name).read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (gunicorn's graceful stop), then SIGKILL if it does not go."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.sock.close()
        self.log.close()
        return self.proc.returncode


# ------------------------------------------------------------------------------------ scheduler
@dataclass
class Outcome:
    pod: DemoPod
    node: str = ""
    cards: list[int] = field(default_factory=list)
    why: str = ""  # empty when placed
    retries: int = 0


class FakeScheduler:
    """Drives the extender with kube-scheduler's protocol (one pod at a time, like its queue)."""

    def __init__(self, url: str, http: requests.Session, names: list[str], node_objs: list[dict] | None,
                 rng: random.Random) -> None:
        self.url, self.http, self.names, self.node_objs, self.rng = url, http, names, node_objs, rng
        self.requests = 0

    def _post(self, verb: str, body: dict) -> requests.Response:
        self.requests += 1
        return self.http.post(f"{self.url}/{verb}", json=body, timeout=30)

    def _args(self, pod: dict) -> dict:
        if self.node_objs is None:
            return {"Pod": pod, "Nodes": None, "NodeNames": self.names}
        return {"Pod": pod, "Nodes": {"metadata": {}, "items": self.node_objs}, "NodeNames": None}

    def schedule(self, p: DemoPod) -> Outcome:
        out = Outcome(p)
        for attempt in range(2):  # a bind error is retried (the scheduler does so within seconds)
            out.retries = attempt
            r = self._post("filter", self._args(p.obj))
            ans = r.json()
            if r.status_code != 200 or ans.get("Error"):
                out.why = f"filter error: {ans.get('Error') or r.status_code}"
                return out
            if self.node_objs is None:
                feasible = ans.get("NodeNames") or []
            else:
                feasible = [n["metadata"]["name"] for n in (ans.get("Nodes") or {}).get("items") or []]
            if not feasible:
                out.why = summarize_failures(len(self.names), ans)
                return out
            # equal to Stowage; kube-scheduler's own scores would choose, the demo draws one
            node = self.rng.choice(feasible) if len(feasible) > 1 else feasible[0]
            bind = self._post("bind", {"PodName": p.name, "PodNamespace": NAMESPACE, "PodUID": p.uid, "Node": node})
            err = bind.json().get("Error", "")
            if not err:
                al = self.http.get(f"{self.url}/allocations/{p.uid}", timeout=30).json()
                out.node, out.cards, out.why = node, al.get("cards", []), ""
                return out
            out.why = f"bind error: {err}"
        return out


def summarize_failures(total: int, ans: dict) -> str:
    """kube-scheduler's FailedScheduling style: '0/36 nodes are available: 20 <reason>, ...'."""
    reasons = Counter(list((ans.get("FailedNodes") or {}).values())
                      + list((ans.get("FailedAndUnresolvableNodes") or {}).values()))
    top = reasons.most_common(3)
    parts = [f"{c} {r}" for r, c in top]
    more = len(reasons) - len(top)
    if more > 0:
        rest = sum(reasons.values()) - sum(c for _, c in top)
        parts.append(f"{rest} for {more} other reason{'s' if more != 1 else ''}")
    return f"0/{total} nodes are available: " + ", ".join(parts)


# -------------------------------------------------------------------------------------- report
SHADES = " ▁▂▃▄▅▆▇█"


def card_cell(c: dict) -> str:
    """One character per card: W whole-GPU pod, a block as tall as the shared memory in use,
    · free, x unhealthy."""
    if not c["healthy"]:
        return "x"
    if c["pods"] == 0:
        return "·"
    if c["freeMemoryMiB"] == 0 and c["freeCoreMilli"] == 0:
        return "W"
    used = max(1 - c["freeMemoryMiB"] / max(c["memoryMiB"], 1), 1 - c["freeCoreMilli"] / 1000)
    return SHADES[max(1, min(8, round(used * 8)))]


def card_used(c: dict) -> float:
    """Card-equivalents in use (the larger of memory and compute shares)."""
    if not c["healthy"] or c["pods"] == 0:
        return 0.0
    return max(1 - c["freeMemoryMiB"] / max(c["memoryMiB"], 1), 1 - c["freeCoreMilli"] / 1000)


def short_model(model: str) -> str:
    for p in ("NVIDIA ", "Tesla "):
        if model.startswith(p):
            model = model[len(p):]
    return model


def node_table(state: dict) -> list[str]:
    rows = [f"{'node':<14} {'model':<20} {'cards':>5} {'whole':>5} {'shared':>6} {'free':>4} {'mem used':>9}  cards"]
    for n in state["nodes"]:
        cards = n["cards"]
        if not cards:
            continue
        whole = sum(1 for c in cards if card_cell(c) == "W")
        free = sum(1 for c in cards if c["healthy"] and c["pods"] == 0)
        shared = sum(1 for c in cards if c["pods"] > 0) - whole
        tot = sum(c["memoryMiB"] for c in cards if c["healthy"])
        used = sum(c["memoryMiB"] - c["freeMemoryMiB"] for c in cards if c["healthy"])
        pct = f"{100 * used / tot:.0f}%" if tot else "-"
        rows.append(f"{n['name']:<14} {short_model(cards[0]['model']):<20} {len(cards):>5} {whole:>5} {shared:>6} "
                    f"{free:>4} {pct:>9}  [{''.join(card_cell(c) for c in cards)}]")
    return rows


def summary(state: dict, outcomes: list[Outcome], elapsed: float, requests_sent: int) -> list[str]:
    cards = [c for n in state["nodes"] for c in n["cards"]]
    healthy = [c for c in cards if c["healthy"]]
    in_use = sum(card_used(c) for c in healthy)
    free_whole = sum(1 for c in healthy if c["pods"] == 0)
    empty = sum(1 for n in state["nodes"] if n["cards"] and all(c["pods"] == 0 for c in n["cards"]))
    placed = [o for o in outcomes if not o.why]
    whole = [o for o in outcomes if o.pod.obj["spec"]["containers"][0]["resources"]["limits"].get(RESOURCE_GPU)]
    whole_placed = sum(1 for o in whole if not o.why)
    shared_n = len(outcomes) - len(whole)
    mem_tot = sum(c["memoryMiB"] for c in healthy)
    mem_used = sum(c["memoryMiB"] - c["freeMemoryMiB"] for c in healthy)
    return [
        f"pods placed        {len(placed)}/{len(outcomes)}  (whole-GPU {whole_placed}/{len(whole)}, "
        f"shared {len(placed) - whole_placed}/{shared_n}); retried after a bind error: "
        f"{sum(1 for o in outcomes if o.retries)}",
        f"GPUs allocated     {100 * in_use / max(len(healthy), 1):.1f}% of {len(healthy)} healthy cards "
        f"({in_use:.1f} card-equivalents; GPU memory {fmt_mib(mem_used)} of {fmt_mib(mem_tot)})",
        f"whole free cards   {free_whole}",
        f"nodes empty        {empty}/{sum(1 for n in state['nodes'] if n['cards'])}",
        f"time               {elapsed:.1f}s, {requests_sent} HTTP requests to the extender",
    ]


# ----------------------------------------------------------------------------------------- CLI
@click.command("demo")
@click.option("--cluster", "--simulated", "cluster_file", metavar="FILE", default=None, is_flag=False,
              flag_value=BUILTIN,
              help="Simulated cluster YAML, or builtin (default, and a bare --simulated: the built-in cluster of 36 "
                   "mixed GPU nodes). --simulated is the name the extender, inspect and plan give it.")
@click.option("--pods", type=WholeRange(1, 100_000), default=150, show_default=True, help="Pods to schedule.")
@click.option("--seed", type=int, default=7, show_default=True, help="Seed of the workload mix.")
@click.option("--full-nodes", is_flag=True,
              help="Send full v1.Node objects (nodeCacheCapable: false) instead of node names.")
@click.option("--threads", type=WholeRange(1, 64), default=4, show_default=True,
              help="Request threads of the extender's worker.")
@click.option("--quiet", is_flag=True,
              help="Do not print one line per pod (a terminal still shows a progress bar on standard error).")
@click.option("--startup-timeout", type=seconds(1), default=60.0, show_default=True,
              help="Seconds to wait for the extender to answer /readyz.")
def demo(cluster_file: str | None, pods: int, seed: int, full_nodes: bool, threads: int, quiet: bool,
         startup_timeout: float) -> None:
    """Start the extender on the embedded cluster and schedule a mix of GPU pods through it.

    Speaks to the extender over HTTP exactly as kube-scheduler does with the shipped config
    (filter, which answers only the best nodes, then bind), prints where each pod went (node and cards) or why not, how
    full every node and card is, and a summary.
    """
    try:
        cluster: SimCluster = load_cluster(cluster_file)
    except SimClusterError as exc:
        raise click.ClickException(str(exc)) from None
    cluster_arg = BUILTIN if cluster_file in (None, BUILTIN) else str(Path(cluster_file).resolve())
    workload = make_workload(pods, seed)
    click.echo(f"Cluster: {describe(cluster)}")
    server = ExtenderProcess(cluster_arg, threads=threads)
    http = requests.Session()
    try:
        message = server.wait_ready(http, startup_timeout)
        click.echo(f"Extender (gunicorn, 1 worker x {threads} threads) ready at {server.url}: {message}")
        click.echo(f"Scheduling {pods} pods (seed {seed}) with "
                   f"{'full Node objects' if full_nodes else 'node names (nodeCacheCapable)'}...\n")
        names = [n.name for n in cluster.nodes]
        sched = FakeScheduler(server.url, http, names, node_objects(cluster) if full_nodes else None,
                              random.Random(seed))
        outcomes: list[Outcome] = []
        t0 = time.monotonic()
        # The bar goes to standard error, and only on a terminal (disable=None); --quiet drops the
        # per-pod lines, not the sign that a long run is moving.
        with tqdm(total=len(workload), unit="pod", disable=None, leave=False) as bar:
            for p in workload:
                o = sched.schedule(p)
                outcomes.append(o)
                if not quiet:
                    where = (f"-> {o.node} {fmt_cards(o.cards)}"
                             if not o.why else f"not scheduled: {o.why}")
                    bar.write(f"{NAMESPACE}/{p.name:<10} {p.what:<44} {where}")
                bar.update()
        elapsed = time.monotonic() - t0
        state = http.get(server.url + "/state", timeout=30).json()
    except requests.RequestException as exc:
        raise click.ClickException(f"talking to the extender failed: {exc}\n{server.log_tail()}") from None
    finally:
        http.close()
        rc = server.stop()
    click.echo("\nCards: W whole-GPU pod, ▁..█ shared (height = memory in use), · free, x unhealthy\n")
    for line in node_table(state):
        click.echo(line)
    click.echo("")
    for line in summary(state, outcomes, elapsed, sched.requests):
        click.echo(line)
    click.echo(f"\nExtender stopped (exit code {rc}); its log: {server.log.name}")
