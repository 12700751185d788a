"""A new user's first hour (session 10 review): each mistake below used to end in a traceback, a
wait, or silence where the user needed one line about the mistake."""
from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

import extender.cli as extender_cli
from stowage.cli import main


@pytest.fixture
def busy_port():
    """A loopback port something else already listens on (a second extender, a forgotten demo)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def no_server(monkeypatch):
    """gunicorn is not started in the test process: reaching it counts as a failure to refuse."""
    started = []
    monkeypatch.setattr(extender_cli, "run_server", lambda *a, **k: started.append(a))
    return started


@pytest.mark.parametrize("flag", ["--bind", "--metrics-bind"])
def test_an_address_in_use_is_one_line_naming_the_flag(busy_port, no_server, flag):
    """--bind in use: gunicorn retried for 5 s, printing 11 lines; --metrics-bind in use: a
    traceback from the worker and "Worker failed to boot", exit 3. Now one line, before anything
    starts, naming the address and the flag to change."""
    args = ["extender", "--simulated", "builtin", flag, f"127.0.0.1:{busy_port}"]
    if flag == "--metrics-bind":
        args += ["--bind", "unix:/nonexistent/never-used.sock"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1, r.output
    assert f"cannot listen on 127.0.0.1:{busy_port} ({flag})" in r.output and "in use" in r.output
    assert not no_server and "Traceback" not in r.output


def test_a_free_address_still_starts(no_server):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()   # free again (nothing listens): the check must not hold it
    r = CliRunner().invoke(main, ["extender", "--simulated", "builtin", "--bind", f"127.0.0.1:{port}"])
    assert r.exit_code == 0, r.output
    assert len(no_server) == 1


def test_plan_refuses_priority_without_preempt():
    """`plan --shape 1 --priority 5` counted the shape as if no priority were given, without a
    word: --priority only means something to --preempt (as --any-model to --drain)."""
    r = CliRunner().invoke(main, ["plan", "--simulated", "--shape", "1", "--priority", "5"])
    assert r.exit_code == 2 and "--priority only applies to --preempt" in r.output
