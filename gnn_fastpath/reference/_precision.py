"""The dtype rules of the reduced-precision contract, shared by the reference ops and the ops:
16-bit inputs are computed in float32, float64 in float64, with autocast off; results come
back in ``out_dtype``, which an op checks with :func:`check_out_dtype`.

Kept in the reference package (which imports nothing of :mod:`gnn_fastpath.ops`) so that
both layers can use them without an import cycle.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import Tensor


def check_out_dtype(out_dtype, dtype: torch.dtype, dtype_name: str, *,
                    default: Optional[torch.dtype] = None) -> torch.dtype:
    """``out_dtype`` resolved against the inputs' ``dtype``.

    Allowed values: ``None``, ``dtype``, ``torch.float32`` and ``default``; anything else is a
    ValueError naming ``out_dtype`` (``dtype_name`` is how the message calls ``dtype``, e.g.
    ``"x's dtype"``). Default (``None``): ``default``, or ``dtype`` when ``default`` is None (spmm
    passes torch's promoted dtype of ``edge_weight * x`` there).
    """
    if default is None:
        default = dtype
    if out_dtype is None:
        return default
    if out_dtype not in (dtype, torch.float32, default):
        raise ValueError(f"out_dtype must be None, {dtype_name} ({dtype}) or torch.float32; got {out_dtype!r}")
    return out_dtype


def product_dtype(x: Tensor, edge_weight: Optional[Tensor]) -> torch.dtype:
    """torch's dtype of ``edge_weight * x``: ``x.dtype`` without a weight (the result dtype of
    segment_reduce, and spmm's default)."""
    return x.dtype if edge_weight is None else torch.promote_types(x.dtype, edge_weight.dtype)


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float64 if any of ``dtypes`` is float64, else float32 (16-bit inputs compute in float32)."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def no_autocast(device: torch.device):
    """A context with autocast off on ``device`` (the reference computes in the dtypes it
    chooses itself, whatever the caller's autocast)."""
    if device.type in ("cuda", "cpu"):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


class _RoundTo(torch.autograd.Function):
    """Values rounded to a dtype (and back); the gradient passes unchanged (straight through)."""

    @staticmethod
    def forward(ctx, values: Tensor, dtype: torch.dtype) -> Tensor:
        return values.to(dtype).to(values.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


def round_to(values: Tensor, dtype: torch.dtype) -> Tensor:
    """``values`` rounded to ``dtype`` (kept in their own dtype); identity gradient. A no-op
    when ``dtype`` is not narrower than ``values.dtype``."""
    if torch.finfo(dtype).bits >= torch.finfo(values.dtype).bits:
        return values
    return _RoundTo.apply(values, dtype)
