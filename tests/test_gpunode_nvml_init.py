"""NVML left uninitialised at start (an nvmlInit that passed its deadline, then failed) is initialised
again by the next count: gpunode.nvml's discovery side, against the fake NVML at the pynvml layer."""
from __future__ import annotations

from typing import Any

import pynvml

from fakenvml import FakeNvml, default_cards
from gpunode.nvml import Nvml


def test_a_count_initialises_nvml_again_and_an_odd_init_error_is_a_failed_count(monkeypatch: Any) -> None:
    """An nvmlInit that raises what pynvml never does (a broken library) is a count that failed, said
    as such: it must not raise out of the count (the background reads' back-off would not see it)."""
    nv = FakeNvml(default_cards(), driver_loaded=False)
    nv.install(monkeypatch)
    real = pynvml.nvmlInit
    odd = [ValueError("bad answer")]

    def init() -> None:
        if odd:
            raise odd.pop()
        real()
    monkeypatch.setattr(pynvml, "nvmlInit", init)
    nvml = Nvml()   # as after start_within's nvmlInit passed its deadline and then failed
    why = nvml.count_and_read()
    assert why is not None and "nvmlInit" in why and "ValueError" in why and nvml.uncounted == why
    why = nvml.count_and_read()
    assert why is not None and "Driver Not Loaded" in why and nv.initialised == 0
    nv.driver_loaded = True
    assert nvml.count_and_read() is None and nvml.cards_read() == [0, 1, 2, 3] and nv.initialised == 1
    assert nvml.count_and_read() is None and nv.initialised == 1   # initialised once, not per count
    nvml.shutdown()
    assert nv.initialised == 0
