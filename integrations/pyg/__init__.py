"""PyTorch Geometric shims (installed as ``gnn_fastpath.integrations.pyg``).

:func:`shims` never swallows the error of ``import torch_geometric``: it raises it unchanged,
and :func:`not_installed` tells the two cases apart for :func:`gnn_fastpath.enable`, which
skips a framework that is not installed silently and reports one that is installed but broken.

Importing it registers it with the core (:mod:`gnn_fastpath.registry`): :func:`shims` for
``enable()``, and :func:`is_graph` / :func:`describe_graph` for ``Graph.of``.

The shims reproduce the layers of the PyG versions in :data:`TESTED_VERSIONS` (their
arguments, defaults, fallbacks and numerics); ``enable()`` warns once when another is installed.
"""
import functools

from gnn_fastpath import registry

#: The top-level package this integration patches.
PACKAGE = registry.FRAMEWORKS["pyg"].package

#: The PyG releases whose layer semantics the shims reproduce ("major.minor" prefixes: every
#: point release of each); the shims were written against and are tested on these.
#: ``enable()`` warns once per process when the installed PyG is none of them.
TESTED_VERSIONS = ("2.8",)

#: What to install when ``import torch_geometric`` fails (``enable()`` puts it in its error
#: and warning).
INSTALL = ("install PyTorch Geometric for your torch version: `pip install torch_geometric` "
           "(or `pip install -e \".[pyg]\"` in a checkout of gnn_fastpath); see "
           "https://pytorch-geometric.readthedocs.io/en/latest/install/installation.html")


def not_installed(exc: BaseException) -> bool:
    """Whether ``exc``, raised by :func:`shims`, means PyG is not installed at all (a
    ModuleNotFoundError for ``torch_geometric`` itself) rather than installed but failing to
    import."""
    return isinstance(exc, ModuleNotFoundError) and exc.name == PACKAGE


def shims():
    """The PyG shims (one per patched layer class).

    Raises what ``import torch_geometric`` raises, unchanged: a ModuleNotFoundError for
    ``torch_geometric`` itself when PyG is not installed (:func:`not_installed`), or the
    ImportError/OSError of an installed PyG that cannot be imported here.
    """
    import torch_geometric  # noqa: F401

    from .layers import SHIMS

    return list(SHIMS)


def version() -> str:
    """The installed PyG's version (imports ``torch_geometric``: call after :func:`shims`)."""
    import torch_geometric

    return str(getattr(torch_geometric, "__version__", "unknown"))


def is_graph(obj) -> bool:
    """Whether ``obj`` is a PyG ``EdgeIndex`` (through the MRO, so that subclasses are taken
    too; by the classes' modules: imports nothing)."""
    return _is_graph_class(type(obj))


# Asked of every graph input on every layer call (Graph.of); the answer is the class's.
@functools.lru_cache(maxsize=256)
def _is_graph_class(cls: type) -> bool:
    return any(k.__name__ == "EdgeIndex" and registry.comes_from(k, PACKAGE) for k in cls.__mro__)


def describe_graph(obj, num_nodes):
    """``Graph.of``'s adapter for an ``EdgeIndex`` (:func:`gnn_fastpath.integrations.pyg.graph.describe`)."""
    from .graph import describe

    return describe(obj, num_nodes)


registry.register(registry.Integration(framework="pyg", install=INSTALL, shims=shims, not_installed=not_installed,
                                       is_graph=is_graph, describe_graph=describe_graph,
                                       tested_versions=TESTED_VERSIONS, version=version))


def __getattr__(name):
    # PadToCapacity subclasses PyG's BaseTransform: imported on first use, so that importing
    # this package (done by gnn_fastpath itself) never imports torch_geometric.
    if name == "PadToCapacity":
        from .padding import PadToCapacity

        return PadToCapacity
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
