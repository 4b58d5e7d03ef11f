"""DGL ``GINConv`` on :func:`gnn_fastpath.spmm` (sum, mean) and :func:`gnn_fastpath.segment_reduce`
(max).

Reproduces ``dgl.nn.pytorch.conv.GINConv.forward`` (DGL 2.1.0):
``rst = (1 + eps) * feat_dst + aggr_j m_ij`` with ``m_ij = feat_src_j`` (``fn.copy_u``) or
``feat_src_j * edge_weight_ij`` (``fn.u_mul_e``), then ``apply_func`` and ``activation`` (called
as stock calls them; ``apply_func=None`` skips it). ``eps`` is a parameter (``learn_eps``: its
gradient comes back) or a buffer. Destination features: a pair's second tensor, a block's
first ``num_dst_nodes`` rows, else the features themselves.

- ``"sum"``: ``spmm(norm="none")`` with the edge weights;
- ``"mean"``: the sum divided by the structural in-degree clamped to >= 1 (``fn.mean``; the
  weights do not enter the count): ``spmm(norm="right")``;
- ``"max"``: ``segment_reduce`` with DGL 2.1's rules (see :mod:`.sage_conv`): a tie's whole
  gradient to the first or the last tied edge in DGL's edge order, as the running DGL build
  does for this message (:func:`.ties.tie_break`); NaN messages never win and a non-finite
  maximum (a destination without in-edges included) is written as 0 with no gradient.

``edge_weight``: one scalar per edge, ``[M]`` or ``[M, 1]``; features ``[N, *]`` of at least 2
dimensions (the ops reduce every trailing element alike).

Reduced precision, derived from DGL 2.1's code: under CUDA autocast (A) ``update_all`` casts
the features and ``edge_weight`` to A and aggregates into A (:func:`.graph.sparse_cast`); the
float32 ``eps`` and the uncast ``feat_dst`` then give stock's dtype for ``rst``, as in stock.
In a half module everything is the module's dtype. Under CPU autocast the layer runs stock
(:func:`.graph.check_precision`).

Falls back (Unsupported) for: heterographs with several edge types, features of fewer than 2
dimensions or whose row counts do not match the graph (stock raises or broadcasts),
``edge_weight`` other than one float per edge, an ``eps`` on another device, and ``"max"`` on
a graph without edges (DGL 2.1's max then sends every destination's gradient to source 0).
"""
from __future__ import annotations

from torch import Tensor

from gnn_fastpath import ops
from gnn_fastpath.ops.dispatch import require
from ..shim import Unsupported, check_like
from . import ties
from .graph import (apply_optional, broadcasts, check_call, graph_of, node_features,
                    scalar_edge_weight, sparse_cast)


def op_for(module) -> str:
    """The op family ``module`` runs on (the Shim's ``op``)."""
    return "segment_reduce" if getattr(module, "_aggregator_type", None) == "max" else "spmm"


def _check_inputs(module, g, feat, edge_weight, n_src: int, n_dst: int, is_block: bool):
    """(feat_src, feat_dst, edge weight [M] or None) after the checks stock would fail later."""
    aggr = module._aggregator_type
    if aggr not in ("sum", "mean", "max"):
        raise Unsupported("aggregator_type", f"aggregator_type={aggr!r}")
    feat_src, feat_dst = node_features(feat, n_src, n_dst, is_block, "[N, *]")
    for name, p in module.named_parameters():
        check_like(f"parameter {name}", p, feat_src)
    eps = module.eps
    if not isinstance(eps, Tensor) or eps.device != feat_src.device:
        raise Unsupported("device", f"eps is not a tensor on {feat_src.device}")
    weight = scalar_edge_weight(g, edge_weight, feat_src)
    if aggr == "max" and g.num_edges() == 0:
        raise Unsupported("empty_graph", "max on a graph without edges (DGL 2.1's max then sends every "
                                         "destination's gradient to source node 0)")
    return feat_src, feat_dst, weight


def fused_forward(module, backend, graph, feat, edge_weight=None):
    """``GINConv.forward(graph, feat, edge_weight=None)`` on the fused ops."""
    g = graph
    n_src, n_dst, is_block, x = check_call(g, feat)
    feat_src, feat_dst, weight = _check_inputs(module, g, feat, edge_weight, n_src, n_dst, is_block)
    G = graph_of(g)
    require(op_for(module), x.device, x.dtype, G)  # before apply_func or activation runs

    aggr = module._aggregator_type
    h, w = sparse_cast(feat_src, weight)
    if aggr == "max":
        tie = ties.tie_break(g.device, "copy_u" if w is None else "u_mul_e", broadcast=broadcasts(h, w))
        neigh = ops.segment_reduce(G, h, "max", edge_weight=w, tie_break=tie, non_finite="drop")
    else:
        neigh = ops.spmm(G, h, edge_weight=w, norm="right" if aggr == "mean" else "none")
    rst = (1 + module.eps) * feat_dst + neigh
    return apply_optional(rst, module.apply_func, module.activation)
