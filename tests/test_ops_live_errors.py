"""`stowage inspect` / `stowage plan` on a live cluster: what the operator reads when something
is wrong with the connection or the options (found by a new-user review: raw client exceptions,
advice to pass --kubeconfig when it was given, contradictory options silently ignored)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner
from fakekube import FakeKube, kubeconfig_file

from stowage.cli import main


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_a_kubeconfig_that_does_not_exist_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    r = run("inspect", "--kubeconfig", str(tmp_path / "none"))
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"{tmp_path / 'none'} does not exist" in r.output
    assert "Pass --kubeconfig" not in r.output                      # it was passed
    assert r.output.count("simulated") == 1                          # one hint, not two


def test_a_file_that_is_not_a_kubeconfig_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    bad = tmp_path / "passwd"
    bad.write_text("root:x:0:0:root:/root:/bin/bash\n")
    r = run("inspect", "--kubeconfig", str(bad))
    assert r.exit_code == 1 and "is not a kubeconfig" in r.output and "item assignment" not in r.output


def test_forbidden_says_which_permission_is_missing(tmp_path):
    with FakeKube() as kube:
        kube.fail_next(10, status=403)
        r = run("inspect", "--kubeconfig", kubeconfig_file(tmp_path, kube.url))
    assert r.exit_code == 1
    assert "HTTP 403" in r.output and "list" in r.output and "nodes and pods" in r.output
    assert "HTTPHeaderDict" not in r.output and "docs/kube.md" in r.output


def test_the_server_being_read_is_said_before_waiting_for_it(tmp_path):
    with FakeKube() as kube:
        url = kube.url
        r = CliRunner().invoke(main, ["inspect", "--kubeconfig", kubeconfig_file(tmp_path, url)])
    assert r.exit_code == 0 and f"reading nodes and pods from {url}" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (("inspect", "--in-cluster", "--kubeconfig", "/etc/hosts"), "--kubeconfig and --in-cluster"),
    (("plan", "--simulated", "--any-model", "--shape", "1"), "--any-model only applies to --drain"),
    (("plan", "--simulated", "--max-nodes", "2", "--shape", "1"), "--max-nodes only applies to --drain"),
    (("plan", "--simulated", "--learned-configmap", "foo", "--shape", "1"), "--learned-configmap"),
    (("plan", "--simulated", "--scheduler-name", "x", "--shape", "1"), "--scheduler-name"),
    (("inspect", "--simulated", "--learned-configmap", "foo"), "--learned-configmap"),
    (("inspect", "--simulated", "--record-key-file", "/etc/hostname"), "--record-key-file describes a live cluster"),
    (("plan", "--simulated", "--record-key-file", "/etc/hostname", "--shape", "1"),
     "--record-key-file describes a live cluster"),
])
def test_options_that_would_be_ignored_are_refused(args, needle):
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert needle in r.output
