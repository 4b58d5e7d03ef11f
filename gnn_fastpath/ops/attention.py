"""Graph attention ops: GATv2 and dot-product (Graph Transformer) attention.

Each op checks its arguments, puts the graph on the features' device, and runs the fused
CUDA kernels when they serve the input (see :mod:`._dispatch`), else the reference.
"""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from .. import reference
from ._checks import check_graph, check_probability, check_tensor, graph_on
from ._dispatch import CUDA, backend_for, register_cuda

register_cuda("gatv2_attention")

register_cuda("dot_attention")


def _check_return_attention(value) -> None:
    if not (value is False or value is True or value == "dropped"):
        raise ValueError(f"return_attention must be False, True or 'dropped', got {value!r}")


def gatv2_attention(graph, x_src: Tensor, x_dst: Tensor, att: Tensor, negative_slope: float = 0.2,
                    edge_term: Optional[Tensor] = None, return_attention=False, dropout: float = 0.0):
    r"""GATv2 attention aggregated over each destination's in-edges.

    .. math::
        e_{ij} = \sum_d a_{h,d}\,\mathrm{LeakyReLU}\big(x^{src}_{j} + x^{dst}_{i} + t_{ij}\big)_{h,d},
        \qquad \alpha_{ij} = \mathrm{softmax}_{j \in \mathcal{N}(i)}(e_{ij}),
        \qquad o_i = \sum_{j \in \mathcal{N}(i)} \alpha_{ij}\, x^{src}_j

    per head ``h``. Destinations without in-edges get ``o_i = 0``.

    Args:
        graph (Graph): the graph (any device; copied once to the features' device).
        x_src (Tensor): [N_src, H, D], source features (values and left logit term).
        x_dst (Tensor): [N_dst, H, D], destination features (right logit term).
        att (Tensor): [H, D], attention vector.
        negative_slope (float): LeakyReLU slope.
        edge_term (Tensor, optional): [M, H, D] in the caller's edge order, added inside the
            LeakyReLU (GATv2 ``lin_edge(edge_attr)``).
        return_attention (bool or str): also return alpha [M, H] in the caller's edge order:
            ``True`` the softmax weights, ``"dropped"`` the weights after attention dropout.
        dropout (float): attention dropout probability (inverted scaling); pass 0 in eval.

    Returns:
        out [N_dst, H, D] (contiguous), or ``(out, alpha)`` when ``return_attention``.
    """
    graph = check_graph(graph)
    check_tensor("x_src", x_src, (graph.n_src, None, None))
    H, D = x_src.shape[1:]
    check_tensor("x_dst", x_dst, (graph.n_dst, H, D), like=x_src)
    check_tensor("att", att, (H, D), like=x_src)
    if edge_term is not None:
        check_tensor("edge_term", edge_term, (graph.num_edges, H, D), like=x_src)
    _check_return_attention(return_attention)
    dropout = check_probability("dropout", dropout)
    graph = graph_on(graph, x_src)
    if backend_for("gatv2_attention", x_src) == CUDA:
        from .cuda_gatv2 import gatv2_attention_cuda

        return gatv2_attention_cuda(graph, x_src, x_dst, att, negative_slope, edge_term, return_attention, dropout)
    return reference.gatv2_attention(graph, x_src, x_dst, att, negative_slope, edge_term, return_attention, dropout)


def dot_attention(graph, q: Tensor, k: Tensor, v: Tensor, scale: Optional[float] = None,
                  edge_term: Optional[Tensor] = None, return_attention=False, dropout: float = 0.0):
    r"""Dot-product (Graph Transformer) attention over each destination's in-edges.

    .. math::
        e_{ij} = s\,\langle q_i,\; k_j + t_{ij} \rangle,
        \qquad \alpha_{ij} = \mathrm{softmax}_{j \in \mathcal{N}(i)}(e_{ij}),
        \qquad o_i = \sum_{j \in \mathcal{N}(i)} \alpha_{ij}\,(v_j + t_{ij})

    per head (PyG ``TransformerConv`` semantics). Destinations without in-edges get 0.

    Args:
        graph (Graph): the graph.
        q (Tensor): [N_dst, H, D] queries.
        k (Tensor): [N_src, H, D] keys.
        v (Tensor): [N_src, H, D] values.
        scale (float, optional): logit scale ``s``; default ``1 / sqrt(D)``.
        edge_term (Tensor, optional): [M, H, D] in the caller's edge order, added to keys and
            values (``lin_edge(edge_attr)``).
        return_attention (bool or str): also return alpha [M, H] in caller edge order
            (``True``: softmax weights; ``"dropped"``: after attention dropout).
        dropout (float): attention dropout probability.

    Returns:
        out [N_dst, H, D], or ``(out, alpha)`` when ``return_attention``.
    """
    graph = check_graph(graph)
    check_tensor("k", k, (graph.n_src, None, None))
    H, D = k.shape[1:]
    check_tensor("q", q, (graph.n_dst, H, D), like=k)
    check_tensor("v", v, (graph.n_src, H, D), like=k)
    if edge_term is not None:
        check_tensor("edge_term", edge_term, (graph.num_edges, H, D), like=k)
    _check_return_attention(return_attention)
    dropout = check_probability("dropout", dropout)
    graph = graph_on(graph, k)
    if backend_for("dot_attention", k) == CUDA:
        from .cuda_dot import dot_attention_cuda

        return dot_attention_cuda(graph, q, k, v, scale, edge_term, return_attention, dropout)
    return reference.dot_attention(graph, q, k, v, scale, edge_term, return_attention, dropout)
