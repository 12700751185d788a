"""gpunode.deadline: calls that may never return get a deadline, and at most one stuck worker per key."""
from __future__ import annotations

import threading

import pytest

from gpunode.deadline import DeadlineCalls, Stuck


def _workers(name: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(name))


def test_a_call_past_its_deadline_is_stuck_and_gets_no_second_worker_until_it_returns():
    release = threading.Event()
    calls = {"n": 0}

    def hangs() -> str:
        calls["n"] += 1
        release.wait()
        return "late answer"

    d = DeadlineCalls(0.05, name="dl-test-a")
    try:
        out = d.run({"a": hangs, "b": lambda: "fine"})
        assert out["b"] == "fine" and isinstance(out["a"], Stuck) and out["a"].new
        for _ in range(20):   # many rounds: the stuck key is answered at once, never called again
            again = d.run({"a": hangs, "b": lambda: "fine"})
            assert again["a"] == Stuck(new=False, waited_s=again["a"].waited_s) and again["b"] == "fine"
        assert calls["n"] == 1 and d.busy("a") and d.stuck() == ["a"]
        assert _workers("dl-test-a-a") == 1
    finally:
        release.set()
    assert d._stuck["a"].done.wait(10)
    assert d.answered("a") and not d.busy("a")
    assert d.run({"a": hangs})["a"] == "late answer"   # the late answer is handed back, not lost
    assert calls["n"] == 1 and not d.answered("a")
    assert d.run({"a": hangs})["a"] == "late answer" and calls["n"] == 2   # then called afresh


def test_an_error_is_raised_in_the_caller_after_every_call_was_waited_for():
    seen = []

    def boom() -> None:
        raise RuntimeError("a bug")

    d = DeadlineCalls(5.0, name="dl-test-b")
    with pytest.raises(RuntimeError, match="a bug"):
        d.run({"x": boom, "y": lambda: seen.append("y")})
    assert seen == ["y"] and not d.stuck()
