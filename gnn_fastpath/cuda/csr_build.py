"""Launcher of the graph-build kernel (``csr_build.cu``): CSR row offsets from sorted rows."""
from __future__ import annotations

import torch
from torch import Tensor

from . import launch

SOURCE = "csr_build.cu"
THREADS = 256
KERNELS = launch.Family(SOURCE)


def csr_indptr(sorted_rows: Tensor, n_rows: int) -> Tensor:
    """indptr [n_rows+1] (int64) from CUDA row ids [M] sorted ascending, all < n_rows."""
    rows = sorted_rows.to(torch.int64).contiguous()
    m = rows.numel()
    indptr = torch.empty(n_rows + 1, dtype=torch.int64, device=rows.device)
    KERNELS.kernel(rows.device, "csr_indptr_from_sorted").launch(
        launch.cdiv(m + 1, THREADS), THREADS, rows=rows, num_edges=m, n_rows=n_rows, indptr=indptr)
    return indptr
