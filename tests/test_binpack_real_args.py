"""``benchmarks.binpack.real``'s command line: a value that cannot make a run is refused with a
clear message before any control plane starts (it used to run: ``--node-stride 0`` and
``--jobs 0`` went on, ``--limit -5`` dropped the last five pods, ``--until -1`` replayed nothing
and printed "nan %", ``--pod-timeout 0`` counted every pod failed), and ``--quick`` fills in only
what the user did not say (``--quick --burst 0`` timed a burst of 100 anyway)."""
from __future__ import annotations

import pytest

from benchmarks.binpack.real import build_parser, settle_quick
from cli_checks import assert_refused_by_name


@pytest.mark.parametrize("flag, value", [
    ("--node-stride", "0"), ("--jobs", "0"), ("--limit", "-5"), ("--limit", "0"), ("--workers", "0"),
    ("--burst", "-1"), ("--burst-rounds", "0"), ("--until", "-1"), ("--until", "0"), ("--until", "nan"),
    ("--pod-timeout", "0"), ("--pod-timeout", "-3"), ("--jobs", "two"),
])
def test_a_value_that_cannot_make_a_run_is_refused_by_name(flag, value, capsys):
    assert_refused_by_name(build_parser(), flag, value, capsys)


def test_sane_values_are_taken():
    args = build_parser().parse_args(["--node-stride", "6", "--jobs", "3", "--limit", "400", "--until", "101",
                                      "--pod-timeout", "2.5", "--burst", "0", "--workers", "1"])
    assert (args.node_stride, args.jobs, args.limit, args.until, args.pod_timeout, args.burst, args.workers) == \
        (6, 3, 400, 101.0, 2.5, 0, 1)


def test_quick_fills_in_only_what_the_user_did_not_say():
    quick = settle_quick(build_parser().parse_args(["--quick"]))
    assert (quick.seeds, quick.node_stride, quick.limit, quick.burst) == ((42,), 6, 400, 100)
    mine = settle_quick(build_parser().parse_args(["--quick", "--burst", "0", "--seeds", "43", "--node-stride", "3",
                                                   "--limit", "50"]))
    assert (mine.seeds, mine.node_stride, mine.limit, mine.burst) == ((43,), 3, 50, 0)


def test_without_quick_the_defaults_are_the_full_protocol():
    args = settle_quick(build_parser().parse_args([]))
    assert (args.seeds, args.node_stride, args.limit, args.burst, args.until) == ((42, 43, 44), 1, None, 0, None)


@pytest.mark.parametrize("argv", [["--no-replay"], ["--quick", "--no-replay", "--burst", "0"]])
def test_no_replay_without_a_burst_is_refused_before_any_peer_starts(argv, capsys):
    """Refused by the parser itself (so the docs' check refuses such a line too), exit 2."""
    from benchmarks.binpack.real import main
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "--no-replay leaves only the burst" in capsys.readouterr().err


def test_no_replay_with_quicks_burst_is_taken():
    args = build_parser().parse_args(["--quick", "--no-replay"])
    assert settle_quick(args).burst == 100


def test_an_unknown_mode_is_refused_by_name(capsys):
    assert_refused_by_name(build_parser(), "--modes", "fast", capsys)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--modes", "stowage,fast"])
    assert "argument --modes: unknown mode 'fast' (known: plain, stowage)" in capsys.readouterr().err
    assert build_parser().parse_args(["--modes", " plain , stowage"]).modes == ["plain", "stowage"]


@pytest.mark.parametrize("argv", [["--jobs", "4", "--port-base", "65510"], ["--jobs", "2", "--port-base", "65530"],
                                  ["--jobs", "200", "--port-base", "64000"]])
def test_jobs_whose_ports_pass_65535_are_refused_up_front(argv, capsys):
    """Job K's control plane listens on --port-base + 10*K .. +3: ``--jobs 4 --port-base 65510``
    was taken, and the fourth job's etcd could not bind, minutes into the run."""
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--jobs" in err and "--port-base" in err and "65535" in err


def test_jobs_whose_ports_fit_are_taken():
    args = build_parser().parse_args(["--jobs", "4", "--port-base", str(65535 - 33)])
    assert (args.jobs, args.port_base) == (4, 65502)
