"""The latency benchmark's churn variant feeds pod events that the model really applies: a churn pod
asks for the slice its allocation record books, so the feeder honours the record (cards taken),
and its deletion gives them back. (A churn pod that asked for no GPU had its record refused: the
variant then measured event parsing only, not model updates.)"""
from __future__ import annotations

from benchmarks.latency import inproc
from benchmarks.latency.churn import Churn


def test_churn_events_take_and_give_back_cards(tmp_path, caplog):
    svc = inproc._service(50)
    churn = Churn(svc.model, 300, str(tmp_path / "stats.json"))
    free_before = float(svc.model.a.mem_free.sum())
    churn._bind_one(0)
    alloc = svc.model.allocations.get("churn-uid-0")
    assert alloc is not None and len(alloc.cards) == 1 and alloc.mem_mib == (2048,)
    assert float(svc.model.a.mem_free.sum()) == free_before - 2048
    assert "not honoured" not in caplog.text
    churn.feeder._apply_pod(churn.live.popleft(), deleted=True)
    assert "churn-uid-0" not in svc.model.allocations
    assert float(svc.model.a.mem_free.sum()) == free_before
