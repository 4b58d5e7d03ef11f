"""GAT (additive) attention: the public op.

Layer -> op -> kernel: PyG and DGL ``GATConv`` call :func:`gat_attention`; the reference is
:func:`gnn_fastpath.reference.gat_attention`. The logit of GAT needs only one scalar per
(node, head) on each side (``score_src = a_src . W x_j``, ``score_dst = a_dst . W x_i``,
computed by the layer), so per edge the fused kernels read one scalar and the source row:
cheaper than GATv2, whose logit needs the whole [H, D] rows of both ends.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import reference
from ..reference._precision import check_out_dtype
from ._checks import (check_devices, check_graph, check_probability, check_real, check_return_attention,
                      check_tensor, graph_on)


def gat_attention(graph, x_src: Tensor, score_src: Tensor, score_dst: Tensor, edge_score: Optional[Tensor] = None,
                  negative_slope: float = 0.2, return_attention=False, dropout: float = 0.0,
                  edge_weight: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None):
    r"""GAT attention aggregated over each destination's in-edges.

    .. math::
        e_{ij} = \mathrm{LeakyReLU}\big(s_{j} + t_{i} + u_{ij}\big)_h,
        \qquad \alpha_{ij} = \mathrm{softmax}_{j \in \mathcal{N}(i)}(e_{ij}),
        \qquad o_i = \sum_{j \in \mathcal{N}(i)} w_{ij}\,\mathrm{drop}(\alpha_{ij})\, x^{src}_j

    per head ``h``, with ``s = score_src``, ``t = score_dst``, ``u = edge_score`` and
    ``w = edge_weight`` (1 when not given). Destinations without in-edges get ``o_i = 0``.

    Args:
        graph (Graph): the graph (any device; copied once to the features' device).
        x_src (Tensor): [N_src, H, D], source features (the values), of dtype T: float32,
            float16 or bfloat16 on the kernels (any floating dtype on the reference).
        score_src (Tensor): [N_src, H], per-source logit term (``(W x_j * a_src).sum(-1)``),
            any floating dtype.
        score_dst (Tensor): [N_dst, H], per-destination logit term, any floating dtype.
        edge_score (Tensor, optional): [M, H] in the caller's edge order, added to the logit
            (GAT's ``edge_dim`` term), any floating dtype.
        negative_slope (float): LeakyReLU slope, a finite real number.
        return_attention (bool or str): also return alpha [M, H] in the caller's edge order:
            ``True`` the softmax weights, ``"dropped"`` the weights the aggregation used
            (after attention dropout, times ``edge_weight``).
        dropout (float): attention dropout probability (inverted scaling); pass 0 in eval.
        edge_weight (Tensor, optional): [M] in the caller's edge order, scales each edge's
            attention after the softmax and dropout (DGL ``GATConv``'s ``edge_weight``).
        out_dtype (torch.dtype, optional): dtype of out and alpha: T (the default) or
            torch.float32. Arithmetic is float32 (float64 for float64 inputs).

    Returns:
        out [N_dst, H, D] (contiguous), or ``(out, alpha)`` when ``return_attention``, in
        ``out_dtype``. Gradients come back in each input's own dtype.
    """
    graph = check_graph(graph)
    check_devices(("x_src", x_src), ("score_src", score_src), ("score_dst", score_dst), ("edge_score", edge_score),
                  ("edge_weight", edge_weight))
    check_tensor("x_src", x_src, (graph.n_src, None, None))
    H = x_src.shape[1]
    check_tensor("score_src", score_src, (graph.n_src, H))
    check_tensor("score_dst", score_dst, (graph.n_dst, H))
    if edge_score is not None:
        check_tensor("edge_score", edge_score, (graph.num_edges, H))
    if edge_weight is not None:
        check_tensor("edge_weight", edge_weight, (graph.num_edges,))
    negative_slope = check_real("negative_slope", negative_slope)
    check_return_attention(return_attention)
    dropout = check_probability("dropout", dropout)
    out_dtype = check_out_dtype(out_dtype, x_src.dtype, "the features' dtype")
    graph = graph_on(graph, x_src)
    return reference.gat_attention(graph, x_src, score_src, score_dst, edge_score, negative_slope, return_attention,
                                   dropout, edge_weight, out_dtype=out_dtype)
