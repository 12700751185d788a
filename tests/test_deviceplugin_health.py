"""Health: XID events, ignored XIDs, a vanished card, recovery; pure tracker rules and end to end."""
from __future__ import annotations

import pytest

from dp_harness import NODE, rig

from gpunode.health import DEFAULT_IGNORED_XIDS, HealthTracker, parse_ignored_xids
from gpunode.nvml import XidEvent
from stowage.inventory import INVENTORY_ANNOTATION, decode_inventory
from stowage.resources import GPU_RESOURCES, RESOURCE_GPU, RESOURCE_GPU_MEMORY


def _unhealthy_cards(r, resource):
    return {i.split("::")[0] for i, h in r.kubelet.devices(resource).items() if h == "Unhealthy"}


def _inventory_health(r):
    ann = r.kube.get_node(NODE)["metadata"]["annotations"].get(INVENTORY_ANNOTATION)
    return [c.healthy for c in decode_inventory(ann).cards] if ann else None


def test_parse_ignored_xids():
    assert parse_ignored_xids(None) == (DEFAULT_IGNORED_XIDS, False)
    assert parse_ignored_xids("all") == (frozenset(), True)
    assert parse_ignored_xids("13, 48 79") == (frozenset({13, 48, 79}), False)
    assert parse_ignored_xids("") == (frozenset(), False)
    with pytest.raises(ValueError, match="'x'"):
        parse_ignored_xids("13,x")


def test_tracker_rules():
    t = HealthTracker(["a", "b"], quiet_s=10)
    assert t.on_event(XidEvent("a", 13), now=0) == set()          # application fault: ignored
    assert t.on_event(XidEvent("a", 79), now=1) == {"a"}
    assert t.on_probe("a", None, now=5) is False                   # not quiet long enough
    assert t.on_event(XidEvent("a", 48), now=6) == set()           # already bad; quiet period restarts
    assert t.on_probe("a", None, now=12) is False
    assert t.on_probe("a", "retired pages are pending", now=17) is False   # still broken: quiet period restarts
    assert t.on_probe("a", None, now=26) is False
    assert t.on_probe("a", None, now=27) is True and t.snapshot() == {"a": True, "b": True}
    assert t.on_event(XidEvent(None, 79), now=20) == {"a", "b"}    # unattributed event: every card
    assert t.on_probe("b", "gone", now=0) is False
    t.add("c")                                                      # a card read after start
    assert t.snapshot()["c"] is True and t.on_probe("c", "gone", now=30) is True and not t.snapshot()["c"]
    t.add("c")                                                      # already tracked: keeps its state
    assert t.snapshot()["c"] is False and t.uuids == ["a", "b", "c"]
    off = HealthTracker(["a"], disabled=True, quiet_s=10)
    assert off.on_event(XidEvent("a", 79), 0) == set() and off.snapshot() == {"a": True}
    # disabled, the probes read MIG mode alone (Nvml.probe(health_checks=False)): what they find
    # counts, and a passing probe heals at once (no events are watched, so no quiet period)
    assert off.on_probe("a", "MIG mode is enabled", 1) is True and off.snapshot() == {"a": False}
    assert off.on_probe("a", None, 2) is True and off.snapshot() == {"a": True}


def test_xid_marks_card_unhealthy_in_all_resources_then_recovers(monkeypatch):
    with rig(monkeypatch, recovery_quiet_s=0.5) as r:
        assert r.registered()
        u2 = r.uuid(2)
        r.nvml.xid(u2, 13)  # ignored application XID, followed by a critical one
        r.nvml.xid(u2, 79)
        assert r.kubelet.wait_for(lambda: all(_unhealthy_cards(r, res) == {u2} for res in GPU_RESOURCES))
        assert r.kubelet.allocatable(RESOURCE_GPU) == 3
        assert r.kubelet.allocatable(RESOURCE_GPU_MEMORY) == 80 + 80 + 15
        assert r.kube.wait_for(lambda: _inventory_health(r) == [True, True, False, True])
        # quiet period over, probe passes -> Healthy again, allocatable restored, inventory updated
        assert r.kubelet.wait_for(lambda: r.kubelet.allocatable(RESOURCE_GPU) == 4, timeout=20)
        assert r.kube.wait_for(lambda: _inventory_health(r) == [True] * 4)


def test_xid_79_on_a_card_that_fell_off_the_bus_marks_only_that_card(monkeypatch):
    """XID 79: the card has fallen off the bus and every query on it fails, also reading its UUID
    from the event's device handle. The event still names the card (its handle was mapped to its
    UUID when it registered for events), so the other three stay Healthy. Probes are off here, so
    only the event can change health."""
    with rig(monkeypatch, probe_interval_s=3600, recovery_quiet_s=3600) as r:
        assert r.registered()
        u1 = r.uuid(1)
        r.nvml.lose(u1)
        r.nvml.xid(u1, 79)
        assert r.kubelet.wait_for(lambda: all(_unhealthy_cards(r, res) == {u1} for res in GPU_RESOURCES))
        assert r.kubelet.allocatable(RESOURCE_GPU) == 3


def test_an_xid_naming_no_known_card_counts_for_every_card_registered_for_events(monkeypatch):
    """Conservative: an event whose card cannot be told apart may be about any card of the event
    set. The T4, never registered for events, cannot be its subject and keeps its probes' word."""
    with rig(monkeypatch, probe_interval_s=3600, recovery_quiet_s=3600) as r:
        assert r.registered()
        r.nvml.xid(None, 48)
        assert r.kubelet.wait_for(lambda: all(_unhealthy_cards(r, res) == {r.uuid(i) for i in range(3)}
                                              for res in GPU_RESOURCES))
        assert r.kubelet.allocatable(RESOURCE_GPU) == 1


def test_ignored_xid_does_not_flip(monkeypatch):
    with rig(monkeypatch, ignored_xids=frozenset({79})) as r:
        assert r.registered()
        r.nvml.xid(r.uuid(0), 79)
        r.nvml.xid(r.uuid(1), 48)  # a marker event that is not ignored: once it lands, 79 was processed
        assert r.kubelet.wait_for(lambda: _unhealthy_cards(r, RESOURCE_GPU) == {r.uuid(1)})
        assert r.uuid(0) not in _unhealthy_cards(r, RESOURCE_GPU)


def test_card_with_pending_retired_pages_stays_unhealthy(monkeypatch):
    with rig(monkeypatch, recovery_quiet_s=0.2) as r:
        assert r.registered()
        u0 = r.uuid(0)
        r.nvml.card(u0).retired_pages_pending = True
        r.nvml.xid(u0, 48)  # double-bit ECC error
        assert r.kubelet.wait_for(lambda: _unhealthy_cards(r, RESOURCE_GPU) == {u0})
        calls = r.nvml.calls.get("nvmlEventSetWait", 0)
        assert r.kube.wait_for(lambda: r.nvml.calls["nvmlEventSetWait"] > calls + 20)  # many probe rounds later
        assert _unhealthy_cards(r, RESOURCE_GPU) == {u0}
        r.nvml.card(u0).retired_pages_pending = False   # after a reset
        assert r.kubelet.wait_for(lambda: _unhealthy_cards(r, RESOURCE_GPU) == set(), timeout=20)


def test_vanished_card_goes_unhealthy_and_back(monkeypatch):
    with rig(monkeypatch, recovery_quiet_s=0.2) as r:
        assert r.registered()
        u3 = r.uuid(3)  # the T4 does not even report XID events: only probes notice
        r.nvml.lose(u3)
        assert r.kubelet.wait_for(lambda: _unhealthy_cards(r, RESOURCE_GPU_MEMORY) == {u3})
        assert r.kube.wait_for(lambda: _inventory_health(r) == [True, True, True, False])
        r.nvml.restore(u3)
        assert r.kubelet.wait_for(lambda: _unhealthy_cards(r, RESOURCE_GPU_MEMORY) == set(), timeout=20)


def test_health_checks_disabled(monkeypatch):
    with rig(monkeypatch, health_disabled=True) as r:
        assert r.registered()
        r.nvml.lose(r.uuid(1))
        r.nvml.xid(r.uuid(0), 79)
        n = r.kubelet.plugins[RESOURCE_GPU].updates
        assert not r.kubelet.wait_for(lambda: r.kubelet.plugins[RESOURCE_GPU].updates > n, timeout=1.0)
        assert r.kubelet.allocatable(RESOURCE_GPU) == 4


def test_plugin_death_marks_devices_unhealthy_at_the_kubelet(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        r.plugin.stop()
        assert r.kubelet.wait_for(lambda: r.kubelet.allocatable(RESOURCE_GPU) == 0)



@pytest.mark.parametrize("command", ["device-plugin", "exporter"])
def test_a_bad_ignored_xids_value_is_refused_while_parsing(command):
    """The device plugin and the exporter read ``--ignored-xids`` when click parses the command
    line (an option callback), not once the command runs: a refused value is refused wherever the
    line is parsed, the docs' check (tests/test_doc_commands.py, make_context) included."""
    import click
    from stowage.cli import main

    cmd = main.get_command(click.Context(main), command)
    with pytest.raises(click.BadParameter, match="'x'"):
        cmd.make_context(command, ["--ignored-xids", "13,x"])
    assert cmd.make_context(command, ["--ignored-xids", "all"]).params["ignored_xids"] == (frozenset(), True)
    assert cmd.make_context(command, []).params["ignored_xids"] == (DEFAULT_IGNORED_XIDS, False)
