"""DGL shims (installed as ``gnn_fastpath.integrations.dgl``).

:func:`shims` never swallows the error of ``import dgl``: it raises it unchanged, and
:func:`not_installed` tells the two cases apart for :func:`gnn_fastpath.enable`, which skips
a framework that is not installed silently and reports one that is installed but broken.
Nothing here works around a broken DGL (the test harness's ``tests/frameworks.py`` does, for
the PyPI wheel's GraphBolt import; the package never patches DGL's import machinery).

Importing it registers it with the core (:mod:`gnn_fastpath.registry`): :func:`shims` for
``enable()``, and :func:`is_graph` / :func:`describe_graph` for ``Graph.of``.

The shims reproduce the layers of the DGL versions in :data:`TESTED_VERSIONS` (their
arguments, defaults, fallbacks and numerics); ``enable()`` warns once when another is installed.
"""
from gnn_fastpath import registry

#: The top-level package this integration patches.
PACKAGE = registry.FRAMEWORKS["dgl"].package

#: The DGL releases whose layer semantics the shims reproduce ("major.minor" prefixes: every
#: point release of each); the shims were written against and are tested on these.
#: ``enable()`` warns once per process when the installed DGL is none of them.
TESTED_VERSIONS = ("2.1",)

#: What to install when ``import dgl`` fails (``enable()`` puts it in its error and warning).
INSTALL = ("install DGL's own build for your torch and CUDA versions from "
           "https://www.dgl.ai/pages/start.html (the PyPI `dgl` wheel, 2.1.0, is CPU-only and fails "
           "to import on recent torch, e.g. with \"No module named 'torchdata.datapipes'\"); "
           "see the README section \"Installing DGL\"")


def not_installed(exc: BaseException) -> bool:
    """Whether ``exc``, raised by :func:`shims`, means DGL is not installed at all (a
    ModuleNotFoundError for ``dgl`` itself) rather than installed but failing to import."""
    return isinstance(exc, ModuleNotFoundError) and exc.name == PACKAGE


def shims():
    """The DGL shims (one per patched layer class).

    Raises what ``import dgl`` raises, unchanged: a ModuleNotFoundError for ``dgl`` itself
    when DGL is not installed (:func:`not_installed`), or, when it is installed but cannot be
    imported here, the ImportError of one of DGL's own imports (e.g. GraphBolt's
    ``torchdata.datapipes`` on recent torch) or the OSError of loading its libraries.
    """
    import dgl  # noqa: F401

    from .layers import SHIMS

    return list(SHIMS)


def version() -> str:
    """The installed DGL's version (imports ``dgl``: call after :func:`shims`)."""
    import dgl

    return str(getattr(dgl, "__version__", "unknown"))


def is_graph(obj) -> bool:
    """Whether ``obj`` is a DGL graph or block (by its class's module: imports nothing)."""
    return registry.comes_from(type(obj), PACKAGE) and hasattr(obj, "canonical_etypes")


def describe_graph(obj, num_nodes):
    """``Graph.of``'s adapter for DGL graphs (:func:`gnn_fastpath.integrations.dgl.graph.describe`)."""
    from .graph import describe

    return describe(obj, num_nodes)


registry.register(registry.Integration(framework="dgl", install=INSTALL, shims=shims, not_installed=not_installed,
                                       is_graph=is_graph, describe_graph=describe_graph,
                                       tested_versions=TESTED_VERSIONS, version=version))
