"""The ListAndWatch message must fit the kubelet's gRPC receive limit (4 MiB, the grpc-go default).

A v1.28 kubelet dials plugins without raising MaxCallRecvMsgSize: a larger device list fails its
ListAndWatch, it does not retry, and the node's capacity silently stays 0. A small
``--memory-unit-mib`` gets there (8 x H200 at 1 MiB: 71.6 MiB; at 16 MiB still 4.4 MiB). Before,
nothing warned; now the plugin refuses to start and names the smallest unit that fits.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from dp_harness import rig, short_tmpdir
from fakenvml import FakeCard, FakeNvml
from shared_paths import ROOT as _ROOT

from deviceplugin.server import (KUBELET_MAX_MESSAGE_BYTES, DevicePlugin, DeviceState, MessageTooLarge, PluginConfig,
                                 check_message_sizes, list_response_bytes)
from gpunode.devices import DeviceTable
from gpunode.nvml import GpuInfo
from stowage.resources import GPU_RESOURCES, RESOURCE_GPU_MEMORY

ROOT = str(_ROOT)
H200 = [GpuInfo(i, f"GPU-{i:08x}-1111-2222-3333-44444444444{i}", "NVIDIA H200", 143771, minor=i, numa=i // 4)
        for i in range(8)]


def _actual(cards: list[GpuInfo], resource: str, unit: int, healthy: bool) -> int:
    st = DeviceState(DeviceTable(cards, unit))
    st.set_health({c.uuid: healthy for c in cards})
    return st.list_response(resource).ByteSize()


@pytest.mark.parametrize("unit", [64, 1024, 5000, 143771])
def test_computed_size_is_the_size_of_the_message_the_plugin_sends(unit):
    odd = H200[:3] + [GpuInfo(9, "GPU-" + "f" * 80, "long uuid", 20000, numa=-1),   # hashed card key, no NUMA
                      GpuInfo(10, "GPU-tiny", "small", 1500, numa=0)]
    for resource in GPU_RESOURCES:
        assert list_response_bytes(odd, resource, unit) == _actual(odd, resource, unit, healthy=False)
        assert list_response_bytes(odd, resource, unit) >= _actual(odd, resource, unit, healthy=True)


def test_a_memory_unit_too_small_for_the_kubelet_is_refused_naming_the_smallest_that_fits():
    check_message_sizes(H200, GPU_RESOURCES, 1024)   # the default fits easily
    with pytest.raises(MessageTooLarge) as err:
        check_message_sizes(H200, GPU_RESOURCES, 1)
    msg = str(err.value)
    worst = list_response_bytes(H200, RESOURCE_GPU_MEMORY, 1)   # all Unhealthy: the longest the list gets
    assert worst > 71.6 * 2 ** 20   # the review measured 71.6 MiB with every device Healthy
    assert "nvidia.com/gpu-memory" in msg and f"{worst / 2 ** 20:.1f} MiB" in msg and "4 MiB" in msg
    smallest = err.value.smallest_unit_mib
    assert f"--memory-unit-mib {smallest}" in msg
    assert _actual(H200, RESOURCE_GPU_MEMORY, smallest, healthy=False) <= KUBELET_MAX_MESSAGE_BYTES
    assert list_response_bytes(H200, RESOURCE_GPU_MEMORY, smallest - 1) > KUBELET_MAX_MESSAGE_BYTES
    with pytest.raises(MessageTooLarge, match=f"--memory-unit-mib {smallest}"):
        check_message_sizes(H200, GPU_RESOURCES, 16)    # 4.38 MiB: just over
    check_message_sizes(H200, [r for r in GPU_RESOURCES if r != RESOURCE_GPU_MEMORY], 1)   # not advertised


def _fake_h200() -> list[FakeCard]:
    return [FakeCard(c.uuid, c.name, c.memory_mib, c.minor, f"00000000:{0x10 + c.index:02X}:00.0", numa=c.numa)
            for c in H200]


def test_plugin_refuses_to_start_before_serving(monkeypatch):
    FakeNvml(_fake_h200()).install(monkeypatch)
    plugin_dir = os.path.join(short_tmpdir(), "dp")
    plugin = DevicePlugin(PluginConfig(plugin_dir=plugin_dir, pod_resources_socket="", memory_unit_mib=8))
    with pytest.raises(MessageTooLarge, match="--memory-unit-mib"):
        plugin.start()
    assert not plugin.endpoints and os.listdir(plugin_dir) == []    # nothing served, nothing registered
    with rig(monkeypatch, cards=_fake_h200(), memory_unit_mib=64) as r:   # fits: registers as before
        assert r.registered()


def test_cli_exits_with_a_usage_error_naming_the_unit():
    base = short_tmpdir()
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{ROOT!r}, {os.path.join(ROOT, 'tests')!r}]
        from fakenvml import FakeNvml
        import test_deviceplugin_message_size as t
        FakeNvml(t._fake_h200()).install()
        from deviceplugin.cli import main
        main(["--plugin-dir", {os.path.join(base, "dp")!r}, "--no-kube", "--dev-root", {base!r},
              "--memory-unit-mib", "4", "--pod-resources-socket", ""])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--memory-unit-mib" in proc.stderr and "smallest unit that fits" in proc.stderr, proc.stderr
    assert not os.path.exists(os.path.join(base, "dp", "stowage-gpu-memory.sock"))   # never served


def test_cli_says_in_one_line_when_the_plugin_dir_cannot_be_made():
    """A --plugin-dir that cannot be created (a file in its way, a read-only mount) ended the
    plugin with a traceback; an operator's DaemonSet then crash-looped without saying which flag."""
    base = short_tmpdir()
    blocker = os.path.join(base, "not-a-dir")
    open(blocker, "w").close()
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{ROOT!r}, {os.path.join(ROOT, 'tests')!r}]
        from fakenvml import FakeNvml
        import test_deviceplugin_message_size as t
        FakeNvml(t._fake_h200()).install()
        from deviceplugin.cli import main
        main(["--plugin-dir", {os.path.join(blocker, "dp")!r}, "--no-kube", "--dev-root", {base!r},
              "--pod-resources-socket", ""])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("Error:")]
    assert "--plugin-dir" in line and os.path.join(blocker, "dp") in line and "Not a directory" in line, line
