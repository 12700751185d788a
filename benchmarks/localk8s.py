"""A real Kubernetes control plane on this machine's loopback, for the integration tests and the
real-scheduler benchmarks: upstream kube-apiserver and kube-scheduler v1.28.7 (and a kubelet) from
``../shared/k8s``, started with its ``local-k8s`` script, plus ``stowage extender`` in kube mode as
a real process and fake GPU nodes (Node objects only, no kubelet).

Why it lives here and not in ``tests/``: ``python -m benchmarks.binpack.real`` replays the openb
trace through the same peers the integration tests use, started the same way, so both import this
one harness (``tests/integration/realk8s.py`` adds only what is pytest's business: skipping or
failing when a peer cannot run). Nothing here imports pytest.

- :class:`LocalK8s`: one control plane (etcd + kube-apiserver) from ``local-k8s up``, our own
  kube-scheduler processes (:meth:`LocalK8s.start_scheduler`, restartable with another config)
  and one real kubelet with containerd (:meth:`LocalK8s.start_kubelet`, restartable).
- :func:`scheduler_config_for_test`: ``scheduler-config/scheduler-config.yaml`` itself, the file
  users deploy, with only the kubeconfig, leader election and the extender's address changed.
- :class:`ExtenderProc`: ``stowage extender`` in kube mode as a real process.
- :func:`fake_gpu_node`: a Node as the scheduler sees a GPU node running Stowage's device plugin.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_K8S = Path(os.environ.get("STOWAGE_SHARED_K8S", REPO.parent / "shared" / "k8s"))
LOCAL_K8S = SHARED_K8S / "local-k8s"
SCHEDULER_CONFIG = REPO / "scheduler-config" / "scheduler-config.yaml"


class WaitTimeout(AssertionError):
    """:func:`wait_until` ran out of time. An AssertionError, so that a test reads it as a failure."""


def missing_for_control_plane() -> list[str]:
    out = []
    if not LOCAL_K8S.exists():
        out.append(f"{LOCAL_K8S} (the real Kubernetes binaries) is not there")
    for tool in ("etcd", "openssl", "curl", "xz", "kubectl"):
        if shutil.which(tool) is None:
            out.append(f"`{tool}` is not installed")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``pred`` until it returns something truthy; raise :class:`WaitTimeout` naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except Exception as exc:  # a peer still starting, a 404 before creation: poll on
            last_exc = exc
        time.sleep(interval)
    raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}"
                         + (f" (last error: {last_exc})" if last_exc else ""))


@dataclass
class Proc:
    """A background process with its log file; stopped by SIGTERM, then SIGKILL."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen | None = None

    def start(self) -> "Proc":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=self.env, start_new_session=True)
        logf.close()
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)
        self.popen = None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return "(no log)"


@dataclass
class LocalK8s:
    """A control plane from ``local-k8s up`` and what the tests start around it."""

    dir: Path
    port_base: int
    rbac: bool = False
    scheduler: Proc | None = None
    kubelet_node: str | None = None
    _kubelet_argv: list[str] = field(default_factory=list)
    _core: Any = None

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def bin(self) -> Path:
        return self.dir / "bin"

    @property
    def api_port(self) -> int:
        return self.port_base + 2

    def _local_k8s(self, *args: str, timeout: float = 180) -> str:
        r = subprocess.run([str(LOCAL_K8S), *args, "--dir", str(self.dir)], capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"local-k8s {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r.stdout

    def up(self) -> "LocalK8s":
        if (self.dir / "kube-apiserver.pid").exists():
            try:
                self._local_k8s("down")
            except RuntimeError:
                pass
        for stale in ("etcd-data", "ports"):
            p = self.dir / stale
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        self._local_k8s("up", "--port-base", str(self.port_base), *(["--rbac"] if self.rbac else []))
        return self

    def down(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
        try:
            self._local_k8s("down", timeout=120)
        except Exception as exc:  # noqa: BLE001 - teardown must go on
            print(f"local-k8s down: {exc}", file=sys.stderr)

    # --- clients -----------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess:
        r = subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), *args], input=input,
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def api_client(self) -> Any:
        import kubernetes
        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))

    @property
    def core(self) -> Any:
        if self._core is None:
            import kubernetes
            self._core = kubernetes.client.CoreV1Api(self.api_client())
        return self._core

    def token(self, sa: str, namespace: str) -> str:
        return self.kubectl("create", "token", sa, "-n", namespace).stdout.strip()

    # --- kube-scheduler ----------------------------------------------------------------------
    def start_scheduler(self, config: dict | str, name: str = "kube-scheduler", extra_args: tuple[str, ...] = ()) -> Proc:
        """Run the real kube-scheduler with ``config`` (its --config) and ``extra_args``; replaces
        one already running."""
        if self.scheduler is not None:
            self.scheduler.stop()
        text = config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False)
        path = self.dir / f"{name}-config.yaml"
        path.write_text(text.replace("@KUBECONFIG@", str(self.kubeconfig)))
        port = self.port_base + 3
        self.scheduler = Proc(name, [str(self.bin / "kube-scheduler"), f"--config={path}", "--leader-elect=false",
                                     "--bind-address=127.0.0.1", f"--secure-port={port}",
                                     f"--authentication-kubeconfig={self.kubeconfig}",
                                     f"--authorization-kubeconfig={self.kubeconfig}",
                                     "--authentication-skip-lookup=true", "-v=2", *extra_args],
                              self.dir / f"{name}.log").start()
        import requests
        import urllib3
        urllib3.disable_warnings()

        def healthy() -> bool:
            if not self.scheduler.alive():
                raise AssertionError(f"kube-scheduler exited:\n{self.scheduler.log_tail()}")
            return requests.get(f"https://127.0.0.1:{port}/healthz", verify=False, timeout=2).text == "ok"
        wait_until(healthy, 60, "kube-scheduler /healthz")
        return self.scheduler

    # --- kubelet -----------------------------------------------------------------------------
    def start_kubelet(self, node: str) -> None:
        self._local_k8s("kubelet", "--node", node, timeout=180)
        self.kubelet_node = node
        pid = int((self.dir / "kubelet.pid").read_text())
        self._kubelet_argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
        wait_until(lambda: self._node_ready(node), 60, f"node {node} Ready")

    def _node_ready(self, node: str) -> bool:
        n = self.core.read_node(node)
        return any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))

    def kubelet_pid(self) -> int | None:
        try:
            pid = int((self.dir / "kubelet.pid").read_text())
            os.kill(pid, 0)
            return pid
        except (FileNotFoundError, ProcessLookupError, ValueError):
            return None

    def stop_kubelet(self) -> None:
        """Stop the kubelet only (containers keep running, as a kubelet restart does)."""
        pid = self.kubelet_pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 30, "the kubelet to stop")

    def start_kubelet_again(self) -> float:
        """Start the stopped kubelet with the same command line; returns time.time() at its start."""
        assert self._kubelet_argv, "start_kubelet first"
        logf = open(self.dir / "kubelet.log", "ab")
        t0 = time.time()
        p = subprocess.Popen(self._kubelet_argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        logf.close()
        (self.dir / "kubelet.pid").write_text(str(p.pid))
        return t0

    def kubelet_log(self) -> str:
        return (self.dir / "kubelet.log").read_text(errors="replace")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def scheduler_config_for_test(extender_url: str, extra: Callable[[dict], None] | None = None,
                              qps: int = 500) -> dict:
    """The deployed ``scheduler-config.yaml`` with only what a test must change.

    Changed: the kubeconfig (``@KUBECONFIG@``, filled in by :meth:`LocalK8s.start_scheduler`),
    leader election off (one scheduler, no Lease namespace), the extender's URL, and the client's
    qps/burst so that a burst of pods is not throttled by the client at 50/s. Everything else
    (profile, plugin args, managed resources, timeouts, nodeCacheCapable) is the file itself.
    """
    cfg = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    cfg["clientConnection"] = {"kubeconfig": "@KUBECONFIG@", "qps": qps, "burst": qps * 2}
    cfg["leaderElection"] = {"leaderElect": False}
    assert len(cfg["extenders"]) == 1, "the test adapts exactly one extender entry"
    cfg["extenders"][0]["urlPrefix"] = extender_url
    if extra is not None:
        extra(cfg)
    return cfg


@dataclass
class ExtenderProc:
    """``stowage extender`` in kube mode, as a real process on a loopback port."""

    k8s: LocalK8s
    port: int = 0
    args: tuple[str, ...] = ()
    name: str = "extender"
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        """The command line: ``stowage extender`` in kube mode on this cluster and port."""
        exe = Path(sys.executable).with_name("stowage")
        return [str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else ["-m", "stowage.cli"]),
                "extender", "--kubeconfig", str(self.k8s.kubeconfig), "--bind", f"127.0.0.1:{self.port}",
                *self.args]

    def start(self, wait_ready: bool = True) -> "ExtenderProc":
        if not self.port:
            self.port = free_port()
        self.proc = Proc(self.name, self.argv(), self.k8s.dir / f"{self.name}.log").start()
        if wait_ready:
            self.wait_ready()
        return self

    def session(self) -> Any:
        """An HTTP session that can reach the extender (a TLS extender's gives the client certificate)."""
        import requests
        return requests.Session()

    def wait_ready(self, timeout: float = 60) -> None:
        with self.session() as s:
            def ready() -> bool:
                if not self.proc.alive():
                    raise AssertionError(f"the extender exited:\n{self.proc.log_tail()}")
                return s.get(self.url + "/readyz", timeout=2).status_code == 200
            wait_until(ready, timeout, f"the extender's /readyz at {self.url}")

    def state(self) -> dict:
        with self.session() as s:
            return s.get(self.url + "/state", timeout=10).json()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


@dataclass
class FloorExtenderProc(ExtenderProc):
    """The do-nothing extender (:mod:`benchmarks.latency.floor`) as an extender of this cluster:
    filter keeps the first node it is sent, bind creates the Binding; ``args`` adds options
    (e.g. ``--workers 2``)."""

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "benchmarks.latency.floor", "--keep-first",
                "--kubeconfig", str(self.k8s.kubeconfig), "--bind", f"127.0.0.1:{self.port}", *self.args]


def json_patch_status(k8s: LocalK8s, node: str, status: dict) -> None:
    k8s.core.patch_node_status(node, {"status": status})


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)


def fake_gpu_node(k8s: LocalK8s, name: str, cards: list[Any], *, cpu: str = "64", memory: str = "512Gi",
                  labels: dict[str, str] | None = None, memory_unit_mib: int = 1024,
                  extra_allocatable: dict[str, str] | None = None) -> None:
    """A Node without a kubelet, as the scheduler sees a GPU node running Stowage's device plugin.

    ``cards`` are :class:`stowage.inventory.Card`; the node carries their inventory annotation and
    allocatable ``nvidia.com/gpu`` (cards), ``nvidia.com/gpu-memory`` (memory units) and
    ``nvidia.com/gpu-core`` (100 per card), exactly what the device plugin advertises. The
    ``not-ready`` taint that admission adds is removed (no controller-manager runs here).
    """
    from stowage.inventory import INVENTORY_ANNOTATION, encode_inventory
    healthy = [c for c in cards if c.healthy]
    alloc = {"cpu": cpu, "memory": memory, "pods": "110", "nvidia.com/gpu": str(len(healthy)),
             "nvidia.com/gpu-memory": str(sum(c.memory_mib // memory_unit_mib for c in healthy)),
             "nvidia.com/gpu-core": str(100 * len(healthy)), **(extra_allocatable or {})}
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                         "annotations": {INVENTORY_ANNOTATION: encode_inventory(cards, memory_unit_mib)}},
            "spec": {"taints": []}}
    k8s.core.create_node(body)
    ts = "2026-01-01T00:00:00Z"
    k8s.core.patch_node_status(name, {"status": {
        "capacity": dict(alloc), "allocatable": alloc,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Fake", "message": "no kubelet",
                        "lastHeartbeatTime": ts, "lastTransitionTime": ts}]}})
    node = k8s.core.read_node(name)
    if node.spec.taints:
        k8s.core.patch_node(name, {"spec": {"taints": None}})


class ApiSession:
    """A thin HTTP client of the API server for hot loops: plain JSON over one keep-alive pool.

    Why not the ``kubernetes`` client: it turns every answer into model objects, which costs more
    CPU than the API server's own work when thousands of pods are created one at a time. This
    one sends and returns dicts, with the admin token and CA of ``local-k8s``'s kubeconfig.
    """

    def __init__(self, kubeconfig: Path, pool: int = 32) -> None:
        import requests
        import requests.adapters
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        cluster = cfg["clusters"][0]["cluster"]
        self.server = cluster["server"].rstrip("/")
        self.session = requests.Session()
        # passed on every call: a session-wide verify loses to $REQUESTS_CA_BUNDLE in requests
        self.verify: str | bool = cluster.get("certificate-authority") or True
        self.session.headers["Authorization"] = f"Bearer {cfg['users'][0]['user']['token']}"
        adapter = requests.adapters.HTTPAdapter(pool_connections=pool, pool_maxsize=pool)
        self.session.mount("https://", adapter)

    def request(self, method: str, path: str, body: Any = None, *, ok: tuple[int, ...] = (200, 201),
                content_type: str = "application/json", timeout: float = 60, **params: Any) -> Any:
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        r = self.session.request(method, self.server + path, data=data, params=params or None, timeout=timeout,
                                 verify=self.verify, headers={"Content-Type": content_type})
        if r.status_code not in ok:
            raise RuntimeError(f"{method} {path}: HTTP {r.status_code}: {r.text[:500]}")
        return r.json() if r.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, **params)

    def post(self, path: str, body: Any, **kw: Any) -> Any:
        return self.request("POST", path, body, **kw)

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def list_all(self, path: str, page: int = 500, **params: Any) -> tuple[list[dict], str]:
        """Every item of a LIST, fetched in pages; returns (items, the list's resourceVersion)."""
        items: list[dict] = []
        cont = None
        while True:
            doc = self.get(path, limit=page, **({"continue": cont} if cont else {}), **params)
            items.extend(doc.get("items") or [])
            cont = (doc.get("metadata") or {}).get("continue")
            if not cont:
                return items, doc["metadata"]["resourceVersion"]

    def watch(self, path: str, resource_version: str, timeout_s: int = 3600, **params: Any) -> Any:
        """Yield (type, object) from a WATCH starting after ``resource_version``, until the server
        ends it (at most ``timeout_s``). An ERROR event is yielded as is (410: relist)."""
        r = self.session.get(self.server + path, stream=True, timeout=(10, timeout_s + 60), verify=self.verify,
                             params={"watch": "1", "resourceVersion": resource_version,
                                     "timeoutSeconds": str(timeout_s), "allowWatchBookmarks": "true", **params})
        if r.status_code != 200:
            raise RuntimeError(f"WATCH {path}: HTTP {r.status_code}: {r.text[:500]}")
        with r:
            for line in r.iter_lines(chunk_size=None):
                if line:
                    ev = json.loads(line)
                    yield ev.get("type"), ev.get("object") or {}
