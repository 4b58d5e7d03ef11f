"""Sparse-dense product (GCN / DGL GraphConv / SAGE mean): the public op and its autograd
Function.

Layer -> op -> kernel: DGL ``GraphConv``, PyG ``GCNConv`` and ``SAGEConv`` (mean/sum) call
:func:`spmm`; its CUDA path is :class:`SpmmFunction`, one call per pass into the launcher
:mod:`gnn_fastpath.cuda.spmm` (cached cuSPARSE SpMM timed against the own kernels of
``cuda/spmm.cu``) through :func:`_forward`/:func:`_backward`; under ``torch.compile`` the same
Function calls the operators ``torch.ops.gnn_fastpath.spmm``/``spmm_backward``
(:mod:`.library`), whose implementations call the same two functions; the reference is
:func:`gnn_fastpath.reference.spmm`.

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
from ._checks import as_rows, check_choice, check_features, check_graph, fresh_rows, graph_on
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
        graph = graph.with_source_major().with_geometry(kernels.static_geometry())  # the backward walks sources
        return _on_graph_tensors(graph, x, edge_weight, norm, out_dtype)
    # a result the kernels cannot store (float64 from a float64 weight) runs the reference
    if choose("spmm", x.device, x.dtype if out_dtype in CUDA_DTYPES else out_dtype, graph) == CUDA:
        return SpmmFunction.apply(x, edge_weight, graph, norm, out_dtype)
    return reference.spmm(graph, x, edge_weight, norm, out_dtype)


def _on_graph_tensors(graph: GraphTensors, x, edge_weight, norm, out_dtype):
    """:func:`spmm` on a GraphTensors (the operators).

    With an extra row of removed edges, the source scale of ``"left"``/``"both"`` (out-degrees)
    must not count them, which the operator (to which the extra row is an ordinary row)
    cannot know: the source scale is applied here to ``x`` instead, from the out-degrees of
    the edges in real rows, and the operator runs the destination scale alone."""
    if graph.extra_row and norm in ("left", "both"):
        exact = torch.promote_types(x.dtype, torch.float32)
        real = (torch.arange(graph.num_edges, device=graph.device) < graph.indptr[graph.n_dst]).to(exact)
        deg = torch.zeros(graph.n_src, dtype=exact, device=graph.device).index_add_(
            0, graph.indices.to(torch.int64), real).clamp_(min=1)
        x = (x * _column(deg.reciprocal() if norm == "left" else deg.rsqrt(), x)).to(x.dtype)
        out = graph.unpad(SpmmFunction.apply(x, edge_weight, graph, "none", out_dtype))
        if norm == "left":
            return out
        in_deg = graph.in_degree().to(exact).clamp_(min=1)
        return (out * _column(in_deg.rsqrt(), out)).to(out.dtype)
    return graph.unpad(SpmmFunction.apply(x, edge_weight, graph, norm, out_dtype))


def _column(t: Tensor, like: Tensor) -> Tensor:
    """``t`` [N] viewed to broadcast against ``like`` [N, ...]."""
    return t.view((-1,) + (1,) * (like.dim() - 1))


class SpmmFunction(torch.autograd.Function):
    """Fused SpMM; ``apply(x, edge_weight, graph, norm, out_dtype=None)`` (``out_dtype`` None:
    x's dtype). Only the gradients autograd asks for are computed: dX = A^T dY (in x's
    dtype), and dw = the SDDMM of dY and X (in the weight's dtype). The one autograd route,
    eager and compiled: on a Graph it calls :func:`_forward`/:func:`_backward` (the backward
    reuses the forward's normalised-values entry), on a GraphTensors the operators (which
    call them)."""

    @staticmethod
    def forward(ctx, x: Tensor, edge_weight: Optional[Tensor], graph, norm: str,
                out_dtype: Optional[torch.dtype] = None):
        out_dtype = out_dtype or x.dtype
        on_operators = isinstance(graph, GraphTensors)
        if on_operators:
            out, ctx.entry = library.op("spmm")(*graph.operands, x, edge_weight, norm, out_dtype), None
        else:
            out, ctx.entry = _forward(graph, x, edge_weight, norm, out_dtype)
        ctx.norm, ctx.x_dtype, ctx.out_dtype = norm, x.dtype, out_dtype
        # x is read only for the edge-weight gradient (kept alive otherwise for nothing); the
        # operators take the weights themselves (an eager backward has them in ctx.entry)
        library.save(ctx, graph, x if ctx.needs_input_grad[1] else None, edge_weight if on_operators else None)
        ctx.w_dtype = None if edge_weight is None else edge_weight.dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        graph, (x, edge_weight) = library.saved(ctx)
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_out = grad_out.to(ctx.out_dtype).contiguous()
        if ctx.on_operators:
            dx, dw = library.present(library.op("spmm_backward")(
                *graph.operands, x, edge_weight, ctx.norm, grad_out, ctx.x_dtype, need_x, need_w), (need_x, need_w))
        else:
            dx, dw = _backward(graph, x, None, ctx.norm, grad_out, ctx.x_dtype, need_x, need_w, entry=ctx.entry,
                               w_dtype=ctx.w_dtype)
        return dx, dw, None, None, None


def _forward(graph, x, edge_weight, norm, out_dtype, use_reference=False):
    """(out in ``out_dtype``, the launcher's normalised-values entry) on ``graph``;
    ``use_reference``: the reference op instead (the CPU operator; entry None)."""
    if use_reference:
        with torch.no_grad():  # an operator's output records no autograd
            return reference.spmm(graph, x, edge_weight, norm, out_dtype), None
    x2 = as_rows(x, graph.n_src)
    out, out2 = fresh_rows(graph.n_dst, x, out_dtype)
    return out, kernels.forward(graph, x2, edge_weight, norm, out2)


def _backward(graph, x, edge_weight, norm, grad_out, x_dtype, need_x, need_w, entry=None, w_dtype=None,
              use_reference=False):
    """(dx in ``x_dtype`` or None, dw in the weight's dtype (``w_dtype``, default
    edge_weight's) or None). ``x`` is read for dw alone (None otherwise); ``entry``: the
    forward's normalised values (None: looked up from ``edge_weight``). ``use_reference``: by
    autograd through the reference op."""
    dx_shape = (graph.n_src,) + tuple(grad_out.shape[1:])
    if use_reference:
        if x is None:  # the reference's backward of x alone does not read x's values
            x = grad_out.new_zeros(dx_shape, dtype=x_dtype)

        def run(x_, w):
            return (reference.spmm(graph, x_, w, norm, grad_out.dtype),)

        return library.reference_grads(run, (x, edge_weight), (need_x, need_w), (grad_out,))
    if entry is None:
        entry = kernels.cache_of(graph).values(norm, edge_weight)
    x2 = None if x is None else as_rows(x, graph.n_src)
    dx, dw = kernels.backward(graph, entry, norm, x2, as_rows(grad_out, graph.n_dst), need_x, need_w, x_dtype)
    if dx is not None and grad_out.dim() != 2:
        dx = dx.view(dx_shape)
    return dx, None if dw is None else dw.to(w_dtype or edge_weight.dtype)


library.implement("spmm", _forward, _backward)
