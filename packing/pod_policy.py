"""Per-pod placement policy, read from pod annotations under ``stowage.io/``.

| annotation                       | values                         | default            |
|----------------------------------|--------------------------------|--------------------|
| stowage.io/node-policy           | pack, spread                   | cluster default    |
| stowage.io/card-policy           | pack, spread                   | cluster default    |
| stowage.io/gpu-model             | comma list of models to allow  | any                |
| stowage.io/gpu-model-exclude     | comma list of models to avoid  | none               |
| stowage.io/min-card-memory       | quantity ("80Gi") or GiB ("80")| 0                  |
| stowage.io/gpu-topology          | prefer-local, any              | prefer-local       |

Models match exactly on whole tokens (:func:`stowage.inventory.model_matches`): "A10" never
selects an A100. An unknown key under ``stowage.io/`` that looks like a policy key, or an
unknown value, raises :class:`PolicyError`; the extender reports it on every node so the pod's
FailedScheduling event says what to fix.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from stowage.resources import MAX_CARD_MEMORY_MIB, QuantityOutOfRange, RequestError, shown, split_quantity

PREFIX = "stowage.io/"
NODE_POLICY = PREFIX + "node-policy"
CARD_POLICY = PREFIX + "card-policy"
GPU_MODEL = PREFIX + "gpu-model"
GPU_MODEL_EXCLUDE = PREFIX + "gpu-model-exclude"
MIN_CARD_MEMORY = PREFIX + "min-card-memory"
GPU_TOPOLOGY = PREFIX + "gpu-topology"

PACK, SPREAD = "pack", "spread"
PREFER_LOCAL, ANY = "prefer-local", "any"

POLICY_KEYS = {NODE_POLICY, CARD_POLICY, GPU_MODEL, GPU_MODEL_EXCLUDE, MIN_CARD_MEMORY, GPU_TOPOLOGY}
# Keys Stowage itself writes on pods; never a user error.
OWN_KEYS = {PREFIX + "allocation", PREFIX + "requeued-at"}  # the extender's record; its requeue stamp


class PolicyError(ValueError):
    """A pod annotation Stowage cannot honour; the message is shown to the user as is."""


@dataclass(frozen=True)
class PodPolicy:
    node: str = PACK
    card: str = PACK
    models_include: tuple[str, ...] = ()
    models_exclude: tuple[str, ...] = ()
    min_card_mem_mib: int = 0
    topology: str = PREFER_LOCAL

    @property
    def constrains_cards(self) -> bool:
        return bool(self.models_include or self.models_exclude or self.min_card_mem_mib)


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> str:
    v = value.strip().lower()
    if v not in allowed:
        raise PolicyError(f"annotation {key}: unknown value {shown(value)} (expected {' or '.join(allowed)})")
    return v


MAX_MODELS_PER_LIST = 64   # GPU models one annotation may name
MAX_MODEL_NAME = 128       # characters in one model name


def _models(key: str, value: str) -> tuple[str, ...]:
    """A list of GPU models. Bounded: the list is learned with the pod and matched against every
    model of the cluster whenever the learned workload is rebuilt, so a list written to be huge
    would cost every later pod, not only this one (real lists name a few models)."""
    items = tuple(m.strip() for m in value.split(",") if m.strip())
    if not items:
        raise PolicyError(f"annotation {key}: empty model list")
    if len(items) > MAX_MODELS_PER_LIST:
        raise PolicyError(f"annotation {key}: {len(items)} models, at most {MAX_MODELS_PER_LIST}")
    longest = max(items, key=len)
    if len(longest) > MAX_MODEL_NAME:
        raise PolicyError(f"annotation {key}: a model name of {len(longest)} characters, at most {MAX_MODEL_NAME}")
    return items


def _memory_mib(key: str, value: str) -> int:
    """A card size: a bare number is GiB (``80``, ``8e1``: how people say card sizes), a quantity
    with a unit is bytes (``80Gi``). Bounded, so no size beyond any card reaches the placer."""
    try:
        q, suffix = split_quantity(value.strip())
    except QuantityOutOfRange as exc:
        raise PolicyError(f"annotation {key}: {shown(value)} is more than any card could ever hold") from exc
    except RequestError as exc:
        raise PolicyError(f"annotation {key}: {shown(value)} is not a quantity (e.g. 80Gi or 80)") from exc
    if q < 0:
        raise PolicyError(f"annotation {key}: must not be negative")
    mib = q * 1024 if not suffix else q / (1 << 20)
    if mib > MAX_CARD_MEMORY_MIB:
        raise PolicyError(f"annotation {key}: {shown(value)} is more than any card could ever hold (no card has "
                          f"over {MAX_CARD_MEMORY_MIB // 1024} GiB)")
    return int(mib)


def parse_policy(annotations: Mapping[str, Any] | None, default: PodPolicy | None = None) -> PodPolicy:
    """The pod's policy: the cluster default overridden by its ``stowage.io/`` annotations."""
    pol = default or PodPolicy()
    ann = annotations or {}
    for key, raw in ann.items():
        if not isinstance(key, str) or not key.startswith(PREFIX) or key in OWN_KEYS:
            continue
        if key not in POLICY_KEYS:
            raise PolicyError(f"unknown annotation {shown(key, 80)[1:-1]} (known: {' '.join(sorted(POLICY_KEYS))})")
        if not isinstance(raw, str):   # an API server stores only text; anything else came by the port
            raise PolicyError(f"annotation {key}: the value must be a text, not {shown(raw)}")
        value = raw
        if key == NODE_POLICY:
            pol = replace(pol, node=_choice(key, value, (PACK, SPREAD)))
        elif key == CARD_POLICY:
            pol = replace(pol, card=_choice(key, value, (PACK, SPREAD)))
        elif key == GPU_MODEL:
            pol = replace(pol, models_include=_models(key, value))
        elif key == GPU_MODEL_EXCLUDE:
            pol = replace(pol, models_exclude=_models(key, value))
        elif key == MIN_CARD_MEMORY:
            pol = replace(pol, min_card_mem_mib=_memory_mib(key, value))
        elif key == GPU_TOPOLOGY:
            pol = replace(pol, topology=_choice(key, value, (PREFER_LOCAL, ANY)))
    return pol
