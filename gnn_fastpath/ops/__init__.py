"""Differentiable graph ops, one per kernel family; each picks its backend per call.

``gatv2_attention``, ``dot_attention``, ``spmm`` and ``segment_reduce`` run fused CUDA
kernels for CUDA float32 inputs once those kernels exist (:func:`backend_for` says which
backend an input gets), and the pure-PyTorch reference otherwise.
"""
from ._dispatch import CUDA, REFERENCE, backend_for, force_reference, has_cuda_kernels, reference_forced
from .aggregation import segment_reduce, spmm
from .attention import dot_attention, gatv2_attention
from .gcn_norm import gcn_norm_values

__all__ = ["gatv2_attention", "dot_attention", "spmm", "segment_reduce", "gcn_norm_values", "backend_for",
           "force_reference", "has_cuda_kernels", "reference_forced", "CUDA", "REFERENCE"]
