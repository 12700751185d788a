"""Registration, device lists and IDs, inventory, kubelet restart, no GPU, SIGTERM: over real gRPC."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dp_harness import NODE, rig, short_tmpdir
from fakekubelet import FakeKubelet
from fakenvml import FakeCard, default_cards

from gpunode.devices import MAX_ID_LEN, DeviceTable, UnknownDevice, card_key
from gpunode.nvml import GpuInfo
from deviceplugin.server import socket_name
from stowage.inventory import INVENTORY_ANNOTATION, decode_inventory
from stowage.resources import RESOURCE_GPU, RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_registers_all_resources_with_device_lists(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        k = r.kubelet
        uuids = [c.uuid for c in r.nvml.cards]
        # one device per card, ID = card UUID
        assert sorted(k.devices(RESOURCE_GPU)) == sorted(uuids)
        # memory: floor(card MiB / 1024) units per card: 80 + 80 + 22 (23028 MiB) + 15
        mem = k.devices(RESOURCE_GPU_MEMORY)
        assert len(mem) == 80 + 80 + 22 + 15
        assert {f"{uuids[2]}::{n}" for n in range(22)} <= set(mem) and f"{uuids[2]}::22" not in mem
        core = k.devices(RESOURCE_GPU_CORE)
        assert len(core) == 400 and f"{uuids[3]}::99" in core
        assert all(len(i) <= MAX_ID_LEN for res in (mem, core) for i in res)
        assert all(h == "Healthy" for res in (mem, core) for h in res.values())
        # NUMA topology where NVML reports it; none for the T4
        assert k.plugins[RESOURCE_GPU].topology[uuids[2]] == [1]
        assert k.plugins[RESOURCE_GPU].topology[uuids[3]] == []
        # endpoint names, preferred allocation advertised
        assert {e for _, _, e in k.registrations} == {socket_name(x) for x in (RESOURCE_GPU, RESOURCE_GPU_MEMORY, RESOURCE_GPU_CORE)}
        assert all(c.options.get_preferred_allocation_available for c in k.plugins.values())


def test_publishes_inventory_annotation(monkeypatch):
    with rig(monkeypatch) as r:
        ann = r.kube.wait_for(lambda: (r.kube.get_node(NODE)["metadata"].get("annotations") or {}).get(INVENTORY_ANNOTATION))
        inv = decode_inventory(ann)
        assert [c.model for c in inv.cards] == ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A10", "Tesla T4"]
        assert [c.memory_mib for c in inv.cards] == [81920, 81920, 23028, 15360]
        assert inv.cards[0].nvlink == (1,) and inv.cards[1].nvlink == (0,) and inv.cards[2].nvlink == ()
        assert [c.numa for c in inv.cards] == [0, 0, 1, -1]
        assert inv.memory_unit_mib == 1024
        patches = [q for m, p, q in r.kube.requests if m == "PATCH" and p.endswith(f"/nodes/{NODE}")]
        assert patches, "inventory must be written with PATCH on the node"


def test_memory_unit_is_configurable(monkeypatch):
    with rig(monkeypatch, memory_unit_mib=4096) as r:
        assert r.registered()
        assert len(r.kubelet.devices(RESOURCE_GPU_MEMORY)) == 20 + 20 + 5 + 3
        inv = decode_inventory(r.kube.wait_for(lambda: r.kube.get_node(NODE)["metadata"]["annotations"].get(INVENTORY_ANNOTATION)))
        assert inv.memory_unit_mib == 4096


def test_long_uuid_gets_short_recoverable_key():
    long_uuid = "MIG-GPU-" + "f" * 36 + "/1/0-and-some-more-characters"
    cards = [GpuInfo(0, long_uuid, "X", 2048), GpuInfo(1, "GPU-short", "Y", 1024)]
    t = DeviceTable(cards, 1024)
    ids = [d.id for d in t.devices(RESOURCE_GPU_MEMORY, {})]
    assert all(len(i) <= MAX_ID_LEN for i in ids)
    key = card_key(long_uuid)
    assert key != long_uuid and key == card_key(long_uuid)  # deterministic
    assert t.card_of(RESOURCE_GPU_MEMORY, f"{key}::1").uuid == long_uuid
    assert t.card_of(RESOURCE_GPU, key).uuid == long_uuid
    assert t.card_of(RESOURCE_GPU, "GPU-short").index == 1
    assert t.card_of(RESOURCE_GPU_MEMORY, "GPU-short::0").index == 1


@pytest.mark.parametrize("device_id", ["GPU-short::00", "GPU-short::01", "GPU-short::\u00b2", "GPU-short::\u0660",
                                       "GPU-short::-0", "GPU-short::+0", "GPU-short:: 0", "GPU-short::0 ", "GPU-short::",
                                       "GPU-short", "GPU-short::0::0"])
def test_only_ids_exactly_as_advertised_name_a_device(device_id):
    t = DeviceTable([GpuInfo(1, "GPU-short", "Y", 2048)], 1024)
    assert {d.id for d in t.devices(RESOURCE_GPU_MEMORY, {})} == {"GPU-short::0", "GPU-short::1"}
    with pytest.raises(UnknownDevice):
        t.card_of(RESOURCE_GPU_MEMORY, device_id)


def test_no_driver_advertises_nothing_and_keeps_running(monkeypatch, caplog):
    with rig(monkeypatch, driver_loaded=False) as r:
        assert r.registered()
        assert r.kubelet.devices(RESOURCE_GPU) == {} and r.kubelet.devices(RESOURCE_GPU_MEMORY) == {}
        assert any("NVML is not available" in m for m in caplog.messages)
        inv = decode_inventory(r.kube.wait_for(lambda: r.kube.get_node(NODE)["metadata"]["annotations"].get(INVENTORY_ANNOTATION)))
        assert inv.cards == ()


def test_a_driver_loaded_after_the_plugin_started_gets_its_cards_served(monkeypatch, caplog):
    """nvmlInit fails at start (the driver is loaded later, e.g. by a driver container). Before, NVML
    was never initialised again: the node advertised no GPU until the plugin was restarted by hand.
    Now NVML is initialised again in the background with back-off, and the cards are then served."""
    with rig(monkeypatch, driver_loaded=False, rediscover_first_s=0.05, rediscover_max_s=0.1) as r:
        assert r.registered()
        assert r.kubelet.devices(RESOURCE_GPU) == {}
        assert any("NVML is not available" in m for m in caplog.messages)
        r.nvml.driver_loaded = True
        assert r.kubelet.wait_for(lambda: r.kubelet.allocatable(RESOURCE_GPU) == 4)
        inv = r.kube.wait_for(lambda: (lambda i: i if len(i.cards) == 4 else None)(decode_inventory(
            r.kube.get_node(NODE)["metadata"]["annotations"].get(INVENTORY_ANNOTATION) or "")))
        assert {c.uuid for c in inv.cards} == {r.uuid(i) for i in range(4)}


def test_plugin_started_before_kubelet_registers_when_it_appears(monkeypatch):
    with rig(monkeypatch, start_kubelet=False) as r:
        assert r.kubelet.registrations == []
        r.kubelet.start()
        assert r.registered()


def test_kubelet_restart_reregisters_fast(monkeypatch):
    with rig(monkeypatch) as r:
        assert r.registered()
        before = len(r.kubelet.registrations)
        t0 = r.kubelet.restart()
        assert r.kubelet.wait_for(lambda: len(r.kubelet.plugins) == 3, timeout=10)
        took = max(t for t, _, _ in r.kubelet.registrations[before:]) - t0
        print(f"re-registered all 3 resources {took * 1000:.0f} ms after the kubelet restarted")
        assert took < 5.0  # target 0.5 s; generous bound for a loaded 2-core machine
        assert len(r.kubelet.devices(RESOURCE_GPU)) == 4
        # twice in a row works too
        r.kubelet.restart()
        assert r.kubelet.wait_for(lambda: len(r.kubelet.plugins) == 3, timeout=10)


def test_registration_backing_off_retries_as_soon_as_the_kubelet_is_back(monkeypatch):
    """Issue 11, bug 2: a plugin (re)started while the kubelet is down fails Register against the
    stale kubelet.sock and backs off; when the kubelet's registration server comes back it must
    register at once, not after its retry delay (the kubelet re-admits pods ~0.7 s later)."""
    import time

    # A long retry delay makes the two behaviours far apart whatever the machine's load: waiting
    # out the delay takes >= 20 s, registering when the kubelet answers takes a poll (20 ms).
    import deviceplugin.server as server
    retry_s = 20.0
    monkeypatch.setattr(server, "REGISTER_RETRY_S", retry_s)
    with rig(monkeypatch) as r:
        assert r.registered()
        r.kubelet.stop()                      # kubelet.sock stays behind, refusing connections
        registered = len(r.kubelet.registrations)
        r.restart_plugin()
        assert len(r.kubelet.registrations) == registered   # nothing new registered while it is down
        assert any(ep.next_try > time.monotonic() + retry_s / 2 for ep in r.plugin.endpoints), \
            "no failed try to back off from"
        time.sleep(0.25)             # into the back-off
        before = len(r.kubelet.registrations)
        t0 = r.kubelet.restart()
        assert r.kubelet.wait_for(lambda: len(r.kubelet.registrations) - before >= 3, timeout=retry_s + 10)
        took = max(t for t, _, _ in r.kubelet.registrations[before:]) - t0
        # the plugin polls every 20 ms; its retry delay is 20 s here
        assert took < retry_s / 2, f"registered {took * 1000:.0f} ms after the kubelet came back"


def test_sigterm_removes_sockets(tmp_path):
    base = short_tmpdir()
    plugin_dir = os.path.join(base, "dp")
    kubelet = FakeKubelet(plugin_dir)
    kubelet.start()
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{ROOT!r}, {os.path.join(ROOT, 'tests')!r}]
        from fakenvml import FakeNvml
        FakeNvml().install()
        from deviceplugin.cli import main
        main(["--plugin-dir", {plugin_dir!r}, "--no-kube", "--dev-root", {base!r},
              "--pod-resources-socket", {os.path.join(base, "pod-resources", "kubelet.sock")!r}])
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert kubelet.wait_for(lambda: len(kubelet.plugins) == 3, timeout=30), "plugin did not register"
        socks = [os.path.join(plugin_dir, socket_name(x)) for x in (RESOURCE_GPU, RESOURCE_GPU_MEMORY, RESOURCE_GPU_CORE)]
        assert all(os.path.exists(s) for s in socks)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out.decode()
        assert not any(os.path.exists(s) for s in socks)
        assert os.path.exists(os.path.join(plugin_dir, "kubelet.sock"))  # never touches the kubelet's
        assert b"shutting down" in out
        assert out.count(b"falling back to this process's in-memory count") == 1, out.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kubelet.stop()
