"""GAT (additive) attention: the public op, its autograd Function, and the design of its kernels.

Layer -> op -> kernel: PyG and DGL ``GATConv`` call :func:`gat_attention`; its CUDA path is
:class:`GATAttentionFunction`, one call per pass into the launcher
:mod:`gnn_fastpath.cuda.gat_attention` (through :func:`_forward`/:func:`_backward`), whose
kernels are ``cuda/gat_attention.cu``; under ``torch.compile`` the same Function calls the
operators ``torch.ops.gnn_fastpath.gat_attention``/``gat_attention_backward``
(:mod:`.library`), whose implementations call the same two functions; the reference is
:func:`gnn_fastpath.reference.gat_attention`. The logit of GAT needs only one
scalar per (node, head) on each side (``score_src = a_src . W x_j``, ``score_dst = a_dst . W
x_i``, computed by the layer), so per edge the fused kernels read one scalar and the source
row: cheaper than GATv2, whose logit needs the whole [H, D] rows of both ends.

Design note
-----------
*Mapping.* The GATv2 family's (see :mod:`gnn_fastpath.ops.gatv2_attention`; the lane layout
``GfRow``/``gf_lane`` and the work list, grids and split-row accumulators are shared code in
``cuda/attention_common.cuh`` and :mod:`gnn_fastpath.cuda.row_attention`): one warp per work
item (a destination row, or a chunk of a long row) and head tile; a head's D columns over LH
lanes with 16-byte ``float4`` loads for D = 32/64/128/256 (16-bit rows: the float32 lane
layout with 8-byte loads by default, ``GNN_FASTPATH_VEC16=16`` for 16-byte ones), a generic
runtime-D instantiation for any other D <= 512; spare lane groups become edge slots that walk
interleaved edges of the row and are merged by shuffles; heads beyond one warp are tiles.
Templates ``<TI, TO, VW, LH, K, DC, U>``, compiled per shape and dtype on first use.

*Forward.* Per edge a lane reads the source row slice of its head and one float, s_j of its
head (the LH lanes of a head read one address: one transaction); t_i is read once per row,
u_ij (``edge_score``) and w_ij (``edge_weight``) in place through ``perm`` when given. So the
bytes per edge are the x_src row plus 4 per head (plus the index), against GATv2's extra
D-wide logit work and x_dst row: the logit is z = s_j + t_i + u_ij, e = LeakyReLU(z), with no
sum over the head's lanes. Online softmax per (row, head) in registers as GATv2 (U = 4 rows in
flight per step up to 8 floats per lane: a GAT lane holds no x_dst or att row); out = acc / l
and only the logsumexp L [N_dst, H] is saved. The edge weight and the Philox dropout
multiplier ds(caller edge, head) (``gf_dropout_scale``: GATv2's seed, offset and counter
convention) scale the accumulated weight but not the softmax sum, so out = sum alpha w ds x.
Each step's dropout multipliers are drawn once per (edge, head) by the warp's lanes together
and handed to the head's lanes by shuffles (``gf_step_dropout``), not by each of the LH lanes
of the head. With ``return_attention`` the raw logits go to the [M, H] output in caller order
and a small kernel turns them into alpha (times ds w for ``"dropped"``) once L is known.

*Load balance.* The degree-aware row-chunk work list (:mod:`gnn_fastpath.cuda.worklist`):
rows longer than 256 edges are split into chunks that write (acc, m, l) to workspace slots,
merged per row by the shared chunk-merge kernel; split chunks first, whole rows by decreasing
degree; the same cached list as GATv2's at its default chunk length. One warp per item, or a
persistent grid of resident blocks striding over the items when items are many.

*Backward.* alpha = exp(e - L) is recomputed per edge; with f = w ds and g = <dO_i, x_j>:
dalpha = f g (+ grad_alpha, times f for ``"dropped"``), delta_i = <dO_i, O_i> (+ sum_j
alpha_out grad_alpha: FlashAttention's Delta, exact with w and dropout as O carries them), de
= alpha (dalpha - delta), dz = de LeakyReLU'(z); d s_j = sum_i dz, d t_i = sum_j dz, d u = dz,
d w = sum_h ds alpha (g (+ grad_alpha for ``"dropped"``)), dx_src_j = sum_i f alpha dO_i. Two
variants (:func:`gnn_fastpath.cuda.gat_attention.backward_mode`):

- ``transposed`` (the rule's pick on graphs used again where destination rows are far longer
  than source rows, or 16-bit rows with few out-edges per source): a node-sized pass computes delta,
  then one source-major pass over ``graph.source_csr()`` (int32 copy and work list cached per
  graph) gathers dO_i with three floats L_i, delta_i, t_i per (edge, head): x_j and s_j are
  the row's own, so dx_src and d s_j sum in registers with no atomics (except chunks of split
  source rows), g is a shuffle sum over the head's lanes, and d t_i is a scalar atomic per
  (edge, head). One gathered row per edge in total: the backward's byte floor.
- ``atomic`` (the rule's pick otherwise, and always on sampled blocks: many sources, few edges
  each; no source CSR is built, so no sort and no synchronisation): one destination-major pass gathers x_j; d t_i sums in
  registers, d s_j by a scalar atomic and dx_src by float4 atomics per (edge, head).

Both write d u at its caller position and add d w (summed over the warp's heads by shuffles)
with one float atomic per (edge, head tile). Nothing of size [M, H] or [M, H, D] is allocated
except the requested outputs (alpha, d edge_score, d edge_weight [M]).

*Dtypes.* x_src has storage dtype T (float32, float16 or bfloat16); out and the returned alpha
are written in ``out_dtype`` (T or float32: a float32 result is never rounded through T).
score_src, score_dst, edge_score and edge_weight may each have their own floating dtype
(under autocast they may be float32 while x_src is bf16, or 16-bit themselves): the op reads
them as float32 (converting 16-bit ones, a node- or edge-sized cast) and returns their
gradients in their own dtypes (summed in float32, cast once). Every arithmetic operation and
accumulator is float32; lse, delta and the raw logits are float32; each value written in 16
bits is rounded once, to nearest even. dx_src comes back in T: the atomic variant adds into a
float32 [N_src, H, D] scratch cast once (16-bit atomics would round at every add), the
transposed one stores rows in T directly (float32 scratch only for split source rows). The
backward reads grad_out, the saved out and grad_alpha in ``out_dtype``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import reference
from ..graph import GraphTensors
from ..cuda import gat_attention as kernels
from ..reference._precision import check_out_dtype
from ._attention import as_float32, keep, outputs, philox_seed
from ._checks import (check_devices, check_graph, check_probability, check_real, check_return_attention,
                      check_tensor, graph_on)
from . import library
from .dispatch import CUDA, choose


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
    H, D = x_src.shape[1:]
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
    if isinstance(graph, GraphTensors):
        # the attention backward on a static graph walks destinations (atomic): no source-major CSR
        graph = graph.destination_major().with_geometry(kernels.static_geometry())
        return library.unpad_result(graph, GATAttentionFunction.apply(
            x_src, score_src, graph.pad(score_dst), edge_score, edge_weight, graph, negative_slope, return_attention,
            dropout, library.draw_rng(dropout, x_src), None, out_dtype))
    if choose("gat_attention", x_src.device, x_src.dtype, graph, heads=(H, D)) == CUDA:
        seed, offset = philox_seed(dropout)
        return GATAttentionFunction.apply(x_src, score_src, score_dst, edge_score, edge_weight, graph,
                                          negative_slope, return_attention, dropout, seed, offset, out_dtype)
    return reference.gat_attention(graph, x_src, score_src, score_dst, edge_score, negative_slope, return_attention,
                                   dropout, edge_weight, out_dtype=out_dtype)


class GATAttentionFunction(torch.autograd.Function):
    """Fused GAT attention (see the module docstring): saves ``lse`` [N_dst, H] and the
    inputs, recomputes alpha in the backward. The one autograd route, eager and compiled:
    on a Graph it calls :func:`_forward`/:func:`_backward`, on a GraphTensors the operators
    (which call them).

    ``apply(x_src, score_src, score_dst, edge_score, edge_weight, graph, negative_slope,
    return_attention, dropout, seed, offset, out_dtype=None)``; returns ``out`` or ``(out,
    alpha)`` in ``out_dtype`` (None: x_src's dtype). Dtypes as :func:`gat_attention`'s.
    ``seed``/``offset``: the Philox key as ints, or ``seed`` an int64 [2] rng tensor (read on
    the device) and ``offset`` None; on a GraphTensors, the rng tensor or None.
    """

    @staticmethod
    def forward(ctx, x_src, score_src, score_dst, edge_score, edge_weight, graph, negative_slope, return_attention,
                dropout, seed, offset, out_dtype=None):
        x_src = x_src.contiguous()  # saved as the kernels read it
        # the scalar inputs are saved as given (a 16-bit one is converted again in the
        # backward rather than kept as a float32 copy)
        scalars = (score_src, score_dst, edge_score, edge_weight)
        out, lse, alpha = library.attention_forward("gat_attention", _forward, graph, (x_src, *scalars), negative_slope,
                                                    dropout, seed, offset, return_attention, out_dtype)
        library.save(ctx, graph, x_src, *scalars, out, lse, alpha, library.rng_of(seed))
        ctx.negative_slope = negative_slope
        keep(ctx, dropout, seed, offset, return_attention)
        return outputs(out, alpha, return_attention)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_alpha=None):
        return library.attention_backward(ctx, "gat_attention", _backward, 5, ctx.negative_slope, grad_out, grad_alpha)


def _forward(graph, x_src, score_src, score_dst, edge_score, edge_weight, negative_slope, dropout, seed, offset,
             return_attention, out_dtype, use_reference=False):
    """(out, lse, alpha or None) on ``graph``: the launcher, with x_src contiguous and the
    scalar inputs as float32; ``use_reference``: the reference op instead (the CPU operator;
    its dropout mask from torch's CPU generator seeded by the rng tensor ``seed``; lse is
    zeros, as its backward recomputes)."""
    if use_reference:
        with torch.no_grad(), library.fixed_rng(seed):  # an operator's output records no autograd
            result = reference.gat_attention(graph, x_src, score_src, score_dst, edge_score, negative_slope,
                                             return_attention, dropout, edge_weight, out_dtype=out_dtype)
        out, alpha = result if return_attention else (result, None)
        return out, torch.zeros(graph.n_dst, x_src.shape[1], dtype=torch.float32), alpha
    return kernels.forward(graph, x_src.contiguous(), *(as_float32(t) for t in (
        score_src, score_dst, edge_score, edge_weight)), negative_slope, dropout, seed, offset, return_attention,
        out_dtype)


def _backward(graph, x_src, score_src, score_dst, edge_score, edge_weight, out, lse, grad_out, alpha, grad_alpha,
              negative_slope, dropout, seed, offset, return_attention, needs, use_reference=False):
    """(dx_src, d score_src, d score_dst, d edge_score, d edge_weight), None where ``needs``
    is False; each in its input's dtype. ``use_reference``: by autograd through the reference
    op recomputed with the forward's mask."""
    scalars = (score_src, score_dst, edge_score, edge_weight)
    if use_reference:
        def run(x, s, t, u, w):
            with library.fixed_rng(seed):
                r = reference.gat_attention(graph, x, s, t, u, negative_slope, return_attention, dropout, w,
                                            out_dtype=out.dtype)
            return r if return_attention else (r,)

        grads = (grad_out, grad_alpha) if return_attention else (grad_out,)
        return library.reference_grads(run, (x_src,) + scalars, needs, grads)
    dx_src, *scalar_grads = kernels.backward(
        graph, x_src.contiguous(), *(as_float32(t) for t in scalars), out, lse, grad_out, alpha, grad_alpha,
        return_attention == "dropped", negative_slope, dropout, seed, offset, tuple(needs))
    # summed in float32, cast once to each tensor's own dtype
    return [dx_src] + [None if g is None else g.to(t.dtype) for g, t in zip(scalar_grads, scalars)]


library.implement("gat_attention", _forward, _backward)
