"""The `stowage` entry point: a subcommand whose module cannot be imported says so and why."""
from __future__ import annotations

from click.testing import CliRunner

from stowage import cli


def test_unimportable_subcommand_explains_itself(monkeypatch):
    monkeypatch.setitem(cli.SUBCOMMANDS, "broken", ("no_such_module_here:main", "A command that cannot load."))
    result = CliRunner().invoke(cli.main, ["broken"])
    assert result.exit_code == 1, result.output
    assert "'stowage broken' is unavailable in this installation" in result.output
    assert "no_such_module_here" in result.output
    assert "broken" in CliRunner().invoke(cli.main, ["--help"]).output   # still listed, with its help
