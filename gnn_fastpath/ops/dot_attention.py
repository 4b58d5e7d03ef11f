"""Dot-product (Graph Transformer) attention: the public op, its autograd Function, and the
design of its kernels.

Layer -> op -> kernel: PyG ``TransformerConv`` calls :func:`dot_attention`; its CUDA path is
:class:`DotAttentionFunction`, one call per pass into the launcher
:mod:`gnn_fastpath.cuda.dot_attention` (through :func:`_forward`/:func:`_backward`), whose
kernels are ``cuda/dot_attention.cu``; under ``torch.compile`` the same Function calls the
operators ``torch.ops.gnn_fastpath.dot_attention``/``dot_attention_backward`` (:mod:`.library`),
whose implementations call the same two functions; the reference is :func:`gnn_fastpath.reference.dot_attention`.

Design
------
- Forward: one streaming pass per (destination, head group) with the online softmax state
  of ``attention_common.cuh`` (running max m, running sum l, accumulator rescaled when m
  grows); q_i stays in registers, rows are read as float4 by a group of LPH lanes (LPH =
  D/4 up to 32; a warp holds 32/LPH such groups of ONE destination, each with NH heads, so
  every shuffle is warp-uniform). Edges are consumed in batches whose rows are gathered
  together; rows read or written once (q, edge terms, out) carry cache-streaming hints.
  Only the logsumexp ``lse`` [N_dst, H] is saved. No [M, H] or [M, H, D] tensor exists
  unless the attention is requested: then the forward writes raw logits into the [M, H]
  output (caller order) and a small kernel turns them into exp(e - lse) (times the dropout
  multiplier for "dropped").
- Super nodes: rows longer than ``CHUNK_EDGES`` (256) edges are cut into chunks of the
  row-chunk work list (:mod:`gnn_fastpath.cuda.worklist`), one warp each, writing partial
  (m, l, acc) states merged by a second kernel.
- Backward (destination pass): recomputes alpha = exp(e - lse), delta_i = <O_i, dO_i> (O
  is the dropped output when dropout is on, so delta = sum_j alpha_ij dalpha_ij holds), and
  de_ij = alpha_ij (s_ij <dO_i, v_j + t_ij> - delta_i); dq accumulates in registers (split
  rows: partials summed by a second kernel), d_edge_term_ij = alpha_ij s_ij dO_i +
  scale de_ij q_i is written once per edge in caller order. dk, dv need per-source sums,
  two ways (``GNN_FASTPATH_DOT_BWD``):

  * ``atomic`` (default when sources have < 4 out-edges on average): float4 atomics
    (sm_90) along the in-edges inside the same pass; dk, dv are zero-filled first;
  * ``transposed`` (default otherwise, where atomics would contend): the destination pass writes
    delta [N_dst, H]; a source-major pass over ``graph.kernel_source_csr()`` keeps k_j, v_j
    and the dk_j, dv_j sums in registers: no atomics and no zero-fill, but it gathers q_i,
    dO_i (and the edge term) per edge again.

- Tensor cores (:mod:`gnn_fastpath.cuda.block_attention`, ``block_attention.cu``): for 16-bit
  q, k, v without edge term or returned attention (dropout: the same Philox multipliers, on a
  graph without parallel edges), on a graph that outlived a training step, both passes can run FlashAttention-style on the graph's block-sparse layout (windows of
  16 destinations x 16 sources, ``mma.sync`` with float32 accumulators, weights and their
  gradients split hi + lo so that results are rounded once as here); it saves the same ``lse``
  (and computes the same ``delta``), so either backward follows either forward. Chosen by the
  tuner, or by the rule wherever offered (``GNN_FASTPATH_DOT_FWD`` / ``_DOT_BWD`` force it).
  A float32 grad_out (``out_dtype=torch.float32``) enters its backward's products rounded
  once to bfloat16: one more rounding of the gradients, which are returned in bfloat16 anyway
  (float16 with float32 results takes the CSR backward: the rounded grad_out could leave
  float16's range). In float16, de, which the products take as two float16 parts, is divided
  per row by a power of two that keeps it in float16's range (multiplied back at the store),
  so a GradScaler-scaled gradient runs there too.
- Dropout: inverted dropout on alpha, multiplier from Philox keyed by (seed, offset, caller
  edge id, head); seed and offset come from torch's CPU generator (no GPU sync) and are kept
  in ctx, so the backward regenerates the forward's mask exactly.
- Gradient through the returned attention A (alpha or alpha * s): with
  delta_alpha_i = sum_j A_ij grad_alpha_ij (one small kernel), dalpha gains grad_alpha (or
  s grad_alpha) and delta gains delta_alpha.
- Any H >= 1; D specialised at compile time (exact templates for D = 8, 16, 32, 64, 128,
  256, 512 when rows are 16-byte aligned) and a masked generic variant for other D up to
  512 (float4 when D % 4 == 0 and aligned, else scalar loads). Each template instantiation
  is its own small module, compiled on first use. Wider heads fall back (reason
  ``kernel_limit``).
- Tuning: heads per lane group NH=2 in the forward on graphs of mean in-degree < 16, else 1
  (``MAX_ROW_FLOATS*`` in the launcher); registers capped at 80 per thread
  (``__launch_bounds__(DOT_THREADS, 3)``); batch depth 4 edges for D <= 128
  (``DOT_EDGE_FLOATS``).
- Reduced precision: the kernels are templated on the storage type TI of q, k, v, edge_term
  (float32, float16, bfloat16) and TO of out and alpha (TI or float32, ``out_dtype``). Rows
  are read as TI with 16-byte vector loads (8 halves per lane access when rows are aligned),
  converted to float32 in registers; logits, the online-softmax state, the accumulators and
  the saved ``lse`` / ``delta`` are float32, and out / alpha are rounded to TO once when
  written (raw logits for a 16-bit alpha go to a float32 [M, H] buffer first). So the only
  rounding errors beyond float32 arithmetic are the final roundings to TO and, in the
  backward, that out and grad_out are read in TO. Gradients come back in TI: dq and
  d_edge_term are summed in registers (split rows: float32 partials) and rounded once; dk and
  dv either likewise (transposed pass) or, in the atomic mode, summed by float32 atomics into
  zeroed float32 buffers and cast to TI once at the end: atomics straight into 16-bit memory
  (or packed half2 / bf16x2 atomics) would round the running sum at every addition, an error
  growing with the source's out-degree, and bf16 has only 8 significant bits.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import reference
from ..graph import GraphTensors
from ..cuda import dot_attention as kernels
from ..reference._precision import check_out_dtype
from ._checks import (check_devices, check_graph, check_probability, check_real, check_return_attention,
                      check_tensor, graph_on)
from ._attention import keep, outputs, philox_seed
from . import library
from .dispatch import CUDA, choose


def dot_attention(graph, q: Tensor, k: Tensor, v: Tensor, scale: Optional[float] = None,
                  edge_term: Optional[Tensor] = None, return_attention=False, dropout: float = 0.0,
                  out_dtype: Optional[torch.dtype] = None):
    r"""Dot-product (Graph Transformer) attention over each destination's in-edges.

    .. math::
        e_{ij} = s\,\langle q_i,\; k_j + t_{ij} \rangle,
        \qquad \alpha_{ij} = \mathrm{softmax}_{j \in \mathcal{N}(i)}(e_{ij}),
        \qquad o_i = \sum_{j \in \mathcal{N}(i)} \alpha_{ij}\,(v_j + t_{ij})

    per head (PyG ``TransformerConv`` semantics). Destinations without in-edges get 0.

    Dtypes: q, k, v and edge_term share one floating dtype T. float32, float16 and bfloat16
    run the fused kernels on CUDA: values are stored in T, but every logit, softmax statistic,
    sum and gradient sum is computed in float32, and the results are rounded once to
    ``out_dtype`` (gradients to T). Other dtypes (float64) run the reference, in that dtype.
    The reference computes 16-bit inputs in float32 too. An ambient ``torch.autocast``
    changes neither backend.

    Args:
        graph (Graph): the graph (any device; copied once to the features' device).
            The tensor arguments must all be on one device.
        q (Tensor): [N_dst, H, D] queries.
        k (Tensor): [N_src, H, D] keys.
        v (Tensor): [N_src, H, D] values.
        scale (float, optional): logit scale ``s``, a finite real number; default (None)
            ``1 / sqrt(D)``.
        edge_term (Tensor, optional): [M, H, D] in the caller's edge order, added to keys and
            values (``lin_edge(edge_attr)``).
        return_attention (bool or str): also return alpha [M, H] in caller edge order
            (``True``: softmax weights; ``"dropped"``: after attention dropout).
        dropout (float): attention dropout probability.
        out_dtype (torch.dtype, optional): dtype of out and alpha: T (the default, None) or
            torch.float32 (a float32 result of 16-bit inputs, never rounded to 16 bits).

    Returns:
        out [N_dst, H, D], or ``(out, alpha)`` when ``return_attention``, both in
        ``out_dtype``. Gradients flow back in T (grad_out arrives in ``out_dtype``).
    """
    graph = check_graph(graph)
    check_devices(("q", q), ("k", k), ("v", v), ("edge_term", edge_term))
    check_tensor("k", k, (graph.n_src, None, None))
    H, D = k.shape[1:]
    check_tensor("q", q, (graph.n_dst, H, D), like=k)
    check_tensor("v", v, (graph.n_src, H, D), like=k)
    if edge_term is not None:
        check_tensor("edge_term", edge_term, (graph.num_edges, H, D), like=k)
    scale = check_real("scale", scale, allow_none=True)
    check_return_attention(return_attention)
    dropout = check_probability("dropout", dropout)
    out_dtype = check_out_dtype(out_dtype, k.dtype, "the inputs' dtype")
    graph = graph_on(graph, k)
    if isinstance(graph, GraphTensors):
        scale = 1.0 / math.sqrt(D) if scale is None else scale
        # the attention backward on a static graph walks destinations (atomic): no source-major CSR
        graph = graph.destination_major().with_geometry(kernels.static_geometry())
        return library.unpad_result(graph, DotAttentionFunction.apply(
            graph.pad(q), k, v, edge_term, graph, scale, return_attention, dropout, library.draw_rng(dropout, k),
            None, out_dtype))
    if choose("dot_attention", k.device, k.dtype, graph, heads=(H, D)) == CUDA:
        scale = 1.0 / math.sqrt(D) if scale is None else scale
        seed, offset = philox_seed(dropout)
        return DotAttentionFunction.apply(q, k, v, edge_term, graph, scale, return_attention, dropout, seed, offset,
                                          out_dtype)
    return reference.dot_attention(graph, q, k, v, scale, edge_term, return_attention, dropout, out_dtype)


class DotAttentionFunction(torch.autograd.Function):
    """Fused dot-product attention (see the module docstring): saves ``lse`` [N_dst, H]
    (float32) and the inputs, recomputes alpha in the backward. The one autograd route,
    eager and compiled: on a Graph it calls :func:`_forward`/:func:`_backward`, on a
    GraphTensors the operators (which call them).

    ``apply(q, k, v, edge_term, graph, scale, return_attention, dropout, seed, offset,
    out_dtype=None)`` (q, k, v, edge_term of one dtype T in float32, float16, bfloat16 on the
    kernels; ``out_dtype`` T, float32 or None for T); returns ``out`` or ``(out, alpha)`` in
    ``out_dtype``; the gradients are in T. ``seed``/``offset``: the Philox key as ints, or
    ``seed`` an int64 [2] rng tensor and ``offset`` None; on a GraphTensors, the rng tensor
    or None.
    """

    @staticmethod
    def forward(ctx, q, k, v, edge_term, graph, scale: float, return_attention, dropout: float, seed, offset,
                out_dtype: Optional[torch.dtype] = None):
        # saved as the kernels read them
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        edge_term = None if edge_term is None else edge_term.contiguous()
        out, lse, alpha = library.attention_forward("dot_attention", _forward, graph, (q, k, v, edge_term), scale,
                                                    dropout, seed, offset, return_attention, out_dtype)
        library.save(ctx, graph, q, k, v, edge_term, out, lse, alpha, library.rng_of(seed))
        ctx.scale = scale
        keep(ctx, dropout, seed, offset, return_attention)
        return outputs(out, alpha, return_attention)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_alpha=None):
        return library.attention_backward(ctx, "dot_attention", _backward, 4, ctx.scale, grad_out, grad_alpha)


def _forward(graph, q, k, v, edge_term, scale, dropout, seed, offset, return_attention, out_dtype,
             use_reference=False):
    """(out, lse, alpha or None) on ``graph``: the launcher, with the rows contiguous;
    ``use_reference``: the reference op instead (the CPU operator; its dropout mask from
    torch's CPU generator seeded by the rng tensor ``seed``; lse is zeros, as its backward
    recomputes)."""
    if use_reference:
        with torch.no_grad(), library.fixed_rng(seed):  # an operator's output records no autograd
            result = reference.dot_attention(graph, q, k, v, scale, edge_term, return_attention, dropout, out_dtype)
        out, alpha = result if return_attention else (result, None)
        return out, torch.zeros(graph.n_dst, k.shape[1], dtype=torch.float32), alpha
    et = None if edge_term is None else edge_term.contiguous()
    return kernels.forward(graph, q.contiguous(), k.contiguous(), v.contiguous(), et, scale, dropout, seed, offset,
                           return_attention, out_dtype)


def _backward(graph, q, k, v, edge_term, out, lse, grad_out, alpha, grad_alpha, scale, dropout, seed, offset,
              return_attention, needs, use_reference=False):
    """(dq, dk, dv, d edge_term) in T, None where ``needs`` is False. ``use_reference``: by
    autograd through the reference op recomputed with the forward's mask."""
    if use_reference:
        def run(q_, k_, v_, et):
            with library.fixed_rng(seed):
                r = reference.dot_attention(graph, q_, k_, v_, scale, et, return_attention, dropout, out.dtype)
            return r if return_attention else (r,)

        grads = (grad_out, grad_alpha) if return_attention else (grad_out,)
        return library.reference_grads(run, (q, k, v, edge_term), needs, grads)
    et = None if edge_term is None else edge_term.contiguous()
    grads = kernels.backward(graph, q.contiguous(), k.contiguous(), v.contiguous(), et, out, lse, grad_out, alpha,
                             grad_alpha, return_attention == "dropped", scale, dropout, seed, offset,
                             need_d_edge_term=bool(needs[3]))
    return [g if n else None for g, n in zip(grads, needs)]


library.implement("dot_attention", _forward, _backward)
