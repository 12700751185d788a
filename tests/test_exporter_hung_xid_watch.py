"""The exporter's XID watcher when an NVML call it makes without a deadline never returns.

Found by experiment (helper audit, session 14): the device plugin's health thread has a watchdog
(``health_stall_s``) for its event wait; the exporter's XID watcher had none. An
``nvmlEventSetWait`` that did not return (a driver fault) stopped the watcher silently: no XID was
seen again, yet every card stayed ``stowage_gpu_healthy`` 1 as if watched, and nothing was logged.
Now a reading notices that the watcher has finished no round for ``xid_stall_s`` (the device
plugin's :class:`gpunode.backoff.Heartbeat`), says in which call it is once, serves the cards
registered for XID events as unhealthy (their XIDs go unseen, as while waits fail) and
``stowage_exporter_up{source="xid"}`` 0, until the call returns. Fake NVML (pynvml functions),
everything else real: the exporter serving HTTP, scrapes parsed as Prometheus text."""
from __future__ import annotations

import logging

import pynvml

from exporter_harness import make_node
from fakenvml import default_cards
from test_deviceplugin_hung_discovery import Hang
from test_exporter_failures import _healthy, _until

U0, U1, U2, U3 = (c.uuid for c in default_cards())


def _said(caplog, *words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if all(w in r.getMessage() for w in words)]


def test_a_hung_event_wait_is_said_and_blinds_the_watched_cards_until_it_returns(monkeypatch, tmp_path, caplog):
    for node in make_node(monkeypatch, tmp_path, xid_stall_s=1.0):
        s = node.scrape()
        assert _healthy(s) == {U0: 1, U1: 1, U2: 1, U3: 1} and s.up("xid") == 1
        hang = Hang("nvmlEventSetWait")
        hang.install(monkeypatch)
        try:
            _until(lambda: hang.hanging == 1, "the event wait hanging")
            with caplog.at_level(logging.WARNING, logger="stowage.exporter"):
                # the cards registered for XID events are blind; the T4 (no events) keeps its probes'
                _until(lambda: _healthy(node.scrape()) == {U0: 0, U1: 0, U2: 0, U3: 1}, "the stall noticed")
                scrapes = [node.scrape() for _ in range(3)]
            for s in scrapes:
                assert _healthy(s) == {U0: 0, U1: 0, U2: 0, U3: 1}
                assert s.up("xid") == 0 and s.up("nvml") == 1
                assert s.value("stowage_gpu_memory_total_bytes", gpu=U0) > 0   # telemetry is still read
            said = _said(caplog, "XID watcher", "nvmlEventSetWait")
            assert len(said) == 1, said
            node.nvml.xid(U1, 48)          # an XID while the wait hangs: NVML keeps it for the wait
            assert not hang.gave_up
        finally:
            hang.release()
        with caplog.at_level(logging.WARNING, logger="stowage.exporter"):
            # the wait returns: the watcher's own view again, the XID it missed meanwhile included
            _until(lambda: _healthy(node.scrape()) == {U0: 1, U1: 0, U2: 1, U3: 1}, "the watcher going on")
        assert node.scrape().up("xid") == 1
        assert len(_said(caplog, "XID watcher goes on again")) == 1


def test_a_hung_event_set_creation_in_the_watcher_is_noticed_too(monkeypatch, tmp_path, caplog):
    """Re-making the event set (after repeated failed waits) is the watcher's other call without a deadline."""
    for node in make_node(monkeypatch, tmp_path, xid_stall_s=1.0, xid_backoff_s=(0.01, 0.02), xid_recreate_after=1):
        node.scrape()
        hang = Hang("nvmlEventSetCreate")
        hang.install(monkeypatch)
        def wait(es, timeout_ms):             # every wait fails, so the set is re-made (and hangs)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        monkeypatch.setattr(pynvml, "nvmlEventSetWait", wait)
        try:
            _until(lambda: hang.hanging == 1, "re-making the event set hanging")
            with caplog.at_level(logging.WARNING, logger="stowage.exporter"):
                _until(lambda: node.scrape().up("xid") == 0 and _said(caplog, "XID watcher", "nvmlEventSetCreate"),
                       "the stall noticed")
            assert len(_said(caplog, "XID watcher", "nvmlEventSetCreate")) == 1
        finally:
            hang.release()
