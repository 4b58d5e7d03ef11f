"""DGL ``GraphConv`` on :func:`gnn_fastpath.spmm`.

Reproduces ``dgl.nn.pytorch.conv.GraphConv.forward`` (DGL 2.1.0): the zero-in-degree check
(memoised per Graph, same DGLError), ``edge_weight`` multiplying each message, the
normalisation by structural degrees clamped to >= 1 (``edge_weight`` does not enter it),
the module's ``weight`` or an external ``weight=`` (same DGLError when both exist),
multiplying by W before aggregating when ``in_feats > out_feats`` and after otherwise,
then ``bias`` and ``activation``. Blocks take the first ``num_dst_nodes`` rows as
destination features, a pair ``(feat_src, feat_dst)`` is taken as given.

The source and destination degree scales are applied inside the op (one pass), so where
stock scales before or after the matmul with W the fused path may scale on the other side
of it: the same product, rounded in another order (differences around 1e-7 relative).
"""
from __future__ import annotations

import torch

from ... import ops
from ...ops.dispatch import require
from ..shim import Shim, Unsupported, check_like
from .graph import (check_device, check_graph, check_zero_in_degree,
                    dgl_error, features_of, graph_of)

_NORMS = ("none", "both", "right", "left")
_EXTERNAL_WEIGHT_MESSAGE = (
    "External weight is provided while at the same time the"
    " module has defined its own weight parameter. Please"
    " create the module with flag weight=False."
)


def _check_inputs(module, g, feat, weight, edge_weight, n_src: int, n_dst: int, is_block: bool):
    """(feat_src, W or None) after the checks stock would fail later (those run stock)."""
    norm = module._norm
    if norm not in _NORMS:
        raise Unsupported("norm", f"norm={norm!r}")
    if isinstance(feat, tuple):
        if len(feat) != 2:
            raise Unsupported("input", f"feat is a tuple of {len(feat)} (expected (feat_src, feat_dst))")
        feat_src, feat_dst = feat
        if norm in ("right", "both"):  # stock reads feat_dst's dtype and device for the scale
            check_like("feat[1]", feat_dst, feat_src)
    else:
        feat_src = feat  # stock's destination rows (feat[:num_dst] of a block) only set the scale's dtype
    if feat_src.dim() < 2 or feat_src.shape[0] != n_src:
        raise Unsupported("input", f"feat_src has shape {tuple(feat_src.shape)} for {n_src} source nodes")
    if edge_weight is not None:
        check_like("edge_weight", edge_weight, feat_src)
        if edge_weight.dim() != 1 or edge_weight.shape[0] != g.num_edges():
            raise Unsupported("edge_weight", f"edge_weight of shape {tuple(edge_weight.shape)} "
                                             f"(the fused path takes one scalar per edge, [{g.num_edges()}])")
    if weight is not None and module.weight is not None:
        return feat_src, None  # stock raises; checked after the zero-in-degree check, as stock
    w = module.weight if weight is None else weight
    if w is not None:
        check_like("weight", w, feat_src)
        if w.dim() != 2 or w.shape[0] != feat_src.shape[-1]:
            raise Unsupported("input", f"weight of shape {tuple(w.shape)} for features of width "
                                       f"{feat_src.shape[-1]}")
    return feat_src, w


def fused_forward(module, backend, graph, feat, weight=None, edge_weight=None):
    """``GraphConv.forward(graph, feat, weight=None, edge_weight=None)`` on the fused op."""
    g = graph
    n_src, n_dst, is_block = check_graph(g)
    x = features_of(g, feat)
    check_device(g, x)
    feat_src, w = _check_inputs(module, g, feat, weight, edge_weight, n_src, n_dst, is_block)

    G = graph_of(g)
    check_zero_in_degree(module, G)
    require("spmm", x.device, x.dtype, G)  # before any matmul runs
    if weight is not None and module.weight is not None:
        raise dgl_error(_EXTERNAL_WEIGHT_MESSAGE)

    norm = module._norm
    if module._in_feats > module._out_feats:
        # multiply by W first to shrink the features that are aggregated (as stock)
        if w is not None:
            feat_src = torch.matmul(feat_src, w)
        rst = ops.spmm(G, feat_src, edge_weight, norm)
    else:
        rst = ops.spmm(G, feat_src, edge_weight, norm)
        if w is not None:
            rst = torch.matmul(rst, w)
    if module.bias is not None:
        rst = rst + module.bias
    if module._activation is not None:
        rst = module._activation(rst)
    return rst


def make_shim() -> Shim:
    from dgl.nn.pytorch.conv import GraphConv

    return Shim(key="dgl.GraphConv", cls=GraphConv, forward=fused_forward, op="spmm", features=features_of)
