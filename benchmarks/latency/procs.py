"""Starting the servers under test as subprocesses, and reading their CPU time and memory from /proc."""
from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stowage_command() -> list[str]:
    """The deployed entry point: the ``stowage`` console script of this interpreter's environment."""
    script = Path(sys.executable).parent / "stowage"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from stowage.cli import main; main()"]


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process (all its threads), from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory_mib(pid: int, key: str = "VmHWM") -> float:
    """A /proc/<pid>/status memory figure (VmHWM: peak resident set) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Server:
    """A gunicorn server on a loopback port: its master and the master's children, which are
    ONE worker (one-process layout), or ``workers`` HTTP workers + the decision process (split
    layout: ``workers + 1`` children)."""

    name: str
    proc: subprocess.Popen
    port: int
    children: int = 1                 # processes expected under the master
    pids: list[int] = field(default_factory=list)
    log_path: Path | None = None

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def wait_ready(self, timeout: float = 300.0, path: str = "/healthz") -> None:
        """Until the worker answers (it builds the model after fork, which takes a while at 10k nodes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            try:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=5)
                conn.request("GET", path)
                ok = conn.getresponse().status == 200
                conn.close()
                if ok:
                    pids = children(self.proc.pid)
                    if len(pids) == self.children:
                        self.pids = pids
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not become ready (with {self.children} processes under its master) "
                           f"in {timeout:.0f}s; see {self.log_path}")

    def cpu_by_process(self) -> list[float]:
        """CPU seconds of each serving process (the master only supervises); the split layout's
        decision process is the master's first child: it is forked before gunicorn starts its
        workers."""
        return [cpu_seconds(p) for p in sorted(self.pids)]

    def peak_mib(self) -> float:
        """Sum of the serving processes' peak resident sets (pages shared after fork count once each)."""
        return sum(memory_mib(p, "VmHWM") for p in self.pids)


    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start(name: str, cmd: list[str], port: int, log_dir: Path, children: int = 1) -> Server:
    log_path = Path(log_dir) / f"{name}.log"
    log = open(log_path, "wb")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(Path(__file__).parents[2]))
    log.close()
    return Server(name=name, proc=proc, port=port, children=children, log_path=log_path)


def extender_cmd(cluster_file: Path, port: int, threads: int, churn_rate: float = 0.0,
                 churn_stats: Path | None = None, workers: int = 1) -> list[str]:
    """``stowage extender --simulated FILE`` as deployed; with churn, the same command run by the churn wrapper."""
    args = ["--simulated", str(cluster_file), "--bind", f"127.0.0.1:{port}", "--threads", str(threads),
            "--workers", str(workers), "--log-level", "warning"]
    if churn_rate > 0:
        return [sys.executable, "-m", "benchmarks.latency.churn", "--rate", str(churn_rate),
                "--stats", str(churn_stats), "--", *args]
    return stowage_command() + ["extender", *args]


def floor_cmd(port: int, threads: int, workers: int = 1) -> list[str]:
    return [sys.executable, "-m", "benchmarks.latency.floor", "--bind", f"127.0.0.1:{port}", "--threads", str(threads),
            "--workers", str(workers)]


def extender_processes(workers: int) -> int:
    """Processes under `stowage extender --workers N`'s master: the workers, plus the decision
    process of the split layout (N > 1)."""
    return workers + 1 if workers > 1 else workers
