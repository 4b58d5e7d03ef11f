"""Seeds for the fused attention dropout (Philox keyed by seed, offset and edge id)."""
from __future__ import annotations

from typing import Tuple

import torch


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
