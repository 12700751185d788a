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
