"""The block-sparse layout of a CSR matrix, built on the GPU once per matrix: what the
tensor-core kernels (:mod:`block_spmm`, :mod:`block_attention`) walk instead of the CSR.

Rows are cut into windows of :data:`WINDOW`; the distinct columns of a window's entries,
sorted, are packed 16 per block. Per block: the 16 column ids (``cols``, -1: padding), and,
built on first use, either the 16 x 16 values in a 16-bit type (SpMM: A rounded once, as
cuSPARSE takes it; duplicate entries added) or 16 row masks (attention: bit c of row r's mask
says whether the window's row r has an entry in column slot c), with, on a multigraph, the
number of parallel entries of each cell. ``window_ptr`` [n_windows + 1]
gives each window's blocks. All arrays int32.

A B row that several rows of a window use is read once per window instead of once per entry:
the win over the CSR kernels where neighbourhoods are locally dense. :attr:`BlockLayout.sharing`
(entries per distinct (window, column) pair; 1: none) says how much there is to win.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import torch
from torch import Tensor

#: Rows per window (the mma tile's M) and columns per block (its K).
WINDOW = 16
#: Values tensors whose block values stay cached per layout.
VALUE_ENTRIES = 2


class BlockLayout:
    """The block-sparse layout of one int32 CSR matrix [n_rows, n_cols] (see the module
    docstring). Building it costs one host read (the number of blocks)."""

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
        # each CSR entry's cell among the blocks: (block * 16 + row in window) * 16 + slot
        self.position = (key_block[inverse] * WINDOW + rows % WINDOW) * 16 + key_slot[inverse]
        self.sharing = m / max(keys.numel(), 1)  # entries per distinct (window, column)
        self.fill = m / max(self.n_blocks * 256, 1)  # entries per block cell
        self._values: "OrderedDict[tuple, Tensor]" = OrderedDict()
        self._masks: Optional[Tensor] = None
        self._duplicates: Optional[bool] = None
        self._counts: Optional[Tensor] = None
        self._counts_error: Optional[str] = None

    def nbytes(self, dtype: Optional[torch.dtype] = torch.bfloat16) -> int:
        """Bytes of the structure plus one values entry of ``dtype`` (None: the row masks
        instead, as attention keeps them)."""
        cells = (self.n_blocks * 256 * torch.empty(0, dtype=dtype).element_size() if dtype is not None
                 else self.n_blocks * 16 * 4)
        return self.cols.numel() * 4 + self.window_ptr.numel() * 4 + self.position.numel() * 8 + cells

    def values(self, values: Tensor, dtype: torch.dtype) -> Tensor:
        """[n_blocks, 16, 16] of ``dtype`` for float32 CSR-order ``values`` (cached per tensor
        and version); duplicate entries add up."""
        key = (values.data_ptr(), values._version, values.numel(), dtype)
        found = self._values.get(key)
        if found is not None:
            self._values.move_to_end(key)
            return found
        dense = torch.zeros(self.n_blocks * 256, dtype=torch.float32, device=values.device)
        dense.index_add_(0, self.position, values.to(torch.float32))
        found = self._values[key] = dense.to(dtype)
        while len(self._values) > VALUE_ENTRIES:
            self._values.popitem(last=False)
        return found

    def has_duplicates(self) -> bool:
        """Whether two entries share a (row, column) cell (a multigraph's parallel edges; one
        host read, once)."""
        if self._duplicates is None:
            cells = torch.sort(self.position).values
            self._duplicates = bool((cells[1:] == cells[:-1]).any()) if cells.numel() > 1 else False
        return self._duplicates

    def masks(self) -> Tensor:
        """int32 [n_blocks * 16]: the mask of row r of block b at b * 16 + r, bit c set where
        that row has an entry in column slot c (built once)."""
        if self._masks is None:
            cells = torch.unique(self.position) if self.has_duplicates() else self.position
            bits = torch.bitwise_left_shift(torch.ones_like(cells), cells % 16)
            masks = torch.zeros(self.n_blocks * 16, dtype=torch.int64, device=cells.device)
            masks.index_add_(0, cells // 16, bits)  # distinct cells: the sum is the OR
            self._masks = masks.to(torch.int32)
        return self._masks

    def counts(self) -> Optional[Tensor]:
        """uint8 [n_blocks * 256]: the number of entries of each cell (position (b * 16 + r) *
        16 + c), where some cell has more than one (:meth:`has_duplicates`); None where every
        cell holds at most one (the masks say all). Built once (memory: the distinct cells, not
        every cell); ValueError past 255 parallel entries in one cell (also remembered)."""
        if self._counts is None and self.has_duplicates():
            if self._counts_error is not None:
                raise ValueError(self._counts_error)
            cells, n = torch.unique(self.position, return_counts=True)
            if int(n.max()) > 255:  # host read, once
                self._counts_error = "a block cell holds more than 255 parallel edges"
                raise ValueError(self._counts_error)
            counts = torch.zeros(self.n_blocks * 256, dtype=torch.uint8, device=cells.device)
            counts[cells] = n.to(torch.uint8)
            self._counts = counts
        return self._counts
