"""PyG ``SAGEConv`` on :func:`gnn_fastpath.segment_reduce` (max/min) and :func:`gnn_fastpath.spmm`
(mean/sum).

Reproduces ``torch_geometric.nn.conv.SAGEConv.forward`` (PyG 2.8): ``x`` becomes the pair
``(x, x)``; with ``project`` the source side becomes ``lin(x_src).relu()`` (the target side is
not projected); the neighbourhood aggregate goes through ``lin_l``; with ``root_weight`` and a
target side, ``lin_r(x_dst)`` is added; with ``normalize``, ``F.normalize(out, p=2, dim=-1)``.
The submodules ``lin``, ``lin_l`` and ``lin_r`` are called as submodules.

Aggregations (``aggr`` as the strings ``"sum"``/``"add"``, ``"mean"``, ``"max"``, ``"min"`` or as
an instance of the plain ``SumAggregation``/``MeanAggregation``/``MaxAggregation``/
``MinAggregation``; every other aggregation is Unsupported("aggr")), by graph input, the path
stock takes:

- ``edge_index`` Tensor, ``EdgeIndex``, or a torch.sparse adjacency when ``module.fuse`` is
  False (an aggregation given as a module instance): message ``x_j`` and PyG's ``scatter``.
  The adjacency's values are ignored. ``sum``: ``spmm(norm="none")``; ``mean``: sum divided by
  the in-degree clamped to >= 1 (``scatter(reduce="mean")``: zero in-degree gives 0), which is
  ``spmm(norm="right")``; ``max``/``min``: ``torch.scatter_reduce(include_self=False)`` on a
  zero tensor (zero in-degree gives 0), whose gradient splits a tie evenly among the tied edges
  plus the untouched zero when the extreme is 0: ``segment_reduce(tie_break="split")``.
- an aggregation built under ``torch.use_deterministic_algorithms`` and a graph that hands it
  a target pointer (``EdgeIndex`` sorted by target; a CSR adjacency on the unfused path when
  PyG's templated ``collect`` runs): PyG reduces by segment (``torch._segment_reduce``). Sum
  and mean are the same as above; max/min run stock (Unsupported("segment_ties")): torch's
  backward of that op divides a tie's gradient among the tied entries only when it is
  positive and gives a negative one whole to each of them (torch 2.13), no rule to copy.
- torch.sparse COO/CSR adjacency with ``module.fuse`` (a string aggregation): stock's
  ``message_and_aggregate``, ``torch.sparse.mm(adj_t, x_src, reduce)``, in which the
  adjacency's values multiply the messages. ``sum``/``mean`` as above with the values as edge
  weights (``mean`` divides by the stored entries per row); ``max``/``min`` (CPU only: stock
  raises NotImplementedError on CUDA, so CUDA runs stock) give a tie's whole gradient to the
  first tied entry in storage order: ``tie_break="first"``.

Node counts follow ``propagate``: an ``EdgeIndex``'s sparse sizes or a sparse adjacency's
shape, else ``size``, completed from the features; the output has ``size[1]`` rows, or
``size[0]`` when there is no target side (``x = (x_src, None)`` without ``size``).

Falls back (Unsupported) for: other aggregations, ``flow="target_to_source"``, a subclass
overriding any message-passing method, features that are not 2-D, sizes that disagree with the
features (stock raises), the graph inputs listed in :mod:`.graph`, sparse values that require
grad, max/min of a torch.sparse adjacency on CUDA.

Reduced precision (see :mod:`..shim`): the ops aggregate what stock aggregates, in its dtype:
the raw input without ``project`` (float32 under autocast: ``lin_l`` comes after), the 16-bit
``lin(x).relu()`` with it; mean/sum write the features' dtype (float32 arithmetic, one
rounding), max/min are exact; ``lin_l``, ``lin_r`` and ``F.normalize`` then give stock's
output dtype (under CUDA autocast: 16-bit from ``lin_l``, float32 after ``F.normalize``).
A torch.sparse adjacency whose values' dtype differs from the aggregated features' runs
stock, as does a 16-bit sum over one on the CPU (stock raises there).

Known difference: on CUDA with torch-scatter installed and features requiring grad, stock's
max/min run ``torch_scatter.scatter_max``/``scatter_min``, which give a tie's gradient to one
arbitrary tied edge (a racy write); the fused path keeps the ``"split"`` rule there (values are
identical; only the gradient of exact ties differs).
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.conv import SAGEConv

from gnn_fastpath.ops.dispatch import require
from ..shim import linear_dtype
from .aggregation import (aggregate, aggregation, check_module, csr_gives_pointer, node_counts, op_of,
                          reduce_of, runs_fused, split)
from .graph import check_inputs, graph_of, pair_features

# The helpers live in .aggregation (shared with GINConv, GraphConv, EdgeConv); the old
# private names stay for the tests that reach them.
_runs_fused = runs_fused
_csr_gives_pointer = csr_gives_pointer


def op_for(module) -> str:
    """The op family ``module`` runs on (the Shim's ``op``)."""
    return op_of(reduce_of(module))


def features(x, *args, **kwargs) -> Tensor:
    """The tensor deciding device and dtype: ``x`` or ``x[0]`` of a pair."""
    return pair_features(x)


def forward(module, backend: str, x, edge_index, size=None):
    """Fused ``SAGEConv.forward``: same arguments, same return value."""
    reduce = check_module(module, SAGEConv)
    x_src, x_dst = split(x)
    check_inputs(module, x_src)
    n_src, n_dst = node_counts(edge_index, size, x_src, x_dst)
    graph = graph_of(edge_index, n_src, n_dst, x_src)
    projected = module.project and hasattr(module, "lin")
    path = aggregation(module, reduce, edge_index, x_src,
                       linear_dtype(x_src, module.lin.weight) if projected else x_src.dtype)
    require(op_of(reduce), x_src.device, x_src.dtype, graph)

    if projected:
        x_src = module.lin(x_src).relu()
    out = aggregate(graph, x_src, path, path.values)
    out = module.lin_l(out)
    if module.root_weight and x_dst is not None:
        out = out + module.lin_r(x_dst)
    if module.normalize:
        out = F.normalize(out, p=2.0, dim=-1)
    return out
