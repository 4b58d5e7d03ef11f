"""Block-sparse SpMM on tensor cores for 16-bit features (``block_spmm.cu``): the layout, built
on the GPU once per matrix, and its launcher.

It is one more candidate of the SpMM family's timed algorithm choice
(:class:`gnn_fastpath.cuda.cusparse.CsrMatrix`, next to cuSPARSE's CSR algorithms and the own
CSR kernel), offered for float16/bfloat16 products on sm_80+ when the layout is dense enough
(:data:`MIN_SHARING`), so it runs only where it measured fastest.

Layout of A [n_rows, n_cols] (CSR, int32): rows in windows of :data:`WINDOW`; the distinct
columns of a window, sorted, packed 16 per block; per block the 16 column ids (-1: padding)
and the 16 x 16 values, row-major, in B's 16-bit type (A rounded once, as cuSPARSE takes it;
products and sums are float32). The structure costs two host reads when built; the values
are scattered into the blocks once per values tensor (kept for the last
:data:`VALUE_ENTRIES` of them).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import torch
from torch import Tensor

from . import launch

SOURCE = "block_spmm.cu"
KERNELS = launch.Family(SOURCE)
#: Rows per window (the mma tile's M) and columns per block (its K).
WINDOW = 16
#: Warps per thread block (as in the .cu).
WARPS = 4
#: The layout is offered only when a window's rows share their columns at least this much
#: (entries per distinct (window, column) pair; 1: no sharing): without sharing the kernel
#: reads a B row once per entry, like the CSR kernels, while the layout costs 1 KiB per 16
#: distinct pairs.
MIN_SHARING = 1.5
#: Values tensors whose block values stay cached per layout.
VALUE_ENTRIES = 2
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


class BlockLayout:
    """The block-sparse layout of one int32 CSR matrix (see the module docstring)."""

    def __init__(self, indptr: Tensor, indices: Tensor, n_rows: int, n_cols: int):
        device = indices.device
        m = indices.numel()
        self.n_rows, self.n_cols, self.nnz = n_rows, n_cols, m
        self.n_windows = (n_rows + WINDOW - 1) // WINDOW
        rows = torch.repeat_interleave(torch.arange(n_rows, device=device), (indptr[1:] - indptr[:-1]).long(),
                                       output_size=m)
        window = rows // WINDOW
        keys, inverse = torch.unique(window * max(n_cols, 1) + indices.long(), sorted=True, return_inverse=True)
        key_window = keys // max(n_cols, 1)
        key_col = keys - key_window * max(n_cols, 1)
        counts = torch.bincount(key_window, minlength=self.n_windows)
        blocks = (counts + 15) // 16
        window_ptr = torch.zeros(self.n_windows + 1, dtype=torch.int64, device=device)
        window_ptr[1:] = torch.cumsum(blocks, 0)
        self.n_blocks = int(window_ptr[-1])  # host read (the layout is built once per matrix)
        rank = torch.arange(keys.numel(), device=device) - (torch.cumsum(counts, 0) - counts)[key_window]
        key_block = window_ptr[key_window] + rank // 16
        key_slot = rank % 16
        cols = torch.full((self.n_blocks * 16,), -1, dtype=torch.int32, device=device)
        cols[key_block * 16 + key_slot] = key_col.to(torch.int32)
        self.cols = cols
        self.window_ptr = window_ptr.to(torch.int32)
        # each CSR entry's place among the blocks' values: (block * 16 + row in window) * 16 + slot
        self.position = (key_block[inverse] * WINDOW + rows % WINDOW) * 16 + key_slot[inverse]
        self.sharing = m / max(keys.numel(), 1)  # entries per distinct (window, column)
        self.fill = m / max(self.n_blocks * 256, 1)  # entries per block cell
        self._values: "OrderedDict[tuple, Tensor]" = OrderedDict()

    def nbytes(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes of the layout with one values entry of ``dtype``."""
        return (self.cols.numel() * 4 + self.window_ptr.numel() * 4 + self.position.numel() * 8
                + self.n_blocks * 256 * torch.empty(0, dtype=dtype).element_size())

    def values(self, values: Tensor, dtype: torch.dtype) -> Tensor:
        """[n_blocks, 16, 16] of ``dtype`` for float32 CSR-order ``values`` (cached per tensor
        and version)."""
        key = (values.data_ptr(), values._version, values.numel(), dtype)
        found = self._values.get(key)
        if found is not None:
            self._values.move_to_end(key)
            return found
        dense = torch.zeros(self.n_blocks * 256, dtype=torch.float32, device=values.device)
        dense.index_add_(0, self.position, values.to(torch.float32))  # duplicate entries add up
        found = self._values[key] = dense.to(dtype)
        while len(self._values) > VALUE_ENTRIES:
            self._values.popitem(last=False)
        return found

    def matmul(self, values: Tensor, b: Tensor, c: Tensor) -> Tensor:
        """c [n_rows, F] = A @ b [n_cols, F] (see :func:`supported`); every row of c written."""
        F = b.size(1)
        a = self.values(values, b.dtype)
        nt = 16 if F > 64 else 8  # n-tiles of 8 features per warp: A is read once per warp
        n_tiles = (F + nt * 8 - 1) // (nt * 8)
        items = self.n_windows * n_tiles
        if items == 0:
            return c
        KERNELS.kernel(b.device, "bs_spmm", launch.ctype(b.dtype), launch.ctype(c.dtype), nt).launch(
            launch.cdiv(items, WARPS), 32 * WARPS, window_ptr=self.window_ptr, cols=self.cols, a=a, b=b,
            n_windows=self.n_windows, n_rows=self.n_rows, F=F, n_tiles=n_tiles, c=c)
        return c


def layout_if_dense(indptr: Tensor, indices: Tensor, n_rows: int, n_cols: int) -> Optional[BlockLayout]:
    """The layout when the rows of its windows share columns (:data:`MIN_SHARING`), else None."""
    layout = BlockLayout(indptr, indices, n_rows, n_cols)
    return layout if layout.sharing >= MIN_SHARING else None
