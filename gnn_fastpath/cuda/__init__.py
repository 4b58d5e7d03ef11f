"""CUDA kernels: CUDA C++ sources (.cu/.cuh) compiled at first use with CuPy (NVRTC).

``available()`` says whether they can run here; ``unavailable_reason()`` says why not.
Nothing here imports CuPy until a kernel is needed, so the package imports without it.
"""
from .csr import csr_indptr
from .loader import available, get_kernel, launch, ptr, read_source, unavailable_reason

__all__ = ["available", "unavailable_reason", "get_kernel", "launch", "ptr", "read_source", "csr_indptr"]
