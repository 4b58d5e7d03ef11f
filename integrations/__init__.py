"""Framework shims, installed as ``gnn_fastpath.integrations`` (never top-level).

:func:`register_graph_adapters` lets :meth:`gnn_fastpath.Graph.of` take DGL graphs and PyG
``EdgeIndex`` objects without importing DGL or PyG: each adapter recognises its objects by
the module their class comes from, and imports its integration's graph module (which holds
the real adapter) the first time it sees one. An object of those frameworks exists only once
the framework is imported, so that import costs nothing extra.
"""
from __future__ import annotations

from ..graph import register_adapter


def _from_package(cls: type, package: str) -> bool:
    module = cls.__module__
    return module == package or module.startswith(package + ".")


def _is_dgl_graph(obj) -> bool:
    return _from_package(type(obj), "dgl") and hasattr(obj, "canonical_etypes")


def _is_pyg_edge_index(obj) -> bool:
    # Through the MRO, so that subclasses of EdgeIndex are taken too.
    return any(cls.__name__ == "EdgeIndex" and _from_package(cls, "torch_geometric") for cls in type(obj).__mro__)


def _describe_dgl(obj, num_nodes):
    from .dgl.graph import describe

    return describe(obj, num_nodes)


def _describe_pyg(obj, num_nodes):
    from .pyg.graph import describe

    return describe(obj, num_nodes)


def register_graph_adapters() -> None:
    """Register the DGL and PyG adapters of :meth:`Graph.of` (idempotent; ``gnn_fastpath``
    calls it on import)."""
    register_adapter(_is_dgl_graph, _describe_dgl, "a DGL graph or block (gnn_fastpath.integrations.dgl)")
    register_adapter(_is_pyg_edge_index, _describe_pyg, "a PyG EdgeIndex (gnn_fastpath.integrations.pyg)")
