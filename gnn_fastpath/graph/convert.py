"""Plain torch graph inputs -> (src, dst, n_src, n_dst) in the caller's edge order.

Only torch here: framework graph objects reach the Graph through adapters that the
integrations register (see :func:`gnn_fastpath.graph.register_adapter`), which hand these
functions plain tensors. Each function validates its input and names the
argument in its errors. :func:`tensor_version` fingerprints a tensor for the Graph cache.

Node counts
-----------
An explicit count (``num_nodes``, or a size the input carries) is taken as given, up to
:data:`MAX_NODES`; whether memory suffices for it is the allocator's business. A count
*inferred* from the ids (``max id + 1``) must not exceed :data:`MAX_INFERRED_NODES`: a stray
huge id (``2**40``, a garbage or uninitialised tensor) would otherwise make the Graph ask for
terabytes (``bincount``/``zeros`` of that many entries) or overflow. Larger graphs pass
``num_nodes``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

Coo = Tuple[Tensor, Tensor, int, int]
#: Node counts an input may already know, per side (``None``: infer from the ids).
KnownSizes = Tuple[Optional[int], Optional[int]]

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)

#: The largest node count inferred from the ids (``max id + 1``) when no count is given:
#: 2**31 - 1, the most the int32 CUDA kernels index (:meth:`Graph.fits_int32`). A larger id
#: without ``num_nodes`` is a ValueError naming ``edge_index`` and the id.
MAX_INFERRED_NODES = 2**31 - 1
#: The largest node count accepted at all (explicit ``num_nodes`` or a size the input
#: carries): int64 arrays of ``n + 1`` entries keep a byte size int64 can hold (torch fails
#: with "Storage size calculation overflowed" past 2**60). Memory runs out long before.
MAX_NODES = 2**59


def check_readable(t: Tensor, name: str) -> None:
    """ValueError naming ``name`` if ``t`` lives on the meta device: it holds no values, so
    node ids and counts cannot be read from it (``.item()`` would fail inside torch)."""
    if t.device.type == "meta":
        raise ValueError(f"{name} is on {t.device}, a device without data: its node ids cannot be read; "
                         "build the graph from a tensor on a real device (cpu, cuda)")


def _as_node_count(value, name: str) -> int:
    """``value`` (int, 0-d tensor, numpy integer) as a node count >= 0; ValueError naming ``name``."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a single integer, got a tensor of shape {tuple(value.shape)}")
        check_readable(value, name)
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    if value > MAX_NODES:
        raise ValueError(f"{name} must be at most MAX_NODES = 2**59, got {value}")
    return value


def _inferred_count(max_id: int, row: str) -> int:
    """``max_id + 1``, the node count inferred from the largest id of ``row``; ValueError past
    :data:`MAX_INFERRED_NODES` naming ``edge_index``, the row and the id. A negative result
    (all ids negative) is left to the id range check, which names the negative id."""
    if max_id >= MAX_INFERRED_NODES:
        raise ValueError(
            f"edge_index ({row}) contains node id {max_id}; the node count inferred from it ({max_id + 1}) "
            f"exceeds MAX_INFERRED_NODES = {MAX_INFERRED_NODES} (2**31 - 1). Pass num_nodes explicitly if "
            "the graph really has that many nodes")
    return max_id + 1


def _node_counts(num_nodes, src: Tensor, dst: Tensor, known: KnownSizes) -> Tuple[int, int]:
    if num_nodes is None:
        n_src, n_dst = (None if n is None else _as_node_count(n, f"edge_index's {side}")
                        for n, side in zip(known, ("n_src", "n_dst")))
        if n_src is not None and n_dst is not None:
            return n_src, n_dst
        if src.numel() == 0:
            return (0 if n_src is None else n_src), (0 if n_dst is None else n_dst)
        src_max, dst_max = torch.stack([src.max(), dst.max()]).tolist()  # one host sync
        if n_src is None and n_dst is None:
            # One count for both sides, max id + 1 over both rows (an edge_index with no
            # sizes is read as a homogeneous graph).
            n = _inferred_count(*max((src_max, "source row"), (dst_max, "destination row"),
                                     key=lambda m: m[0]))
            return n, n
        # An input that knows one side: the other is inferred from its own row alone.
        if n_src is None:
            n_src = _inferred_count(src_max, "source row")
        if n_dst is None:
            n_dst = _inferred_count(dst_max, "destination row")
        return n_src, n_dst
    if isinstance(num_nodes, (tuple, list)):
        if len(num_nodes) != 2:
            raise ValueError(f"num_nodes must be an int or a pair (n_src, n_dst), got {num_nodes!r}")
        return (_as_node_count(num_nodes[0], "num_nodes[0] (n_src)"),
                _as_node_count(num_nodes[1], "num_nodes[1] (n_dst)"))
    n = _as_node_count(num_nodes, "num_nodes")
    return n, n


def edge_index_to_coo(edge_index, num_nodes=None, known: KnownSizes = (None, None)) -> Coo:
    """An ``edge_index`` [2, M] integer tensor: row 0 sources, row 1 targets.

    Args:
        edge_index: integer tensor [2, M]; a tensor subclass is read through
            ``as_subclass(torch.Tensor)``.
        num_nodes: ``None``, an int (both sides) or a pair ``(n_src, n_dst)``.
        known: with ``num_nodes=None``, sizes the input already knows per side (an adapter
            passes them); a ``None`` side is ``max id + 1`` of that side. When both are
            ``None``, one count ``max id + 1`` over both rows serves both sides.

    Node counts: explicit ones (``num_nodes``, ``known``) up to :data:`MAX_NODES`; inferred
    ones (``max id + 1``) up to :data:`MAX_INFERRED_NODES` (2**31 - 1), else a ValueError
    naming ``edge_index``, the row and the id (pass ``num_nodes`` for larger graphs).

    Devices: any, except ``meta`` (no values to read: ValueError naming ``edge_index``).

    Dtypes (compared with stock PyG 2.8.1, CPU):

    - ``int64``, ``int32``: node ids, as everywhere in PyG.
    - ``uint8``, ``int8``, ``int16``: read as node ids (their values, widened to int64;
      never as a mask). Stock is consistent where it computes: layers that add self loops
      (``GCNConv``, ``GATConv``, ``GATv2Conv`` by default) widen the ids to int64 through
      ``torch.cat`` and give exactly the int64 answer, which is this one; layers that index
      with the ids directly (``SAGEConv``, ``TransformerConv``, and those three with
      ``add_self_loops=False``) raise torch's "Expected dtype int32/int64 for index".
      So a Graph from these dtypes never gives a different answer than stock; where stock
      raises, the PyG integration (not this function) decides whether to fall back to it.
    - ``bool``: ValueError naming ``edge_index``. A boolean tensor is a mask, not node ids;
      stock has no single meaning for it (``GCNConv``/``GATv2Conv`` with self loops silently
      read ``True`` as node 1 and ``False`` as node 0 after ``torch.cat`` widens them,
      ``SAGEConv``/``TransformerConv`` raise "Expected 'edge_index' to be of integer type").
    - floating and complex dtypes: ValueError naming ``edge_index``.
    """
    if not isinstance(edge_index, Tensor):
        raise ValueError(f"edge_index must be a torch.Tensor of shape [2, M], got {type(edge_index).__name__}")
    if edge_index.is_sparse or edge_index.layout != torch.strided:
        raise ValueError(f"edge_index must be a dense [2, M] tensor, got layout {edge_index.layout}; "
                         "use Graph.from_sparse for sparse adjacencies")
    if edge_index.dtype == torch.bool:
        raise ValueError("edge_index must hold integer node ids, got dtype torch.bool (a boolean mask is "
                         "not an edge list; stock PyG gives it no single meaning)")
    if edge_index.dtype not in _INT_DTYPES:
        raise ValueError(f"edge_index must hold integer node ids, got dtype {edge_index.dtype}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, M], got {tuple(edge_index.shape)}")
    check_readable(edge_index, "edge_index")
    plain = edge_index if type(edge_index) is Tensor else edge_index.as_subclass(Tensor)
    plain = plain.to(torch.int64)
    src, dst = plain[0], plain[1]
    n_src, n_dst = _node_counts(num_nodes, src, dst, known)
    return src, dst, n_src, n_dst


def sparse_to_coo(adj_t) -> Coo:
    """A ``torch.sparse`` CSR or COO adjacency [n_dst, n_src] (rows are targets)."""
    if not isinstance(adj_t, Tensor):
        raise ValueError(f"adj_t must be a torch sparse tensor, got {type(adj_t).__name__}")
    if adj_t.dim() != 2:
        raise ValueError(f"adj_t must be 2-D [n_dst, n_src], got shape {tuple(adj_t.shape)}")
    check_readable(adj_t, "adj_t")
    n_dst, n_src = int(adj_t.size(0)), int(adj_t.size(1))
    if adj_t.layout == torch.sparse_csr:
        crow = adj_t.crow_indices().to(torch.int64)
        col = adj_t.col_indices().to(torch.int64)
        counts = crow[1:] - crow[:-1]
        row = torch.repeat_interleave(torch.arange(n_dst, device=crow.device), counts, output_size=col.numel())
    elif adj_t.layout == torch.sparse_coo:
        idx = adj_t._indices().to(torch.int64)  # value order of the caller, coalesced or not
        row, col = idx[0], idx[1]
    else:
        raise ValueError(f"adj_t must be sparse CSR or COO, got layout {adj_t.layout}")
    return col, row, n_src, n_dst


def tensor_version(t: Tensor) -> Tuple:
    """A hashable fingerprint of a tensor graph input that changes when its edges may have.

    The autograd version counter ``_version`` (bumped by every in-place write, through views
    too), storage pointer, shape and dtype of the index tensors (the ``crow``/``col``
    indices of a CSR adjacency, the indices of a COO one, the tensor itself otherwise),
    then the outer tensor's version and shape.
    """
    layout = t.layout
    if layout == torch.strided:  # the usual edge_index: the index tensor is the tensor itself
        version, shape = _version_of(t), tuple(t.shape)
        return ((version, t.data_ptr(), shape, t.dtype), version, shape)
    if layout == torch.sparse_csr:
        parts = (t.crow_indices(), t.col_indices())
    elif layout == torch.sparse_coo:
        parts = (t._indices(),)
    else:
        parts = (t,)
    version = tuple((_version_of(p), p.data_ptr(), tuple(p.shape), p.dtype) for p in parts)
    return version + (_version_of(t), tuple(t.shape))


def _version_of(t: Tensor) -> int:
    # Inference tensors have no version counter; they cannot be written outside inference
    # mode, so their storage identity stands in (an in-place write inside inference mode is
    # not noticed: build the Graph with Graph.from_edge_index there).
    return -1 if t.is_inference() else t._version
