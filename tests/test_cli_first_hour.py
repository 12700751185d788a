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


def _one_node(**gpus):
    return {"nodes": [{"name": "n", "gpus": {"model": "A100", **gpus}}]}


def test_a_bare_card_memory_too_small_for_a_gpu_says_the_unit():
    """`memory: 80` in a cluster file made 80 MiB cards, without a word, where the pod
    annotation stowage.io/min-card-memory reads a bare 80 as GiB. A bare number is still MiB
    (24576 works), but one below 1 GiB is no GPU: refused, with the fix."""
    from extender.simcluster import SimClusterError, parse_cluster

    with pytest.raises(SimClusterError, match=r"my\.yaml: nodes\[0\]\.gpus\.memory: .*80 MiB.*write 80Gi"):
        parse_cluster(_one_node(count=8, memory=80), "my.yaml")
    assert parse_cluster(_one_node(count=8, memory=24576), "ok").nodes[0].cards[0].memory_mib == 24576
    assert parse_cluster(_one_node(count=8, memory="512Mi"), "ok").nodes[0].cards[0].memory_mib == 512


def test_a_missing_card_count_is_called_missing():
    from extender.simcluster import SimClusterError, parse_cluster

    with pytest.raises(SimClusterError, match=r"nodes\[0\]\.gpus\.count: missing \(cards per node, e\.g\. 8\)"):
        parse_cluster(_one_node(memory="80Gi"), "my.yaml")


def test_extender_help_shows_how_to_start_and_what_log_level_does():
    """`stowage extender --help` listed 30 options without one line that runs it (inspect and plan
    have examples), and --log-level said nothing at all."""
    out = CliRunner().invoke(main, ["extender", "--help"]).output
    assert "stowage extender --simulated builtin" in out and "curl" in out
    assert "stowage extender --in-cluster" in out
    level = out[out.index("--log-level"):]
    assert "bind" in level.split("-h, --help")[0]


@pytest.mark.parametrize("env,args,level", [
    ({"STOWAGE_LOG_LEVEL": "WARNING"}, [], "warning"),   # as the node agents read it
    ({}, ["--log-level", "DEBUG"], "debug"),            # the node agents' spelling
    ({"STOWAGE_LOG_LEVEL": "error"}, ["--log-level", "info"], "info"),   # the flag wins
])
def test_the_extender_reads_its_log_level_as_the_node_agents_do(monkeypatch, env, args, level):
    """The device plugin and the exporter take --log-level or STOWAGE_LOG_LEVEL, in any case; the
    extender took only the flag, in lower case, so one ConfigMap of settings could not serve all."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ctx = extender_cli.serve.make_context("extender", ["--simulated", "builtin", *args])
    assert ctx.params["log_level"] == level


def test_every_option_of_every_subcommand_says_what_it_does():
    """`--help` that helps: `-o/--output` of inspect and plan and the node agents' `--log-level`
    showed only their choices."""
    import importlib

    import click

    from stowage.cli import SUBCOMMANDS
    silent = []
    for name, (target, _) in SUBCOMMANDS.items():
        module, attr = target.split(":")
        cmd = getattr(importlib.import_module(module), attr)
        silent += [f"{name} {p.opts[0]}" for p in cmd.params if isinstance(p, click.Option) and not p.help]
    assert silent == []


@pytest.mark.parametrize("gpus,gpu_memory,cards", [
    (1, 0, "card 0 (1 whole GPU)"),
    (2, 0, "cards 0,1 (2 whole GPUs)"),
    (0, 20, "card 0 (20 GiB of one GPU)"),
])
def test_the_bind_log_line_says_card_or_cards(caplog, gpus, gpu_memory, cards):
    """The extender's one line per bind read "bound default/p -> n cards 0": zero cards, or card
    0? One card is "card 0", several "cards 0,1", with what the pod asked for beside them."""
    import logging

    from extender.service import ExtenderService
    from extender.wire import BindingArgs
    from fakekube import make_pod
    from packing.model import ClusterModel
    from planning_clusters import add_node

    m = ClusterModel()
    add_node(m, "n", 4, 80, "A100")
    svc = ExtenderService(m)
    svc.pod_info(make_pod("p", gpus=gpus, gpu_memory=gpu_memory, uid="uid-p"))
    with caplog.at_level(logging.INFO, logger="stowage.extender"):
        assert svc.bind(BindingArgs("p", "default", "uid-p", "n")) == ""
    assert f"bound default/p -> n {cards}" in [r.getMessage() for r in caplog.records]



def test_plan_drain_says_card_or_cards():
    """`plan --drain` moved a pod "TO a10-05 cards 2": two cards, or card 2? As the bind log."""
    import re

    out = CliRunner().invoke(main, ["plan", "--simulated", "--fill", "80", "--drain"]).output
    targets = re.findall(r"(\S+ cards? [\d,]+)$", out, re.M)
    assert targets, out
    for t in targets:
        word, idx = t.split()[1:]
        assert word == ("card" if len(idx.split(",")) == 1 else "cards"), t


def _run_on_a_terminal(args: list[str], tmp_path) -> tuple[int, str, str]:
    """Run ``stowage ARGS`` with standard error on a pseudo-terminal (stdout a pipe, as in
    ``stowage demo > out.txt``): (exit status, stdout, what the terminal showed)."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios
    from pathlib import Path

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))   # a new pty is 0 columns wide
    p = subprocess.Popen([sys.executable, "-m", "stowage.cli", *args], stdout=subprocess.PIPE, stderr=slave,
                         cwd=Path(__file__).resolve().parent.parent, env={**os.environ, "TMPDIR": str(tmp_path)})
    os.close(slave)
    shown = b""
    try:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:   # EIO: every process holding the terminal has closed it
                break
            if not chunk:
                break
            shown += chunk
        out = p.stdout.read()
        status = p.wait(timeout=120)
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
            p.wait()
    return status, out.decode(), shown.decode(errors="replace")


def test_demo_quiet_still_shows_progress_on_a_terminal(tmp_path):
    """`stowage demo --quiet --pods 5000` printed nothing at all until the end: --quiet dropped the
    progress bar with the per-pod lines. It drops only the lines; the bar stays on a terminal
    (standard error), and a file or pipe gets neither, as before."""
    status, out, shown = _run_on_a_terminal(["demo", "--pods", "20", "--quiet"], tmp_path)
    assert status == 0, out + shown
    assert "/20 [" in shown, shown                  # tqdm's "  5/20 [00:00<00:00, ...pod/s]"
    assert not any(ln.startswith("demo/") for ln in (out + shown).splitlines())
    assert "pods placed" in out


@pytest.mark.parametrize("args,simulated", [
    (["--simulated"], "builtin"),
    (["--simulated", "--bind", "127.0.0.1:9999"], "builtin"),
    (["--simulated", "builtin"], "builtin"),
    (["--simulated", "my-cluster.yaml"], "my-cluster.yaml"),
])
def test_simulated_reads_the_same_on_every_command(args, simulated):
    """`stowage inspect --simulated` and `stowage plan --simulated` mean the built-in cluster;
    `stowage extender --simulated` said "requires an argument", and `--simulated --bind ADDR`
    took "--bind" for a file name. The extender now reads it as they do (a FILE still wins)."""
    from stowage_ops.inspect_cmd import inspect
    from stowage_ops.plan_cmd import plan

    assert extender_cli.serve.make_context("extender", list(args)).params["simulated"] == simulated
    for cmd in (inspect, plan):
        extra = [a for a in args if a not in ("--bind", "127.0.0.1:9999")]
        assert cmd.make_context(cmd.name, [*extra, "--shape", "1"] if cmd is plan else extra
                                ).params["simulated"] == simulated
    # `stowage demo` calls its cluster --cluster; it takes --simulated too, as the others read it.
    from extender.demo import demo
    assert demo.make_context("demo", [a for a in args if a not in ("--bind", "127.0.0.1:9999")]
                             ).params["cluster_file"] == simulated
