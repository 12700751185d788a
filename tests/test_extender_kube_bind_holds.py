"""How a "bind outcome unknown" hold ends (ExtenderService._hold_unknown) when nothing about the
pod itself ends it: its time is up while the feed no longer keeps the pod's pending copy (the
copies are bounded: extender/pending_pods.py), or the pod finished while it was held.

Wired as ``stowage extender`` wires them (the service, the real KubeBinder and the feed, against
the fake API server). Found by experiment: a lapsed hold of a pod whose copy was dropped was
released only by a bind of that pod to another node, so in a cluster with no other room its
cards stayed booked for as long as the pod lived (its own filter kept finding them taken); and a
pod that finished while held left its entry in the hold table.
"""
from __future__ import annotations

import logging
import time

import pytest
from extender_kube_helpers import FakeClock, FakeKube, make_pod, new_feeder
from test_extender_kube_bind_faults import kube  # noqa: F401  (the fixture: one 80 GiB card on each of n1, n2)
from test_extender_kube_bind_faults import bind, caught_up, filter_nodes, gpu_pod, rec, snapshot

from extender.cli import connect_feed
from extender.kube_binder import KubeBinder
from extender.service import ExtenderService
from extender_harness import simple_placers
from stowage.allocation import ALLOCATION_ANNOTATION

GiB = 1024


def extender(kube: FakeKube, clock=None, hold_s: float = 120.0, pending_entries: int = 2):
    """(feeder, service), started; the feed keeps at most ``pending_entries`` pending copies."""
    f = new_feeder(kube, pending_entries=pending_entries)
    svc = ExtenderService(f.model, binder=KubeBinder(kube.api_client(), readback_attempts=1, readback_delay_s=0),
                          pod_source=f, placer_factory=simple_placers, clock=clock or FakeClock(),
                          unknown_outcome_hold_s=hold_s)
    connect_feed(f, svc)
    f.start()
    kube.wait_for(lambda: f.ready()[0])
    return f, svc


def held_never_applied(kube: FakeKube, svc: ExtenderService, pod: dict, node: str) -> None:
    """Bind ``pod`` to ``node``: answered 504, and the API server never applies it."""
    kube.hold_bindings(1, status=504)
    assert "504" in bind(svc, pod, node)
    kube.held.clear()
    assert svc.state()["allocations"][pod["metadata"]["uid"]]["bindOutcomeUnknown"] is True


def drop_pending_copy(kube: FakeKube, f, key: str) -> None:
    """Newer pending pods push ``key``'s copy out of the feed's bounded store."""
    for _ in range(f._pending.max_entries + 1):
        caught_up(kube, f)
    assert f.pending_uid(key) is None


@pytest.fixture
def stopping():
    made = []
    yield made
    for f, svc in made:
        svc.stop_hold_timer()
        f.stop()


def test_a_lapsed_hold_whose_pending_copy_was_dropped_is_released_by_the_timer(kube, stopping, caplog):
    """The hold's time is up, the pod still unbound, its pending copy dropped for the bounds. Its
    own filter cannot tell (no copy, and filter makes no API call), and with no room elsewhere no
    bind elsewhere comes to read it: before, the card stayed booked until the pod went. Now the
    hold timer reads the pod (a GET), finds it unbound and releases the card, and says so."""
    f, svc = extender(kube, clock=time.monotonic, hold_s=5.0)
    stopping.append((f, svc))
    svc.start_hold_timer()
    b = gpu_pod(kube, "b")
    kube.create_pod(make_pod("n2-filler", node="n2", phase="Running", gpus=1,   # no room elsewhere
                             annotations={ALLOCATION_ANNOTATION: rec("n2", 0)}))
    a = gpu_pod(kube, "a")
    caught_up(kube, f)
    before = snapshot(svc)
    with caplog.at_level(logging.WARNING, logger="stowage.extender"):
        held_never_applied(kube, svc, a, "n1")
        drop_pending_copy(kube, f, "default/a")
        assert svc.state()["allocations"][a["metadata"]["uid"]]["bindOutcomeUnknown"] is True   # not up yet
        kube.wait_for(lambda: snapshot(svc) == before, timeout=30)
    assert not kube.get_pod("default", "a")["spec"].get("nodeName")
    assert any("default/a" in r.getMessage() and "released" in r.getMessage() for r in caplog.records)
    assert "bindOutcomeUnknown" not in str(svc.state()["allocations"])
    assert filter_nodes(svc, b) == ["n1"] and bind(svc, b, "n1") == ""


def test_end_lapsed_holds_checks_the_pod_when_its_copy_is_gone(kube, stopping):
    """The sweep itself, on a clock the test moves: nothing before the hold's time; after it, a
    pod read back unbound is released; a pod read back bound (its Binding landed, the watch has
    not shown it yet) is confirmed, its cards kept; an unreadable API server leaves the hold for
    the next round."""
    f, svc = extender(kube)
    stopping.append((f, svc))
    a, c = gpu_pod(kube, "a"), gpu_pod(kube, "c")
    caught_up(kube, f)
    held_never_applied(kube, svc, a, "n1")
    kube.hold_bindings(1, status=504)
    assert "504" in bind(svc, c, "n2")           # c's Binding is kept to land later
    drop_pending_copy(kube, f, "default/a")
    drop_pending_copy(kube, f, "default/c")
    held = snapshot(svc)
    assert set(held[0]) == {"default/a", "default/c"}

    assert svc.end_lapsed_holds() == pytest.approx(svc.unknown_outcome_hold_s)
    assert snapshot(svc) == held
    svc._clock.t += svc.unknown_outcome_hold_s
    kube.fail_next(2, status=503, path="/pods/(a|c)$", method="GET")
    assert svc.end_lapsed_holds() == pytest.approx(5.0)    # unreadable: tried again later
    assert snapshot(svc) == held

    f.stop()                                      # the watch will not show what comes now
    assert kube.apply_held()[0]["status"] == "Success"   # c's Binding lands late
    assert svc.end_lapsed_holds() is None         # no hold left: a released, c confirmed
    assert snapshot(svc)[0] == {"default/c": ("n2", (0,), (80 * GiB,), (1000,))}
    assert "bindOutcomeUnknown" not in str(svc.state()["allocations"])
    assert kube.get_pod("default", "c")["spec"]["nodeName"] == "n2"


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_a_pod_that_finished_while_held_leaves_no_hold_entry(kube, stopping, phase):
    """The pod finished while its hold stood (the feed frees its cards): its entry in the hold
    table went too. Before, it stayed until the next hold of any pod was made."""
    f, svc = extender(kube)
    stopping.append((f, svc))
    a = gpu_pod(kube, "a")
    caught_up(kube, f)
    held_never_applied(kube, svc, a, "n1")
    kube.patch_pod("default", "a", {"status": {"phase": phase}})
    caught_up(kube, f)
    assert snapshot(svc)[0] == {}
    assert svc._unknown == {}
