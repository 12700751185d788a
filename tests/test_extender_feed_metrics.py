"""The Kubernetes feed's health on the extender's /metrics: per stream (``kind``: nodes, pods) its
lists, watches, events, errors and relists after a 410 Gone since start, whether it is synced, how
long it has been failing and how long since its last list; and how many nodes and pods the feed
cannot read or count (numbers only: names would make the labels unbounded). Driven by real
list/watch/410/error traffic against the fake API server, read through the real app.

Before: ``KubeFeeder.status()`` had these counters ("for /metrics"), but only the feed's memory
bounds reached /metrics: an operator saw /readyz turn false, but not a stream failing before it
did, nor the 410s, nor the pods whose cards Stowage does not count.
"""
from __future__ import annotations

import functools
import logging

from click.testing import CliRunner
from extender_kube_helpers import FakeClock, feeders, inv_node, kube, make_node, make_pod, new_feeder  # noqa: F401
from fakekube import kubeconfig_file

import extender.kube
from extender.app import create_app
from extender.kube import NODES, PODS
from extender.service import ExtenderService
from stowage.allocation import ALLOCATION_ANNOTATION
from stowage.cli import main
from stowage.inventory import INVENTORY_ANNOTATION
from test_extender_bound_use import scrape

FEED = "stowage_extender_feed_"
KINDS = {NODES, PODS}


def by_kind(m: dict, name: str) -> dict[str, float]:
    """One per-stream family of a scrape (``name`` without ``_total``) as kind -> value."""
    samples = m[FEED + name][1]
    assert all(len(labels) == 1 and labels[0][0] == "kind" for labels in samples)
    return {labels[0][1]: value for labels, value in samples.items()}


def value(m: dict, name: str) -> float:
    """The one sample of an unlabelled family."""
    (only,) = m[FEED + name][1].items()
    assert only[0] == ()
    return only[1]


def app_of(f: extender.kube.KubeFeeder):
    """The extender app over ``f``, wired as ``stowage extender`` wires it in kube mode."""
    return create_app(ExtenderService(f.model), ready=f.ready, feed_bounds=f.bounds, feed_health=f.health)


def test_each_streams_lists_watches_events_errors_and_gone_relists_reach_metrics(kube, feeders):  # noqa: F811
    clock = FakeClock()
    kube.create_node(inv_node("n1", [80, 80]))
    kube.fail_next(2, status=500, path="^/api/v1/pods$", method="GET")   # the first pod list fails twice
    f = new_feeder(kube, clock=clock, stale_after_s=30.0)
    feeders.append(f)
    app = app_of(f)
    m = scrape(app)
    assert by_kind(m, "synced") == {NODES: 0.0, PODS: 0.0}
    assert by_kind(m, "lists") == {NODES: 0.0, PODS: 0.0}
    assert by_kind(m, "last_list_age_seconds") == {}          # unknown before the first list, not 0
    assert value(m, "stale_after_seconds") == 30.0

    f.start()
    kube.wait_for(lambda: f.ready()[0] and all(st.watches >= 1 for st in f.streams.values()))
    clock.t += 50
    m = scrape(app)
    assert by_kind(m, "synced") == {NODES: 1.0, PODS: 1.0}
    assert by_kind(m, "lists") == {NODES: 1.0, PODS: 1.0}
    assert by_kind(m, "errors") == {NODES: 0.0, PODS: 2.0}
    assert by_kind(m, "watches") == {k: float(f.streams[k].watches) for k in KINDS}
    assert by_kind(m, "gone_relists") == {NODES: 0.0, PODS: 0.0}
    assert by_kind(m, "failing_seconds") == {NODES: 0.0, PODS: 0.0}   # the pod list's failures ended with it
    assert by_kind(m, "last_list_age_seconds") == {NODES: 50.0, PODS: 50.0}

    kube.create_pod(make_pod("late"))
    kube.create_node(inv_node("n2", [24]))
    kube.wait_for(lambda: f.streams[PODS].events == 1 and f.streams[NODES].events == 1)
    assert by_kind(scrape(app), "events") == {NODES: 1.0, PODS: 1.0}

    # The API server compacts its history: both watches get 410 Gone, each kind is listed again.
    kube.expire_watches()
    kube.wait_for(lambda: f.streams[PODS].lists == 2 and f.streams[NODES].lists == 2)
    m = scrape(app)
    assert by_kind(m, "gone_relists") == {NODES: 1.0, PODS: 1.0}
    assert by_kind(m, "lists") == {NODES: 2.0, PODS: 2.0}
    assert by_kind(m, "errors") == {NODES: 0.0, PODS: 2.0}            # a 410 is not an error
    assert by_kind(m, "last_list_age_seconds") == {NODES: 0.0, PODS: 0.0}

    # The nodes' watch fails, and goes on failing past stale_after_s: /readyz turns false.
    kube.fail_next(10**6, status=500, path="^/api/v1/nodes$")
    kube.drop_watches("nodes")
    st = f.streams[NODES]
    kube.wait_for(lambda: st.failures >= 2)
    clock.t += 31
    m = scrape(app)
    failing = by_kind(m, "failing_seconds")
    assert failing == {NODES: clock.t - st.failing_since, PODS: 0.0}
    assert failing[NODES] > value(m, "stale_after_seconds")
    assert app.test_client().get("/readyz").status_code == 503
    assert 2 <= by_kind(m, "errors")[NODES] <= st.errors and by_kind(m, "errors")[PODS] == 2.0
    assert by_kind(m, "last_list_age_seconds") == {NODES: 31.0, PODS: 31.0}
    assert by_kind(m, "synced") == {NODES: 1.0, PODS: 1.0}            # synced once: it stays so

    kube.clear_faults()
    kube.create_node(inv_node("n3", [24]))
    kube.wait_for(lambda: "n3" in f.model.index)
    kube.wait_for(lambda: f.ready()[0])
    assert by_kind(scrape(app), "failing_seconds") == {NODES: 0.0, PODS: 0.0}
    assert app.test_client().get("/readyz").status_code == 200


def test_the_nodes_and_pods_the_feed_cannot_read_or_count_are_counted_never_named(kube, feeders):  # noqa: F811
    kube.create_node(inv_node("n1", [80, 80]))
    kube.create_node(make_node("node-with-bad-inventory", gpus=2, annotations={INVENTORY_ANNOTATION: "{not json"}))
    bad = kube.create_pod(make_pod("pod-with-bad-record", gpus=1, node="n1", phase="Running",
                                   annotations={ALLOCATION_ANNOTATION: '{"version": 1, "node": "n1"'}))
    other = kube.create_pod(make_pod("gpu-pod-bound-by-hand", gpus=1, node="n1", phase="Running"))
    f = new_feeder(kube)
    feeders.append(f)
    f.start()
    kube.wait_for(lambda: f.ready()[0])
    app = app_of(f)
    text = app.test_client().get("/metrics").get_data(as_text=True)
    m = scrape(app)
    assert (value(m, "node_errors"), value(m, "pod_errors"), value(m, "unrecorded_gpu_pods")) == (1.0, 1.0, 1.0)
    # The names are in the feed's status() (stowage inspect, the log), never in a label.
    assert set(f.status()["unrecorded_gpu_pods"]) == {other["metadata"]["uid"]}
    for word in ("node-with-bad-inventory", "pod-with-bad-record", "gpu-pod-bound-by-hand",
                 bad["metadata"]["uid"], other["metadata"]["uid"]):
        assert word not in text
    for name, (_, samples) in m.items():
        if name.startswith(FEED):
            assert all(dict(labels).keys() <= {"kind"} and dict(labels).get("kind", NODES) in KINDS
                       for labels in samples), name
    # Counts, not totals: they fall back when the objects are fixed or gone.
    kube.patch_node("node-with-bad-inventory", {"metadata": {"annotations": {INVENTORY_ANNOTATION: None}}})
    kube.delete_pod("default", "pod-with-bad-record")
    kube.delete_pod("default", "gpu-pod-bound-by-hand")
    kube.wait_for(lambda: not any(f.status()[key] for key in ("node_errors", "pod_errors", "unrecorded_gpu_pods")))
    m = scrape(app)
    assert (value(m, "node_errors"), value(m, "pod_errors"), value(m, "unrecorded_gpu_pods")) == (0.0, 0.0, 0.0)


def test_the_help_says_what_each_series_means_and_what_to_alert_on(kube):  # noqa: F811
    m = scrape(app_of(new_feeder(kube)))
    helps = {name[len(FEED):]: help_text for name, (help_text, _) in m.items() if name.startswith(FEED)}
    assert set(helps) == {"lists", "watches", "events", "errors", "gone_relists", "synced", "failing_seconds",
                          "last_list_age_seconds", "stale_after_seconds", "silent_seconds", "silent_after_seconds",
                          "node_errors", "pod_errors", "unrecorded_gpu_pods"}
    assert "/readyz" in helps["failing_seconds"] and "stale_after_seconds" in helps["failing_seconds"]
    assert "--stale-after" in helps["stale_after_seconds"] and "/readyz" in helps["stale_after_seconds"]
    assert "410" in helps["gone_relists"] and "relist" in helps["gone_relists"]
    assert "/readyz" in helps["synced"]
    assert "/readyz" in helps["silent_seconds"] and "silent_after_seconds" in helps["silent_seconds"]
    assert "--stale-after" in helps["silent_after_seconds"] and "watch timeout" in helps["silent_after_seconds"]
    for key in ("node_errors", "pod_errors", "unrecorded_gpu_pods"):
        assert "alert" in helps[key].lower() and "log" in helps[key]
    assert "not counted" in helps["pod_errors"] and "does not count" in helps["unrecorded_gpu_pods"]


def test_kube_mode_serves_the_feeds_health_and_a_simulated_cluster_none(tmp_path, kube):  # noqa: F811
    """What `stowage extender` serves: its feed's series in kube mode; none with --simulated, which
    has no feed (as it has none of the feed's bounds)."""
    from extender.cli import ServeConfig, _build_app
    from extender.gunicorn_conf import run_exit_callbacks
    from extender.simcluster import load_cluster

    kube.create_node(inv_node("n1", [80]))
    cfg = ServeConfig(kubeconfig=kubeconfig_file(tmp_path, kube.url), learned_configmap=None, stale_after_s=45.0)
    app = _build_app(cfg)
    try:
        f = app.extensions["stowage"]["service"].pod_source
        kube.wait_for(lambda: f.ready()[0])
        m = scrape(app)
        assert by_kind(m, "synced") == {NODES: 1.0, PODS: 1.0}
        assert by_kind(m, "lists") == {NODES: 1.0, PODS: 1.0}
        assert by_kind(m, "errors") == {NODES: 0.0, PODS: 0.0}
        assert set(by_kind(m, "last_list_age_seconds")) == KINDS
        assert value(m, "stale_after_seconds") == 45.0
    finally:
        run_exit_callbacks()
    sim = scrape(_build_app(ServeConfig(cluster=load_cluster("builtin"))))
    assert "stowage_extender_nodes" in sim
    assert not [name for name in sim if name.startswith(FEED)]


# ------------------------------------------------------------- the list-learn bound's log line
def stowage_pods(kube, n: int) -> None:  # noqa: F811
    for i in range(n):
        p = make_pod(f"p{i}", gpus=1)
        p["spec"]["schedulerName"] = "stowage-scheduler"
        kube.create_pod(p)


def learn_bound_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "learn copies passed" in r.getMessage()]


def test_the_extenders_list_past_its_learn_bound_names_its_flag(tmp_path, kube, caplog):  # noqa: F811
    from extender.cli import ServeConfig, _build_app
    from extender.gunicorn_conf import run_exit_callbacks

    kube.create_node(inv_node("n1", [80]))
    stowage_pods(kube, 3)
    app = _build_app(ServeConfig(kubeconfig=kubeconfig_file(tmp_path, kube.url), learned_configmap=None,
                                 list_learn_bytes=1))
    try:
        f = app.extensions["stowage"]["service"].pod_source
        kube.wait_for(lambda: f.ready()[0])
    finally:
        run_exit_callbacks()
    (line,) = learn_bound_lines(caplog)
    assert "--list-learn-mib" in line


def test_inspects_list_past_its_learn_bound_names_no_flag_it_does_not_have(tmp_path, kube, caplog,  # noqa: F811
                                                                             monkeypatch):
    """`stowage inspect --learned` and `stowage plan` list the pods with a feeder of their own,
    whose bound no flag of theirs sets: the line named the extender's --list-learn-mib."""
    kube.create_node(inv_node("n1", [80]))
    stowage_pods(kube, 3)
    monkeypatch.setattr(extender.kube, "KubeFeeder", functools.partial(extender.kube.KubeFeeder, list_learn_bytes=1))
    with caplog.at_level(logging.WARNING, logger="stowage.kube"):
        r = CliRunner().invoke(main, ["inspect", "--kubeconfig", kubeconfig_file(tmp_path, kube.url), "--learned",
                                      "--no-cards", "-o", "json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    (line,) = learn_bound_lines(caplog)
    assert "--list-learn-mib" not in line and "extender" not in line


def test_the_seconds_since_the_api_server_last_said_anything_reach_metrics_as_readyz_reads_them(kube, feeders):  # noqa: F811
    """``/readyz``'s second staleness rule: a stream that is not failing but from which nothing has
    come (no event, no bookmark, no end of a watch) for longer than a healthy watch allows
    (2 x the watch timeout + 60 s + ``--stale-after``) is a connection hung somewhere between, and
    the model may be stale. Before, /metrics showed nothing of it: failing_seconds stayed 0 while
    /readyz turned false."""
    clock = FakeClock()
    kube.create_node(inv_node("n1", [80, 80]))
    f = new_feeder(kube, clock=clock, watch_timeout_s=60, stale_after_s=30.0)
    feeders.append(f)
    app = app_of(f)
    m = scrape(app)
    assert by_kind(m, "silent_seconds") == {}                 # unknown before the first list, not 0
    limit = value(m, "silent_after_seconds")
    assert limit == 2 * 60 + 60 + 30.0

    f.start()
    # Until a watch's answer has come (open_since), its arrival counts as word from the API server:
    # a clock moved before it would be undone (seen on a loaded machine).
    kube.wait_for(lambda: f.ready()[0] and all(st.open_since is not None for st in f.streams.values()))
    assert by_kind(scrape(app), "silent_seconds") == {NODES: 0.0, PODS: 0.0}
    clock.t += limit - 1
    m = scrape(app)
    assert by_kind(m, "silent_seconds") == {NODES: limit - 1, PODS: limit - 1}
    assert app.test_client().get("/readyz").status_code == 200
    clock.t += 2                                              # past the bound: /readyz says so, and so do the series
    m = scrape(app)
    assert by_kind(m, "silent_seconds") == {NODES: limit + 1, PODS: limit + 1}
    assert by_kind(m, "failing_seconds") == {NODES: 0.0, PODS: 0.0}   # nothing failed: only silence
    readyz = app.test_client().get("/readyz")
    assert readyz.status_code == 503 and "no word from the API server" in readyz.get_data(as_text=True)

    kube.create_pod(make_pod("late"))                          # the pods' stream speaks again
    kube.wait_for(lambda: f.streams[PODS].events == 1)
    assert by_kind(scrape(app), "silent_seconds") == {NODES: limit + 1, PODS: 0.0}
    assert app.test_client().get("/readyz").status_code == 503
    kube.create_node(inv_node("n2", [24]))
    kube.wait_for(lambda: f.streams[NODES].events == 1)
    assert by_kind(scrape(app), "silent_seconds") == {NODES: 0.0, PODS: 0.0}
    assert app.test_client().get("/readyz").status_code == 200
