"""The exporter's pure parts: cgroup paths -> pod UID, kubelet checkpoint -> UID map, device IDs ->
cards, and the card split rules (the end-to-end behaviour is in test_exporter_scrape.py)."""
from __future__ import annotations

import json

import pytest

from gpunode.devices import card_key
from exporter import checkpoint as ckpt
from exporter.attribution import ContainerRef, Holding, Owner, card_of_device, holders_by_card, key_index, split_card
from exporter.cgroups import PodCgroup, ProcessGone, parse_cgroup_path, parse_proc_cgroup, pod_of_pid
from exporter.checkpoint import PodKey
from exporter.nvmlreader import CardSample, ProcUsage
from fakepodresources import cgroup_v1_cgroupfs
from gpunode.podresources.client import ContainerDevices

UID = "1a2b3c4d-0000-1111-2222-333344445555"
CID = "ab" * 32


@pytest.mark.parametrize("path", [
    f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
    f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/docker-{CID}.scope",            # guaranteed, docker
    f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope",
    f"/kubepods/besteffort/pod{UID}/{CID}",                                                      # cgroupfs driver
    f"/kubepods/pod{UID}/{CID}",
    f"/../../kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",  # via a cgroup namespace
    f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
    f"kubelet-kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",  # kind
])
def test_cgroup_layouts_name_the_pod_and_container(path):
    assert parse_cgroup_path(path) == PodCgroup(UID, CID)


OTHER = "0f6c3b1e-8d2a-4c5e-9b7f-1a2b3c4d5e0b"


@pytest.mark.parametrize("path", [
    # cgroup v2, systemd driver: a child cgroup the container made, named like another pod's
    f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
    f"cri-containerd-{CID}.scope/pod{OTHER}",
    f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
    f"cri-containerd-{CID}.scope/kubepods-pod{OTHER.replace('-', '_')}.slice/{'cd' * 32}",
    # cgroup v1 / cgroupfs driver
    f"/kubepods/burstable/pod{UID}/{CID}/pod{OTHER}",
    f"/kubepods/pod{UID}/{CID}/x/pod{OTHER}/{'cd' * 32}",
    # seen through a cgroup namespace
    f"/../../kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope/pod{OTHER}",
])
def test_a_pod_named_cgroup_below_a_container_does_not_move_its_processes_to_that_pod(path):
    # the kubelet's level comes first; anything below it is the container's own doing
    assert parse_cgroup_path(path) == PodCgroup(UID, CID)
    assert parse_proc_cgroup(f"11:memory:{path}\n0::/\n") == PodCgroup(UID, CID)


def test_static_pod_uids_and_pod_level_cgroups():
    assert parse_cgroup_path("/kubepods/burstable/pod" + "c" * 32 + "/" + CID) == PodCgroup("c" * 32, CID)
    assert parse_cgroup_path(f"/kubepods/burstable/pod{UID.upper()}") == PodCgroup(UID, "")


@pytest.mark.parametrize("path", ["/", "/system.slice/containerd.service", "/kubepods.slice/kubepods-burstable.slice",
                                  "/user.slice/user-1000.slice/session-3.scope", "/kubepods/besteffort/podnot-a-uid/x"])
def test_non_pod_cgroups_are_none(path):
    assert parse_cgroup_path(path) is None


def test_proc_cgroup_v1_file_uses_any_controller_line(tmp_path):
    text = f"12:pids:/\n11:memory:/kubepods/burstable/pod{UID}/{CID}\n0::/\n"
    assert parse_proc_cgroup(text) == PodCgroup(UID, CID)
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(text)
    assert pod_of_pid(42, str(tmp_path)) == PodCgroup(UID, CID)
    with pytest.raises(ProcessGone):
        pod_of_pid(43, str(tmp_path))


# /proc/<pid>/cgroup of a container's process on the integration tests' node (kubelet v1.28.7,
# cgroupfs driver, containerd 1.6 + runc; cgroup v1 with the v2 hierarchy mounted beside it), as read
# there: a burstable pod's container (a guaranteed pod has no QoS level: /kubepods/pod<uid>/<id>).
REAL_V1_HYBRID = """\
9:name=systemd:/kubepods/burstable/podb62492fa-547e-48f6-a993-12a769cac6d5/7819a956ca25468727099fd020e134d87c8f68afd2427c94d88a51cbcf60e066
8:pids:/kubepods/burstable/podb62492fa-547e-48f6-a993-12a769cac6d5/7819a956ca25468727099fd020e134d87c8f68afd2427c94d88a51cbcf60e066
7:blkio:/kubepods/burstable/podb62492fa-547e-48f6-a993-12a769cac6d5/7819a956ca25468727099fd020e134d87c8f68afd2427c94d88a51cbcf60e066
6:freezer:/kubepods/burstable/podb62492fa-547e-48f6-a993-12a769cac6d5/7819a956ca25468727099fd020e134d87c8f68afd2427c94d88a51cbcf60e066
5:devices:/kubepods/burstable/podb62492fa-547e-48f6-a993-12a769cac6d5/7819a956ca25468727099fd020e134d87c8f68afd2427c94d88a51cbcf60e066
4:memory:/kubepods/burstable/podb62492fa-547e-48f6-a993-12a769cac6d5/7819a956ca25468727099fd020e134d87c8f68afd2427c94d88a51cbcf60e066
3:cpuset:/kubepods/burstable/podb62492fa-547e-48f6-a993-12a769cac6d5/7819a956ca25468727099fd020e134d87c8f68afd2427c94d88a51cbcf60e066
2:cpuacct:/kubepods/burstable/podb62492fa-547e-48f6-a993-12a769cac6d5/7819a956ca25468727099fd020e134d87c8f68afd2427c94d88a51cbcf60e066
1:cpu:/kubepods/burstable/podb62492fa-547e-48f6-a993-12a769cac6d5/7819a956ca25468727099fd020e134d87c8f68afd2427c94d88a51cbcf60e066
0::/kubepods/burstable/podb62492fa-547e-48f6-a993-12a769cac6d5/7819a956ca25468727099fd020e134d87c8f68afd2427c94d88a51cbcf60e066
"""


def test_the_real_nodes_cgroup_v1_hybrid_file_and_the_fake_of_it():
    want = PodCgroup("b62492fa-547e-48f6-a993-12a769cac6d5",
                     "7819a956ca25468727099fd020e134d87c8f68afd2427c94d88a51cbcf60e066")
    assert parse_proc_cgroup(REAL_V1_HYBRID) == want
    # the unit tests' fake writes exactly this layout
    assert cgroup_v1_cgroupfs(want.pod_uid, want.container_id, qos="burstable") == REAL_V1_HYBRID
    guaranteed = cgroup_v1_cgroupfs(want.pod_uid, want.container_id, qos="guaranteed", unified=False)
    assert f"4:memory:/kubepods/pod{want.pod_uid}/{want.container_id}\n" in guaranteed
    assert parse_proc_cgroup(guaranteed) == want


# ------------------------------------------------------------------------------ checkpoint


def _doc(entries):
    return json.dumps({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}, "Checksum": 7})


def test_checkpoint_both_device_id_formats():
    entries = ckpt.parse(_doc([
        {"PodUID": UID.upper(), "ContainerName": "c", "ResourceName": "r", "DeviceIDs": {"0": ["a"], "1": ["b"]}},
        {"PodUID": "u2", "ContainerName": "d", "ResourceName": "r", "DeviceIDs": ["x", "y"]},
        {"ContainerName": "no uid"},
    ]))
    assert entries == [ckpt.CheckpointEntry(UID, "c", "r", ("a", "b")), ckpt.CheckpointEntry("u2", "d", "r", ("x", "y"))]


@pytest.mark.parametrize("text", ["", "{", "[]", '{"Data": {}}', '{"Data": {"PodDeviceEntries": 3}}'])
def test_bad_checkpoints_raise_a_clear_error(text):
    with pytest.raises(ckpt.CheckpointError):
        ckpt.parse(text)


def test_missing_checkpoint_file_is_an_error_not_a_crash(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="cannot read"):
        ckpt.read(str(tmp_path / "absent"))


def test_join_maps_uids_through_device_ids_and_container_names():
    assigns = [ContainerDevices("ns", "a", "main", "r", ("d1", "d2")),
               ContainerDevices("ns", "b", "main", "r", ("d3",)),
               ContainerDevices("ns", "c", "main", "r", ("d4",))]
    entries = [ckpt.CheckpointEntry("ua", "main", "r", ("d1", "d2")),
               ckpt.CheckpointEntry("ub", "main", "r", ("d3",)),
               ckpt.CheckpointEntry("uc", "other", "r", ("d4",)),   # container name differs: no match
               ckpt.CheckpointEntry("ux", "main", "r2", ("d1",))]   # another resource: no match
    m = ckpt.join(assigns, entries)
    assert m.pods == {"ua": PodKey("ns", "a"), "ub": PodKey("ns", "b")}
    assert m.known_uids == {"ua", "ub", "uc", "ux"}


def test_join_never_guesses_between_two_uids():
    assigns = [ContainerDevices("ns", "a", "main", "r", ("d1", "d2"))]
    entries = [ckpt.CheckpointEntry("new", "main", "r", ("d1",)), ckpt.CheckpointEntry("stale", "main", "r", ("d2",))]
    assert ckpt.join(assigns, entries).pods == {}


# ------------------------------------------------------------------------------ device IDs

LONG = "MIG-GPU-0f6c3b1e-8d2a-4c5e-9b7f-1a2b3c4d5e01/1/0-with-a-long-suffix"


def test_device_ids_decode_to_cards():
    keys = key_index(["GPU-1", LONG])
    assert card_of_device("GPU-1", keys) == "GPU-1"
    assert card_of_device("GPU-1::17", keys) == "GPU-1"
    assert card_of_device(card_key(LONG), keys) == LONG
    assert card_of_device(card_key(LONG) + "::3", keys) == LONG
    assert card_of_device(LONG, keys) == LONG                      # NVIDIA's plugin: the plain UUID
    for other in ("GPU-2", "GPU-1::x", "GPU-1::", "::3", "", "cpu-0"):
        assert card_of_device(other, keys) is None


def test_holdings_count_units_per_resource():
    held = holders_by_card([
        ContainerDevices("ns", "p", "c", "nvidia.com/gpu-memory", ("GPU-1::0", "GPU-1::1", "GPU-2::0")),
        ContainerDevices("ns", "p", "c", "nvidia.com/gpu-core", ("GPU-1::5",)),
        ContainerDevices("ns", "q", "c", "nvidia.com/gpu", ("GPU-3",)),
        ContainerDevices("ns", "q", "c", "example.com/nic", ("eth7",)),
    ], ["GPU-1", "GPU-2", "GPU-3"])
    p, q = ContainerRef("ns", "p", "c"), ContainerRef("ns", "q", "c")
    assert held["GPU-1"] == {p: Holding(memory_units=2, core_units=1)}
    assert held["GPU-2"] == {p: Holding(memory_units=1)}
    assert held["GPU-3"] == {q: Holding(other=1)}


# ---------------------------------------------------------------------------------- split


def _card(used: int, util: float | None, procs: list[ProcUsage], util_known: bool = True) -> CardSample:
    return CardSample(0, "GPU-1", "m", 100, used, util, None, None, True, tuple(procs), util_known)


def test_split_single_holder_gets_the_card_and_nobody_gets_nothing():
    a = ContainerRef("ns", "a", "c")
    card = _card(60, 0.7, [ProcUsage(1, 10, 5.0)])
    s = split_card(card, {a: Holding(memory_units=3)}, {})
    assert (s.shares[a].memory_bytes, s.shares[a].utilization, s.estimated) == (60, 0.7, False)
    assert split_card(card, {}, {}).shares == {}


def test_split_measures_known_pods_and_ignores_foreign_processes():
    a, b = ContainerRef("ns", "a", "c"), ContainerRef("ns", "b", "c")
    card = _card(100, 0.9, [ProcUsage(1, 30, 40.0), ProcUsage(2, 50, 70.0), ProcUsage(3, 20, 90.0)])
    s = split_card(card, {a: Holding(memory_units=1), b: Holding(memory_units=1)},
                   {1: PodKey("ns", "a"), 2: PodKey("ns", "b"), 3: Owner.FOREIGN})
    assert (s.shares[a].memory_bytes, s.shares[b].memory_bytes) == (30, 50)
    assert (s.shares[a].utilization, s.shares[b].utilization) == pytest.approx((0.4, 0.7))
    assert not s.estimated


def test_split_caps_utilisation_at_one():
    a, b = ContainerRef("ns", "a", "c"), ContainerRef("ns", "b", "c")
    card = _card(100, 1.0, [ProcUsage(1, 30, 80.0), ProcUsage(2, 30, 70.0)])
    s = split_card(card, {a: Holding(memory_units=1), b: Holding(memory_units=1)},
                   {1: PodKey("ns", "a"), 2: PodKey("ns", "a")})
    assert s.shares[a].utilization == 1.0 and s.shares[b].utilization == 0.0


# -------------------------------------------------------------------------------- pod logs


def test_pod_log_directory_names(tmp_path):
    from exporter import podlogs
    assert podlogs.parse_dir_name(f"ml_serve-a-7d9f_{UID}") == (UID, PodKey("ml", "serve-a-7d9f"))
    assert podlogs.parse_dir_name("kube-system_etcd-node1_" + "f" * 32) == ("f" * 32, PodKey("kube-system", "etcd-node1"))
    for bad in ("ml_serve", f"ml__{UID}", f"_p_{UID}", "ml_p_not-a-uid", f"a_b_c_{UID}"):
        assert podlogs.parse_dir_name(bad) is None
    (tmp_path / f"ml_p_{UID}").mkdir()
    (tmp_path / "junk").mkdir()
    assert podlogs.read(str(tmp_path)) == {UID: PodKey("ml", "p")}
    with pytest.raises(podlogs.PodLogsError):
        podlogs.read(str(tmp_path / "absent"))


def test_a_card_without_utilisation_gives_no_pod_utilisation_rather_than_zero():
    a, b = ContainerRef("ns", "a", "c"), ContainerRef("ns", "b", "c")
    whole = split_card(_card(60, None, []), {a: Holding(other=1)}, {})
    assert whole.shares[a].utilization is None and whole.shares[a].memory_bytes == 60
    shared = split_card(_card(60, None, [ProcUsage(1, 10)], util_known=False),
                        {a: Holding(memory_units=1), b: Holding(memory_units=1)}, {1: PodKey("ns", "a")})
    assert shared.shares[a].utilization is None and shared.shares[a].memory_bytes == 10


def test_an_unknown_process_list_splits_the_card_itself_by_units_held():
    import dataclasses
    a, b = ContainerRef("ns", "a", "c"), ContainerRef("ns", "b", "c")
    holders = {a: Holding(memory_units=1, core_units=3), b: Holding(memory_units=3, core_units=1)}
    unknown = dataclasses.replace(_card(80, 0.4, [], util_known=False), processes_known=False)
    s = split_card(unknown, holders, {})
    assert s.estimated and s.shares[a].memory_bytes == 20 and s.shares[b].memory_bytes == 60
    assert s.shares[a].utilization == pytest.approx(0.3) and s.shares[b].utilization == pytest.approx(0.1)
    no_util = split_card(dataclasses.replace(unknown, utilization=None), holders, {})
    assert no_util.shares[a].utilization is None and no_util.shares[a].memory_bytes == 20
    # one holder still gets the card's own figures, measured
    whole = split_card(unknown, {a: Holding(other=1)}, {})
    assert not whole.estimated and whole.shares[a].memory_bytes == 80


def test_a_process_whose_owner_is_unknown_makes_the_split_estimated_even_when_every_holder_was_measured():
    """docs/metrics-contract.md: ``stowage_gpu_attribution_estimated`` is 1 when the split is
    estimated, "process owner unknown" among the reasons. A process of unknown owner (no /proc
    entry for it) may be one of the holders': when every holder had something measured, its
    memory and utilisation went to nobody and the card said 0, measured, though the holders'
    figures may miss it (the exporter audit's helper noticed it)."""
    a, b = ContainerRef("ns", "a", "c"), ContainerRef("ns", "b", "c")
    card = _card(100, 0.9, [ProcUsage(1, 30, 40.0), ProcUsage(2, 50, 30.0), ProcUsage(3, 20, 20.0)])
    s = split_card(card, {a: Holding(memory_units=1), b: Holding(memory_units=1)},
                   {1: PodKey("ns", "a"), 2: PodKey("ns", "b")})          # pid 3: owner unknown
    assert (s.shares[a].memory_bytes, s.shares[b].memory_bytes) == (30, 50)
    assert s.estimated
    known = split_card(card, {a: Holding(memory_units=1), b: Holding(memory_units=1)},
                       {1: PodKey("ns", "a"), 2: PodKey("ns", "b"), 3: Owner.FOREIGN})
    assert not known.estimated                                             # a host process: nobody's, measured
