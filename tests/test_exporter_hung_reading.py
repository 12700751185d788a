"""A reading that never ends: an NVML call that blocks (a wedged driver: the call ``nvidia-smi``
hangs in too) holds the snapshot lock for ever. Every scrape must still answer, with a clear "no
reading" (``stowage_exporter_up`` 0), and not pile up a waiting thread per scrape. Fake NVML
(pynvml functions), everything else real: the exporter serving HTTP, scrapes parsed as Prometheus
text."""
from __future__ import annotations

import logging
import threading

import pynvml

from exporter_harness import make_node
from fakenvml import default_cards

U0 = default_cards()[0].uuid


def test_scrapes_answer_without_a_reading_that_hangs_and_say_so(monkeypatch, tmp_path, caplog):
    """Before, each scrape behind the hung reading waited for the lock for ever: Prometheus saw
    timeouts, and the exporter kept one more thread per scrape (two replicas every 15 s: ~500 an
    hour) until its memory limit, while /healthz kept it alive."""
    for node in make_node(monkeypatch, tmp_path, exporter_config=dict(reading_wait_s=0.5)):
        assert node.scrape().value("stowage_gpu_healthy", gpu=U0) == 1
        hung, release = threading.Event(), threading.Event()
        real_count = node.nvml.nvmlDeviceGetCount

        def count() -> int:
            hung.set()
            release.wait()          # the driver does not answer (until the test ends)
            return real_count()
        monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", count)
        first = threading.Thread(target=node.scrape, daemon=True)
        first.start()               # takes the reading, and hangs in it
        try:
            assert hung.wait(30)
            with caplog.at_level(logging.WARNING, logger="stowage.exporter"):
                later = [node.scrape() for _ in range(3)]
            for s in later:
                assert s.up("nvml") == 0 and s.up("podresources") == 0
                assert s.samples("stowage_gpu_healthy") == []
            said = [r for r in caplog.records if "reading" in r.getMessage() and "not ended" in r.getMessage()]
            assert len(said) == 1, [r.getMessage() for r in caplog.records]
        finally:
            with caplog.at_level(logging.WARNING, logger="stowage.exporter"):
                release.set()
                first.join(30)
        assert any("ended after" in r.getMessage() for r in caplog.records)
        assert node.scrape().value("stowage_gpu_healthy", gpu=U0) == 1   # the next reading is whole
