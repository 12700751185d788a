"""A simulated cluster file's node names: the ``{i}`` pattern is a file's to give, never code to run.

Found by experiment (session 14): ``parse_cluster`` expanded ``name`` with ``str.format``, so
``"n{i.nope}"`` ended ``stowage inspect --simulated FILE`` in an AttributeError traceback (exit 1),
``"n{i!r:>99999999}"`` built a 100 MB node name (inspect: 83 s, 1.6 GB), and names no Kubernetes
API server would take (``"GPU_{i}"``, 300 characters) were served as node names.
"""
from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from extender.simcluster import SimClusterError, parse_cluster
from stowage.cli import main

GPUS = {"model": "L4", "count": 1, "memory": "24Gi"}


def _doc(name: str, count: int = 2) -> dict:
    return {"nodes": [{"name": name, "count": count, "gpus": GPUS}]}


@pytest.mark.parametrize("pattern,said", [
    ("n{i.nope}", "only {i} or {i:FORMAT}"), ("n{i[0]}", "only {i} or {i:FORMAT}"),
    ("n{j}-{i}", "only {i} or {i:FORMAT}"), ("n{0}-{i}", "only {i} or {i:FORMAT}"),
    ("n{i!r:>99999999}", "only {i} or {i:FORMAT}"), ("n{i:>99999999}", "at most 253"),
    ("n{i:.99999999f}", "at most 253"), ("n{i:{i}}", "only {i} or {i:FORMAT}"),
    ("n{i:q}", "bad pattern"), ("n{i", "bad pattern"),
    ("GPU_{i}", "not a Kubernetes node name"), ("n{i:0>253}", "not a Kubernetes node name"),
    ("-n{i}", "not a Kubernetes node name"), ("n{i:c}", "not a Kubernetes node name"),
])
def test_a_bad_name_pattern_is_the_files_error(pattern, said):
    with pytest.raises(SimClusterError) as exc:
        parse_cluster(_doc(pattern), "my.yaml")
    text = str(exc.value)
    assert text.startswith("my.yaml") and "nodes[0].name" in text and said in text, text
    assert len(text) < 400


def test_a_single_name_is_checked_too():
    with pytest.raises(SimClusterError, match="not a Kubernetes node name"):
        parse_cluster({"nodes": [{"name": "x" * 254, "gpus": GPUS}]}, "my.yaml")


def test_good_patterns_still_expand():
    c = parse_cluster({"nodes": [{"name": "a100-{i:02d}", "count": 2, "gpus": GPUS},
                                 {"name": "rack{i:x}.zone-a", "count": 11, "gpus": GPUS},
                                 {"name": "solo", "gpus": GPUS}]})
    names = [n.name for n in c.nodes]
    assert names[:3] == ["a100-01", "a100-02", "rack1.zone-a"] and names[11:] == ["racka.zone-a", "rackb.zone-a", "solo"]


@pytest.mark.parametrize("cmd", [["inspect", "--simulated"], ["plan", "--shape", "1", "--simulated"],
                                 ["extender", "--simulated"]])
@pytest.mark.parametrize("pattern", ["n{i.nope}", "n{i:>300}"])
def test_the_commands_say_which_entry_is_wrong(tmp_path, cmd, pattern, monkeypatch):
    import extender.cli

    monkeypatch.setattr(extender.cli, "run_server", lambda *a, **k: pytest.fail("served a bad cluster"))
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(_doc(pattern)))
    r = CliRunner().invoke(main, [*cmd, str(f)])
    assert r.exit_code == 1 and "nodes[0].name" in r.output and r.exception is not None
    assert isinstance(r.exception, SystemExit) and "Traceback" not in r.output, r.output
