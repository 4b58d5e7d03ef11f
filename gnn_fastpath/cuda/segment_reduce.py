"""Launchers of the min/max aggregation kernels (segment_reduce.cu) and their feature mapping.

Every function takes int32 CSR arrays and contiguous fp32 tensors on one CUDA device and
launches on torch's current stream; nothing here synchronises with the host.
"""
from __future__ import annotations

import os
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from .loader import get_kernel, launch, ptr

SOURCE = "segment_reduce.cu"
THREADS = 128
#: Tie-rule codes of the kernels.
MODE_COUNT, MODE_FIRST, MODE_LAST, MODE_VALUE = 0, 1, 2, 3
#: CSR edges per group in the edge-range kernel (SDDMM).
EDGES_PER_GROUP = 16
#: Feature chunks per lane of the min/max kernels (``GNN_FASTPATH_SR_CHUNKS`` overrides).
DEFAULT_CHUNKS = 2


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _env_chunks() -> int:
    value = os.environ.get("GNN_FASTPATH_SR_CHUNKS", "").strip()
    if not value:
        return DEFAULT_CHUNKS
    chunks = int(value)
    if chunks not in (1, 2, 4):
        raise ValueError(f"GNN_FASTPATH_SR_CHUNKS must be 1, 2 or 4; got {value!r}")
    return chunks


def feature_config(F: int, *tensors: Tensor, max_chunks: int = 1) -> Tuple[int, int, int, int]:
    """(VEC, T, CH, feature blocks) for rows of width F.

    VEC = 4 (16-byte loads) when F % 4 == 0 and every tensor's base address is 16-byte
    aligned; T lanes per row (a power of two, up to a warp); CH chunks of VEC features per
    lane (at most ``max_chunks``, only with a full warp); one feature block
    (``blockIdx.y``) covers T * VEC * CH features. Wide rows therefore get several groups
    (F = 512, CH = 1: four warps with one 16-byte load per lane and edge), which keeps
    registers low and many rows in flight; each pass over the edges then reads part of
    every source row, so only that part of x competes for L2 at a time.
    """
    vec = 4 if F % 4 == 0 and all(t.data_ptr() % 16 == 0 for t in tensors) else 1
    width = F // vec
    lanes = min(32, _next_pow2(max(width, 1)))
    chunks = 1
    while chunks < max_chunks and lanes * chunks < width:
        chunks *= 2
    per_block = lanes * vec * chunks
    return vec, lanes, chunks, (F + per_block - 1) // per_block


def templated(name: str, config, device: torch.device, source: str = SOURCE, extra: Tuple[int, ...] = ()):
    """Kernel ``name<VEC, T, CH, *extra>``."""
    vec, lanes, chunks = config[:3]
    expr = f"{name}<{','.join(str(v) for v in (vec, lanes, chunks) + tuple(extra))}>"
    return get_kernel(source, expr, device, name_expressions=(expr,))


def _grid(n_groups: int, lanes: int, fblocks: int):
    per_block = THREADS // lanes
    return ((n_groups + per_block - 1) // per_block, fblocks)


def forward(indptr: Tensor, indices: Tensor, perm: Tensor, x: Tensor, w: Optional[Tensor], n_dst: int,
            light_rows: Optional[Tensor], heavy_rows: Optional[Tensor], heavy_items: Optional[Tensor],
            sign: float, mode: int, need_aux: bool, out: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """out [n_dst, F] = sign * max_k (sign * w_k) * x[src_k] per row, and aux (count or arg).

    Without ``need_aux`` only the value is computed (MODE_VALUE) and aux is None.

    ``light_rows`` None means every row is light (row id = group id). ``heavy_items`` [n, 3]
    int32 (slot into ``heavy_rows``, edge start, edge end).
    """
    F = x.size(1)
    device = x.device
    if out is None:
        out = torch.empty(n_dst, F, dtype=torch.float32, device=device)
    aux = torch.empty(n_dst, F, dtype=torch.int32, device=device) if need_aux else None
    if n_dst == 0 or F == 0:
        return out, aux
    config = feature_config(F, x, out, max_chunks=_env_chunks())
    vec, lanes, chunks, fblocks = config
    if not need_aux:
        mode = MODE_VALUE
    n_light = n_dst if light_rows is None else light_rows.numel()
    if n_light:
        kernel = templated("gf_sr_fwd_light", config, device, extra=(mode,))
        launch(kernel, _grid(n_light, lanes, fblocks), (THREADS,),
               (ptr(indptr), ptr(indices), ptr(perm), ptr(x), ptr(w), ptr(light_rows), np.int32(n_light),
                np.int32(F), np.float32(sign), ptr(out), ptr(aux)), device)
    if heavy_rows is not None and heavy_rows.numel():
        n_heavy, n_items = heavy_rows.numel(), heavy_items.size(0)
        packed = torch.zeros(n_heavy, F, dtype=torch.int64, device=device)
        kernel = templated("gf_sr_fwd_heavy", config, device, extra=(mode,))
        launch(kernel, _grid(n_items, lanes, fblocks), (THREADS,),
               (ptr(indices), ptr(perm), ptr(x), ptr(w), ptr(heavy_items), np.int32(n_items), np.int32(F),
                np.float32(sign), ptr(packed)), device)
        total = n_heavy * F
        unpack = get_kernel(SOURCE, "gf_sr_fwd_unpack", device)
        launch(unpack, ((total + 255) // 256,), (256,),
               (ptr(packed), ptr(heavy_rows), np.int32(n_heavy), np.int32(F), np.float32(sign), np.int32(mode),
                ptr(out), ptr(aux)), device)
    return out, aux


def backward_arg(arg: Tensor, dy: Tensor, src_of: Tensor, w: Optional[Tensor], x: Tensor,
                 dx: Optional[Tensor], dw: Optional[Tensor]) -> None:
    """Single-edge rules: dx[src[arg]] += dy * w[arg]; dw[arg] += dy * x[src[arg]] (zeroed outputs)."""
    total = arg.numel()
    if total == 0:
        return
    kernel = get_kernel(SOURCE, "gf_sr_bwd_arg", dy.device)
    launch(kernel, ((total + 255) // 256,), (256,),
           (ptr(arg), ptr(dy), ptr(src_of), ptr(w), ptr(x), np.int64(total), np.int32(arg.size(1)),
            ptr(dx), ptr(dw)), dy.device)


def backward_split(segments: Tensor, indices: Tensor, perm: Tensor, x: Tensor, w: Optional[Tensor],
                   sign: float, quirk: bool, out: Tensor, cnt: Tensor, dy: Tensor,
                   dx: Optional[Tensor], dw: Optional[Tensor]) -> None:
    """Split rules: each tied edge gets dy / (count + [quirk and out == 0]) (zeroed outputs).

    ``segments`` int32 [n, 3] = (row, edge start, edge end) covering every CSR edge once.
    """
    n_segs = segments.size(0)
    F = x.size(1)
    if n_segs == 0 or F == 0:
        return
    config = feature_config(F, x, out, dy, cnt, max_chunks=_env_chunks())
    vec, lanes, chunks, fblocks = config
    kernel = templated("gf_sr_bwd_split", config, dy.device)
    launch(kernel, _grid(n_segs, lanes, fblocks), (THREADS,),
           (ptr(segments), np.int32(n_segs), ptr(indices), ptr(perm), ptr(x), ptr(w), np.int32(F),
            np.float32(sign), np.int32(1 if quirk else 0), ptr(out), ptr(cnt), ptr(dy), ptr(dx), ptr(dw)),
           dy.device)
