"""DGL graphs and blocks as gnn_fastpath Graphs, through public DGL API only.

Nothing here writes into a DGL graph (no ``ndata``/``edata``/``srcdata`` keys, no
``local_scope``): the shims read the structure once through :meth:`Graph.of` (cached per
graph object, rebuilt when its edges change) and keep every derived fact on that Graph via
:meth:`Graph.memo`.

The DGL graph may stay on the CPU while the features live on a GPU (DGL's PyPI build is
CPU-only): the ops copy the Graph to the features' device once (:meth:`Graph.to` caches the
copy). A graph on a GPU with features elsewhere is left to stock DGL, which reports it.
"""
from __future__ import annotations

from typing import Callable, Hashable, Optional, Tuple

import torch
from torch import Tensor, nn

from gnn_fastpath.graph import Graph
from ..shim import Unsupported, autocast_dtype, check_like, finite_number, has_module_hooks

#: Stock DGL's message for zero in-degree destinations (GATv2Conv, GraphConv, ... in 2.1.0).
ZERO_IN_DEGREE_MESSAGE = (
    "There are 0-in-degree nodes in the graph, "
    "output for those nodes will be invalid. "
    "This is harmful for some applications, "
    "causing silent performance regression. "
    "Adding self-loop on the input graph by "
    "calling `g = dgl.add_self_loop(g)` will resolve "
    "the issue. Setting ``allow_zero_in_degree`` "
    "to be `True` when constructing this module will "
    "suppress the check and let the code run."
)

_ZERO_IN_DEGREE_KEY = ("dgl", "has_zero_in_degree")


def dgl_error(message: str) -> Exception:
    """A ``dgl.DGLError`` (the exception type stock layers raise)."""
    from dgl import DGLError

    return DGLError(message)


def check_graph(g) -> Tuple[int, int, bool]:
    """(n_src, n_dst, is_block) of a single-edge-type DGL graph; Unsupported otherwise."""
    import dgl

    if not isinstance(g, dgl.DGLGraph):
        raise Unsupported("graph", f"graph is a {type(g).__name__}, not a DGLGraph")
    etypes = g.canonical_etypes
    if len(etypes) != 1:
        raise Unsupported("heterograph", f"{len(etypes)} edge types (the fused path takes one)")
    return int(g.num_src_nodes()), int(g.num_dst_nodes()), bool(g.is_block)


def check_precision(x: Tensor) -> None:
    """Unsupported where stock DGL cannot run the features' precision on the CPU: under CPU
    autocast (DGL's sparse ops cast their inputs only under *CUDA* autocast, so stock feeds
    them 16-bit node and float32 edge data and raises a DGLError in most layers; stock runs
    and decides) and for float16 CPU features (DGL 2.1 has no float16 CPU kernels)."""
    if x.device.type != "cpu":
        return
    if autocast_dtype("cpu") is not None:
        raise Unsupported("autocast", "CPU autocast: DGL's sparse ops do not cast under it (stock mixes dtypes)")
    if x.dtype == torch.float16:
        raise Unsupported("dtype", "float16 features on the CPU (DGL 2.1 has no float16 CPU kernels)")


def sparse_cast(*tensors: Optional[Tensor]) -> Tuple[Optional[Tensor], ...]:
    """DGL's ``_cast_if_autocast_enabled`` (``dgl/backend/pytorch/sparse.py``), applied by stock
    to the inputs of every ``gspmm``/``gsddmm``/``edge_softmax``: under CUDA autocast, floating
    CUDA tensors other than float64 become the autocast dtype; otherwise nothing changes."""
    dtype = autocast_dtype("cuda")
    if dtype is None:
        return tensors
    return tuple(t.to(dtype) if t is not None and t.is_cuda and t.is_floating_point() and t.dtype != torch.float64
                 else t for t in tensors)


def check_call(g, feat) -> Tuple[int, int, bool, Tensor]:
    """The checks every DGL shim opens with: ``(n_src, n_dst, is_block)`` of ``g``
    (:func:`check_graph`) and the features deciding device and dtype (:func:`features_of`),
    on a device (:func:`check_device`) and in a precision (:func:`check_precision`) the fused
    path takes; returned as ``(n_src, n_dst, is_block, x)``."""
    n_src, n_dst, is_block = check_graph(g)
    x = features_of(g, feat)
    check_device(g, x)
    check_precision(x)
    return n_src, n_dst, is_block, x


def check_device(g, x: Tensor) -> None:
    """Graph on the CPU (any feature device) or on the features' device; else Unsupported."""
    if g.device.type != "cpu" and g.device != x.device:
        raise Unsupported("device", f"graph on {g.device} but features on {x.device}")


def _check_one_edge_type(g) -> None:
    """ValueError naming ``g`` unless it is a DGL graph with a single edge type."""
    for attr in ("edges", "num_src_nodes", "num_dst_nodes", "canonical_etypes"):
        if not hasattr(g, attr):
            raise ValueError(f"g must be a DGL graph, got {type(g).__name__}")
    if len(g.canonical_etypes) != 1:
        raise ValueError(f"g must have a single edge type, got {len(g.canonical_etypes)}: {g.canonical_etypes}")


def graph_from_dgl(g) -> Graph:
    """A new Graph of a DGL graph or block (one edge type; int32 or int64 ids), uncached.

    ``perm`` holds DGL edge ids, so it indexes ``g.edata`` tensors. A graph whose CSC DGL
    has already made (every block of DGL's samplers) is taken as it is: its CSC is our
    destination-major CSR, valid by construction, so there is nothing to sort, check or
    read back. Other graphs go through their edge list (validated, sorted when needed);
    asking DGL for a CSC it has not made would build one inside the caller's graph.
    """
    _check_one_edge_type(g)
    formats = getattr(g, "formats", None)  # DGLGraph API (absent from look-alikes)
    if callable(formats) and "csc" in formats().get("created", ()):
        indptr, indices, eids = g.adj_tensors("csc")
        return Graph.from_csr(indptr, indices, eids, int(g.num_src_nodes()), int(g.num_dst_nodes()), name="g")
    src, dst = g.edges(order="eid")
    # Validated like any input: a malformed block (edges to destinations beyond
    # num_dst_nodes) must raise here, not write out of bounds in a kernel.
    return Graph.from_coo(src.to(torch.int64), dst.to(torch.int64), int(g.num_src_nodes()),
                          int(g.num_dst_nodes()), name="g")


def describe(g, num_nodes=None) -> Tuple[str, Hashable, Callable[[], Graph]]:
    """The Graph cache's adapter for DGL graphs (see :func:`gnn_fastpath.graph.register_adapter`).

    ``num_nodes`` is unused: a DGL graph knows its node counts. The version holds the
    graph's structure object itself, not only its ``id``: DGL replaces that object on
    add_edges/remove_edges/add_nodes and frees the old one, whose address the next object
    may reuse; counting alone would miss a remove followed by an add of as many edges.
    """
    _check_one_edge_type(g)
    structure = getattr(g, "_graph", None)
    version = (g.num_src_nodes(), g.num_dst_nodes(), g.num_edges(), str(g.idtype), id(structure), structure)
    return str(g.device), version, lambda: graph_from_dgl(g)


def graph_of(g) -> Graph:
    """The cached gnn_fastpath Graph of a DGL graph or block (on the DGL graph's device)."""
    return Graph.of(g)


def has_zero_in_degree(graph: Graph) -> bool:
    """Whether some destination has no in-edge; computed once per Graph (one host sync)."""
    return graph.memo(_ZERO_IN_DEGREE_KEY, lambda: bool((graph.in_degree() == 0).any()))


def check_zero_in_degree(module: nn.Module, graph: Graph) -> None:
    """Raise stock DGL's DGLError when the module forbids zero in-degree and the graph has one."""
    if not module._allow_zero_in_degree and has_zero_in_degree(graph):
        raise dgl_error(ZERO_IN_DEGREE_MESSAGE)


def features_of(graph, feat, *args, **kwargs):
    """The tensor that decides device and dtype: ``feat``, or ``feat[0]`` for a pair."""
    if isinstance(feat, tuple) and feat:
        return feat[0]
    return feat


# --------------------------------------------------------------------------- attention layers
# Checks shared by the attention layers (GATConv, GATv2Conv), which hold the same submodules.
def check_attention_modules(module) -> Tuple[float, float]:
    """(negative slope, attention dropout p) of a module whose ``leaky_relu`` and
    ``attn_drop`` the fused op applies itself: plain ``nn.LeakyReLU``/``nn.Dropout`` without
    hooks (the hooks would not fire), else Unsupported. p is 0 when ``attn_drop`` is in eval
    mode (its own flag, as stock's call reads it)."""
    attn_drop = module.attn_drop
    if type(attn_drop) is not nn.Dropout:
        raise Unsupported("attn_drop", f"attn_drop is a {type(attn_drop).__name__}, not nn.Dropout")
    leaky = module.leaky_relu
    if type(leaky) is not nn.LeakyReLU:
        raise Unsupported("leaky_relu", f"leaky_relu is a {type(leaky).__name__}, not nn.LeakyReLU")
    if has_module_hooks(attn_drop) or has_module_hooks(leaky):
        raise Unsupported("hooks", "hooks on attn_drop or leaky_relu")
    p = float(attn_drop.p) if attn_drop.training else 0.0
    return finite_number("negative_slope", leaky.negative_slope), p


def check_attention_vector(name: str, param, x: Tensor, heads: int, width: int) -> Tensor:
    """An attention parameter of shape (1, heads, width), like ``x`` (:func:`..shim.check_like`),
    as [heads, width]; else Unsupported (reason ``"attn"``)."""
    check_like(name, param, x)
    if tuple(param.shape) != (1, heads, width):
        raise Unsupported("attn", f"{name} has shape {tuple(param.shape)}, expected (1, {heads}, {width})")
    return param.reshape(heads, width)


def check_features(feat, n_src: int, n_dst: int, is_block: bool) -> Tensor:
    """Shape checks stock would fail later (a mismatch runs stock, so it reports the error):
    2-D features, ``(feat_src, feat_dst)`` with one row per source / destination, or one
    tensor with a row per source node of a homogeneous graph or a block. Returns the source
    features."""
    if isinstance(feat, tuple):
        if len(feat) != 2:
            raise Unsupported("input", f"feat is a tuple of {len(feat)} (expected (feat_src, feat_dst))")
        src, dst = feat
        check_like("feat[1]", dst, src)
        if src.dim() != 2 or dst.dim() != 2:
            raise Unsupported("input", "feat_src and feat_dst must be 2-D [N, in_feats]")
        if src.shape[0] != n_src or dst.shape[0] != n_dst:
            raise Unsupported("input", f"feature rows ({src.shape[0]}, {dst.shape[0]}) != graph nodes "
                                       f"({n_src}, {n_dst})")
        return src
    if feat.dim() != 2:
        raise Unsupported("input", f"feat must be 2-D [N, in_feats], got {feat.dim()}-D")
    if feat.shape[0] != n_src or (n_src != n_dst if not is_block else n_src < n_dst):
        raise Unsupported("input", f"feat has {feat.shape[0]} rows for a graph of ({n_src}, {n_dst}) nodes")
    return feat


# --------------------------------------------------------------------------- feature and weight inputs
def split_feat(feat) -> Tuple[Tensor, Optional[Tensor]]:
    """``(feat_src, feat_dst)`` of a pair (the second like the first, :func:`..shim.check_like`),
    ``(feat, None)`` of one tensor; Unsupported for anything else."""
    if isinstance(feat, tuple):
        if len(feat) != 2:
            raise Unsupported("input", f"feat is a tuple of {len(feat)} (expected (feat_src, feat_dst))")
        feat_src, feat_dst = feat
        if not isinstance(feat_src, Tensor):
            raise Unsupported("input", f"feat[0] is a {type(feat_src).__name__}")
        check_like("feat[1]", feat_dst, feat_src)
        return feat_src, feat_dst
    if not isinstance(feat, Tensor):
        raise Unsupported("input", f"feat is a {type(feat).__name__}")
    return feat, None


def node_features(feat, n_src: int, n_dst: int, is_block: bool, layout: str) -> Tuple[Tensor, Tensor]:
    """``(feat_src, feat_dst)`` as stock's ``expand_as_pair`` gives them (a block's destination
    features are its first ``n_dst`` rows), of at least 2 dimensions with one trailing shape on
    both sides and one row per node; Unsupported otherwise (``layout`` names the shape taken,
    such as ``"[N, *]"``, in the reason)."""
    feat_src, feat_dst = split_feat(feat)
    if feat_dst is None:
        feat_dst = feat_src[:n_dst] if is_block else feat_src
    if feat_src.dim() < 2 or feat_dst.shape[1:] != feat_src.shape[1:]:
        raise Unsupported("input", f"the fused path takes {layout} features of at least 2 dimensions, one "
                                   "trailing shape on both sides")
    if feat_src.shape[0] != n_src or feat_dst.shape[0] != n_dst:
        raise Unsupported("input", f"feature rows ({feat_src.shape[0]}, {feat_dst.shape[0]}) for a graph of "
                                   f"({n_src}, {n_dst}) nodes")
    return feat_src, feat_dst


def check_pair_frames(g, feat) -> None:
    """Unsupported for a feature pair on a graph whose ``srcdata`` and ``dstdata`` are one frame
    (one node type, not a block): stock layers that write one key on both sides (SAGE's
    ``"gcn"``, EdgeConv, AGNN) then read the destination features at the sources too."""
    if isinstance(feat, tuple) and not g.is_block and len(g.ntypes) == 1:
        raise Unsupported("input", "a feature pair on a graph with one node type (stock's dstdata write replaces "
                                   "the source features: DGL's srcdata and dstdata are one frame there)")


def scalar_edge_weight(g, edge_weight: Optional[Tensor], like: Tensor) -> Optional[Tensor]:
    """``edge_weight`` as [M] (None stays None): one scalar per edge, ``[M]`` or ``[M, 1]``, like
    the features ``like`` (:func:`..shim.check_like`); Unsupported otherwise."""
    if edge_weight is None:
        return None
    check_like("edge_weight", edge_weight, like)
    m = g.num_edges()
    if edge_weight.shape not in ((m,), (m, 1)):
        raise Unsupported("edge_weight", f"edge_weight of shape {tuple(edge_weight.shape)} "
                                         f"(the fused path takes one scalar per edge, [{m}] or [{m}, 1])")
    return edge_weight.reshape(m)


def broadcasts(x: Tensor, edge_weight: Optional[Tensor]) -> bool:
    """Whether stock's ``fn.u_mul_e`` of the features ``x`` [N, *] by the scalar edge weight
    broadcasts (DGL views an ``[M]`` weight as ``[M, 1]``: no broadcast only for ``[N, 1]``
    features); it decides which of DGL's max kernels runs (:mod:`.ties`)."""
    return edge_weight is not None and tuple(x.shape[1:]) != (1,)


def apply_optional(rst: Tensor, *modules) -> Tensor:
    """``rst`` through each of ``modules`` that is not None, in order (stock's optional
    ``apply_func``, ``activation``, ``norm`` calls)."""
    for module in modules:
        if module is not None:
            rst = module(rst)
    return rst
