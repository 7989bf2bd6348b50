"""The packages' layering, read from the source with ``ast`` (imports inside functions too).

Each ooc module belongs to a layer; a module imports only from its own layer or below, and
no two modules import each other, directly or round a loop. ``TYPE_CHECKING`` blocks are
left out (they never run). CONTRIBUTING.md draws the same layers.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "ooc"

#: bottom to top: a module's layer is the longest prefix listed
LAYERS: dict[str, int] = {
    "ooc.core": 0,        # errors, sizes and ranges, notes, worker threads, jit, random kernels
    "ooc.storage": 1,     # dataset format, ingest, I/O backends, feature and neighbour readers
    "ooc.cli": 2,         # what every command line shares (over storage's atomic writes)
    "ooc.caches": 3,      # feature, neighbour and chunk caches, their policies, changesets
    "ooc.partition": 3,   # SPRING and baseline partitioners, per-partition datasets
    "ooc.sampling": 4,    # sampler, epoch plan, inspector, runtime files
    "ooc.executor": 5,    # settings, loader, training, inference, distributed, sizing
    "ooc": 6,             # the package's front door and the commands (train, infer, pyg, ...)
}
#: the most ooc imports made inside functions (outside a package's lazy ``__getattr__``):
#: only where they defer torch, PyG or a kernel's compilation
MAX_FUNCTION_IMPORTS = 40


def _modname(p: Path) -> str:
    parts = list(p.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_modname(p): p for p in PKG.rglob("*.py")}


def layer(module: str) -> int:
    name = module
    while name and name not in LAYERS:
        name = name.rpartition(".")[0]
    return LAYERS[name]


def _known(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _base(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = module.split(".") if is_pkg else module.split(".")[:-1]
    parts = parts[:len(parts) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def _skipped(tree: ast.AST, is_pkg: bool) -> tuple[set[int], set[int]]:
    """ids of nodes under ``if TYPE_CHECKING`` and of nodes inside functions."""
    typing_only, in_function = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
            typing_only.update(id(s) for s in ast.walk(n))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not (
                is_pkg and n.name == "__getattr__"):
            in_function.update(id(s) for s in ast.walk(n))
    return typing_only, in_function


def imports() -> list[tuple[str, str, str, bool]]:
    """(importer, imported module, imported name or "", inside a function) for every ooc
    import."""
    out = []
    for module, path in MODULES.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        typing_only, in_function = _skipped(tree, is_pkg)
        for n in ast.walk(tree):
            if id(n) in typing_only:
                continue
            if isinstance(n, ast.Import):
                targets = [(a.name, "") for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                base = _base(module, is_pkg, n)
                # a module imported from its package names no attribute: name ""
                targets = [(f"{base}.{a.name}", "") if _known(f"{base}.{a.name}") == f"{base}.{a.name}"
                           else (base, a.name) for a in n.names]
            else:
                continue
            for target, name in targets:
                found = _known(target) if target.startswith("ooc") else None
                if found and found != module:
                    out.append((module, found, name, id(n) in in_function))
    return out


IMPORTS = imports()


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    u = stack.pop()
                    on.discard(u)
                    comp.append(u)
                    if u == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycles():
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for importer, imported, _, _ in IMPORTS:
        edges[importer].add(imported)
    assert _cycles(edges) == []


def test_no_import_climbs_a_layer():
    climbs = sorted(f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
                    for a, b, _, _ in IMPORTS
                    if layer(b) > layer(a) and not a.startswith(b + "."))
    assert climbs == []


def test_few_imports_inside_functions():
    inside = [f"{a} -> {b}" for a, b, _, f in IMPORTS if f]
    assert len(inside) <= MAX_FUNCTION_IMPORTS, "\n".join(sorted(inside))


def test_no_private_name_imported_from_another_module():
    private = sorted(f"{a} <- {b}.{name}" for a, b, name, _ in IMPORTS
                     if name.startswith("_") and not name.startswith("__"))
    assert private == []


def test_the_checks_catch_what_they_look_for():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert layer("ooc.storage.ingest.ogb") == 1 and layer("ooc.train") == 6
    assert layer("ooc.core.errors") < layer("ooc.caches.policies") < layer("ooc.executor.settings")
    with pytest.raises(KeyError):
        layer("numpy")
