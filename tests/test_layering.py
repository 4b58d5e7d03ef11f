"""The layering of design.md section 2, read from the source (ast; nothing is imported).

* The core (``gnn_fastpath.ops``, ``.graph``, ``.cuda``, ``.reference``) imports no
  integration, no framework (DGL, PyG) and nothing of the layer above it (the package facade
  ``gnn_fastpath``, ``switch``, ``registry``), anywhere in a module, function bodies included.
* The integrations (``integrations/`` in the checkout, installed as
  ``gnn_fastpath.integrations``) import the core by absolute name only; their relative imports
  stay inside ``gnn_fastpath.integrations``.
* Nothing outside the integrations has an import statement for them: they register with
  ``gnn_fastpath.registry``, which loads them by name.
* No import cycle among the ``gnn_fastpath.*`` modules. Module-level imports (what runs when a
  module is imported, class bodies and ``try``/``if`` blocks included) form no cycle at all.
  With the imports inside functions added, there is still none, leaving out only a function's
  import of the top-level package ``gnn_fastpath`` itself (e.g. ``tuning`` reading
  ``__version__``): the package facade imports every layer, so such a read would close a
  "cycle" through the whole package by construction, and it runs only once that package has
  finished importing. Parent packages a module lives in are not counted as imported by it.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Set

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = None

REPO_ROOT = Path(__file__).resolve().parents[1]
ROOT = "gnn_fastpath"
INTEGRATIONS = "gnn_fastpath.integrations"
CORE = ("gnn_fastpath.ops", "gnn_fastpath.graph", "gnn_fastpath.cuda", "gnn_fastpath.reference")
FRAMEWORK_PACKAGES = ("dgl", "torch_geometric")
#: What the core must not import: the layer above it.
ABOVE_CORE = (INTEGRATIONS, "gnn_fastpath.switch", "gnn_fastpath.registry")


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _package_dirs() -> Dict[str, Path]:
    """Package name -> folder, as pyproject's ``[tool.setuptools.package-dir]`` maps them."""
    mapping = {ROOT: "gnn_fastpath", INTEGRATIONS: "integrations"}
    if tomllib is not None:
        with open(REPO_ROOT / "pyproject.toml", "rb") as fh:
            mapping = tomllib.load(fh)["tool"]["setuptools"]["package-dir"]
    return {name: REPO_ROOT / folder for name, folder in mapping.items()}


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


def _modules() -> Dict[str, Module]:
    dirs = _package_dirs()
    found: Dict[str, Module] = {}
    for package, folder in dirs.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            name = ".".join([package, *parts])
            # a folder mapped elsewhere (integrations/ under gnn_fastpath/ would be) wins
            owner = max((p for p in dirs if _within(name, p)), key=len)
            if owner == package:
                found[name] = Module(name, path, is_package)
    return found


MODULES = _modules()


@dataclass(frozen=True)
class Import:
    importer: str
    target: str      # the module imported (a submodule when ``from pkg import sub`` names one)
    relative: bool
    in_function: bool
    line: int

    def where(self) -> str:
        return f"{MODULES[self.importer].path.relative_to(REPO_ROOT)}:{self.line}"


def _imports(module: Module) -> List[Import]:
    tree = ast.parse(module.path.read_text(), str(module.path))
    found: List[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(module.name, alias.name, False, inner, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.name if module.is_package else module.name.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        base = base.rpartition(".")[0]
                    source = f"{base}.{child.module}" if child.module else base
                else:
                    source = child.module
                subs = [f"{source}.{alias.name}" for alias in child.names if f"{source}.{alias.name}" in MODULES]
                if len(subs) < len(child.names):  # names that are not submodules come from `source` itself
                    found.append(Import(module.name, source, bool(child.level), inner, child.lineno))
                found.extend(Import(module.name, sub, bool(child.level), inner, child.lineno) for sub in subs)
            visit(child, inner)

    visit(tree, False)
    return found


IMPORTS: List[Import] = [imp for module in MODULES.values() for imp in _imports(module)]


def _cycles(edges: Iterable[Import]) -> List[List[str]]:
    """The strongly connected components with more than one module (or a self-import)."""
    graph: Dict[str, Set[str]] = {name: set() for name in MODULES}
    for imp in edges:
        if imp.target in MODULES:
            graph[imp.importer].add(imp.target)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                components.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return components


def _cycle_report(components: List[List[str]], edges: List[Import]) -> str:
    lines = []
    for component in components:
        members = set(component)
        lines.append(" <-> ".join(component))
        lines += [f"    {imp.importer} -> {imp.target} ({imp.where()})" for imp in edges
                  if imp.importer in members and imp.target in members]
    return "\n".join(lines)


def test_the_scan_sees_the_package():
    assert {ROOT, *CORE, INTEGRATIONS, f"{INTEGRATIONS}.dgl", f"{INTEGRATIONS}.pyg", f"{INTEGRATIONS}.shim",
            "gnn_fastpath.switch", "gnn_fastpath.registry"} <= set(MODULES)
    assert not any(name.startswith("gnn_fastpath.gnn_fastpath") or name == "integrations" for name in MODULES)
    # relative imports resolve to modules that exist
    unresolved = [f"{imp.where()}: {imp.target}" for imp in IMPORTS
                  if imp.relative and imp.target not in MODULES]
    assert not unresolved, "\n".join(unresolved)


@pytest.mark.parametrize("layer", CORE)
def test_core_imports_no_integration_framework_or_layer_above(layer):
    bad = [f"{imp.where()}: {imp.target}" for imp in IMPORTS
           if _within(imp.importer, layer)
           and (any(_within(imp.target, p) for p in ABOVE_CORE + FRAMEWORK_PACKAGES) or imp.target == ROOT)]
    assert not bad, f"{layer} reaches up or into a framework:\n" + "\n".join(bad)


def test_integrations_import_the_core_by_absolute_name():
    bad = [f"{imp.where()}: relative import of {imp.target}" for imp in IMPORTS
           if _within(imp.importer, INTEGRATIONS) and imp.relative and not _within(imp.target, INTEGRATIONS)]
    assert not bad, "\n".join(bad)
    absolute = {imp.target for imp in IMPORTS
                if _within(imp.importer, INTEGRATIONS) and not imp.relative and _within(imp.target, ROOT)
                and not _within(imp.target, INTEGRATIONS)}
    assert {"gnn_fastpath.ops", "gnn_fastpath.graph"} <= absolute


def test_nothing_outside_the_integrations_imports_them():
    bad = [f"{imp.where()}: {imp.target}" for imp in IMPORTS
           if not _within(imp.importer, INTEGRATIONS) and _within(imp.target, INTEGRATIONS)]
    assert not bad, "the integrations register with gnn_fastpath.registry instead:\n" + "\n".join(bad)


def test_no_cycle_among_module_level_imports():
    edges = [imp for imp in IMPORTS if not imp.in_function]
    components = _cycles(edges)
    assert not components, "import cycles:\n" + _cycle_report(components, edges)


def test_no_cycle_counting_imports_inside_functions():
    edges = [imp for imp in IMPORTS if not (imp.in_function and imp.target == ROOT)]
    components = _cycles(edges)
    assert not components, "import cycles:\n" + _cycle_report(components, edges)


def test_the_cycle_check_finds_a_cycle():
    """The check itself: a function-level import back into a module's importer is a cycle
    (as cuda.block_attention's import of cuda.dot_attention was)."""
    edges = [imp for imp in IMPORTS if not (imp.in_function and imp.target == ROOT)]
    back = Import("gnn_fastpath.cuda.block_attention", "gnn_fastpath.cuda.dot_attention", True, True, 0)
    assert any(imp.importer == back.target and imp.target == back.importer for imp in edges)
    components = _cycles(edges + [back])
    assert [c for c in components if {back.importer, back.target} <= set(c)]
