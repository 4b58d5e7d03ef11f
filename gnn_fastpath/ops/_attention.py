"""What the attention ops' autograd Functions share: the Philox seed of the fused dropout,
what the forward keeps in ctx besides the saved tensors, and the shape of their outputs and
incoming grads."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor


def philox_seed(p: float) -> Tuple[int, int]:
    """(seed, offset) for a dropout mask of probability ``p``; (0, 0) when ``p`` is 0.

    Drawn from torch's default CPU generator: no GPU work and no synchronisation, and
    ``torch.manual_seed`` makes the mask reproducible. The op saves both in its autograd
    context, so the backward regenerates exactly the forward's mask.
    """
    if p <= 0.0:
        return 0, 0
    seed, offset = torch.randint(0, 2**62, (2,), dtype=torch.int64).tolist()
    return int(seed), int(offset)


def as_float32(t: Optional[Tensor]) -> Optional[Tensor]:
    """``t`` as the kernels read it: contiguous float32 (itself when it already is); None
    stays None."""
    return None if t is None else t.to(torch.float32).contiguous()


def keep(ctx, dropout: float, seed, offset, return_attention) -> None:
    """Keep the scalars the backward needs (the graph and the tensors, ``lse`` and the rng
    tensor among them, go through :func:`gnn_fastpath.ops.library.save`). ``seed`` as the
    Function took it: ints, or the rng tensor (saved, so None here)."""
    ctx.dropout, ctx.offset = dropout, offset
    ctx.seed = None if isinstance(seed, Tensor) else seed
    ctx.return_attention = return_attention
    ctx.set_materialize_grads(False)


def outputs(out: Tensor, alpha: Optional[Tensor], return_attention):
    """``out``, or ``(out, alpha)`` when the attention was asked for."""
    return (out, alpha) if return_attention else out


def incoming(out: Tensor, grad_out: Optional[Tensor], grad_alpha: Optional[Tensor]):
    """(grad_out, grad_alpha) as the kernels take them: contiguous, zeros for a missing
    grad_out, None for a missing grad_alpha."""
    grad_out = torch.zeros_like(out) if grad_out is None else grad_out.contiguous()
    return grad_out, None if grad_alpha is None else grad_alpha.contiguous()
