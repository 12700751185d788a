"""A --memory-unit-mib larger than a card's memory makes that card offer no nvidia.com/gpu-memory
device at all: every shared-GPU pod is then refused there ("Insufficient nvidia.com/gpu-memory")
with nothing in the plugin's log to say why. Noticed by the command-line helper (session 15): the
plugin accepted the unit and advertised the cards' memory quietly as nothing."""
from __future__ import annotations

import logging

from dp_harness import rig

from stowage.resources import RESOURCE_GPU_MEMORY


def _warnings(caplog, *words: str) -> list[str]:
    return [x.getMessage() for x in caplog.records if x.levelno == logging.WARNING
            and all(w in x.getMessage() for w in words)]


def test_a_unit_larger_than_a_card_says_the_card_offers_no_gpu_memory(monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    with rig(monkeypatch, memory_unit_mib=200_000) as r:
        assert r.registered()
        assert not r.kubelet.devices(RESOURCE_GPU_MEMORY)     # what the warning explains
        said = _warnings(caplog, "--memory-unit-mib 200000", RESOURCE_GPU_MEMORY)
        assert len(said) == 1, said
        assert all(r.uuid(i) in said[0] for i in range(4)), said[0]


def test_a_unit_that_fits_every_card_says_nothing(monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    with rig(monkeypatch, memory_unit_mib=1024) as r:
        assert r.registered()
        assert r.kubelet.devices(RESOURCE_GPU_MEMORY)
    assert not _warnings(caplog, "--memory-unit-mib")
