"""Shared check for the benchmark commands' argument types (benchmarks/cliargs.py)."""
from __future__ import annotations

import argparse

import pytest


def assert_refused_by_name(parser: argparse.ArgumentParser, flag: str, value: str, capsys) -> None:
    """``flag value`` stops the command while parsing (exit 2), naming the flag and the value."""
    with pytest.raises(SystemExit) as exc:
        parser.parse_args([flag, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: " in err and repr(value) in err
