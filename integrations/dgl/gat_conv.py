"""DGL ``GATConv`` on :func:`gnn_fastpath.gat_attention`.

Reproduces ``dgl.nn.pytorch.conv.GATConv.forward`` (DGL 2.1.0) step by step: the
zero-in-degree check (memoised per Graph, same DGLError), ``feat_drop`` called the same
number of times in the same order (so feature dropout draws the same random numbers as
stock), ``fc`` (one projection for both sides, also of a ``(feat_src, feat_dst)`` pair) or
``fc_src``/``fc_dst`` (a module built with ``in_feats=(F_src, F_dst)``) called as submodules;
blocks take the first ``num_dst_nodes`` rows as destination features. The logit terms
``el = (feat_src * attn_l).sum(-1)`` and ``er = (feat_dst * attn_r).sum(-1)`` are computed
from the module's own parameters (autograd gives their gradients); then one fused op for the
LeakyReLU logits, the edge softmax, attention dropout, ``edge_weight`` (scaling the weights
after dropout, as stock's ``a * edge_weight``) and the aggregation; then the residual
(``res_fc`` called as a submodule: ``nn.Linear`` or DGL's ``Identity``), the explicit bias
(``bias`` exists only without a linear residual, whose own bias takes its place) and
``activation``. ``get_attention`` returns the weights the aggregation used, [E, H, 1] in
edge-id order: after dropout and times ``edge_weight``, as stock's ``graph.edata["a"]``.

What differs from stock: attention dropout with p > 0 in training draws its own random
numbers (same keep probability 1 - p and scale 1 / (1 - p)); stock and fused agree exactly
at p = 0 and in eval mode.

Reduced precision, derived from DGL 2.1's code (as for GATv2Conv): under CUDA autocast
``fc`` gives 16-bit projections A, ``el``/``er`` are float32 (float32 ``attn_l``/``attn_r``);
``u_add_v`` (gsddmm) casts both to A, so the logits, ``edge_softmax`` and ``attn_drop`` are
A; ``a * edge_weight`` promotes (float32 for a float32 weight); ``u_mul_e`` + ``sum`` (gspmm)
cast the weights to A and aggregate A features into A. So the op gets the projections and
the logit terms cast as DGL casts them (:func:`.graph.sparse_cast`), writes A, and the
returned attention takes the dtype of stock's ``a * edge_weight``; ``res_fc``, the bias and
``activation`` then run as in stock (a float32 bias or ``Identity`` residual gives a float32
output, as stock). In a half module everything is the module's dtype. Under CPU autocast
the layer runs stock (:func:`.graph.check_precision`).

Falls back (Unsupported) for: ``attn_drop`` not an ``nn.Dropout``, ``leaky_relu`` not an
``nn.LeakyReLU``, hooks on either, features not 2-D (stock takes ``(N, *, F)``), a single
feature tensor for a module built with ``(F_src, F_dst)`` (stock raises AttributeError), an
``edge_weight`` that is not one value per edge like the features, ``attn_l``/``attn_r`` not
of shape (1, heads, out_feats), heterographs and the graph inputs listed in :mod:`.graph`.
"""
from __future__ import annotations

import torch
from torch import Tensor

from gnn_fastpath import ops
from gnn_fastpath.ops.dispatch import require
from ..shim import Unsupported, check_like
from .graph import (check_attention_modules, check_attention_vector, check_call, check_features,
                    check_zero_in_degree, graph_of, sparse_cast)


def _edge_weight(edge_weight, num_edges: int, like: Tensor):
    """``edge_weight`` when it is [E] like the features (stock's ``tile``/``transpose`` makes
    it [E, H, 1]); Unsupported otherwise."""
    if edge_weight is None:
        return None
    check_like("edge_weight", edge_weight, like)
    if edge_weight.dim() != 1 or edge_weight.numel() != num_edges:
        raise Unsupported("edge_weight", f"edge_weight of shape {tuple(edge_weight.shape)} "
                                         f"(expected [{num_edges}])")
    return edge_weight


def fused_forward(module, backend, graph, feat, edge_weight=None, get_attention=False):
    """``GATConv.forward(graph, feat, edge_weight=None, get_attention=False)`` on the fused op."""
    g = graph
    n_src, n_dst, is_block, x = check_call(g, feat)
    negative_slope, p = check_attention_modules(module)
    H, D = int(module._num_heads), int(module._out_feats)
    check_attention_vector("attn_l", module.attn_l, x, H, D)
    check_attention_vector("attn_r", module.attn_r, x, H, D)
    check_features(feat, n_src, n_dst, is_block)
    separate = hasattr(module, "fc_src")
    if not isinstance(feat, tuple) and separate:
        raise Unsupported("input", "one feature tensor for a module built with (src, dst) in_feats "
                                   "(stock has no fc to apply)")

    G = graph_of(g)
    edge_weight = _edge_weight(edge_weight, G.num_edges, x)
    check_zero_in_degree(module, G)
    require("gat_attention", x.device, x.dtype, G, heads=(H, D))  # before feat_drop or any fc runs

    if isinstance(feat, tuple):
        h_src = module.feat_drop(feat[0])
        h_dst = module.feat_drop(feat[1])
        fc_src, fc_dst = (module.fc_src, module.fc_dst) if separate else (module.fc, module.fc)
        feat_src = fc_src(h_src).view(-1, H, D)
        feat_dst = fc_dst(h_dst).view(-1, H, D)
    else:
        h_src = h_dst = module.feat_drop(feat)
        feat_src = feat_dst = module.fc(h_src).view(-1, H, D)
        if is_block:
            feat_dst = feat_src[:n_dst]
            h_dst = h_dst[:n_dst]

    el = (feat_src * module.attn_l).sum(dim=-1)
    er = (feat_dst * module.attn_r).sum(dim=-1)
    feat_src, el, er = sparse_cast(feat_src, el, er)
    result = ops.gat_attention(G, feat_src, el, er, negative_slope=negative_slope,
                               return_attention="dropped" if get_attention else False, dropout=p,
                               edge_weight=edge_weight)
    rst, alpha = result if get_attention else (result, None)

    if module.res_fc is not None:
        resval = module.res_fc(h_dst).view(h_dst.shape[0], -1, D)
        rst = rst + resval
    if module.has_explicit_bias:
        rst = rst + module.bias.view(1, H, D)
    if module.activation:
        rst = module.activation(rst)
    if get_attention:
        if edge_weight is not None:  # stock's a * edge_weight promotes (autocast: A times float32)
            alpha = alpha.to(torch.promote_types(alpha.dtype, edge_weight.dtype))
        return rst, alpha.unsqueeze(-1)
    return rst
