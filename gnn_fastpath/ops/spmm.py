"""Sparse-dense product (GCN / DGL GraphConv / SAGE mean): the public op and its autograd
Function.

Layer -> op -> kernel: DGL ``GraphConv``, PyG ``GCNConv`` and ``SAGEConv`` (mean/sum) call
:func:`spmm`; its CUDA path is :class:`SpmmFunction`, one call per pass into the launcher
:mod:`gnn_fastpath.cuda.spmm` (cached cuSPARSE SpMM timed against the own kernels of
``cuda/spmm.cu``); the reference is :func:`gnn_fastpath.reference.spmm`.

Dtypes (the reduced-precision contract): ``x`` float32, float16 or bfloat16 is read as it
is; ``edge_weight`` may have another floating dtype (a float32 parameter with bf16
features under autocast) and is read as float32; the normalised edge values stay float32 in
the own kernel (cuSPARSE multiplies with a cached copy in x's dtype, as its SpMM needs A and
B of one type). The result is written directly in ``out_dtype``; every product and sum is
float32. Gradients: dY arrives in ``out_dtype``, dX = A^T dY comes back in x's dtype, and the
edge-weight SDDMM runs in float32 and comes back in the weight's dtype. Partial sums of long
rows merged with atomics go to float32 memory and are cast once (adding into 16-bit memory
would round at every atomic).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import reference
from ..graph import GraphTensors
from ..cuda import spmm as kernels
from ._checks import check_choice, check_features, check_graph, graph_on, row_width
from . import library
from .dispatch import CUDA, CUDA_DTYPES, choose

NORMS = ("none", "left", "right", "both")


def spmm(graph, x: Tensor, edge_weight: Optional[Tensor] = None, norm: str = "none",
         out_dtype: Optional[torch.dtype] = None) -> Tensor:
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
        edge_weight (Tensor, optional): [M] in the caller's edge order, any floating dtype;
            differentiable (its gradient comes back in its dtype).
        norm (str): ``"none"``, ``"left"``, ``"right"`` or ``"both"``.
        out_dtype (torch.dtype, optional): dtype of the result: ``x.dtype`` or
            ``torch.float32`` (anything else is a ValueError). Default: torch's dtype of
            ``edge_weight * x`` (``promote_types``), ``x.dtype`` without weights. A float32
            result of 16-bit inputs is never rounded to 16 bits.

    Returns:
        [N_dst, F] (same trailing shape as ``x``) in ``out_dtype``.
    """
    graph = check_graph(graph)
    check_features(graph, x, edge_weight)
    check_choice("norm", norm, NORMS)
    out_dtype = reference.aggregation.spmm_out_dtype(x, edge_weight, out_dtype)
    graph = graph_on(graph, x)
    if isinstance(graph, GraphTensors):
        return library.spmm(graph, x, edge_weight, norm, out_dtype)
    # a result the kernels cannot store (float64 from a float64 weight) runs the reference
    if choose("spmm", x.device, x.dtype if out_dtype in CUDA_DTYPES else out_dtype, graph) == CUDA:
        return SpmmFunction.apply(x, edge_weight, graph, norm, out_dtype)
    return reference.spmm(graph, x, edge_weight, norm, out_dtype)


class SpmmFunction(torch.autograd.Function):
    """Fused SpMM; ``apply(x, edge_weight, graph, norm, out_dtype=None)`` (``out_dtype`` None:
    x's dtype). Only the gradients autograd asks for are computed: dX = A^T dY (in x's
    dtype), and dw = the SDDMM of dY and X (in the weight's dtype)."""

    @staticmethod
    def forward(ctx, x: Tensor, edge_weight: Optional[Tensor], graph, norm: str,
                out_dtype: Optional[torch.dtype] = None):
        x2 = x.reshape(graph.n_src, row_width(x)).contiguous()
        # allocated in its final shape so the op returns a fresh tensor, not a view
        out = torch.empty((graph.n_dst,) + tuple(x.shape[1:]), dtype=out_dtype or x2.dtype, device=x2.device)
        entry = kernels.forward(graph, x2, edge_weight, norm, out.view(graph.n_dst, x2.size(1)))
        ctx.graph, ctx.entry, ctx.norm, ctx.x_shape = graph, entry, norm, x.shape
        ctx.x_dtype, ctx.out_dtype = x.dtype, out.dtype
        ctx.w_dtype = None if edge_weight is None else edge_weight.dtype
        ctx.save_for_backward(x2 if ctx.needs_input_grad[1] else None)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        (x2,) = ctx.saved_tensors
        graph = ctx.graph
        grad_out = grad_out.reshape(graph.n_dst, row_width(grad_out)).to(ctx.out_dtype).contiguous()
        dx, dw = kernels.backward(graph, ctx.entry, ctx.norm, x2, grad_out, ctx.needs_input_grad[0],
                                  ctx.needs_input_grad[1], ctx.x_dtype)
        if dx is not None:
            dx = dx.view(ctx.x_shape)
        if dw is not None:
            dw = dw.to(ctx.w_dtype)
        return dx, dw, None, None, None
