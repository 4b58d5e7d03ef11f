"""PyG ``GINConv`` on :func:`gnn_fastpath.spmm` (sum/mean) and :func:`gnn_fastpath.segment_reduce`
(max/min).

Reproduces ``torch_geometric.nn.conv.GINConv.forward`` (PyG 2.8): ``out = aggr_j x_j`` over
each target's in-edges, ``out + (1 + eps) * x_dst`` when there is a target side, then ``nn``
(called as a submodule). ``eps`` is a parameter (``train_eps``: its gradient comes back) or a
buffer. ``aggr`` defaults to ``"add"`` but any aggregation can be given: the plain ones
(``"add"``/``"sum"``, ``"mean"``, ``"max"``, ``"min"`` or their plain aggregation modules) run
fused, on the paths of :mod:`.aggregation` (a torch.sparse adjacency with a string
aggregation goes through stock's ``message_and_aggregate``, whose product reads the
adjacency's values as edge weights; on every other input the values are ignored).

Node counts follow ``propagate`` (``size``, an ``EdgeIndex``'s sparse sizes or a sparse
adjacency's shape); ``x = (x_src, None)`` has no root term.

Reduced precision (see :mod:`..shim`): the op aggregates ``x_src`` as it comes and writes its
dtype (stock's scatter keeps it); ``(1 + eps) * x_dst`` and ``nn`` then run as in stock.

Falls back (Unsupported) for: other aggregations, ``flow="target_to_source"``, features that
are not 2-D, sizes that disagree with the features, an ``eps`` on another device, the graph
inputs listed in :mod:`.graph` and the aggregation paths :mod:`.aggregation` leaves to stock.
"""
from __future__ import annotations

from torch import Tensor

from gnn_fastpath.ops.dispatch import require
from ..shim import Unsupported
from .aggregation import aggregate, aggregation, check_module, node_counts, op_of, reduce_of, split
from .graph import check_inputs, graph_of, pair_features


def op_for(module) -> str:
    """The op family ``module`` runs on (the Shim's ``op``)."""
    return op_of(reduce_of(module))


def features(x, *args, **kwargs) -> Tensor:
    """The tensor deciding device and dtype: ``x`` or ``x[0]`` of a pair."""
    return pair_features(x)


def forward(module, backend: str, x, edge_index, size=None):
    """Fused ``GINConv.forward``: same arguments, same return value."""
    from torch_geometric.nn.conv import GINConv

    reduce = check_module(module, GINConv)
    x_src, x_dst = split(x)
    check_inputs(module, x_src)
    eps = module.eps
    if not isinstance(eps, Tensor) or eps.device != x_src.device:
        raise Unsupported("device", f"eps is not a tensor on {x_src.device}")
    n_src, n_dst = node_counts(edge_index, size, x_src, x_dst)
    graph = graph_of(edge_index, n_src, n_dst, x_src)
    path = aggregation(module, reduce, edge_index, x_src, x_src.dtype)
    require(op_of(reduce), x_src.device, x_src.dtype, graph)  # before nn runs

    out = aggregate(graph, x_src, path, path.values)
    if x_dst is not None:
        out = out + (1 + eps) * x_dst
    return module.nn(out)
