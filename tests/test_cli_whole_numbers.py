"""Every int option of every command has an upper end (stowage/bounded.py), as every float option
is finite (tests/test_cli_finite_numbers.py).

Found by experiment (session 15): click's ``IntRange(min=1)`` took numbers of any size.
``stowage extender --timeout`` with 400 digits ended gunicorn's master in an OverflowError
traceback (``timeout / 2.0``); ``stowage inspect --simulated --fill 10**30`` never ended;
``--max-body-mib 10**30`` took any body into memory. The walk below covers each command's int
options, so a new one is caught too; seeds (any whole number seeds ``random.Random``) are the
only int options without ends.
"""
from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from stowage.bounded import MAX_QUOTED, WholeRange, quoted
from stowage.cli import main
from tests.test_cli_finite_numbers import _commands, _refusal

SEEDS = {("demo", "--seed"), ("inspect", "--seed"), ("plan", "--seed")}   # any whole number is a seed

HUGE = (str(10 ** 30), str(2 ** 63), "9" * 5000)


def _int_options() -> list[tuple[str, str, click.Option]]:
    return [(name, opt.opts[0], opt) for name, cmd in _commands() for opt in cmd.params
            if isinstance(opt, click.Option) and isinstance(opt.type, click.types.IntParamType)
            and (name, opt.opts[0]) not in SEEDS]


INT_OPTIONS = _int_options()
IDS = [f"{n} {f}" for n, f, _ in INT_OPTIONS]


def test_the_walk_finds_the_known_int_options():
    found = {(name, flag) for name, flag, _ in INT_OPTIONS}
    assert {("extender", "--memory-unit-mib"), ("extender", "--max-body-mib"), ("extender", "--timeout"),
            ("device-plugin", "--memory-unit-mib"), ("inspect", "--fill"), ("plan", "--fill"),
            ("plan", "--limit"), ("plan", "--top"), ("plan", "--max-nodes"), ("plan", "--priority"),
            ("inspect", "--memory-unit-mib"), ("exporter", "--port")} <= found


@pytest.mark.parametrize("name,flag,opt", INT_OPTIONS, ids=IDS)
def test_every_int_option_has_an_upper_end(name, flag, opt):
    assert isinstance(opt.type, WholeRange) and opt.type.max is not None, \
        f"stowage {name} {flag}: use stowage.bounded.WholeRange (IntRange(min=..) takes any size)"


@pytest.mark.parametrize("name,flag,opt", INT_OPTIONS, ids=IDS)
@pytest.mark.parametrize("value", HUGE, ids=["1e30", "2**63", "5000 digits"])
def test_every_int_option_refuses_a_huge_number_by_name_and_briefly(name, flag, opt, value):
    """Refused while parsing, naming the flag; the refusal quotes a long text shortened."""
    said = _refusal(name, [f"{flag}={value}"])
    assert flag in said and len(said) < 300, said[:400]


@pytest.mark.parametrize("variable,name", [("STOWAGE_MEMORY_UNIT_MIB", "device-plugin"),
                                           ("STOWAGE_METRICS_PORT", "device-plugin"),
                                           ("STOWAGE_EXPORTER_PORT", "exporter")])
def test_an_environment_default_is_bounded_as_the_flag_is(variable, name, monkeypatch):
    monkeypatch.setenv(variable, str(10 ** 30))
    assert "10000000000" in _refusal(name, [])


def test_the_extender_timeout_that_crashed_gunicorn_is_refused_as_typed(monkeypatch):
    import extender.cli

    monkeypatch.setattr(extender.cli, "run_server", lambda *a, **k: pytest.fail("served"))
    r = CliRunner().invoke(main, ["extender", "--simulated", "builtin", "--timeout", "1" + "0" * 400])
    assert r.exit_code == 2 and "--timeout" in r.output and "Traceback" not in r.output


def test_whole_numbers_still_parse_within_their_ends():
    t = WholeRange(1, 3600)
    assert t.convert("60", None, None) == 60 and t.convert(7, None, None) == 7 and t.convert(" 0060 ", None, None) == 60
    for bad in ("0", "3601", "soon", "1" * 20):
        with pytest.raises(click.BadParameter):
            t.convert(bad, None, None)
    assert WholeRange(-(2 ** 31), 2 ** 31 - 1).convert("-100", None, None) == -100
    assert len(quoted("9" * 5000)) < MAX_QUOTED + 40


# The benchmarks' argparse commands: every whole-number flag has an upper end too.
# ``python -m benchmarks.binpack --jobs 10**30`` never started (it made a pool of that many
# workers); ``python -m benchmarks.latency.inproc --nodes 10**30`` ended in a traceback.
def _benchmark_parsers():
    import importlib

    return [(m, importlib.import_module(m).build_parser()) for m in (
        "benchmarks.binpack.cli", "benchmarks.binpack.real", "benchmarks.binpack.anatomy", "benchmarks.elastic.cli",
        "benchmarks.latency.cli", "benchmarks.latency.inproc")]


BENCH_INT_FLAGS = [(m, p, a.option_strings[0]) for m, p in _benchmark_parsers() for a in p._actions
                   if a.option_strings and (a.type is int or getattr(a.type, "whole_numbers", False))
                   and a.option_strings[0] != "--seed"]


def test_the_benchmark_walk_finds_the_known_whole_number_flags():
    found = {(m, f) for m, _, f in BENCH_INT_FLAGS}
    assert {("benchmarks.binpack.cli", "--jobs"), ("benchmarks.latency.inproc", "--nodes"),
            ("benchmarks.latency.cli", "--sizes"), ("benchmarks.elastic.cli", "--step")} <= found


@pytest.mark.parametrize("module,parser,flag", BENCH_INT_FLAGS, ids=[f"{m} {f}" for m, _, f in BENCH_INT_FLAGS])
def test_every_benchmark_whole_number_flag_refuses_a_huge_number_by_name(module, parser, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        parser.parse_args([flag, str(10 ** 30)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: " in err and len(err) < 2000


@pytest.mark.parametrize("module,flag", [("benchmarks.binpack.cli", "--jobs"), ("benchmarks.latency.inproc", "--nodes"),
                                         ("benchmarks.latency.cli", "--sizes")])
def test_the_benchmark_numbers_found_by_experiment_are_refused(module, flag, capsys):
    parser = dict(_benchmark_parsers())[module]
    with pytest.raises(SystemExit) as exc:
        parser.parse_args([flag, str(10 ** 30)])
    assert exc.value.code == 2 and f"argument {flag}: " in capsys.readouterr().err
