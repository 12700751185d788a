"""The kube-scheduler extender wire format (``k8s.io/kube-scheduler/extender/v1``), and nothing else.

kube-scheduler is not ours: these types mirror the upstream Go structs exactly. They have no
JSON tags, so on the wire the keys are the Go field names (``Pod``, ``Nodes``, ``NodeNames``,
``PodName``...). Go's ``encoding/json`` matches keys case-insensitively when decoding (an
exact match wins), so we accept any case on input but always answer with the Go spelling.

Upstream types::

    ExtenderArgs          {Pod *v1.Pod; Nodes *v1.NodeList; NodeNames *[]string}
    ExtenderFilterResult  {Nodes *v1.NodeList; NodeNames *[]string; FailedNodes map[string]string;
                           FailedAndUnresolvableNodes map[string]string; Error string}
    HostPriorityList      []{Host string; Score int64}
    ExtenderBindingArgs   {PodName, PodNamespace string; PodUID types.UID; Node string}
    ExtenderBindingResult {Error string}
    (preempt: ExtenderPreemptionArgs / ExtenderPreemptionResult, at the end of this module)

Parsing raises :class:`WireError` for a body that is not an extender request at all (the app
answers HTTP 400); everything that *is* a request but describes an unschedulable pod is left to
:mod:`extender.service`, which answers it through ``FailedNodes``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import orjson


class WireError(ValueError):
    """A body that is not a valid extender request; the message says what is wrong."""


def _get(doc: Mapping[str, Any], name: str) -> Any:
    """Field ``name`` the way Go decodes it: exact key first, else any key equal ignoring case.

    Go keeps the *last* case-insensitive match when several keys fold to the same name; an
    exact match is preferred regardless of order.
    """
    if name in doc:
        return doc[name]
    low = name.lower()
    found = None
    for key, value in doc.items():
        if isinstance(key, str) and key.lower() == low:
            found = value
    return found


def decode_body(body: bytes | str) -> dict[str, Any]:
    """The JSON object in a request body; :class:`WireError` if it is not one."""
    if isinstance(body, str):
        body = body.encode()
    if not body or not body.strip():
        raise WireError("empty request body: expected a JSON object from kube-scheduler")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise WireError(f"request body must be a JSON object, got {type(doc).__name__}")
    return doc


@dataclass
class ExtenderArgs:
    """A filter or prioritize request.

    ``node_names`` is set when the extender is ``nodeCacheCapable`` (kube-scheduler sends names
    only); ``nodes`` holds the full ``v1.Node`` objects otherwise. ``names`` is the union in
    request order, which is what the service works on.
    """

    pod: dict[str, Any]
    node_names: list[str] | None
    nodes: list[dict[str, Any]] | None
    names: list[str] = field(default_factory=list)

    @property
    def full_nodes(self) -> bool:
        return self.nodes is not None


def _node_name(node: Any, i: int) -> str:
    if not isinstance(node, dict):
        raise WireError(f"Nodes.items[{i}] must be a Node object, got {type(node).__name__}")
    meta = node.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise WireError(f"Nodes.items[{i}] has no metadata.name")
    return name


def _all_str(items: list[Any]) -> bool:
    try:
        "".join(items)
    except TypeError:
        return False
    return True


def parse_extender_args(body: bytes | str | Mapping[str, Any]) -> ExtenderArgs:
    """Parse an ``ExtenderArgs`` body (filter, prioritize)."""
    doc = decode_body(body) if isinstance(body, (bytes, bytearray, memoryview, str)) else body
    pod = _get(doc, "Pod")
    if pod is None:
        raise WireError("not an extender request: no 'Pod' (expected {\"Pod\": ..., \"NodeNames\": [...]} "
                        "or {\"Pod\": ..., \"Nodes\": {\"items\": [...]}})")
    if not isinstance(pod, dict):
        raise WireError(f"'Pod' must be a Pod object, got {type(pod).__name__}")
    raw_names = _get(doc, "NodeNames")
    node_names: list[str] | None = None
    if raw_names is not None:
        # str.join raises TypeError on any non-string item: the same check as isinstance per
        # item, 4x faster on 5,000 names.
        if not isinstance(raw_names, list) or not _all_str(raw_names):
            raise WireError("'NodeNames' must be a list of node name strings")
        node_names = raw_names
    raw_nodes = _get(doc, "Nodes")
    nodes: list[dict[str, Any]] | None = None
    node_list_names: list[str] = []
    if raw_nodes is not None:
        if not isinstance(raw_nodes, dict):
            raise WireError(f"'Nodes' must be a NodeList object with 'items', got {type(raw_nodes).__name__}")
        items = _get(raw_nodes, "items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise WireError("'Nodes.items' must be a list of Node objects")
        node_list_names = [_node_name(n, i) for i, n in enumerate(items)]
        nodes = items
    if node_names is None and nodes is None:
        names: list[str] = []
    elif node_names is not None and nodes is not None:
        # Never sent by kube-scheduler; be lenient and consider every node mentioned once.
        seen = set(node_names)
        names = list(node_names) + [n for n in node_list_names if n not in seen]
    else:
        names = list(node_names) if node_names is not None else node_list_names
    return ExtenderArgs(pod=pod, node_names=node_names, nodes=nodes, names=names)


# The longest name of a Kubernetes object (a DNS subdomain: pods, nodes); namespaces (63) and
# uids (36) are shorter. A bind body's names past it are no object's.
MAX_NAME_CHARS = 253


def _check_name(what: str, value: str) -> None:
    """A name a request sent, refused past :data:`MAX_NAME_CHARS`: no object has it, and quoted
    whole it would go into the log line, the error answered and an API request."""
    if len(value) > MAX_NAME_CHARS:
        raise WireError(f"{what} has {len(value)} characters; a Kubernetes name has at most {MAX_NAME_CHARS}")


@dataclass(frozen=True)
class BindingArgs:
    """An ``ExtenderBindingArgs`` body."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.pod_namespace}/{self.pod_name}"


def parse_binding_args(body: bytes | str | Mapping[str, Any]) -> BindingArgs:
    """Parse an ``ExtenderBindingArgs`` body (bind)."""
    # bytes first: isinstance() against the Mapping ABC costs more than decoding a bind body
    doc = decode_body(body) if isinstance(body, (bytes, bytearray, memoryview, str)) else body
    values = {}
    for name in ("PodName", "PodNamespace", "PodUID", "Node"):
        v = _get(doc, name)
        if v is None:
            v = ""
        if not isinstance(v, str):
            raise WireError(f"'{name}' must be a string, got {type(v).__name__}")
        _check_name(f"'{name}'", v)
        values[name] = v
    missing = [n for n in ("PodName", "Node") if not values[n]]
    if missing:
        raise WireError(f"not a bind request: missing {', '.join(missing)} "
                        "(expected {\"PodName\", \"PodNamespace\", \"PodUID\", \"Node\"})")
    return BindingArgs(pod_name=values["PodName"], pod_namespace=values["PodNamespace"] or "default",
                       pod_uid=values["PodUID"], node=values["Node"])


# ------------------------------------------------------------------------------------- answers
@dataclass
class FilterResult:
    """An ``ExtenderFilterResult``. ``None`` fields are encoded as JSON null, like Go nil."""

    node_names: list[str] | None = None
    nodes: list[dict[str, Any]] | None = None
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "Nodes": None if self.nodes is None else {"metadata": {}, "items": self.nodes},
            "NodeNames": self.node_names,
            "FailedNodes": self.failed,
            "FailedAndUnresolvableNodes": self.unresolvable,
            "Error": self.error,
        }


def filter_answer(args: ExtenderArgs | None, passing: Sequence[str] | None = None,
                  passing_nodes: list[dict[str, Any]] | None = None,
                  failed: dict[str, str] | None = None, unresolvable: dict[str, str] | None = None,
                  error: str = "") -> FilterResult:
    """A filter answer in the same shape as the request.

    With ``nodeCacheCapable: false`` kube-scheduler reads ONLY ``Nodes`` (answering names
    alone silently rejects every node), so when the request carried Node objects the answer
    carries the passing Node objects exactly as received.
    """
    res = FilterResult(failed=dict(failed or {}), unresolvable=dict(unresolvable or {}), error=error)
    if args is None or args.node_names is not None or args.nodes is None:
        res.node_names = list(passing or [])
    if args is not None and args.nodes is not None:
        res.nodes = list(passing_nodes or [])
    return res


def encode(doc: Any) -> bytes:
    """JSON bytes for an answer (numpy integers allowed)."""
    return orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)


def encode_filter_result(res: FilterResult) -> tuple[bytes, bytes | None]:
    """``encode(res.to_json())``, byte for byte, and the JSON of its ``NodeNames`` array (None
    when it is null) as a piece of it: the passing list kube-scheduler sends to prioritize
    next, which :class:`extender.wirememo.NodeNamesMemo` can then recognise without decoding."""
    names_json = None if res.node_names is None else encode(res.node_names)
    nodes = None if res.nodes is None else {"metadata": {}, "items": res.nodes}
    body = b"".join((b'{"Nodes":', encode(nodes), b',"NodeNames":', names_json or b"null",
                     b',"FailedNodes":', encode(res.failed), b',"FailedAndUnresolvableNodes":',
                     encode(res.unresolvable), b',"Error":', encode(res.error), b"}"))
    return body, names_json


def priority_list(hosts: Sequence[str], scores: Sequence[int]) -> list[dict[str, Any]]:
    """A ``HostPriorityList``: ``[{"Host": name, "Score": 0..10}, ...]``."""
    return [{"Host": h, "Score": int(s)} for h, s in zip(hosts, scores)]


# '{"Host":"<name>","Score":' per node name, and '<score>},' per score 0..10: see encode_priority_list.
_HOST_PREFIX: dict[str, bytes] = {}
_HOST_PREFIX_MAX = 200_000
_SCORE_TAIL = np.array([b"%d}," % s for s in range(11)] + [b""], dtype=object)[:-1]  # object array, not bytes_


def priority_heads(hosts: Sequence[str]) -> list[bytes]:
    """Each host's ``{"Host":"<name>","Score":`` piece of :func:`encode_priority_list`, which
    a caller may keep for a list of hosts it will answer again."""
    prefix = _HOST_PREFIX
    try:
        return list(map(prefix.__getitem__, hosts))
    except KeyError:
        if len(prefix) > _HOST_PREFIX_MAX:
            prefix.clear()  # node names churned a lot: start over rather than grow without bound
        for h in dict.fromkeys(hosts):  # in request order: later lookups walk memory in order
            if h not in prefix:
                prefix[h] = b'{"Host":' + orjson.dumps(h) + b',"Score":'
        return [prefix.get(h) or b'{"Host":' + orjson.dumps(h) + b',"Score":' for h in hosts]


def encode_priority_list(hosts: Sequence[str], scores: Sequence[int], heads: list[bytes] | None = None) -> bytes:
    """``encode(priority_list(hosts, scores))``, byte for byte, without building a dict per host.

    Why: on a 5,000-node prioritize, making and encoding 5,000 small dicts was the largest single
    cost of the answer. Each host's JSON prefix is made once and kept (node names repeat on every
    request), so an answer is one join of pre-encoded pieces, laid out by list slicing (in C).
    ``heads``: :func:`priority_heads` of ``hosts``, when the caller kept them.
    """
    arr = np.asarray(scores)
    if (not len(hosts) or arr.shape != (len(hosts),) or arr.dtype.kind not in "iu"
            or arr.min() < 0 or arr.max() >= len(_SCORE_TAIL)):
        return encode(priority_list(hosts, scores))
    if heads is None or len(heads) != len(hosts):
        heads = priority_heads(hosts)
    parts: list[bytes] = [b""] * (2 * len(hosts) + 2)
    parts[0] = b"["
    parts[1:-1:2] = heads
    parts[2:-1:2] = _SCORE_TAIL[arr].tolist()
    parts[-2] = parts[-2][:-1]  # no comma after the last entry
    parts[-1] = b"]"
    return b"".join(parts)


def binding_result(error: str = "") -> dict[str, str]:
    """An ``ExtenderBindingResult``; empty ``Error`` means success."""
    return {"Error": error}


def object_array(items: list) -> np.ndarray:
    """A 1-D numpy object array of ``items`` (selections from it run in C)."""
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr


def take(items: list, sel: np.ndarray) -> list:
    """items[sel] for a list, through a numpy object array (no Python loop per element)."""
    return object_array(items)[sel].tolist()


class PlainParser:
    """Request bodies decoded afresh every time: the reference of
    :class:`extender.wirememo.NodeNamesMemo` (same interface, nothing remembered)."""

    def parse(self, body: bytes | str) -> ExtenderArgs:
        return parse_extender_args(body)

    def remember(self, names_json: bytes, names: list[str]) -> None:
        return None



# ------------------------------------------------------------------------------------- preempt
# ExtenderPreemptionArgs   {Pod *v1.Pod; NodeNameToVictims map[string]*Victims;
#                           NodeNameToMetaVictims map[string]*MetaVictims}
# ExtenderPreemptionResult {NodeNameToMetaVictims map[string]*MetaVictims}
# Victims                  {Pods []*v1.Pod; NumPDBViolations int64}
# MetaVictims              {Pods []*MetaPod; NumPDBViolations int64}
# MetaPod                  {UID string}
# kube-scheduler sends NodeNameToMetaVictims when the extender is nodeCacheCapable, else
# NodeNameToVictims with whole Pod objects; the answer is always the Meta form.
MAX_PDB_VIOLATIONS = 1 << 31  # more than any node can hold pods: a bigger count is not a count


@dataclass
class NodeVictims:
    """One node's proposed victims: pod UIDs in the order sent, the priorities the request
    carried (full Pod objects only), and the PodDisruptionBudget violations the scheduler counted."""

    uids: list[str]
    priorities: dict[str, int]
    num_pdb_violations: int


@dataclass
class PreemptionArgs:
    """An ``ExtenderPreemptionArgs`` body. ``meta``: the victims came as ``NodeNameToMetaVictims``."""

    pod: dict[str, Any]
    victims: dict[str, NodeVictims]
    meta: bool


def pod_priority(pod: Mapping[str, Any] | None) -> int:
    """``spec.priority`` (set by admission from the pod's PriorityClass; 0 when absent, as
    kube-scheduler reads it). A value that is not an integer counts as 0."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    value = spec.get("priority") if isinstance(spec, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(-(1 << 31), min(value, (1 << 31) - 1))


def _victims_of(node: str, raw: Any, meta: bool) -> NodeVictims:
    _check_name(f"a node name in {'NodeNameToMetaVictims' if meta else 'NodeNameToVictims'}", node)
    where = f"{'NodeNameToMetaVictims' if meta else 'NodeNameToVictims'}[{node!r}]"
    if raw is None:
        return NodeVictims([], {}, 0)
    if not isinstance(raw, dict):
        raise WireError(f"{where} must be an object with 'Pods' and 'NumPDBViolations'")
    pdb = _get(raw, "NumPDBViolations")
    if pdb is None:
        pdb = 0
    if isinstance(pdb, bool) or not isinstance(pdb, int) or not 0 <= pdb < MAX_PDB_VIOLATIONS:
        raise WireError(f"{where}.NumPDBViolations must be a non-negative integer")
    pods = _get(raw, "Pods")
    if pods is None:
        pods = []
    if not isinstance(pods, list):
        raise WireError(f"{where}.Pods must be a list")
    uids: list[str] = []
    seen: set[str] = set()
    prios: dict[str, int] = {}
    for j, p in enumerate(pods):
        if not isinstance(p, dict):
            raise WireError(f"{where}.Pods[{j}] must be an object")
        if meta:
            uid = _get(p, "UID")
        else:
            m = p.get("metadata")
            uid = m.get("uid") if isinstance(m, dict) else None
        if not isinstance(uid, str) or not uid:
            raise WireError(f"{where}.Pods[{j}] has no {'UID' if meta else 'metadata.uid'}")
        _check_name(f"{where}.Pods[{j}]'s UID", uid)
        if uid in seen:
            continue  # a UID listed twice is one pod
        seen.add(uid)
        uids.append(uid)
        if not meta:
            prios[uid] = pod_priority(p)
    return NodeVictims(uids, prios, pdb)


def parse_preemption_args(body: bytes | str | Mapping[str, Any]) -> PreemptionArgs:
    """Parse an ``ExtenderPreemptionArgs`` body (preempt)."""
    doc = decode_body(body) if isinstance(body, (bytes, bytearray, memoryview, str)) else body
    pod = _get(doc, "Pod")
    if not isinstance(pod, dict):
        raise WireError("not a preempt request: 'Pod' must be a Pod object (expected {\"Pod\": ..., "
                        "\"NodeNameToMetaVictims\": {...}} or {\"Pod\": ..., \"NodeNameToVictims\": {...}})")
    meta_map = _get(doc, "NodeNameToMetaVictims")
    full_map = _get(doc, "NodeNameToVictims")
    meta = meta_map is not None
    raw = meta_map if meta else full_map
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise WireError(f"'{'NodeNameToMetaVictims' if meta else 'NodeNameToVictims'}' must be an object "
                        "mapping node names to victims")
    victims = {str(node): _victims_of(str(node), v, meta) for node, v in raw.items()}
    return PreemptionArgs(pod=pod, victims=victims, meta=meta)


def preemption_result(victims: Mapping[str, tuple[Sequence[str], int]]) -> dict[str, Any]:
    """An ``ExtenderPreemptionResult``: node -> (victim UIDs, PDB violations) in the Meta form."""
    return {"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": int(pdb)}
        for node, (uids, pdb) in victims.items()}}
