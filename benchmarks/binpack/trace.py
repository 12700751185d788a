"""Reading the openb trace CSVs (Alibaba ``cluster-trace-gpu-v2023``) into plain arrays.

Why a module of its own: the replay, the tests and the CLI all need the same parsing, and a
missing or malformed file must become one clear message (:class:`TraceError`), never a traceback.
"""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stowage.resources import GpuRequest

NODE_FILE = "openb_node_list_gpu_node.csv"
POD_PREFIX = "openb_pod_list_"
PUBLISHED_FILE = "published_fgd_results.csv"
DEFAULT_TRACE = "default"
SOURCE_HINT = ("the public alibaba/clusterdata repository, folder cluster-trace-gpu-v2023 "
               "(https://github.com/alibaba/clusterdata/tree/master/cluster-trace-gpu-v2023)")
REPO_ROOT = Path(__file__).resolve().parents[2]


class TraceError(RuntimeError):
    """A trace file is missing or unreadable; the message says what and where to get it."""


@dataclass(frozen=True)
class Nodes:
    """The cluster: one row per node, every card is 1000 milli whatever its model."""

    names: tuple[str, ...]
    cpu_milli: np.ndarray   # [N]
    memory_mib: np.ndarray  # [N]
    gpus: np.ndarray        # [N]
    model: tuple[str, ...]

    @property
    def total_gpu_milli(self) -> int:
        return int(self.gpus.sum()) * 1000


@dataclass(frozen=True)
class Pods:
    """The workload: one row per pod of the trace (arrival order is the replay's business)."""

    name: str
    cpu_milli: np.ndarray   # [P]
    memory_mib: np.ndarray  # [P]
    num_gpu: np.ndarray     # [P]
    gpu_milli: np.ndarray   # [P] share of ONE card per GPU; 1000 for whole-GPU pods
    gpu_spec: tuple[str, ...]  # "" or "|"-joined allowed models

    def __len__(self) -> int:
        return len(self.cpu_milli)

    @property
    def milli(self) -> np.ndarray:
        """[P] total GPU-milli each pod requests (num_gpu * gpu_milli)."""
        return self.num_gpu * self.gpu_milli

    def request(self, j: int) -> GpuRequest:
        """Row j as the extender's request: a share pod asks for mem = core = gpu_milli of a
        1000-unit card; a whole-GPU pod for num_gpu cards; CPU and host memory are node filters."""
        g, m = int(self.num_gpu[j]), int(self.gpu_milli[j])
        cpu, mem = int(self.cpu_milli[j]), int(self.memory_mib[j])
        if g == 0 or m == 0:
            return GpuRequest(cpu_milli=cpu, host_mem_mib=mem)
        if g == 1 and m < 1000:
            return GpuRequest(mem_mib=m, core_milli=m, cpu_milli=cpu, host_mem_mib=mem)
        return GpuRequest(gpus=g, cpu_milli=cpu, host_mem_mib=mem)

    def models(self, j: int) -> tuple[str, ...]:
        return tuple(m for m in self.gpu_spec[j].split("|") if m)


def data_dir(explicit: str | os.PathLike | None = None) -> Path:
    """--data-dir, else $STOWAGE_OPENB, else ../shared/openb next to the repository."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("STOWAGE_OPENB")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "openb"


def _rows(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    if path.is_dir():
        raise TraceError(f"{path} is a folder, not a trace CSV (a folder of openb CSVs is --data-dir; "
                         "--trace is a trace name such as default, or a CSV's path)")
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}\nGet the openb CSVs from {SOURCE_HINT} "
                         f"and point --data-dir (or $STOWAGE_OPENB) at the folder holding them.")
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in required if c not in (reader.fieldnames or ())]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)}")
            return list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"cannot read {path}: {exc}") from exc


def _ints(rows: list[dict[str, str]], col: str, path: Path) -> np.ndarray:
    try:
        return np.array([int(float(r[col] or 0)) for r in rows], np.int64)
    except ValueError as exc:
        raise TraceError(f"{path}: column {col} holds a non-number ({exc})") from exc


def load_nodes(directory: Path) -> Nodes:
    path = directory / NODE_FILE
    rows = _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model"))
    return Nodes(names=tuple(r["sn"] for r in rows), cpu_milli=_ints(rows, "cpu_milli", path),
                 memory_mib=_ints(rows, "memory_mib", path), gpus=_ints(rows, "gpu", path),
                 model=tuple(r["model"] for r in rows))


def trace_path(trace: str, directory: Path) -> Path:
    """A trace name ("default", "gpushare40") or a path to a CSV of the same format."""
    p = Path(trace)
    if trace.endswith(".csv") or p.exists() or "/" in trace or os.sep in trace:   # a path, not a name
        return p
    return directory / f"{POD_PREFIX}{trace}.csv"


def trace_name(trace: str) -> str:
    stem = Path(trace).stem if trace.endswith(".csv") else trace
    return stem[len(POD_PREFIX):] if stem.startswith(POD_PREFIX) else stem


def load_pods(trace: str, directory: Path) -> Pods:
    path = trace_path(trace, directory)
    rows = _rows(path, ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli"))
    pods = Pods(name=trace_name(trace), cpu_milli=_ints(rows, "cpu_milli", path),
                memory_mib=_ints(rows, "memory_mib", path), num_gpu=_ints(rows, "num_gpu", path),
                gpu_milli=_ints(rows, "gpu_milli", path),
                gpu_spec=tuple((r.get("gpu_spec") or "").strip() for r in rows))
    if len(pods) == 0:
        raise TraceError(f"{path}: no pods")
    bad = (pods.gpu_milli < 0) | (pods.gpu_milli > 1000) | (pods.num_gpu < 0) | ((pods.num_gpu > 1) & (pods.gpu_milli < 1000) & (pods.gpu_milli > 0))
    if bad.any():
        raise TraceError(f"{path}: row {int(np.flatnonzero(bad)[0]) + 2} has an impossible GPU request")
    return pods


def available_traces(directory: Path) -> list[str]:
    """default first, then every other openb_pod_list_*.csv in the folder."""
    names = sorted(p.name[len(POD_PREFIX):-4] for p in directory.glob(f"{POD_PREFIX}*.csv"))
    return sorted(names, key=lambda n: (n != DEFAULT_TRACE, n))
