"""The extender, the device plugin and `stowage inspect`/`plan` read the same options the same way
when they decide which allocation records count: ``--record-key-file`` (env
STOWAGE_RECORD_KEY_FILE) and ``--scheduler-name`` (env STOWAGE_SCHEDULER_NAMES, space separated),
with the same default (``stowage-scheduler``) and the same one-line error for a key that cannot be
used. Before, the device plugin built its trust with its own copy of the default, and only it read
STOWAGE_SCHEDULER_NAMES: the same environment gave the plugin and the extender different ideas of
whose records count, so the plugin refused pods the extender had placed (or the other way round).

Each command runs through its real click entry point up to the moment it would start serving or
read the cluster; the test takes the configuration it built there and asks it for its trust.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
from click.testing import CliRunner
from fakekube import kubeconfig_file

from stowage.allocation import RecordKey, RecordTrust
from stowage.cli import main

SECRET = b"s" * 40


class Captured(Exception):
    """Raised by the stand-in for what each command would run next: the command stops there."""

    def __init__(self, trust: Callable[[], RecordTrust]) -> None:
        super().__init__("captured")
        self.trust = trust


def _extender(monkeypatch: Any, tmp_path: Any) -> list[str]:
    import extender.cli

    def run_server(cfg: Any, **_: Any) -> None:
        raise Captured(cfg.trust)
    monkeypatch.setattr(extender.cli, "run_server", run_server)
    return ["extender", "--kubeconfig", kubeconfig_file(tmp_path, "http://127.0.0.1:9"), "--bind", "127.0.0.1:8888"]


def _device_plugin(monkeypatch: Any, tmp_path: Any) -> list[str]:
    import deviceplugin.server

    class Plugin:
        def __init__(self, cfg: Any, nvml: Any = None) -> None:
            raise Captured(cfg.trust)
    monkeypatch.setattr(deviceplugin.server, "DevicePlugin", Plugin)
    return ["device-plugin", "--no-kube", "--plugin-dir", str(tmp_path / "dp")]


def _inspect(monkeypatch: Any, tmp_path: Any) -> list[str]:
    import stowage_ops.inspect_cmd

    def load(source: Any, **_: Any) -> None:
        raise Captured(source.trust)
    monkeypatch.setattr(stowage_ops.inspect_cmd, "load", load)
    return ["inspect", "--kubeconfig", kubeconfig_file(tmp_path, "http://127.0.0.1:9")]


COMMANDS = {"extender": _extender, "device-plugin": _device_plugin, "inspect": _inspect}


def trust_of(command: str, monkeypatch: Any, tmp_path: Any, *args: str) -> RecordTrust:
    argv = COMMANDS[command](monkeypatch, tmp_path)
    r = CliRunner().invoke(main, [*argv, *args])
    assert isinstance(r.exception, Captured), (r.exit_code, r.output, r.exception)
    return r.exception.trust()


def trusts(monkeypatch: Any, tmp_path: Any, *args: str) -> dict[str, RecordTrust]:
    return {c: trust_of(c, monkeypatch, tmp_path, *args) for c in COMMANDS}


def test_the_defaults_are_the_same_everywhere(monkeypatch, tmp_path):
    monkeypatch.delenv("STOWAGE_RECORD_KEY_FILE", raising=False)
    monkeypatch.delenv("STOWAGE_SCHEDULER_NAMES", raising=False)
    got = trusts(monkeypatch, tmp_path)
    assert set(got.values()) == {RecordTrust(scheduler_names=frozenset({"stowage-scheduler"}))}, got


def test_the_same_environment_gives_the_same_trust_in_every_command(monkeypatch, tmp_path):
    key_file = tmp_path / "record.key"
    key_file.write_bytes(SECRET + b"\n")
    monkeypatch.setenv("STOWAGE_RECORD_KEY_FILE", str(key_file))
    monkeypatch.setenv("STOWAGE_SCHEDULER_NAMES", "gpu-a gpu-b")
    got = trusts(monkeypatch, tmp_path)
    assert set(got.values()) == {RecordTrust(RecordKey(SECRET), scheduler_names=frozenset({"gpu-a", "gpu-b"}))}, got


def test_the_flags_win_over_the_environment_everywhere(monkeypatch, tmp_path):
    key_file = tmp_path / "record.key"
    key_file.write_bytes(SECRET)
    monkeypatch.setenv("STOWAGE_RECORD_KEY_FILE", str(tmp_path / "absent.key"))
    monkeypatch.setenv("STOWAGE_SCHEDULER_NAMES", "from-env")
    got = trusts(monkeypatch, tmp_path, "--record-key-file", str(key_file), "--scheduler-name", "flag-a",
                 "--scheduler-name", "flag-b", "--memory-unit-mib", "2048")
    assert set(got.values()) == {RecordTrust(RecordKey(SECRET), 2048, frozenset({"flag-a", "flag-b"}))}, got


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_key_file_that_cannot_be_used_is_the_same_one_line_error_everywhere(monkeypatch, tmp_path, how):
    short = tmp_path / "short.key"
    short.write_text("too short\n")
    for path in (short, tmp_path / "absent.key"):
        errors = {}
        for command, prepare in COMMANDS.items():
            argv = prepare(monkeypatch, tmp_path)
            if how == "flag":
                monkeypatch.delenv("STOWAGE_RECORD_KEY_FILE", raising=False)
                argv += ["--record-key-file", str(path)]
            else:
                monkeypatch.setenv("STOWAGE_RECORD_KEY_FILE", str(path))
            r = CliRunner().invoke(main, argv)
            assert r.exit_code == 2 and not isinstance(r.exception, Captured), (command, r.output)
            lines = [line for line in r.output.splitlines() if line.startswith("Error")]
            assert len(lines) == 1 and "Traceback" not in r.output, (command, r.output)
            errors[command] = lines[0]
        assert len(set(errors.values())) == 1, errors
        line = errors["extender"]
        assert "--record-key-file" in line and str(path) in line
        assert ("at least 32" in line) if path == short else ("cannot read the record key file" in line)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_names_both_environment_variables(command):
    r = CliRunner().invoke(main, [command, "--help"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "STOWAGE_RECORD_KEY_FILE" in text and "STOWAGE_SCHEDULER_NAMES" in text, r.output
