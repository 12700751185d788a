"""The events an XID storm kept quiet are counted in a warning line even when the storm ends.

Found by experiment (helper audit, session 13): the pacer (gpunode.health.XidLogPacer) logs the
first event of a kind loudly, then at most one a minute, and the count of the events it kept quiet
was said only by the next loud line. A storm that ended within its minute never got that line: the
log at warning level showed one XID 13 where there had been thousands.
"""
from __future__ import annotations

import logging
import re

from dp_harness import rig

from gpunode.health import XidLogPacer


def _accounted(caplog, uuid: str) -> int:
    """Events of XID 13 on ``uuid`` the warning lines account for: one per loud line, plus the counts
    they (and the summaries) give of events kept quiet."""
    n = 0
    for x in list(caplog.records):
        msg = x.getMessage()
        if x.levelno < logging.WARNING or "XID 13" not in msg or uuid not in msg:
            continue
        n += msg.startswith("NVML event: ")
        n += sum(int(m) for m in re.findall(r"(\d+) more such events", msg))
    return n


def test_the_events_a_storm_kept_quiet_are_counted_once_its_window_is_over(monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    with rig(monkeypatch, probe_interval_s=3600, recovery_quiet_s=3600, xid_log_every_s=0.3) as r:
        assert r.registered()
        u1 = r.uuid(1)
        for _ in range(200):
            r.nvml.xid(u1, 13)   # an application's fault: ignored, at the rate the application likes
        # no event follows the storm; its quiet events are still accounted for at warning level
        assert r.kube.wait_for(lambda: _accounted(caplog, u1) == 200)
        summaries = [x for x in caplog.records if x.getMessage().startswith("NVML events: ")]
        assert summaries and all(x.levelno == logging.WARNING for x in summaries)


def test_the_pacer_hands_out_each_windows_quiet_count_once_and_forgets_the_kind():
    now = [0.0]
    p = XidLogPacer(every_s=60, max_keys=4, clock=lambda: now[0])
    assert p.loud("a", 13) == (True, 0)
    assert [p.loud("a", 13) for _ in range(5)] == [(False, 0)] * 5
    assert p.loud("b", 48) == (True, 0)     # loud, nothing kept quiet: no summary to give
    assert p.summaries() == []              # the window is not over
    now[0] = 61
    assert p.summaries() == [("a", 13, 5)]
    assert p.summaries() == [] and p._last == {}   # said once; the kinds are forgotten
    assert p.loud("a", 13) == (True, 0)     # a new storm starts loud
