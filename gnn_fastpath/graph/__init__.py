"""Graph layer: destination-major CSR built once per framework graph and cached."""
from .cache import cache_size, cached_count, clear_cache, set_cache_size
from .graph import DegreeBuckets, DegreeStats, Graph, KernelCSR, SourceCSR

__all__ = ["Graph", "DegreeStats", "DegreeBuckets", "SourceCSR", "KernelCSR",
           "cache_size", "set_cache_size", "clear_cache", "cached_count"]
