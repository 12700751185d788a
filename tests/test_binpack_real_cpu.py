"""The burst's CPU accounting (``benchmarks.binpack.real``): a peer's CPU is every thread of it,
and the extender's is every process of its group (master, decision process, HTTP workers)."""
from __future__ import annotations

import pytest

import os
import subprocess
import sys
import time

from benchmarks.binpack.real import group_cpu_by_name, proc_stat, process_cpu_seconds

BURN = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import sys, time
from extender.split import name_process
name_process("burner-with-a-long-name")
t = time.process_time()
while time.process_time() - t < 0.4:
    pass
print("burnt", flush=True)
time.sleep(60)
'''], stdout=sys.stdout)
time.sleep(60)
"""


def test_a_group_counts_the_cpu_of_its_children_and_a_process_only_its_own():
    leader = subprocess.Popen([sys.executable, "-c", BURN], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert leader.stdout.readline().strip() == "burnt"
        group, own = sum(group_cpu_by_name(leader.pid).values()), process_cpu_seconds(leader.pid)
        assert group >= own + 0.35          # the child's 0.4 s busy loop is in the group's figure
        assert own < 0.35                    # and not in the leader's own
        by_name = group_cpu_by_name(leader.pid)
        assert by_name["burner-with-a-l"] >= 0.35   # the child's name (15 bytes of it) carries its CPU
        assert by_name[proc_stat(leader.pid).name] < 0.35
        assert abs(sum(by_name.values()) - group) < 0.05
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


def test_a_process_that_is_gone_counts_zero():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    time.sleep(0.05)
    assert process_cpu_seconds(p.pid) == 0.0
    assert proc_stat(p.pid) is None
    assert group_cpu_by_name(p.pid) == {}


# ------------------------------------------------------------------ --burst-rounds
def _burst(mode: str, pods_per_s: float):
    from benchmarks.binpack.real import BurstRun
    return BurstRun(mode, 300, 300, 0, 0, 1.0, 300 / pods_per_s if pods_per_s else 0.0)


def test_burst_rounds_pair_each_extender_burst_with_the_plain_one_of_its_round():
    from benchmarks.binpack.real import burst_ratios
    # round 1: stowage then plain; round 2: plain then stowage (the order alternates)
    bursts = [_burst("stowage", 30), _burst("plain", 50), _burst("plain", 40), _burst("stowage", 30)]
    assert [round(r) for r in burst_ratios(bursts)] == [60, 75]
    assert burst_ratios([_burst("stowage", 30)]) == []          # no plain run: no ratio
    assert burst_ratios([_burst("stowage", 30), _burst("plain", 0)]) == []   # a plain run that bound nothing


def test_burst_rounds_below_one_are_refused(capsys):
    from benchmarks.binpack.real import main
    with pytest.raises(SystemExit) as exc:           # refused while parsing, before any peer starts
        main(["--no-replay", "--burst", "10", "--burst-rounds", "0"])
    assert exc.value.code == 2
    assert "--burst-rounds: must be a whole number from 1 to 1000, not '0'" in capsys.readouterr().err


def test_cores_busy_and_the_cpu_bound_rate_come_from_the_peers_cpu_and_the_burst_wall_time():
    from benchmarks.binpack.real import BurstRun
    # 300 pods in 4 s; the peers used 7.2 CPU seconds in all: 1.8 cores busy, 24 ms per pod
    b = BurstRun("stowage", 300, 300, 0, 0, 1.0, 4.0,
                 cpu_seconds={"kube-apiserver": 2.0, "kube-scheduler": 3.0, "extender": 2.2})
    assert round(b.cores_busy, 6) == 1.8
    assert round(b.cpu_bound_rate(2), 3) == round(2 / 0.024, 3)   # 83.3 pods/s on 2 cores
    assert round(b.cpu_bound_rate(4), 3) == round(4 / 0.024, 3)
    empty = BurstRun("plain", 300, 0, 0, 300, 1.0, 0.0)           # nothing measured: no figure, no error
    assert empty.cores_busy == 0.0 and empty.cpu_bound_rate(2) == 0.0
