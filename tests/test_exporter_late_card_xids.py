"""A card the exporter reads for the first time after its XID watcher started (unreadable at the
first reading, or answering again after a fault) must have its XID events watched too.

Found by experiment (session 14): the watcher registered the cards tracked when it started and no
other; a card first read later was tracked (its probes counted) but never registered for events,
so its XIDs (e.g. 48, a double-bit ECC error) went unseen and it stayed ``stowage_gpu_healthy`` 1
until NVML was initialised again. The device plugin registers such a late card in its running
watch (``XidWatch.add``); the exporter now hands late cards to its watcher thread, which adds them
(the watch is that thread's alone). Fake NVML (pynvml functions), everything else real."""
from __future__ import annotations

from exporter_harness import make_node
from fakenvml import default_cards
from test_exporter_failures import _healthy, _until

U0, U1, U2, U3 = (c.uuid for c in default_cards())


def test_a_card_first_read_after_the_watcher_started_has_its_xids_seen(monkeypatch, tmp_path):
    cards = default_cards()
    cards[2].lost = True                   # the A10 does not answer at the first reading
    for node in make_node(monkeypatch, tmp_path, cards=cards):
        s = node.scrape()
        assert set(_healthy(s)) == {U0, U1, U3}      # never read: no series yet
        assert node.nvml._sets                         # the watcher runs, without the A10
        node.nvml.restore(U2)
        assert node.scrape().value("stowage_gpu_healthy", gpu=U2) == 1
        _until(lambda: any(U2 in es["uuids"] for es in node.nvml._sets.values()), "the A10 registered for events")
        node.nvml.xid(U2, 48)
        _until(lambda: _healthy(node.scrape()) == {U0: 1, U1: 1, U2: 0, U3: 1}, "XID 48 of the late card seen")
