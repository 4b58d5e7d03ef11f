"""PyG ``GATv2Conv`` on :func:`gnn_fastpath.gatv2_attention`.

Reproduces ``torch_geometric.nn.conv.GATv2Conv.forward`` (PyG 2.8) step by step: ``res``,
``lin_l`` and ``lin_r`` called as submodules in stock's order (``lin_r`` is ``lin_l`` under
``share_weights``; a homogeneous input then projects once), stock's self-loop handling
(every existing loop removed, ``(i, i)`` appended for ``i < min(N_src, N_dst)``, loop edge
attributes from ``fill_value``: ``None``, a number, a tensor, or a reduction of the kept
edges' attributes by target such as ``"mean"``), ``lin_edge`` on the (looped) edge
attributes, one fused op for the logits, softmax, attention dropout and aggregation, then
concat or head mean, residual and bias.

The looped graph is built once per input graph and memoised on it (see :mod:`.graph`);
only the loop edge attributes are computed per call, as they depend on ``edge_attr``.

``return_attention_weights`` (truthy, as stock checks it) returns
``(out, (edge_index, alpha))`` where ``edge_index`` includes the added loops exactly as
stock builds it, and alpha is the attention *after* dropout: stock's ``edge_update``
applies dropout before returning alpha, so that is what stock returns (the issue text says
so too). For a torch.sparse adjacency (without added loops) stock returns
``(out, (adj_with_alpha_values, alpha))``; so does this.

What differs from stock: attention dropout with p > 0 in training draws its own random
numbers (same keep probability 1 - p and scale 1 / (1 - p)); stock and fused agree exactly
at p = 0 and in eval mode.

Reduced precision (see :mod:`..shim`): the op gets stock's projections as they come (bf16
or fp16 from ``lin_l``/``lin_r``/``lin_edge`` under autocast, the module dtype in a half
module) and ``att`` in its own dtype; its ``out_dtype`` is the dtype of stock's messages
``x_j * softmax((leaky_relu(x_i + x_j [+ e]) * att).sum(-1))``, replayed by
:func:`..shim.result_dtype`. Under CUDA autocast that is float32 (float32 ``att`` promotes
the logits, and the softmax's ``exp`` runs in float32), so the output and the returned
attention weights are float32, as stock's; in a half module everything stays in its dtype.

Falls back (Unsupported) for: ``aggr`` other than sum, ``flow="target_to_source"``, a
torch.sparse adjacency with ``add_self_loops=True`` (stock rebuilds and coalesces the
adjacency, merging duplicate edges), ``edge_attr`` without ``edge_dim`` (stock asserts), a
string ``fill_value`` that is not a PyG reduction or whose reduction stock cannot index
(kept edges target a node >= min(N_src, N_dst)), ``x_dst = None``, x not 2-D, and the
graph inputs listed in :mod:`.graph`.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from gnn_fastpath import ops
from gnn_fastpath.ops.dispatch import require
from ..shim import Unsupported, finite_number
from .graph import (attention_dropout, attention_out_dtype, attention_result, attention_self_loops, check_inputs,
                    check_like, check_message_passing, check_return_attention, graph_of, looped_edge_attr,
                    looped_needs_exact_graph, pair_features, pyg_softmax, split_pair)

#: The tensor deciding device and dtype: ``x``, or ``x[0]`` of a pair.
features = pair_features

def _stock_dtypes(x: Tensor, att: Tensor):
    """(alpha, message) as stock's ``edge_update`` and ``message`` type them."""
    logits = (F.leaky_relu(x + x) * att).sum(dim=-1)
    alpha = pyg_softmax(logits)
    return alpha, x * alpha.unsqueeze(-1)


def forward(module, backend: str, x, edge_index, edge_attr=None, return_attention_weights=None):
    """Fused ``GATv2Conv.forward``: same arguments, same return value."""
    check_message_passing(module)
    x_src, x_dst = split_pair(x)
    check_inputs(module, x_src)
    check_return_attention(return_attention_weights, module)
    n_src = x_src.size(0)
    n_dst = n_src if x_dst is None else x_dst.size(0)
    base = graph_of(edge_index, n_src, n_dst, x_src,
                    static=not looped_needs_exact_graph(module, return_attention_weights, edge_attr))
    if edge_attr is not None:
        if module.lin_edge is None:
            raise Unsupported("edge_attr", "edge_attr without edge_dim (stock asserts)")
        check_like("edge_attr", edge_attr, x_src)
        if edge_attr.dim() not in (1, 2) or edge_attr.size(0) != base.num_edges:
            raise Unsupported("edge_attr", f"edge_attr of shape {tuple(edge_attr.shape)} "
                                           f"(expected [{base.num_edges}] or [{base.num_edges}, edge_dim])")
    graph, looped = attention_self_loops(module, edge_index, base, edge_attr, lambda: min(n_src, n_dst))
    p = attention_dropout(module)
    slope = finite_number("negative_slope", module.negative_slope)

    H, C = module.heads, module.out_channels
    require("gatv2_attention", x_src.device, x_src.dtype, graph, heads=(H, C))  # before any submodule runs
    res = None
    if x_dst is None:
        if module.res is not None:
            res = module.res(x_src)
        x_l = module.lin_l(x_src).view(-1, H, C)
        x_r = x_l if module.share_weights else module.lin_r(x_src).view(-1, H, C)
    else:
        if module.res is not None:
            res = module.res(x_dst)
        x_l = module.lin_l(x_src).view(-1, H, C)
        x_r = module.lin_r(x_dst).view(-1, H, C)

    edge_term = None
    if edge_attr is not None:
        if looped is not None:
            edge_attr = looped_edge_attr(module.fill_value, edge_attr, looped)
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        edge_term = module.lin_edge(edge_attr).view(-1, H, C)

    out_dtype = attention_out_dtype("GATv2Conv", _stock_dtypes, x_l, module.att.dtype)
    # Stock returns alpha after dropout ("dropped"): its edge_update applies the dropout.
    out = ops.gatv2_attention(graph, x_l, x_r, module.att.view(H, C), negative_slope=slope,
                              edge_term=edge_term, dropout=p, out_dtype=out_dtype,
                              return_attention="dropped" if return_attention_weights else False)
    return attention_result(module, out, res, edge_index, looped, return_attention_weights)
