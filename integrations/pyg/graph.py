"""PyG graph inputs as gnn_fastpath Graphs, with PyG's size rules and derived graphs.

PyG hands a layer its graph as an ``edge_index`` [2, M] tensor (row 0 sources, row 1
targets), a PyG ``EdgeIndex`` (the same, with optional sparse sizes), or a ``torch.sparse``
COO/CSR adjacency, which :class:`~torch_geometric.nn.conv.MessagePassing` reads as
``adj_t``: rows are targets, columns sources, shape ``[N_dst, N_src]``, edges in storage
order. Node counts come from the feature tensors, as ``propagate`` infers them.

Every input the fused path does not take raises :class:`Unsupported` (so stock PyG runs
and reports its own error where it has one): ``torch_sparse.SparseTensor``, CSC layouts,
uncoalesced COO (stock marks those coalesced in place), hybrid sparse values, sizes that
disagree with the features, devices that differ, node ids out of range.

Graphs derived from the caller's graph (self loops replaced or appended) are built once and
memoised on the base Graph (:meth:`Graph.memo`), which :meth:`Graph.of` itself caches per
``edge_index`` object and version; nothing is rebuilt per call and nothing is stored on the
module or the PyG objects.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Hashable, Optional, Tuple

import torch
from torch import Tensor

from gnn_fastpath.graph import Graph, GraphTensors
from gnn_fastpath.graph.tensors import Memo, from_coo
from gnn_fastpath.config import setting
from gnn_fastpath.graph.cache import cached
from gnn_fastpath.graph.convert import edge_index_to_coo, tensor_version
from gnn_fastpath.ops.dispatch import is_compiling
from ..shim import Unsupported, check_like, out_dtype_of, result_dtype

try:  # PyG >= 2.5
    from torch_geometric import EdgeIndex
except ImportError:  # pragma: no cover
    EdgeIndex = None
try:  # imported once here: an import statement would run on every layer call
    from torch_geometric.nn.aggr import SumAggregation
except ImportError:  # pragma: no cover - PyG missing: no shim calls the checks below
    SumAggregation = None

# Stock PyG indexes with int32/int64 only (it raises, or for some layers widens smaller ids
# through its self-loop concatenation): other dtypes run stock, which decides.
_INT_DTYPES = (torch.int32, torch.int64)
_SPARSE = (torch.sparse_coo, torch.sparse_csr)


def is_sparse(edge_index) -> bool:
    """Whether ``edge_index`` is a torch.sparse adjacency the fused path reads (COO or CSR)."""
    return isinstance(edge_index, Tensor) and edge_index.layout in _SPARSE


def pair_features(x, *args, **kwargs) -> Tensor:
    """A shim's ``features``: ``x``, or ``x[0]`` of an ``(x_src, x_dst)`` pair."""
    if isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[0], Tensor):
        return x[0]
    return x


def pyg_softmax(logits: Tensor) -> Tensor:
    """The operations of ``torch_geometric.utils.softmax`` (shift by the group maximum,
    ``exp``, divide by the group sum + 1e-16), elementwise, for :func:`..shim.result_dtype`
    to see how stock types the attention weights under the ambient autocast."""
    e = (logits - logits.detach()).exp()
    return e / (e + 1e-16)


def check_sparse_product(values: Tensor, dtype: torch.dtype, reduce: str) -> None:
    """Stock's ``torch.sparse.mm(adj_t, x, reduce)`` multiplies the adjacency's values by
    features of ``dtype``: Unsupported (stock runs and decides) where the two dtypes differ
    (under autocast the projected features are 16-bit, the values are not) and for a 16-bit
    sum on the CPU (torch has no such CPU kernel: stock raises NotImplementedError)."""
    if values.dtype != dtype:
        raise Unsupported("dtype", f"a torch.sparse adjacency with {values.dtype} values times {dtype} "
                                   "features (stock's sparse product decides)")
    if values.device.type == "cpu" and reduce == "sum" and dtype in (torch.float16, torch.bfloat16):
        raise Unsupported("dtype", f"a {dtype} sum over a torch.sparse adjacency on the CPU (stock raises)")


def split_pair(x, *, single_is_target: bool = False,
               none_target: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
    """``(x, None)`` for one feature tensor (``(x, x)`` with ``single_is_target``, stock's
    ``x = (x, x)``), ``(x_src, x_dst)`` for a pair; both 2-D with one dtype and device, else
    Unsupported. A ``None`` target side of a pair is Unsupported (stock asserts) unless
    ``none_target`` (the layers whose stock takes it)."""
    if isinstance(x, Tensor):
        x_src, x_dst = x, (x if single_is_target else None)
    elif isinstance(x, (tuple, list)) and len(x) == 2:
        x_src, x_dst = x
        if not isinstance(x_src, Tensor):
            raise Unsupported("input", f"x[0] is a {type(x_src).__name__}")
        if x_dst is None:
            if not none_target:
                raise Unsupported("input", "x[1] is None")
        else:
            check_like("x[1]", x_dst, x_src)
    else:
        raise Unsupported("input", f"x is a {type(x).__name__}, not a tensor or a pair of tensors")
    if x_src.dim() != 2 or (x_dst is not None and x_dst.dim() != 2):
        raise Unsupported("input", "node features must be 2-D [N, F]")
    return x_src, x_dst


def check_message_passing(module) -> None:
    """The MessagePassing settings every shim needs: sum aggregation, source-to-target flow."""
    if module.aggr not in ("add", "sum") or type(module.aggr_module) is not SumAggregation:
        raise Unsupported("aggr", f"aggr={module.aggr!r} (the fused path sums)")
    if module.flow != "source_to_target":
        raise Unsupported("flow", f"flow={module.flow!r}")


def check_inputs(module, x: Tensor) -> None:
    """Parameters on ``x``'s device and dtype; under autocast float32 parameters with 16-bit
    features (the previous layer's output) too (:func:`..shim.check_like`). Any other mix
    runs stock, which decides."""
    if _parameters_on(module, x.dtype, x.device):
        return  # the common case, without building a name per parameter
    for name, p in module.named_parameters():
        check_like(f"parameter {name}", p, x)


#: The methods through which ``Module.parameters()`` finds a module tree's parameters.
_WALK_METHODS = ("parameters", "named_parameters", "_named_members", "named_modules")
# class -> whether it keeps torch.nn.Module's own _WALK_METHODS
_plain_walk: dict = {}


def _parameters_on(module, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether every parameter of ``module``'s tree has ``dtype`` and ``device``, as
    ``all(... for p in module.parameters())`` says (:func:`_walk_parameters`, without the
    generators of ``parameters()``: this runs on every layer call). Under torch.compile,
    through ``parameters()`` as dynamo traces it (the walk's class table is process state)."""
    found = None if is_compiling() else _walk_parameters(module, dtype, device)
    if found is None:
        return all(p.dtype == dtype and p.device == device for p in module.parameters())
    return found


def _walk_parameters(module, dtype: torch.dtype, device: torch.device) -> Optional[bool]:
    """:func:`_parameters_on` read from the ``_parameters`` and ``_modules`` dicts that
    ``parameters()`` walks. None where a class in the tree finds its parameters its own way
    (overrides one of :data:`_WALK_METHODS`): then only ``parameters()`` knows. False may also
    come from a parameter such a class would hide, which only costs :func:`check_inputs` its
    exact check. A submodule shared by two parents is visited twice, which changes nothing."""
    cls = type(module)
    plain = _plain_walk.get(cls)
    if plain is None:
        plain = _plain_walk[cls] = all(getattr(cls, name, None) is getattr(torch.nn.Module, name)
                                       for name in _WALK_METHODS)
    if not plain:
        return None
    for p in module._parameters.values():
        if p is not None and (p.dtype != dtype or p.device != device):
            return False
    for child in module._modules.values():
        if child is not None:
            found = _walk_parameters(child, dtype, device)
            if found is not True:
                return found
    return True


def check_return_attention(return_attention_weights, module=None) -> None:
    """Unsupported unless ``return_attention_weights`` is None or a bool (stock's attention
    layers test it for truth; other values run stock, which decides); under torch.compile
    also for the weights of a ``module`` that adds self loops (PyG returns them over its
    compacted looped edge list, a data-dependent shape), decided before any work is traced."""
    if not (return_attention_weights is None or isinstance(return_attention_weights, bool)):
        raise Unsupported("return_attention_weights", f"return_attention_weights={return_attention_weights!r}")
    if return_attention_weights and module is not None and module.add_self_loops and is_compiling():
        raise Unsupported("compile", "attention weights of a layer adding self loops under torch.compile")


def looped_needs_exact_graph(module, return_attention_weights, edge_attr) -> bool:
    """Whether an attention layer's call needs the exact graph (``graph_of(static=False)``): it
    adds self loops and returns attention weights over PyG's compacted looped edge list, or
    reduces ``edge_attr`` into the loops by a string ``fill_value``, which stock cannot do
    where a kept edge targets a node beyond the loops (the static graph cannot tell without
    reading the graph back; :func:`check_fill`)."""
    return bool(module.add_self_loops) and (
        bool(return_attention_weights) or (edge_attr is not None and isinstance(module.fill_value, str)))


def attention_out_dtype(name: str, stock_dtypes, h: Tensor, *dtypes: torch.dtype) -> torch.dtype:
    """The ``out_dtype`` of an attention op fed projections ``h``: the dtype of stock's messages,
    as ``stock_dtypes(h, *others)`` (returning ``(alpha, message)``) gives it for ``h``'s dtype and
    ``dtypes`` (:func:`..shim.result_dtype`, :func:`..shim.out_dtype_of` for layer ``name``);
    Unsupported where stock's attention weights would have another dtype."""
    alpha_dtype, message_dtype = result_dtype(stock_dtypes, h.device, h.dtype, *dtypes)
    out_dtype = out_dtype_of(name, h.dtype, message_dtype)
    if alpha_dtype != out_dtype:
        raise Unsupported("dtype", f"stock's attention weights ({alpha_dtype}) and messages ({out_dtype}) differ")
    return out_dtype


def attention_result(module, result, res: Optional[Tensor], edge_index, looped: Optional[Looped],
                     return_attention_weights: Optional[bool]):
    """What stock's attention layer returns from the op's ``result`` ([N, H, C], or with the
    attention weights ``(out, alpha)`` when ``return_attention_weights``): heads concatenated
    (``module.concat``) or averaged, plus the residual ``res`` (None: none) and ``module.bias``;
    with the weights ``(out, (edge_index, alpha))``, the looped ``edge_index`` built as stock
    builds it where loops were added (``looped``), or ``(out, (adj_with_alpha_values, alpha))``
    for a torch.sparse adjacency."""
    out, alpha = result if return_attention_weights else (result, None)
    out = out.view(-1, out.size(1) * out.size(2)) if module.concat else out.mean(dim=1)
    if res is not None:
        out = out + res
    if module.bias is not None:
        out = out + module.bias
    if not return_attention_weights:
        return out
    if is_sparse(edge_index):
        from torch_geometric.utils.sparse import set_sparse_value

        return out, (set_sparse_value(edge_index, alpha), alpha)
    if looped is not None:
        edge_index = stock_looped_edge_index(edge_index, looped.num_loops)
    return out, (edge_index, alpha)


def attention_dropout(module) -> float:
    """The attention dropout probability stock applies now (0 in eval mode)."""
    p = module.dropout
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise Unsupported("dropout", f"dropout={p!r}")
    return float(p) if module.training else 0.0


def graph_of(edge_index, n_src: int, n_dst: int, like: Tensor, static: bool = True) -> Graph:
    """The cached Graph of a PyG graph input for ``n_src`` source and ``n_dst`` target nodes.

    ``like`` is a feature tensor: the graph must be on its device. Raises Unsupported for
    inputs the fused path does not take (see the module docstring).

    With ``GNN_FASTPATH_NEW_GRAPH=static`` an ``edge_index`` (tensor or ``EdgeIndex``) gets
    the graph a compiled layer builds (:func:`static_graph`) for its first calls, unless the
    caller needs the exact one (``static=False``: what it returns depends on PyG's own edge
    order of a derived graph, e.g. the attention weights of a layer adding self loops).
    """
    if not isinstance(edge_index, Tensor):
        raise Unsupported("edge_index", f"edge_index is a {type(edge_index).__name__} "
                                        "(the fused path takes Tensor, EdgeIndex or torch.sparse COO/CSR)")
    if edge_index.device != like.device:
        raise Unsupported("device", f"edge_index is on {edge_index.device}, features on {like.device}")
    if edge_index.layout in _SPARSE:
        if is_compiling():
            raise Unsupported("compile", "a torch.sparse adjacency under torch.compile (stock runs)")
        if edge_index.dim() != 2 or edge_index.dense_dim() != 0:
            raise Unsupported("edge_index", f"sparse adjacency of shape {tuple(edge_index.shape)} "
                                            f"with {edge_index.dense_dim()} dense dimensions")
        if edge_index.layout == torch.sparse_coo and not edge_index.is_coalesced():
            raise Unsupported("edge_index", "uncoalesced sparse COO adjacency")
        if (edge_index.size(1), edge_index.size(0)) != (n_src, n_dst):
            raise Unsupported("size", f"adjacency [N_dst, N_src] = {tuple(edge_index.shape)} but the "
                                      f"features give ({n_dst}, {n_src})")
        return Graph.of(edge_index)
    if edge_index.layout != torch.strided:
        raise Unsupported("edge_index", f"edge_index layout {edge_index.layout}")
    if edge_index.dtype not in _INT_DTYPES or edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise Unsupported("edge_index", f"edge_index of dtype {edge_index.dtype} and shape "
                                        f"{tuple(edge_index.shape)} (expected integer [2, M])")
    if EdgeIndex is not None and isinstance(edge_index, EdgeIndex):
        rows, cols = edge_index.sparse_size()
        if rows not in (None, n_src) or cols not in (None, n_dst):
            raise Unsupported("size", f"EdgeIndex sparse size {(rows, cols)} but the features give "
                                      f"({n_src}, {n_dst})")
    if is_compiling():
        return traced_graph(edge_index, n_src, n_dst)
    if static and setting("GNN_FASTPATH_NEW_GRAPH") == "static":
        graph = static_graph(edge_index, n_src, n_dst)
        if graph is not None:
            return graph
    try:
        return Graph.of(edge_index, num_nodes=(n_src, n_dst))
    except ValueError as exc:  # node ids out of range: stock reports its own error
        raise Unsupported("edge_index", str(exc)) from None


def traced_graph(edge_index: Tensor, n_src: int, n_dst: int, removed: Optional[Tensor] = None,
                 source_major: bool = True) -> GraphTensors:
    """The graph of an ``edge_index`` built inside a compiled region (see
    :mod:`gnn_fastpath.graph.tensors`); ``removed`` edges go to the extra row ``n_dst``;
    ``source_major=False`` leaves the transpose out (an op that needs it builds it:
    :meth:`GraphTensors.with_source_major`)."""
    if EdgeIndex is not None and isinstance(edge_index, EdgeIndex):
        edge_index = edge_index.as_tensor()
    return from_coo(edge_index[0], edge_index[1], n_src, n_dst, removed=removed, source_major=source_major)


#: How many layer calls an ``edge_index`` runs on its static graph (``GNN_FASTPATH_NEW_GRAPH=
#: static``) before the exact Graph is built: a sampled batch's layers all stay below it, a
#: graph trained on for many steps pays the exact build once and keeps its degree-aware lists.
STATIC_CALLS = 8


class _StaticEntry:
    """A graph input's static graph and how many calls asked for it."""

    __slots__ = ("graph", "calls")

    def __init__(self, graph: GraphTensors):
        self.graph = graph
        self.calls = 0


def static_graph(edge_index: Tensor, n_src: int, n_dst: int) -> Optional[GraphTensors]:
    """The graph a compiled layer builds (:func:`traced_graph`) of an eager ``edge_index``,
    cached per object, version and node counts, so the layers of a step share it; None once
    the input has had :data:`STATIC_CALLS` calls (the caller builds the exact Graph).

    Built without a host synchronisation: node ids are checked on the device
    (:func:`gnn_fastpath.graph.tensors.from_coo`: a bad id fails the CUDA stream as stock's
    own indexing does), and the kernels read work lists sized from shapes, as under
    ``torch.compile``."""
    version = tensor_version(edge_index)
    if EdgeIndex is not None and isinstance(edge_index, EdgeIndex):
        version = version + tensor_version(edge_index.as_tensor())
    entry = cached(edge_index, version, lambda: _build_static(edge_index, n_src, n_dst),
                   _STATIC_CACHE + str(edge_index.device), (n_src, n_dst))
    entry.calls += 1
    return entry.graph if entry.calls <= STATIC_CALLS else None


def _build_static(edge_index, n_src: int, n_dst: int) -> _StaticEntry:
    if EdgeIndex is not None and isinstance(edge_index, EdgeIndex):
        edge_index = edge_index.as_tensor()
    # built from a copy: views of the caller's tensor would keep it, and so this entry, alive
    own = edge_index.to(torch.int64, copy=True)
    # without its transpose: most layers' ops never walk sources, the others build it once
    return _StaticEntry(traced_graph(own, n_src, n_dst, source_major=False)._replace(store=Memo()))


#: The prefix of the graph cache's LRU that holds the static graphs (one per device, apart
#: from the Graphs :meth:`Graph.of` keeps under the device's own name).
_STATIC_CACHE = "static:"


def describe(edge_index, num_nodes=None) -> Tuple[str, Hashable, Callable[[], Graph]]:
    """The Graph cache's adapter for an ``EdgeIndex`` (see :func:`gnn_fastpath.graph.register_adapter`).

    The version holds the EdgeIndex's own version and that of the tensor it wraps (an
    in-place write through ``edge_index`` bumps only the first, one through ``as_tensor()``
    only the second) and its sparse size (``sparse_resize_`` changes it in place). With
    ``num_nodes=None`` the sparse size gives the node counts; a side it leaves unknown is
    ``max id + 1`` of that side alone (as PyG's ``get_sparse_size``). An explicit
    ``num_nodes`` wins.
    """
    sizes = tuple(edge_index.sparse_size())
    version = tensor_version(edge_index) + tensor_version(edge_index.as_tensor()) + (sizes,)

    def build() -> Graph:
        src, dst, n_src, n_dst = edge_index_to_coo(edge_index.as_tensor(), num_nodes, known=sizes)
        return Graph.from_coo(src, dst, n_src, n_dst, name="edge_index")

    return str(edge_index.device), version, build


def sparse_values(adj: Tensor) -> Tensor:
    """The values of a COO/CSR adjacency in storage order (the Graph's caller edge order)."""
    return adj._values() if adj.layout == torch.sparse_coo else adj.values()


@dataclass(frozen=True)
class Looped:
    """A graph with self loops added, in PyG's edge order: kept edges first, then loops.

    Attributes:
        graph: the derived Graph; its edge ``e < n_kept`` is the caller's edge ``keep[e]``
            (``e`` itself without ``keep``), the rest are the loops ``(i, i)``,
            ``i < num_loops``, in order.
        keep: int64 caller ids of the base graph's edges that stay; None when every edge
            stays, in its order (no loop was removed).
        loop_node, loop_pos: node ids and caller ids of the base graph's self loops, which
            were removed (ascending positions); empty when loops are only appended.
        num_loops: how many loops were appended.
    """

    graph: Graph
    keep: Optional[Tensor]
    loop_node: Tensor
    loop_pos: Tensor
    num_loops: int

    @property
    def n_kept(self) -> int:
        """How many of the caller's edges stay."""
        return self.graph.num_edges - self.num_loops

    def kept(self, t: Tensor) -> Tensor:
        """The rows of ``t`` (per caller edge, [M, *]) that stay, in the looped graph's order:
        ``t`` itself when no loop was removed."""
        return t if self.keep is None else t[self.keep]

    @property
    def kept_dst(self) -> Tensor:
        return self.graph.caller_coo()[1][: self.n_kept]

    @cached_property
    def kept_dst_max(self) -> int:
        """The largest target id among the kept edges (-1 when none); one host sync, only
        for the rare callers that need it (a string ``fill_value`` with edge attributes)."""
        return int(self.kept_dst.max()) if self.n_kept else -1


def _looped(base: Graph, num_loops: int, remove_existing: bool) -> Looped:
    # No host synchronisation: the number of existing loops is a fact of the base graph's
    # build, and the loop positions come from a stable sort of the loop flags (kept edges
    # first, then loops, each ascending) instead of boolean masks, whose sizes the host
    # would have to read.
    src, dst = base.caller_coo()
    m = base.num_edges
    n_existing = base.num_self_loops() if remove_existing else 0
    if n_existing:
        order = torch.sort((src == dst).to(torch.uint8), stable=True).indices
        keep, loop_pos = order[: m - n_existing], order[m - n_existing:]
        loop_node, kept_src, kept_dst = src[loop_pos], src[keep], dst[keep]
    else:  # every edge stays, in its order (a sampled batch): no gathers
        keep, loop_pos = None, src.new_empty(0)
        loop_node, kept_src, kept_dst = loop_pos, src, dst
    loops = torch.arange(num_loops, device=base.device)
    # At most one loop more per row than the base graph had.
    bounds = tuple(None if b is None else b + 1 for b in (base.degree_bound(False), base.degree_bound(True)))
    graph = Graph.from_coo(torch.cat([kept_src, loops]), torch.cat([kept_dst, loops]),
                           base.n_src, base.n_dst, validate=False, degree_bounds=bounds)
    return Looped(graph, keep, loop_node, loop_pos, num_loops)


@dataclass(frozen=True)
class TracedLooped:
    """:class:`Looped` as a compiled layer builds it: static shapes, no host reads.

    The edges are the caller's edges in their order, then the loops ``(i, i)``,
    ``i < num_loops``; the caller's own self loops (``removed``, bool [M]) stay in the list
    but sit in the graph's extra destination row (:mod:`gnn_fastpath.graph.tensors`), so they
    take no part in any result and get zero gradients. Not PyG's edge order (PyG compacts the
    kept edges): attention weights are not returned from this graph (Unsupported).
    """

    graph: GraphTensors
    removed: Tensor
    src: Tensor
    dst: Tensor
    num_loops: int

    def loop_weight(self, edge_weight: Tensor, fill: float) -> Tensor:
        """The appended loops' weights as PyG's ``add_remaining_self_loops`` gives them: a
        node's own loop keeps its weight, the others get ``fill``."""
        n = self.num_loops
        target = torch.where(self.removed & (self.src < n), self.src, n)
        weights = edge_weight.new_full((n + 1,), fill)
        return weights.scatter(0, target, edge_weight)[:n]

    def edge_attr(self, fill, edge_attr: Tensor) -> Tensor:
        """The edge attributes in this graph's order: the caller's rows, then one per loop."""
        n = self.num_loops
        size = (n,) + tuple(edge_attr.shape[1:])
        if isinstance(fill, str):
            from torch_geometric.utils import scatter

            index = torch.where(self.removed | (self.dst >= n), n, self.dst)
            loops = scatter(edge_attr, index, 0, n + 1, fill)[:n]
        else:
            loops = loop_attr(fill, edge_attr, None, size)
        return torch.cat([edge_attr, loops])


def _traced_looped(base: GraphTensors, num_loops: int, remove_existing: bool) -> TracedLooped:
    src, dst = base.coo
    loops = torch.arange(num_loops, device=src.device)
    removed = (src == dst) if remove_existing else torch.zeros_like(src, dtype=torch.bool)
    all_removed = torch.cat([removed, torch.zeros_like(loops, dtype=torch.bool)])
    graph = from_coo(torch.cat([src, loops]), torch.cat([dst, loops]), base.n_src, base.n_dst,
                     removed=all_removed if remove_existing else None, source_major=base.src_indptr is not None)
    if base.store is not None:  # an eager static graph: the derived one keeps its own values
        graph = graph._replace(store=Memo())
    return TracedLooped(graph, removed, src, dst, num_loops)


def replace_self_loops(base: Graph, num_loops: int) -> Looped:
    """Every self loop removed, then ``(i, i)`` for ``i < num_loops`` appended.

    The edge order of PyG's ``remove_self_loops`` + ``add_self_loops`` and of
    ``add_remaining_self_loops`` (which also drops the existing loops and appends one per
    node). Memoised on ``base``.
    """
    looped = _traced_looped if isinstance(base, GraphTensors) else _looped
    return base.memo(("pyg", "replace_self_loops", int(num_loops)),
                     lambda: looped(base, int(num_loops), remove_existing=True))


def append_self_loops(base: Graph, num_loops: int) -> Looped:
    """``(i, i)`` for ``i < num_loops`` appended after every existing edge (PyG's
    ``add_self_loops`` on a torch.sparse adjacency). Memoised on ``base``."""
    looped = _traced_looped if isinstance(base, GraphTensors) else _looped
    return base.memo(("pyg", "append_self_loops", int(num_loops)),
                     lambda: looped(base, int(num_loops), remove_existing=False))


def attention_self_loops(module, edge_index, base: Graph, edge_attr: Optional[Tensor],
                         num_loops: Callable[[], int]) -> Tuple[Graph, Optional[Looped]]:
    """``(graph, looped)`` of an attention layer with stock's ``add_self_loops`` handling:
    ``(base, None)`` without it, else every loop replaced by ``num_loops()`` appended ones (a
    torch.sparse adjacency and a ``fill_value`` stock cannot apply are Unsupported)."""
    if not module.add_self_loops:
        return base, None
    if is_sparse(edge_index):
        raise Unsupported("sparse_self_loops", "add_self_loops on a torch.sparse adjacency "
                                               "(stock rebuilds and coalesces it)")
    looped = replace_self_loops(base, num_loops())
    check_fill(module.fill_value, edge_attr, looped)
    return looped.graph, looped


def edge_weight_of(name: str, edge_weight: Optional[Tensor], graph: Graph, like: Tensor) -> Optional[Tensor]:
    """A per-edge weight [M] on ``like``'s device and dtype, or None; Unsupported otherwise."""
    if edge_weight is None:
        return None
    check_like(name, edge_weight, like)
    if edge_weight.dim() != 1 or edge_weight.numel() != graph.num_edges:
        raise Unsupported("edge_weight", f"{name} of shape {tuple(edge_weight.shape)} "
                                         f"(expected [{graph.num_edges}])")
    return edge_weight


#: The reductions ``torch_geometric.utils.scatter`` accepts (``fill_value`` strings).
FILL_REDUCTIONS = ("sum", "add", "mean", "min", "max", "amin", "amax", "mul", "any")


def check_fill(fill, edge_attr: Optional[Tensor], looped: Looped) -> None:
    """Unsupported where stock's ``add_self_loops(edge_index, edge_attr, fill_value=fill)``
    would fail or mean something the fused path does not compute: a string that is not a
    PyG reduction, a reduction stock cannot index (a kept edge targets a node >= the number
    of loops), a fill of another type. Nothing to check without ``edge_attr``."""
    if edge_attr is None:
        return
    if isinstance(fill, str):
        if fill not in FILL_REDUCTIONS:
            raise Unsupported("fill_value", f"fill_value={fill!r}")
        if isinstance(looped, TracedLooped):
            return  # no host read under compilation: a kept edge beyond the loops reduces into none
        if looped.kept_dst_max >= looped.num_loops:
            raise Unsupported("fill_value", "a kept edge targets a node beyond min(N_src, N_dst) "
                                            f"(stock cannot reduce fill_value={fill!r} there)")
    elif fill is not None and not isinstance(fill, (int, float, Tensor)):
        raise Unsupported("fill_value", f"fill_value of type {type(fill).__name__}")


def loop_attr(fill, edge_attr: Tensor, looped: Optional[Looped], size=None) -> Tensor:
    """PyG's ``compute_loop_attr`` for the appended loops, from the kept edges' attributes
    (``size``: the loops' attribute shape, given when there is no ``looped``)."""
    size = (looped.num_loops,) + tuple(edge_attr.shape[1:]) if size is None else size
    if fill is None:
        return edge_attr.new_ones(size)
    if isinstance(fill, (int, float)):
        return edge_attr.new_full(size, fill)
    if isinstance(fill, Tensor):
        attr = fill.to(edge_attr.device, edge_attr.dtype)
        if edge_attr.dim() != attr.dim():
            attr = attr.unsqueeze(0)
        return attr.expand(size).contiguous()
    from torch_geometric.utils import scatter

    return scatter(edge_attr, looped.kept_dst, 0, looped.num_loops, fill)


def looped_edge_attr(fill, edge_attr: Tensor, looped: Looped) -> Tensor:
    """The edge attributes stock's ``remove_self_loops`` + ``add_self_loops`` produce, in the
    looped graph's edge order: the kept edges' rows, then one row per loop from ``fill``."""
    if isinstance(looped, TracedLooped):
        return looped.edge_attr(fill, edge_attr)
    kept = looped.kept(edge_attr)
    return torch.cat([kept, loop_attr(fill, kept, looped)])


def stock_looped_edge_index(edge_index: Tensor, num_loops: int) -> Tensor:
    """The looped ``edge_index`` stock returns, built by the same PyG calls (only on request)."""
    from torch_geometric.utils import add_self_loops, remove_self_loops

    edge_index, _ = remove_self_loops(edge_index)
    edge_index, _ = add_self_loops(edge_index, num_nodes=num_loops)
    return edge_index
