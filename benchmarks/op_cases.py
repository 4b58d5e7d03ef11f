"""The op cases the op and tuning benchmarks time (``bench_ops``, ``bench_tuning``): each op's
head and feature shape and its seeded random inputs."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

import torch


@dataclass(frozen=True)
class OpCase:
    name: str
    heads: int
    width: int           # H*D or F
    label: str
    ref_factor: float    # reference fwd+bwd working set ~ ref_factor * M * width * 4 bytes

    def inputs(self, n: int, device, seed: int, dtype: torch.dtype = torch.float32) -> Tuple[List[torch.Tensor], Dict]:
        """Fresh random inputs (requires_grad) and keyword arguments for the call: features in
        ``dtype`` (the same values, rounded, for every dtype of one seed); GATv2's ``att`` and
        GAT's per-node scores in float32, a parameter (and its float32 reductions) as under
        autocast."""
        g = torch.Generator(device="cpu").manual_seed(seed)

        def rnd(*shape, scale=1.0, dt=dtype):
            t = torch.randn(*shape, generator=g) * scale
            return t.to(device=device, dtype=dt).requires_grad_(True)

        if self.name == "gatv2_attention":
            h, d = self.heads, self.width // self.heads
            return [rnd(n, h, d), rnd(n, h, d), rnd(h, d, scale=1 / math.sqrt(d), dt=torch.float32)], {}
        if self.name == "gat_attention":
            h, d = self.heads, self.width // self.heads
            return [rnd(n, h, d), rnd(n, h, dt=torch.float32), rnd(n, h, dt=torch.float32)], {}
        if self.name == "dot_attention":
            h, d = self.heads, self.width // self.heads
            return [rnd(n, h, d), rnd(n, h, d), rnd(n, h, d)], {}
        if self.name == "spmm":
            return [rnd(n, self.width)], {"norm": "both"}
        if self.name == "segment_reduce":
            return [rnd(n, self.width)], {"reduce": "max"}
        raise KeyError(self.name)

    def fn(self) -> Callable:
        from gnn_fastpath import ops

        return getattr(ops, self.name)


OPS: Dict[str, OpCase] = {c.name: c for c in [
    OpCase("gatv2_attention", 2, 128, "H=2 D=64", 8),
    OpCase("gat_attention", 2, 128, "H=2 D=64", 6),
    OpCase("dot_attention", 4, 512, "H=4 D=128", 10),
    OpCase("spmm", 1, 512, "F=512 norm=both", 4),
    OpCase("segment_reduce", 1, 512, "F=512 max", 4),
]}
