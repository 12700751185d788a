"""Keeping each replayed seed on disk, so a long benchmark can be resumed or assembled in parts.

The full table is 9 traces x 8 policies x 10 seeds; on a 2-core machine that is the better part
of an hour. With ``--runs DIR`` every finished (trace, policy, seed) is written to
``DIR/<trace>/<policy>/seed<N>.npz`` at once, and a later run with the same ``DIR`` reuses what
is there instead of replaying it again: an interrupted run picks up where it stopped, and the
policies whose code did not change need not be replayed after a change to one policy.

Reuse is only honest while the code that produced a run is the code being measured. So every
stored run carries the git commit (and whether the tree was dirty) it was produced at, the
results' ``meta.reused_runs`` lists those commits per policy, and the CLI prints them. Delete a
policy's folder (or use another ``DIR``) when its code changed.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .trace import REPO_ROOT


@dataclass(frozen=True)
class StoredRun:
    """One replayed seed: its binned curve, failed pods and seconds, and the code it came from."""

    trace: str
    policy: str
    seed: int
    curve: np.ndarray
    failed: int
    seconds: float
    commit: str


def code_version(root: Path = REPO_ROOT) -> str:
    """``<commit>`` or ``<commit>+dirty`` of the checkout, ``unknown`` outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+dirty" if dirty else head


def _safe(part: str) -> str:
    """A trace or policy name as one path component (CSV paths as traces keep only their stem)."""
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in Path(part).name) or "_"


def run_path(directory: Path, trace: str, policy: str, seed: int) -> Path:
    return directory / _safe(trace) / _safe(policy) / f"seed{seed}.npz"


def save(directory: Path, run: StoredRun) -> Path:
    """Write one run atomically (a half-written file is never read back as a run)."""
    path = run_path(directory, run.trace, run.policy, run.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, curve=run.curve, failed=np.int64(run.failed), seconds=np.float64(run.seconds),
             commit=np.array(run.commit))
    tmp.replace(path)
    return path


def load(directory: Path, trace: str, policy: str, seed: int, bins: int) -> StoredRun | None:
    """The stored run, or None when there is none (or it is unreadable or of another shape)."""
    path = run_path(directory, trace, policy, seed)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            curve = np.asarray(z["curve"], float)
            if curve.shape != (bins,):
                return None
            return StoredRun(trace, policy, seed, curve, int(z["failed"]), float(z["seconds"]), str(z["commit"]))
    except (OSError, ValueError, KeyError):
        return None
