"""Block-sparse SpMM on tensor cores for 16-bit features (``block_spmm.cu``): the layout, built
on the GPU once per matrix, and its launcher.

It is one more candidate of the SpMM family's timed algorithm choice
(:class:`gnn_fastpath.cuda.cusparse.CsrMatrix`, next to cuSPARSE's CSR algorithms and the own
CSR kernel), offered for float16/bfloat16 products on sm_80+ when the layout is dense enough
(:data:`MIN_SHARING`), so it runs only where it measured fastest.

The layout of A [n_rows, n_cols] is :class:`gnn_fastpath.cuda.block_layout.BlockLayout` with
its values: per block the 16 x 16 values, row-major, in B's 16-bit type (A rounded once, as
cuSPARSE takes it; products and sums are float32), scattered into the blocks once per values
tensor.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import launch
from .block_layout import BlockLayout

SOURCE = "block_spmm.cu"
KERNELS = launch.Family(SOURCE)
#: Warps per thread block (as in the .cu).
WARPS = 4
#: The layout is offered only when a window's rows share their columns at least this much
#: (entries per distinct (window, column) pair; 1: no sharing): without sharing the kernel
#: reads a B row once per entry, like the CSR kernels, while the layout costs 1 KiB per 16
#: distinct pairs.
MIN_SHARING = 1.5
DTYPES = (torch.float16, torch.bfloat16)


def supported(b: Tensor, c: Tensor) -> bool:
    """Whether the kernel takes ``c = A @ b``: 16-bit b, c of b's dtype or float32, F a
    multiple of 8, 16-byte aligned rows, tensor cores with bf16 mma (sm_80+)."""
    if b.dtype not in DTYPES or c.dtype not in (b.dtype, torch.float32) or not b.is_cuda:
        return False
    F = b.size(1)
    if F % 8 or b.data_ptr() % 16 or c.data_ptr() % 16:
        return False
    return torch.cuda.get_device_capability(b.device)[0] >= 8


def matmul(layout: BlockLayout, values: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """c [n_rows, F] = A @ b [n_cols, F] with A = ``values`` (float32, CSR order) on ``layout``
    (see :func:`supported`); every row of c written."""
    F = b.size(1)
    a = layout.values(values, b.dtype)
    nt = 16 if F > 64 else 8  # n-tiles of 8 features per warp: A is read once per warp
    n_tiles = (F + nt * 8 - 1) // (nt * 8)
    items = layout.n_windows * n_tiles
    if items == 0:
        return c
    KERNELS.kernel(b.device, "bs_spmm", launch.ctype(b.dtype), launch.ctype(c.dtype), nt).launch(
        launch.cdiv(items, WARPS), 32 * WARPS, window_ptr=layout.window_ptr, cols=layout.cols, a=a, b=b,
        n_windows=layout.n_windows, n_rows=layout.n_rows, F=F, n_tiles=n_tiles, c=c)
    return c


def layout_if_dense(indptr: Tensor, indices: Tensor, n_rows: int, n_cols: int) -> Optional[BlockLayout]:
    """The layout when the rows of its windows share columns (:data:`MIN_SHARING`), else None."""
    layout = BlockLayout(indptr, indices, n_rows, n_cols)
    return layout if layout.sharing >= MIN_SHARING else None
