"""gnn_fastpath: fused, IO-aware CUDA kernels behind DGL and PyG layers.

Imports with nothing but torch and numpy: CuPy, a GPU, DGL and PyG are all optional.
"""
from . import cuda, ops
from .graph import Graph
from .ops import dot_attention, gatv2_attention, segment_reduce, spmm

__version__ = "0.1.0"

__all__ = ["Graph", "gatv2_attention", "dot_attention", "spmm", "segment_reduce", "cuda", "ops",
           "__version__"]
