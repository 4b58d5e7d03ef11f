"""Sparse-dense product (GCN / DGL GraphConv / SAGE mean): the public op and its autograd
Function.

Layer -> op -> kernel: DGL ``GraphConv``, PyG ``GCNConv`` and ``SAGEConv`` (mean/sum) call
:func:`spmm`; its CUDA path is :class:`SpmmFunction`, one call per pass into the launcher
:mod:`gnn_fastpath.cuda.spmm` (cached cuSPARSE SpMM timed against the own kernels of
``cuda/spmm.cu``); the reference is :func:`gnn_fastpath.reference.spmm`.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import reference
from ..cuda import spmm as kernels
from ._checks import check_choice, check_features, check_graph, graph_on, row_width
from .dispatch import CUDA, choose

NORMS = ("none", "left", "right", "both")


def spmm(graph, x: Tensor, edge_weight: Optional[Tensor] = None, norm: str = "none") -> Tensor:
    r"""Sum of (weighted, normalised) source features over each destination's in-edges.

    .. math::
        o_i = c^{dst}_i \sum_{j \in \mathcal{N}(i)} w_{ij}\, c^{src}_j\, x_j

    with DGL ``GraphConv`` normalisation: ``norm="none"``: ``c = 1``; ``"left"``:
    ``c^{src}_j = 1/\deg^{out}_j``; ``"right"``: ``c^{dst}_i = 1/\deg^{in}_i``; ``"both"``:
    ``c^{src}_j = \deg^{out}_j{}^{-1/2}``, ``c^{dst}_i = \deg^{in}_i{}^{-1/2}``. Degrees are
    structural (edge counts, clamped to >= 1); edge weights do not enter them.

    Args:
        graph (Graph): the graph.
        x (Tensor): [N_src, F] (or [N_src, *]) source features.
        edge_weight (Tensor, optional): [M] in the caller's edge order; differentiable.
        norm (str): ``"none"``, ``"left"``, ``"right"`` or ``"both"``.

    Returns:
        [N_dst, F] (same trailing shape as ``x``).
    """
    graph = check_graph(graph)
    check_features(graph, x, edge_weight)
    check_choice("norm", norm, NORMS)
    graph = graph_on(graph, x)
    if choose("spmm", x.device, x.dtype, graph) == CUDA:
        return SpmmFunction.apply(x, edge_weight, graph, norm)
    return reference.spmm(graph, x, edge_weight, norm)


class SpmmFunction(torch.autograd.Function):
    """Fused SpMM; ``apply(x, edge_weight, graph, norm)``. Only the gradients autograd asks
    for are computed: dX = A^T dY, and dw = the SDDMM of dY and X."""

    @staticmethod
    def forward(ctx, x: Tensor, edge_weight: Optional[Tensor], graph, norm: str):
        x2 = x.reshape(graph.n_src, row_width(x)).contiguous()
        # allocated in its final shape so the op returns a fresh tensor, not a view
        out = torch.empty((graph.n_dst,) + tuple(x.shape[1:]), dtype=x2.dtype, device=x2.device)
        entry = kernels.forward(graph, x2, edge_weight, norm, out.view(graph.n_dst, x2.size(1)))
        ctx.graph, ctx.entry, ctx.norm, ctx.x_shape = graph, entry, norm, x.shape
        ctx.save_for_backward(x2 if ctx.needs_input_grad[1] else None)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        (x2,) = ctx.saved_tensors
        graph = ctx.graph
        grad_out = grad_out.reshape(graph.n_dst, row_width(grad_out)).contiguous()
        dx, dw = kernels.backward(graph, ctx.entry, ctx.norm, x2, grad_out, ctx.needs_input_grad[0],
                                  ctx.needs_input_grad[1])
        if dx is not None:
            dx = dx.view(ctx.x_shape)
        return dx, dw, None, None
