"""The requeuer: pods the extender refused everywhere on a model that has since gained room are
patched (so kube-scheduler retries them), only while still pending, with their uid as a
precondition, and only those that can have raced the change.

Why it exists is in extender/requeue.py; the race it closes is reproduced against the real
kube-scheduler in tests/integration/test_real_scheduler.py."""
from __future__ import annotations

import time

from extender.requeue import REQUEUE_ANNOTATION, Requeuer
from extender.service import ExtenderService
from extender.wire import parse_extender_args
from extender_harness import gpus, model_from, take_whole
from packing.pod_policy import parse_policy


class Api:
    """Records patches; fails for the names in ``fail``."""

    def __init__(self, fail: set[str] | None = None) -> None:
        self.calls: list[tuple[str, str, dict]] = []
        self.fail = fail or set()

    def patch(self, namespace: str, name: str, body: dict) -> None:
        if name in self.fail:
            raise RuntimeError("Not Found")
        self.calls.append((namespace, name, body))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_refused_pods_still_pending_are_patched_with_their_uid_once() -> None:
    api = Api(fail={"gone"})
    pending = {"t/a": "uid-a", "t/gone": "uid-g", "t/recreated": "uid-new"}
    rq = Requeuer(api.patch, pending.get, now=lambda: 1234.5)
    rq.refused("uid-a", "t", "a", generation=5)
    rq.refused("uid-b", "t", "bound-meanwhile", generation=5)   # no longer pending: untouched
    rq.refused("uid-g", "t", "gone", generation=5)              # the API says 404: others still done
    rq.refused("uid-old", "t", "recreated", generation=5)       # same name, another pod: untouched
    assert rq.requeue_now() == 0  # the model has not gained room since
    rq.cards_freed(generation=6)
    assert rq.requeue_now() == 1
    assert api.calls == [("t", "a", {"metadata": {"uid": "uid-a", "annotations": {REQUEUE_ANNOTATION: "1234.500"}}})]
    assert rq.requeue_now() == 0  # once per refusal
    rq.refused("uid-a", "t", "a", generation=6)  # refused again, on the new model: legitimately
    assert rq.requeue_now() == 0
    rq.cards_freed(generation=9)
    assert rq.requeue_now() == 1


def test_only_recent_refusals_are_requeued_and_at_most_a_round_at_a_time() -> None:
    api, clock = Api(), Clock()
    pending = {f"t/p{i}": f"u{i}" for i in range(10)}
    rq = Requeuer(api.patch, pending.get, window_s=5, max_per_round=3, clock=clock)
    rq.refused("u0", "t", "p0", generation=1)
    clock.t += 6  # u0's refusal is older than the window: it did not race the coming change
    for i in range(1, 8):
        rq.refused(f"u{i}", "t", f"p{i}", generation=1)
    rq.cards_freed(generation=2)
    assert rq.requeue_now() == 3 and [c[1] for c in api.calls] == ["p7", "p6", "p5"]  # newest first
    assert rq.requeue_now() == 3 and rq.requeue_now() == 1 and rq.requeue_now() == 0
    assert "p0" not in [c[1] for c in api.calls]


def test_cards_freed_wakes_the_worker() -> None:
    api = Api()
    rq = Requeuer(api.patch, {"t/a": "uid-a"}.get, debounce_s=0.01).start()
    try:
        rq.refused("uid-a", "t", "a", generation=1)
        rq.cards_freed(generation=2)
        deadline = time.monotonic() + 5
        while not api.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [c[1] for c in api.calls] == ["a"]
    finally:
        rq.stop()


def test_tracking_is_bounded() -> None:
    rq = Requeuer(Api().patch, lambda key: None, max_tracked=3)
    for i in range(10):
        rq.refused(f"u{i}", "t", f"p{i}", generation=1)
    assert list(rq._refused) == ["u7", "u8", "u9"]


def test_the_service_reports_pods_that_fit_nowhere_with_the_models_generation() -> None:
    model = model_from({"nodes": [{"name": "n", "gpus": gpus("NVIDIA A100-SXM4-80GB", 2, "80Gi")}]})
    take_whole(model, "n", [0], "x")
    svc = ExtenderService(model)
    seen: list[tuple[str, str, str, int]] = []
    svc.on_refused = lambda uid, ns, name, gen: seen.append((uid, ns, name, gen))

    def ask(name: str, n: str) -> list[str]:
        pod = {"metadata": {"name": name, "namespace": "t", "uid": f"uid-{name}"},
               "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": n}}}]}}
        return svc.filter(parse_extender_args({"Pod": pod, "NodeNames": ["n"]})).node_names

    assert ask("fits", "1") == ["n"] and seen == []
    assert ask("waits", "2") == [] and seen == [("uid-waits", "t", "waits", model.generation)]


def test_the_annotation_is_ours_not_a_policy_typo() -> None:
    parse_policy({REQUEUE_ANNOTATION: "1234.500"})  # raises PolicyError for unknown stowage.io/ keys
