"""Launchers of the per-edge value kernels (edge_norm.cu): SpMM edge values, their SDDMM
gradient, and PyG's gcn_norm. int32 CSR arrays, fp32 tensors, torch's current stream."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor

from .loader import get_kernel, launch, ptr
from .segment_reduce import EDGES_PER_GROUP, THREADS, _grid, feature_config, templated

SOURCE = "edge_norm.cu"
#: Degree-scale codes of the kernels (ga_degree_scale).
SCALE_NONE, SCALE_INVERSE, SCALE_RSQRT = 0, 1, 2


def spmm_edge_values(indptr: Tensor, indices: Tensor, perm: Tensor, out_degree: Optional[Tensor],
                     w: Optional[Tensor], src_mode: int, dst_mode: int) -> Tensor:
    """values [M] in CSR order: c_dst[row] * w[perm] * c_src[col]."""
    m = indices.numel()
    values = torch.empty(m, dtype=torch.float32, device=indices.device)
    if m:
        kernel = get_kernel(SOURCE, "gf_spmm_edge_values", indices.device)
        launch(kernel, ((m + 255) // 256,), (256,),
               (ptr(indptr), ptr(indices), ptr(perm), ptr(out_degree), ptr(w), np.int32(indptr.numel() - 1),
                np.int32(m), np.int32(src_mode), np.int32(dst_mode), ptr(values)), indices.device)
    return values


def spmm_edge_grad(indptr: Tensor, indices: Tensor, perm: Tensor, out_degree: Optional[Tensor], src_mode: int,
                   dst_mode: int, dy: Tensor, x: Tensor) -> Tensor:
    """dw [M] in caller order: c_dst[row] * c_src[col] * <dy[row], x[col]>."""
    m = indices.numel()
    F = x.size(1)
    config = feature_config(F, dy, x)
    vec, lanes, chunks, fblocks = config
    accumulate = fblocks > 1
    dw = (torch.zeros if accumulate or F == 0 else torch.empty)(m, dtype=torch.float32, device=x.device)
    if m == 0 or F == 0:
        return dw
    groups = (m + EDGES_PER_GROUP - 1) // EDGES_PER_GROUP
    kernel = templated("gf_spmm_edge_grad", config, x.device, source=SOURCE)
    launch(kernel, _grid(groups, lanes, fblocks), (THREADS,),
           (ptr(indptr), ptr(indices), ptr(perm), ptr(out_degree), np.int32(indptr.numel() - 1), np.int32(m),
            np.int32(src_mode), np.int32(dst_mode), ptr(dy), ptr(x), np.int32(F), np.int32(EDGES_PER_GROUP),
            np.int32(1 if accumulate else 0), ptr(dw)), x.device)
    return dw


def gcn_norm(indptr: Tensor, indices: Tensor, perm: Tensor, w: Optional[Tensor], fill: float) -> Tensor:
    """PyG gcn_norm edge values [M] in caller order (see ops.gcn_norm.gcn_norm_values)."""
    n = indptr.numel() - 1
    m = indices.numel()
    device = indices.device
    dinv = torch.empty(n, dtype=torch.float32, device=device)
    out = torch.empty(m, dtype=torch.float32, device=device)
    if n:
        kernel = get_kernel(SOURCE, "gf_gcn_degree", device)
        launch(kernel, ((n * 32 + 255) // 256,), (256,),
               (ptr(indptr), ptr(indices), ptr(perm), ptr(w), np.int32(n), np.float32(fill), ptr(dinv)), device)
    if m:
        kernel = get_kernel(SOURCE, "gf_gcn_edges", device)
        launch(kernel, ((m + 255) // 256,), (256,),
               (ptr(indptr), ptr(indices), ptr(perm), ptr(w), np.int32(n), np.int32(m), np.float32(fill),
                ptr(dinv), ptr(out)), device)
    return out
