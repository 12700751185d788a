"""What a ListAndWatch stream sends the kubelet while health changes: each change, never the same
list twice in a row, and always the final state.

Found by experiment (a card flapping every 0.7 ms against a stream whose reader takes 1 ms per
message): a few identical lists were sent back to back. The stream took the state's version, let
go of the lock and then built the list; a change in between went into that list, and the version
it brought was then sent again, unchanged. Now a list equal to the one sent last is not sent.
"""
from __future__ import annotations

import threading
from typing import Any

from deviceplugin.server import DeviceState, ResourceServicer
from gpunode.devices import DeviceTable
from gpunode.nvml import GpuInfo
from stowage.resources import RESOURCE_GPU

CARDS = [GpuInfo(i, f"GPU-0000000{i}-1111-2222-3333-444444444444", "NVIDIA A100", 81920) for i in range(2)]


class Stream:
    """The gRPC context of one ListAndWatch: active until :meth:`end`."""

    def __init__(self) -> None:
        self.active = True

    def is_active(self) -> bool:
        return self.active

    def end(self) -> None:
        self.active = False

    def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


def _health(resp: Any) -> list[str]:
    return [d.health for d in resp.devices]


def test_a_change_while_a_list_is_built_is_sent_once(monkeypatch):
    state = DeviceState(DeviceTable(CARDS, 1024))
    stop, ctx = threading.Event(), Stream()
    stream = ResourceServicer(RESOURCE_GPU, state, None, stop).ListAndWatch(None, ctx)
    assert _health(next(stream)) == ["Healthy", "Healthy"]

    built = DeviceState.list_response
    changes = iter([{CARDS[0].uuid: False, CARDS[1].uuid: True}])

    def change_while_building(self: DeviceState, resource: str) -> Any:
        change = next(changes, None)   # card 0 goes Unhealthy just as the list is built, once
        if change is not None:
            state.set_health(change)
        return built(self, resource)
    monkeypatch.setattr(DeviceState, "list_response", change_while_building)
    state.set_health({CARDS[0].uuid: True, CARDS[1].uuid: False})   # card 1 goes Unhealthy: a send
    assert _health(next(stream)) == ["Unhealthy", "Healthy"]          # the latest state, with both changes

    got: list[list[str]] = []
    reader = threading.Thread(target=lambda: got.extend(_health(r) for r in stream))
    reader.start()
    threading.Event().wait(0.5)   # nothing changes meanwhile: nothing is to be sent
    state.set_health({CARDS[0].uuid: True, CARDS[1].uuid: True})      # the final state, after a pause
    threading.Event().wait(0.6)   # the stream polls every 0.2 s
    stop.set()
    ctx.end()
    reader.join(5)
    # before: the list above was sent again (its version came after it), then the final one
    assert got == [["Healthy", "Healthy"]], got
