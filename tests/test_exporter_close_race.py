"""A reading that starts the XID watcher while the exporter closes must not leave the watcher running.

Found in review (session 14): :meth:`NvmlReader.read` checked "not closed" and then started the
watcher; a ``close()`` between the two (the exporter stopping while a scrape reads) found no
watcher to stop, shut NVML down, and the watcher started after it ran for the rest of the
process, waiting on an event set of a closed session. Fake NVML (pynvml functions), the reader real.
"""
from __future__ import annotations

import threading
import time

import exporter.nvmlreader as nvmlreader
from exporter.nvmlreader import NvmlReader
from fakenvml import FakeNvml, default_cards


def test_a_close_during_the_watchers_start_stops_it(monkeypatch):
    FakeNvml(default_cards()).install(monkeypatch)
    reader = NvmlReader(retry_s=0.0)
    closer: list[threading.Thread] = []
    real_watch = nvmlreader.XidWatch

    def watch_made_while_closing(*args, **kwargs):
        # The exporter stops just as the first reading starts its watcher.
        t = threading.Thread(target=reader.close)
        closer.append(t)
        t.start()
        time.sleep(0.3)
        return real_watch(*args, **kwargs)

    monkeypatch.setattr(nvmlreader, "XidWatch", watch_made_while_closing)
    reader.read()
    closer[0].join(10)
    assert not closer[0].is_alive()
    left = [t for t in threading.enumerate() if t.name == "exporter-xid" and t.is_alive()]
    assert not left, "the XID watcher outlived close()"
