"""Sum and min/max neighbourhood aggregation in plain PyTorch (CPU path and oracle).

Dtypes (the reduced-precision contract): any floating inputs; 16-bit ones are computed in
float32, float64 ones in float64, with autocast off; the result is returned in its dtype
(``out_dtype`` for spmm) and each gradient in the dtype of its input.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..graph import Graph
from ._precision import check_out_dtype, compute_dtype, no_autocast, product_dtype, round_to
from ._segment import expand_rows, route_gradient, segment_sum


def degree_norms(graph: Graph, norm: str, dtype: torch.dtype):
    """(source scale [n_src] or None, destination scale [n_dst] or None) for ``norm``.

    DGL GraphConv semantics: structural degrees clamped to >= 1; ``left`` divides by the
    source out-degree, ``right`` by the destination in-degree, ``both`` by the square root
    of each.
    """
    src_scale = dst_scale = None
    if norm in ("left", "both"):
        deg = graph.out_degree().clamp(min=1).to(dtype)
        src_scale = deg.rsqrt() if norm == "both" else deg.reciprocal()
    if norm in ("right", "both"):
        deg = graph.in_degree().clamp(min=1).to(dtype)
        dst_scale = deg.rsqrt() if norm == "both" else deg.reciprocal()
    return src_scale, dst_scale


def _edge_weight_csr(graph: Graph, edge_weight: Optional[Tensor]) -> Optional[Tensor]:
    return None if edge_weight is None else edge_weight[graph.perm]


def _broadcast(w: Tensor, like: Tensor) -> Tensor:
    return w.view(-1, *([1] * (like.dim() - 1)))


def spmm_out_dtype(x: Tensor, edge_weight: Optional[Tensor], out_dtype: Optional[torch.dtype]) -> torch.dtype:
    """The dtype of spmm's result: by default torch's dtype of ``edge_weight * x`` (x's
    without weights); ``out_dtype`` may name that, x's dtype or float32 (anything else is a
    ValueError)."""
    return check_out_dtype(out_dtype, x.dtype, "x's dtype", default=product_dtype(x, edge_weight))


def spmm(graph: Graph, x: Tensor, edge_weight: Optional[Tensor] = None, norm: str = "none",
         out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """Reference sparse-dense product; see :func:`gnn_fastpath.ops.spmm`."""
    out_dtype = spmm_out_dtype(x, edge_weight, out_dtype)
    dtype = compute_dtype(x.dtype, out_dtype, *(() if edge_weight is None else (edge_weight.dtype,)))
    with no_autocast(x.device):
        w = None if edge_weight is None else edge_weight.to(dtype)
        return _spmm(graph, x.to(dtype), w, norm).to(out_dtype)


def _spmm(graph: Graph, x: Tensor, edge_weight: Optional[Tensor], norm: str) -> Tensor:
    src_scale, dst_scale = degree_norms(graph, norm, x.dtype)
    if src_scale is not None:
        x = x * _broadcast(src_scale, x)
    messages = x[graph.indices]
    w = _edge_weight_csr(graph, edge_weight)
    if w is not None:
        messages = messages * _broadcast(w, messages)
    out = segment_sum(messages, graph.dst_index(), graph.n_dst)
    if dst_scale is not None:
        out = out * _broadcast(dst_scale, out)
    return out


#: Gradient rules for tied extremes in :func:`segment_reduce` (see the op's docstring).
TIE_BREAKS = ("split", "even", "first", "last")
#: NaN/infinity rules (see the op's docstring): torch/PyG's and DGL's.
NON_FINITE = ("keep", "drop")


def segment_reduce(graph: Graph, x: Tensor, reduce: str = "max", edge_weight: Optional[Tensor] = None,
                   tie_break: str = "split", non_finite: str = "keep") -> Tensor:
    """Reference min/max aggregation; see :func:`gnn_fastpath.ops.segment_reduce`.

    The value is the same for every ``tie_break``; only the gradient of tied extremes
    differs. ``"split"`` (with ``non_finite="keep"``) is literally torch's
    ``scatter_reduce(..., include_self=False)`` on a zero tensor (what PyG runs); the other
    rules route the gradient to the messages through fixed per-edge coefficients.

    The result has ``promote_types(x.dtype, edge_weight.dtype)`` (x's dtype without
    weights); each message ``w * x`` is rounded once to it, as torch's product in that dtype
    is (computed in float32 for 16-bit inputs, so the comparisons and the gradient
    arithmetic are float32).
    """
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be one of {', '.join(map(repr, TIE_BREAKS))}; got {tie_break!r}")
    if non_finite not in NON_FINITE:
        raise ValueError(f"non_finite must be one of {', '.join(map(repr, NON_FINITE))}; got {non_finite!r}")
    out_dtype = product_dtype(x, edge_weight)
    dtype = compute_dtype(out_dtype)
    with no_autocast(x.device):
        w = None if edge_weight is None else edge_weight.to(dtype)
        return _segment_reduce(graph, x.to(dtype), reduce, w, tie_break, non_finite, out_dtype).to(out_dtype)


def _segment_reduce(graph: Graph, x: Tensor, reduce: str, edge_weight: Optional[Tensor], tie_break: str,
                    non_finite: str, out_dtype: torch.dtype) -> Tensor:
    drop = non_finite == "drop"
    messages = x[graph.indices]
    w = _edge_weight_csr(graph, edge_weight)
    if w is not None:
        messages = round_to(messages * _broadcast(w, messages), out_dtype)
    dst = graph.dst_index()
    idx = expand_rows(dst, messages)
    op = "amax" if reduce == "max" else "amin"
    out = messages.new_zeros((graph.n_dst,) + messages.shape[1:])
    if tie_break == "split" and not drop:
        # include_self=False: rows with edges take their true extreme; empty rows keep 0.
        # torch's backward divides the gradient by (number of tied edges + 1 if the extreme
        # equals the untouched zero of ``out``): PyG's scatter path, quirk included.
        return out.scatter_reduce(0, idx, messages, op, include_self=False)
    with torch.no_grad():
        candidates = messages
        if drop:  # DGL: a NaN message never wins
            candidates = messages.masked_fill(torch.isnan(messages), float("-inf") if reduce == "max" else float("inf"))
        value = out.scatter_reduce(0, idx, candidates, op, include_self=False)
        tied = messages == value[dst]
        if drop:  # DGL: a non-finite extreme is written as 0 and has no winning edge
            finite = torch.isfinite(value)
            tied &= finite[dst]
            value = torch.where(finite, value, torch.zeros_like(value))
        if tie_break == "even":
            count = torch.zeros_like(value).index_add_(0, dst, tied.to(value.dtype))
            coef = tied.to(value.dtype) / count[dst].clamp(min=1)
        else:  # one edge, the first or last tied one in the caller's edge order
            perm = expand_rows(graph.perm, messages)
            first = tie_break == "first"
            sentinel = torch.iinfo(torch.int64).max if first else -1
            key = torch.where(tied, perm, torch.full_like(perm, sentinel))
            chosen = torch.full(value.shape, sentinel, dtype=torch.int64, device=value.device)
            chosen = chosen.scatter_reduce(0, idx, key, "amin" if first else "amax", include_self=True)
            coef = (tied & (perm == chosen[dst])).to(value.dtype)
    # The gradient reaches x and w only through the (edge, feature) pairs that win: masking
    # the others keeps a NaN or infinite loser from turning a zero gradient into NaN (0 * inf).
    wins = coef != 0
    x_src = torch.where(wins, x[graph.indices], torch.zeros((), dtype=x.dtype, device=x.device))
    routed = x_src if w is None else x_src * _broadcast(w, x_src)
    return route_gradient(routed, value, coef, dst)
