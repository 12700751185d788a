"""`stowage inspect`: per node and per card, what is allocated to which pod, what is free, card
health and fragmentation — from a live cluster or the embedded simulated one.

The report is built as plain data first (:func:`report`), then rendered as a table or JSON, so
the JSON is exactly what the table shows and tests can check either.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import click

from packing.frag import model_list
from packing.model import ClusterModel
from packing.stranded import typical_one_gpu_host_request, stranded_per_node, why_stranded
from stowage.clickcheck import after_parsing
from stowage_ops.cluster_source import (LearnFrom, LiveFacts, OperatorCommand, Source, cluster_options,
                                        learn_options, load, output_option, say, shapes_option)
from stowage_ops.planning import Learned, Shape, fragmentation, iter_nodes
from stowage.resources import CORE_MILLI_PER_CARD, fmt_mib
from stowage.textable import render


def report(model: ClusterModel, typical: Sequence[Shape] = (), nodes: Sequence[str] = (),
           notes: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """The whole picture as JSON-ready data. ``typical``: shapes for fragmentation (default:
    the shapes running now); ``nodes``: only these nodes (default all); ``notes``: per node, what
    the operator should know beyond its figures (a live cluster's :attr:`LiveFacts.node_notes`)."""
    frag = fragmentation(model, list(typical) or None)
    with model.lock:
        a = model.a
        # (not ``typical``, the fragmentation shapes above: a 1-GPU pod's host CPU and memory)
        one_gpu = typical_one_gpu_host_request(model.allocations.values())
        host_stranded = stranded_per_node(a, *one_gpu)
        out_nodes = []
        want = set(nodes)
        for i, name in iter_nodes(model):
            if want and name not in want:
                continue
            meta = model.meta.get(name)
            on_card: dict[int, list[dict[str, Any]]] = {}
            # A record the feed honoured may name a card this node does not list (a forged one,
            # or one from before the inventory changed): the pod holds no card row to be seen on.
            off_cards: list[dict[str, Any]] = []
            for uid in sorted(meta.pods if meta else ()):
                al = model.allocations.get(uid)
                if al is None:
                    continue
                missing = [k for k in al.cards if not (k < a.shape[1] and a.exists[i, k])]
                if missing:
                    off_cards.append({"pod": al.name, "uid": uid, "cards": missing})
                for k, mem, core in zip(al.cards, al.mem_mib, al.core_milli):
                    on_card.setdefault(k, []).append({"pod": al.name, "uid": uid, "whole": al.whole,
                                                      "memoryMiB": int(mem), "corePct": core / 10})
            cards = []
            for k in range(a.shape[1]):
                if not a.exists[i, k]:
                    continue
                cards.append({
                    "index": k, "uuid": model.card_uuid(name, k),
                    "model": meta.models.get(k, "UNKNOWN") if meta else "UNKNOWN",
                    "memoryMiB": int(a.mem_total[i, k]), "memoryFreeMiB": max(int(a.mem_free[i, k]), 0),
                    "coreFreePct": max(int(a.core_free[i, k]), 0) / 10, "healthy": bool(a.healthy[i, k]),
                    "freeMilli": int(frag.free[i, k]), "strandedMilli": int(frag.stranded[i, k]),
                    # booked beyond what the card has (records an unsigned cluster honours may
                    # double-book it): shown, where the free figures above stop at 0
                    "overbookedMiB": max(-int(a.mem_free[i, k]), 0),
                    "overbookedCorePct": max(-int(a.core_free[i, k]), 0) / 10,
                    "pods": on_card.get(k, []),
                })
            free, stranded = frag.node_totals(i)
            out_nodes.append({
                "name": name, "source": meta.source if meta else "", "schedulable": bool(a.node_ok[i]),
                # (a node without GPUs reads as an inventory from allocatable: whole-only, of nothing)
                "wholeOnly": bool(meta.whole_only) and bool(cards) if meta else False,
                "gpus": len(cards), "healthyGpus": sum(c["healthy"] for c in cards),
                "freeGpus": sum(1 for c in cards if c["healthy"] and not c["pods"]),
                "memoryMiB": sum(c["memoryMiB"] for c in cards),
                "memoryFreeMiB": sum(c["memoryFreeMiB"] for c in cards if c["healthy"]),
                "pods": len({p["uid"] for c in cards for p in c["pods"]}),
                "freeMilli": free, "strandedMilli": stranded,
                # free whole cards no 1-GPU pod can use for lack of CPU, memory or pod slots here
                "strandedWholeGpus": int(host_stranded[i]),
                "strandedBecause": why_stranded(a, i, *one_gpu) if host_stranded[i] else "",
                "overbookedCards": sum(1 for c in cards if c["overbookedMiB"] or c["overbookedCorePct"]),
                "podsOnMissingCards": off_cards,
                "notes": list((notes or {}).get(name, ())),
                "cards": cards,
            })
    gpus = sum(n["gpus"] for n in out_nodes)
    return {
        "summary": {"nodes": len(out_nodes), "gpus": gpus,
                    "healthyGpus": sum(n["healthyGpus"] for n in out_nodes),
                    "freeGpus": sum(n["freeGpus"] for n in out_nodes),
                    "pods": sum(n["pods"] for n in out_nodes),
                    "allocatedPct": _pct(sum(n["healthyGpus"] * CORE_MILLI_PER_CARD - n["freeMilli"] for n in out_nodes),
                                         sum(n["healthyGpus"] for n in out_nodes) * CORE_MILLI_PER_CARD),
                    "strandedPct": _pct(sum(n["strandedMilli"] for n in out_nodes), sum(n["freeMilli"] for n in out_nodes)),
                    "strandedWholeGpus": sum(n["strandedWholeGpus"] for n in out_nodes),
                    "typicalShapes": [s.describe() for s in frag.shapes]},
        "nodes": out_nodes,
        "podsOnUnknownNodes": [] if want else _pods_on_unknown_nodes(model),
    }


def _pods_on_unknown_nodes(model: ClusterModel) -> list[dict[str, Any]]:
    """Pods whose honoured record holds cards on a node the cluster does not list (deleted, or
    not yet back): the model keeps them, as the extender does, should the node return, and no node
    row shows them."""
    with model.lock:
        return sorted(({"pod": al.name, "uid": uid, "node": al.node, "cards": list(al.cards)}
                       for uid, al in model.allocations.items() if al.node not in model.index),
                      key=lambda p: (p["node"], p["pod"]))


def _pct(num: float, den: float) -> float:
    return round(100.0 * num / den, 1) if den else 0.0


def _gpus(x: float) -> str:
    return f"{x / CORE_MILLI_PER_CARD:.2f}"


def render_table(rep: dict[str, Any], cards: bool = True) -> str:
    s = rep["summary"]
    lines = [f"{s['nodes']} nodes, {s['gpus']} GPUs ({s['healthyGpus']} healthy, {s['freeGpus']} free), "
             f"{s['pods']} GPU pods; {s['allocatedPct']}% of healthy GPU capacity allocated; "
             f"{s['strandedPct']}% of the free capacity is stranded (no typical shape fits: "
             f"{', '.join(s['typicalShapes'])})"
             + (f"; {s['strandedWholeGpus']} free GPUs on nodes that cannot take a 1-GPU pod (CPU, memory or pod "
                f"slots gone)" if s["strandedWholeGpus"] else ""), ""]
    rows = []
    for n in rep["nodes"]:
        state = "ok" if n["schedulable"] else "unschedulable"
        if n["healthyGpus"] < n["gpus"]:
            state += f", {n['gpus'] - n['healthyGpus']} unhealthy"
        if n["wholeOnly"]:
            state += ", whole GPUs only"
        if n["strandedWholeGpus"]:
            state += f", {n['strandedWholeGpus']} free GPUs stranded ({n['strandedBecause']})"
        if n["overbookedCards"]:
            state += f", {n['overbookedCards']} card{'s' if n['overbookedCards'] > 1 else ''} overbooked"
        if n["podsOnMissingCards"]:
            state += f", {len(n['podsOnMissingCards'])} pod(s) on cards it does not have"
        state += "".join(f", {note}" for note in n["notes"])
        models = sorted({c["model"] for c in n["cards"]})
        rows.append([n["name"], "/".join(models) or "-", n["gpus"], n["freeGpus"], n["pods"],
                     f"{fmt_mib(n['memoryFreeMiB'])} / {fmt_mib(n['memoryMiB'])}" if n["memoryMiB"] else "-",
                     _gpus(n["freeMilli"]), _gpus(n["strandedMilli"]), state])
    lines.append(render(["NODE", "MODEL", "GPUS", "FREE", "PODS", "GPU MEM FREE", "FREE GPU", "STRANDED", "STATE"], rows))
    if cards:
        crow = []
        for n in rep["nodes"]:
            for c in n["cards"]:
                pods = ", ".join(p["pod"] + ("" if p["whole"] else f" ({fmt_mib(p['memoryMiB'])}"
                                             + (f", {p['corePct']:g}%" if p["corePct"] else "") + ")")
                                 for p in c["pods"])
                crow.append([n["name"], c["index"], c["model"],
                             f"{fmt_mib(c['memoryFreeMiB'])} / {fmt_mib(c['memoryMiB'])}" if c["memoryMiB"] else "-",
                             f"{c['coreFreePct']:g}%", _card_health(c),
                             _gpus(c["strandedMilli"]) if c["strandedMilli"] else "", pods or "-"])
        lines += ["", render(["NODE", "CARD", "MODEL", "MEM FREE", "CORE FREE", "HEALTH", "STRANDED", "PODS"], crow)]
    notes = [f"  pod {p['pod']} holds card(s) {', '.join(map(str, p['cards']))}, which node {n['name']} does not "
             "have: its allocation record names them, and no card of the node counts it (the extender reads it so)"
             for n in rep["nodes"] for p in n["podsOnMissingCards"]]
    notes += [f"  pod {p['pod']} is bound to node {p['node']}, which the cluster does not list: its allocation "
              f"record holds card(s) {', '.join(map(str, p['cards'])) or 'none'} there (the extender keeps it so)"
              for p in rep.get("podsOnUnknownNodes", ())]
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


def _card_health(card: dict[str, Any]) -> str:
    """"ok" or "UNHEALTHY", and by how much the card is booked beyond what it has."""
    text = "ok" if card["healthy"] else "UNHEALTHY"
    over = ([fmt_mib(card["overbookedMiB"])] if card["overbookedMiB"] else []) + \
        ([f"{card['overbookedCorePct']:g}%"] if card["overbookedCorePct"] else [])
    return text + (f", OVERBOOKED by {', '.join(over)}" if over else "")


def learned_report(learn: LearnFrom, memory_unit_mib: int) -> dict[str, Any]:
    """What the extender's placer has learned, as :func:`report` data: per learned shape, how many
    pods of it exist now (of Stowage's schedulers) and how many departed (its ConfigMap), most
    first. The pods parsed as ``stowage plan`` learns them (:meth:`Learned.of`, the watch's parse)."""
    now: dict[tuple, int] = {}
    for req, models, n in Learned.of(None, learn.pods, memory_unit_mib).shapes:
        key = (req, model_list(models))   # keyed as the departed pods are (DepartedPods.add)
        now[key] = now.get(key, 0) + n
    gone = {(req, models): n for req, models, n in (learn.past.items() if learn.past is not None else ())}
    rows = [{"shape": _shape_text(req, models), "now": now.get((req, models), 0),
             "departed": gone.get((req, models), 0)} for req, models in {**now, **gone}]
    rows.sort(key=lambda r: (-(r["now"] + r["departed"]), r["shape"]))
    return {"pods": sum(now.values()), "departedPods": sum(gone.values()),
            "configMap": "/".join(learn.configmap) if learn.configmap else None, "note": learn.note,
            "schedulers": list(learn.scheduler_names), "shapes": rows}


def _shape_text(req: Any, models: tuple[str, ...]) -> str:
    text = req.describe()
    if req.cpu_milli:
        text += f", {req.cpu_milli / 1000:g} CPU"
    if req.host_mem_mib:
        text += f", {fmt_mib(req.host_mem_mib)} memory"
    return text + (f" @{'|'.join(models)}" if models else "")


def render_learned(learned: dict[str, Any], top: int = 15) -> str:
    head = (f"What the extender's placer has learned: {learned['pods']} pods of "
            f"{', '.join(learned['schedulers'])} now, {learned['departedPods']} departed "
            f"({'ConfigMap ' + learned['configMap'] if learned['configMap'] else 'no ConfigMap'})")
    if learned["note"]:
        head += f"; {learned['note']}"
    rows = [[r["shape"], r["now"] + r["departed"], r["now"], r["departed"]] for r in learned["shapes"][:top]]
    lines = [head]
    if rows:
        lines.append(render(["SHAPE", "PODS", "NOW", "DEPARTED"], rows, indent="  "))
    if len(learned["shapes"]) > top:
        lines.append(f"  ... {len(learned['shapes']) - top} more shape(s)")
    return "\n".join(lines)


def _check_inspect(ctx: click.Context) -> None:
    if ctx.params["learned"] and ctx.params["simulated"] is not None:
        raise click.UsageError("--learned reads a live cluster (a simulated one has no pods of Stowage's "
                               "schedulers and no ConfigMap)", ctx)
    if (not ctx.params["learned"]
            and ctx.get_parameter_source("learned_configmap") == click.core.ParameterSource.COMMANDLINE
            and ctx.params["simulated"] is None):   # (on a simulated cluster learn_options says why)
        raise click.UsageError("--learned-configmap only applies with --learned (inspect reads the ConfigMap "
                               "only to show what the placer learned)", ctx)


@click.command("inspect", cls=OperatorCommand)
@cluster_options
@learn_options
@click.option("--learned", is_flag=True,
              help="Live cluster: also show what the extender's placer has learned of the workload: per pod "
                   "shape, the pods of Stowage's schedulers now and the departed ones its ConfigMap keeps.")
@click.option("--node", "nodes", multiple=True, metavar="NAME", help="Only this node (repeatable).")
@click.option("--typical", multiple=True, metavar="SHAPE", callback=shapes_option,
              help="Pod shape that counts for fragmentation (repeatable; grammar as in `stowage plan --shape`). "
                   "Default: the shapes running now, plus one whole GPU.")
@click.option("--cards/--no-cards", default=True, show_default=True, help="Also print the per-card table.")
@output_option
@after_parsing(_check_inspect)
def inspect(source: Source, learn: LearnFrom, learned: bool, nodes: tuple[str, ...], typical: list[Shape],
            cards: bool, output: str) -> None:
    """Show, per node and per card, which pods hold what, what is free, card health, and
    STRANDED capacity: free GPU share that no typical pod shape could use right now. STATE
    also names a node's free GPUs that no 1-GPU pod can use for lack of CPU, memory or pod
    slots there (the extender's stowage_extender_stranded_whole_cards).

    \b
    Examples:
      stowage inspect --simulated --fill 60          # the embedded cluster with a random mix
      stowage inspect --kubeconfig ~/.kube/config --no-cards
      stowage inspect --simulated --typical 1 --typical 20Gi,50% -o json
    """
    facts = LiveFacts() if source.live else None
    model, what = load(source, learn=learn if learned else None, facts=facts)
    rep = report(model, typical, nodes, facts.node_notes if facts is not None else None)
    missing = sorted(set(nodes) - {n["name"] for n in rep["nodes"]})
    if missing:
        raise click.ClickException(f"no such node(s): {', '.join(missing)}")
    if learned:
        rep["learned"] = learned_report(learn, source.memory_unit_mib)
    if output == "json":
        rep["source"] = what
        if facts is not None:
            rep["unrecordedGpuPods"] = facts.unrecorded_pods()
            rep["podErrors"], rep["nodeErrors"] = facts.pod_errors, facts.node_errors
        click.echo(json.dumps(rep, indent=2))   # (JSON escapes control characters)
    else:
        say(what)
        if facts is not None and facts.warning():
            say(facts.warning())
        say(render_table(rep, cards))
        if learned:
            say("\n" + render_learned(rep["learned"]))
