"""Ctrl-C during a long benchmark (first-hour review): every benchmark command ended in a
KeyboardInterrupt traceback, plus one traceback per pool worker ("Process ForkPoolWorker-1: ...").
Now one line, exit status 130 (the shell's for SIGINT), and the workers leave it to the parent."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.entry import run_command, worker_pool
from tiny_trace import write_trace

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("STOWAGE_OPENB", ROOT.parent / "shared" / "openb"))


def test_an_interrupted_command_says_so_in_one_line(capsys):
    def main() -> int:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exc:
        run_command(main, "python -m benchmarks.example")
    assert exc.value.code == 130
    assert capsys.readouterr().err.strip() == "python -m benchmarks.example: interrupted (Ctrl-C)"
    with pytest.raises(SystemExit) as exc:
        run_command(main, "x", note="no results written")
    assert exc.value.code == 130
    assert capsys.readouterr().err.strip() == "x: interrupted (Ctrl-C); no results written"


def test_a_command_stopped_by_sigterm_says_sigterm_not_ctrl_c(capsys):
    """binpack.real unwinds SIGTERM as an interrupt (its control planes are stopped on the way
    out); the line said "(Ctrl-C)" and the status was Ctrl-C's 130 for a `kill`."""
    def main() -> int:
        raise KeyboardInterrupt(signal.SIGTERM)

    with pytest.raises(SystemExit) as exc:
        run_command(main, "x")
    assert exc.value.code == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip() == "x: interrupted (SIGTERM)"


def test_a_finished_command_keeps_its_status():
    with pytest.raises(SystemExit) as exc:
        run_command(lambda: 3, "x")
    assert exc.value.code == 3


def test_pool_workers_leave_ctrl_c_to_the_parent():
    """A terminal's Ctrl-C reaches every process of the group: a worker that took it printed its
    own traceback while the parent stopped the pool anyway."""
    with worker_pool(2) as pool:
        handlers = pool.map(signal.getsignal, [signal.SIGINT] * 2)
    assert handlers == [signal.SIG_IGN] * 2


_GIVEN: tuple = ()


def _remember(*args: object) -> None:
    global _GIVEN
    _GIVEN = args


def _worker_state(_: object) -> tuple:
    return signal.getsignal(signal.SIGINT), _GIVEN


def test_a_pool_with_its_own_initializer_still_leaves_ctrl_c_to_the_parent():
    """A benchmark whose workers need set-up of their own (binpack.real: a slot each, SIGTERM
    handling) gets both: its initializer runs after the one that ignores Ctrl-C."""
    with worker_pool(2, initializer=_remember, initargs=("slot", 3)) as pool:
        assert pool.map(_worker_state, range(2)) == [(signal.SIG_IGN, ("slot", 3))] * 2


@pytest.mark.skipif(not (DATA / "openb_pod_list_default.csv").is_file(), reason="openb trace not present")
def test_ctrl_c_during_a_replay_is_one_line_and_status_130(tmp_path):
    """End to end, as a terminal does it: SIGINT to the whole process group once the run started
    (its first progress line), while the pool replays."""
    p = subprocess.Popen([sys.executable, "-m", "benchmarks.binpack", "--quick", "--trace", "default",
                          "--seeds", "42-51", "--policies", "stowage,fgd", "--jobs", "2", "--data-dir", str(DATA),
                          "--out", str(tmp_path / "o")],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        first = p.stderr.readline()          # "replays:   0%|..." once the pool is up
        assert "replays" in first, first
        os.killpg(p.pid, signal.SIGINT)
        rest = p.stderr.read()
        assert p.wait(timeout=60) == 130
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert "Traceback" not in rest and "interrupted (Ctrl-C)" in rest
    assert not (tmp_path / "o").exists()


# The real-cluster benchmark, without a cluster: its pool (run_tasks) runs this stand-in for one
# replay, which holds its "control plane" until it is stopped, as replay_real does (Cluster.__exit__).
REAL_WITHOUT_A_CLUSTER = """
import os, sys, time
import benchmarks.binpack.real as real
from benchmarks.entry import NOT_WRITTEN, run_command

def replay_real(nodes, pods, mode, seed, opts, *, limit=None, until_pct=None):
    opts.work_dir.mkdir(parents=True)          # slotK: each worker its own, from _init_worker's slot
    try:
        os.write(2, f"replaying {mode}\\n".encode())   # one write: print's two interleave between workers
        time.sleep(300)
    finally:
        (opts.work_dir / "stopped").write_text(mode)

real.replay_real = replay_real                 # the pool's workers are forked: they run it too
real.missing_for_control_plane = lambda: []
run_command(real.main, "python -m benchmarks.binpack.real", NOT_WRITTEN)
"""


def test_ctrl_c_during_binpack_real_is_one_line_and_each_replay_stops(tmp_path):
    """binpack.real's pool kept its own initializer (a slot per worker, SIGTERM unwinds), so its
    workers took Ctrl-C themselves: a traceback per worker. Now they leave it to the parent, whose
    pool stops them with SIGTERM; each still unwinds its replay (stops its control plane)."""
    data = write_trace(tmp_path / "data", nodes=4, pods=20)
    work = tmp_path / "work"
    p = subprocess.Popen([sys.executable, "-c", REAL_WITHOUT_A_CLUSTER, "--data-dir", str(data), "--seeds", "42",
                          "--jobs", "2", "--burst", "0", "--no-progress", "--work-dir", str(work),
                          "--out", str(tmp_path / "o")],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    try:
        while "".join(seen).count("replaying") < 2:    # both workers are in a replay
            seen.append(p.stderr.readline())
            assert seen[-1], "".join(seen)
        os.killpg(p.pid, signal.SIGINT)
        rest = p.stderr.read()
        assert p.wait(timeout=60) == 130, rest
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert "Traceback" not in rest, rest
    assert [ln for ln in rest.splitlines() if ln.strip()] == [
        "python -m benchmarks.binpack.real: interrupted (Ctrl-C); no results written (no run had finished)"]
    assert sorted((work / s / "stopped").read_text() for s in ("slot0", "slot1")) == ["plain", "stowage"]
