"""The HorizontalPodAutoscaler's arithmetic (``autoscaling/v2``), as kube-controller-manager does it.

Pure functions and one small state holder, so the elastic benchmark scales its deployments the
way a real cluster would and the tests can check each rule on its own. Followed rules (from
``pkg/controller/podautoscaler``: ``replica_calculator.go`` and ``horizontal.go``):

1. Replica count for a per-pod metric with an ``AverageValue`` target (``Pods`` metric type,
   what Stowage's adapter rules serve): ``usageRatio = mean(metric of ready pods) / target``;
   pending pods are ignored, except that on a scale-up they are counted as using 0 (so pods
   still waiting for a node dampen further scale-out); within the tolerance (default 10 %) or
   when that correction flips the direction, the current count is kept; otherwise
   ``ceil(ratio * pods counted)``. With no ready pod there is no metric and nothing changes.
2. Stabilisation: the recommendation is clamped between the *minimum* of the raw
   recommendations in the scale-up window (default 0 s) and the *maximum* of those in the
   scale-down window (default 300 s) — a scale-down only happens once every recommendation of
   the last five minutes agrees.
3. Rate limits (the v2 default behaviour): up by at most max(+100 %, +4 pods) per 15 s, down by
   up to 100 % per 15 s, counted from the replicas at the start of the period; then
   ``minReplicas``/``maxReplicas``. A count outside min/max is brought back to it directly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

PODS, PERCENT = "Pods", "Percent"


@dataclass(frozen=True)
class ScalingPolicy:
    """One ``behavior.scale{Up,Down}.policies`` entry."""

    type: str       # "Pods" or "Percent"
    value: int
    period_s: float


@dataclass(frozen=True)
class HpaSpec:
    """The parts of an HPA object the arithmetic uses; defaults are Kubernetes' own."""

    target: float                  # target average value of the per-pod metric
    min_replicas: int = 1
    max_replicas: int = 10
    tolerance: float = 0.1
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    scale_up: tuple[ScalingPolicy, ...] = (ScalingPolicy(PERCENT, 100, 15.0), ScalingPolicy(PODS, 4, 15.0))
    scale_down: tuple[ScalingPolicy, ...] = (ScalingPolicy(PERCENT, 100, 15.0),)

    def __post_init__(self) -> None:
        if self.target <= 0:
            raise ValueError("HPA target must be positive")
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError(f"need 0 <= minReplicas <= maxReplicas and maxReplicas >= 1, got "
                             f"{self.min_replicas}/{self.max_replicas}")


def replicas_for(current: int, ready: int, metric_sum: float, pending: int, target: float,
                 tolerance: float = 0.1) -> int | None:
    """``calcPlainMetricReplicas`` from the ready pods' count and metric sum (all the rule needs):
    the replica count the metric asks for, or None when no ready pod reports the metric (the
    HPA then leaves the scale alone)."""
    if ready <= 0:
        return None
    usage = metric_sum / (ready * target)
    if not (pending > 0 and usage > 1.0):
        if abs(1.0 - usage) <= tolerance:
            return current
        return int(math.ceil(usage * ready))
    counted = ready + pending                       # pending pods count as using nothing
    new_usage = metric_sum / (counted * target)
    if abs(1.0 - new_usage) <= tolerance or new_usage < 1.0:
        return current                              # too small, or the direction would flip
    return int(math.ceil(new_usage * counted))


def metric_replicas(current: int, ready_values: Sequence[float], pending: int, target: float,
                    tolerance: float = 0.1) -> int | None:
    """:func:`replicas_for` from the ready pods' metric values."""
    return replicas_for(current, len(ready_values), float(sum(ready_values)), pending, target, tolerance)


def _change_in_period(events: Sequence[tuple[float, int]], now: float, period_s: float) -> int:
    return sum(n for t, n in events if t > now - period_s)


def scale_up_limit(current: int, ups: Sequence[tuple[float, int]], downs: Sequence[tuple[float, int]],
                   policies: Sequence[ScalingPolicy], now: float) -> int:
    """``calculateScaleUpLimitWithScalingRules`` with selectPolicy Max."""
    best = -(2**31)
    for p in policies:
        start = current - _change_in_period(ups, now, p.period_s) + _change_in_period(downs, now, p.period_s)
        proposed = start + p.value if p.type == PODS else int(math.ceil(start * (1 + p.value / 100.0)))
        best = max(best, proposed)
    return best


def scale_down_limit(current: int, ups: Sequence[tuple[float, int]], downs: Sequence[tuple[float, int]],
                     policies: Sequence[ScalingPolicy], now: float) -> int:
    """``calculateScaleDownLimitWithBehaviors`` with selectPolicy Max (the largest decrease)."""
    best = 2**31
    for p in policies:
        start = current - _change_in_period(ups, now, p.period_s) + _change_in_period(downs, now, p.period_s)
        proposed = start - p.value if p.type == PODS else int(start * (1 - p.value / 100.0))
        best = min(best, proposed)
    return best


@dataclass
class Hpa:
    """One HPA's controller state: past recommendations and scale events, for windows/limits."""

    spec: HpaSpec
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    ups: list[tuple[float, int]] = field(default_factory=list)
    downs: list[tuple[float, int]] = field(default_factory=list)

    def _forget(self, now: float) -> None:
        keep = max(self.spec.scale_down_window_s, self.spec.scale_up_window_s)
        longest = max([p.period_s for p in self.spec.scale_up + self.spec.scale_down] + [0.0])
        self.recommendations = [r for r in self.recommendations if r[0] > now - keep]
        self.ups = [e for e in self.ups if e[0] > now - longest]
        self.downs = [e for e in self.downs if e[0] > now - longest]

    def stabilize(self, now: float, current: int, desired: int) -> int:
        """``stabilizeRecommendationWithBehaviors``; records the raw recommendation."""
        s = self.spec
        up = down = desired
        for t, r in self.recommendations:
            if t > now - s.scale_up_window_s:
                up = min(up, r)
            if t > now - s.scale_down_window_s:
                down = max(down, r)
        self.recommendations.append((now, desired))
        return min(max(current, up), down)

    def limit(self, now: float, current: int, desired: int) -> int:
        """``convertDesiredReplicasWithBehaviorRate``: rate limits, then min/max."""
        s = self.spec
        if desired > current:
            cap = max(scale_up_limit(current, self.ups, self.downs, s.scale_up, now), current)
            return min(desired, min(s.max_replicas, cap))
        if desired < current:
            floor = min(scale_down_limit(current, self.ups, self.downs, s.scale_down, now), current)
            return max(desired, max(s.min_replicas, floor))
        return desired

    def step(self, now: float, current: int, ready: int, metric_sum: float, pending: int) -> int:
        """One sync of the controller: the new replica count (``current`` when nothing changes).
        ``ready``/``metric_sum``: how many ready pods report the metric and the sum of their
        values; ``pending``: pods not yet running."""
        self._forget(now)
        s = self.spec
        if current == 0 and s.min_replicas != 0:
            return 0  # scaled to zero by hand: autoscaling is off
        if current > s.max_replicas:
            new = s.max_replicas
        elif current < s.min_replicas:
            new = s.min_replicas
        else:
            wanted = replicas_for(current, ready, metric_sum, pending, s.target, s.tolerance)
            if wanted is None:
                return current
            new = self.limit(now, current, self.stabilize(now, current, wanted))
        if new > current:
            self.ups.append((now, new - current))
        elif new < current:
            self.downs.append((now, current - new))
        return new
