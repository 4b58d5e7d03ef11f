"""The ops in plain PyTorch: the CPU path and the oracle every kernel test compares against."""
from .aggregation import degree_norms, segment_reduce, spmm
from .attention import dot_attention, gat_attention, gatv2_attention

__all__ = ["gat_attention", "gatv2_attention", "dot_attention", "spmm", "segment_reduce", "degree_norms"]
