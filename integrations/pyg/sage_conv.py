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

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ... import ops
from ...ops.dispatch import require
from ..shim import Unsupported, check_like, linear_dtype
from .graph import (EdgeIndex, check_inputs, check_sparse_product, graph_of, is_sparse, pair_features,
                    sparse_values)

#: The plain aggregation modules by class name, and the reduction each performs.
_PLAIN = {"SumAggregation": "sum", "MeanAggregation": "mean", "MaxAggregation": "max",
          "MinAggregation": "min"}
#: ``torch_geometric.utils.spmm``'s reading of ``module.aggr`` on the fused sparse path.
_SPARSE_REDUCE = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min"}
_NO_FUSED_BRANCH = "'message_and_aggregate' not implemented"


def _reduce_of(module) -> Optional[str]:
    """The reduction of ``module.aggr_module`` when it is one of the plain ones, else None."""
    from torch_geometric.nn import aggr

    aggr_module = getattr(module, "aggr_module", None)
    name = type(aggr_module).__name__
    if name in _PLAIN and type(aggr_module) is getattr(aggr, name):
        return _PLAIN[name]
    return None


def op_for(module) -> str:
    """The op family ``module`` runs on (the Shim's ``op``)."""
    return "segment_reduce" if _reduce_of(module) in ("max", "min") else "spmm"


def features(x, *args, **kwargs) -> Tensor:
    """The tensor deciding device and dtype: ``x`` or ``x[0]`` of a pair."""
    return pair_features(x)


def _check_module(module) -> str:
    from torch_geometric.nn.conv import SAGEConv

    # (overridden message-passing methods are caught for every PyG shim in integrations/shim.py)
    cls = type(module)
    if getattr(cls, "SUPPORTS_FUSED_EDGE_INDEX", False) is not getattr(SAGEConv, "SUPPORTS_FUSED_EDGE_INDEX", False):
        raise Unsupported("subclass", f"{cls.__name__} changes SUPPORTS_FUSED_EDGE_INDEX")
    reduce = _reduce_of(module)
    if reduce is None:
        raise Unsupported("aggr", f"aggr={module.aggr!r} (the fused path takes sum, mean, max and min)")
    if module.flow != "source_to_target":
        raise Unsupported("flow", f"flow={module.flow!r}")
    if module.node_dim not in (-2, 0):
        raise Unsupported("node_dim", f"node_dim={module.node_dim}")
    return reduce


def _split(x) -> Tuple[Tensor, Optional[Tensor]]:
    """(x_src, x_dst or None), both 2-D with one dtype and device."""
    if isinstance(x, Tensor):
        x_src, x_dst = x, x
    elif isinstance(x, (tuple, list)) and len(x) == 2:
        x_src, x_dst = x
        if not isinstance(x_src, Tensor):
            raise Unsupported("input", f"x[0] is a {type(x_src).__name__}")
        if x_dst is not None:
            check_like("x[1]", x_dst, x_src)
    else:
        raise Unsupported("input", f"x is a {type(x).__name__}, not a tensor or a pair of tensors")
    if x_src.dim() != 2 or (x_dst is not None and x_dst.dim() != 2):
        raise Unsupported("input", "node features must be 2-D [N, F]")
    return x_src, x_dst


def _size_entry(value):
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise Unsupported("size", f"size entry {value!r}")


def _node_counts(edge_index, size, x_src: Tensor, x_dst: Optional[Tensor]) -> Tuple[int, int]:
    """(n_src, n_dst) as ``propagate`` settles them; Unsupported where stock raises."""
    if EdgeIndex is not None and isinstance(edge_index, EdgeIndex):
        sizes = [edge_index.num_rows, edge_index.num_cols]  # ``size`` is ignored
    elif isinstance(edge_index, Tensor) and edge_index.layout != torch.strided:
        if edge_index.dim() != 2:
            raise Unsupported("edge_index", f"sparse adjacency of shape {tuple(edge_index.shape)}")
        sizes = [edge_index.size(1), edge_index.size(0)]  # ``size`` is ignored
    elif size is None:
        sizes = [None, None]
    elif isinstance(size, (tuple, list)) and len(size) == 2:
        sizes = [_size_entry(size[0]), _size_entry(size[1])]
    else:
        raise Unsupported("size", f"size={size!r}")
    for dim, t in ((1, x_dst), (0, x_src)):
        if t is None:
            continue
        if sizes[dim] is None:
            sizes[dim] = t.size(0)
        elif sizes[dim] != t.size(0):
            raise Unsupported("size", f"size[{dim}] = {sizes[dim]} but the features have {t.size(0)} rows")
    return sizes[0], sizes[1] if sizes[1] is not None else sizes[0]


def _propagate_function(module):
    """The function behind the ``propagate`` stock calls (instance attribute first)."""
    propagate = module.__dict__.get("propagate") or type(module).propagate
    return getattr(propagate, "__func__", propagate)


def _runs_fused(module) -> bool:
    """Whether the propagate stock runs has a fused branch. PyG compiles one ``propagate`` per
    class from a template, with the fused branch only when the class's *first* instance had
    ``fuse`` set; otherwise that branch raises NotImplementedError for sparse inputs."""
    code = getattr(_propagate_function(module), "__code__", None)
    return code is None or _NO_FUSED_BRANCH not in code.co_consts


def _csr_gives_pointer(module) -> bool:
    """Whether a CSR adjacency hands the aggregation a target pointer: the templated
    ``collect`` does (``crow_indices``), ``MessagePassing._collect`` (used when the template
    could not be compiled) does not."""
    from torch_geometric.nn.conv import MessagePassing

    return _propagate_function(module) is not MessagePassing.propagate


def _aggregation(module, reduce: str, edge_index, x_src: Tensor):
    """(reduce, edge weight or None, tie rule) of the path stock takes for this input."""
    if is_sparse(edge_index) and module.fuse:
        # message_and_aggregate: torch.sparse.mm with the adjacency's values
        if not _runs_fused(module):
            raise Unsupported("aggr", "this class's compiled propagate has no fused branch (stock raises)")
        sparse_reduce = _SPARSE_REDUCE.get(module.aggr) if isinstance(module.aggr, str) else None
        if sparse_reduce != reduce:
            raise Unsupported("aggr", f"aggr={module.aggr!r} with a {type(module.aggr_module).__name__}")
        values = check_like("adjacency values", sparse_values(edge_index), x_src)
        if values.requires_grad:
            raise Unsupported("sparse_grad", "the adjacency's values require grad")
        projected = module.project and hasattr(module, "lin")
        check_sparse_product(values, linear_dtype(x_src, module.lin.weight) if projected else x_src.dtype, reduce)
        if reduce in ("max", "min") and x_src.is_cuda:
            raise Unsupported("sparse_reduce", f"{reduce} of a torch.sparse adjacency on CUDA "
                                               "(stock raises NotImplementedError)")
        return reduce, values, "first"
    # message + aggregate: the aggregation reduces by segment when it was built under
    # deterministic algorithms and the graph gives a target pointer (sorted EdgeIndex, CSR).
    is_edge_index = EdgeIndex is not None and isinstance(edge_index, EdgeIndex)
    by_segment = getattr(module.aggr_module, "_deterministic", False) and (
        (is_edge_index and edge_index.is_sorted_by_col)
        or (edge_index.layout == torch.sparse_csr and _csr_gives_pointer(module)))
    if not by_segment:
        return reduce, None, "split"
    if is_edge_index and edge_index.num_cols is None:
        raise Unsupported("size", "sorted EdgeIndex without a target count on the segment path")
    if reduce in ("max", "min"):
        raise Unsupported("segment_ties", "PyG's deterministic segment reduction: torch's "
                                          "_segment_reduce backward splits a tie's gradient only when "
                                          "it is positive (a negative one goes whole to every tied edge)")
    return reduce, None, "split"


def forward(module, backend: str, x, edge_index, size=None):
    """Fused ``SAGEConv.forward``: same arguments, same return value."""
    reduce = _check_module(module)
    x_src, x_dst = _split(x)
    check_inputs(module, x_src)
    n_src, n_dst = _node_counts(edge_index, size, x_src, x_dst)
    graph = graph_of(edge_index, n_src, n_dst, x_src)
    reduce, weight, tie = _aggregation(module, reduce, edge_index, x_src)
    require("segment_reduce" if reduce in ("max", "min") else "spmm", x_src.device, x_src.dtype, graph)

    if module.project and hasattr(module, "lin"):
        x_src = module.lin(x_src).relu()
    if reduce in ("max", "min"):
        out = ops.segment_reduce(graph, x_src, reduce, edge_weight=weight, tie_break=tie)
    else:
        out = ops.spmm(graph, x_src, edge_weight=weight, norm="right" if reduce == "mean" else "none")
    out = module.lin_l(out)
    if module.root_weight and x_dst is not None:
        out = out + module.lin_r(x_dst)
    if module.normalize:
        out = F.normalize(out, p=2.0, dim=-1)
    return out
