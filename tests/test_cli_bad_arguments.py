"""Operator mistakes on the command line get a message about the mistake (new-user review):
a malformed --bind was refused as 'reachable from other machines'; a cluster file that is not
text ended in a UnicodeDecodeError traceback; `demo --cluster builtin` failed late although
every other command takes `builtin`; `demo --startup-timeout -1` was accepted."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from stowage.cli import main


@pytest.mark.parametrize("bind", ["nonsense", "127.0.0.1:99999", "127.0.0.1:", "127.0.0.1:\u00b2"])
def test_a_malformed_bind_is_named_as_malformed(bind):
    r = CliRunner().invoke(main, ["extender", "--bind", bind, "--simulated", "builtin"])
    assert r.exit_code == 2 and "HOST:PORT" in r.output and "other machines" not in r.output


@pytest.mark.parametrize("cmd", [["inspect", "--simulated"], ["demo", "--cluster"]])
def test_a_cluster_file_that_is_not_text_is_one_clear_line(tmp_path, cmd):
    f = tmp_path / "binary.yaml"
    f.write_bytes(b"\xff\xfe\x00\x81garbage")
    r = CliRunner().invoke(main, [*cmd, str(f)])
    assert r.exit_code == 1 and "not UTF-8 text" in r.output and "Traceback" not in r.output


def test_demo_takes_builtin_like_the_other_commands(monkeypatch):
    import extender.demo as demo

    seen = {}

    class Stop(Exception):
        pass

    def fake_process(cluster_arg, **kwargs):
        seen["arg"] = cluster_arg
        raise Stop

    monkeypatch.setattr(demo, "ExtenderProcess", fake_process)
    r = CliRunner().invoke(main, ["demo", "--cluster", "builtin", "--pods", "1"])
    assert isinstance(r.exception, Stop) and seen["arg"] == "builtin"


def test_demo_refuses_a_negative_startup_timeout():
    r = CliRunner().invoke(main, ["demo", "--startup-timeout", "-1"])
    assert r.exit_code == 2 and "--startup-timeout" in r.output


def test_demo_failure_summary_counts_nodes_not_kinds_of_reason():
    from extender.demo import summarize_failures
    ans = {"FailedNodes": {f"n{i}": r for i, r in enumerate(["a"] * 16 + ["b"] * 12 + ["c"] * 6 + ["d", "e"])}}
    text = summarize_failures(36, ans)
    assert text == "0/36 nodes are available: 16 a, 12 b, 6 c, 2 for 2 other reasons"


def test_plan_names_a_model_no_card_is():
    r = CliRunner().invoke(main, ["plan", "--simulated", "--shape", "1@Z9000", "--shape", "1@H100"])
    assert r.exit_code == 0, r.output
    assert "no card of this cluster is a Z9000 (models here:" in r.output
    assert r.output.count("no card of this cluster") == 1


@pytest.mark.parametrize("extra", [["--record-key-file", "/nonexistent/key"], ["--scheduler-name", "other"],
                                   ["--stale-after", "30"], ["--learned-configmap", "off"],
                                   ["--learned-interval", "5"], ["--bind-outcome-hold", "300"]])
def test_the_extender_refuses_kube_mode_options_on_a_simulated_cluster(extra, monkeypatch):
    """They were silently ignored with --simulated (inspect and plan already refused theirs)."""
    import extender.cli as cli

    monkeypatch.setattr(cli, "run_server", lambda cfg, *a, **k: None)  # never serve, even if not refused
    r = CliRunner().invoke(main, ["extender", "--simulated", "builtin", *extra])
    assert r.exit_code == 2, r.output
    assert extra[0] in r.output and "kube mode" in r.output


def test_a_kube_mode_variable_in_the_environment_does_not_stop_a_simulated_extender(monkeypatch):
    """Only what was typed is refused: an exported STOWAGE_SCHEDULER_NAMES is not a mistake here."""
    import extender.cli as cli

    seen = {}
    monkeypatch.setenv("STOWAGE_SCHEDULER_NAMES", "other")
    monkeypatch.setattr(cli, "run_server", lambda cfg, *a, **k: seen.setdefault("cfg", cfg))
    r = CliRunner().invoke(main, ["extender", "--simulated", "builtin"])
    assert r.exit_code == 0, r.output
    assert seen["cfg"].cluster is not None
