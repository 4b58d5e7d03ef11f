"""GATv2 attention on the fused CUDA kernels: the autograd op and its design.

Semantics are those of :func:`gnn_fastpath.reference.gatv2_attention`; kernels are in
``gnn_fastpath/cuda/gatv2_attention.cu``, launchers in :mod:`gnn_fastpath.cuda.gatv2`.

Design note
-----------
*Mapping.* One warp per work item (a destination row, or a chunk of a long row) and head
tile. A head's D columns are spread over LH lanes (a power of two), K vectors per lane:
for D = 32/64/128/256 the width is a template constant and rows are read with 16-byte
``float4`` loads (LH = 8/16/32/32, K = 1/1/1/2); any other D <= 512 takes the generic
scalar instantiation (LH = next power of two of D up to 32, K columns per lane, masked
tail), as does a specialised D whose rows are not 16-byte aligned. The warp's 32/LH lane
groups cover min(H, 32/LH) heads; when that is fewer groups than the warp has, the spare
groups become extra *edge slots* that walk interleaved edges of the same row (H=1, D=32
uses four slots) and are merged by shuffles at the end; when H exceeds it, the heads are
split into tiles, each its own warp. Per step a slot loads U (2-4) edges' rows before using
any (memory-level parallelism); the per-head logit is a shuffle sum over the head's lanes.
Each x_src row is gathered once per edge in the forward (the bandwidth floor), indices are
read 32 at a time coalesced and broadcast by shuffles, edge_term is read in place through
``perm``. Templates: ``<VW, LH, K, DC, U, has_edge_term>``, compiled per shape on first use
(CuPy ``name_expressions``).

*Forward.* Online softmax per (row, head) in registers: for each step of U logits the
running max m grows once, the accumulator and running sum are rescaled once. Output
out = acc / l; only the logsumexp L = m + log l [N_dst, H] is saved. With attention
dropout, the Philox multiplier ds(caller edge, head) (``gf_dropout_scale``; seed and offset
drawn on the host from torch's CPU generator) scales the accumulated weight but not the
softmax sum, so out = sum alpha ds x. When attention is returned, raw logits are written to
the [M, H] output in caller order and normalised in place by a small kernel once L is known.

*Load balance.* The work list (built once per graph on the GPU, cached in ``graph.memo``;
one host sync at build) gives every row one item, except rows longer than ``CHUNK`` (256)
edges, which become ceil(deg / CHUNK) chunk items. Chunks write their partial state
(acc [H, D], m [H], l [H]) to a workspace slot and a merge kernel combines them per row
(max, rescale, sum; parallel over chunks and column tiles); so a 100k-edge super node is
~400 warps, not one. Split-row chunks come first in the list and whole rows follow by
decreasing degree, so the longest work starts first and the tail is short. Grids
(``gnn_fastpath.cuda.gatv2._grid``): the forward and the source-major backward launch one
warp per work item when items are few (tolokers: 13k heavy items, balanced best by the
block scheduler) and otherwise a persistent grid of resident blocks whose warps stride
over the items (10-20% faster on arxiv-, roads- and pokec-like graphs: far fewer block
launches); the destination-major backward is always persistent. Dynamic fetching from an
atomic work counter was tried and dropped: no faster, more registers.

*Backward.* One destination-major pass recomputes z, e and alpha = exp(e - L) per edge:
G_i = <dO_i, O_i> (the FlashAttention Delta; it equals sum_j alpha_ij dalpha_ij also with
dropout, as O already carries ds), dalpha = ds <dO_i, x_j>, de = alpha (dalpha - G),
dz = de att LeakyReLU'(z). dx_dst accumulates in registers (atomics only for chunks of split
rows, whose rows are zeroed first), d edge_term is written at its caller position, datt is
summed in registers, then in shared memory per block, then one global atomic per block and
column (the persistent grid keeps those atomics few). For dx_src = sum_i (alpha ds dO_i +
dz_ij) there are two variants (``gnn_fastpath.cuda.gatv2.BWD_DX_SRC``, env
``GNN_FASTPATH_GATV2_BWD``): ``atomic`` (default) adds each edge's term with a float4
atomicAdd from the destination-major pass; ``transposed`` runs a second, source-major
pass over ``graph.source_csr()`` (int32 copies and its own work list cached per graph) that
recomputes alpha and dz from x_dst, dO, L and G (saved by the first pass) with no atomics
except for chunks of split source rows. Nothing of size [M, H] or [M, H, D] is allocated
except the requested outputs (alpha, d edge_term).

*Gradient through the returned attention.* Also supported: with a gradient gA on alpha,
dalpha gains gA (times ds for "dropped") and G gains sum_j alpha_out_ij gA_ij, computed by
one small pre-pass.

*Measured* (H200, H=2, D=64, op level incl. Python/CuPy launch overhead, median of 20;
numbers of the version with a one-warp-per-item forward grid; small graphs vary ~1.4x
between machines because the op is then bound by host launch overhead, ~80-200 us per
forward):
tolokers fwd 0.18 ms, fwd+bwd 0.66; arxiv-like 0.31 / 1.07; arxiv-skewdst 0.39 / 1.18;
roads-like 0.22 / 0.66; pokec-like 4.9 / 19.2 (floor ~4.2 ms for the forward's bytes). The
atomic dx_src variant beat the transposed one on all five graphs (pokec 19.2 vs 24.6 ms
fwd+bwd). On pokec the backward is DRAM-bound by the float4 atomic read-modify-write of an
836 MB dx_src plus the x_src gather (~3x the forward's bytes, matching ~2.9x its time).

Not covered (falls back to the reference): head width above 512, H*D >= 2**31, graphs with
2**31 edges or more.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import reference
from ..cuda import gatv2 as kernels
from ..graph import Graph
from ..graph.graph import INT32_MAX
from ._dropout import philox_seed


class GATv2AttentionFunction(torch.autograd.Function):
    """Fused GATv2 attention; see the module docstring.

    ``apply(x_src, x_dst, att, edge_term, graph, negative_slope, return_attention, dropout,
    seed, offset)``; returns ``out`` or ``(out, alpha)``.
    """

    @staticmethod
    def forward(ctx, x_src, x_dst, att, edge_term, graph, negative_slope, return_attention, dropout, seed, offset):
        x_src, x_dst, att = x_src.contiguous(), x_dst.contiguous(), att.contiguous()
        if edge_term is not None:
            edge_term = edge_term.contiguous()
        out, lse, alpha = kernels.forward(graph, x_src, x_dst, att, edge_term, negative_slope, dropout, seed,
                                          offset, return_attention)
        ctx.graph = graph
        ctx.slope = negative_slope
        ctx.dropout = dropout
        ctx.seed, ctx.offset = seed, offset
        ctx.return_attention = return_attention
        ctx.save_for_backward(x_src, x_dst, att, edge_term, out, lse, alpha)
        ctx.set_materialize_grads(False)
        if return_attention:
            return out, alpha
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        x_src, x_dst, att, edge_term, out, lse, alpha = ctx.saved_tensors
        g_out = grads[0]
        g_alpha = grads[1] if len(grads) > 1 else None
        needs = tuple(ctx.needs_input_grad[:4])
        none = (None,) * 6
        if (g_out is None and g_alpha is None) or not any(needs):
            return (None, None, None, None) + none
        g_out = torch.zeros_like(out) if g_out is None else g_out.contiguous()
        if g_alpha is not None:
            g_alpha = g_alpha.contiguous()
        dx_src, dx_dst, datt, det = kernels.backward(
            ctx.graph, x_src, x_dst, att, edge_term, out, lse, g_out, alpha, g_alpha,
            ctx.return_attention == "dropped", ctx.slope, ctx.dropout, ctx.seed, ctx.offset, needs)
        return (dx_src, dx_dst, datt, det) + none


def gatv2_attention_cuda(graph: Graph, x_src: Tensor, x_dst: Tensor, att: Tensor, negative_slope: float,
                         edge_term: Optional[Tensor], return_attention, dropout: float):
    """GATv2 attention on the CUDA kernels (arguments already checked by
    :func:`gnn_fastpath.ops.gatv2_attention`; graph on the features' device, fp32)."""
    H, D = x_src.shape[1], x_src.shape[2]
    if not kernels.supports(H, D) or graph.num_edges > INT32_MAX or max(graph.n_src, graph.n_dst) > INT32_MAX:
        return reference.gatv2_attention(graph, x_src, x_dst, att, negative_slope, edge_term, return_attention,
                                         dropout)
    seed, offset = philox_seed(dropout)
    return GATv2AttentionFunction.apply(x_src, x_dst, att, edge_term, graph, float(negative_slope),
                                        return_attention, float(dropout), seed, offset)
