"""The small-graph rule: where a patched layer runs stock because the fused path cannot win.

On a small graph a training step is bound by host time (Python, autograd, kernel launches),
not by the GPU. The fused path saves GPU time and memory but, for the plain aggregations
(stock's ``scatter`` is one cheap call), spends more host time per call than stock does, so
there it is slower until the graph is large enough for the GPU work to dominate. Below a
layer's *crossover* the layer runs its stock forward, counted in ``stats()`` under the reason
``"small_graph"`` (without a warning: nothing is unsupported, stock is simply faster there).

The crossover is counted in *edge features*: edges times the width of the call's input
features, the size of the message tensor stock's aggregation writes and reads. It is the size
from which a two-layer training step of the layer (64 features, random graphs of average
in-degree 8), fused, was no slower than stock's at every larger size measured on an H200
(``python -m benchmarks.bench_examples --parts sweep --rule off``; benchmarks/RESULTS.md,
"Small graphs"). Layers without an entry (the attention layers, ``EdgeConv``) were no slower
at every size measured, or not measured, and run fused at every size. The rule is read in
eager mode; under ``torch.compile`` the layers trace their fused path.

``GNN_FASTPATH_SMALL_GRAPH=off`` runs the fused path at every size (to measure it).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from gnn_fastpath import config

#: (layer key, variant) -> the edge features (edges x input width) from which the fused path
#: runs. The variant is what changes stock's cost: the op family of an aggregation (``spmm`` for
#: sum/mean, ``segment_reduce`` for max/min), ``cached`` for a GCNConv that caches its
#: normalisation. The sweep's sizes are 2,400 x 3^k edges at 64 features: each entry is the
#: smallest measured size with no slower size above it. GINConv and GraphConv max/min were not
#: swept: they take SAGEConv max's entry (the same stock scatter and fused op).
_SPMM_SUM_MEAN = 2_400_000 * 64
_MAX_MIN = 800_000 * 64
MIN_EDGE_FEATURES: Dict[Tuple[str, str], int] = {
    ("pyg.GCNConv", "spmm"): 24_000 * 64,
    ("pyg.GCNConv", "cached"): 800_000 * 64,
    ("pyg.SAGEConv", "spmm"): _SPMM_SUM_MEAN,
    ("pyg.SAGEConv", "segment_reduce"): _MAX_MIN,
    ("pyg.GINConv", "spmm"): _SPMM_SUM_MEAN,
    ("pyg.GINConv", "segment_reduce"): _MAX_MIN,
    ("pyg.GraphConv", "spmm"): _SPMM_SUM_MEAN,
    ("pyg.GraphConv", "segment_reduce"): _MAX_MIN,
}


_largest: Dict[str, int] = {}
_largest_of: list = [None]  # the table _largest was built from (tests replace the table)


def largest(layer: str) -> Optional[int]:
    """The largest entry of layer key ``layer`` (None: no entry): a call at least this large
    runs fused whatever its variant, so the rule asks nothing more of it."""
    if _largest_of[0] is not MIN_EDGE_FEATURES:
        _largest.clear()
        for (key, _), least in MIN_EDGE_FEATURES.items():
            _largest[key] = max(least, _largest.get(key, 0))
        _largest_of[0] = MIN_EDGE_FEATURES
    return _largest.get(layer)


def variant(layer: str, op: str, module) -> str:
    """The table's variant of ``module`` running op ``op``."""
    if layer.endswith("GCNConv") and getattr(module, "cached", False):
        return "cached"
    return op


def threshold(layer: str, op: str, module) -> Optional[int]:
    """The edge features below which ``module`` (of layer key ``layer``, on op ``op``) runs
    stock under the rule, or None (fused at every size; also with
    ``GNN_FASTPATH_SMALL_GRAPH=off``)."""
    if config.setting("GNN_FASTPATH_SMALL_GRAPH") == "off":
        return None
    return MIN_EDGE_FEATURES.get((layer, variant(layer, op, module)))


def blocker(layer: str, op: str, module, num_edges: Optional[int], width: int) -> Optional[Tuple[str, str]]:
    """``("small_graph", detail)`` when a call over ``num_edges`` edges of ``width``-wide input
    features runs stock by the rule."""
    if num_edges is None:
        return None
    least = threshold(layer, op, module)
    if least is None or num_edges * width >= least:
        return None
    return "small_graph", (f"{num_edges} edges x {width} features, fused from {least} edge features "
                           "(GNN_FASTPATH_SMALL_GRAPH=off runs it fused)")
