"""PyG ``GCNConv`` on :func:`gnn_fastpath.spmm`.

Reproduces ``torch_geometric.nn.conv.GCNConv.forward`` (PyG 2.8): the symmetric
normalisation of ``gcn_norm``, then ``lin`` (called as a submodule), one
``spmm(graph, lin(x), edge_weight=normalised, norm="none")`` and the bias.

The normalisation is gnn_fastpath's own code, computed from the Graph by
:func:`gnn_fastpath.ops.gcn_norm_values` (two CUDA kernels on the GPU):

- ``edge_index`` Tensor / ``EdgeIndex``: with ``add_self_loops``, PyG's
  ``add_remaining_self_loops`` (every existing loop removed, one loop per node appended;
  with ``edge_weight`` a node's loop keeps the weight of its existing loop, else gets
  ``fill_value`` = 2 if ``improved`` else 1). Then ``deg_i = sum of weights into i``,
  ``w_ij * deg_j^-1/2 * deg_i^-1/2`` (0 where a degree is 0). Without ``edge_weight`` the
  weights are structural: the looped graph and the normalised weights are memoised on the
  input's Graph (once per graph and dtype). Like stock PyG 2.8, ``improved`` has no effect
  then: stock adds the loops without weights and fills every weight with 1 afterwards.
  With ``edge_weight`` the weights are recomputed per call (they may carry gradients).
- torch.sparse adjacency: its values are the weights; with ``add_self_loops`` loops of
  weight ``fill_value`` are appended (stock coalesces them into existing loops, which sums
  the same weights), then the same normalisation. ``edge_weight`` is ignored, as stock
  ignores it for sparse inputs.

``cached=True`` keeps stock's semantics: whatever sits in ``module._cached_edge_index``
is used as the normalised ``(edge_index, edge_weight)`` (stock reads it whenever it is set,
even with ``cached=False``), and a first call with ``cached=True`` stores exactly what stock
stores (the looped ``edge_index`` PyG builds, the normalised weights), so switching
``enable()``/``disable()`` mid-training stays consistent. The first ``cached=True`` call on
a torch.sparse adjacency runs stock (reason ``cached_sparse``) so stock builds the sparse
tensor it caches; later calls read that cache on the fused path.

Reduced precision (see :mod:`..shim`): ``spmm`` gets ``lin(x)`` as it comes (16-bit under
autocast) and the normalised weights in the input's dtype (float32 under autocast); its
default result dtype is torch's promotion of stock's ``w * x_j``: float32 under autocast
with ``normalize`` or an ``edge_weight``, the features' 16-bit dtype for an unweighted
``normalize=False`` (then the float32 ``bias`` makes the output float32, as stock's). A
torch.sparse adjacency whose values' dtype differs from ``lin(x)``'s runs stock, as does a
16-bit one on the CPU (stock raises there).

Falls back (Unsupported) for: bipartite (tuple) x (stock raises), x not 2-D, ``aggr`` other
than sum, ``flow="target_to_source"``, ``edge_weight`` not a float [M] tensor, a
torch.sparse adjacency whose values require grad, and the graph inputs listed in
:mod:`.graph` (a non-square adjacency among them: its shape must match the features).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from gnn_fastpath import ops
from gnn_fastpath.ops.dispatch import is_compiling, require
from gnn_fastpath.graph import Graph
from ..shim import Unsupported, linear_dtype
from .graph import (append_self_loops, check_inputs, check_like, check_message_passing, check_sparse_product,
                    edge_weight_of, graph_of, is_sparse, replace_self_loops, sparse_values,
                    TracedLooped)


def features(x, *args, **kwargs) -> Tensor:
    """The tensor deciding device and dtype: ``x`` (a pair runs stock, which raises)."""
    if isinstance(x, (tuple, list)):
        raise Unsupported("bipartite", "GCNConv takes no (x_src, x_dst) pair (stock raises)")
    return x


def gcn_weights(graph: Graph, weight: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """PyG's ``gcn_norm`` weights of ``graph`` (loops included); memoised when structural.

    Without weights every edge weighs 1 (PyG 2.8's edge_index path ignores ``improved``
    then), so the structural result depends on the graph alone.
    """
    if weight is None:
        return graph.memo(("pyg", "gcn_norm", dtype), lambda: ops.gcn_norm_values(graph, dtype=dtype))
    return ops.gcn_norm_values(graph, weight)


def _sparse_values(module, adj: Tensor, x: Tensor) -> Tensor:
    """The adjacency's values, which stock's ``torch.sparse.mm`` multiplies by ``lin(x)``."""
    values = check_like("adjacency values", sparse_values(adj), x)
    if values.requires_grad:
        raise Unsupported("sparse_grad", "the adjacency's values require grad")
    check_sparse_product(values, linear_dtype(x, module.lin.weight), "sum")
    return values


def _as_given(module, edge_index, edge_weight, n: int, x: Tensor) -> Tuple[Graph, Optional[Tensor]]:
    """Graph and weights for propagating over ``edge_index`` as it is (normalised already)."""
    graph = graph_of(edge_index, n, n, x)
    if is_sparse(edge_index):  # stock's message_and_aggregate reads the adjacency's values only
        return graph, _sparse_values(module, edge_index, x)
    return graph, edge_weight_of("edge_weight", edge_weight, graph, x)


def _normalised_sparse(module, adj: Tensor, n: int, x: Tensor) -> Tuple[Graph, Tensor]:
    graph = graph_of(adj, n, n, x)
    values = _sparse_values(module, adj, x)
    if module.add_self_loops:
        graph = append_self_loops(graph, n).graph
        values = torch.cat([values, values.new_full((n,), 2.0 if module.improved else 1.0)])
    return graph, gcn_weights(graph, values, x.dtype)


def _normalised(module, edge_index: Tensor, edge_weight, n: int, x: Tensor) -> Tuple[Graph, Tensor, bool]:
    """(graph, normalised weights, whether the weights are a memoised structural tensor)."""
    # a cache stock reads later holds PyG's looped edge order, which only the exact graph has
    graph = graph_of(edge_index, n, n, x, static=not module.cached)
    edge_weight = edge_weight_of("edge_weight", edge_weight, graph, x)
    if module.add_self_loops:
        looped = replace_self_loops(graph, n)
        graph = looped.graph
        if edge_weight is not None:
            fill = 2.0 if module.improved else 1.0
            if isinstance(looped, TracedLooped):
                loop_weight = looped.loop_weight(edge_weight, fill)
                return graph, gcn_weights(graph, torch.cat([edge_weight, loop_weight]), x.dtype), False
            loop_weight = edge_weight.new_full((n,), fill)
            # Stock's very write: for a node with several loops, the CPU keeps the last one's
            # weight and CUDA any one's (undefined for duplicate indices), and the backward
            # sends the node's gradient to every one of them. Same op, same behaviour.
            if looped.loop_pos.numel():
                loop_weight[looped.loop_node] = edge_weight[looped.loop_pos]
            edge_weight = torch.cat([looped.kept(edge_weight), loop_weight])
    return graph, gcn_weights(graph, edge_weight, x.dtype), edge_weight is None


def _stock_edge_index(module, edge_index: Tensor, n: int) -> Tensor:
    """The normalised ``edge_index`` stock caches: PyG's own ``add_remaining_self_loops``."""
    if not module.add_self_loops:
        return edge_index
    from torch_geometric.utils import add_remaining_self_loops

    return add_remaining_self_loops(edge_index, None, 2.0 if module.improved else 1.0, n)[0]


def forward(module, backend: str, x, edge_index, edge_weight=None):
    """Fused ``GCNConv.forward``: same arguments, same return value."""
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise Unsupported("input", "x must be a 2-D [N, F] tensor")
    check_message_passing(module)
    check_inputs(module, x)
    if not isinstance(edge_index, Tensor):
        raise Unsupported("edge_index", f"edge_index is a {type(edge_index).__name__}")
    n = x.size(0)
    if not module.normalize:
        graph, weight = _as_given(module, edge_index, edge_weight, n, x)
    elif module._cached_edge_index is not None:
        cached_index, cached_weight = module._cached_edge_index
        graph, weight = _as_given(module, cached_index, cached_weight, n, x)
    elif is_sparse(edge_index):
        if module.cached:
            raise Unsupported("cached_sparse", "first cached=True call on a torch.sparse adjacency "
                                               "(stock builds the sparse tensor it caches)")
        graph, weight = _normalised_sparse(module, edge_index, n, x)
    else:
        if module.cached and is_compiling():
            # the cache holds stock's looped edge_index, whose compacted edge order a traced
            # graph (static shapes, loops kept in the extra row) cannot give: stock builds it
            raise Unsupported("compile", "the first cached=True call under torch.compile (stock builds the cache)")
        graph, weight, memoised = _normalised(module, edge_index, edge_weight, n, x)
        if module.cached:
            require("spmm", x.device, x.dtype, graph)  # before the cache is written
            module._cached_edge_index = (_stock_edge_index(module, edge_index, n),
                                         weight.clone() if memoised else weight)

    require("spmm", x.device, x.dtype, graph)  # before lin runs
    out = ops.spmm(graph, module.lin(x), edge_weight=weight, norm="none")
    if module.bias is not None:
        out = out + module.bias
    return out
