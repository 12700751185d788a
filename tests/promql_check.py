"""Check a PromQL expression against the series our processes really serve.

Why: an alert on a misspelt metric or label is not an error anywhere. Prometheus evaluates it to
an empty vector, the alert never fires, and nobody notices until the outage it was meant to
catch. Grafana draws such a panel as "No data". So every expression we ship (the PrometheusRule,
the Grafana dashboard) is parsed with a real PromQL parser (``promql-parser``, the Rust parser
GreptimeDB uses, with Python bindings; a syntax error is an error here too) and walked:

- every metric a selector names must be a series of the scrape (``series``: name -> label names,
  as read from the extender's, the exporter's and the device plugin's own /metrics);
- every label a selector matches on, an aggregation groups by (``by``/``without``), a vector
  match names (``on``/``ignoring``/``group_left``/``group_right``), ``histogram_quantile`` needs
  (``le``) must exist where it is used: the labels of each sub-expression are propagated as
  Prometheus computes them (an aggregation keeps its ``by`` labels, a one-to-one match on ``on``
  keeps those, a comparison keeps the left side's, ...), so ``sum by (verb) (...)`` followed by
  ``... by (outcome)`` is caught although both labels exist on the metric;
- a vector match whose two sides differ in the labels it compares (all but the ``ignoring`` ones,
  or the ``on`` ones) matches nothing, and is reported.

``TARGET_LABELS`` are the labels Prometheus itself adds to every scraped series (``instance``,
``job``); they are allowed everywhere. No other label is assumed: for the exporter ``namespace``
and ``pod`` are the workload's (``honorLabels``), so a rule must not rely on target labels of
that name.

What the result labels of an expression are is also what alert annotations (``$labels.x``) and
Grafana legends (``{{x}}``) may name: :func:`result_labels` gives them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

import promql_parser as pp

TARGET_LABELS = frozenset({"instance", "job"})

# Grafana's interval variables are not PromQL; a query is parsed with them replaced by a duration.
GRAFANA_INTERVALS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}

_SET_OPS = {"and", "or", "unless"}
_COMPARISONS = {"==", "!=", ">", "<", ">=", "<="}
_LABEL_ADDING_CALLS = {"label_replace", "label_join"}
_SCALAR_CALLS = {"time", "scalar", "pi"}


@dataclass
class Check:
    """What walking one expression found: the metric names it reads, and its problems."""

    metrics: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


Labels = frozenset[str] | None   # None: a scalar, or a sub-expression already reported unknown


class _Walker:
    def __init__(self, series: Mapping[str, frozenset[str]], check: Check) -> None:
        self.series, self.check = series, check

    def problem(self, msg: str) -> None:
        self.check.problems.append(msg)

    def need(self, labels: frozenset[str] | None, names: list[str], where: str) -> None:
        if labels is None:
            return
        for name in names:
            if name not in labels:
                self.problem(f"label {name!r} ({where}) is not on the series there (they have: "
                             f"{', '.join(sorted(labels)) or 'none'})")

    def labels(self, e: object) -> Labels:
        if isinstance(e, pp.VectorSelector):
            return self.selector(e)
        if isinstance(e, pp.MatrixSelector):
            return self.selector(e.vector_selector)
        if isinstance(e, (pp.ParenExpr, pp.UnaryExpr, pp.SubqueryExpr)):
            return self.labels(e.expr)
        if isinstance(e, (pp.NumberLiteral, pp.StringLiteral)):
            return None
        if isinstance(e, pp.Call):
            return self.call(e)
        if isinstance(e, pp.AggregateExpr):
            return self.aggregate(e)
        if isinstance(e, pp.BinaryExpr):
            return self.binary(e)
        self.problem(f"unhandled expression {type(e).__name__}: {e}")
        return None

    def selector(self, e: pp.VectorSelector) -> Labels:
        matchers = list(e.matchers.matchers) + [m for group in e.matchers.or_matchers for m in group]
        name = e.name
        if name is None:
            names = [m.value for m in matchers if m.name == "__name__" and str(m.op) == "MatchOp.Equal"]
            name = names[0] if names else None
        if name is None:
            self.problem(f"selector {e} names no metric: it would read every series")
            return None
        self.check.metrics.add(name)
        have = self.series.get(name)
        if have is None:
            self.problem(f"metric {name!r} is not served by any of our processes")
            return None
        labels = frozenset(have) | TARGET_LABELS
        self.need(labels, [m.name for m in matchers if m.name != "__name__"], f"matcher of {name}")
        return labels

    def call(self, e: pp.Call) -> Labels:
        func = e.func.name
        args = [self.labels(a) for a in e.args]
        if func in ("absent", "absent_over_time"):
            sel = e.args[0].vector_selector if isinstance(e.args[0], pp.MatrixSelector) else e.args[0]
            if isinstance(sel, pp.VectorSelector):
                return frozenset(m.name for m in sel.matchers.matchers
                                 if str(m.op) == "MatchOp.Equal" and m.name != "__name__")
            return frozenset()
        if func == "vector":
            return frozenset()
        if func in _SCALAR_CALLS:
            return None
        if func == "histogram_quantile":
            inner = args[1]
            self.need(inner, ["le"], "histogram_quantile needs the buckets' le")
            return None if inner is None else inner - {"le"}
        vectors = [a for a in args if a is not None]
        out = vectors[0] if vectors else None
        if func in _LABEL_ADDING_CALLS and out is not None:
            dst = e.args[1].val
            sources = [a.val for a in e.args[3:]] if func == "label_join" else [e.args[3].val]
            self.need(out, [s for s in sources if s], f"source label of {func}")
            out = out | {dst}
        return out

    def aggregate(self, e: pp.AggregateExpr) -> Labels:
        inner = self.labels(e.expr)
        op = str(e.op)
        if e.param is not None:
            self.labels(e.param)
        mod = e.modifier
        if mod is None:
            out: Labels = frozenset()
        else:
            self.need(inner, list(mod.labels), f"{op} {str(mod.type).rsplit('.', 1)[-1].lower()}")
            if str(mod.type).endswith("By"):
                out = frozenset(mod.labels)
            else:
                out = None if inner is None else inner - set(mod.labels)
        if op in ("topk", "bottomk", "limitk", "limit_ratio"):
            return inner
        if op == "count_values" and isinstance(e.param, pp.StringLiteral) and out is not None:
            out = out | {e.param.val}
        return out

    def binary(self, e: pp.BinaryExpr) -> Labels:
        lhs, rhs = self.labels(e.lhs), self.labels(e.rhs)
        op = str(e.op)
        if lhs is None or rhs is None:
            return lhs if rhs is None else rhs   # vector op scalar: the vector's labels
        mod = e.modifier
        matching = mod.matching if mod is not None else None
        on = matching is not None and str(matching.type).endswith("Include")
        names = list(matching.labels) if matching is not None else []
        if on:
            if op == "or":
                self.need(lhs | rhs, names, f"{op} on(...)")
            else:
                self.need(lhs, names, f"{op} on(...), left side")
                self.need(rhs, names, f"{op} on(...), right side")
        elif matching is not None:
            self.need(lhs | rhs, names, f"{op} ignoring(...)")
        group = list(mod.group_labels or []) if mod is not None and getattr(mod, "group_labels", None) else []
        card = str(mod.card) if mod is not None else "VectorMatchCardinality.OneToOne"
        if card.endswith("ManyToOne"):
            self.need(rhs, group, "group_left(...), the right side")
        elif card.endswith("OneToMany"):
            self.need(lhs, group, "group_right(...), the left side")
        if op in _SET_OPS:
            return lhs | rhs if op == "or" else lhs
        # The labels a vector match compares: all but the ignored ones, or the on() ones.
        if on:
            left_sig, right_sig = lhs & set(names), rhs & set(names)
        else:
            left_sig, right_sig = lhs - set(names), rhs - set(names)
        if left_sig != right_sig:
            self.problem(f"'{op}' matches on labels the two sides do not share: left "
                         f"{sorted(left_sig)}, right {sorted(right_sig)}; no sample would match "
                         "(use on(...) or ignoring(...))")
        if card.endswith("ManyToOne"):
            return lhs | set(group)
        if card.endswith("OneToMany"):
            return rhs | set(group)
        if op in _COMPARISONS and not (mod is not None and mod.return_bool):
            return lhs
        return frozenset(names) if on else lhs - set(names)


def grafana_to_promql(query: str) -> str:
    """A Grafana query with its interval variables replaced, so that it parses as PromQL."""
    for var, value in GRAFANA_INTERVALS.items():
        query = query.replace(var, value)
    return query


def check_expr(expr: str, series: Mapping[str, frozenset[str]]) -> Check:
    """Parse ``expr`` and check it against ``series`` (sample name -> its label names)."""
    check = Check()
    try:
        tree = pp.parse(expr)
    except Exception as exc:  # the parser raises its own error types
        check.problems.append(f"does not parse as PromQL: {exc}")
        return check
    _Walker(series, check).labels(tree)
    return check


def result_labels(expr: str, series: Mapping[str, frozenset[str]]) -> frozenset[str] | None:
    """The labels of ``expr``'s result (None for a scalar or an expression with problems)."""
    check = Check()
    try:
        out = _Walker(series, check).labels(pp.parse(expr))
    except Exception:
        return None
    return None if check.problems else out


_TEMPLATE_LABEL = re.compile(r"\$labels\.([A-Za-z_][A-Za-z0-9_]*)")
_LEGEND_LABEL = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def annotation_labels(text: str) -> set[str]:
    """The labels an alert annotation names (``{{ $labels.node }}``)."""
    return set(_TEMPLATE_LABEL.findall(text))


def legend_labels(text: str) -> set[str]:
    """The labels a Grafana legend names (``{{node}}``)."""
    return set(_LEGEND_LABEL.findall(text))


def parse_label_values(query: str) -> tuple[str, str] | None:
    """A Grafana variable query ``label_values(metric, label)`` as (metric selector, label)."""
    m = re.fullmatch(r"\s*label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", query)
    return (m.group(1), m.group(2)) if m else None
