"""CUDA kernels: CUDA C++ sources (.cu/.cuh) compiled at first use with CuPy (NVRTC).

``available()`` says whether they can run here; ``unavailable_reason()`` says why not.
Nothing here imports CuPy until a kernel is needed, so the package imports without it.

One launcher module per kernel family (``gat_attention``, ``gatv2_attention``,
``dot_attention``, ``segment_reduce``, ``spmm``; ``csr_build`` for the graph layer), each with
one ``.cu``; ``launch`` (kernel cache, named arguments, grid helpers) and ``worklist`` (row
chunks) are shared by all of them, ``row_attention`` (lane layout, grids, split-row
accumulators) by the GAT and GATv2 launchers, as ``attention_common.cuh`` is by the attention
kernels.
"""
from .csr_build import csr_indptr, edge_facts
from .loader import available, read_source, unavailable_reason

__all__ = ["available", "unavailable_reason", "read_source", "csr_indptr", "edge_facts"]
