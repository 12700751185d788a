"""Each of the extender's memory bounds says what it holds and what passing it dropped (the feed's
``status()``, the service's ``bounds()``, ``/metrics``), and its bytes are set on the command line.

Before: past a bound the extender dropped copies (the pending pods kept for bind, the pod cache,
the learned pods) or showed a list's pods to the placers out of order (the list's learn copies),
and said so at most once in its log (the last not at all): an operator of a big cluster could not
see a bound coming, nor what passing it had cost, nor raise it without editing code.
"""
from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from extender.app import create_app
from extender.kube import LIST_LEARN_BYTES, creation_order
from extender.kube_objects import pod_for_learn
from extender.learned_uids import LEARNED_BYTES, LEARNED_ENTRIES
from extender.pending_pods import PENDING_BYTES, PENDING_ENTRIES, pack
from extender.service import POD_CACHE_BYTES, POD_CACHE_ENTRIES, ExtenderService
from extender_harness import gpus, model_from
from extender_kube_helpers import kube, new_feeder  # noqa: F401
from stowage.cli import main
from stowage.resources import MAX_CONTAINERS_PER_POD
from test_extender_learned_bounds import crafted, pod
from test_extender_pending_bounds import _Batch, pending

USE_KEYS = {"entries", "max_entries", "bytes", "max_bytes", "dropped"}


def test_the_feed_status_says_what_the_pending_pods_hold_and_dropped(kube):  # noqa: F811
    f = new_feeder(kube, pending_entries=50, pending_bytes=3 << 20)
    assert f.status()["bounds"]["pending_pods"] == {"entries": 0, "max_entries": 50, "bytes": 0,
                                                    "max_bytes": 3 << 20, "dropped": 0}
    for i in range(120):
        f._apply_pod(pending(i))
    assert f.status()["bounds"]["pending_pods"] == {"entries": 50, "max_entries": 50, "bytes": f._pending.bytes_used,
                                                    "max_bytes": 3 << 20, "dropped": 70}
    assert 0 < f._pending.bytes_used < 3 << 20
    # The defaults are the library's.
    assert new_feeder(kube).status()["bounds"]["pending_pods"]["max_bytes"] == PENDING_BYTES
    assert new_feeder(kube).status()["bounds"]["pending_pods"]["max_entries"] == PENDING_ENTRIES


@pytest.mark.parametrize("page_size", [1000, 7])   # 1000: the whole list in one page
def test_a_list_past_its_learn_bytes_is_counted_with_the_most_it_held(kube, page_size, caplog):  # noqa: F811
    """Each batch of a list's pods shown to the placers before the list's end (its learn copies
    passed ``list_learn_bytes``) is counted, and the most the copies of a list held at once is
    said: how near a list comes to the bound, and how often it passed it."""
    pods = []
    for i in range(60):
        p = pending(i, containers=MAX_CONTAINERS_PER_POD - 1 if i % 3 == 0 else 0)
        p["metadata"]["creationTimestamp"] = f"2024-05-01T10:{(i * 7) % 60:02d}:00Z"
        pods.append(kube.create_pod(p, emit=False))
    biggest = max(sys.getsizeof(pack(pod_for_learn(p))) for p in pods) + 1024
    budget = 4 * biggest
    f = new_feeder(kube, page_size=page_size, list_learn_bytes=budget, list_learn_flag="--list-learn-mib")
    batches: list[list[dict]] = [[]]
    f.learning_in_bulk = lambda: _Batch(batches)
    f.on_pod_seen = lambda pod: batches[-1].append(pod)
    assert f.status()["bounds"]["list_learn"] == {"max_bytes": budget, "peak_bytes": 0, "early_batches": 0}
    f.sync_once()
    shown = [b for b in batches if b]
    assert len(shown) > 3 and all(b == sorted(b, key=creation_order) for b in shown)
    use = f.status()["bounds"]["list_learn"]
    assert use["early_batches"] == len(shown) - 1      # the last batch is the list's end
    assert budget < use["peak_bytes"] <= budget + biggest and use["max_bytes"] == budget
    f.sync_once()                                      # counted since start
    assert f.status()["bounds"]["list_learn"]["early_batches"] == 2 * (len(shown) - 1)
    assert len([r for r in caplog.records if "--list-learn-mib" in r.getMessage()]) == 1   # said once
    # Within the bound: one batch at the end, nothing counted, the most held said.
    g = new_feeder(kube, page_size=page_size)
    g.on_pod_seen = lambda pod: None
    g.sync_once()
    use = g.status()["bounds"]["list_learn"]
    assert use["early_batches"] == 0 and 60 * 500 < use["peak_bytes"] < budget * 60
    assert use["max_bytes"] == LIST_LEARN_BYTES


def service(**kw) -> ExtenderService:
    return ExtenderService(model_from({"nodes": [{"name": "n1", "gpus": gpus("Tesla T4", 4, "16Gi")}]}), **kw)


def test_the_service_says_what_its_pod_cache_and_learned_pods_hold_and_dropped():
    s = service()
    assert s.bounds() == {
        "pod_cache": {"entries": 0, "max_entries": POD_CACHE_ENTRIES, "bytes": 0, "max_bytes": POD_CACHE_BYTES,
                      "dropped": 0},
        "learned_pods": {"entries": 0, "max_entries": LEARNED_ENTRIES, "bytes": s._learned.bytes_used,
                         "max_bytes": LEARNED_BYTES, "dropped": 0}}
    s = service(pod_cache_size=3, pod_cache_bytes=5 << 20, learned_bytes=64 << 10)
    for i in range(8):
        s.pod_info(crafted(i))
    use = s.bounds()
    assert use["pod_cache"] == {"entries": 3, "max_entries": 3, "bytes": s.pod_cache_bytes_used,
                                "max_bytes": 5 << 20, "dropped": 5}
    assert use["learned_pods"] == {"entries": len(s._learned), "max_entries": 3, "bytes": s._learned.bytes_used,
                                   "max_bytes": 64 << 10, "dropped": s._learned.forgotten}
    assert s._learned.forgotten == 8 - len(s._learned) > 0
    s._forget(uid_of(crafted(7)))   # bound: forgotten, not dropped
    assert s.bounds()["pod_cache"]["entries"] == 2 and s.bounds()["pod_cache"]["dropped"] == 5


def uid_of(p: dict) -> str:
    return p["metadata"]["uid"]


def scrape(app) -> dict[str, tuple[str, dict[tuple, float]]]:
    """/metrics as name -> (HELP, {labels: value})."""
    text = app.test_client().get("/metrics").get_data(as_text=True)
    out = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = (fam.documentation, {tuple(sorted(s.labels.items())): s.value for s in fam.samples
                                             if not s.name.endswith("_created")})
    return out


def test_metrics_export_every_bound_and_say_what_passing_it_costs(kube):  # noqa: F811
    f = new_feeder(kube, pending_entries=2)
    for i in range(5):
        f._apply_pod(pending(i))
    s = service(pod_cache_size=2)
    for i in range(3):
        s.pod_info(pod(i))
    m = scrape(create_app(s, feed_bounds=f.bounds))
    b = lambda name: ("bound", name)  # noqa: E731
    help_dropped, dropped = m["stowage_extender_bound_dropped"]
    # (the learned pods' entries are bounded as the pod cache's)
    assert dropped == {(b("pending_pods"),): 3.0, (b("pod_cache"),): 1.0, (b("learned_pods"),): 1.0}
    for words in ("GET at bind", "not requeued", "learned twice", "departed"):
        assert words in help_dropped
    assert m["stowage_extender_bound_entries"][1] == {(b("pending_pods"),): 2.0, (b("pod_cache"),): 2.0,
                                                      (b("learned_pods"),): 2.0}
    assert m["stowage_extender_bound_max_entries"][1][(b("pending_pods"),)] == 2.0
    assert m["stowage_extender_bound_bytes"][1] == {(b("pending_pods"),): float(f._pending.bytes_used),
                                                    (b("pod_cache"),): float(s.pod_cache_bytes_used),
                                                    (b("learned_pods"),): float(s._learned.bytes_used)}
    assert m["stowage_extender_bound_max_bytes"][1] == {
        (b("pending_pods"),): float(PENDING_BYTES), (b("pod_cache"),): float(POD_CACHE_BYTES),
        (b("learned_pods"),): float(LEARNED_BYTES), (b("list_learn"),): float(LIST_LEARN_BYTES)}
    assert "--pending-pods-mib" in m["stowage_extender_bound_max_bytes"][0]
    assert m["stowage_extender_list_learn_early_batches"][1] == {(): 0.0}
    assert "creation order" in m["stowage_extender_list_learn_early_batches"][0]
    assert m["stowage_extender_list_learn_peak_bytes"][1] == {(): 0.0}


def test_without_a_feed_metrics_export_the_services_bounds_only():
    m = scrape(create_app(service()))
    assert set(m["stowage_extender_bound_max_bytes"][1]) == {(("bound", "pod_cache"),), (("bound", "learned_pods"),)}
    assert "stowage_extender_list_learn_peak_bytes" not in m


# ------------------------------------------------------------------------------------- the flags
FLAGS = {"--pod-cache-mib": ("pod_cache_bytes", POD_CACHE_BYTES), "--learned-pods-mib": ("learned_bytes", LEARNED_BYTES),
         "--pending-pods-mib": ("pending_bytes", PENDING_BYTES),
         "--list-learn-mib": ("list_learn_bytes", LIST_LEARN_BYTES)}


def served(monkeypatch, *args: str):
    """The ServeConfig `stowage extender ARGS` would serve (nothing is served), and the result."""
    import extender.cli as cli

    seen = {}
    monkeypatch.setattr(cli, "run_server", lambda cfg, *a, **k: seen.setdefault("cfg", cfg))
    r = CliRunner().invoke(main, ["extender", *args])
    return seen.get("cfg"), r


def test_the_bounds_are_set_in_mib_on_the_command_line(monkeypatch, tmp_path):
    cfg, r = served(monkeypatch, "--simulated", "builtin")
    assert r.exit_code == 0, r.output
    assert {field: getattr(cfg, field) for field, _ in FLAGS.values()} == {f: d for f, d in FLAGS.values()}
    cfg, r = served(monkeypatch, "--simulated", "builtin", "--pod-cache-mib", "512", "--learned-pods-mib", "200")
    assert r.exit_code == 0, r.output
    assert cfg.pod_cache_bytes == 512 << 20 and cfg.learned_bytes == 200 << 20


@pytest.mark.parametrize("flag", list(FLAGS))
@pytest.mark.parametrize("value", ["0", "-5", "16385", "lots"])
def test_a_bound_out_of_range_is_refused_naming_its_flag(monkeypatch, flag, value):
    cfg, r = served(monkeypatch, "--simulated", "builtin", flag, value)
    assert r.exit_code == 2 and cfg is None
    assert f"Invalid value for '{flag}'" in r.output and "Traceback" not in r.output
    if value != "lots":
        assert "1<=x<=16384" in r.output


@pytest.mark.parametrize("flag", ["--pending-pods-mib", "--list-learn-mib"])
def test_the_feeds_bounds_are_refused_on_a_simulated_cluster(monkeypatch, flag):
    """A simulated cluster has no feed: they would be ignored without a word."""
    cfg, r = served(monkeypatch, "--simulated", "builtin", flag, "100")
    assert r.exit_code == 2 and cfg is None and flag in r.output and "kube mode" in r.output


def test_help_says_what_each_bound_holds_and_what_passing_it_costs():
    text = " ".join(CliRunner().invoke(main, ["extender", "--help"], terminal_width=400).output.split())
    for flag, (_, default) in FLAGS.items():
        assert flag in text and f"[default: {default >> 20}; 1<=x<=16384]" in text.replace("\n", " ")
    for words in ("GET at bind", "not requeued", "learned twice", "creation order"):
        assert words in text


def test_the_flags_reach_the_feed_and_the_service(tmp_path, kube):  # noqa: F811
    """What the command line sets is what bounds the running extender (its /metrics say so)."""
    from extender.cli import ServeConfig, _build_app
    from extender.gunicorn_conf import run_exit_callbacks
    from fakekube import kubeconfig_file

    cfg = ServeConfig(kubeconfig=kubeconfig_file(tmp_path, kube.url), learned_configmap=None,
                      pod_cache_bytes=3 << 20, learned_bytes=5 << 20, pending_bytes=7 << 20, list_learn_bytes=9 << 20)
    app = _build_app(cfg)
    try:
        s = app.extensions["stowage"]["service"]
        f = s.pod_source
        assert (s._cache_bytes, s._learned.max_bytes, f._pending.max_bytes, f.list_learn_bytes) == \
               (3 << 20, 5 << 20, 7 << 20, 9 << 20)
        assert scrape(app)["stowage_extender_bound_max_bytes"][1] == {
            (("bound", "pod_cache"),): 3 << 20, (("bound", "learned_pods"),): 5 << 20,
            (("bound", "pending_pods"),): 7 << 20, (("bound", "list_learn"),): 9 << 20}
    finally:
        run_exit_callbacks()


def test_the_bind_outcome_hold_reaches_the_service(tmp_path, kube):  # noqa: F811
    """--bind-outcome-hold: how long a Binding answered 5xx (or lost) keeps its cards while the pod
    reads unbound; an API server whose --request-timeout is longer than the default's 60 s needs
    more than the default 120 s, else a late Binding lands on cards given to another pod."""
    import socket

    from click.testing import CliRunner

    import extender.cli as cli
    from extender.cli import ServeConfig, _build_app
    from extender.gunicorn_conf import run_exit_callbacks
    from extender.service import UNKNOWN_OUTCOME_HOLD_S
    from fakekube import kubeconfig_file
    from stowage.cli import main

    seen: dict = {}
    kubeconfig = kubeconfig_file(tmp_path, kube.url)
    original = cli.run_server
    try:
        cli.run_server = lambda cfg, **kw: seen.setdefault("cfg", cfg)
        for args, want in (([], UNKNOWN_OUTCOME_HOLD_S), (["--bind-outcome-hold", "300"], 300.0)):
            seen.clear()
            with socket.socket() as free:   # a port nothing listens on (the command checks it can)
                free.bind(("127.0.0.1", 0))
                port = free.getsockname()[1]
            r = CliRunner().invoke(main, ["extender", "--kubeconfig", kubeconfig, "--bind", f"127.0.0.1:{port}",
                                          "--learned-configmap", "off", *args])
            assert r.exit_code == 0, r.output
            assert seen["cfg"].bind_outcome_hold_s == want
    finally:
        cli.run_server = original
    app = _build_app(ServeConfig(kubeconfig=kubeconfig, learned_configmap=None, bind_outcome_hold_s=300.0))
    try:
        assert app.extensions["stowage"]["service"].unknown_outcome_hold_s == 300.0
    finally:
        run_exit_callbacks()
