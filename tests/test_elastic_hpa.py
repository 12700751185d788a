"""The HPA arithmetic of the elastic benchmark against the Kubernetes rules
(pkg/controller/podautoscaler: replica_calculator.go, horizontal.go)."""
from __future__ import annotations

import pytest

from benchmarks.elastic.hpa import (PERCENT, PODS, Hpa, HpaSpec, ScalingPolicy, metric_replicas, scale_down_limit,
                                    scale_up_limit)


# ------------------------------------------------------------------ replica calculator
def test_desired_is_ceil_of_current_times_ratio():
    # 3 pods at 90 against a target of 60: ratio 1.5 -> ceil(4.5) = 5
    assert metric_replicas(3, [90, 90, 90], 0, 60) == 5
    # 4 pods at 20 against 60: ratio 1/3 -> ceil(1.33) = 2
    assert metric_replicas(4, [20, 20, 20, 20], 0, 60) == 2
    # uneven pods use the mean: (100 + 20) / 2 / 50 = 1.2 -> ceil(2.4) = 3
    assert metric_replicas(2, [100, 20], 0, 50) == 3


def test_tolerance_keeps_the_current_count():
    assert metric_replicas(10, [54] * 10, 0, 50) == 10   # ratio 1.08: within 10 %
    assert metric_replicas(10, [46] * 10, 0, 50) == 10   # ratio 0.92
    assert metric_replicas(10, [56] * 10, 0, 50) == 12   # ratio 1.12: ceil(11.2)
    assert metric_replicas(10, [44] * 10, 0, 50) == 9    # ratio 0.88: ceil(8.8)
    assert metric_replicas(10, [56] * 10, 0, 50, tolerance=0.2) == 10


def test_pending_pods_count_as_zero_on_scale_up():
    # 2 ready at 100 (target 50) and 2 pending: 200 / (4*50) = 1.0 -> no further scale-out
    assert metric_replicas(4, [100, 100], 2, 50) == 4
    # one pending: 200 / (3*50) = 1.33 -> ceil(4.0) = 4
    assert metric_replicas(3, [100, 100], 1, 50) == 4
    # 3 pending dilute below target: direction would flip, keep current
    assert metric_replicas(5, [100, 100], 3, 50) == 5


def test_pending_pods_are_ignored_on_scale_down():
    # ratio 0.5 on the ready pods; pending pods do not enter: ceil(0.5 * 2) = 1
    assert metric_replicas(5, [25, 25], 3, 50) == 1


def test_no_ready_pod_no_decision():
    assert metric_replicas(3, [], 3, 50) is None
    h = Hpa(HpaSpec(target=50, max_replicas=10))
    assert h.step(0, 3, 0, 0, 3) == 3


# ------------------------------------------------------------------ stabilisation
def test_scale_down_waits_for_the_window():
    h = Hpa(HpaSpec(target=50, max_replicas=20, scale_down_window_s=300))
    assert h.step(0, 10, 10, 500, 0) == 10          # recommendation 10 at t=0
    assert h.step(60, 10, 10, 100, 0) == 10         # wants 2, but 10 was recommended within 300 s
    assert h.step(240, 10, 10, 100, 0) == 10
    assert h.step(301, 10, 10, 100, 0) == 2         # t=0 left the window; max(2, 2, 2) = 2


def test_scale_down_goes_to_the_highest_recent_recommendation():
    h = Hpa(HpaSpec(target=50, max_replicas=20, scale_down_window_s=300))
    h.step(0, 10, 10, 500, 0)        # 10
    h.step(100, 10, 10, 300, 0)      # wants 6 -> held at 10
    assert h.step(350, 10, 10, 100, 0) == 6   # window holds 6 (t=100) and 2 (now): max is 6


def test_scale_up_is_immediate_by_default():
    h = Hpa(HpaSpec(target=50, max_replicas=20))
    h.step(0, 4, 4, 80, 0)
    assert h.step(15, 4, 4, 300, 0) == 6


def test_scale_up_window_takes_the_minimum():
    h = Hpa(HpaSpec(target=50, max_replicas=20, scale_up_window_s=60))
    h.step(0, 4, 4, 200, 0)                 # recommendation 4
    assert h.step(30, 4, 4, 400, 0) == 4   # wants 8; min over the up-window is 4
    assert h.step(61, 4, 4, 400, 0) == 8


# ------------------------------------------------------------------ rate limits, min/max
def test_default_scale_up_limit_is_double_or_plus_four():
    assert scale_up_limit(1, [], [], HpaSpec(target=1).scale_up, now=0) == 5      # +4 pods
    assert scale_up_limit(10, [], [], HpaSpec(target=1).scale_up, now=0) == 20    # +100 %
    # 6 were added 10 s ago: the period started at 4 -> max(8, 8)
    assert scale_up_limit(10, [(-10, 6)], [], HpaSpec(target=1).scale_up, now=0) == 8
    # an event older than the 15 s period no longer counts
    assert scale_up_limit(10, [(-16, 6)], [], HpaSpec(target=1).scale_up, now=0) == 20


def test_scale_down_limits():
    assert scale_down_limit(10, [], [], HpaSpec(target=1).scale_down, now=0) == 0
    pol = (ScalingPolicy(PODS, 2, 60), ScalingPolicy(PERCENT, 10, 60))
    assert scale_down_limit(10, [], [], pol, now=0) == 8       # the larger decrease (Max policy)
    assert scale_down_limit(10, [], [(-30, 2)], pol, now=0) == 10  # already removed 2 this period


def test_rate_limit_applies_before_max_replicas():
    h = Hpa(HpaSpec(target=10, max_replicas=30))
    assert h.step(0, 5, 5, 500, 0) == 10          # wants 50, limited to 2 x 5
    assert h.step(5, 10, 10, 1000, 0) == 10        # same 15 s period began at 5: max(2 x 5, 5 + 4)
    assert h.step(20, 10, 10, 1000, 0) == 20       # new period: 2 x 10
    assert h.step(40, 20, 20, 2000, 0) == 30       # maxReplicas


def test_min_replicas_floor_and_out_of_range_counts():
    h = Hpa(HpaSpec(target=50, min_replicas=3, max_replicas=10, scale_down_window_s=0))
    assert h.step(0, 8, 8, 8, 0) == 3              # wants 1, floor 3
    assert h.step(100, 12, 12, 600, 0) == 10        # above max: back to max directly
    assert h.step(200, 1, 1, 500, 0) == 3              # below min: back to min directly
    assert h.step(300, 0, 0, 0, 0) == 0                 # scaled to zero by hand: autoscaling off


def test_spec_validation():
    with pytest.raises(ValueError):
        HpaSpec(target=0)
    with pytest.raises(ValueError):
        HpaSpec(target=1, min_replicas=5, max_replicas=2)
