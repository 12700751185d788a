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
FailedScheduling event says what to fix. So does a value past its length limit
(:data:`MAX_VALUE_CHARS`: 9 KiB for a model list, 256 characters for the others).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from stowage.resources import MAX_CARD_MEMORY_MIB, QuantityOutOfRange, RequestError, shown, split_quantity
from stowage.taints import tolerated_closures

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
    # Closures of a node (stowage.taints.NodeClosure bits) the pod's spec.tolerations open: not
    # an annotation (parse_policy leaves it 0); the pod's parse sets it from the Pod object.
    tolerates: int = 0


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> str:
    v = value.strip().lower()
    if v not in allowed:
        raise PolicyError(f"annotation {key}: unknown value {shown(value)} (expected {' or '.join(allowed)})")
    return v


MAX_MODELS_PER_LIST = 64   # GPU models one annotation may name
MAX_MODEL_NAME = 128       # characters in one model name
# Characters in one policy annotation value, checked before anything else of it. Why: the feed
# keeps each pending pod of Stowage's schedulers until it is bound
# (``extender.kube_objects.pod_for_bind``), a pod refused at filter stays pending for ever, and
# each value may be ~256 KiB; refused past its limit whatever follows, a value is kept only up to
# one character past it, and the copy fails as the pod does. Each limit is far above any value
# that means something: a model list holds at most 64 names of 128 characters, 8,318 characters
# written "a, b" (so ~900 characters of blanks and empty items to spare); a setting (pack,
# spread, prefer-local, any) or a card size (80Gi) is a word. Per key, so that a crafted pod's
# copy (~20 KiB) is about the size of a valid one with both longest lists (~17 KiB).
MAX_MODEL_LIST_CHARS = 9 * 1024
MAX_SETTING_CHARS = 256
MAX_VALUE_CHARS: dict[str, int] = {key: MAX_SETTING_CHARS for key in POLICY_KEYS} | {
    GPU_MODEL: MAX_MODEL_LIST_CHARS, GPU_MODEL_EXCLUDE: MAX_MODEL_LIST_CHARS}
# Characters in the longest annotation key an API server accepts: a DNS-subdomain prefix (253),
# "/", a name (63). An unknown key past it is refused without its exact length, for the same copy.
MAX_KEY_CHARS = 253 + 1 + 63
SHOWN_KEY = 80   # characters of an unknown key its error shows


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
    except QuantityOutOfRange as exc:   # an exponent past +-40: "e-" only in a tiny one (no unit then)
        if "e-" in value.lower():
            raise PolicyError(f"annotation {key}: {shown(value)} is too small to be a card size (e.g. 80Gi or "
                              "80)") from exc
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


def _key_shown(key: str) -> str:
    """An unknown key for its error: short, and past MAX_KEY_CHARS without its exact length."""
    if len(key) > MAX_KEY_CHARS:
        return shown(key[:SHOWN_KEY], SHOWN_KEY)[1:-1] + f"... (longer than {MAX_KEY_CHARS} characters)"
    return shown(key, SHOWN_KEY)[1:-1]


def policy_annotations(annotations: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`parse_policy` reads of ``annotations``, bounded in size whatever they hold:
    ``parse_policy`` returns or raises for this what it returns or raises for ``annotations``.

    Why: the Kubernetes feed keeps this of each pending pod of Stowage's schedulers until it is
    bound, and a pod refused at filter stays pending for ever; its author can make each value
    ~256 KiB. Kept: the policy keys in order, each text value up to one character past its limit
    (:data:`MAX_VALUE_CHARS`: past it the error is the same), each other value as an empty one of
    its type (its error names the type only); then the first unknown ``stowage.io/`` key, up to
    one character past :data:`MAX_KEY_CHARS`, without its value (refused by name before its
    value is read, and no key after it is read). At most 2 x 9 KiB + 4 x 256 + 318 characters.
    """
    kept: dict[str, Any] = {}
    for key, raw in annotations.items():
        if not isinstance(key, str) or not key.startswith(PREFIX) or key in OWN_KEYS:
            continue
        if key not in POLICY_KEYS:
            kept[key[:MAX_KEY_CHARS + 1]] = ""
            break
        kept[key] = raw[:MAX_VALUE_CHARS[key] + 1] if isinstance(raw, str) else small_like(raw)
    return kept


def small_like(value: Any) -> Any:
    """An empty value of ``value``'s type (``[]`` for a list, ``0`` for an int), or ``value`` itself
    when its type has none (``None``): what a reader that names a value by its type only
    (:func:`~stowage.resources.shown`) makes of it is what it makes of ``value``, in bounded size."""
    try:
        return type(value)()
    except (TypeError, ValueError):   # a type without an empty value (None): kept; JSON has no other
        return value


def pod_policy(pod: Mapping[str, Any], annotations: Mapping[str, Any] | None,
               default: PodPolicy | None = None) -> PodPolicy:
    """A pod's placement policy: :func:`parse_policy` of its annotations (which raises
    :class:`PolicyError`), and the node closures its ``spec.tolerations`` open
    (:func:`stowage.taints.tolerated_closures`: a DaemonSet's pod may go to a cordoned node)."""
    policy = parse_policy(annotations, default)
    tolerates = tolerated_closures(pod)
    return replace(policy, tolerates=int(tolerates)) if tolerates else policy


def parse_policy(annotations: Mapping[str, Any] | None, default: PodPolicy | None = None) -> PodPolicy:
    """The pod's policy: the cluster default overridden by its ``stowage.io/`` annotations."""
    pol = default or PodPolicy()
    ann = annotations or {}
    for key, raw in ann.items():
        if not isinstance(key, str) or not key.startswith(PREFIX) or key in OWN_KEYS:
            continue
        if key not in POLICY_KEYS:   # refused by name: its value is never read
            raise PolicyError(f"unknown annotation {_key_shown(key)} (known: {' '.join(sorted(POLICY_KEYS))})")
        if not isinstance(raw, str):   # an API server stores only text; anything else came by the port
            raise PolicyError(f"annotation {key}: the value must be a text, not {shown(raw)}")
        if len(raw) > MAX_VALUE_CHARS[key]:   # first, and whatever the rest: see MAX_VALUE_CHARS
            raise PolicyError(f"annotation {key}: longer than {MAX_VALUE_CHARS[key]} characters")
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
