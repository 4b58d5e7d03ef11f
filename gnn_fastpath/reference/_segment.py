"""Segment helpers over destination-major CSR edges (pure torch). The dtype rules of the
reference ops are in :mod:`._precision`."""
from __future__ import annotations

import torch
from torch import Tensor


def expand_rows(index: Tensor, like: Tensor) -> Tensor:
    """Broadcast an [M] index to ``like``'s shape [M, ...] for scatter ops."""
    return index.view(-1, *([1] * (like.dim() - 1))).expand_as(like)


def segment_softmax(logits: Tensor, dst: Tensor, n_dst: int) -> Tensor:
    """Softmax of ``logits`` [M, H] over the edges of each destination (``dst`` [M]).

    Returns alpha [M, H]; rows with no edges simply have no entries.
    """
    idx = expand_rows(dst, logits)
    row_max = torch.full((n_dst,) + logits.shape[1:], float("-inf"), dtype=logits.dtype, device=logits.device)
    row_max = row_max.scatter_reduce(0, idx, logits.detach(), "amax", include_self=True)
    # The max is a constant shift for the softmax: no gradient flows through it.
    weights = torch.exp(logits - row_max[dst])
    denom = torch.zeros_like(row_max).index_add_(0, dst, weights)
    return weights / denom[dst]


def segment_sum(values: Tensor, dst: Tensor, n_dst: int) -> Tensor:
    """Sum ``values`` [M, ...] into [n_dst, ...] by destination."""
    out = values.new_zeros((n_dst,) + values.shape[1:])
    return out.index_add(0, dst, values)


def attention_dropout(alpha: Tensor, p: float) -> Tensor:
    """Inverted dropout on attention weights (keep probability 1 - p, scale 1 / (1 - p))."""
    if p <= 0.0:
        return alpha
    if p >= 1.0:
        return torch.zeros_like(alpha)
    keep = torch.rand_like(alpha) >= p
    return alpha * keep / (1.0 - p)


class _RouteGradient(torch.autograd.Function):
    """``value`` forward; backward sends ``coef * grad[dst]`` to ``messages``. Exact for any
    message values (a straight-through sum would turn infinite messages into NaN)."""

    @staticmethod
    def forward(ctx, messages: Tensor, value: Tensor, coef: Tensor, dst: Tensor) -> Tensor:
        ctx.save_for_backward(coef, dst)
        return value.clone()

    @staticmethod
    def backward(ctx, grad: Tensor):
        coef, dst = ctx.saved_tensors
        return coef * grad[dst], None, None, None


def route_gradient(messages: Tensor, value: Tensor, coef: Tensor, dst: Tensor) -> Tensor:
    """``value`` [n_dst, ...] whose gradient reaches ``messages`` [M, ...] as ``coef * grad[dst]``."""
    return _RouteGradient.apply(messages, value, coef, dst)
