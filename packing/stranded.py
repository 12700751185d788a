"""Stranded whole cards: free GPUs on nodes that cannot take one more 1-GPU pod.

A healthy card with no pod on a schedulable node is stranded when the node has no pod slot left,
or less host CPU or memory free than the running 1-GPU whole-card pods' median asks for::

    stranded = sum over schedulable nodes i, cards k of
               free_whole[i, k] * [pod_room[i] < 1  or  cpu_free[i] < c  or  hmem_free[i] < m]

    (c, m) = (median CPU, median memory) over the running pods that hold exactly one whole card
             (the lower median, each taken alone; (0, 0) when none runs: then only a node out of
             pod slots, or overbooked by pods bound without Stowage, strands its cards)

Why the median of the running 1-GPU pods: it is what the cluster's own workload says a GPU pod
needs beside its card, learned from nothing but what is bound now, and a card counted is one at
least half of those pods could not use. Not their least: one 1-GPU pod that asks for no CPU (a
pod without requests) would make every node's CPU look enough, and the count would say nothing.
A node whose host figures are not modelled (infinite) never strands a card.

What Stowage's packing exists to avoid, as a number an operator can alert on:
``stowage_extender_stranded_whole_cards`` (extender/verbs.py).
"""
from __future__ import annotations

from statistics import median_low
from typing import Iterable

import numpy as np

from stowage.resources import fmt_mib

from .model import CardArrays, PodAllocation


def typical_one_gpu_host_request(allocations: Iterable[PodAllocation]) -> tuple[float, float]:
    """(milli-CPU, host MiB): the lower median of what the running 1-GPU whole-card pods ask
    for, each taken alone; (0, 0) when none runs."""
    cpus, mems = [], []
    for al in allocations:
        if al.whole and len(al.cards) == 1:
            cpus.append(al.cpu_milli)
            mems.append(al.host_mem_mib)
    if not cpus:
        return 0.0, 0.0
    return float(median_low(cpus)), float(median_low(mems))


def host_blocked(a: CardArrays, cpu_milli: float, host_mem_mib: float) -> np.ndarray:
    """[N] nodes that cannot take one more pod asking ``cpu_milli`` and ``host_mem_mib``: no pod
    slot left, or less CPU or memory free than that."""
    return (a.pod_room < 1) | (a.cpu_free < cpu_milli) | (a.hmem_free < host_mem_mib)


def stranded_per_node(a: CardArrays, cpu_milli: float, host_mem_mib: float) -> np.ndarray:
    """[N] free whole cards of each schedulable node that cannot take a 1-GPU pod asking
    ``cpu_milli`` and ``host_mem_mib`` (0 elsewhere; module docstring)."""
    blocked = a.node_ok & host_blocked(a, cpu_milli, host_mem_mib)
    return (a.free_whole() & blocked[:, None]).sum(axis=1)


def stranded_whole_cards(a: CardArrays, cpu_milli: float, host_mem_mib: float) -> int:
    """Free whole cards on schedulable nodes that cannot take a 1-GPU pod asking ``cpu_milli``
    and ``host_mem_mib`` (module docstring)."""
    return int(stranded_per_node(a, cpu_milli, host_mem_mib).sum())


def why_stranded(a: CardArrays, i: int, cpu_milli: float, host_mem_mib: float) -> str:
    """Why node ``i`` cannot take a 1-GPU pod asking ``cpu_milli`` and ``host_mem_mib``, in words
    ("" when it can): what an operator reads beside its stranded cards."""
    why = []
    if a.pod_room[i] < 1:
        why.append("no pod slot left")
    if a.cpu_free[i] < cpu_milli:
        why.append(f"{max(float(a.cpu_free[i]), 0.0) / 1000:g} CPU free, a typical 1-GPU pod asks {cpu_milli / 1000:g} CPU")
    if a.hmem_free[i] < host_mem_mib:
        why.append(f"{fmt_mib(max(float(a.hmem_free[i]), 0.0))} memory free, a typical 1-GPU pod asks {fmt_mib(host_mem_mib)}")
    return "; ".join(why)
