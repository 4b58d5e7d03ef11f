"""DGL graphs and blocks as gnn_fastpath Graphs, through public DGL API only.

Nothing here writes into a DGL graph (no ``ndata``/``edata``/``srcdata`` keys, no
``local_scope``): the shims read the structure once through :meth:`Graph.of` (cached per
graph object, rebuilt when its edges change) and keep every derived fact on that Graph via
:meth:`Graph.memo`.

The DGL graph may stay on the CPU while the features live on a GPU (DGL's PyPI build is
CPU-only): the ops copy the Graph to the features' device once (:meth:`Graph.to` caches the
copy). A graph on a GPU with features elsewhere is left to stock DGL, which reports it.
"""
from __future__ import annotations

from typing import Tuple

from torch import Tensor, nn

from ...graph import Graph
from ..shim import Unsupported

#: Stock DGL's message for zero in-degree destinations (GATv2Conv, GraphConv, ... in 2.1.0).
ZERO_IN_DEGREE_MESSAGE = (
    "There are 0-in-degree nodes in the graph, "
    "output for those nodes will be invalid. "
    "This is harmful for some applications, "
    "causing silent performance regression. "
    "Adding self-loop on the input graph by "
    "calling `g = dgl.add_self_loop(g)` will resolve "
    "the issue. Setting ``allow_zero_in_degree`` "
    "to be `True` when constructing this module will "
    "suppress the check and let the code run."
)

_ZERO_IN_DEGREE_KEY = ("dgl", "has_zero_in_degree")


def dgl_error(message: str) -> Exception:
    """A ``dgl.DGLError`` (the exception type stock layers raise)."""
    from dgl import DGLError

    return DGLError(message)


def check_graph(g) -> Tuple[int, int, bool]:
    """(n_src, n_dst, is_block) of a single-edge-type DGL graph; Unsupported otherwise."""
    import dgl

    if not isinstance(g, dgl.DGLGraph):
        raise Unsupported("graph", f"graph is a {type(g).__name__}, not a DGLGraph")
    etypes = g.canonical_etypes
    if len(etypes) != 1:
        raise Unsupported("heterograph", f"{len(etypes)} edge types (the fused path takes one)")
    return int(g.num_src_nodes()), int(g.num_dst_nodes()), bool(g.is_block)


def check_device(g, x: Tensor) -> None:
    """Graph on the CPU (any feature device) or on the features' device; else Unsupported."""
    if g.device.type != "cpu" and g.device != x.device:
        raise Unsupported("device", f"graph on {g.device} but features on {x.device}")


def graph_of(g) -> Graph:
    """The cached gnn_fastpath Graph of a DGL graph or block (on the DGL graph's device)."""
    return Graph.of(g)


def has_zero_in_degree(graph: Graph) -> bool:
    """Whether some destination has no in-edge; computed once per Graph (one host sync)."""
    return graph.memo(_ZERO_IN_DEGREE_KEY, lambda: bool((graph.in_degree() == 0).any()))


def check_zero_in_degree(module: nn.Module, graph: Graph) -> None:
    """Raise stock DGL's DGLError when the module forbids zero in-degree and the graph has one."""
    if not module._allow_zero_in_degree and has_zero_in_degree(graph):
        raise dgl_error(ZERO_IN_DEGREE_MESSAGE)


def features_of(graph, feat, *args, **kwargs):
    """The tensor that decides device and dtype: ``feat``, or ``feat[0]`` for a pair."""
    if isinstance(feat, tuple) and feat:
        return feat[0]
    return feat
