"""AGNN's cosine attention on :func:`gnn_fastpath.dot_attention`, shared by the PyG and DGL
``AGNNConv`` shims.

Both frameworks compute, per destination i over its in-edges (self loops included when the
graph has them),

.. math::
    \\alpha_{ij} = \\mathrm{softmax}_j(\\beta \\cos(x_i, x_j)), \\qquad
    o_i = \\sum_j \\alpha_{ij} x_j,

with the cosine as the dot product of ``F.normalize(x, p=2, dim=-1)`` rows (``x / max(|x|,
1e-12)``: the shims call that very function, so a zero row normalises to 0 and its cosines
are 0, as in stock). That is dot-product attention with ``q = beta * n_dst``, ``k = n_src``,
``v = x_src`` and logit scale 1: folding the (possibly learnable, one-element) ``beta`` into
the queries makes its gradient flow through ``q`` (``d beta = sum_i <dq_i, n_i>``) with no
host read of its value. Features ``[N, *, D]`` are ``prod(*)`` heads of width D (DGL's
``u_dot_v`` reduces the last dimension only); ``[N, F]`` is one head.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from gnn_fastpath import ops
from gnn_fastpath.graph import Graph


def normalize(x: Tensor) -> Tensor:
    """Stock's normalisation, ``F.normalize(x, p=2, dim=-1)`` (eps 1e-12), called as stock calls it."""
    return F.normalize(x, p=2.0, dim=-1)


def heads(x: Tensor) -> Tuple[int, int]:
    """(H, D) of features ``[N, *, D]``: H = prod(*) (1 for ``[N, D]``)."""
    d = x.shape[-1]
    h = 1
    for s in x.shape[1:-1]:
        h *= s
    return h, d


def queries(beta: Tensor, n_dst: Tensor) -> Tensor:
    """``beta * n_dst``: the queries carrying the scale (``beta`` has one element)."""
    return beta * n_dst


def attention(graph: Graph, q: Tensor, k: Tensor, v: Tensor, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """``dot_attention`` with scale 1 over features ``[N, *, D]`` (all three one dtype),
    returned as ``[N_dst, *, D]``."""
    h, d = heads(k)
    out = ops.dot_attention(graph, q.reshape(q.shape[0], h, d), k.reshape(k.shape[0], h, d),
                            v.reshape(v.shape[0], h, d), scale=1.0, out_dtype=out_dtype)
    return out.view((graph.n_dst,) + tuple(v.shape[1:]))
