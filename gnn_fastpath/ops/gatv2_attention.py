"""GATv2 attention: the public op, its autograd Function, and the design of its kernels.

Layer -> op -> kernel: PyG and DGL ``GATv2Conv`` call :func:`gatv2_attention`; its CUDA
path is :class:`GATv2AttentionFunction`, one call per pass into the launcher
:mod:`gnn_fastpath.cuda.gatv2_attention` (through :func:`_forward`/:func:`_backward`), whose
kernels are ``cuda/gatv2_attention.cu``; under ``torch.compile`` the same Function calls the
operators ``torch.ops.gnn_fastpath.gatv2_attention``/``gatv2_attention_backward``
(:mod:`.library`), whose implementations call the same two functions; the reference is :func:`gnn_fastpath.reference.gatv2_attention`.

Design note
-----------
*Mapping.* One warp per work item (a destination row, or a chunk of a long row) and head
tile. A head's D columns are spread over LH lanes (a power of two), K vectors per lane:
for D = 32/64/128/256 the width is a template constant and rows are read with 16-byte
``float4`` loads (LH = 8/16/32/32, K = 1/1/1/2); any other D <= 512 takes the generic
scalar instantiation (LH = next power of two of D up to 32, K columns per lane, masked
tail), as does a specialised D whose rows are not 16-byte aligned. 16-bit features use
16-byte vectors of 8 elements (LH = 4/8/16/32, K = 1: half the lanes per head, so a warp
covers twice the heads or edge slots with the same registers per lane); a D that is not
specialised, or rows not 16-byte aligned, take the generic instantiation with the widest of
8/4/2/1-element vectors (16/8/4/2 bytes) that D and the alignment allow. The warp's 32/LH lane
groups cover min(H, 32/LH) heads; when that is fewer groups than the warp has, the spare
groups become extra *edge slots* that walk interleaved edges of the same row (H=1, D=32
uses four slots) and are merged by shuffles at the end; when H exceeds it, the heads are
split into tiles, each its own warp. Per step a slot loads U (2-4) edges' rows before using
any (memory-level parallelism); the per-head logit is a shuffle sum over the head's lanes.
Each x_src row is gathered once per edge in the forward (the bandwidth floor), indices are
read 32 at a time coalesced and broadcast by shuffles, edge_term is read in place through
``perm``. Templates: ``<TI, TO, VW, LH, K, DC, U, has_edge_term>`` (storage types: see
*Dtypes* below), compiled per shape and dtype on first use (CuPy ``name_expressions``).

*Forward.* Online softmax per (row, head) in registers: for each step of U logits the
running max m grows once, the accumulator and running sum are rescaled once. Output out =
acc / l; only the logsumexp L = m + log l [N_dst, H] is saved. With attention dropout, the
Philox multiplier ds(caller edge, head) (``gf_dropout_scale``; seed and offset drawn on the
host from torch's CPU generator) scales the accumulated weight but not the softmax sum, so
out = sum alpha ds x. When attention is returned, raw logits are written to the [M, H]
output in caller order and normalised in place by a small kernel once L is known.

*Load balance.* The row-chunk work list (:mod:`gnn_fastpath.cuda.worklist`, built once per
graph on the GPU, one host sync at build) gives every row one item, except rows longer than
``GNN_FASTPATH_GATV2_CHUNK`` (256) edges, which become ceil(deg / chunk) chunk items. Chunks
write their partial state (acc [H, D], m [H], l [H]) to a workspace slot and a merge kernel
combines them per row (max, rescale, sum; parallel over chunks and column tiles); so a
100k-edge super node is ~400 warps, not one. Split-row chunks come first in the list and
whole rows follow by decreasing degree, so the longest work starts first and the tail is
short. Grids (``gnn_fastpath.cuda.gatv2_attention._grid``): the forward and the source-major
backward launch one warp per work item when items are few (few heavy items are balanced
best by the block scheduler) and otherwise a persistent grid of resident blocks
whose warps stride over the items (on graphs with many rows: far fewer block launches); the
destination-major backward is always persistent. No dynamic fetching from an atomic work
counter: it gains nothing over the static order and costs registers.

*Backward.* One destination-major pass recomputes z, e and alpha = exp(e - L) per edge:
delta_i = <dO_i, O_i> (FlashAttention's Delta; it equals sum_j alpha_ij dalpha_ij also with
dropout, as O already carries ds), dalpha = ds <dO_i, x_j>, de = alpha (dalpha - delta), dz
= de att LeakyReLU'(z). dx_dst accumulates in registers (atomics only for chunks of split
rows, whose rows are zeroed first), d_edge_term is written at its caller position, datt is
summed in registers, then in shared memory per block, then one global atomic per block and
column (the persistent grid keeps those atomics few). For dx_src = sum_i (alpha ds dO_i +
dz_ij) there are three variants (``GNN_FASTPATH_GATV2_BWD``; empty: the rule,
:func:`gnn_fastpath.cuda.gatv2_attention.backward_mode`: ``atomic``, except ``fused`` for
16-bit rows on an undirected graph of at most 4 in-edges per node that outlived a training
step; or on a graph used again with tuning on, the fastest for its size class by measurement):
``atomic`` adds each edge's term with a float4 atomicAdd from the destination-major pass;
``transposed`` runs a second, source-major pass over ``graph.source_csr()`` (int32 copies
and its own work list cached per graph; the forward CSR itself on an undirected graph) that
recomputes alpha and dz from x_dst, dO, L and delta (saved by the first pass) with no
atomics except for chunks of split source rows; ``fused``, on an undirected graph (symmetry
known or detected once the graph outlived a step; elsewhere it runs ``transposed``), takes
both gradients of each node in one pass over the forward CSR: row i's in-edges k -> i,
reversed, are its out-edges i -> k, so per edge it gathers x_src[k], x_dst[k] and dO_k once
and computes the edge k -> i (dx_dst_i, datt, d edge_term) and the edge i -> k (dx_src_i,
with L_k and delta_k from a small delta pre-pass; the reverse edge's caller id, for its edge
term, dropout mask and grad_alpha, is cached per graph). Nothing of size [M, H] or [M, H, D]
is allocated except the requested outputs (alpha, d edge_term) and, for ``fused``, the
[M] int32 reverse ids.

*Gradient through the returned attention.* Also supported: with a gradient grad_alpha on
alpha, dalpha gains grad_alpha (times ds for "dropped") and delta gains delta_alpha_i =
sum_j alpha_out_ij grad_alpha_ij, computed by one small pre-pass.

*Dtypes (reduced precision).* The features x_src, x_dst, edge_term share one storage dtype
T (float32, float16 or bfloat16: template type TI of the kernels); ``att`` may have its own
floating dtype (under autocast it stays a float32 parameter) and is read as float32 (the op
converts the [H, D] tensor). out and the returned alpha are written in ``out_dtype`` (TO: T
or float32), so a float32 result of 16-bit inputs is never rounded to T. Every arithmetic
operation and accumulator is float32: logits, the online-softmax state, the weighted sums,
the dot products of the backward, every gradient sum; the saved lse and delta and the raw
logits behind alpha are float32. Each value written in 16 bits is rounded once, to nearest
even. The backward reads grad_out, the saved out and grad_alpha in out_dtype. Gradients
come back in the dtype of their tensor: dx_src, dx_dst and d_edge_term in T, datt in att's
dtype. Where the backward adds with atomics (dx_src in the ``atomic`` variant, chunks of
split rows for dx_dst and, ``transposed``, dx_src; datt) it adds into float32 buffers and
casts once at the end: atomics on 16-bit memory would round the running sum at every add
(a row of a 100k-edge super node would lose all precision; packed bf16x2/half2 atomics
round the same way), while the float32 scratch costs one [N, H, D] float32 buffer (dx_src,
atomic variant; for split rows only [n_split, H, D]) and one cast. Rows without split chunks
store their gradient straight in T. 16-bit rows are read with 16-byte vectors (8 elements
per lane; 8/4/2-byte vectors or scalars where D or the alignment do not allow it).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import reference
from ..graph import GraphTensors
from ..cuda import gatv2_attention as kernels
from ..reference._precision import check_out_dtype
from ._checks import (check_devices, check_graph, check_probability, check_real, check_return_attention,
                      check_tensor, graph_on)
from ._attention import as_float32, keep, outputs, philox_seed
from . import library
from .dispatch import CUDA, choose


def gatv2_attention(graph, x_src: Tensor, x_dst: Tensor, att: Tensor, negative_slope: float = 0.2,
                    edge_term: Optional[Tensor] = None, return_attention=False, dropout: float = 0.0,
                    out_dtype: Optional[torch.dtype] = None):
    r"""GATv2 attention aggregated over each destination's in-edges.

    .. math::
        e_{ij} = \sum_d a_{h,d}\,\mathrm{LeakyReLU}\big(x^{src}_{j} + x^{dst}_{i} + t_{ij}\big)_{h,d},
        \qquad \alpha_{ij} = \mathrm{softmax}_{j \in \mathcal{N}(i)}(e_{ij}),
        \qquad o_i = \sum_{j \in \mathcal{N}(i)} \alpha_{ij}\, x^{src}_j

    per head ``h``. Destinations without in-edges get ``o_i = 0``.

    Args:
        graph (Graph): the graph (any device; copied once to the features' device).
            The tensor arguments must all be on one device.
        x_src (Tensor): [N_src, H, D], source features (values and left logit term), of
            dtype T: float32, float16 or bfloat16 on the kernels (any floating dtype on the
            reference; float64 runs the reference).
        x_dst (Tensor): [N_dst, H, D], destination features (right logit term), dtype T.
        att (Tensor): [H, D], attention vector, any floating dtype (read as float32 by the
            kernels; its gradient comes back in its own dtype).
        negative_slope (float): LeakyReLU slope, a finite real number.
        edge_term (Tensor, optional): [M, H, D] in the caller's edge order, added inside the
            LeakyReLU (GATv2 ``lin_edge(edge_attr)``), dtype T.
        return_attention (bool or str): also return alpha [M, H] in the caller's edge order:
            ``True`` the softmax weights, ``"dropped"`` the weights after attention dropout.
        dropout (float): attention dropout probability (inverted scaling); pass 0 in eval.
        out_dtype (torch.dtype, optional): dtype of out and alpha: T (the default) or
            torch.float32 (written directly by the kernels, never rounded through T).
            Arithmetic is float32 either way (float64 for float64 inputs).

    Returns:
        out [N_dst, H, D] (contiguous), or ``(out, alpha)`` when ``return_attention``, in
        ``out_dtype``. Gradients: x_src, x_dst, edge_term in T, att in att's dtype.
    """
    graph = check_graph(graph)
    check_devices(("x_src", x_src), ("x_dst", x_dst), ("att", att), ("edge_term", edge_term))
    check_tensor("x_src", x_src, (graph.n_src, None, None))
    H, D = x_src.shape[1:]
    check_tensor("x_dst", x_dst, (graph.n_dst, H, D), like=x_src)
    check_tensor("att", att, (H, D))  # a parameter: its own floating dtype
    if edge_term is not None:
        check_tensor("edge_term", edge_term, (graph.num_edges, H, D), like=x_src)
    negative_slope = check_real("negative_slope", negative_slope)
    check_return_attention(return_attention)
    dropout = check_probability("dropout", dropout)
    out_dtype = check_out_dtype(out_dtype, x_src.dtype, "the features' dtype")
    graph = graph_on(graph, x_src)
    if isinstance(graph, GraphTensors):
        # the attention backward on a static graph walks destinations (atomic): no source-major CSR
        graph = graph.destination_major().with_geometry(kernels.static_geometry())
        return library.unpad_result(graph, GATv2AttentionFunction.apply(
            x_src, graph.pad(x_dst), att, edge_term, graph, negative_slope, return_attention, dropout,
            library.draw_rng(dropout, x_src), None, out_dtype))
    if choose("gatv2_attention", x_src.device, x_src.dtype, graph, heads=(H, D)) == CUDA:
        seed, offset = philox_seed(dropout)
        return GATv2AttentionFunction.apply(x_src, x_dst, att, edge_term, graph, negative_slope,
                                            return_attention, dropout, seed, offset, out_dtype)
    return reference.gatv2_attention(graph, x_src, x_dst, att, negative_slope, edge_term, return_attention, dropout,
                                     out_dtype=out_dtype)


class GATv2AttentionFunction(torch.autograd.Function):
    """Fused GATv2 attention (see the module docstring): saves ``lse`` [N_dst, H] and the
    inputs, recomputes alpha in the backward. The one autograd route, eager and compiled:
    on a Graph it calls :func:`_forward`/:func:`_backward`, on a GraphTensors the operators
    (which call them).

    ``apply(x_src, x_dst, att, edge_term, graph, negative_slope, return_attention, dropout,
    seed, offset, out_dtype=None)``; returns ``out`` or ``(out, alpha)`` in ``out_dtype``
    (None: x_src's dtype). Dtypes as :func:`gatv2_attention`'s. ``seed``/``offset``: the
    Philox key as ints, or ``seed`` an int64 [2] rng tensor and ``offset`` None; on a
    GraphTensors, the rng tensor or None.
    """

    @staticmethod
    def forward(ctx, x_src, x_dst, att, edge_term, graph, negative_slope, return_attention, dropout, seed, offset,
                out_dtype=None):
        # saved as the kernels read them (att, [H, D], is converted to float32 again in the backward)
        x_src, x_dst = x_src.contiguous(), x_dst.contiguous()
        edge_term = None if edge_term is None else edge_term.contiguous()
        out, lse, alpha = library.attention_forward("gatv2_attention", _forward, graph, (x_src, x_dst, att, edge_term),
                                                    negative_slope, dropout, seed, offset, return_attention, out_dtype)
        library.save(ctx, graph, x_src, x_dst, att, edge_term, out, lse, alpha, library.rng_of(seed))
        ctx.negative_slope = negative_slope
        keep(ctx, dropout, seed, offset, return_attention)
        return outputs(out, alpha, return_attention)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_alpha=None):
        return library.attention_backward(ctx, "gatv2_attention", _backward, 4, ctx.negative_slope, grad_out, grad_alpha)


def _forward(graph, x_src, x_dst, att, edge_term, negative_slope, dropout, seed, offset, return_attention, out_dtype,
             use_reference=False):
    """(out, lse, alpha or None) on ``graph``: the launcher, with the rows contiguous and att
    as float32; ``use_reference``: the reference op instead (the CPU operator; its dropout
    mask from torch's CPU generator seeded by the rng tensor ``seed``; lse is zeros, as its
    backward recomputes)."""
    if use_reference:
        with torch.no_grad(), library.fixed_rng(seed):  # an operator's output records no autograd
            result = reference.gatv2_attention(graph, x_src, x_dst, att, negative_slope, edge_term, return_attention,
                                               dropout, out_dtype=out_dtype)
        out, alpha = result if return_attention else (result, None)
        return out, torch.zeros(graph.n_dst, x_src.shape[1], dtype=torch.float32), alpha
    et = None if edge_term is None else edge_term.contiguous()
    return kernels.forward(graph, x_src.contiguous(), x_dst.contiguous(), as_float32(att), et, negative_slope,
                           dropout, seed, offset, return_attention, out_dtype)


def _backward(graph, x_src, x_dst, att, edge_term, out, lse, grad_out, alpha, grad_alpha, negative_slope, dropout,
              seed, offset, return_attention, needs, use_reference=False):
    """(dx_src, dx_dst, datt, d edge_term), None where ``needs`` is False; datt in att's dtype,
    the others in T. ``use_reference``: by autograd through the reference op recomputed with
    the forward's mask."""
    if use_reference:
        def run(xs, xd, a, et):
            with library.fixed_rng(seed):
                r = reference.gatv2_attention(graph, xs, xd, a, negative_slope, et, return_attention, dropout,
                                              out_dtype=out.dtype)
            return r if return_attention else (r,)

        grads = (grad_out, grad_alpha) if return_attention else (grad_out,)
        return library.reference_grads(run, (x_src, x_dst, att, edge_term), needs, grads)
    et = None if edge_term is None else edge_term.contiguous()
    dx_src, dx_dst, datt, d_edge_term = kernels.backward(
        graph, x_src.contiguous(), x_dst.contiguous(), as_float32(att), et, out, lse, grad_out, alpha, grad_alpha,
        return_attention == "dropped", negative_slope, dropout, seed, offset, tuple(needs))
    # datt summed in float32, cast once
    return [dx_src, dx_dst, None if datt is None else datt.to(att.dtype), d_edge_term]


library.implement("gatv2_attention", _forward, _backward)
