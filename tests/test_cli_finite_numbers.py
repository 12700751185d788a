"""Every float option of every command refuses ``nan``, ``inf`` and ``-inf`` (stowage/finite.py).

Found by experiment (session 14): click's FloatRange lets ``nan`` through any bounds and ``inf``
through a range with no upper end. ``stowage device-plugin --recovery-quiet-seconds nan`` left an
unhealthy card unhealthy for ever, ``--probe-interval-seconds inf`` never probed again,
``--reconcile-interval-seconds inf`` killed the reconciler thread (OverflowError in its wait);
``stowage extender --stale-after nan`` never saw a failing watch as stale. The walk below covers
each command's float options, so a new one is caught too; the benchmarks' argparse commands
are listed by hand.
"""
from __future__ import annotations

import importlib

import click
import pytest
from click.testing import CliRunner

from stowage.cli import SUBCOMMANDS, main
from stowage.finite import FiniteRange, finite_number

NOT_NUMBERS = ("nan", "NaN", "inf", "-inf", "infinity", "1e999")


def _commands() -> list[tuple[str, click.Command]]:
    out = []
    for name, (target, _) in sorted(SUBCOMMANDS.items()):
        module, attr = target.split(":")
        out.append((name, getattr(importlib.import_module(module), attr)))
    return out


def _float_options() -> list[tuple[str, str, click.Option]]:
    return [(name, opt.opts[0], opt) for name, cmd in _commands() for opt in cmd.params
            if isinstance(opt, click.Option) and isinstance(opt.type, click.types.FloatParamType)]


FLOAT_OPTIONS = _float_options()


def test_the_walk_finds_the_known_float_options():
    found = {(name, flag) for name, flag, _ in FLOAT_OPTIONS}
    assert {("device-plugin", "--recovery-quiet-seconds"), ("device-plugin", "--probe-interval-seconds"),
            ("device-plugin", "--reconcile-interval-seconds"), ("extender", "--stale-after"),
            ("exporter", "--cache-seconds"), ("demo", "--startup-timeout")} <= found


@pytest.mark.parametrize("name,flag,opt", FLOAT_OPTIONS, ids=[f"{n} {f}" for n, f, _ in FLOAT_OPTIONS])
def test_every_float_option_is_a_finite_range(name, flag, opt):
    assert isinstance(opt.type, FiniteRange), f"stowage {name} {flag}: use stowage.finite (nan/inf pass FloatRange)"


def _refusal(name: str, args: list[str]) -> str:
    """The message with which parsing ``stowage NAME ARGS`` stops (parsing only: nothing runs,
    whatever the code under test accepts)."""
    cmd = dict(_commands())[name]
    with pytest.raises(click.BadParameter) as refused:
        cmd.make_context(name, args)
    return refused.value.format_message()


@pytest.mark.parametrize("name,flag,opt", FLOAT_OPTIONS, ids=[f"{n} {f}" for n, f, _ in FLOAT_OPTIONS])
@pytest.mark.parametrize("value", NOT_NUMBERS)
def test_every_float_option_refuses_what_is_no_finite_number(name, flag, opt, value):
    """Refused while parsing, naming the flag and saying why."""
    said = _refusal(name, [f"{flag}={value}"])
    assert flag in said and "finite number" in said, said


def test_a_refusal_is_one_line_and_exit_2_as_typed(monkeypatch):
    import deviceplugin.cli

    monkeypatch.setattr(deviceplugin.cli.main, "callback", lambda **_: pytest.fail("ran with nan"))
    r = CliRunner().invoke(main, ["device-plugin", "--recovery-quiet-seconds", "nan"])
    assert r.exit_code == 2 and "--recovery-quiet-seconds" in r.output and "'nan' is not a finite number" in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("variable,name", [("STOWAGE_RECOVERY_QUIET_SECONDS", "device-plugin"),
                                           ("STOWAGE_RECOVERY_QUIET_SECONDS", "exporter"),
                                           ("STOWAGE_PROBE_INTERVAL_SECONDS", "device-plugin"),
                                           ("STOWAGE_RECONCILE_INTERVAL_SECONDS", "device-plugin"),
                                           ("STOWAGE_EXPORTER_CACHE_SECONDS", "exporter")])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_an_environment_default_is_checked_as_the_flag_is(variable, name, value, monkeypatch):
    monkeypatch.setenv(variable, value)
    assert "finite number" in _refusal(name, [])


def test_finite_numbers_still_parse_within_their_bounds():
    t = FiniteRange(1, 3600)
    assert t.convert("1.5", None, None) == 1.5 and t.convert(60, None, None) == 60.0
    with pytest.raises(click.BadParameter, match="range"):
        t.convert("0.5", None, None)
    with pytest.raises(click.BadParameter, match="not a number"):
        t.convert("soon", None, None)
    assert finite_number("-2.5") == -2.5


# The benchmarks' argparse commands: each number flag, the values that make no run.
def _elastic():
    from benchmarks.elastic.cli import build_parser
    return build_parser()


def _latency():
    from benchmarks.latency.cli import build_parser
    return build_parser()


@pytest.mark.parametrize("parser,flag,value", [
    (_elastic, "--tolerance", "nan"), (_elastic, "--tolerance", "-0.1"), (_elastic, "--window", "nan"),
    (_elastic, "--window", "inf"), (_elastic, "--metric-window", "nan"), (_elastic, "--metric-window", "-5"),
    (_elastic, "--unneeded", "nan"), (_elastic, "--unneeded", "-1"), (_elastic, "--restart-at", "nan"),
    (_elastic, "--days", "inf"), (_latency, "--churn-rate", "nan"), (_latency, "--churn-rate", "inf"),
    (_latency, "--churn-rate", "-3")])
def test_benchmark_numbers_that_make_no_run_are_refused_by_name(parser, flag, value, capsys):
    """``--tolerance nan`` made "within the tolerance" never true (an HPA with no dead band: a result
    that looks like one); a nan or negative ``--churn-rate`` made the churn thread's pause never
    positive (events flat out, not at the rate asked)."""
    from tests.cli_checks import assert_refused_by_name

    assert_refused_by_name(parser(), flag, value, capsys)


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_the_churn_extender_refuses_a_rate_that_is_no_rate(value, capsys, monkeypatch):
    import extender.cli

    from benchmarks.latency import churn

    monkeypatch.setattr(extender.cli, "run_server", extender.cli.run_server)   # churn.main rebinds it
    with pytest.raises(SystemExit) as exc:
        churn.main(["--rate", value, "--stats", "/nonexistent/stats", "--", "--no-such-extender-flag"])
    assert exc.value.code == 2 and "argument --rate: " in capsys.readouterr().err


@pytest.mark.parametrize("flag,value", [("--threads", "0"), ("--workers", "0"), ("--workers", "-2")])
def test_the_latency_floor_refuses_no_threads_or_workers(flag, value, capsys, monkeypatch):
    from benchmarks.latency import floor

    monkeypatch.setattr(floor, "ExtenderServer", lambda *a, **k: pytest.fail("started with " + value))
    with pytest.raises(SystemExit) as exc:
        floor.main([flag, value])
    assert exc.value.code == 2 and f"argument {flag}: " in capsys.readouterr().err


@pytest.mark.parametrize("value", ["abc", "0", "-5", "70000"])
def test_binpack_real_port_base_is_a_port_flag_or_environment(value, capsys, monkeypatch):
    """``STOWAGE_BENCH_PORT_BASE=abc`` ended ``python -m benchmarks.binpack.real --help`` in a
    ValueError traceback (int() while building the parser), and ``--port-base 70000`` was taken
    (the control plane then failed to bind, minutes later)."""
    from benchmarks.binpack.real import build_parser
    from tests.cli_checks import assert_refused_by_name

    assert_refused_by_name(build_parser(), "--port-base", value, capsys)
    monkeypatch.setenv("STOWAGE_BENCH_PORT_BASE", value)
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([])
    assert exc.value.code == 2 and "argument --port-base: " in capsys.readouterr().err
    monkeypatch.setenv("STOWAGE_BENCH_PORT_BASE", "24000")
    assert build_parser().parse_args([]).port_base == 24000
