"""Sum and min/max neighbourhood aggregation in plain PyTorch (CPU path and oracle)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..graph import Graph
from ._segment import expand_rows, segment_sum


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


def spmm(graph: Graph, x: Tensor, edge_weight: Optional[Tensor] = None, norm: str = "none") -> Tensor:
    """Reference sparse-dense product; see :func:`gnn_fastpath.ops.spmm`."""
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


def segment_reduce(graph: Graph, x: Tensor, reduce: str = "max", edge_weight: Optional[Tensor] = None) -> Tensor:
    """Reference min/max aggregation; see :func:`gnn_fastpath.ops.segment_reduce`."""
    messages = x[graph.indices]
    w = _edge_weight_csr(graph, edge_weight)
    if w is not None:
        messages = messages * _broadcast(w, messages)
    out = messages.new_zeros((graph.n_dst,) + messages.shape[1:])
    # include_self=False: rows with edges take their true extreme; empty rows keep 0.
    # Gradient on ties is split evenly among the tied edges (torch's scatter_reduce rule).
    return out.scatter_reduce(0, expand_rows(graph.dst_index(), messages), messages,
                              "amax" if reduce == "max" else "amin", include_self=False)
