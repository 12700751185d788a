"""Device IDs named in a refusal are quoted, so every one of them can be seen.

Found by reading a refusal for an empty device ID: it read ``unknown device ID(s) ; this plugin
never advertised them`` -- the empty ID vanished between "ID(s)" and ";", and an ID with a comma
or a space read as two. Each ID is now quoted as ``repr`` writes it (bounded in length).
"""
from __future__ import annotations

import pytest

from deviceplugin.allocator import AllocationRefused, _cards_of, some_ids
from gpunode.devices import DeviceTable
from gpunode.nvml import GpuInfo
from stowage.resources import RESOURCE_GPU

CARD = GpuInfo(0, "GPU-00000000-1111-2222-3333-444444444444", "NVIDIA A100", 81920, minor=0)


def _refusal(ids: list[str]) -> str:
    with pytest.raises(AllocationRefused) as exc:
        _cards_of(DeviceTable([CARD], 1024), RESOURCE_GPU, ids)
    return exc.value.message


def test_an_empty_device_id_is_visible_in_the_refusal():
    assert "unknown device ID(s) ''; " in _refusal([""])


def test_ids_with_a_comma_or_control_characters_read_as_one_quoted_id_each():
    msg = _refusal(["a, b", "x\ny"])
    assert "'a,b'" in msg or "'a, b'" in msg
    assert "\n" not in msg and "'x\\ny'" in msg


def test_a_huge_id_is_shown_bounded_and_the_list_still_says_how_many():
    msg = _refusal(["z" * 100_000])
    assert len(msg) < 400 and "100000 characters" in msg
    many = some_ids([str(n) for n in range(20)])
    assert many.startswith("'0', '1'") and "(20 devices)" in many
