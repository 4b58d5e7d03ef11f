"""Python entry points of the CSR construction kernels (csr_build.cu)."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .loader import get_kernel, launch

_THREADS = 256


def csr_indptr(sorted_rows: Tensor, n_rows: int) -> Tensor:
    """indptr [n_rows+1] (int64) from CUDA row ids [M] sorted ascending, all < n_rows."""
    rows = sorted_rows.to(torch.int64).contiguous()
    m = rows.numel()
    indptr = torch.empty(n_rows + 1, dtype=torch.int64, device=rows.device)
    kernel = get_kernel("csr_build.cu", "csr_indptr_from_sorted", rows.device)
    blocks = (m + 1 + _THREADS - 1) // _THREADS
    launch(kernel, (blocks,), (_THREADS,), (np.uint64(rows.data_ptr()), np.int64(m),
                                             np.int64(n_rows), np.uint64(indptr.data_ptr())), rows.device)
    return indptr
