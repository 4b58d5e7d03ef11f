"""Graph attention in plain PyTorch: the CPU path and the oracle for the CUDA kernels.

Both ops gather per-edge rows in destination-major CSR order, compute a logit per (edge,
head), normalise it with a per-destination softmax and sum the weighted messages. They
materialise [M, H, D] tensors: that is what the fused kernels exist to avoid.
"""
from __future__ import annotations

import math
from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from ..graph import Graph
from ._precision import compute_dtype, no_autocast
from ._segment import attention_dropout, segment_softmax, segment_sum


def _to_caller_order(graph: Graph, csr_values: Tensor) -> Tensor:
    out = csr_values.new_empty(csr_values.shape)
    out[graph.perm] = csr_values
    return out


def _finish(graph: Graph, alpha: Tensor, messages: Tensor, dropout: float, return_attention, out_dtype,
            edge_weight: Optional[Tensor] = None):
    """out (and alpha in caller order when asked for) from the softmax weights, in ``out_dtype``.

    ``edge_weight`` [M] (CSR order) scales the weights after dropout; ``"dropped"`` returns
    the weights the aggregation used (dropout and edge weight applied)."""
    dropped = attention_dropout(alpha, dropout)
    if edge_weight is not None:
        dropped = dropped * edge_weight.unsqueeze(-1)
    out = segment_sum(dropped.unsqueeze(-1) * messages, graph.dst_index(), graph.n_dst).to(out_dtype)
    if not return_attention:
        return out
    weights = dropped if return_attention == "dropped" else alpha
    return out, _to_caller_order(graph, weights).to(out_dtype)


def gatv2_attention(graph: Graph, x_src: Tensor, x_dst: Tensor, att: Tensor, negative_slope: float = 0.2,
                    edge_term: Optional[Tensor] = None, return_attention=False, dropout: float = 0.0,
                    out_dtype=None):
    """Reference GATv2 attention; see :func:`gnn_fastpath.ops.gatv2_attention`.

    Any floating dtypes: computed in float32 for 16-bit features (as the kernels do), else in
    the features' dtype, promoted with att's (a float32 ``att`` of bf16 features stays
    float32), with autocast off; out and alpha come back in ``out_dtype`` (default x_src's
    dtype), gradients in each input's own dtype (through the casts).
    """
    out_dtype = out_dtype or x_src.dtype
    compute = compute_dtype(x_src.dtype, att.dtype)
    x_src, x_dst, att = x_src.to(compute), x_dst.to(compute), att.to(compute)
    edge_term = edge_term.to(compute) if edge_term is not None else None
    # an ambient autocast must not change what the reference computes (contract of the ops)
    with no_autocast(x_src.device):
        src, dst = graph.indices, graph.dst_index()
        xj = x_src[src]
        z = xj + x_dst[dst]
        if edge_term is not None:
            z = z + edge_term[graph.perm]
        logits = (F.leaky_relu(z, negative_slope) * att).sum(-1)
        alpha = segment_softmax(logits, dst, graph.n_dst)
        return _finish(graph, alpha, xj, dropout, return_attention, out_dtype)


def gat_attention(graph: Graph, x_src: Tensor, score_src: Tensor, score_dst: Tensor,
                  edge_score: Optional[Tensor] = None, negative_slope: float = 0.2, return_attention=False,
                  dropout: float = 0.0, edge_weight: Optional[Tensor] = None, out_dtype=None):
    """Reference GAT (additive) attention; see :func:`gnn_fastpath.ops.gat_attention`.

    Any floating dtypes: computed in float32 for 16-bit features (as the kernels do), else in
    the features' dtype promoted with the scores' and the edge weight's, with autocast off;
    out and alpha come back in ``out_dtype`` (default x_src's dtype), gradients in each
    input's own dtype (through the casts).
    """
    out_dtype = out_dtype or x_src.dtype
    extra = [t.dtype for t in (score_src, score_dst, edge_score, edge_weight) if t is not None]
    compute = compute_dtype(x_src.dtype, *extra)
    x_src, score_src, score_dst = x_src.to(compute), score_src.to(compute), score_dst.to(compute)
    # an ambient autocast must not change what the reference computes (contract of the ops)
    with no_autocast(x_src.device):
        src, dst = graph.indices, graph.dst_index()
        z = score_src[src] + score_dst[dst]
        if edge_score is not None:
            z = z + edge_score.to(compute)[graph.perm]
        alpha = segment_softmax(F.leaky_relu(z, negative_slope), dst, graph.n_dst)
        weight = edge_weight.to(compute)[graph.perm] if edge_weight is not None else None
        return _finish(graph, alpha, x_src[src], dropout, return_attention, out_dtype, weight)


def dot_attention(graph: Graph, q: Tensor, k: Tensor, v: Tensor, scale: Optional[float] = None,
                  edge_term: Optional[Tensor] = None, return_attention=False, dropout: float = 0.0,
                  out_dtype=None):
    """Reference dot-product attention; see :func:`gnn_fastpath.ops.dot_attention`.

    Any floating dtype: 16-bit inputs are computed in float32 (as the kernels do), others in
    their own dtype, with autocast off; out and alpha come back in ``out_dtype`` (default
    q's dtype), gradients in the inputs' dtypes.
    """
    if scale is None:
        scale = 1.0 / math.sqrt(q.size(-1))
    out_dtype = out_dtype or q.dtype
    compute = compute_dtype(q.dtype)
    q, k, v = q.to(compute), k.to(compute), v.to(compute)
    edge_term = edge_term.to(compute) if edge_term is not None else None
    # an ambient autocast must not change what the reference computes (contract of the ops)
    with no_autocast(q.device):
        src, dst = graph.indices, graph.dst_index()
        kj, vj = k[src], v[src]
        if edge_term is not None:
            e = edge_term[graph.perm]
            kj, vj = kj + e, vj + e
        logits = (q[dst] * kj).sum(-1) * scale
        alpha = segment_softmax(logits, dst, graph.n_dst)
        return _finish(graph, alpha, vj, dropout, return_attention, out_dtype)
