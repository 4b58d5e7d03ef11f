"""DGL ``GATv2Conv`` on :func:`gnn_fastpath.gatv2_attention`.

Reproduces ``dgl.nn.pytorch.conv.GATv2Conv.forward`` (DGL 2.1.0) step by step: the
zero-in-degree check (memoised per Graph, same DGLError), ``feat_drop`` called the same
number of times in the same order (so feature dropout draws the same random numbers as
stock), ``fc_src``/``fc_dst`` called as submodules, blocks take the first
``num_dst_nodes`` rows as destination features, then one fused op for the edge logits,
softmax, attention dropout and aggregation, then the residual (``res_fc`` called as a
submodule: ``nn.Linear`` or DGL's ``Identity``) and ``activation``. The bias lives in the
``fc_*``/``res_fc`` linears in DGL 2.1.0, so there is no separate bias step.

What differs from stock: attention dropout with p > 0 in training draws its own random
numbers (same keep probability 1 - p and scale 1 / (1 - p)); stock and fused agree exactly
at p = 0 and in eval mode.

Reduced precision, derived from DGL 2.1's code (stock DGL's PyPI build cannot run CUDA
features): under CUDA autocast ``fc_src``/``fc_dst`` give 16-bit projections; ``u_add_v``
(gsddmm) keeps them 16-bit; ``(e * attn).sum(-1)`` is float32 (float32 ``attn``);
``edge_softmax`` casts the logits back to the autocast dtype A and runs with autocast off, so
the attention ``a`` is A; ``u_mul_e`` + ``sum`` (gspmm) aggregate A features with A weights
into A. So the op gets the projections cast as DGL casts them (:func:`.graph.sparse_cast`),
writes A (its default: the features' dtype) and returns the attention in A, as stock's
``get_attention``; ``res_fc`` and ``activation`` then run as in stock (an ``Identity``
residual adds the float32 input: float32 output, as stock). In a half module everything is
the module's dtype. Under CPU autocast the layer runs stock (:func:`.graph.check_precision`).
"""
from __future__ import annotations

from torch import Tensor, nn

from gnn_fastpath import ops
from gnn_fastpath.ops.dispatch import require
from ..shim import has_module_hooks
from .graph import (check_attention_modules, check_attention_vector, check_call, check_features,
                    check_zero_in_degree, graph_of, sparse_cast)


def _check_module(module, x: Tensor):
    """(H, D, att [H, D], negative slope, attention dropout p) or Unsupported."""
    negative_slope, p = check_attention_modules(module)
    H, D = int(module._num_heads), int(module._out_feats)
    return H, D, check_attention_vector("attn", module.attn, x, H, D), negative_slope, p


def _fc_dst_rows(module, h_dst: Tensor, n_dst: int) -> Tensor:
    """``fc_dst(h_dst)[:n_dst]`` for a block; a plain hook-free Linear only computes the rows kept."""
    fc = module.fc_dst
    if type(fc) is nn.Linear and not has_module_hooks(fc):
        return fc(h_dst[:n_dst])
    return fc(h_dst)[:n_dst]


def fused_forward(module, backend, graph, feat, get_attention=False):
    """``GATv2Conv.forward(graph, feat, get_attention=False)`` on the fused op."""
    g = graph
    n_src, n_dst, is_block, x = check_call(g, feat)
    H, D, att, negative_slope, p = _check_module(module, x)
    check_features(feat, n_src, n_dst, is_block)

    G = graph_of(g)
    check_zero_in_degree(module, G)
    require("gatv2_attention", x.device, x.dtype, G, heads=(H, D))  # before feat_drop or any fc runs

    if isinstance(feat, tuple):
        h_src = module.feat_drop(feat[0])
        h_dst = module.feat_drop(feat[1])
        feat_src = module.fc_src(h_src).view(-1, H, D)
        feat_dst = module.fc_dst(h_dst).view(-1, H, D)
    else:
        h_src = h_dst = module.feat_drop(feat)
        feat_src = module.fc_src(h_src).view(-1, H, D)
        if is_block:
            h_dst = h_dst[:n_dst]
        if module.share_weights:
            feat_dst = feat_src[:n_dst] if is_block else feat_src
        elif is_block:
            feat_dst = _fc_dst_rows(module, h_src, n_dst).view(-1, H, D)
        else:
            feat_dst = module.fc_dst(h_dst).view(-1, H, D)

    feat_src, feat_dst = sparse_cast(feat_src, feat_dst)
    result = ops.gatv2_attention(G, feat_src, feat_dst, att, negative_slope,
                                 return_attention="dropped" if get_attention else False, dropout=p)
    rst, alpha = result if get_attention else (result, None)

    if module.res_fc is not None:
        resval = module.res_fc(h_dst).view(h_dst.shape[0], -1, module._out_feats)
        rst = rst + resval
    if module.activation:
        rst = module.activation(rst)
    if get_attention:
        return rst, alpha.unsqueeze(-1)
    return rst
