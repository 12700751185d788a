"""An embedded, simulated cluster: nodes and cards from a YAML file, no Kubernetes needed.

It feeds the same :class:`~packing.model.ClusterModel` the Kubernetes feeder feeds, so
`stowage demo` and `stowage extender --simulated` exercise exactly the production code path
above the model. The format is documented at the top of the built-in file,
``extender/data/default-cluster.yaml``; :func:`load_cluster` validates a user file of the
same format and names the offending entry in its errors.

:func:`node_objects` renders the cluster as ``v1.Node`` JSON objects (like those kube-scheduler
sends with ``nodeCacheCapable: false``), carrying the inventory annotation our device plugin
would publish, so the full-nodes mode can be driven too.
"""
from __future__ import annotations

import re
import string
import uuid
from dataclasses import dataclass, field
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any, Mapping

import yaml

from stowage.inventory import (MAX_CARDS_PER_NODE, MAX_MEMORY_UNIT_MIB, MAX_NUMA_NODE, GFD_COUNT, GFD_MEMORY, GFD_PRODUCT, INVENTORY_ANNOTATION, Card, Inventory,
                               encode_inventory)
from stowage.resources import (DEFAULT_MEMORY_UNIT_MIB, MAX_CARD_MEMORY_MIB, RESOURCE_GPU, RESOURCE_GPU_MEMORY, RequestError,
                               quantity_to_mib, quantity_to_milli)

from packing.model import ClusterModel
from packing.pod_policy import GPU_MODEL, MAX_MODEL_NAME

BUILTIN = "builtin"
_UUID_NS = uuid.UUID("6f1d3a52-5b7e-4c1e-9d5f-2a8b7c6e4d30")
MAX_NODES = 100_000
# Cards of the whole cluster: 10,000 nodes of 64 cards or 100,000 of 8 (the latency benchmarks'
# largest clusters are 10,000 nodes). Checked per entry before its nodes are built: 100,000
# nodes of 64 cards (a 90-byte file) built 6.4 million cards, a minute and gigabytes.
MAX_CLUSTER_CARDS = 1_000_000


class SimClusterError(ValueError):
    """A simulated-cluster file that cannot be used; the message names file and entry."""


@dataclass(frozen=True)
class SimNode:
    name: str
    cards: tuple[Card, ...]
    cpu_milli: int = 0       # 0: not given
    memory_mib: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)

    def inventory(self, memory_unit_mib: int) -> Inventory:
        return Inventory(cards=self.cards, source="simulated", memory_unit_mib=memory_unit_mib)


@dataclass(frozen=True)
class SimCluster:
    nodes: tuple[SimNode, ...]
    memory_unit_mib: int = DEFAULT_MEMORY_UNIT_MIB
    source: str = BUILTIN

    @property
    def card_count(self) -> int:
        return sum(len(n.cards) for n in self.nodes)

    def populate(self, model: ClusterModel) -> None:
        """Put every node and card into the model (host CPU/memory are kube-scheduler's job)."""
        for n in self.nodes:
            model.upsert_node(n.name, n.inventory(self.memory_unit_mib))


def builtin_path() -> Path:
    return Path(str(importlib_resources.files("extender.data").joinpath("default-cluster.yaml")))


def card_uuid(node: str, index: int) -> str:
    """A stable, realistic-looking UUID for a simulated card."""
    return "GPU-" + str(uuid.uuid5(_UUID_NS, f"{node}/{index}"))


def _where(src: str, path: str) -> str:
    return f"{src}: {path}"


def _quoted(value: Any) -> str:
    """A value of the file for its error: a scalar as written (at most 80 characters), a list or
    mapping by its type only (its repr is as big as the file, or as all its aliases)."""
    if isinstance(value, (list, dict, set)):
        return f"<{type(value).__name__}>"
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


def _int(value: Any, where: str, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SimClusterError(f"{where}: expected a whole number, got {_quoted(value)}")
    if value < lo or (hi is not None and value > hi):
        raise SimClusterError(f"{where}: {_quoted(value)} is out of range "
                              f"({lo}..{hi if hi is not None else ''})")
    return value


SMALLEST_BARE_MIB = 1024   # a bare card memory below this is a unit mistake: no GPU has under 1 GiB


def _mib(value: Any, where: str) -> int:
    """Per-card memory: a quantity ("80Gi") or a bare number of MiB.

    A bare number under 1 GiB is refused: ``memory: 80`` meant 80 GiB (the pod annotation
    stowage.io/min-card-memory reads a bare 80 as GiB), and as MiB it made cards no pod fits,
    with nothing said."""
    try:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            mib, bare = int(value), True
        elif isinstance(value, str) and value.isascii() and value.strip().replace(".", "", 1).isdigit():
            mib, bare = int(float(value)), True
        else:
            mib, bare = quantity_to_mib(value), False
    except (RequestError, OverflowError, ValueError) as exc:   # int(float("9" * 400)): infinity
        raise SimClusterError(f"{where}: {exc} (per-card memory: a quantity such as 80Gi, or a bare "
                              "number of MiB)") from None
    if mib <= 0:
        raise SimClusterError(f"{where}: memory must be positive, got {_quoted(value)}")
    if mib > MAX_CARD_MEMORY_MIB:   # the bound every inventory reader holds a card to
        raise SimClusterError(f"{where}: memory must be at most {MAX_CARD_MEMORY_MIB} MiB, got {_quoted(value)}")
    if bare and mib < SMALLEST_BARE_MIB:
        shown = str(value).strip()
        raise SimClusterError(f"{where}: a bare number is MiB, and {shown} MiB is smaller than any GPU: "
                              f"write {shown}Gi for {shown} GiB")
    return mib


def _host(value: Any, where: str, conv) -> int:
    if value is None:
        return 0
    try:
        out = conv(value)
    except RequestError as exc:
        raise SimClusterError(f"{where}: {exc}") from None
    if out < 0:
        raise SimClusterError(f"{where}: must not be negative")
    return out


def _numa(value: Any, count: int, where: str) -> list[int]:
    """Each card's NUMA node, -1 (unknown) to MAX_NUMA_NODE: the bound the inventory annotation
    holds it to (a larger one overflowed the model's int64 array: a traceback in inspect)."""
    if value is None:
        return [-1] * count
    if isinstance(value, int) and not isinstance(value, bool):
        return [_int(value, where, -1, MAX_NUMA_NODE)] * count
    if isinstance(value, list) and len(value) == count:
        return [_int(v, f"{where}[{k}]", -1, MAX_NUMA_NODE) for k, v in enumerate(value)]
    raise SimClusterError(f"{where}: expected one int or a list of {count} ints, got {_quoted(value)}")


def _nvlink(value: Any, count: int, where: str) -> list[set[int]]:
    peers: list[set[int]] = [set() for _ in range(count)]
    if value is None:
        return peers
    if value == "all":
        groups = [list(range(count))]
    elif isinstance(value, list) and all(isinstance(g, list) for g in value):
        groups = value
    else:
        raise SimClusterError(f"{where}: expected \"all\" or a list of card-index groups, got {_quoted(value)}")
    if sum(len(g) for g in groups) > MAX_NVLINK_INDICES:
        raise SimClusterError(f"{where}: more than {MAX_NVLINK_INDICES} card indices in all (every pair of "
                              f"{MAX_CARDS_PER_NODE} cards is fewer)")
    for gi, g in enumerate(groups):
        ks = [_int(k, f"{where}[{gi}]", 0, count - 1) for k in g]
        for k in ks:
            peers[k].update(x for x in ks if x != k)
    return peers


MAX_NVLINK_INDICES = MAX_CARDS_PER_NODE ** 2   # every pair of a node's cards is fewer (4,032)


def _known_keys(entry: dict, known: set[str], where: str) -> None:
    """A misspelled key is an error, not silently ignored."""
    unknown = set(entry) - known
    if unknown:
        raise SimClusterError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")


@dataclass(frozen=True)
class _CardsSpec:
    """An entry's validated ``gpus``, the same for each of its ``count`` nodes: read once per
    entry (each node was read again before: its nvlink groups, count times), built per node."""

    model: str = ""
    memory_mib: int = 0
    numa: tuple[int, ...] = ()
    links: tuple[tuple[int, ...], ...] = ()
    unhealthy: frozenset[int] = frozenset()

    def cards(self, node: str) -> tuple[Card, ...]:
        return tuple(Card(index=k, uuid=card_uuid(node, k), model=self.model, memory_mib=self.memory_mib,
                          healthy=k not in self.unhealthy, numa=self.numa[k], nvlink=self.links[k])
                     for k in range(len(self.numa)))


def _cards(gpus: Any, where: str) -> _CardsSpec:
    if gpus is None:
        return _CardsSpec()
    if not isinstance(gpus, dict):
        raise SimClusterError(f"{where}: expected a mapping with model, count, memory")
    _known_keys(gpus, {"model", "count", "memory", "numa", "nvlink", "unhealthy"}, where)
    model = gpus.get("model")
    if not isinstance(model, str) or not model.strip():
        raise SimClusterError(f"{where}.model: expected a GPU model name")
    if len(model.strip()) > MAX_MODEL_NAME or "," in model or not model.isprintable():
        raise SimClusterError(f"{where}.model: {_quoted(model)} is not a GPU model name (printable, no comma, at most "
                              f"{MAX_MODEL_NAME} characters: what a pod's {GPU_MODEL} list can name)")
    if "count" not in gpus:
        raise SimClusterError(f"{where}.count: missing (cards per node, e.g. 8)")
    count = _int(gpus.get("count"), f"{where}.count", 0, MAX_CARDS_PER_NODE)
    if "memory" not in gpus:
        raise SimClusterError(f"{where}.memory: missing (per-card memory, e.g. 80Gi)")
    mem = _mib(gpus["memory"], f"{where}.memory")
    numa = _numa(gpus.get("numa"), count, f"{where}.numa")
    links = _nvlink(gpus.get("nvlink"), count, f"{where}.nvlink")
    bad = gpus.get("unhealthy") or []
    if not isinstance(bad, list):
        raise SimClusterError(f"{where}.unhealthy: expected a list of card indices")
    if len(bad) > MAX_CARDS_PER_NODE:
        raise SimClusterError(f"{where}.unhealthy: more than {MAX_CARDS_PER_NODE} card indices")
    unhealthy = frozenset(_int(k, f"{where}.unhealthy", 0, max(count - 1, 0)) for k in bad)
    return _CardsSpec(model=model.strip(), memory_mib=mem, numa=tuple(numa),
                      links=tuple(tuple(sorted(peers)) for peers in links), unhealthy=unhealthy)


# A Kubernetes label: key [prefix/]name (prefix a DNS subdomain), value empty or a name.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?" + _LABEL_NAME)
_LABEL_VALUE = re.compile(f"({_LABEL_NAME})?")


def _label_text(value: Any) -> str | None:
    """A label key or value as Kubernetes text: YAML's true/false and numbers as written, null
    as empty; None for a list or mapping (no label can hold one)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    return None


def _labels(value: Any, where: str) -> dict[str, str]:
    """The node's extra labels, each one an API server would store: they are served on the
    node objects (--full-nodes), where a list was str()'d into one before."""
    if not isinstance(value, dict):
        raise SimClusterError(f"{where}: expected a mapping")
    out: dict[str, str] = {}
    for k, v in value.items():
        key, text = _label_text(k), _label_text(v)
        if text is None:
            raise SimClusterError(f"{where}: the value of {_quoted(key)} must be a text, not {_quoted(v)}")
        if key is None or len(key) > MAX_NODE_NAME_CHARS + 64 or not _LABEL_KEY.fullmatch(key) \
                or len(key.rpartition("/")[0]) > MAX_NODE_NAME_CHARS:
            raise SimClusterError(f"{where}: {_quoted(key if key is not None else k)} is not a Kubernetes label key "
                                  "([prefix/]name: a name of at most 63 letters, digits, '-', '_' or '.')")
        if not _LABEL_VALUE.fullmatch(text):
            raise SimClusterError(f"{where}: {_quoted(key)} = {_quoted(text)} is not a Kubernetes label value (at "
                                  "most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)")
        out[key] = text
    return out


# A Kubernetes node name: a DNS subdomain (RFC 1123), what the API server takes as metadata.name.
MAX_NODE_NAME_CHARS = 253
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_FORMATTER = string.Formatter()


def _name_parts(pattern: str, where: str) -> list[tuple[str, str | None]]:
    """``pattern`` as (literal text, format spec of ``{i}`` or None) pairs, checked before any
    formatting: only ``{i}`` or ``{i:FORMAT}``, no attribute, index, other field or conversion
    (``str.format`` would run them: ``{i.nope}`` raised AttributeError), and no width or precision
    above a node name's length (``{i:>99999999}`` built a 100 MB name)."""
    def bad(why: str) -> SimClusterError:
        return SimClusterError(f"{where}: bad pattern {pattern[:80]!r} ({why})")
    try:
        parsed = list(_FORMATTER.parse(pattern))
    except ValueError as exc:
        raise bad(str(exc)) from None
    parts: list[tuple[str, str | None]] = []
    for literal, field_name, spec, conversion in parsed:
        if field_name is None:
            parts.append((literal, None))
            continue
        if field_name != "i" or conversion is not None or "{" in (spec or ""):
            raise bad("only {i} or {i:FORMAT} may stand in braces, e.g. \"a100-{i:02d}\"")
        if any(len(d) > 3 or int(d) > MAX_NODE_NAME_CHARS for d in re.findall(r"\d+", spec or "")):
            raise bad(f"a width or precision makes a name longer than a node name's {MAX_NODE_NAME_CHARS} "
                      f"characters: at most {MAX_NODE_NAME_CHARS}")
        parts.append((literal, spec or ""))
    return parts


def node_name(pattern: str, parts: list[tuple[str, str | None]], i: int, where: str) -> str:
    """Node ``i``'s name from the file's ``name`` pattern (``parts``: :func:`_name_parts` of it,
    read once per entry), a Kubernetes node name or the file's :class:`SimClusterError` (what the
    extender serves and ``stowage inspect`` prints is a name an API server would take)."""
    pieces = []
    for literal, spec in parts:
        pieces.append(literal)
        if spec is not None:
            try:
                pieces.append(format(i, spec))
            except ValueError as exc:
                raise SimClusterError(f"{where}: bad pattern {pattern[:80]!r} ({exc})") from None
    name = "".join(pieces)
    if len(name) > MAX_NODE_NAME_CHARS or not _NODE_NAME.fullmatch(name):
        raise SimClusterError(f"{where}: {name[:80]!r}{'...' if len(name) > 80 else ''} is not a Kubernetes "
                              f"node name (lower-case letters, digits, '-' and '.', starting and ending with a "
                              f"letter or digit, at most {MAX_NODE_NAME_CHARS} characters)")
    return name


def parse_cluster(doc: Any, src: str = "<cluster>") -> SimCluster:
    """Validate a parsed YAML document into a :class:`SimCluster`."""
    if not isinstance(doc, dict):
        raise SimClusterError(f"{src}: expected a mapping with a 'nodes' list at the top")
    unknown = set(doc) - {"nodes", "memoryUnitMiB"}
    if unknown:
        raise SimClusterError(f"{src}: unknown top-level key(s) {', '.join(sorted(map(str, unknown)))}")
    unit = _int(doc.get("memoryUnitMiB", DEFAULT_MEMORY_UNIT_MIB), _where(src, "memoryUnitMiB"), 1, MAX_MEMORY_UNIT_MIB)
    entries = doc.get("nodes")
    if not isinstance(entries, list) or not entries:
        raise SimClusterError(f"{src}: 'nodes' must be a non-empty list")
    nodes: list[SimNode] = []
    seen: set[str] = set()
    cards = 0
    for e, entry in enumerate(entries):
        where = _where(src, f"nodes[{e}]")
        if not isinstance(entry, dict):
            raise SimClusterError(f"{where}: expected a mapping")
        _known_keys(entry, {"name", "count", "cpu", "memory", "labels", "gpus"}, where)
        pattern = entry.get("name")
        if not isinstance(pattern, str) or not pattern:
            raise SimClusterError(f"{where}.name: expected a node name (with {{i}} when count > 1)")
        count = _int(entry.get("count", 1), f"{where}.count", 1, MAX_NODES)
        if count > 1 and "{i" not in pattern:
            raise SimClusterError(f"{where}.name: with count > 1 the name needs {{i}} (e.g. \"a100-{{i:02d}}\")")
        cpu = _host(entry.get("cpu"), f"{where}.cpu", quantity_to_milli)
        mem = _host(entry.get("memory"), f"{where}.memory", quantity_to_mib)
        labels = _labels(entry.get("labels") or {}, f"{where}.labels")
        parts = _name_parts(pattern, f"{where}.name")
        spec = _cards(entry.get("gpus"), f"{where}.gpus")
        cards += count * len(spec.numa)
        if cards > MAX_CLUSTER_CARDS:
            raise SimClusterError(f"{where}: {count} nodes of {len(spec.numa)} cards make more than "
                                  f"{MAX_CLUSTER_CARDS} cards in the cluster")
        for i in range(1, count + 1):
            name = node_name(pattern, parts, i, f"{where}.name")
            if name in seen:
                raise SimClusterError(f"{where}: duplicate node name {name!r}")
            seen.add(name)
            nodes.append(SimNode(name=name, cards=spec.cards(name),
                                 cpu_milli=cpu, memory_mib=mem,
                                 labels=labels))
            if len(nodes) > MAX_NODES:
                raise SimClusterError(f"{src}: more than {MAX_NODES} nodes")
    return SimCluster(nodes=tuple(nodes), memory_unit_mib=unit, source=src)


def load_cluster(path: str | Path | None = None) -> SimCluster:
    """The cluster in ``path`` (YAML), or the built-in one for None / "builtin"."""
    if path is None or str(path) == BUILTIN:
        p = builtin_path()
        src = BUILTIN
    else:
        p = Path(path)
        src = str(p)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SimClusterError(f"{src}: cannot read cluster file: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise SimClusterError(f"{src}: more than {MAX_FILE_BYTES} bytes, too big for a cluster file (write many "
                              "alike nodes as one entry with count)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SimClusterError(f"{src}: not UTF-8 text (byte {exc.start}), so not a cluster YAML file") from None
    return parse_cluster(_load_yaml(text, src), src)


# Bounds on what a cluster file's YAML may stand for, checked on the composed node graph before
# any Python object is built. Why: aliases share one node, so a few hundred bytes of nested
# anchors ("billion laughs") stand for 9**8 strings, and every reader that walks the data whole
# (an error's repr, str() of a label) built all of them (1.3 GB, no end); nesting is bounded so
# that no reader recurses past Python's limit (PyYAML's own composer raised RecursionError).
# A real file is a few levels deep and a few thousand nodes: many alike nodes are one entry.
MAX_FILE_BYTES = 16 << 20
MAX_YAML_NODES = 2_000_000    # YAML nodes the document stands for, each alias counted in full
MAX_YAML_DEPTH = 64


class _ClusterLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):   # type: ignore[misc]
    """Safe loading (no Python tags), and a key written twice in one mapping is an error: the
    second silently replaced the first (a second top-level ``nodes:`` dropped every node above)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found the key {str(key)[:80]!r} a second time", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


def _node_sizes(root: yaml.Node, src: str) -> None:
    """Raise the file's error if ``root`` nests deeper than MAX_YAML_DEPTH, contains itself, or
    stands for more than MAX_YAML_NODES nodes with every alias expanded. Iterative, and each
    shared node is sized once, so checking costs the file's size, not what it stands for."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] > MAX_YAML_NODES:
                raise SimClusterError(f"{src}: its aliases stand for more than {MAX_YAML_NODES} YAML nodes "
                                      f"(line {node.start_mark.line + 1}): not a cluster file")
            continue
        if key in size:
            continue
        if key in on_path:
            raise SimClusterError(f"{src}: an anchor refers to itself (line {node.start_mark.line + 1}): not a "
                                  "cluster file")
        if depth > MAX_YAML_DEPTH:
            raise SimClusterError(f"{src}: nested more than {MAX_YAML_DEPTH} levels deep (line "
                                  f"{node.start_mark.line + 1}): not a cluster file")
        on_path.add(key)
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in _children(node))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _load_yaml(text: str, src: str) -> Any:
    """The document in ``text``, safely loaded within the bounds above; the file's
    :class:`SimClusterError` for anything else."""
    loader = _ClusterLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _node_sizes(node, src)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise SimClusterError(f"{src}: not valid YAML: {exc}") from None
    except RecursionError:   # the pure-Python composer, where libyaml is missing: nesting
        raise SimClusterError(f"{src}: nested too deep: not a cluster file") from None
    except SimClusterError:   # a ValueError too, from _node_sizes: already the file's error
        raise
    except ValueError as exc:   # int() of a number past Python's 4300 digits, in the constructor
        raise SimClusterError(f"{src}: not valid YAML here: {str(exc)[:120]}") from None
    finally:
        loader.dispose()


def node_objects(cluster: SimCluster) -> list[dict[str, Any]]:
    """The cluster's nodes as ``v1.Node`` JSON objects (as kube-scheduler sends them)."""
    out = []
    for n in cluster.nodes:
        healthy = [c for c in n.cards if c.healthy]
        labels = {"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", **n.labels}
        resources: dict[str, str] = {"pods": "110"}
        if n.cpu_milli:
            resources["cpu"] = f"{n.cpu_milli}m" if n.cpu_milli % 1000 else str(n.cpu_milli // 1000)
        if n.memory_mib:
            resources["memory"] = f"{n.memory_mib}Mi"
        annotations = {}
        if n.cards:
            model = n.cards[0].model
            labels.update({GFD_COUNT: str(len(n.cards)), GFD_PRODUCT: model.replace(" ", "-"),
                           GFD_MEMORY: str(n.cards[0].memory_mib)})
            resources[RESOURCE_GPU] = str(len(healthy))
            resources[RESOURCE_GPU_MEMORY] = str(sum(c.memory_mib for c in healthy) // cluster.memory_unit_mib)
            annotations[INVENTORY_ANNOTATION] = encode_inventory(n.cards, cluster.memory_unit_mib)
        out.append({
            "metadata": {"name": n.name, "uid": str(uuid.uuid5(_UUID_NS, f"node/{n.name}")),
                         "labels": labels, "annotations": annotations},
            "spec": {},
            "status": {"capacity": dict(resources), "allocatable": dict(resources),
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "simulated by Stowage"}]},
        })
    return out


def describe(cluster: SimCluster) -> str:
    """One line: '36 nodes, 204 cards (32 H100-SXM5-80GB, ...)'."""
    counts: dict[str, int] = {}
    for n in cluster.nodes:
        for c in n.cards:
            counts[c.model] = counts.get(c.model, 0) + 1
    detail = ", ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f"{len(cluster.nodes)} nodes, {cluster.card_count} cards ({detail})"


__all__ = ["SimCluster", "SimNode", "SimClusterError", "load_cluster", "parse_cluster", "node_objects",
           "card_uuid", "builtin_path", "describe", "BUILTIN"]
