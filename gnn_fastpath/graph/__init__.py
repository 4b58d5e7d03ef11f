"""Graph layer: destination-major CSR built once per graph input and cached. Only torch here."""
from .cache import cache_size, cached_count, clear_cache, set_cache_size
from .graph import DegreeStats, Graph, KernelCSR, KernelSourceCSR, SourceCSR, register_adapter
from .tensors import GraphTensors

__all__ = ["Graph", "DegreeStats", "SourceCSR", "KernelCSR", "KernelSourceCSR", "GraphTensors", "register_adapter",
           "cache_size", "set_cache_size", "clear_cache", "cached_count"]
