"""Numbers written as text by a peer, an operator or a pod author's node labels.

``str.isdigit()`` accepts ``²`` that ``int()`` refuses, and ``int()`` refuses more than 4,300
digits; either was a traceback at each place below. Every place reads through
``stowage.digits.whole_number``, and each is pinned here on both traps.
"""

from __future__ import annotations

import io

import pytest
from kubernetes.client.exceptions import ApiException

from extender.intake import BodyReader
from extender.kube import retry_after_s
from gpunode.devices import SEP, DeviceTable, UnknownDevice
from gpunode.health import parse_ignored_xids
from gpunode.nvml import GpuInfo
from stowage.clickcheck import parse_host_port
from stowage.digits import whole_number
from stowage.inventory import GFD_COUNT, InventoryError, inventory_from_node
from stowage.resources import RESOURCE_GPU_MEMORY

HUGE = "9" * 5000   # past CPython's int() digit limit (4,300)


@pytest.mark.parametrize("text, cap, want", [
    ("0", 10, 0), ("7", 10, 7), ("007", 10, 7), ("10", 10, 10), ("11", 10, 10),
    ("123456", 1000, 1000), (HUGE, 1000, 1000), ("0" * 5000 + "5", 1000, 5),
    ("", 10, None), (" 5", 10, None), ("-1", 10, None), ("+1", 10, None), ("1_0", 10, None),
    ("1.0", 10, None), ("\u00b2", 10, None), ("1\u0663", 10, None),
])
def test_whole_number_reads_ascii_digits_and_clamps_to_its_cap(text, cap, want):
    assert whole_number(text, cap) == want


def test_a_retry_after_of_thousands_of_digits_is_a_very_long_wait_not_a_traceback():
    exc = ApiException(status=429)
    exc.headers = {"Retry-After": HUGE}
    assert retry_after_s(exc) is not None and retry_after_s(exc) > 10**9   # the feeder holds it to its ceiling


def test_a_content_length_of_thousands_of_digits_is_too_large_not_a_traceback():
    reader = BodyReader(limit=100)
    body, held = reader.read({"CONTENT_LENGTH": HUGE, "wsgi.input": io.BytesIO(b"{}")})
    reader.done(held)
    assert getattr(body, "status", None) == 413


def test_a_gfd_count_label_of_thousands_of_digits_is_the_labels_own_error():
    node = {"metadata": {"name": "n", "labels": {GFD_COUNT: HUGE}}, "status": {"allocatable": {}}}
    with pytest.raises(InventoryError, match="is not a whole number from 0 to"):
        inventory_from_node(node)


@pytest.mark.parametrize("port", [HUGE, "\u00b2", "0", "65536"])
def test_a_port_that_is_no_port_gets_the_flags_message(port):
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        parse_host_port(f"0.0.0.0:{port}")


def test_a_device_unit_of_thousands_of_digits_is_an_unknown_device():
    table = DeviceTable([GpuInfo(index=0, uuid="GPU-a", name="A100", memory_mib=1024)], memory_unit_mib=256)
    last = table.devices(RESOURCE_GPU_MEMORY, {})[-1].id
    assert table.card_of(RESOURCE_GPU_MEMORY, last).uuid == "GPU-a"
    key = last.rpartition(SEP)[0]
    for unit in (HUGE, "\u00b2"):
        with pytest.raises(UnknownDevice):
            table.card_of(RESOURCE_GPU_MEMORY, key + SEP + unit)
        assert table.unit_number(key + SEP + unit) >= 0


@pytest.mark.parametrize("text", [HUGE, "13 \u00b2"])
def test_an_ignored_xid_that_is_no_number_gets_the_options_message(text):
    with pytest.raises(ValueError, match="ignored XIDs must be numbers"):
        parse_ignored_xids(text)
