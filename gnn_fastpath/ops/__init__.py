"""Differentiable graph ops, one module per kernel family.

``gat_attention``, ``gatv2_attention``, ``dot_attention``, ``spmm`` and ``segment_reduce`` (and the helper
``gcn_norm_values``) run the fused CUDA kernels when :mod:`.dispatch` says they can serve the
call, and the pure-PyTorch reference otherwise. Each family's module (``ops/<family>.py``)
holds the public op and its autograd Function; note that ``gnn_fastpath.ops.spmm`` (the
attribute) is the function, so import a module as ``from gnn_fastpath.ops.spmm import ...``.
"""
from ..config import force_reference, reference_forced
from .dispatch import CUDA, REFERENCE, backend_for
from .dot_attention import dot_attention
from .gat_attention import gat_attention
from .gatv2_attention import gatv2_attention
from .gcn_norm import gcn_norm_values
from .segment_reduce import segment_reduce
from .spmm import spmm

__all__ = ["gat_attention", "gatv2_attention", "dot_attention", "spmm", "segment_reduce", "gcn_norm_values", "backend_for",
           "force_reference", "reference_forced", "CUDA", "REFERENCE"]
