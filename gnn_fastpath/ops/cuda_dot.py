"""Dot-product (Graph Transformer) attention on the fused CUDA kernels.

Design (kernels in ``cuda/dot_attention.cu``, launchers in ``cuda/dot.py``):

- Forward: one streaming pass per (destination, head group) with an online softmax
  (running max m, running sum l, accumulator rescaled when m grows); q_i stays in
  registers, rows are read as float4 by a group of LPH lanes (LPH = D/4 up to 32; a warp
  holds 32/LPH such groups of ONE destination, each with NH heads, so every shuffle is
  warp-uniform). Edges are consumed in batches whose rows are gathered together; rows read
  or written once (q, t, out) carry cache-streaming hints. Only the logsumexp L [N_dst, H]
  is saved. No [M, H] or [M, H, D] tensor exists unless the attention is requested: then
  the forward writes raw logits into the [M, H] output (caller order) and a small kernel
  turns them into exp(e - L) (times the dropout multiplier for "dropped").
- Super nodes: rows longer than ``CHUNK_EDGES`` (256) edges are cut into chunks, one warp
  each, writing partial (m, l, acc) states merged by a second kernel. The chunk list (int4
  records: row, first edge, end edge, partial slot; split rows first) is built once per
  graph on the GPU and cached with ``graph.memo`` (a few host syncs then, none per call).
- Backward (destination pass): recomputes alpha = exp(e - L), Delta_i = <O_i, dO_i> (O is
  the dropped output when dropout is on, so Delta = sum_j alpha_ij dalpha_ij holds), and
  de_ij = alpha_ij (s_ij <dO_i, v_j + t_ij> - Delta_i); dq accumulates in registers (split
  rows: partials summed by a second kernel), dt_ij = alpha_ij s_ij dO_i + scale de_ij q_i is
  written once per edge in caller order. dk, dv need per-source sums, two ways selected by
  the environment variable ``GNN_FASTPATH_DOT_BWD`` (read per call):

  * ``atomic`` (default when sources have < 4 out-edges on average): float4 atomics (sm_90) along the in-edges inside the same pass;
    dk, dv are zero-filled first;
  * ``transposed`` (default otherwise; measured faster there): the destination pass writes Delta [N_dst, H]; a source-major pass over
    ``graph.source_csr()`` (int32 copies and its own chunk list, cached with the graph on
    first use) keeps k_j, v_j and the dk_j, dv_j sums in registers: no atomics and no
    zero-fill, but it gathers q_i, dO_i (and t) per edge again.

- Dropout: inverted dropout on alpha, multiplier from Philox keyed by (seed, offset, caller
  edge id, head); seed and offset come from torch's CPU generator (no GPU sync) and are kept
  in ctx, so backward regenerates the forward's mask exactly.
- Gradient through the returned attention A (alpha or alpha * s) is supported: with
  G_i = sum_j A_ij dA_ij (one small kernel), dalpha gains dA (or s dA) and Delta gains G.
- Any H >= 1; D specialised at compile time (exact templates for D = 8, 16, 32, 64, 128,
  256, 512 when rows are 16-byte aligned) and a masked generic variant for other D up to
  512 (float4 when D % 4 == 0 and aligned, else scalar loads). Each template instantiation
  is its own small module, compiled on first use. Wider heads and graphs with 2**31 or
  more edges fall back to the reference op with a warning.
- Tuning (measured on an H200, H=4, D=128): heads per lane group NH=2 in the forward on
  graphs of mean in-degree < 16, else 1 (``cuda/dot.py``: ``MAX_ROW_FLOATS*``); registers
  capped at 80 per thread (``__launch_bounds__(256, 3)``); batch depth 4 edges for
  D <= 128 (``DOT_EDGE_FLOATS``).
"""
from __future__ import annotations

import math
import os
import warnings
from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import reference
from ..cuda import dot as kernels
from ..graph import Graph
from ._dropout import philox_seed

BACKWARD_MODES = ("atomic", "transposed")
_warned: set = set()


#: Mean out-degree from which the source-major backward wins. Measured on the H200 (H=4,
#: D=128, fwd+bwd ms, atomic / transposed): tolokers 2.12 / 1.99, arxiv-like 4.78 / 4.35,
#: arxiv-skewdst 6.00 / 4.81, roads-like (out-degree 2) 1.83 / 2.06.
TRANSPOSED_MIN_MEAN_DEGREE = 4.0


def backward_mode(graph: Graph) -> str:
    """The dk/dv strategy of the backward for ``graph``.

    ``GNN_FASTPATH_DOT_BWD`` (``atomic`` or ``transposed``) forces one; by default the
    source-major pass runs when sources have at least
    :data:`TRANSPOSED_MIN_MEAN_DEGREE` out-edges on average, atomics otherwise.
    """
    default = "transposed" if graph.num_edges >= TRANSPOSED_MIN_MEAN_DEGREE * max(graph.n_src, 1) else "atomic"
    mode = os.environ.get("GNN_FASTPATH_DOT_BWD", default).strip().lower() or default
    if mode not in BACKWARD_MODES:
        raise ValueError(f"GNN_FASTPATH_DOT_BWD must be one of {', '.join(BACKWARD_MODES)}; got {mode!r}")
    return mode


class DotAttentionFunction(torch.autograd.Function):
    """Fused dot-product attention; see :func:`dot_attention_cuda`.

    Inputs: q, k, v, edge_term (or None) [contiguous fp32 CUDA], graph, scale, return
    attention (False / True / "dropped"), dropout p, seed, offset. Outputs: out, or
    (out, attention) when attention is requested.
    """

    @staticmethod
    def forward(ctx, q, k, v, edge_term, graph: Graph, scale: float, return_attention, dropout: float,
                seed: int, offset: int):
        dg = kernels.dot_graph(graph)
        cfg = _config(dg, q, k, v, edge_term)
        out, lse, attn = kernels.forward(cfg, dg, q, k, v, edge_term, scale, dropout, seed, offset,
                                         want_logits=bool(return_attention))
        if return_attention:
            kernels.finalize_attention(cfg, dg, lse, attn, return_attention == "dropped", dropout, seed, offset)
        ctx.save_for_backward(q, k, v, edge_term, out, lse, attn)
        ctx.dg = dg
        ctx.graph = graph
        ctx.scale = scale
        ctx.dropout = dropout
        ctx.seed = seed
        ctx.offset = offset
        ctx.return_attention = return_attention
        ctx.set_materialize_grads(False)
        if return_attention:
            return out, attn
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dattn=None):
        q, k, v, t, out, lse, attn = ctx.saved_tensors
        dg = ctx.dg
        dout = torch.zeros_like(out) if dout is None else dout.contiguous()
        cfg = _config(dg, q, k, v, t, out, dout)
        gsum = None
        if dattn is not None:
            dattn = dattn.contiguous()
            gsum = kernels.attention_grad_rowsum(cfg, dg, q.shape[0], attn, dattn)
        want_dt = t is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dt = kernels.backward(cfg, dg, backward_mode(ctx.graph) == "transposed", q, k, v, t, out, dout, lse,
                                          dattn, gsum, ctx.return_attention == "dropped", want_dt, ctx.scale,
                                          ctx.dropout, ctx.seed, ctx.offset)
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
                dt if want_dt else None, None, None, None, None, None, None)


def _config(dg: kernels.DotGraph, *tensors: Optional[Tensor]) -> kernels.Config:
    H, D = tensors[0].shape[1:]
    cfg = kernels.config_for(D, kernels.aligned(*tensors), H, dg.low_degree)
    assert cfg is not None, "unsupported head width reached the kernels"  # _unsupported() guards
    return cfg


def _unsupported(graph: Graph, H: int, D: int) -> Optional[str]:
    if H < 1 or D < 1:
        return f"empty heads (H={H}, D={D})"
    if kernels.config_for(D, False) is None:
        return f"head width D={D} above {kernels.MAX_FLOATS_PER_LANE * 32}"
    if graph.num_edges > 2**31 - 1 or max(graph.n_src, graph.n_dst) > 2**31 - 1:
        return f"graph with {graph.num_edges} edges: int32 kernels index fewer than 2**31"
    return None


def dot_attention_cuda(graph: Graph, q: Tensor, k: Tensor, v: Tensor, scale: Optional[float] = None,
                       edge_term: Optional[Tensor] = None, return_attention=False, dropout: float = 0.0):
    """:func:`gnn_fastpath.ops.dot_attention` on the CUDA kernels (arguments already checked,
    graph already on the features' device)."""
    H, D = k.shape[1:]
    reason = _unsupported(graph, H, D)
    if reason is not None:
        if reason not in _warned:
            _warned.add(reason)
            warnings.warn(f"gnn_fastpath: dot_attention runs the reference op ({reason})", stacklevel=3)
        return reference.dot_attention(graph, q, k, v, scale, edge_term, return_attention, dropout)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    seed, offset = philox_seed(dropout)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    t = edge_term.contiguous() if edge_term is not None else None
    return DotAttentionFunction.apply(q, k, v, t, graph, float(scale), return_attention, float(dropout), seed,
                                      offset)
