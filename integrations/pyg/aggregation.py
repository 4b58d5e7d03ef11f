"""PyG's plain neighbourhood aggregations (sum, mean, max, min of ``x_j`` or ``w_ij * x_j``) as
the fused ops run them, shared by the shims whose stock aggregates node features with
``MessagePassing``'s own machinery (``SAGEConv``, ``GINConv``, ``GraphConv``, ``EdgeConv``).

Which path stock takes depends on the graph input and the module (see :func:`aggregation`):

- a torch.sparse adjacency with ``module.fuse`` (a string aggregation and a
  ``message_and_aggregate``): ``torch.sparse.mm(adj_t, x_src, reduce)``, the adjacency's values
  multiplying the messages; max/min give a tie's whole gradient to the first tied entry in
  storage order (CPU; stock raises on CUDA);
- a PyG ``EdgeIndex`` sorted by target with ``module.fuse`` and a class that sets
  ``SUPPORTS_FUSED_EDGE_INDEX`` (``GraphConv``): ``EdgeIndex.matmul``; sum and mean only here
  (its max/min backends, torch.sparse / torch-sparse / scatter by what is installed, have no
  common tie rule);
- otherwise ``message`` + the aggregation module: ``scatter`` (max/min: torch's
  ``scatter_reduce(include_self=False)`` tie rule, ``tie_break="split"``), or, for an
  aggregation built under deterministic algorithms with a target pointer,
  ``torch._segment_reduce`` (sum/mean the same; max/min run stock: no tie rule to copy).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from gnn_fastpath import ops
from gnn_fastpath.graph import Graph
from ..shim import Unsupported, check_like
from .graph import EdgeIndex, check_sparse_product, is_sparse, sparse_values, split_pair

try:  # imported once here: an import statement would run on every layer call
    from torch_geometric.nn import aggr as _aggr
except ImportError:  # pragma: no cover - PyG missing: no shim calls reduce_of
    _aggr = None

#: The plain aggregation modules by class name, and the reduction each performs.
PLAIN = {"SumAggregation": "sum", "MeanAggregation": "mean", "MaxAggregation": "max",
         "MinAggregation": "min"}
#: ``torch_geometric.utils.spmm``'s reading of ``module.aggr`` on the fused sparse path.
SPARSE_REDUCE = {"add": "sum", "sum": "sum", "mean": "mean", "max": "max", "min": "min"}
_NO_FUSED_BRANCH = "'message_and_aggregate' not implemented"


def reduce_of(module) -> Optional[str]:
    """The reduction of ``module.aggr_module`` when it is one of the plain ones, else None."""
    # the submodule read from nn.Module's own registry, not through nn.Module.__getattr__: the
    # small-graph rule asks this on every layer call
    aggr_module = module._modules.get("aggr_module") if isinstance(module, torch.nn.Module) else None
    if aggr_module is None:
        aggr_module = getattr(module, "aggr_module", None)
    name = type(aggr_module).__name__
    if name in PLAIN and type(aggr_module) is getattr(_aggr, name):
        return PLAIN[name]
    return None


def op_of(reduce: Optional[str]) -> str:
    """The op family of a reduction: ``segment_reduce`` for max/min, ``spmm`` otherwise."""
    return "segment_reduce" if reduce in ("max", "min") else "spmm"


def check_module(module, base: type) -> str:
    """The module's plain reduction after the checks every aggregating shim needs; ``base``
    is the patched PyG class (a subclass must not change ``SUPPORTS_FUSED_EDGE_INDEX``).
    Overridden message-passing methods are caught for every PyG shim in integrations/shim.py."""
    cls = type(module)
    if getattr(cls, "SUPPORTS_FUSED_EDGE_INDEX", False) is not getattr(base, "SUPPORTS_FUSED_EDGE_INDEX", False):
        raise Unsupported("subclass", f"{cls.__name__} changes SUPPORTS_FUSED_EDGE_INDEX")
    reduce = reduce_of(module)
    if reduce is None:
        raise Unsupported("aggr", f"aggr={module.aggr!r} (the fused path takes sum, mean, max and min)")
    if module.flow != "source_to_target":
        raise Unsupported("flow", f"flow={module.flow!r}")
    if module.node_dim not in (-2, 0):
        raise Unsupported("node_dim", f"node_dim={module.node_dim}")
    return reduce


def split(x) -> Tuple[Tensor, Optional[Tensor]]:
    """(x_src, x_dst or None) of ``x`` or ``(x_src, x_dst)``, both 2-D with one dtype and
    device; a single tensor is both sides (``x = (x, x)`` in stock)."""
    return split_pair(x, single_is_target=True, none_target=True)


def _size_entry(value):
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise Unsupported("size", f"size entry {value!r}")


def node_counts(edge_index, size, x_src: Tensor, x_dst: Optional[Tensor]) -> Tuple[int, int]:
    """(n_src, n_dst) as ``propagate`` settles them: an ``EdgeIndex``'s sparse sizes or a
    sparse adjacency's shape, else ``size``, completed from the features; the target count
    falls back to the source count when neither gives it. Unsupported where stock raises."""
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


def propagate_function(module):
    """The function behind the ``propagate`` stock calls (instance attribute first)."""
    propagate = module.__dict__.get("propagate") or type(module).propagate
    return getattr(propagate, "__func__", propagate)


def runs_fused(module) -> bool:
    """Whether the propagate stock runs has a fused branch. PyG compiles one ``propagate`` per
    class from a template, with the fused branch only when the class's *first* instance had
    ``fuse`` set; otherwise that branch raises NotImplementedError for the inputs it takes."""
    code = getattr(propagate_function(module), "__code__", None)
    return code is None or _NO_FUSED_BRANCH not in code.co_consts


def csr_gives_pointer(module) -> bool:
    """Whether a CSR adjacency hands the aggregation a target pointer: the templated
    ``collect`` does (``crow_indices``), ``MessagePassing._collect`` (used when the template
    could not be compiled) does not."""
    from torch_geometric.nn.conv import MessagePassing

    return propagate_function(module) is not MessagePassing.propagate


@dataclass(frozen=True)
class Path:
    """How stock aggregates this call.

    Attributes:
        reduce: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``.
        kind: ``"sparse"`` (torch.sparse product with the adjacency's values),
            ``"edge_index"`` (``EdgeIndex.matmul``, sum/mean) or ``"message"`` (message +
            aggregation module).
        values: the adjacency's values on the ``"sparse"`` path (the edge weights), else None.
        tie: the tie rule of max/min (``segment_reduce``'s ``tie_break``).
    """

    reduce: str
    kind: str
    values: Optional[Tensor] = None
    tie: str = "split"


#: The paths without values, made once (frozen: one instance serves every call).
_PLAIN_PATHS = {(reduce, kind): Path(reduce, kind) for reduce in SPARSE_REDUCE.values()
                for kind in ("edge_index", "message")}


def aggregation(module, reduce: str, edge_index, x_src: Tensor, dtype: torch.dtype) -> Path:
    """The path stock takes for this input (see the module docstring); ``dtype`` is the dtype
    of the features stock aggregates (the sparse product multiplies them by the values)."""
    if is_sparse(edge_index) and module.fuse:
        # message_and_aggregate: torch.sparse.mm with the adjacency's values
        if not runs_fused(module):
            raise Unsupported("aggr", "this class's compiled propagate has no fused branch (stock raises)")
        sparse_reduce = SPARSE_REDUCE.get(module.aggr) if isinstance(module.aggr, str) else None
        if sparse_reduce != reduce:
            raise Unsupported("aggr", f"aggr={module.aggr!r} with a {type(module.aggr_module).__name__}")
        values = check_like("adjacency values", sparse_values(edge_index), x_src)
        if values.requires_grad:
            raise Unsupported("sparse_grad", "the adjacency's values require grad")
        check_sparse_product(values, dtype, reduce)
        if reduce in ("max", "min") and x_src.is_cuda:
            raise Unsupported("sparse_reduce", f"{reduce} of a torch.sparse adjacency on CUDA "
                                               "(stock raises NotImplementedError)")
        return Path(reduce, "sparse", values, "first")
    is_edge_index = EdgeIndex is not None and isinstance(edge_index, EdgeIndex)
    if (is_edge_index and module.fuse and getattr(type(module), "SUPPORTS_FUSED_EDGE_INDEX", False)
            and edge_index.is_sorted_by_col):
        # message_and_aggregate: EdgeIndex.matmul(x_src, input_value=edge_weight, reduce)
        if not runs_fused(module):
            raise Unsupported("aggr", "this class's compiled propagate has no fused branch (stock raises)")
        if reduce in ("max", "min"):
            raise Unsupported("edge_index_reduce", f"{reduce} of a sorted EdgeIndex (EdgeIndex.matmul: "
                                                   "torch.sparse, torch-sparse or scatter by what is "
                                                   "installed, each with its own tie rule)")
        if dtype != torch.float32:
            raise Unsupported("dtype", f"EdgeIndex.matmul of {dtype} features (stock's sparse product decides)")
        return _PLAIN_PATHS[reduce, "edge_index"]
    # message + aggregate: the aggregation reduces by segment when it was built under
    # deterministic algorithms and the graph gives a target pointer (sorted EdgeIndex, CSR).
    by_segment = getattr(module.aggr_module, "_deterministic", False) and (
        (is_edge_index and edge_index.is_sorted_by_col)
        or (edge_index.layout == torch.sparse_csr and csr_gives_pointer(module)))
    if not by_segment:
        return _PLAIN_PATHS[reduce, "message"]
    if is_edge_index and edge_index.num_cols is None:
        raise Unsupported("size", "sorted EdgeIndex without a target count on the segment path")
    if reduce in ("max", "min"):
        raise Unsupported("segment_ties", "PyG's deterministic segment reduction: torch's "
                                          "_segment_reduce backward splits a tie's gradient only when "
                                          "it is positive (a negative one goes whole to every tied edge)")
    return _PLAIN_PATHS[reduce, "message"]


def aggregate(graph: Graph, x: Tensor, path: Path, edge_weight: Optional[Tensor] = None) -> Tensor:
    """The aggregate of ``x`` [N_src, F] (times ``edge_weight`` [M], caller order) on ``path``:
    ``spmm`` for sum/mean (mean divides by the structural in-degree clamped to >= 1, 0 without
    in-edges), ``segment_reduce`` with the path's tie rule for max/min (0 without in-edges)."""
    if path.reduce in ("max", "min"):
        return ops.segment_reduce(graph, x, path.reduce, edge_weight=edge_weight, tie_break=path.tie)
    return ops.spmm(graph, x, edge_weight=edge_weight, norm="right" if path.reduce == "mean" else "none")
