"""The floors of the code base, checked from every module's imports (parsed, not executed).

Floor 1, ``stowage``: the shared contract (resources, inventory, allocation, text tables).
Floor 2, ``packing``: pure packing (cluster model, pod policy, fit and reasons, placers, decide()).
Floor 3, ``gpunode``: what the two node agents share (NVML, card health, device IDs, PodResources).
Floor 4, the hosts: ``extender``, ``deviceplugin``, ``exporter``; above them the operator commands
(``stowage_ops``) and the benchmarks. A module may import its own package and the floors below
it, never a floor above, and no two modules may import each other, directly or round a circle.
Imports inside functions count too: a lazy import is still a dependency a reader must follow.

``stowage.cli`` is the top entry: it names its subcommands as strings and loads them lazily
(``importlib``), so it imports nothing of ours and stays on floor 1.

docs/architecture.md draws the floors.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Package -> floor. Packages on the same floor may not import each other (except as allowed
# below); a package may import any package on a lower floor.
FLOORS: dict[str, int] = {
    "stowage": 1,
    "packing": 2,
    "gpunode": 3,
    "extender": 4,
    "deviceplugin": 4,
    "exporter": 4,
    "stowage_ops": 5,
    "benchmarks": 6,
}

# Known violations, to be removed (never added to): (importing module, imported module). None left.
ALLOWED_EDGES: set[tuple[str, str]] = set()
# Known import circles, to be removed (never added to). None left.
ALLOWED_CYCLES: list[list[str]] = []


def _allowed(module: str, target: str) -> bool:
    """An allowed edge, or an edge to a package above an allowed target (its __init__ runs)."""
    return any(m == module and (t == target or t.startswith(target + ".")) for m, t in ALLOWED_EDGES)


def _modules() -> dict[str, Path]:
    """Every module of our packages: dotted name -> file (generated gRPC stubs left out)."""
    out: dict[str, Path] = {}
    for pkg in FLOORS:
        base = ROOT / pkg
        if not base.is_dir():
            continue
        for path in base.rglob("*.py"):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The longest prefix of ``name`` that is one of our modules (``a.b.c`` may be a name in a.b)."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in MODULES:
            return cand
        parts.pop()
    return None


def imports_of(module: str) -> set[str]:
    """Our modules that ``module`` imports anywhere in its body (and their parent packages,
    whose ``__init__`` runs first)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                names.add(f"{prefix}.{alias.name}")  # a submodule, or a name in ``prefix``
    out: set[str] = set()
    for name in names:
        target = _resolve(name)
        while target is not None and target != module:
            out.add(target)
            parent = target.rpartition(".")[0]
            target = parent if parent in MODULES else None
    out.discard(module)
    return out


GRAPH = {m: imports_of(m) for m in MODULES}


def _floor(module: str) -> tuple[str, int]:
    pkg = module.split(".")[0]
    return pkg, FLOORS[pkg]


def test_every_package_has_a_floor():
    for name in sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()):
        if name != "tests":
            assert name in FLOORS, f"package {name} has no floor in tests/test_architecture.py"


def test_no_import_from_a_lower_floor_to_a_higher_one():
    bad = []
    for module, targets in GRAPH.items():
        pkg, floor = _floor(module)
        for target in targets:
            tpkg, tfloor = _floor(target)
            if tpkg == pkg or _allowed(module, target):
                continue
            if tfloor >= floor:
                bad.append(f"{module} (floor {floor}) imports {target} (floor {tfloor})")
    assert not bad, "\n".join(sorted(bad))


def test_allowed_violations_still_exist():
    """The allow-list only shrinks: an entry that no longer happens must be removed from it."""
    gone = [edge for edge in ALLOWED_EDGES if edge[0] not in GRAPH or edge[1] not in GRAPH[edge[0]]]
    assert not gone, f"remove from ALLOWED_EDGES (fixed): {sorted(gone)}"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_cycle_between_modules():
    graph = {m: {t for t in ts if not _allowed(m, t)} for m, ts in GRAPH.items()}
    assert [c for c in _cycles(graph) if c not in ALLOWED_CYCLES] == []


def test_the_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_packing_is_pure():
    """No I/O, HTTP, Kubernetes or caches of the hosts in the packing core."""
    forbidden = ("flask", "gunicorn", "kubernetes", "requests", "grpc", "prometheus_client", "socket",
                 "http", "subprocess", "pynvml")
    bad = []
    for module, path in MODULES.items():
        if not module.startswith("packing"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{module} imports {m}" for m in mods if m.split(".")[0] in forbidden]
    assert not bad, bad
