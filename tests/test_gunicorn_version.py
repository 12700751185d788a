"""The extender's worker (extender/intake.py, GuardedWorker) builds on gthread internals that
gunicorn has had only since 26.0 (``pending_conns`` and ``murder_pending``; ``method_queue``
since 24.0), but pyproject.toml asked for gunicorn>=22: with 22-25 installed the extender
started and then failed inside its worker with an AttributeError (found in review, session 15,
by reading each release's gthread.py). Now the declared minimum is the one the code needs, and
the extender refuses to start on an older gunicorn with a message that says so."""
from __future__ import annotations

import re
from pathlib import Path

import gunicorn
import pytest
from gunicorn.workers.gthread import ThreadWorker

from extender import intake
from extender.gunicorn_conf import ExtenderServer, gunicorn_options

ROOT = Path(__file__).resolve().parent.parent


def test_the_declared_minimum_is_the_one_the_worker_needs():
    # (read as text: tomllib is 3.11+, the project supports 3.10)
    specs = re.findall(r'^\s*"(gunicorn[^"]*)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert len(specs) == 1, specs
    m = re.fullmatch(r"gunicorn>=(\d+)(?:\.(\d+))?", specs[0].replace(" ", ""))
    assert m, specs[0]
    assert (int(m.group(1)), int(m.group(2) or 0)) == intake.MIN_GUNICORN


def test_the_installed_gunicorn_has_what_the_worker_builds_on():
    assert hasattr(ThreadWorker, "murder_pending") and hasattr(ThreadWorker, "finish_request")
    intake.check_gunicorn()   # does not raise here
    assert tuple(gunicorn.version_info[:2]) >= intake.MIN_GUNICORN


@pytest.mark.parametrize("old", [(22, 0, 0), (23, 0, 0), (25, 3, 0)])
def test_an_older_gunicorn_is_refused_before_serving_with_a_clear_message(monkeypatch, old):
    monkeypatch.setattr(gunicorn, "version_info", old)
    with pytest.raises(RuntimeError) as exc:
        ExtenderServer(lambda: None, gunicorn_options("127.0.0.1:1", 1, "warning"))
    text = str(exc.value)
    assert f"gunicorn {'.'.join(map(str, old))}" in text and "gunicorn>=26" in text


def test_the_extender_command_says_so_in_one_line(monkeypatch):
    from click.testing import CliRunner

    from stowage.cli import main

    monkeypatch.setattr(gunicorn, "version_info", (23, 0, 0))
    r = CliRunner().invoke(main, ["extender", "--simulated", "builtin", "--bind", "127.0.0.1:1"])
    assert r.exit_code == 1, r.output
    assert "Error: gunicorn 23.0.0 is installed" in r.output and "Traceback" not in r.output
