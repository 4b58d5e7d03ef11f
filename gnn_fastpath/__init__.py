"""gnn_fastpath: fused, IO-aware CUDA kernels behind DGL and PyG layers.

    import gnn_fastpath
    gnn_fastpath.enable()          # or: with gnn_fastpath.enabled(): ...

Imports with nothing but torch and numpy: CuPy, a GPU, DGL and PyG are all optional.
"""
from . import cuda, ops, registry
from .graph import Graph
from .ops import dot_attention, gat_attention, gatv2_attention, segment_reduce, spmm
from .stats import FastpathFallbackWarning, reset_stats, stats
from .switch import disable, enable, enabled, is_enabled

# Graph.of(DGL graph / PyG EdgeIndex): imports neither the frameworks nor their integrations
# (gnn_fastpath.registry loads an integration by name once one of its graphs shows up).
registry.register_graph_adapters()

__version__ = "0.1.0"

__all__ = ["enable", "disable", "enabled", "is_enabled", "stats", "reset_stats",
           "FastpathFallbackWarning", "Graph", "gat_attention", "gatv2_attention", "dot_attention", "spmm",
           "segment_reduce", "cuda", "ops", "__version__"]
