"""PyG ``GraphConv`` on :func:`gnn_fastpath.spmm` (sum/mean) and :func:`gnn_fastpath.segment_reduce`
(max/min).

Reproduces ``torch_geometric.nn.conv.GraphConv.forward`` (PyG 2.8):
``lin_rel(aggr_j w_ij x_j) + lin_root(x_dst)`` (the root term only with a target side), the
submodules ``lin_rel`` and ``lin_root`` called as submodules. The aggregation, by the path
stock takes (:mod:`.aggregation`):

- ``message`` + aggregation (an ``edge_index`` Tensor, an unsorted ``EdgeIndex``, a module
  aggregation): messages ``edge_weight.view(-1, 1) * x_j`` (``x_j`` without a weight); sum
  and mean by ``spmm`` with the weights (mean divides by the structural in-degree clamped to
  >= 1), max/min by ``segment_reduce`` over ``w_ij x_j`` with torch's scatter tie rule
  (``"split"``, the weight gradients included);
- torch.sparse adjacency with a string aggregation: ``message_and_aggregate``, the
  adjacency's values as the weights; ``edge_weight`` is ignored, as stock ignores it;
- ``EdgeIndex`` sorted by target with a string aggregation (``SUPPORTS_FUSED_EDGE_INDEX``):
  ``EdgeIndex.matmul(x_src, input_value=edge_weight, reduce)``, sum and mean (float32
  features); max/min run stock there (reason ``edge_index_reduce``).

Reduced precision (see :mod:`..shim`): the op writes the dtype of stock's messages
(``promote_types(edge_weight, x)``: float32 for a float32 weight with 16-bit features);
``lin_rel``/``lin_root`` then run as in stock.

Falls back (Unsupported) for: other aggregations, ``flow="target_to_source"``, features that
are not 2-D, sizes that disagree with the features, ``edge_weight`` not a float [M] tensor
on the paths that read it, and the inputs :mod:`.aggregation` and :mod:`.graph` leave to
stock.
"""
from __future__ import annotations

from torch import Tensor

from gnn_fastpath.ops.dispatch import require
from ..shim import Unsupported
from .aggregation import aggregate, aggregation, check_module, node_counts, op_of, reduce_of, split
from .graph import check_inputs, edge_weight_of, graph_of, pair_features


def op_for(module) -> str:
    """The op family ``module`` runs on (the Shim's ``op``)."""
    return op_of(reduce_of(module))


def features(x, *args, **kwargs) -> Tensor:
    """The tensor deciding device and dtype: ``x`` or ``x[0]`` of a pair."""
    return pair_features(x)


def forward(module, backend: str, x, edge_index, edge_weight=None, size=None):
    """Fused ``GraphConv.forward``: same arguments, same return value."""
    from torch_geometric.nn.conv import GraphConv

    reduce = check_module(module, GraphConv)
    x_src, x_dst = split(x)
    check_inputs(module, x_src)
    n_src, n_dst = node_counts(edge_index, size, x_src, x_dst)
    graph = graph_of(edge_index, n_src, n_dst, x_src)
    path = aggregation(module, reduce, edge_index, x_src, x_src.dtype)
    if path.kind == "sparse":
        weight = path.values  # stock's sparse product ignores edge_weight
    else:
        weight = edge_weight_of("edge_weight", edge_weight, graph, x_src)
        if path.kind == "edge_index" and weight is not None and weight.dtype != x_src.dtype:
            raise Unsupported("dtype", f"EdgeIndex.matmul of {x_src.dtype} features with {weight.dtype} "
                                       "weights (stock's sparse product decides)")
    require(op_of(reduce), x_src.device, x_src.dtype, graph)  # before lin_rel runs

    out = module.lin_rel(aggregate(graph, x_src, path, weight))
    if x_dst is not None:
        out = out + module.lin_root(x_dst)
    return out
