"""Where the framework integrations plug into the core.

Data flows down (design.md, section 2): the core never imports an integration or a framework.
Each integration package (``gnn_fastpath.integrations.dgl``, ``gnn_fastpath.integrations.pyg``)
registers itself here when it is imported, with :func:`register`: its shims (loaded on demand,
as they need the framework) and its graph adapter. The integration packages themselves import
no framework, so importing one is always cheap and never fails for a missing framework.

Two public entry points load an integration by name (:func:`integration`), never through an
import statement:

* :func:`gnn_fastpath.enable` asks each framework's integration for its shims;
* :meth:`gnn_fastpath.Graph.of`, through the adapter :func:`register_graph_adapters` installs
  for each framework of :data:`FRAMEWORKS` (``import gnn_fastpath`` does): it looks only at
  objects whose class comes from the framework's package, so the integration is loaded the
  first time such an object reaches ``Graph.of`` (the framework is imported by then), and
  hands them to the integration's own predicate and ``describe``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, Optional, Sequence, Tuple

from .graph import register_adapter


@dataclass(frozen=True)
class Framework:
    """A framework gnn_fastpath integrates with, known by name before its integration loads."""

    name: str      #: what ``enable(frameworks=...)`` takes, and the integration's module name
    title: str     #: how messages name it
    package: str   #: the framework's top-level package
    graphs: str    #: what its graph adapter takes (named in ``Graph.of``'s error)

    @property
    def module(self) -> str:
        """The integration package, imported by this name only."""
        return f"gnn_fastpath.integrations.{self.name}"


FRAMEWORKS: Dict[str, Framework] = {f.name: f for f in (
    Framework("dgl", "DGL", "dgl", "a DGL graph or block (gnn_fastpath.integrations.dgl)"),
    Framework("pyg", "PyG", "torch_geometric", "a PyG EdgeIndex (gnn_fastpath.integrations.pyg)"),
)}

#: ``describe(obj, num_nodes) -> (device_key, version, build)``: see
#: :func:`gnn_fastpath.graph.register_adapter`.
Describe = Callable[[object, object], Tuple[str, Hashable, Callable[[], object]]]


@dataclass(frozen=True)
class Integration:
    """What an integration registers.

    Attributes:
        framework: its key in :data:`FRAMEWORKS`.
        install: what to install when the framework cannot be imported (``enable()`` puts it
            in its error and warning).
        shims: ``shims()`` -> the shims, one per patched layer class; imports the framework and
            raises its import error unchanged (ImportError or OSError). A shim has ``key`` (its
            name in ``stats()``), ``cls`` (the class to patch) and ``patched_call()`` (the
            class-level ``__call__`` that ``enable()`` installs on ``cls``).
        not_installed: ``not_installed(exc)``: whether ``exc``, raised by ``shims()``, means the
            framework is not installed at all rather than installed but failing to import.
        is_graph: ``is_graph(obj)``: whether ``obj`` is a graph the adapter takes.
        describe_graph: the adapter's ``describe`` (:func:`gnn_fastpath.graph.register_adapter`).
        tested_versions: the framework versions whose layer semantics the shims reproduce, as
            ``"major.minor"`` prefixes (``("2.8",)`` takes 2.8.0, 2.8.1+cu121, ...); ``()``:
            none declared, nothing checked.
        version: ``version()`` -> the installed framework's ``__version__`` (called by
            ``enable()`` only after :attr:`shims` has imported the framework).
    """

    framework: str
    install: str
    shims: Callable[[], Sequence]
    not_installed: Callable[[BaseException], bool]
    is_graph: Callable[[object], bool]
    describe_graph: Describe
    tested_versions: Tuple[str, ...] = ()
    version: Optional[Callable[[], str]] = None

    def untested_version(self) -> Optional[str]:
        """The installed framework version when it is none of :attr:`tested_versions` (whose
        layers the shims may then not reproduce), else None; None too when nothing is
        declared."""
        if not self.tested_versions or self.version is None:
            return None
        installed = str(self.version())
        if any(version_matches(installed, tested) for tested in self.tested_versions):
            return None
        return installed


def version_matches(installed: str, prefix: str) -> bool:
    """Whether version ``installed`` (e.g. ``"2.8.1"``, ``"2.1.0+cu121"``) is release
    ``prefix`` or one of its point releases (``"2.8"``: 2.8, 2.8.0, 2.8.1, not 2.80)."""
    release = installed.split("+", 1)[0]
    return release == prefix or release.startswith(prefix + ".")


_registered: Dict[str, Integration] = {}


def register(entry: Integration) -> None:
    """Register an integration (its package calls this on import; again replaces it)."""
    if entry.framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {entry.framework!r}; known: {tuple(FRAMEWORKS)}")
    _registered[entry.framework] = entry


def integration(framework: str) -> Integration:
    """The integration of ``framework``, importing its package by name the first time (the
    import registers it; it imports no framework)."""
    found = _registered.get(framework)
    if found is None:
        module = FRAMEWORKS[framework].module
        importlib.import_module(module)
        found = _registered.get(framework)
        if found is None:
            raise RuntimeError(f"{module} was imported but did not register itself with gnn_fastpath.registry")
    return found


def comes_from(cls: type, package: str) -> bool:
    """Whether class ``cls`` is defined in ``package`` or one of its modules (read from its
    ``__module__``: nothing is imported)."""
    module = cls.__module__
    return module == package or module.startswith(package + ".")


def _graph_adapter(framework: Framework):
    """(predicate, describe) of ``Graph.of`` for ``framework``'s graphs."""

    def predicate(obj) -> bool:
        entry = _registered.get(framework.name)
        if entry is None:
            if not any(comes_from(cls, framework.package) for cls in type(obj).__mro__):
                return False
            entry = integration(framework.name)
        return entry.is_graph(obj)

    def describe(obj, num_nodes):
        return integration(framework.name).describe_graph(obj, num_nodes)

    return predicate, describe


_adapters = {name: _graph_adapter(f) for name, f in FRAMEWORKS.items()}


def register_graph_adapters() -> None:
    """Let :meth:`gnn_fastpath.Graph.of` take the graphs of every framework of
    :data:`FRAMEWORKS` (idempotent; ``import gnn_fastpath`` calls it; loads nothing)."""
    for name, (predicate, describe) in _adapters.items():
        register_adapter(predicate, describe, FRAMEWORKS[name].graphs)
