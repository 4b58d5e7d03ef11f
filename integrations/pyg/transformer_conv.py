"""PyG ``TransformerConv`` on :func:`gnn_fastpath.dot_attention`.

Reproduces ``torch_geometric.nn.conv.TransformerConv.forward`` (PyG 2.8) step by step:
``lin_query`` on the targets, ``lin_key``/``lin_value`` on the sources, ``lin_edge`` on
``edge_attr`` (added to keys and values), all called as submodules in stock's order; one
fused op for the logits ``<q_i, k_j + e_ij> / sqrt(C)``, the softmax over each target's
in-edges, attention dropout and the weighted sum of ``v_j + e_ij``; then concat or head
mean, ``lin_skip`` and the ``lin_beta`` gate. Stock leaves ``module._alpha`` as ``None``
after every call, and so does this.

``return_attention_weights`` given as a bool (``True`` or ``False``, as stock checks it)
returns ``(out, (edge_index, alpha))`` with the softmax weights before dropout, for an
``edge_index`` Tensor, ``EdgeIndex`` or torch.sparse adjacency alike (stock returns the
input object itself, with alpha in its edge order).

What differs from stock: attention dropout with p > 0 in training draws its own random
numbers (same keep probability 1 - p and scale 1 / (1 - p)); stock and fused agree exactly
at p = 0 and in eval mode.

Reduced precision (see :mod:`..shim`): the op gets stock's projections as they come (bf16
or fp16 from the ``lin_*`` under autocast, the module dtype in a half module); its
``out_dtype`` is the dtype of stock's messages ``(v_j [+ e]) * softmax((q_i * k_j).sum(-1) /
sqrt(C))``, replayed by :func:`..shim.result_dtype`. Under CUDA autocast the ``sum`` and the
softmax's ``exp`` run in float32, so the aggregate and the returned attention weights are
float32 (as stock's); then ``lin_skip``, the ``lin_beta`` gate and the sums run as in stock,
giving stock's output dtype. Under CPU autocast (other op lists) the replay gives whatever
stock computes there.

Falls back (Unsupported) for: ``aggr`` other than sum, ``flow="target_to_source"``,
``edge_attr`` without ``edge_dim`` (stock adds the raw attributes to the values) or
``edge_dim`` without ``edge_attr`` (stock asserts), ``edge_attr`` not [M, edge_dim], x not
2-D, ``torch_sparse.SparseTensor`` and the graph inputs listed in :mod:`.graph`.
"""
from __future__ import annotations

import math

import torch

from gnn_fastpath import ops
from gnn_fastpath.ops.dispatch import require
from ..shim import Unsupported, out_dtype_of, result_dtype
from .graph import (attention_dropout, check_inputs, check_like, check_message_passing, graph_of, pair_features,
                    pyg_softmax, split_pair)

#: The tensor deciding device and dtype: ``x``, or ``x[0]`` of a pair.
features = pair_features


def _stock_dtypes(x: torch.Tensor):
    """(alpha, message) as stock's ``message`` types them."""
    alpha = pyg_softmax((x * x).sum(dim=-1) / math.sqrt(2.0))
    return alpha, x * alpha.view(-1, 1, 1)


def forward(module, backend: str, x, edge_index, edge_attr=None, return_attention_weights=None):
    """Fused ``TransformerConv.forward``: same arguments, same return value."""
    check_message_passing(module)
    x_src, x_dst = split_pair(x)
    if x_dst is None:
        x_dst = x_src
    check_inputs(module, x_src)
    graph = graph_of(edge_index, x_src.size(0), x_dst.size(0), x_src)
    if module.lin_edge is not None:
        if edge_attr is None:
            raise Unsupported("edge_attr", "edge_dim is set but edge_attr is None (stock asserts)")
        check_like("edge_attr", edge_attr, x_src)
        if edge_attr.dim() != 2 or edge_attr.size(0) != graph.num_edges:
            raise Unsupported("edge_attr", f"edge_attr of shape {tuple(edge_attr.shape)} "
                                           f"(expected [{graph.num_edges}, edge_dim])")
    elif edge_attr is not None:
        raise Unsupported("edge_attr", "edge_attr without edge_dim (stock adds it to the values unprojected)")
    p = attention_dropout(module)
    want_alpha = isinstance(return_attention_weights, bool)

    H, C = module.heads, module.out_channels
    require("dot_attention", x_src.device, x_src.dtype, graph, heads=(H, C))  # before any submodule runs
    query = module.lin_query(x_dst).view(-1, H, C)
    key = module.lin_key(x_src).view(-1, H, C)
    value = module.lin_value(x_src).view(-1, H, C)
    edge_term = None
    if module.lin_edge is not None:
        edge_term = module.lin_edge(edge_attr).view(-1, H, C)

    alpha_dtype, message_dtype = result_dtype(_stock_dtypes, query.device, query.dtype)
    out_dtype = out_dtype_of("TransformerConv", query.dtype, message_dtype)
    if alpha_dtype != out_dtype:
        raise Unsupported("dtype", f"stock's attention weights ({alpha_dtype}) and messages ({out_dtype}) differ")
    out = ops.dot_attention(graph, query, key, value, scale=1.0 / math.sqrt(C), edge_term=edge_term,
                            return_attention=want_alpha, dropout=p, out_dtype=out_dtype)
    if want_alpha:
        out, alpha = out
    module._alpha = None  # stock stores alpha during propagate and resets it after

    if module.concat:
        out = out.view(-1, H * C)
    else:
        out = out.mean(dim=1)

    if module.root_weight:
        x_r = module.lin_skip(x_dst)
        if module.lin_beta is not None:
            beta = module.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)).sigmoid()
            out = beta * x_r + (1 - beta) * out
        else:
            out = out + x_r

    if want_alpha:
        return out, (edge_index, alpha)
    return out

