"""Plain torch graph inputs -> (src, dst, n_src, n_dst) in the caller's edge order.

Only torch here: framework graph objects reach the Graph through adapters that the
integrations register (see :func:`gnn_fastpath.graph.register_adapter`), which hand these
functions plain tensors. Each function validates its input and names the
argument in its errors. :func:`tensor_version` fingerprints a tensor for the Graph cache.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

Coo = Tuple[Tensor, Tensor, int, int]
#: Node counts an input may already know, per side (``None``: infer from the ids).
KnownSizes = Tuple[Optional[int], Optional[int]]

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _as_node_count(value, name: str) -> int:
    """``value`` (int, 0-d tensor, numpy integer) as a node count >= 0; ValueError naming ``name``."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a single integer, got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _node_counts(num_nodes, src: Tensor, dst: Tensor, known: KnownSizes) -> Tuple[int, int]:
    if num_nodes is None:
        n_src, n_dst = known
        if n_src is None and n_dst is None:
            # One count for both sides, max id + 1 over both rows (an edge_index with no
            # sizes is read as a homogeneous graph).
            n = int(torch.maximum(src.max(), dst.max())) + 1 if src.numel() else 0
            return n, n
        # An input that knows one side: the other is inferred from its own row alone.
        if n_src is None:
            n_src = int(src.max()) + 1 if src.numel() else 0
        if n_dst is None:
            n_dst = int(dst.max()) + 1 if dst.numel() else 0
        return int(n_src), int(n_dst)
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
    """
    if not isinstance(edge_index, Tensor):
        raise ValueError(f"edge_index must be a torch.Tensor of shape [2, M], got {type(edge_index).__name__}")
    if edge_index.is_sparse or edge_index.layout != torch.strided:
        raise ValueError(f"edge_index must be a dense [2, M] tensor, got layout {edge_index.layout}; "
                         "use Graph.from_sparse for sparse adjacencies")
    if edge_index.dtype not in _INT_DTYPES:
        raise ValueError(f"edge_index must hold integer node ids, got dtype {edge_index.dtype}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, M], got {tuple(edge_index.shape)}")
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
    if t.layout == torch.sparse_csr:
        parts = (t.crow_indices(), t.col_indices())
    elif t.layout == torch.sparse_coo:
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
