"""Speed-up: the failure reasons of many nodes at once, for the extender's filter.

The reference is :func:`packing.fit.reason`, one node at a time; this gives the same strings
(tested against it) by formatting each distinct message once with the same ``msg_*`` functions.
Plugged in through the service's speed-up seam (:mod:`extender.speedups`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from packing.fit import (FITS, NO_GPUS, POD_LIMIT, WHOLE_ONLY, msg_closed, msg_compute, msg_cpu,
                         msg_free_cards, msg_host_memory, msg_memory, msg_no_usable_card, msg_tail, open_nodes,
                         row_any, row_count)
from packing.model import CardArrays, ClusterModel
from stowage.resources import GpuRequest

SMALL_SETTLE = 128  # up to this many rows per branch, distinct keys found with a dict


def reasons(a: CardArrays, rows: np.ndarray, req: GpuRequest, allowed: np.ndarray,
            tolerates: int = 0) -> list[str]:
    """``[reason(a, i, req, allowed, detail=False, tolerates=tolerates) for i in rows]`` (what
    filter answers: no per-node numbers, so kube-scheduler adds equal causes up), computed for all
    rows at once.

    Why: a filter on a large cluster can fail thousands of nodes (a 4-GPU pod on a half-used
    cluster), and one :func:`reason` per node in Python cost more than the whole rest of the
    request. Each branch's inputs are gathered as arrays, and each distinct message is
    formatted once with the ``msg_*`` functions :func:`packing.fit.reason` words them with, so
    the strings are identical.
    """
    rows = np.asarray(rows, np.int64)
    out = np.empty(len(rows), dtype=object)
    if not len(rows):
        return []
    left = np.ones(len(rows), bool)

    def settle(sel: np.ndarray, keys: list[np.ndarray], fmt: Callable[..., str]) -> None:
        """Rows in ``sel`` get fmt(*key) for their key columns, formatted once per distinct key."""
        nonlocal left
        sel = sel & left
        left = left & ~sel
        pos = np.flatnonzero(sel)
        if not pos.size:
            return
        cols = [np.asarray(k)[pos] for k in keys]
        if not cols:
            out[pos] = fmt()
            return
        keyed = np.stack(cols, axis=1)  # one dtype for all key columns, as np.unique sees them
        if len(pos) <= SMALL_SETTLE:
            # A few rows (those changed since the shape's last pod): a dict beats np.unique's
            # row sort by tens of microseconds; same keys, same texts.
            memo: dict[tuple, str] = {}
            texts_list = []
            for key in keyed.tolist():
                t = tuple(key)
                text = memo.get(t)
                if text is None:
                    text = memo[t] = fmt(*key)
                texts_list.append(text)
            texts = np.empty(len(pos), dtype=object)
            texts[:] = texts_list
            out[pos] = texts
            return
        uniq, inverse = np.unique(keyed, axis=0, return_inverse=True)
        texts = np.empty(len(uniq), dtype=object)
        texts[:] = [fmt(*u) for u in uniq.tolist()]
        out[pos] = texts[inverse.ravel()]

    node_ok = open_nodes(a, tolerates)[rows]
    present = a.exists[rows]
    cpu, hmem = a.cpu_free[rows], a.hmem_free[rows]
    settle(~node_ok, [a.closed[rows]], msg_closed)
    if req.is_gpu:
        settle(~row_any(present), [], lambda: NO_GPUS)
    settle(cpu < req.cpu_milli, [], lambda: msg_cpu(req))
    settle(hmem < req.host_mem_mib, [], lambda: msg_host_memory(req))
    settle(a.pod_room[rows] < 1, [], lambda: POD_LIMIT)
    if not req.is_gpu:
        settle(left, [], lambda: FITS)
    if not left.any():
        return out.tolist()
    eligible = allowed[rows]
    card_ok = a.healthy[rows]
    healthy = eligible & card_ok
    excluded = row_count(present) - row_count(eligible)
    unhealthy = row_count(eligible & ~card_ok)

    if req.is_whole:
        free = row_count(healthy & (a.pods[rows] == 0))
        settle(left, [free, excluded, unhealthy], lambda f, e, u: msg_free_cards(f, req, msg_tail(e, u)))
        return out.tolist()
    settle(~row_any(healthy), [excluded, unhealthy], lambda e, u: msg_no_usable_card(req, msg_tail(e, u)))
    if not left.any():
        return out.tolist()
    best_mem = np.max(np.where(healthy, a.mem_free[rows], -1), axis=1)
    settle(best_mem < req.mem_mib, [excluded, unhealthy], lambda e, u: msg_memory(req, msg_tail(e, u)))
    settle(left, [excluded, unhealthy], lambda e, u: msg_compute(req, msg_tail(e, u)))
    return out.tolist()


def whole_only_override(model: ClusterModel, rows: np.ndarray, texts: list[str]) -> list[str]:
    """A shared pod's reasons for ``rows`` of the model with :data:`packing.fit.WHOLE_ONLY` on
    whole-only nodes that have cards, as :func:`packing.fit.reason` (``whole_only=True``) says."""
    meta, names = model.meta, model.names
    has_cards = row_any(model.a.exists[rows]).tolist()
    return [WHOLE_ONLY if has and (m := meta.get(names[r] or "")) is not None and m.whole_only else text
            for r, text, has in zip(rows.tolist(), texts, has_cards)]
