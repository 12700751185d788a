"""Resource names, units and a pod's effective GPU request.

Both halves of Stowage (the scheduler extender and the device plugin) and the benchmark read
a pod's GPU request through :func:`pod_gpu_request`, so "what does this pod ask for" has one
answer everywhere.

Units inside Stowage:
- card memory in MiB (``int``);
- card compute ("core") in milli-cards: 1000 is a whole card. ``nvidia.com/gpu-core`` is given
  by users in percent (1-100) and multiplied by 10;
- the extended resource ``nvidia.com/gpu-memory`` counts *units* of card memory; one unit is
  :data:`DEFAULT_MEMORY_UNIT_MIB` (1 GiB) unless the operator configures otherwise. The device
  plugin advertises one device per unit, so the unit must be the same on both sides.

Request semantics (documented in the README):
- ``nvidia.com/gpu: N`` alone: N whole cards, each used by this pod alone.
- ``nvidia.com/gpu-memory: M`` (and optionally ``nvidia.com/gpu-core: C``) without
  ``nvidia.com/gpu``: a share of ONE card with M units of memory and C percent of compute.
- ``nvidia.com/gpu: N`` together with ``nvidia.com/gpu-memory: M``: N whole cards, each with at
  least M units of total memory (a "big enough card" constraint, like ``stowage.io/min-card-memory``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, ROUND_CEILING
from typing import Any, Iterable, Mapping

RESOURCE_GPU = "nvidia.com/gpu"
RESOURCE_GPU_MEMORY = "nvidia.com/gpu-memory"
RESOURCE_GPU_CORE = "nvidia.com/gpu-core"
GPU_RESOURCES = (RESOURCE_GPU, RESOURCE_GPU_MEMORY, RESOURCE_GPU_CORE)
# Every resource :func:`pod_request` reads from a container's requests/limits and ``spec.overhead``:
# a copy of a pod that keeps only these asks for the very same thing (extender.kube_objects.pod_for_bind).
REQUEST_RESOURCES = frozenset(GPU_RESOURCES + ("cpu", "memory"))

DEFAULT_MEMORY_UNIT_MIB = 1024
CORE_MILLI_PER_CARD = 1000
MAX_GPUS_PER_POD = 64
# The most memory any one card could ever have (16 TiB; today's largest have 0.2 TiB). A request
# beyond it is refused for that pod before anything learns from it: it fits nowhere, and numbers
# that large would overflow the model's 64-bit arithmetic.
MAX_CARD_MEMORY_MIB = 1 << 24
# The most containers and init containers together (those that are objects) of a pod Stowage
# schedules. Kubernetes has no such limit: a real kube-apiserver 1.28 stored a pod of 25,774
# minimal containers (etcd's 1.5 MiB request limit ends it there), and kube-scheduler places it.
# Real pods have a few, a few dozen at most (sidecars, a pipeline's steps); GPU pods one to
# three. Why a limit: the extender's watch keeps a copy of each pending pod of Stowage's
# schedulers until it is bound, with each container's name and requests
# (extender.kube_objects.pod_for_bind), and a pod refused at filter stays pending for ever: a pod
# of ~18,000 containers kept ~5-11 MiB, and 100 of them put the extender past its 1 GiB. At most
# 129 are kept now: ~60 KiB at worst, packed (63-character names, ten 20-character quantities each).
# Checked before any container is read, with an error that does not depend on how many there
# are past the limit, so that a copy keeping one more than the limit is refused as the pod is.
MAX_CONTAINERS_PER_POD = 128


class RequestError(ValueError):
    """A pod's resource request that Stowage cannot honour; the message is shown to the user."""


class QuantityOutOfRange(RequestError):
    """A well-formed quantity beyond Kubernetes' 64-bit range: more than anything could hold."""


_SUFFIXES: dict[str, Decimal] = {
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
    "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9),
    "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
}


# Kubernetes' quantity grammar (apimachinery ``resource.Quantity``): a signed decimal number, then
# at most one suffix: binary SI (Ki..Ei), an exponent (e3, E-2) or decimal SI (n..E). Nothing else:
# no spaces, no underscores, no hex, no NaN or Infinity (Python's Decimal accepts all of those).
_QUANTITY = re.compile(r"(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE])?")
# Kubernetes stores quantities in 64 bits; nothing larger can come from a real API server.
MAX_QUANTITY = Decimal(2**63 - 1)
_MAX_TEXT = 64   # characters: the longest quantity worth reading


SHOWN_CHARS = 40   # of a user's value quoted in a message


def shown(value: Any, limit: int = SHOWN_CHARS) -> str:
    """A value a pod author wrote, quoted for a message: at most ``limit`` characters, and never
    ", " (kube-scheduler joins the reasons of all nodes with it, and counts nodes per reason).
    Why bounded: a pod-level reason is repeated for every node of the answer, and the parsed
    pod (with its reason) is cached, so an echoed 256 KiB annotation cost megabytes per request.
    Anything but text (a nested object could be ~1,000 deep) is shown by its type only."""
    if not isinstance(value, str):
        return f"<{type(value).__name__}>"
    text = value if len(value) <= limit else value[:limit] + f"... ({len(value)} characters)"
    return repr(text).replace(", ", ",")


def split_quantity(value: Any) -> tuple[Decimal, str]:
    """Parse a Kubernetes resource quantity into (value, suffix as written; "" for a bare number).

    The suffix tells a bare number (``80``, ``8e1``) from one with a unit (``80Gi``); an exponent
    is not a unit. Raises :class:`RequestError` for anything outside Kubernetes' grammar or beyond
    its 64-bit range, so no NaN, infinity or astronomically large number ever reaches arithmetic.
    """
    if isinstance(value, bool):
        raise RequestError(f"invalid quantity {value}")
    if isinstance(value, int):
        value = str(value)
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise RequestError(f"invalid quantity {value}")
        value = repr(value)
    if not isinstance(value, str) or not value or len(value) > _MAX_TEXT:
        raise RequestError(f"invalid quantity {shown(value)}")
    m = _QUANTITY.fullmatch(value)
    if m is None:
        raise RequestError(f"invalid quantity {value!r}")
    suffix = m.group("suffix") or ""
    number = Decimal(m.group("num"))
    if suffix not in _SUFFIXES:   # an exponent (e3, E-2); "Ei" and "E" are units
        exponent = int(suffix[1:])
        if abs(exponent) > 40:   # far beyond 2**63 either way: not a size anything has
            raise QuantityOutOfRange(f"quantity {value!r} is out of range")
        q, suffix = number.scaleb(exponent), ""
    else:
        q = number * _SUFFIXES[suffix]
    if abs(q) > MAX_QUANTITY:
        raise QuantityOutOfRange(f"quantity {value!r} is out of range")
    return q, suffix


def parse_quantity(value: Any) -> Decimal:
    """Parse a Kubernetes resource quantity ("2", "500m", "20Gi", "1e3", 4) into a Decimal."""
    return split_quantity(value)[0]


def non_negative_quantity(value: Any, what: str) -> Decimal:
    """A quantity that must not be negative; errors name ``what`` (e.g. "memory of container x")."""
    try:
        q = parse_quantity(value)
    except RequestError as exc:
        raise RequestError(f"{what}: {exc}") from exc
    if q < 0:
        raise RequestError(f"{what} must not be negative (got {value!r})")
    return q


def quantity_to_int(value: Any, what: str) -> int:
    """A quantity that must be a non-negative whole number of units (extended resources are)."""
    q = non_negative_quantity(value, what)
    if q != q.to_integral_value():
        raise RequestError(f"{what} must be a whole number (got {value!r})")
    return int(q)


def quantity_to_milli(value: Any) -> int:
    """CPU-style quantity in milli units, rounded up as Kubernetes does."""
    return int((parse_quantity(value) * 1000).to_integral_value(rounding=ROUND_CEILING))


def quantity_to_mib(value: Any) -> int:
    """Byte quantity in MiB, rounded up."""
    return int((parse_quantity(value) / Decimal(2**20)).to_integral_value(rounding=ROUND_CEILING))


@dataclass(frozen=True)
class GpuRequest:
    """What one pod needs from the cluster's GPUs (and, for the benchmark, host CPU/memory).

    ``gpus`` > 0: that many whole cards; ``min_card_mem_mib`` is then a lower bound on each
    card's *total* memory. ``gpus`` == 0 and (``mem_mib`` or ``core_milli``) > 0: a share of one
    card. ``cpu_milli`` / ``host_mem_mib`` (MiB, may be fractional) are the pod's host CPU and
    memory (:func:`pod_request`; 0 from :func:`pod_gpu_request`, which the device plugin and the
    record checks use): node filters and placer inputs, in the extender as in the benchmark.
    """

    gpus: int = 0
    mem_mib: int = 0
    core_milli: int = 0
    min_card_mem_mib: int = 0
    cpu_milli: int = 0
    host_mem_mib: float = 0

    @property
    def is_gpu(self) -> bool:
        return self.gpus > 0 or self.mem_mib > 0 or self.core_milli > 0

    @property
    def is_whole(self) -> bool:
        return self.gpus > 0

    @property
    def is_shared(self) -> bool:
        return self.gpus == 0 and (self.mem_mib > 0 or self.core_milli > 0)

    def describe(self) -> str:
        """Short human text, e.g. '2 whole GPUs' or '20 GiB + 30% of one GPU'."""
        if self.is_whole:
            s = f"{self.gpus} whole GPU{'s' if self.gpus != 1 else ''}"
            if self.min_card_mem_mib:
                s += f" of >= {fmt_mib(self.min_card_mem_mib)}"
            return s
        if self.is_shared:
            parts = []
            if self.mem_mib:
                parts.append(fmt_mib(self.mem_mib))
            if self.core_milli:
                parts.append(f"{self.core_milli / 10:g}% compute")
            return " + ".join(parts) + " of one GPU"
        return "no GPU"


def fmt_mib(mib: float) -> str:
    """MiB as a person reads it: '12 GiB', '1.5 GiB', '512 MiB'."""
    if mib >= 1024:
        return f"{mib / 1024:.4g} GiB"
    return f"{mib:.4g} MiB"


def fmt_cards(indices: Iterable[int]) -> str:
    """Card indices as a person reads them: 'card 0', 'cards 0,1'. A bare "cards 0" reads as a
    count (no cards?) as easily as card number 0."""
    idx = [str(k) for k in indices]
    return f"card{'s' if len(idx) != 1 else ''} {','.join(idx)}"


def container_requests(container: Mapping[str, Any]) -> dict[str, Any]:
    """Requests of one container, falling back to limits (extended resources: requests == limits).
    Resources that are not objects are refused by name (no API server stores them, but anything
    may reach the extender's port, and the device plugin reads whatever its API connection
    answers)."""
    res = container.get("resources") or {}
    if not isinstance(res, Mapping):
        raise RequestError(f"resources of container {shown(container.get('name', '?'))} is not an object")
    limits = res.get("limits") or {}
    requests = res.get("requests") or {}
    for part, value in (("limits", limits), ("requests", requests)):
        if not isinstance(value, Mapping):
            raise RequestError(f"resources.{part} of container {shown(container.get('name', '?'))} is not an object")
    merged = dict(limits)
    merged.update(requests)
    return merged


def _amounts(container: Mapping[str, Any], memory_unit_mib: int) -> tuple[int, int, int]:
    req = container_requests(container)
    name = shown(container.get("name", "?"))
    gpus = quantity_to_int(req.get(RESOURCE_GPU, 0), f"{RESOURCE_GPU} of container {name}")
    mem_units = quantity_to_int(req.get(RESOURCE_GPU_MEMORY, 0), f"{RESOURCE_GPU_MEMORY} of container {name}")
    core_pct = quantity_to_int(req.get(RESOURCE_GPU_CORE, 0), f"{RESOURCE_GPU_CORE} of container {name}")
    return gpus, mem_units * memory_unit_mib, core_pct * (CORE_MILLI_PER_CARD // 100)


def _effective(app: Iterable[tuple[int, ...]], init: list[tuple[tuple[int, ...], bool]],
               width: int = 3) -> tuple[int, ...]:
    """Kubernetes' effective pod request, resource by resource.

    max(sum of app containers + all sidecars, max over init containers i of
    (init_i + sidecars started before i)). A sidecar is an init container with
    ``restartPolicy: Always`` (KEP-753), which keeps running beside the app containers.
    """
    total = [0] * width
    for a in app:
        total = [t + x for t, x in zip(total, a)]
    sidecars = [0] * width
    peak_init = [0] * width
    for amounts, is_sidecar in init:
        if is_sidecar:
            sidecars = [s + x for s, x in zip(sidecars, amounts)]
            peak_init = [max(p, s) for p, s in zip(peak_init, sidecars)]
        else:
            peak_init = [max(p, s + x) for p, s, x in zip(peak_init, sidecars, amounts)]
    total = [t + s for t, s in zip(total, sidecars)]
    return tuple(max(t, p) for t, p in zip(total, peak_init))


def quantity_to_bytes(value: Any, what: str) -> int:
    """A memory quantity in whole bytes, rounded up (as Kubernetes' ``Quantity.Value()``)."""
    return int(non_negative_quantity(value, what).to_integral_value(rounding=ROUND_CEILING))


def _host_amounts(container: Mapping[str, Any]) -> tuple[int, int]:
    """(milli-CPU, memory bytes) one container requests (requests, else limits: the API server
    defaults a missing request to its limit)."""
    req = container_requests(container)
    name = shown(container.get("name", "?"))
    cpu = req.get("cpu", 0)
    mem = req.get("memory", 0)
    try:
        cpu_milli = quantity_to_milli(cpu)
    except RequestError as exc:
        raise RequestError(f"cpu of container {name}: {exc}") from exc
    if cpu_milli < 0:
        raise RequestError(f"cpu of container {name} must not be negative (got {cpu!r})")
    return cpu_milli, quantity_to_bytes(mem, f"memory of container {name}")


def pod_host_request(pod: Mapping[str, Any], max_containers: int | None = MAX_CONTAINERS_PER_POD) -> tuple[int, float]:
    """(milli-CPU, host memory MiB) of a pod by Kubernetes' effective-request rule, as
    kube-scheduler's NodeResourcesFit counts it: max(sum of app containers + sidecars, the
    largest init container + the sidecars started before it), plus ``spec.overhead``.

    Memory is bytes / 2**20 as a float, exact (a power-of-two division of a whole number far
    below 2**53), so sums over a node agree with kube-scheduler's byte counts to the byte.
    Raises :class:`RequestError` for a malformed quantity (an API server never stores one), and
    for more than ``max_containers`` containers (:func:`pod_containers`).
    """
    spec, app_containers, init_containers = pod_containers(pod, max_containers)
    app = [_host_amounts(c) for c in app_containers]
    init = [(_host_amounts(c), c.get("restartPolicy") == "Always") for c in init_containers]
    cpu, mem = _effective(app, init, width=2)
    overhead = spec.get("overhead") or {}
    if isinstance(overhead, Mapping):
        if "cpu" in overhead:
            cpu += int((non_negative_quantity(overhead["cpu"], "overhead cpu") * 1000).to_integral_value(
                rounding=ROUND_CEILING))
        if "memory" in overhead:
            mem += quantity_to_bytes(overhead["memory"], "overhead memory")
    return int(cpu), mem / float(1 << 20)


def pod_request(pod: Mapping[str, Any], memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB) -> GpuRequest:
    """:func:`pod_gpu_request` with the pod's host CPU and memory (:func:`pod_host_request`):
    what the extender decides with, the same request the benchmark's trace pods carry."""
    req = pod_gpu_request(pod, memory_unit_mib)
    cpu, mem = pod_host_request(pod)
    return GpuRequest(gpus=req.gpus, mem_mib=req.mem_mib, core_milli=req.core_milli,
                      min_card_mem_mib=req.min_card_mem_mib, cpu_milli=cpu, host_mem_mib=mem)


def pod_containers(pod: Mapping[str, Any], max_containers: int | None = MAX_CONTAINERS_PER_POD
                   ) -> tuple[Mapping[str, Any], list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(spec, app containers, init containers) of a pod, the entries that are objects (what the
    request rule reads; an API server stores no other). Refuses more than ``max_containers`` of
    them together (:data:`MAX_CONTAINERS_PER_POD`; None: no limit) before any is read, with the
    same error whatever the count past the limit.

    ``max_containers=None`` is for reading what a pod placed already holds (its record, its
    host CPU and memory on its node): it holds them whatever its size, and the limit is on what
    Stowage schedules."""
    if not isinstance(pod, Mapping):
        raise RequestError("pod is not an object")
    spec = pod.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise RequestError("pod.spec is not an object")
    containers = spec.get("containers") or []
    init_containers = spec.get("initContainers") or []
    if not isinstance(containers, list) or not isinstance(init_containers, list):
        raise RequestError("pod.spec.containers must be a list")
    app = [c for c in containers if isinstance(c, Mapping)]
    init = [c for c in init_containers if isinstance(c, Mapping)]
    if max_containers is not None and len(app) + len(init) > max_containers:
        raise RequestError(f"more than {max_containers} containers (init containers included): Stowage schedules "
                           f"pods of at most {max_containers}")
    return spec, app, init


def pod_gpu_amounts(pod: Mapping[str, Any], memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB,
                    max_containers: int | None = MAX_CONTAINERS_PER_POD) -> tuple[int, int, int]:
    """(``nvidia.com/gpu``, ``nvidia.com/gpu-memory`` in MiB, ``nvidia.com/gpu-core`` in milli)
    a pod asks by the effective-request rule, with ``spec.overhead``'s GPUs: the pod's request
    as kube-scheduler's NodeResourcesFit adds it up, whatever the three mean together (a
    whole-GPU pod's gpu-memory counts against the node's allocatable too). Unchecked beyond each
    quantity's grammar (:func:`pod_gpu_request` says what the combination means, or why not)."""
    spec, app_containers, init_containers = pod_containers(pod, max_containers)
    app = [_amounts(c, memory_unit_mib) for c in app_containers]
    init = [(_amounts(c, memory_unit_mib), c.get("restartPolicy") == "Always") for c in init_containers]
    gpus, mem_mib, core_milli = _effective(app, init)
    overhead = spec.get("overhead") or {}
    if isinstance(overhead, Mapping) and RESOURCE_GPU in overhead:
        gpus += quantity_to_int(overhead[RESOURCE_GPU], f"overhead {RESOURCE_GPU}")
    return gpus, mem_mib, core_milli


def pod_gpu_request(pod: Mapping[str, Any], memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB,
                    max_containers: int | None = MAX_CONTAINERS_PER_POD) -> GpuRequest:
    """The GPU request of a pod object (Kubernetes JSON, camelCase), by the effective-request rule.

    Raises :class:`RequestError` with a message meant for the user when the request is
    malformed (negative, fractional, or an impossible combination), or the pod has more than
    ``max_containers`` containers (:func:`pod_containers`).
    """
    gpus, mem_mib, core_milli = pod_gpu_amounts(pod, memory_unit_mib, max_containers)
    if gpus > MAX_GPUS_PER_POD:
        raise RequestError(f"pod asks for {gpus} GPUs; at most {MAX_GPUS_PER_POD} are supported")
    if mem_mib > MAX_CARD_MEMORY_MIB:
        raise RequestError(f"{RESOURCE_GPU_MEMORY}: {mem_mib // 1024} GiB on one card is more than any card "
                           f"could ever hold (at most {MAX_CARD_MEMORY_MIB // 1024} GiB)")
    if gpus > 0:
        # Whole cards: gpu-memory is a per-card minimum, compute is always the whole card.
        return GpuRequest(gpus=gpus, min_card_mem_mib=mem_mib)
    if core_milli > CORE_MILLI_PER_CARD:
        raise RequestError(f"{RESOURCE_GPU_CORE} is a percentage of one card (1-100): got {core_milli // 10}")
    if core_milli > 0 and mem_mib == 0:
        raise RequestError(f"{RESOURCE_GPU_CORE} needs {RESOURCE_GPU_MEMORY} too: a card share without memory cannot be enforced")
    return GpuRequest(mem_mib=mem_mib, core_milli=core_milli)
