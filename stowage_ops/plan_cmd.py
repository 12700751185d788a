"""`stowage plan`: what-if answers before scaling — how many more pods of a shape fit now and
where, which nodes could be emptied for the cluster autoscaler by moving the fewest pods, and
(``--preempt``) what it would take for a pod of a shape and priority: which pods would have to
go where (the extender's preempt verb, :mod:`packing.preempt`).

All answers come from :mod:`stowage_ops.planning`, which simulates the extender's own placement
code on a copy of the cluster; nothing is changed on the cluster.
"""
from __future__ import annotations

import json
from typing import Any, Callable

import click

from stowage.bounded import WholeRange
from stowage.clickcheck import after_parsing
from stowage.resources import fmt_cards
from stowage_ops.cluster_source import (LearnFrom, LiveFacts, OperatorCommand, Source, cluster_options,
                                        learn_options, load, output_option, say, shapes_option)
from stowage_ops.planning import (DEFAULT_LIMIT, SHAPE_GRAMMAR, CapacityResult, DrainPlan, GpuAllocatable, Learned,
                              PreemptPlan, Shape, capacity, drain_plan, placer_names, pod_asks, preemption_plan, unmatched_models)
from stowage.textable import render

# Long work (a --shape counted to --limit, --drain's candidates: minutes each on thousands of
# nodes) says how far it is on stderr every this many pods placed or nodes tried.
PROGRESS_EVERY = 1000
MAX_LIMIT = 1_000_000   # --limit: pods counted per shape (each is placed on a copy of the model)
MAX_NODES = 100_000     # --max-nodes, --top: more nodes than any cluster has (Kubernetes supports 5,000)


def _capacity_text(res: CapacityResult, top: int, unmatched: list[str], models: list[str]) -> str:
    more = "at least " if res.limited else ""
    lines = [f"{more}{res.count} more pod(s) of {res.shape.describe()} [{res.shape.text}] fit now"]
    if unmatched:
        lines.append(f"  no card of this cluster is a {' or '.join(unmatched)} (models here: "
                     f"{', '.join(models) or 'none known'})")
    if res.per_node:
        items = list(res.per_node.items())
        rows = [[n, c] for n, c in items[:top]]
        if len(items) > top:
            rows.append([f"... {len(items) - top} more node(s)", sum(c for _, c in items[top:])])
        lines.append(render(["NODE", "PODS"], rows, indent="  "))
    if res.why_not:
        lines.append("  then nothing more fits:")
        lines += [f"    {count} node(s): {why}" for why, count in res.why_not.items()]
    return "\n".join(lines)


# What a drain plan does not check. Before, this line said "Only GPU pods are modelled: CPU-only
# pods ... must also be movable", although a live cluster's CPU-only pods are moved like the rest.
DRAIN_CAVEAT = ("  Moves are checked as the extender checks them (cards, host CPU and memory, pod slots): "
                "kube-scheduler's own rules (node selectors and affinity, taints, volumes) and "
                "PodDisruptionBudgets are not; DaemonSet pods stay with their node, as the cluster "
                "autoscaler leaves them.")


def _drain_text(plan: DrainPlan, nodes_total: int, max_nodes: int | None = None) -> str:
    """The drain plan for people: what is emptied, which nodes stay and why, and how many the plan
    never tried because ``--max-nodes`` was reached (before, those read as if none were left)."""
    lines = [f"{len(plan.drained)} of {nodes_total} GPU node(s) can be emptied ({plan.gpus_freed} GPUs) "
             f"by moving {len(plan.moves)} pod(s):"]
    rows: list[list[Any]] = []
    for d in plan.drained:
        if not d.moves:
            rows.append([d.node, d.gpus, "(already empty)", "", ""])
        for m in d.moves:
            rows.append([d.node, d.gpus, m.pod, m.shape, f"{m.target} {fmt_cards(m.target_cards)}"])
    if rows:
        lines.append(render(["NODE", "GPUS", "MOVE POD", "SHAPE", "TO"], rows, indent="  "))
    if plan.kept:
        lines.append(f"  {len(plan.kept)} node(s) stay: " +
                     "; ".join(f"{n}: {why}" for n, why in list(plan.kept.items())[:10]) +
                     (" ..." if len(plan.kept) > 10 else ""))
    if plan.not_tried:
        lines.append(f"  {plan.not_tried} node(s) not tried (--max-nodes {max_nodes}): the plan stopped "
                     f"at {len(plan.drained)} emptied")
    lines.append(DRAIN_CAVEAT)
    return "\n".join(lines)


def _preempt_text(plan: PreemptPlan, top: int) -> str:
    head = f"what it would take to place {plan.shape.describe()} [{plan.shape.text}] at priority {plan.priority}:"
    if plan.fits_now:
        fit_now = [o.node for o in plan.options if not o.evict]
        return (f"{head}\n  nothing: it fits now on {len(fit_now)} node(s) "
                f"({', '.join(fit_now[:top])}{' ...' if len(fit_now) > top else ''})")
    lines = [head]
    if not plan.options:
        lines.append("  no eviction of lower-priority pods would make room")
    rows: list[list[Any]] = []
    for o in plan.options[:top]:
        for j, e in enumerate(o.evict):
            rows.append([o.node if j == 0 else "", e.pod, e.priority, e.shape, ",".join(map(str, e.cards))])
    if rows:
        lines.append(render(["NODE", "EVICT POD", "PRIORITY", "HOLDS", "CARDS"], rows, indent="  "))
    if len(plan.options) > top:
        lines.append(f"  ... {len(plan.options) - top} more node(s)")
    if plan.no_help:
        lines.append("  no eviction helps on:")
        lines += [f"    {count} node(s): {why}" for why, count in plan.no_help.items()]
    return "\n".join(lines)


def _every(line: Callable[..., str]) -> Callable[..., None]:
    """A progress callback whose first argument counts up: every :data:`PROGRESS_EVERY`, ``line``
    of its arguments goes to stderr (stdout, the answer or its JSON, stays as it is)."""
    def tell(n: int, *rest: Any) -> None:
        if n % PROGRESS_EVERY == 0:
            say(line(n, *rest), err=True)
    return tell


def _placer_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value not in placer_names():
        raise click.BadParameter(f"unknown placement policy {value!r} (known: {', '.join(placer_names())})", ctx, param)
    return value


def _check_plan(ctx: click.Context) -> None:
    """What to plan, and options that need another (checked while parsing: OperatorCommand)."""
    p = ctx.params
    if not p["shapes"] and not p["drain"] and not p["preempt_shapes"]:
        raise click.UsageError("nothing to plan: give --shape SHAPE (repeatable), --drain and/or --preempt SHAPE", ctx)
    for flag, given in (("--any-model", p["any_model"]), ("--max-nodes", p["max_nodes"] is not None)):
        if given and not p["drain"]:
            raise click.UsageError(f"{flag} only applies to --drain", ctx)
    given = {name for name in ("limit", "top")
             if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}
    if "limit" in given and not p["shapes"]:   # (a default would change nothing: only one typed)
        raise click.UsageError("--limit only applies to --shape (it stops counting a shape)", ctx)
    if "top" in given and not p["shapes"] and not p["preempt_shapes"]:
        raise click.UsageError("--top only applies to --shape and --preempt (--drain lists every node it empties)",
                               ctx)
    if p["priority"] is not None and not p["preempt_shapes"]:
        raise click.UsageError("--priority only applies to --preempt (--shape counts pods as they are, "
                               "without evicting any)", ctx)
    if p["preempt_shapes"] and p["priority"] is None:
        raise click.UsageError("--preempt needs --priority N: the pod's priority (the value of its PriorityClass)", ctx)


@click.command("plan", cls=OperatorCommand, epilog="Shape grammar (--shape):\n\n\b\n" + SHAPE_GRAMMAR)
@cluster_options
@click.option("--shape", "shapes", multiple=True, metavar="SHAPE", callback=shapes_option,
              help="How many more pods of this shape fit, and where (repeatable; grammar below).")
@click.option("--drain", is_flag=True, help="Which nodes could be emptied by moving the fewest pods.")
@click.option("--preempt", "preempt_shapes", multiple=True, metavar="SHAPE", callback=shapes_option,
              help="What it would take to place one pod of this shape at --priority: which lower-priority "
                   "pods would have to go where, best node first (repeatable).")
@click.option("--priority", type=WholeRange(-(2 ** 31), 2 ** 31 - 1), default=None,
              help="With --preempt: the pod's priority (its PriorityClass value); only pods of lower "
                   "priority can be evicted for it.")
@click.option("--placer", default="pack", show_default=True, callback=_placer_option,
              help="Placement policy to simulate: pack, spread, or a placer name (e.g. most-allocated).")
@click.option("--limit", type=WholeRange(1, MAX_LIMIT), default=DEFAULT_LIMIT, show_default=True,
              help="Stop counting a shape after this many pods.")
@click.option("--any-model", is_flag=True,
              help="With --drain, for pods whose own ask is unknown (a simulated cluster's; a live "
                   "cluster's pods move as they ask): let them move to other GPU models (whole-GPU pods "
                   "still only to cards at least as large). Default: such a pod only moves to its "
                   "current model.")
@click.option("--max-nodes", type=WholeRange(1, MAX_NODES), default=None, help="With --drain: empty at most this many nodes.")
@click.option("--top", type=WholeRange(1, MAX_NODES), default=15, show_default=True, help="Nodes listed per shape.")
@learn_options
@output_option
@after_parsing(_check_plan)
def plan(source: Source, shapes: list[Shape], drain: bool, preempt_shapes: list[Shape],
         priority: int | None, placer: str, limit: int, any_model: bool, max_nodes: int | None, top: int,
         learn: LearnFrom, output: str) -> None:
    """What-if: how many more pods of a SHAPE fit right now and on which nodes; (--drain)
    which nodes the cluster autoscaler could remove after moving the fewest pods (CPU-only
    pods too; DaemonSet pods stay); (--preempt) which lower-priority pods would have to go
    where for one pod of a SHAPE.

    Pods are placed one by one with the extender's own fit, scoring and card-choice code on a
    copy of the cluster, so fragmentation counts: free memory spread over many cards does not
    make room for a big pod.

    \b
    Examples:
      stowage plan --simulated --fill 80 --shape 1x80Gi --shape 4 --shape 10Gi,30%
      stowage plan --kubeconfig ~/.kube/config --shape 1@H100 --drain
      stowage plan --kubeconfig ~/.kube/config --preempt 20Gi@L4 --priority 100000
    """
    marks = None
    if preempt_shapes and source.live:
        from extender.nominated import PodMarks
        marks = PodMarks(source.memory_unit_mib)
    # On a live cluster the what-if's placer learns what the live extender's has (LearnFrom).
    learn = learn if source.live else None
    facts = LiveFacts() if source.live else None
    model, what = load(source, marks, learn, facts)
    learned = Learned.of(learn.past, learn.pods, source.memory_unit_mib) if learn is not None else None
    if learn is not None:
        what += "\n" + learn.describe()
    prios = marks.all_priorities() if marks is not None else {}
    # kube-scheduler's own check of a node's allocatable nvidia.com/gpu (a live cluster's nodes)
    kube = GpuAllocatable(facts.gpu_allocatable) if facts is not None else None
    pplans = [preemption_plan(model, s, priority or 0, prios, allocatable=kube) for s in preempt_shapes]
    results = [capacity(model, s, placer=placer, limit=limit, learned=learned, allocatable=kube,
                        progress=_every(lambda n, s=s: f"shape {s.text}: {n} pods placed so far..."))
               for s in shapes]
    dplan = (drain_plan(model, placer=placer, keep_model=not any_model, max_nodes=max_nodes, learned=learned,
                        stays=facts.daemon_pods if facts else (), unrecorded=facts.unrecorded if facts else None,
                        asks=pod_asks(learn.pods, source.memory_unit_mib) if learn is not None else None,
                        progress=_every(lambda n, total: f"drain: {n} of {total} GPU nodes tried..."),
                        allocatable=kube)
             if drain else None)
    if output == "json":
        doc: dict[str, Any] = {"source": what.split("\n")[0], "placer": placer,
                               "capacity": [{**r.to_json(), "unmatchedModels": unmatched_models(
                                   model, r.shape.policy.models_include)} for r in results]}
        if learn is not None:
            doc["learned"] = {"pods": len(learn.pods), "departedPods": learn.past.pods if learn.past else 0,
                              "configMap": "/".join(learn.configmap) if learn.configmap else None,
                              "note": learn.note}
        if facts is not None:
            doc["unrecordedGpuPods"] = facts.unrecorded_pods()
            doc["podErrors"], doc["nodeErrors"] = facts.pod_errors, facts.node_errors
        if dplan is not None:
            doc["drain"] = dplan.to_json()
        if pplans:
            doc["preempt"] = [p.to_json() for p in pplans]
        click.echo(json.dumps(doc, indent=2))   # (JSON escapes control characters)
        return
    if facts is not None and facts.warning():
        what += "\n" + facts.warning()
    say(f"{what}\nplacement policy: {placer}\n")
    present = sorted({m for m in model.models if m != "UNKNOWN"})
    for r in results:
        say(_capacity_text(r, top, unmatched_models(model, r.shape.policy.models_include), present) + "\n")
    if dplan is not None:
        gpu_nodes = sum(1 for n, i in model.index.items() if model.a.exists[i].any())
        say(_drain_text(dplan, gpu_nodes, max_nodes))
    for p in pplans:
        say(_preempt_text(p, top) + "\n")
