"""A card in MIG mode is not one Stowage can hand out: the device plugin advertises it Unhealthy,
from its first list to the kubelet, and says why.

In MIG mode a card's compute is split into GPU instances, and a container given the whole card's
UUID (what Stowage's records name) sees no CUDA device it can use; a share of its memory or
compute means nothing either. Stowage allocates whole cards and shares of whole cards, not MIG
instances. Before, nothing read the MIG mode: such a card was advertised Healthy in every
resource, the extender placed pods on it, and they started on a card they could not use.
Enabling or disabling MIG takes a card reset, which can happen while the plugin runs: the mode is
read by the periodic probes too, and a card whose MIG mode is disabled again is healthy again
after the usual quiet period. Only the mode in force counts: a pending one takes effect at the
next reset. The exporter's ``stowage_gpu_healthy`` says the same (its contract: 1 while the plugin
would advertise the card Healthy).
"""
from __future__ import annotations

import logging

import pynvml

from dp_harness import NODE, rig
from exporter_harness import make_node
from fakenvml import default_cards

from stowage.inventory import INVENTORY_ANNOTATION, decode_inventory
from stowage.resources import GPU_RESOURCES, RESOURCE_GPU

ON, OFF = pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE


def unhealthy_cards(r, resource):
    return {i.split("::")[0] for i, h in r.kubelet.devices(resource).items() if h == "Unhealthy"}


def inventory_health(r):
    ann = r.kube.get_node(NODE)["metadata"]["annotations"].get(INVENTORY_ANNOTATION)
    return [c.healthy for c in decode_inventory(ann).cards] if ann else None


def test_a_card_in_mig_mode_at_start_is_unhealthy_in_the_first_list(monkeypatch, caplog):
    cards = default_cards()
    cards[1].mig_mode = (ON, ON)
    cards[0].mig_mode = (OFF, OFF)          # MIG-capable, not in MIG mode: an ordinary card
    caplog.set_level(logging.WARNING)
    # no periodic probe during the test: the first list must already say it
    with rig(monkeypatch, cards=cards, probe_interval_s=3600, recovery_quiet_s=3600) as r:
        assert r.registered()
        u1 = r.uuid(1)
        assert r.kubelet.wait_for(lambda: all(r.kubelet.devices(res) for res in GPU_RESOURCES))
        for res in GPU_RESOURCES:
            assert unhealthy_cards(r, res) == {u1}, res
            assert r.kubelet.plugins[res].updates == 1, res     # the first list said so, not a later update
        assert r.kubelet.allocatable(RESOURCE_GPU) == 3
        assert r.kube.wait_for(lambda: inventory_health(r) == [True, False, True, True])
    said = [rec.getMessage() for rec in caplog.records if u1 in rec.getMessage()]
    assert any("MIG mode" in m and "nvidia-smi" in m for m in said), said


def test_mig_enabled_while_running_goes_unhealthy_and_disabled_again_heals(monkeypatch):
    with rig(monkeypatch, probe_interval_s=0.1, recovery_quiet_s=0.3) as r:
        assert r.registered()
        u0 = r.uuid(0)
        assert r.kubelet.allocatable(RESOURCE_GPU) == 4
        r.nvml.card(u0).mig_mode = (OFF, ON)        # pending: the card still works as a whole card
        calls = r.nvml.calls.get("nvmlEventSetWait", 0)
        assert r.kube.wait_for(lambda: r.nvml.calls["nvmlEventSetWait"] > calls + 10)   # probe rounds later
        assert unhealthy_cards(r, RESOURCE_GPU) == set()
        r.nvml.card(u0).mig_mode = (ON, ON)         # after the reset
        assert r.kubelet.wait_for(lambda: all(unhealthy_cards(r, res) == {u0} for res in GPU_RESOURCES))
        assert r.kube.wait_for(lambda: inventory_health(r) == [False, True, True, True])
        r.nvml.card(u0).mig_mode = (OFF, OFF)
        assert r.kubelet.wait_for(lambda: unhealthy_cards(r, RESOURCE_GPU) == set(), timeout=20)
        assert r.kube.wait_for(lambda: inventory_health(r) == [True] * 4)


def test_the_exporter_reports_a_mig_card_unhealthy_as_the_plugin_advertises_it(monkeypatch, tmp_path):
    """docs/metrics-contract.md: ``stowage_gpu_healthy`` is 1 while the device plugin would advertise
    the card Healthy (same code, ``Nvml.probe``). The card's telemetry is still read: it works, it
    is only not Stowage's to hand out. Turned off again, it is 1 after the quiet period."""
    cards = default_cards()
    cards[0].mig_mode = (ON, ON)
    for node in make_node(monkeypatch, tmp_path, cards=cards, exporter_config=dict(recovery_quiet_s=0.0)):
        s = node.scrape()
        assert {x.labels["gpu"]: x.value for x in s.samples("stowage_gpu_healthy")} == {
            c.uuid: (0 if c is cards[0] else 1) for c in cards}
        assert s.value("stowage_gpu_memory_total_bytes", gpu=cards[0].uuid) > 0
        node.nvml.card(cards[0].uuid).mig_mode = (OFF, OFF)
        assert node.scrape().value("stowage_gpu_healthy", gpu=cards[0].uuid) == 1


def test_with_health_checks_disabled_a_mig_card_is_still_unhealthy_and_heals_when_turned_off(monkeypatch):
    """``--ignored-xids all`` turns off the health checks (XID events, and the probes for unreachable
    cards, pending retired pages / row remaps, ECC errors), as NVIDIA's plugin does with
    ``DP_DISABLE_HEALTHCHECKS=all``. MIG mode is not one of them: it is how the card is set up, and a
    container given a MIG card's whole UUID cannot use it whether or not health is watched. Before,
    MIG mode was read only by the health probes, so with checks off such a card was advertised
    Healthy. With no quiet period to wait for (no events are watched), it is fit again at the first
    probe after MIG is turned off."""
    cards = default_cards()
    cards[2].mig_mode = (ON, ON)
    with rig(monkeypatch, cards=cards, health_disabled=True, probe_interval_s=0.1, recovery_quiet_s=3600) as r:
        assert r.registered()
        u2 = r.uuid(2)
        assert r.kubelet.wait_for(lambda: all(r.kubelet.devices(res) for res in GPU_RESOURCES))
        for res in GPU_RESOURCES:
            assert unhealthy_cards(r, res) == {u2}, res
            assert r.kubelet.plugins[res].updates == 1, res     # the first list said so
        assert r.kube.wait_for(lambda: inventory_health(r) == [True, True, False, True])
        r.nvml.card(u2).mig_mode = (OFF, OFF)
        assert r.kubelet.wait_for(lambda: all(unhealthy_cards(r, res) == set() for res in GPU_RESOURCES))
        assert r.kube.wait_for(lambda: inventory_health(r) == [True] * 4)
        r.nvml.card(u2).mig_mode = (ON, ON)          # on again (after a reset) while running
        assert r.kubelet.wait_for(lambda: unhealthy_cards(r, RESOURCE_GPU) == {u2})


def test_with_health_checks_disabled_other_probe_findings_still_do_not_count(monkeypatch):
    """Disabled means disabled for the health checks: a card with pending retired pages stays Healthy
    (the operator asked for that), while reading MIG mode does not turn them back on."""
    cards = default_cards()
    cards[0].retired_pages_pending = True
    with rig(monkeypatch, cards=cards, health_disabled=True, probe_interval_s=0.1) as r:
        assert r.registered()
        assert r.kubelet.wait_for(lambda: all(r.kubelet.devices(res) for res in GPU_RESOURCES))
        u1 = r.uuid(1)
        r.nvml.card(u1).mig_mode = (ON, ON)          # the probes that see this one also read card 0
        assert r.kubelet.wait_for(lambda: unhealthy_cards(r, RESOURCE_GPU) == {u1})
        assert unhealthy_cards(r, RESOURCE_GPU) == {u1}


def test_the_exporter_with_health_checks_disabled_reports_a_mig_card_unhealthy(monkeypatch, tmp_path):
    cards = default_cards()
    cards[3].mig_mode = (ON, ON)
    for node in make_node(monkeypatch, tmp_path, cards=cards,
                          exporter_config=dict(recovery_quiet_s=3600.0, health_disabled=True)):
        s = node.scrape()
        assert {x.labels["gpu"]: x.value for x in s.samples("stowage_gpu_healthy")} == {
            c.uuid: (0 if c is cards[3] else 1) for c in cards}
        node.nvml.card(cards[3].uuid).mig_mode = (OFF, OFF)
        assert node.scrape().value("stowage_gpu_healthy", gpu=cards[3].uuid) == 1
