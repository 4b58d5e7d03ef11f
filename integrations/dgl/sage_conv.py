"""DGL ``SAGEConv`` on :func:`gnn_fastpath.spmm` (mean, gcn) and :func:`gnn_fastpath.segment_reduce`
(pool).

Reproduces ``dgl.nn.pytorch.conv.SAGEConv.forward`` (DGL 2.1.0):

- ``feat_drop`` on the features: once for a single tensor (a block's destination features are
  the first ``num_dst_nodes`` rows of the dropped source features), on ``feat[0]`` then
  ``feat[1]`` for a pair;
- ``edge_weight`` multiplies each message (``fn.u_mul_e``); it never enters a degree;
- ``"mean"``: the mean of the neighbours' features (0 without in-edges) is
  ``spmm(norm="right")`` (in-degree clamped to >= 1). ``fc_neigh`` runs before the
  aggregation when ``in_src_feats > out_feats`` (fewer columns to aggregate), after otherwise;
- ``"gcn"``: ``(sum of the neighbours' features + the node's own) / (in_degree + 1)``, the
  sum by ``spmm(norm="none")``, the own features being the destination side (a block's first
  rows, the pair's second tensor); ``fc_neigh`` before or after as for ``"mean"`` (before: on
  both sides of a pair); the module's ``bias`` is added after (there is no ``fc_self``);
- ``"pool"``: ``relu(fc_pool(feat_src))``, then the element-wise max over the in-edges (0
  without in-edges) by ``segment_reduce``, then ``fc_neigh``. The gradient of a maximum
  reached by several edges (duplicate edges, equal features; ties at the ReLU's zeros carry
  no gradient back) goes, as in DGL, whole to one tied edge: the first or the last in DGL's
  edge order, whichever the running DGL build picks for ``fn.copy_u`` (no ``edge_weight``) or
  ``fn.u_mul_e`` (:func:`.ties.tie_break`); NaN messages never win and a non-finite maximum is
  written as 0 with no gradient, as DGL's ``fn.max`` does (``non_finite="drop"``);
- then ``fc_self(feat_dst) + h_neigh`` (not for ``"gcn"``), ``activation`` and ``norm``.

Submodules (``fc_pool``, ``fc_neigh``, ``fc_self``, ``feat_drop``, ``activation``/``norm``
when modules) are called as submodules, in stock's order.

Falls back (Unsupported) for: ``"lstm"``, heterographs with several edge types, features that
are not 2-D ``[N, F]`` or whose row counts do not match the graph (stock raises or
broadcasts), a ``"gcn"`` pair of different widths (stock raises) or on a graph with one node
type that is not a block (stock's ``dstdata`` write replaces the source features there:
:func:`.graph.check_pair_frames`), ``edge_weight`` other than
one float per edge (``[M]`` or ``[M, 1]``), and ``"pool"`` on a graph without edges (DGL 2.1's
max then returns zeros but sends every destination's gradient to source node 0; no rule to
copy). ``"mean"``/``"gcn"`` on a graph without edges are fused (0 aggregated, as stock).

Reduced precision, derived from DGL 2.1's code (stock DGL's PyPI build cannot run CUDA
features). Under CUDA autocast (A the autocast dtype) every ``update_all`` (gspmm) casts its
features and ``edge_weight`` to A and aggregates into A; the ``fc_*`` give A. So the ops get
the aggregated features and the edge weight cast as DGL casts them
(:func:`.graph.sparse_cast`) and write A (their default): ``"mean"`` and ``"pool"`` give A
(``fc_self(h_self) + h_neigh``: A); ``"gcn"`` adds the *uncast* destination features (float32
when ``fc_neigh`` comes after) and divides by ``in_degree + 1`` in ``feat_dst``'s dtype
(float32), so its ``h_neigh`` is float32 before ``fc_neigh`` (A after it) and its output is
float32 through the float32 ``bias``, as stock's. In a half module everything is the
module's dtype. Under CPU autocast the layer runs stock (:func:`.graph.check_precision`).
"""
from __future__ import annotations

from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from gnn_fastpath import ops
from gnn_fastpath.ops.dispatch import require
from gnn_fastpath.graph import Graph
from ..shim import Unsupported, check_like
from . import ties
from .graph import (apply_optional, broadcasts, check_call, check_pair_frames, graph_of,
                    scalar_edge_weight, sparse_cast, split_feat)

_AGGREGATORS = ("mean", "gcn", "pool")


def op_for(module) -> str:
    """The op family ``module`` runs on (the Shim's ``op``)."""
    return "segment_reduce" if getattr(module, "_aggre_type", None) == "pool" else "spmm"


def _check_inputs(module, g, feat, edge_weight, n_src: int, n_dst: int, is_block: bool) -> Optional[Tensor]:
    """The edge weight as [M] (or None), after every check stock would fail later."""
    aggr = module._aggre_type
    if aggr not in _AGGREGATORS:
        raise Unsupported("aggregator_type", f"aggregator_type={aggr!r} (the fused path takes "
                                             f"{', '.join(_AGGREGATORS)})")
    if aggr == "gcn":
        check_pair_frames(g, feat)
    feat_src, feat_dst = split_feat(feat)
    if feat_dst is None:
        feat_dst = feat_src
    if feat_src.dim() != 2 or feat_dst.dim() != 2:
        raise Unsupported("input", "the fused path takes 2-D [N, F] features")
    if aggr == "gcn" and feat_src.shape[1:] != feat_dst.shape[1:]:
        raise Unsupported("input", "gcn with source and destination features of different widths "
                                   "(stock raises)")
    dst_rows = n_dst if is_block and feat_dst is feat_src else feat_dst.shape[0]
    if feat_src.shape[0] != n_src:
        raise Unsupported("input", f"feat_src has {feat_src.shape[0]} rows for {n_src} source nodes")
    if dst_rows != n_dst:
        raise Unsupported("input", f"the destination features have {dst_rows} rows for {n_dst} "
                                   "destination nodes")
    for name, p in module.named_parameters():
        check_like(f"parameter {name}", p, feat_src)
    edge_weight = scalar_edge_weight(g, edge_weight, feat_src)
    if aggr == "pool" and g.num_edges() == 0:
        raise Unsupported("empty_graph", "pool on a graph without edges (DGL 2.1's max then sends every "
                                         "destination's gradient to source node 0)")
    return edge_weight


def _gcn_denominator(graph: Graph, like: Tensor) -> Tensor:
    """``in_degree + 1`` as a [n_dst, 1] column of ``like``'s dtype on its device (memoised)."""
    if graph.device != like.device:
        graph = graph.to(like.device)
    return graph.memo(("dgl", "sage_gcn_in_degree_plus_one", like.dtype),
                      lambda: (graph.in_degree().to(like.dtype) + 1).unsqueeze(-1))


def fused_forward(module, backend, graph, feat, edge_weight=None):
    """``SAGEConv.forward(graph, feat, edge_weight=None)`` on the fused ops."""
    g = graph
    n_src, n_dst, is_block, x = check_call(g, feat)
    weight = _check_inputs(module, g, feat, edge_weight, n_src, n_dst, is_block)
    G = graph_of(g)
    require(op_for(module), x.device, x.dtype, G)  # before feat_drop or any fc runs
    if module._aggre_type == "pool":  # fc_pool keeps the width: x tells whether DGL broadcasts the weight
        tie = ties.tie_break(g.device, "copy_u" if weight is None else "u_mul_e", broadcast=broadcasts(x, weight))

    if isinstance(feat, tuple):
        feat_src = module.feat_drop(feat[0])
        feat_dst = module.feat_drop(feat[1])
    else:
        feat_src = feat_dst = module.feat_drop(feat)
        if is_block:
            feat_dst = feat_src[:n_dst]
    h_self = feat_dst
    aggr = module._aggre_type
    lin_before = module._in_src_feats > module._out_feats

    if aggr == "mean":
        h = module.fc_neigh(feat_src) if lin_before else feat_src
        h_neigh = ops.spmm(G, *sparse_cast(h, weight), norm="right")
        if not lin_before:
            h_neigh = module.fc_neigh(h_neigh)
    elif aggr == "gcn":
        h = module.fc_neigh(feat_src) if lin_before else feat_src
        if isinstance(feat, tuple):
            h_dst = module.fc_neigh(feat_dst) if lin_before else feat_dst
        else:
            h_dst = h[:n_dst] if is_block else h  # uncast, as stock's dstdata["h"]
        total = ops.spmm(G, *sparse_cast(h, weight), norm="none") + h_dst
        h_neigh = total / _gcn_denominator(G, h_self)  # stock's degrees are in feat_dst's dtype
        if not lin_before:
            h_neigh = module.fc_neigh(h_neigh)
    else:  # pool
        h = F.relu(module.fc_pool(feat_src))
        h, pool_weight = sparse_cast(h, weight)
        h_neigh = module.fc_neigh(ops.segment_reduce(G, h, "max", edge_weight=pool_weight, tie_break=tie,
                                                     non_finite="drop"))

    if aggr == "gcn":
        rst = h_neigh
        if module.bias is not None:
            rst = rst + module.bias
    else:
        rst = module.fc_self(h_self) + h_neigh
    return apply_optional(rst, module.activation, module.norm)
