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

A graph that lives one step (a sampled mini-batch) pays the fused path's graph build (CSR,
degrees, self loops) in every step, which a static graph pays once; where that moves a layer's
crossover, the layer has a second, *new-graph* entry (:data:`NEW_GRAPH_MIN_EDGE_FEATURES`),
which applies to a graph input until it has been called :data:`STATIC_AFTER_CALLS` times (more
than the layer calls of one step of any usual model, so a sampled batch never gets there and a
static graph does within its first steps). The count is kept per graph input object, weakly, for the
last :data:`COUNTED_GRAPHS` graph inputs, and only for calls between the two entries.

Under ``torch.compile`` without CUDA graphs (the default mode), a traced fused layer still runs
each operator's Python body per call and builds the graph's CSR inside the compiled step, while
compiled stock is a few Inductor kernels; there the layers with an entry in
:data:`COMPILED_MIN_EDGE_FEATURES` trace their stock forward below that size (every size, for an
entry of None), counted under ``stats()[layer]["compiled"]`` as
``"fallback:compiled_stock_faster"``. With CUDA graphs (``mode="reduce-overhead"``) the host
work is recorded once and the fused path is traced at every size.

``GNN_FASTPATH_SMALL_GRAPH=off`` runs the fused path at every size, eager and compiled (to
measure it; a function compiled before the switch changed keeps its choice until
``torch._dynamo.reset()``).
"""
from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Dict, Optional, Tuple

import torch

from gnn_fastpath import config
from gnn_fastpath.graph.convert import tensor_version

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

#: (layer key, variant) -> the edge features from which the fused path runs on a *new* graph
#: (a graph input called fewer than :data:`STATIC_AFTER_CALLS` times), where that is more than
#: :data:`MIN_EDGE_FEATURES` says. GCNConv's fused path on a new graph also builds the graph
#: with self loops and its degree normalisation; its sampled training step (arxiv-like, batch
#: 1024: 99.6k edges, 128 then 64 features) was slower than stock's, so until a new-graph sweep
#: measures its crossover it takes the largest aggregation entry.
NEW_GRAPH_MIN_EDGE_FEATURES: Dict[Tuple[str, str], int] = {
    ("pyg.GCNConv", "spmm"): _SPMM_SUM_MEAN,
}
#: Under torch.compile without CUDA graphs: (layer key, variant) -> the edge features from which
#: the traced fused path runs; None: stock at every size measured. Measured on an H200 as whole
#: 3-layer training steps (hidden 64, fp32) of compiled stock against compiled enabled
#: (``python -m benchmarks.bench_compile --mode full --compile default``; benchmarks/RESULTS.md,
#: "torch.compile's default mode"): GCNConv was slower fused on tolokers, arxiv-like and
#: pokec-like (30.6M edges); SAGEConv max fused was slower on tolokers and arxiv-like, faster on
#: pokec-like, whose 64-wide layers give its entry. The sum and mean aggregations of SAGEConv,
#: GINConv and GraphConv run GCNConv's op and graph build and take its entry; their max/min
#: take SAGEConv max's. Layers without an entry (the attention layers, EdgeConv, AGNNConv)
#: trace their fused path at every size.
_COMPILED_MAX_MIN = 30_600_000 * 64
COMPILED_MIN_EDGE_FEATURES: Dict[Tuple[str, str], Optional[int]] = {
    ("pyg.GCNConv", "spmm"): None,
    ("pyg.GCNConv", "cached"): None,
    ("pyg.SAGEConv", "spmm"): None,
    ("pyg.SAGEConv", "segment_reduce"): _COMPILED_MAX_MIN,
    ("pyg.GINConv", "spmm"): None,
    ("pyg.GINConv", "segment_reduce"): _COMPILED_MAX_MIN,
    ("pyg.GraphConv", "spmm"): None,
    ("pyg.GraphConv", "segment_reduce"): _COMPILED_MAX_MIN,
}

#: Calls on one graph input after which it counts as static (no longer new).
STATIC_AFTER_CALLS = 16


_largest: Dict[str, int] = {}
_largest_of: list = [None, None]  # the tables _largest was built from (tests replace them)


def largest(layer: str) -> Optional[int]:
    """The largest entry of layer key ``layer`` (None: no entry): a call at least this large
    runs fused whatever its variant, so the rule asks nothing more of it."""
    if _largest_of[0] is not MIN_EDGE_FEATURES or _largest_of[1] is not NEW_GRAPH_MIN_EDGE_FEATURES:
        _largest.clear()
        for table in (MIN_EDGE_FEATURES, NEW_GRAPH_MIN_EDGE_FEATURES):
            for (key, _), least in table.items():
                _largest[key] = max(least, _largest.get(key, 0))
        _largest_of[:] = [MIN_EDGE_FEATURES, NEW_GRAPH_MIN_EDGE_FEATURES]
    return _largest.get(layer)


def variant(layer: str, op: str, module) -> str:
    """The table's variant of ``module`` running op ``op``."""
    if layer.endswith("GCNConv") and getattr(module, "cached", False):
        return "cached"
    return op


#: How many graph inputs :func:`calls_on` keeps counts for (the oldest dropped first): a few
#: static graphs and the sampled batches of the last steps.
COUNTED_GRAPHS = 64
# id(graph input) -> [weak reference, fingerprint..., calls]. Not the shared graph cache
# (:func:`gnn_fastpath.graph.cache.cached`): a sampled batch asks once per layer call, and a
# plain dict with a weak reference without a callback costs a fraction of that cache's entry.
# No lock: a count lost to a race between threads only delays a graph's move to fused.
_counts: "OrderedDict[int, list]" = OrderedDict()


def calls_on(graph_input) -> int:
    """How many times the rule has been asked about ``graph_input`` (this call included), while
    the object lives unchanged (its tensor version); 1 for anything it cannot count."""
    if not isinstance(graph_input, torch.Tensor):
        return 1
    key = id(graph_input)
    entry = _counts.get(key)
    if type(graph_input) is torch.Tensor and graph_input.layout is torch.strided and graph_input.dim() == 2:
        # an edge_index, fingerprinted inline and compared field by field (a sampled batch pays
        # this on every call; no tuple is built): in-place writes bump _version; `.data =`
        # bumps nothing, so the storage pointer, sizes and dtype stand in for it
        try:
            version = graph_input._version
        except RuntimeError:  # an inference tensor has no version counter: its storage stands in
            version = -1
        pointer, rows, cols, dtype = graph_input.data_ptr(), graph_input.size(0), graph_input.size(1), graph_input.dtype
        if (entry is not None and entry[0]() is graph_input and len(entry) == 7 and entry[1] == version
                and entry[2] == pointer and entry[3] == rows and entry[4] == cols and entry[5] is dtype):
            entry[6] += 1
            return entry[6]
        fresh = [weakref.ref(graph_input), version, pointer, rows, cols, dtype, 1]
    else:
        fingerprint = tensor_version(graph_input)
        if entry is not None and entry[0]() is graph_input and len(entry) == 3 and entry[1] == fingerprint:
            entry[2] += 1
            return entry[2]
        fresh = [weakref.ref(graph_input), fingerprint, 1]
    if entry is None and len(_counts) >= COUNTED_GRAPHS:
        try:
            _counts.popitem(last=False)  # the oldest first asked about
        except KeyError:  # emptied by another thread meanwhile
            pass
    _counts[key] = fresh
    return 1


@torch.compiler.assume_constant_result
def _rule_off() -> bool:
    """``GNN_FASTPATH_SMALL_GRAPH=off``: the fused path at every size. While dynamo traces it is
    taken as a constant (dynamo does not trace the environment's internals), without a guard: a
    compiled function keeps the choice it was traced with until ``torch._dynamo.reset()``."""
    return config.setting("GNN_FASTPATH_SMALL_GRAPH") == "off"


def blocker(layer: str, op: str, module, num_edges: Optional[int], width: int,
            graph_input=None) -> Optional[Tuple[str, str]]:
    """``("small_graph", detail)`` when a call over ``num_edges`` edges of ``width``-wide input
    features runs stock by the rule (never with ``GNN_FASTPATH_SMALL_GRAPH=off``);
    ``graph_input`` (the caller's graph object) is counted where the layer's new-graph entry
    applies."""
    if num_edges is None or _rule_off():
        return None
    key = (layer, variant(layer, op, module))
    size = num_edges * width
    least = MIN_EDGE_FEATURES.get(key)
    if least is not None and size < least:
        return "small_graph", (f"{num_edges} edges x {width} features, fused from {least} edge features "
                               "(GNN_FASTPATH_SMALL_GRAPH=off runs it fused)")
    new_least = NEW_GRAPH_MIN_EDGE_FEATURES.get(key)
    if new_least is None or size >= new_least or graph_input is None:
        return None
    calls = calls_on(graph_input)
    if calls > STATIC_AFTER_CALLS:
        return None
    return "small_graph", (f"{num_edges} edges x {width} features on a new graph (call {calls} on it), fused from "
                           f"{new_least} edge features until a graph has had {STATIC_AFTER_CALLS} calls "
                           "(GNN_FASTPATH_SMALL_GRAPH=off runs it fused)")


def compiled_blocker(layer: str, op: str, module, num_edges, width: int) -> Optional[Tuple[str, str]]:
    """``("compiled_stock_faster", detail)`` when a call traced for torch.compile without CUDA
    graphs, over ``num_edges`` edges of ``width``-wide features, runs stock by
    :data:`COMPILED_MIN_EDGE_FEATURES` (never with ``GNN_FASTPATH_SMALL_GRAPH=off``). Read while
    dynamo traces: ``num_edges`` may be symbolic (``dynamic=True``), and comparing it guards the
    compiled graph on the side of the entry it falls."""
    key = (layer, variant(layer, op, module))
    if key not in COMPILED_MIN_EDGE_FEATURES or _rule_off():
        return None
    least = COMPILED_MIN_EDGE_FEATURES[key]
    if least is None:
        return "compiled_stock_faster", ("torch.compile without CUDA graphs: compiled stock was faster at every "
                                         "size measured (mode='reduce-overhead' or GNN_FASTPATH_SMALL_GRAPH=off "
                                         "trace it fused)")
    if num_edges * width >= least:
        return None
    return "compiled_stock_faster", (f"torch.compile without CUDA graphs: compiled stock is faster below {least} "
                                     "edge features (mode='reduce-overhead' or GNN_FASTPATH_SMALL_GRAPH=off trace "
                                     "it fused)")


def compiled_stock_at_every_size(layer: str, op: str, module) -> bool:
    """Whether :func:`compiled_blocker` sends every call of ``module`` to stock whatever its size
    (an entry of None), while the rule is on."""
    key = (layer, variant(layer, op, module))
    return key in COMPILED_MIN_EDGE_FEATURES and COMPILED_MIN_EDGE_FEATURES[key] is None and not _rule_off()


def thresholds(layer: str, op: str, module) -> Tuple[int, int]:
    """(the static entry, the new-graph entry) of ``module`` running op ``op``, 0 where it has
    none: a call below the first runs stock, below the second too while its graph is new."""
    key = (layer, variant(layer, op, module))
    return MIN_EDGE_FEATURES.get(key) or 0, NEW_GRAPH_MIN_EDGE_FEATURES.get(key) or 0
