"""The README's "Where things run" table stays true to the code.

Each row maps a patched layer (its ``stats()`` key) -> the shim modules that call the op ->
the public op of ``gnn_fastpath.ops`` -> the launchers of ``gnn_fastpath/cuda/`` it runs
through -> the ``.cu`` files they compile -> the custom operators of ``ops/library.py`` it
calls under ``torch.compile``. Everything is read from the source (the shim tables and the
import statements with ``ast``; the launchers' kernel families and the ops by importing the
core, which needs neither a GPU nor a framework):

* every layer class of the shim tables (``integrations/{pyg,dgl}/layers.py``) has a row and
  every row's layer is one of them; the first shim module of a row is the one holding the
  shim's fused forward, the others are helpers it imports, and one of them calls the op;
  the op named in the shim table (when it is a literal) and every op the shim module itself
  names are among the layer's rows;
* every op exists in ``gnn_fastpath.ops`` and has a row; the first launcher is the one the
  op's module imports, the others are reached from it (through ``ops/dispatch.py``,
  ``ops/library.py`` or the launchers' own imports);
* every ``.cu`` file named exists and is the source of a kernel family
  (``launch.Family``) of one of the row's launchers, every family of those launchers is
  named, and every ``.cu`` file of ``gnn_fastpath/cuda`` appears in the table;
* under ``torch.compile``: rows of a framework whose layers run stock there (read from
  ``integrations/shim.py``'s compile blocker) say "stock"; the others name the op's forward
  and backward operators exactly when ``ops/library.py`` defines them, and the op routes to
  ``library.<op>``, whose implementation imports the op's launcher.

So adding a shim without a row, renaming a shim module, an op, a launcher or a ``.cu`` file
fails here until the README says so.
"""
from __future__ import annotations

import ast
import functools
import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

import pytest

import gnn_fastpath
from gnn_fastpath import ops, registry
from gnn_fastpath.cuda import launch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INTEGRATIONS_DIR = ROOT / "integrations"
CUDA_DIR = ROOT / "gnn_fastpath" / "cuda"
LIBRARY = "gnn_fastpath.ops.library"
DISPATCH = "gnn_fastpath.ops.dispatch"
CUDA = "gnn_fastpath.cuda"
HEADER = ["layer (`stats()` key)", "shim (`integrations/`)", "op (`gnn_fastpath.ops`)",
          "launchers (`gnn_fastpath/cuda/`)", "kernels (`gnn_fastpath/cuda/`)",
          "under `torch.compile` (`torch.ops.gnn_fastpath`)"]
_TOKEN = re.compile(r"`([^`]+)`")


# ------------------------------------------------------------------------------ the table
@dataclass(frozen=True)
class Row:
    text: str
    layer: Optional[str]        # the stats() key, e.g. "pyg.SAGEConv"; None: not a layer row
    shims: Tuple[str, ...]      # paths under integrations/
    op: str
    launchers: Tuple[str, ...]  # file names in gnn_fastpath/cuda/
    kernels: Tuple[str, ...]    # .cu file names in gnn_fastpath/cuda/
    compiled: Tuple[str, ...]   # custom operator names
    compiled_text: str


def _section() -> str:
    text = README.read_text()
    match = re.search(r"^### Where things run\n(.*?)(?=^#{2,3} )", text, re.M | re.S)
    assert match, 'README has no "### Where things run" section'
    return match.group(1)


def _cells(line: str) -> List[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


@functools.lru_cache(maxsize=None)
def table() -> Tuple[Row, ...]:
    lines = [line for line in _section().splitlines() if line.startswith("|")]
    assert lines, 'the "Where things run" section has no table'
    assert _cells(lines[0]) == HEADER, f"unexpected header: {_cells(lines[0])}"
    rows = []
    for line in lines[2:]:
        cells = _cells(line)
        assert len(cells) == len(HEADER), f"row with {len(cells)} cells: {line}"
        layer, shim, op, launchers, kernels, compiled = (tuple(_TOKEN.findall(c)) for c in cells)
        assert len(op) == 1, f"a row names one op: {line}"
        is_layer = bool(layer) and re.fullmatch(r"[a-z]+\.\w+", layer[0]) is not None
        rows.append(Row(line, layer[0] if is_layer else None, shim, op[0], launchers, kernels, compiled,
                        cells[5]))
    return tuple(rows)


# ----------------------------------------------------------------------- modules and imports
def _package_dirs() -> Dict[str, Path]:
    """Package name -> folder, as pyproject's ``[tool.setuptools.package-dir]`` maps them."""
    mapping = {"gnn_fastpath": "gnn_fastpath", "gnn_fastpath.integrations": "integrations"}
    if sys.version_info >= (3, 11):
        import tomllib

        with open(ROOT / "pyproject.toml", "rb") as fh:
            mapping = tomllib.load(fh)["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / folder for name, folder in mapping.items()}


def module_path(name: str) -> Optional[Path]:
    """The file of module ``name`` in the checkout, or None when it is not one of ours."""
    for package, folder in sorted(_package_dirs().items(), key=lambda kv: -len(kv[0])):
        if name == package or name.startswith(package + "."):
            base = folder.joinpath(*name[len(package):].split(".")[1:])
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate
            return None
    return None


def module_name(path: Path) -> str:
    for package, folder in sorted(_package_dirs().items(), key=lambda kv: -len(kv[0])):
        try:
            rel = path.resolve().relative_to(folder.resolve())
        except ValueError:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join([package, *parts])
    raise AssertionError(f"{path} is in no package of pyproject")


@functools.lru_cache(maxsize=None)
def _tree(name: str) -> ast.Module:
    path = module_path(name)
    assert path is not None, f"no module {name} in the checkout"
    return ast.parse(path.read_text(), str(path))


@functools.lru_cache(maxsize=None)
def imports(name: str) -> FrozenSet[str]:
    """The modules of ours that module ``name`` imports anywhere (function bodies included).
    ``from P import a`` imports module ``P.a`` when that is a module, else ``P``."""
    is_package = module_path(name).name == "__init__.py"
    found: Set[str] = set()
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                package = ".".join(base + ([node.module] if node.module else []))
            else:
                package = node.module
            targets = []
            for alias in node.names:
                sub = f"{package}.{alias.name}"
                targets.append(sub if module_path(sub) is not None else package)
        else:
            continue
        found.update(t for t in targets if module_path(t) is not None)
    return frozenset(found)


def integration_closure(name: str) -> Set[str]:
    """The integration modules ``name`` imports, directly or through other integration modules."""
    seen, todo = set(), [name]
    while todo:
        for target in imports(todo.pop()):
            if target.startswith("gnn_fastpath.integrations.") and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


@functools.lru_cache(maxsize=None)
def referenced_names(name: str) -> FrozenSet[str]:
    """What module ``name`` takes from the core: names imported from ``gnn_fastpath.*``, the
    attributes it reads of a core module bound to a name (``ops.spmm``), and the op names it
    passes to ``require`` (the dispatch check of an op) as literals."""
    tree = _tree(name)
    bound: Set[str] = set()
    found: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gnn_fastpath"):
            for alias in node.names:
                found.add(alias.name)
                if module_path(f"{node.module}.{alias.name}") is not None:
                    bound.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            found.add(node.attr)
    return frozenset(found)


def required_ops(name: str) -> Set[str]:
    """The op names module ``name`` passes as a literal to ``require(...)``."""
    return {node.args[0].value for node in ast.walk(_tree(name))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "require"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)}


def launchers_reached(start: str) -> Set[str]:
    """The launcher modules (``gnn_fastpath.cuda.*``) module ``start`` runs through: its own
    imports of them, and theirs, and those of ``ops/dispatch.py`` and ``ops/library.py``. The
    ``gnn_fastpath.cuda`` package's own imports count only for a module that imports the
    package itself (its ``__init__`` re-exports the graph-build launcher)."""
    seen: Set[str] = set()
    todo = [start]
    visited = {start}
    while todo:
        current = todo.pop()
        for target in imports(current):
            follow = (target.startswith(CUDA + ".") or target in (DISPATCH, LIBRARY)
                      or (target == CUDA and current == start))
            if target.startswith(CUDA + "."):
                seen.add(target)
            if follow and target not in visited:
                visited.add(target)
                todo.append(target)
    return seen


# ------------------------------------------------------------------------------ shim tables
@dataclass(frozen=True)
class ShimEntry:
    framework: str
    key: str
    cls: str                    # the class name the table patches
    module: str                 # the module of its fused forward
    op: Optional[str]           # the op named in the table, None when chosen per module


@functools.lru_cache(maxsize=None)
def shim_tables() -> Tuple[ShimEntry, ...]:
    """The ``SHIMS`` lists of ``integrations/<framework>/layers.py``, read with ast (no
    framework import)."""
    entries = []
    for framework in registry.FRAMEWORKS:
        layers = f"gnn_fastpath.integrations.{framework}.layers"
        tree = _tree(layers)
        (shims,) = [node.value for node in tree.body
                    if isinstance(node, (ast.Assign, ast.AnnAssign))
                    and any(isinstance(t, ast.Name) and t.id == "SHIMS"
                            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
        assert isinstance(shims, ast.List), f"{layers}.SHIMS is not a list literal"
        for call in shims.elts:
            assert isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Shim", ast.dump(call)
            kw = {k.arg: k.value for k in call.keywords}
            forward = kw["forward"]
            assert isinstance(forward, ast.Attribute) and isinstance(forward.value, ast.Name), ast.dump(forward)
            module = f"gnn_fastpath.integrations.{framework}.{forward.value.id}"
            assert module in imports(layers), f"{layers} does not import {module}"
            op = kw["op"].value if isinstance(kw["op"], ast.Constant) else None
            entries.append(ShimEntry(framework, kw["key"].value, kw["cls"].id, module, op))
    return tuple(entries)


def shim_of(key: str) -> ShimEntry:
    (entry,) = [e for e in shim_tables() if e.key == key]
    return entry


def integration_module(path: str) -> str:
    file = INTEGRATIONS_DIR / path
    assert file.is_file(), f"integrations/{path} does not exist"
    return module_name(file)


# ------------------------------------------------------------------------------------- ops
def public_ops() -> Set[str]:
    """The op functions of ``gnn_fastpath.ops`` (its ``__all__`` less the dispatch helpers
    and switches: what an op family's module defines)."""
    return {name for name in ops.__all__
            if callable(getattr(ops, name))
            and getattr(getattr(ops, name), "__module__", "").startswith("gnn_fastpath.ops.")
            and getattr(ops, name).__module__ != DISPATCH}


def op_object(row: Row):
    if row.op in public_ops():
        return getattr(ops, row.op)
    return functools.reduce(getattr, row.op.split("."), gnn_fastpath)


def op_module(row: Row) -> str:
    return op_object(row).__module__


def families(launcher: str) -> Set[str]:
    """The ``.cu`` sources of the kernel families a launcher module holds."""
    module = importlib.import_module(launcher)
    return {v.source for v in vars(module).values() if isinstance(v, launch.Family)}


def library_operators() -> Set[str]:
    """The operators ``ops/library.py`` defines (its ``OPERATORS`` table, filled by ``_define``)."""
    return set(importlib.import_module(LIBRARY).OPERATORS)


def library_routes(name: str) -> Set[str]:
    """The operators of ``ops/library.py`` module ``name`` calls: ``library.<operator>(...)``
    (a wrapper named after it) or ``library.<helper>("<operator>")`` (the operator looked up by
    name)."""
    found = set()
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "library":
            found.add(node.attr)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "library"):
            found.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return found


def implementation_imports(operator: str) -> Set[str]:
    """The family module whose registered implementation ``operator`` runs (``OPERATORS`` in
    ``ops/library.py``: the family ``_define`` names for it), if ``ops/<family>.py`` does
    register one with ``library.implement("<family>", ...)``."""
    family = importlib.import_module(LIBRARY).OPERATORS[operator]
    module = f"gnn_fastpath.ops.{family}"
    return {module} if module_path(module) is not None and family in registered_implementations(module) else set()


def registered_implementations(module: str) -> Set[str]:
    """The families ``module`` registers with ``library.implement("<family>", ...)``."""
    return {node.args[0].value for node in ast.walk(_tree(module))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "implement"
            and getattr(node.func.value, "id", None) == "library" and node.args
            and isinstance(node.args[0], ast.Constant)}


def eager_under_compile() -> Set[str]:
    """The frameworks whose layers run their eager route at a graph break under torch.compile:
    the prefixes ``_traced`` of ``integrations/shim.py`` (the compiled route) sends there
    (``shim.key.startswith``)."""
    tree = _tree("gnn_fastpath.integrations.shim")
    (route,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_traced"]
    found = set()
    for node in ast.walk(route):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith"
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "key"):
            found.add(node.args[0].value.rstrip("."))
    return found


def layer_rows() -> List[Row]:
    return [r for r in table() if r.layer is not None]


def _ids(rows):
    return [f"{r.layer or 'graph'}-{r.op}" for r in rows]


# ------------------------------------------------------------------------------------ tests
def test_the_table_parses():
    """A guard on the parsing: rows of both frameworks, the attention, SpMM and min/max
    families, and the graph build."""
    rows = table()
    assert {r.layer.split(".")[0] for r in layer_rows()} == set(registry.FRAMEWORKS)
    assert {"gatv2_attention", "gat_attention", "dot_attention", "spmm", "segment_reduce"} <= {r.op for r in rows}
    assert len(rows) == len(set(r.text for r in rows)), "a row is listed twice"
    assert len(shim_tables()) >= 10


def test_every_patched_layer_has_a_row_and_every_row_is_patched():
    keys = {e.key for e in shim_tables()}
    listed = {r.layer for r in layer_rows()}
    assert not keys - listed, f"patched layers missing from the README's map: {sorted(keys - listed)}"
    assert not listed - keys, f"the README's map lists layers no shim table patches: {sorted(listed - keys)}"
    for entry in shim_tables():
        assert entry.key == f"{entry.framework}.{entry.cls}", entry


@pytest.mark.parametrize("framework", tuple(registry.FRAMEWORKS))
def test_the_ast_reading_matches_the_imported_shim_tables(framework):
    """The ast reading of ``SHIMS`` agrees with the tables themselves, where the framework
    imports here."""
    if framework == "dgl":
        from frameworks import import_dgl

        if import_dgl() is None:
            pytest.skip("DGL is not importable here")
    try:
        shims = registry.integration(framework).shims()
    except (ImportError, OSError) as exc:
        pytest.skip(f"{framework} does not import here: {exc}")
    imported = {(s.key, s.cls.__name__, s.forward.__module__, s.op if isinstance(s.op, str) else None)
                for s in shims}
    read = {(e.key, e.cls, e.module, e.op) for e in shim_tables() if e.framework == framework}
    assert imported == read


def test_every_op_has_a_row():
    missing = public_ops() - {r.op for r in table()}
    assert not missing, f"ops missing from the README's map: {sorted(missing)}"


def test_every_kernel_file_is_in_the_table():
    named = {k for r in table() for k in r.kernels}
    files = {p.name for p in CUDA_DIR.glob("*.cu")}
    assert not files - named, f".cu files missing from the README's map: {sorted(files - named)}"


@pytest.mark.parametrize("row", layer_rows(), ids=_ids(layer_rows()))
def test_shim_modules_call_the_op(row):
    entry = shim_of(row.layer)
    assert row.op in public_ops(), f"{row.op} is not an op of gnn_fastpath.ops"
    modules = [integration_module(p) for p in row.shims]
    assert modules and modules[0] == entry.module, \
        f"the first shim module of {row.layer} must be {entry.module} (its fused forward), not {modules[:1]}"
    helpers = integration_closure(entry.module)
    for helper in modules[1:]:
        assert helper in helpers, f"{entry.module} does not import {helper}"
    assert any(row.op in referenced_names(m) for m in modules), \
        f"none of {row.shims} calls {row.op}"


@pytest.mark.parametrize("entry", shim_tables(), ids=lambda e: e.key)
def test_the_ops_a_shim_names_have_rows(entry):
    """The op of the shim table (a literal) and every op the shim module itself names (calls,
    ``require``) are among the layer's rows."""
    listed = {r.op for r in layer_rows() if r.layer == entry.key}
    named = set(referenced_names(entry.module) | required_ops(entry.module)) & public_ops()
    if entry.op is not None:
        named.add(entry.op)
    assert named <= listed, f"{entry.key}: ops {sorted(named - listed)} have no row"


@pytest.mark.parametrize("row", table(), ids=_ids(table()))
def test_launchers_are_those_the_op_runs_through(row):
    start = op_module(row)
    assert row.launchers, row.text
    names = []
    for file in row.launchers:
        assert (CUDA_DIR / file).is_file(), f"gnn_fastpath/cuda/{file} does not exist"
        names.append(module_name(CUDA_DIR / file))
    reached = launchers_reached(start)
    missing = [n for n in names if n not in reached]
    assert not missing, f"{start} ({row.op}) does not run through {missing}"
    direct = {t for t in imports(start) if t.startswith(CUDA + ".")}
    if direct:
        assert direct == {names[0]}, f"{start} imports the launchers {sorted(direct)}; the row's first is {names[0]}"


@pytest.mark.parametrize("row", table(), ids=_ids(table()))
def test_kernels_are_the_launchers_sources(row):
    loaded = set()
    for file in row.launchers:
        loaded |= families(module_name(CUDA_DIR / file))
    for kernel in row.kernels:
        assert kernel.endswith(".cu") and (CUDA_DIR / kernel).is_file(), f"gnn_fastpath/cuda/{kernel} does not exist"
    assert set(row.kernels) <= loaded, f"no launcher of the row compiles {sorted(set(row.kernels) - loaded)}"
    assert loaded <= set(row.kernels), f"the row's launchers also compile {sorted(loaded - set(row.kernels))}"


@pytest.mark.parametrize("row", layer_rows(), ids=_ids(layer_rows()))
def test_the_compiled_route(row):
    framework = row.layer.split(".")[0]
    if framework in eager_under_compile():
        assert not row.compiled and row.compiled_text == "eager, at a graph break", \
            f"{row.layer} runs its eager route at a graph break under torch.compile; the row says {row.compiled_text!r}"
        return
    defined = library_operators()
    expected = (row.op, f"{row.op}_backward") if row.op in defined else ()
    assert row.compiled == expected, \
        f"{row.layer}: under torch.compile it calls {expected}, the row says {row.compiled}"
    for name in row.compiled:
        assert name in defined, f"ops/library.py defines no operator {name}"
    if expected:
        start = op_module(row)
        assert row.op in library_routes(start), f"{start} never reaches the operator {row.op} of ops/library.py"
        own = module_name(CUDA_DIR / row.launchers[0])
        for name in expected:
            runs = implementation_imports(name)
            assert own in runs or (start in runs and own in imports(start)), \
                f"the implementation of operator {name} imports neither {own} nor {start}"
