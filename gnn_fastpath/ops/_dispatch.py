"""Backend choice for the ops: the CUDA kernels when they can serve the input, else reference.

An op family marks itself CUDA-capable with :func:`register_cuda` once its kernels exist.
:func:`force_reference` switches every op to the reference path (tests and debugging).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch
from torch import Tensor

CUDA = "cuda"
REFERENCE = "reference"

_cuda_ops: set = set()
_state = threading.local()
#: dtypes the CUDA kernels take today.
CUDA_DTYPES = (torch.float32,)


def register_cuda(name: str) -> None:
    """Declare that op ``name`` has CUDA kernels."""
    _cuda_ops.add(name)


def has_cuda_kernels(name: str) -> bool:
    return name in _cuda_ops


@contextlib.contextmanager
def force_reference(enabled: bool = True) -> Iterator[None]:
    """Context manager: while active, every op runs its reference (pure PyTorch) path."""
    previous = getattr(_state, "forced", False)
    _state.forced = enabled
    try:
        yield
    finally:
        _state.forced = previous


def reference_forced() -> bool:
    return getattr(_state, "forced", False)


def backend_for(name: str, x: Tensor) -> str:
    """``"cuda"`` if op ``name`` would run its kernels for input ``x``, else ``"reference"``."""
    if reference_forced() or not x.is_cuda or x.dtype not in CUDA_DTYPES or name not in _cuda_ops:
        return REFERENCE
    from .. import cuda

    return CUDA if cuda.available() else REFERENCE
