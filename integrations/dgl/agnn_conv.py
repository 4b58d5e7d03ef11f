"""DGL ``AGNNConv`` on :func:`gnn_fastpath.dot_attention` (see :mod:`..agnn`).

Reproduces ``dgl.nn.pytorch.conv.AGNNConv.forward`` (DGL 2.1.0): the zero-in-degree check
(memoised per Graph, same DGLError), ``F.normalize(feat, p=2, dim=-1)`` of the source and
destination features (a block's destination rows are the first ``num_dst_nodes`` rows, whose
normalisation is the first rows of the source side's; a pair's second tensor is normalised
on its own), ``cos = u_dot_v``, ``e = beta * cos``, ``edge_softmax`` and ``u_mul_e`` + sum of the
unnormalised source features. One fused op: no [M] logits, no [M, F] messages. ``beta`` is a
parameter (``learn_beta``: its gradient comes back) or a buffer. Features ``[N, *, D]``:
``u_dot_v`` reduces the last dimension, so each of the ``prod(*)`` positions is one attention
head of width D; the output has the source features' shape with ``num_dst_nodes`` rows.

Reduced precision, derived from DGL 2.1's code (stock DGL's PyPI build cannot run CUDA
features): under CUDA autocast (A the autocast dtype) ``u_dot_v`` (gsddmm) casts the
normalised features to A, ``beta * cos`` is float32, ``edge_softmax`` casts it back to A and
``u_mul_e`` (gspmm) aggregates A features with A weights into A. The op gets
``q = beta * n_dst``, ``k = n_src`` and ``v = feat_src`` cast as DGL casts them
(:func:`.graph.sparse_cast`) and writes A. Without autocast ``beta`` must have the features'
dtype (anything else runs stock, which decides) and everything stays in it. Under CPU
autocast the layer runs stock (:func:`.graph.check_precision`).

Falls back (Unsupported) for: heterographs with several edge types, features that are not
at least 2-D or whose row counts do not match the graph, a pair whose two sides differ in
trailing shape, one tensor on a non-block graph whose source and destination node types
differ (stock fails: no destination ``norm_h``), a feature pair on a graph with one node type
that is not a block (stock's ``dstdata`` write replaces the source keys there:
:func:`.graph.check_pair_frames`), and a ``beta`` of another dtype or device.
"""
from __future__ import annotations

from gnn_fastpath.ops.dispatch import require
from .. import agnn
from ..shim import Unsupported, check_like
from .graph import (check_call, check_pair_frames, check_zero_in_degree, graph_of, sparse_cast,
                    split_feat)


def _check_features(g, feat, n_src: int, n_dst: int, is_block: bool):
    """(feat_src, feat_dst or None when the destination side is the source's first rows)."""
    check_pair_frames(g, feat)
    src, dst = split_feat(feat)
    if dst is not None:
        if dst.shape[1:] != src.shape[1:]:
            raise Unsupported("input", f"feat_src {tuple(src.shape)} and feat_dst {tuple(dst.shape)} differ "
                                       "in trailing shape")
    else:
        etype = g.canonical_etypes[0]
        if not is_block and etype[0] != etype[2]:
            raise Unsupported("input", "one feature tensor on a graph whose source and destination node types "
                                       "differ (stock fails)")
    if src.dim() < 2:
        raise Unsupported("input", "the fused path takes features [N, *, D] of at least 2 dimensions")
    if src.shape[0] != n_src or (dst is not None and dst.shape[0] != n_dst):
        raise Unsupported("input", f"feature rows do not match the graph's ({n_src}, {n_dst}) nodes")
    return src, dst


def fused_forward(module, backend, graph, feat):
    """``AGNNConv.forward(graph, feat)`` on the fused op."""
    g = graph
    n_src, n_dst, is_block, x = check_call(g, feat)
    feat_src, feat_dst = _check_features(g, feat, n_src, n_dst, is_block)
    beta = check_like("beta", module.beta, feat_src)

    G = graph_of(g)
    check_zero_in_degree(module, G)
    require("dot_attention", x.device, x.dtype, G, heads=agnn.heads(feat_src))

    n_src_feat = agnn.normalize(feat_src)
    n_dst_feat = agnn.normalize(feat_dst) if feat_dst is not None else n_src_feat[:n_dst]
    q, k, v = sparse_cast(agnn.queries(beta, n_dst_feat), n_src_feat, feat_src)
    if not q.dtype == k.dtype == v.dtype:
        raise Unsupported("dtype", f"beta {beta.dtype} with {feat_src.dtype} features (stock mixes them)")
    return agnn.attention(G, q, k, v)
