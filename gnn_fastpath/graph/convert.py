"""Framework graph objects -> (src, dst, n_src, n_dst) in the caller's edge order.

Duck-typed on purpose: this module never imports DGL or PyG, so the package imports
without them. Each function validates its input and names the argument in its errors.
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor

from .graph import _as_node_count

Coo = Tuple[Tensor, Tensor, int, int]

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def _plain(t: Tensor) -> Tensor:
    """A plain torch.Tensor view of a tensor subclass (PyG EdgeIndex)."""
    return t if type(t) is Tensor else t.as_tensor() if callable(getattr(t, "as_tensor", None)) else t.as_subclass(Tensor)


def _node_counts(num_nodes, src: Tensor, dst: Tensor, default: Tuple) -> Tuple[int, int]:
    if num_nodes is None:
        n_src, n_dst = default
        if n_src is None and n_dst is None:
            # PyG's maybe_num_nodes: one count for both sides, max id + 1.
            n = int(torch.maximum(src.max(), dst.max())) + 1 if src.numel() else 0
            return n, n
        # An EdgeIndex that knows one side: the other is inferred on its own (PyG's
        # EdgeIndex.get_sparse_size does the same).
        if n_src is None:
            n_src = int(src.max()) + 1 if src.numel() else 0
        if n_dst is None:
            n_dst = int(dst.max()) + 1 if dst.numel() else 0
        return int(n_src), int(n_dst)
    if isinstance(num_nodes, (tuple, list)):
        if len(num_nodes) != 2:
            raise ValueError(f"num_nodes must be an int or a pair (n_src, n_dst), got {num_nodes!r}")
        return _as_node_count(num_nodes[0], "num_nodes[0] (n_src)"), _as_node_count(num_nodes[1], "num_nodes[1] (n_dst)")
    n = _as_node_count(num_nodes, "num_nodes")
    return n, n


def edge_index_to_coo(edge_index, num_nodes=None) -> Coo:
    """A PyG ``edge_index`` [2, M] (or ``EdgeIndex``): row 0 sources, row 1 targets."""
    if not isinstance(edge_index, Tensor):
        raise ValueError(f"edge_index must be a torch.Tensor of shape [2, M], got {type(edge_index).__name__}")
    if edge_index.is_sparse or edge_index.layout != torch.strided:
        raise ValueError(f"edge_index must be a dense [2, M] tensor, got layout {edge_index.layout}; "
                         "use Graph.from_sparse for sparse adjacencies")
    if edge_index.dtype not in _INT_DTYPES:
        raise ValueError(f"edge_index must hold integer node ids, got dtype {edge_index.dtype}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, M], got {tuple(edge_index.shape)}")
    default = (None, None)
    sparse_size = getattr(edge_index, "sparse_size", None)
    if callable(sparse_size):  # PyG EdgeIndex knows its (n_src, n_dst), possibly partly
        default = tuple(sparse_size())
    plain = _plain(edge_index).to(torch.int64)
    src, dst = plain[0], plain[1]
    n_src, n_dst = _node_counts(num_nodes, src, dst, default)
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


def dgl_to_coo(g) -> Coo:
    """A DGL graph or block with one edge type, through public DGL API only."""
    for attr in ("edges", "num_src_nodes", "num_dst_nodes", "canonical_etypes"):
        if not hasattr(g, attr):
            raise ValueError(f"g must be a DGL graph, got {type(g).__name__}")
    if len(g.canonical_etypes) != 1:
        raise ValueError(f"g must have a single edge type, got {len(g.canonical_etypes)}: {g.canonical_etypes}")
    src, dst = g.edges(order="eid")
    return src.to(torch.int64), dst.to(torch.int64), int(g.num_src_nodes()), int(g.num_dst_nodes())


def is_dgl_graph(obj) -> bool:
    return type(obj).__module__.startswith("dgl") and hasattr(obj, "canonical_etypes")
