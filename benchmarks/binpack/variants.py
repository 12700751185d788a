"""Workload variants of the openb trace, generated in code: GPU-model-constrained and multi-GPU-heavy.

Why: the five published traces are what Stowage's policy was first tuned on; a policy that only
wins there is tuned, not robust. The variants below follow the method of the public
``cluster-trace-gpu-v2023`` generator that made ``gpuspec10`` and ``multigpu20`` from ``default``,
at other strengths, deterministically (fixed seeds, no downloads):

- ``specX`` (X = 1..90; ``spec25``, ``spec33``, ``spec40`` by default): the ``default`` trace
  with a ``gpu_spec`` (the list of GPU models the pod may run on) given to X % of its GPU pods,
  chosen uniformly at random. The model lists follow the production mix, derived from the
  ``gpu_spec`` values of the openb traces at hand (``gpuspec10``: 732 of its 7,064 GPU pods,
  10.4 %, carry one; T4, G2, P100 and the V100 pair are the common lists). Each chosen pod
  draws a list from the pods of the same GPU shape in that mix (share, one whole GPU, or n
  whole GPUs), so a 8-GPU pod gets a list of models that come in 8-GPU nodes, as in the trace;
  a shape the mix has no pod of draws from every list that some node can satisfy.
- ``multigpuX`` (X = 1..90; ``multigpu40`` by default): the ``default`` trace plus multi-GPU
  pods (2, 4 or 8 GPUs) drawn uniformly with replacement from its own multi-GPU pods until
  they request X % of the trace's GPU-milli. At X = 20 this is the published ``multigpu20``
  (default 7.3 % multi-GPU milli; multigpu20 adds 1,000,000 milli of them to reach 20.4 %).

The seeds are fixed per variant (:data:`VARIANT_SEED`, X and the kind), so a name always
means the same pods; the replay's own per-seed shuffle and resampling then apply as for any trace.
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from .trace import DEFAULT_TRACE, Pods, TraceError, load_nodes, load_pods, trace_name, trace_path

VARIANT_SEED = 2023
SPEC_SOURCE = "gpuspec10"      # the openb trace whose gpu_spec values give the production mix
DEFAULT_VARIANTS = ("spec25", "spec33", "spec40", "multigpu40")
_NAME = re.compile(r"^(spec|multigpu)(\d{1,2})$")
_KIND = {"spec": 1, "multigpu": 2}


def is_variant(name: str) -> bool:
    """Whether ``name`` is a generated variant (``spec25``, ``multigpu40``, ...), not a file."""
    m = _NAME.match(name)
    return m is not None and 1 <= int(m.group(2)) <= 90


def _shape(num_gpu: int, gpu_milli: int) -> tuple[int, bool]:
    """The GPU shape a model list is drawn for: (cards, is a share of one card)."""
    return int(num_gpu), bool(num_gpu == 1 and gpu_milli < 1000)


def spec_mix(directory: Path) -> dict[tuple[int, bool], list[str]]:
    """The production mix of model lists, per GPU shape: every non-empty ``gpu_spec`` of the
    :data:`SPEC_SOURCE` trace (repeats kept: a list's frequency is its share of the mix)."""
    src = load_pods(SPEC_SOURCE, directory)
    mix: dict[tuple[int, bool], list[str]] = defaultdict(list)
    for j, spec in enumerate(src.gpu_spec):
        if spec and src.num_gpu[j] > 0:
            mix[_shape(src.num_gpu[j], src.gpu_milli[j])].append(spec)
    if not mix:
        raise TraceError(f"{trace_path(SPEC_SOURCE, directory)}: no pod has a gpu_spec, so it gives no model mix")
    return dict(mix)


def with_specs(base: Pods, pct: int, mix: dict[tuple[int, bool], list[str]],
               max_cards: dict[str, int], name: str) -> Pods:
    """``base`` with a model list drawn from ``mix`` (per shape) on ``pct`` % of its GPU pods."""
    rng = np.random.default_rng([VARIANT_SEED, _KIND["spec"], pct])
    gpu_rows = np.flatnonzero((base.num_gpu > 0) & (base.gpu_milli > 0))
    chosen = np.sort(rng.choice(gpu_rows, size=int(round(pct / 100 * len(gpu_rows))), replace=False))
    every = sorted({s for specs in mix.values() for s in specs})
    specs = list(base.gpu_spec)
    for j in chosen.tolist():
        shape = _shape(base.num_gpu[j], base.gpu_milli[j])
        pool = mix.get(shape)
        if not pool:  # no pod of this shape in the mix: any list some node can satisfy
            pool = [s for s in every if any(max_cards.get(m, 0) >= shape[0] for m in s.split("|"))]
        specs[j] = pool[int(rng.integers(len(pool)))]
    return Pods(name=name, cpu_milli=base.cpu_milli, memory_mib=base.memory_mib, num_gpu=base.num_gpu,
                gpu_milli=base.gpu_milli, gpu_spec=tuple(specs))


def with_multigpu(base: Pods, pct: int, name: str) -> Pods:
    """``base`` plus multi-GPU pods resampled from its own until they request ``pct`` % of the
    GPU-milli (unchanged when they already do)."""
    rows = multigpu_rows(base, pct)
    return Pods(name=name, cpu_milli=base.cpu_milli[rows], memory_mib=base.memory_mib[rows],
                num_gpu=base.num_gpu[rows], gpu_milli=base.gpu_milli[rows],
                gpu_spec=tuple(base.gpu_spec[j] for j in rows.tolist()))


def multigpu_rows(base: Pods, pct: int) -> np.ndarray:
    """The rows of ``base`` that variant ``multigpu<pct>`` is made of: every row once, then the
    resampled multi-GPU rows, each a copy of the row it repeats."""
    rng = np.random.default_rng([VARIANT_SEED, _KIND["multigpu"], pct])
    multi = np.flatnonzero(base.num_gpu > 1)
    if not len(multi):
        raise TraceError(f"trace {base.name} has no multi-GPU pod to resample")
    milli = base.milli
    multi_milli, total = int(milli[multi].sum()), int(milli.sum())
    extra: list[int] = []
    while multi_milli < pct / 100 * total:
        j = int(multi[int(rng.integers(len(multi)))])
        extra.append(j)
        multi_milli += int(milli[j])
        total += int(milli[j])
    return np.concatenate([np.arange(len(base)), np.array(extra, np.int64)])


def source_rows(trace: str, directory: Path) -> np.ndarray | None:
    """For a generated variant (no file of its name in ``directory``), the row of ``default``
    each of its pods comes from, in the variant's order: what a consumer that needs more than the
    pods' shapes (the elastic scenario's creation and deletion times) reads from the default file.
    None for a trace read from its own file."""
    name = trace_name(trace)
    if not is_variant(name) or trace_path(trace, directory).is_file():
        return None
    m = _NAME.match(name)
    assert m is not None
    base = load_pods(DEFAULT_TRACE, directory)
    if m.group(1) == "spec":
        return np.arange(len(base))
    return multigpu_rows(base, int(m.group(2)))


def make_variant(name: str, directory: Path) -> Pods:
    """The pods of variant ``name``, generated from the openb files in ``directory``."""
    m = _NAME.match(name)
    if m is None or not is_variant(name):
        raise TraceError(f"unknown trace variant {name!r} (specX or multigpuX, X from 1 to 90)")
    kind, pct = m.group(1), int(m.group(2))
    base = load_pods(DEFAULT_TRACE, directory)
    if kind == "spec":
        nodes = load_nodes(directory)
        max_cards: dict[str, int] = {}
        for model, g in zip(nodes.model, nodes.gpus.tolist()):
            max_cards[model] = max(max_cards.get(model, 0), int(g))
        return with_specs(base, pct, spec_mix(directory), max_cards, name)
    return with_multigpu(base, pct, name)


def load_trace(trace: str, directory: Path) -> Pods:
    """A trace by name or path, as :func:`.trace.load_pods`, or a generated variant when the
    name is one and no file of that name exists."""
    if is_variant(trace_name(trace)) and not trace_path(trace, directory).is_file():
        return make_variant(trace_name(trace), directory)
    return load_pods(trace, directory)


def default_traces(files: list[str], directory: Path) -> list[str]:
    """The traces a plain run replays: the openb files, then the default variants (only those
    whose source files are at hand)."""
    out = list(files)
    have = set(files)
    if DEFAULT_TRACE in have:
        for v in DEFAULT_VARIANTS:
            if v not in have and (not v.startswith("spec") or SPEC_SOURCE in have):
                out.append(v)
    return out
