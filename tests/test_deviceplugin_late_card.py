"""A card NVML cannot read when the plugin starts is re-read in the background and advertised once it answers.

Before, discovery ran once: a card whose handle or UUID could not be read at startup (off the bus,
a transient NVML error) was never advertised, not even Unhealthy, was missing from the inventory
annotation, and stayed missing after it answered again until the plugin was restarted.
"""
from __future__ import annotations

import logging

import pynvml
from dp_harness import NODE, bind_pod, container, record, rig
from fakenvml import FakeCard, default_cards

from stowage.inventory import INVENTORY_ANNOTATION, decode_inventory
from stowage.resources import GPU_RESOURCES, RESOURCE_GPU, RESOURCE_GPU_CORE, RESOURCE_GPU_MEMORY


def _inventory(r):
    ann = (r.kube.get_node(NODE)["metadata"].get("annotations") or {}).get(INVENTORY_ANNOTATION)
    return decode_inventory(ann).cards if ann else None


def _loud_about(caplog, index: int) -> list[str]:
    """Warnings and errors that speak of card ``index``."""
    return [rec.getMessage() for rec in caplog.records
            if rec.levelno >= logging.WARNING and rec.getMessage().startswith(f"GPU {index} ")]


def _node_patches(r) -> int:
    return sum(1 for m, p, _ in r.kube.requests if m == "PATCH" and p.endswith(f"/nodes/{NODE}"))


def test_a_card_unreadable_at_start_is_advertised_once_it_answers(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    cards = default_cards()
    cards[1].lost = True            # index 1 cannot be read when the plugin starts
    u1 = cards[1].uuid
    with rig(monkeypatch, cards=cards) as r:   # default back-off: first re-read 1 s after start
        assert r.registered()
        assert set(r.kubelet.devices(RESOURCE_GPU)) == {cards[i].uuid for i in (0, 2, 3)}
        assert r.kube.wait_for(lambda: [c.index for c in _inventory(r) or []] == [0, 2, 3])
        assert _inventory(r)[0].nvlink == ()    # its NVLink peer is not known yet
        assert len(_loud_about(caplog, 1)) == 1

        r.nvml.restore(u1)
        assert r.kubelet.wait_for(lambda: all(u1 in {i.split("::")[0] for i in r.kubelet.devices(res)}
                                              for res in GPU_RESOURCES), timeout=15)
        # the full list, in every resource, each device once
        for res, per_card in ((RESOURCE_GPU, (1, 1, 1, 1)), (RESOURCE_GPU_MEMORY, (80, 80, 22, 15)),
                              (RESOURCE_GPU_CORE, (100,) * 4)):
            ids = r.kubelet.plugins[res].ids
            assert len(ids) == len(set(ids)) == sum(per_card), res
            assert all(h == "Healthy" for h in r.kubelet.devices(res).values())
        mem = r.kubelet.devices(RESOURCE_GPU_MEMORY)
        assert f"{u1}::79" in mem and f"{u1}::80" not in mem
        assert r.kubelet.plugins[RESOURCE_GPU].topology[u1] == [0]
        # the inventory lists it at its index, with the NVLink pair resolved on both sides
        assert r.kube.wait_for(lambda: [c.uuid for c in _inventory(r) or []] == [c.uuid for c in cards])
        inv = _inventory(r)
        assert [c.index for c in inv] == [0, 1, 2, 3] and inv[1].memory_mib == 81920 and inv[1].healthy
        assert inv[0].nvlink == (1,) and inv[1].nvlink == (0,)
        said = _loud_about(caplog, 1)    # once when it could not be read, once when it was added
        assert len(said) == 2 and "could not be read" in said[0] and "restart" not in said[0], said
        assert u1 in said[1] and "advertis" in said[1], said

        # the kubelet can allocate it: a whole-GPU pod recorded on it gets it
        pod = bind_pod(r, "late", [container("main", gpus=1)], record([(1, u1)], whole=True, mem_mib=81920),
                       "2024-01-01T00:00:01Z")
        resp = r.kubelet.admit(pod)["main"][RESOURCE_GPU]
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == u1
        assert "/dev/nvidia1" in [d.host_path for d in resp.devices]


def test_a_late_card_is_shared_and_watched_for_health_like_the_others(monkeypatch):
    """Once added, the card is a card like any other: its memory/core devices allocate, its XIDs are
    seen (it was registered for events), and the inventory follows its health."""
    cards = default_cards()
    cards[2].lost = True
    u2 = cards[2].uuid
    with rig(monkeypatch, cards=cards, rediscover_first_s=0.05, rediscover_max_s=0.1,
             probe_interval_s=3600, recovery_quiet_s=3600) as r:
        assert r.registered()
        r.nvml.restore(u2)
        assert r.kubelet.wait_for(lambda: all(u2 in {i.split("::")[0] for i in r.kubelet.devices(res)}
                                              for res in GPU_RESOURCES), timeout=10)
        pod = bind_pod(r, "share", [container("main", mem=10, core=30)],
                       record([(2, u2)], whole=False, mem_mib=10240, core_milli=300), "2024-01-01T00:00:01Z")
        got = r.kubelet.admit(pod)["main"]
        alloc = r.kubelet.allocated[pod["metadata"]["uid"]]["main"]
        assert {i.split("::")[0] for i in alloc[RESOURCE_GPU_MEMORY] + alloc[RESOURCE_GPU_CORE]} == {u2}
        assert got[RESOURCE_GPU_MEMORY].envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
        assert got[RESOURCE_GPU_CORE].envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"

        r.nvml.xid(u2, 79)   # probes are off: only the event can mark it
        assert r.kubelet.wait_for(lambda: all(
            {i.split("::")[0] for i, h in r.kubelet.devices(res).items() if h == "Unhealthy"} == {u2}
            for res in GPU_RESOURCES))
        assert r.kube.wait_for(lambda: [c.healthy for c in _inventory(r) or []] == [True, True, False, True])


def test_a_card_that_never_answers_is_retried_quietly(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    cards = default_cards()
    cards[3].lost = True
    with rig(monkeypatch, cards=cards, rediscover_first_s=0.01, rediscover_max_s=0.02) as r:
        assert r.registered()
        assert r.kube.wait_for(lambda: _inventory(r) is not None)
        updates = {res: r.kubelet.plugins[res].updates for res in GPU_RESOURCES}
        patches = _node_patches(r)
        tries = r.nvml.calls["nvmlDeviceGetHandleByIndex"]
        assert r.kube.wait_for(lambda: r.nvml.calls["nvmlDeviceGetHandleByIndex"] >= tries + 20)
        said = _loud_about(caplog, 3)
        assert len(said) == 1 and "could not be read" in said[0], said   # repeats go to debug
        assert any(rec.levelno == logging.DEBUG and rec.getMessage().startswith("GPU 3 ") for rec in caplog.records)
        # nothing is re-sent or re-published for a try that changes nothing
        assert {res: r.kubelet.plugins[res].updates for res in GPU_RESOURCES} == updates
        assert _node_patches(r) == patches
        assert len(r.kubelet.devices(RESOURCE_GPU)) == 3


def _h200s(n: int) -> list[FakeCard]:
    return [FakeCard(f"GPU-{i:08x}-1111-2222-3333-44444444444{i}", "NVIDIA H200", 143771, i,
                     f"00000000:{0x10 + i:02X}:00.0", numa=i // 4) for i in range(n)]


def test_a_late_card_that_would_overflow_the_kubelet_message_is_refused_once(monkeypatch, caplog):
    """At --memory-unit-mib 16, seven H200s fit one ListAndWatch message and eight do not (4.4 MiB):
    the eighth, readable only later, is not advertised (the kubelet would drop the whole list),
    said once with the unit that fits, and not read again."""
    cards = _h200s(8)
    cards[7].lost = True
    with rig(monkeypatch, cards=cards, memory_unit_mib=16, rediscover_first_s=0.01, rediscover_max_s=0.02) as r:
        assert r.registered()
        r.nvml.restore(cards[7].uuid)
        assert r.kube.wait_for(lambda: any("--memory-unit-mib" in m for m in _loud_about(caplog, 7)))
        tries = r.nvml.calls["nvmlDeviceGetHandleByIndex"]
        r.nvml.xid(cards[0].uuid, 79)   # a later list change still sends the seven cards only
        assert r.kubelet.wait_for(lambda: r.kubelet.allocatable(RESOURCE_GPU) == 6)
        assert set(r.kubelet.devices(RESOURCE_GPU)) == {c.uuid for c in cards[:7]}
        assert r.nvml.calls["nvmlDeviceGetHandleByIndex"] == tries       # not read again
        said = _loud_about(caplog, 7)
        assert len(said) == 2 and "--memory-unit-mib" in said[1], said


def test_cards_nvml_cannot_count_at_start_are_advertised_once_it_can(monkeypatch, caplog):
    """``nvmlDeviceGetCount`` failing when the plugin starts (a driver still coming up, a transient
    NVML error): before, the plugin advertised no card and never counted again, until its pod was
    restarted. Now the count is tried again with the back-off of a late card, quietly, and the cards
    it finds are advertised (every resource, the inventory, Allocate); a card that cannot be read
    even then is read again on its own, as at start."""
    caplog.set_level(logging.DEBUG)
    cards = default_cards()
    cards[1].lost = True
    with rig(monkeypatch, cards=cards, count_error=pynvml.NVML_ERROR_UNKNOWN, rediscover_first_s=0.01,
             rediscover_max_s=0.02) as r:
        assert r.registered()
        assert r.kube.wait_for(lambda: _inventory(r) == ())
        assert all(r.kubelet.devices(res) == {} for res in GPU_RESOURCES)
        updates = {res: r.kubelet.plugins[res].updates for res in GPU_RESOURCES}
        patches, counts = _node_patches(r), r.nvml.calls["nvmlDeviceGetCount"]
        assert r.kube.wait_for(lambda: r.nvml.calls["nvmlDeviceGetCount"] >= counts + 10)   # counted again ...
        assert {res: r.kubelet.plugins[res].updates for res in GPU_RESOURCES} == updates    # ... changing nothing
        assert _node_patches(r) == patches
        loud = [m.getMessage() for m in caplog.records if m.levelno >= logging.WARNING and "count" in m.getMessage()]
        assert len(loud) == 1 and "cannot count" in loud[0] and "restart" not in loud[0], loud   # repeats: debug
        assert any(m.levelno == logging.DEBUG and "cannot count" in m.getMessage() for m in caplog.records)

        r.nvml.count_error = None
        found = {cards[i].uuid for i in (0, 2, 3)}
        assert r.kubelet.wait_for(lambda: all({i.split("::")[0] for i in r.kubelet.devices(res)} == found
                                              for res in GPU_RESOURCES), timeout=10)
        assert r.kube.wait_for(lambda: [c.index for c in _inventory(r) or []] == [0, 2, 3])
        counts = r.nvml.calls["nvmlDeviceGetCount"]
        loud = [m.getMessage() for m in caplog.records if m.levelno >= logging.WARNING and "count" in m.getMessage()]
        assert len(loud) == 2 and "counts" in loud[1] and "3 can be read, 1 cannot yet" in loud[1], loud
        assert len(_loud_about(caplog, 0)) == 1 and "advertised" in _loud_about(caplog, 0)[0]
        assert len(_loud_about(caplog, 1)) == 1 and "could not be read" in _loud_about(caplog, 1)[0]

        r.nvml.restore(cards[1].uuid)     # the card that could not be read once counted: read on its own
        assert r.kubelet.wait_for(lambda: len(r.kubelet.devices(RESOURCE_GPU)) == 4, timeout=10)
        assert r.kube.wait_for(lambda: [c.uuid for c in _inventory(r) or []] == [c.uuid for c in cards])
        inv = _inventory(r)
        assert inv[0].nvlink == (1,) and inv[1].nvlink == (0,) and all(c.healthy for c in inv)
        assert r.nvml.calls["nvmlDeviceGetCount"] == counts             # counted once, never again
        for res in GPU_RESOURCES:
            ids = r.kubelet.plugins[res].ids
            assert len(ids) == len(set(ids)), res

        u0 = cards[0].uuid
        pod = bind_pod(r, "counted", [container("main", gpus=1)], record([(0, u0)], whole=True, mem_mib=81920),
                       "2024-01-01T00:00:01Z")
        assert r.kubelet.admit(pod)["main"][RESOURCE_GPU].envs["NVIDIA_VISIBLE_DEVICES"] == u0


def test_a_late_card_reading_as_an_advertised_cards_uuid_is_refused_by_the_read_itself(monkeypatch, caplog):
    """The read of a late card refuses a UUID another card holds (``Nvml.read_index``), as discovery
    does at start: the card is not advertised twice, is read again, and is advertised once it reads
    as itself. The health thread needs no check of its own."""
    caplog.set_level(logging.INFO)
    cards = default_cards()
    cards[2].lost = True
    own = cards[2].uuid
    with rig(monkeypatch, cards=cards, rediscover_first_s=0.05, rediscover_max_s=0.1) as r:
        assert r.registered()
        cards[2].uuid = cards[0].uuid    # answers again, but as card 0
        cards[2].lost = False
        assert r.kube.wait_for(lambda: "GPU 0" in r.plugin.nvml.unreadable.get(2, ""))
        assert r.kube.wait_for(lambda: any("reads as" in x.getMessage() for x in caplog.records
                                           if x.getMessage().startswith("GPU 2 ")))
        for res in GPU_RESOURCES:
            ids = r.kubelet.plugins[res].ids
            assert len(ids) == len(set(ids)), res
        assert set(r.kubelet.devices(RESOURCE_GPU)) == {cards[i].uuid for i in (0, 1, 3)}
        cards[2].uuid = own              # reads as itself at last
        assert r.kube.wait_for(lambda: [c.index for c in _inventory(r) or []] == [0, 1, 2, 3], timeout=15)
        # the inventory and ListAndWatch are sent apart: the kubelet may not have the new list yet
        assert r.kubelet.wait_for(lambda: len(r.kubelet.plugins[RESOURCE_GPU].ids) >= 4)
        ids = r.kubelet.plugins[RESOURCE_GPU].ids
        assert len(ids) == len(set(ids)) == 4
