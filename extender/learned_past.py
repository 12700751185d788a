"""What the placers learned from pods that are gone, in a form that survives a restart.

The placers learn the workload from every pod of Stowage's schedulers the watch shows
(``ExtenderService.learn_pod``). A restarted extender (or every replica, after a rollout that
replaced them all) relearns the pods that still exist from its first list, but the pods deleted
before it started are gone from the API server: what the running extender had learned from them
was lost. On the openb elastic scenario that past is worth 24 -> 9 jobs never placed (default
trace) and 1,551 -> 1,086 (spec33) (docs/deploy.md).

:class:`DepartedPods` is that past: for each distinct learned request (the pod's GPU request,
host CPU and memory, and its list of allowed GPU models) the number of learned pods of that
shape that were deleted. It is all a placer needs (``Placer.observe(req, models, count)``), its
size is bounded by the number of distinct shapes, not of pods, and it is kept in a ConfigMap
(extender/learned_store.py) that a starting extender reads before its first list.

Bounds (the shapes come from what pod authors wrote, and the ConfigMap is read back as input):
at most :data:`MAX_SHAPES` shapes (past it, the shape with the fewest pods, the oldest among
equals, is dropped: only pods written to be unlike each other get there; the openb traces have
145-473 classes), and a document of at most :data:`MAX_DOCUMENT_BYTES` (a ConfigMap holds 1 MiB;
the rarest shapes go first). Reading validates every field against the bounds a pod's own request
has; a document that fails is refused as a whole, with the reason, and the extender starts
without a past (as before this existed), never with part of one.

Two replicas keep the same past (each learns every pod the watch shows), so both may write it:
:meth:`DepartedPods.merged` takes, per shape, the larger count. A shape's count only grows, and
each replica's count is at most the true one, so the merge never counts a pod twice; what it can
miss is the pods deleted while no replica ran, or after a replica's last write before it stopped.
"""
from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from packing.frag import model_list
from packing.pod_policy import MAX_MODEL_NAME, MAX_MODELS_PER_LIST
from stowage.resources import MAX_CARD_MEMORY_MIB, MAX_GPUS_PER_POD, GpuRequest

FORMAT = "stowage.io/departed-pods/v1"
MAX_SHAPES = 4096                   # distinct learned shapes kept
MAX_DOCUMENT_BYTES = 768 << 10      # the JSON document (a ConfigMap's data holds at most 1 MiB)
MAX_COUNT = 1 << 50                 # pods of one shape (a count past it is not a real cluster's)
MAX_CPU_MILLI = 1 << 40             # a pod's CPU request, millicores
MAX_HOST_MEMORY_MIB = float(1 << 40)
FIELDS = ("gpus", "gpuMemoryMiB", "coreMilli", "minCardMemoryMiB", "cpuMilli", "memoryMiB", "models", "pods")

Shape = tuple[GpuRequest, tuple[str, ...]]


class PastError(ValueError):
    """A stored past that cannot be used (says why)."""


@dataclass
class DepartedPods:
    """Pods learned and since deleted, counted per learned shape (see the module doc)."""

    counts: "OrderedDict[Shape, int]" = field(default_factory=OrderedDict)
    max_shapes: int = MAX_SHAPES

    @property
    def pods(self) -> int:
        return sum(self.counts.values())

    def __len__(self) -> int:
        return len(self.counts)

    @property
    def gpu_pods_left(self) -> bool:
        """Whether GPU pods are among the departed (what a placer's churn mode is told)."""
        return any(req.is_gpu for req, _ in self.counts)

    def add(self, req: GpuRequest, models: tuple[str, ...] | list[str] = (), count: int = 1) -> bool:
        """Count ``count`` departed pods of this shape. A shape the stored document could not
        hold (a request past the bounds :meth:`from_json` checks: only a pod written to be absurd
        has one) is left out, so that writing can never make the document unreadable; returns
        whether it was counted."""
        models = model_list(models)   # one list however it was written
        try:
            _row(_cells(req, models, count))
        except PastError:
            return False
        key = (req, models)
        if key not in self.counts and len(self.counts) >= self.max_shapes:
            self._drop_rarest()
        self.counts[key] = min(MAX_COUNT, self.counts.get(key, 0) + count)
        return True

    def _drop_rarest(self) -> None:
        rarest = min(self.counts, key=self.counts.__getitem__)   # the first of the fewest: the oldest
        del self.counts[rarest]

    def items(self) -> Iterator[tuple[GpuRequest, tuple[str, ...], int]]:
        """(request, models, pods) per shape, in the order the shapes first departed."""
        for (req, models), n in self.counts.items():
            yield req, models, n

    def copy(self) -> "DepartedPods":
        return DepartedPods(OrderedDict(self.counts), self.max_shapes)

    def merged(self, other: "DepartedPods") -> "DepartedPods":
        """Per shape the larger count of the two (see the module doc); this one's order first."""
        out = self.copy()
        for key, n in other.counts.items():
            if key in out.counts:
                out.counts[key] = max(out.counts[key], n)
            else:
                out.add(key[0], key[1], n)
        return out

    # ------------------------------------------------------------------ the stored document
    def to_json(self) -> str:
        """The document, at most MAX_DOCUMENT_BYTES (the rarest shapes left out if need be)."""
        rows = [_cells(r, models, n) for (r, models), n in self.counts.items()]
        while True:
            doc = json.dumps({"format": FORMAT, "fields": list(FIELDS), "shapes": rows}, separators=(",", ":"))
            if len(doc.encode()) <= MAX_DOCUMENT_BYTES or not rows:
                return doc
            # Too big (long model lists): leave out the rarest tenth, the oldest among equals.
            order = sorted(range(len(rows)), key=lambda i: (rows[i][-1], i))
            drop = set(order[:max(1, len(rows) // 10)])
            rows = [row for i, row in enumerate(rows) if i not in drop]

    @classmethod
    def from_json(cls, text: str | bytes) -> "DepartedPods":
        """Read a document written by :meth:`to_json`; :class:`PastError` if it is not one."""
        if len(text) > MAX_DOCUMENT_BYTES * 2:
            raise PastError(f"{len(text)} bytes, more than any document Stowage writes")
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise PastError(f"not JSON: {exc}") from None
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
            raise PastError(f"not a {FORMAT} document")
        if doc.get("fields") != list(FIELDS):
            raise PastError(f"fields must be {list(FIELDS)}")
        rows = doc.get("shapes")
        if not isinstance(rows, list):
            raise PastError("shapes must be a list")
        if len(rows) > MAX_SHAPES:
            raise PastError(f"{len(rows)} shapes, at most {MAX_SHAPES}")
        past = cls()
        for i, row in enumerate(rows):
            try:
                req, models, n = _row(row)
            except PastError as exc:
                raise PastError(f"shape {i}: {exc}") from None
            if (req, models) in past.counts:
                raise PastError(f"shape {i} is written twice")
            past.counts[(req, models)] = n
        return past


def _cells(r: GpuRequest, models: tuple[str, ...], n: int) -> list[Any]:
    """One shape as the document's row (FIELDS order)."""
    mem = r.host_mem_mib
    return [r.gpus, r.mem_mib, r.core_milli, r.min_card_mem_mib, r.cpu_milli,
            int(mem) if float(mem).is_integer() else float(mem), list(models), n]


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise PastError(f"{name} must be an integer from {lo} to {hi}, not {value!r}")
    return value


def _row(row: Any) -> tuple[GpuRequest, tuple[str, ...], int]:
    """One shape, validated as a pod's own request would be."""
    if not isinstance(row, list) or len(row) != len(FIELDS):
        raise PastError(f"must be a list of {len(FIELDS)} values ({', '.join(FIELDS)})")
    gpus, mem, core, min_card, cpu, host_mem, models, n = row
    gpus = _int(gpus, "gpus", 0, MAX_GPUS_PER_POD)
    mem = _int(mem, "gpuMemoryMiB", 0, MAX_CARD_MEMORY_MIB)
    core = _int(core, "coreMilli", 0, 1000)
    min_card = _int(min_card, "minCardMemoryMiB", 0, MAX_CARD_MEMORY_MIB)
    cpu = _int(cpu, "cpuMilli", 0, MAX_CPU_MILLI)
    if isinstance(host_mem, bool) or not isinstance(host_mem, (int, float)) or not (
            math.isfinite(host_mem) and 0 <= host_mem <= MAX_HOST_MEMORY_MIB):
        raise PastError(f"memoryMiB must be a number from 0 to {MAX_HOST_MEMORY_MIB:.0f}, not {host_mem!r}")
    if gpus and (mem or core):
        raise PastError("a whole-GPU shape has no gpuMemoryMiB or coreMilli")
    if min_card and not gpus:
        raise PastError("minCardMemoryMiB belongs to whole-GPU shapes")
    if not isinstance(models, list) or len(models) > MAX_MODELS_PER_LIST or not all(
            isinstance(m, str) and 0 < len(m) <= MAX_MODEL_NAME for m in models):
        raise PastError(f"models must be a list of at most {MAX_MODELS_PER_LIST} names of 1 to "
                        f"{MAX_MODEL_NAME} characters")
    if tuple(models) != model_list(models):   # as add() keeps it: one list, one row
        raise PastError("models must be sorted, without repeats")
    n = _int(n, "pods", 1, MAX_COUNT)
    req = GpuRequest(gpus=gpus, mem_mib=mem, core_milli=core, min_card_mem_mib=min_card, cpu_milli=cpu,
                     host_mem_mib=float(host_mem))   # a float, as pod_request gives it
    return req, tuple(models), n


def replay(shapes: Iterable[tuple[GpuRequest, tuple[str, ...], int]],
           observe: Callable[[GpuRequest, tuple[str, ...], int], None]) -> int:
    """Show every (request, models, count) to ``observe``, in order; returns the pods shown."""
    shown = 0
    for req, models, n in shapes:
        observe(req, models, n)
        shown += n
    return shown
