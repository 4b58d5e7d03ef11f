"""Random graphs for tests: the shapes that break graph kernels.

Every builder is deterministic in its seed and returns a PyG-style ``edge_index`` [2, M]
(row 0 sources, row 1 destinations) plus ``(n_src, n_dst)``.
"""
from __future__ import annotations

from typing import Tuple

import torch


def random_edges(n_src: int, n_dst: int, m: int, seed: int = 0, *, self_loops: bool = True,
                 duplicates: bool = True, empty_rows: int = 0, super_node_degree: int = 0,
                 device="cpu") -> Tuple[torch.Tensor, Tuple[int, int]]:
    """Random edges with the awkward cases switched on by default.

    - ``self_loops``: add (i, i) for some i < min(n_src, n_dst);
    - ``duplicates``: repeat some edges verbatim;
    - ``empty_rows``: the last ``empty_rows`` destinations get no in-edges;
    - ``super_node_degree``: destination 0 gets that many extra in-edges.
    """
    gen = torch.Generator().manual_seed(seed)
    n_dst_live = max(n_dst - empty_rows, 0)
    parts = []
    if m and n_src and n_dst_live:
        src = torch.randint(0, n_src, (m,), generator=gen)
        dst = torch.randint(0, n_dst_live, (m,), generator=gen)
        parts.append(torch.stack([src, dst]))
    n_min = min(n_src, n_dst_live)
    if self_loops and n_min:
        loops = torch.randperm(n_min, generator=gen)[: max(1, n_min // 4)]
        parts.append(torch.stack([loops, loops]))
    if duplicates and parts:
        base = torch.cat(parts, 1)
        pick = torch.randint(0, base.size(1), (max(1, base.size(1) // 10),), generator=gen)
        parts.append(base[:, pick])
    if super_node_degree and n_src and n_dst_live:
        src = torch.randint(0, n_src, (super_node_degree,), generator=gen)
        parts.append(torch.stack([src, torch.zeros_like(src)]))
    edge_index = torch.cat(parts, 1) if parts else torch.empty(2, 0, dtype=torch.int64)
    if edge_index.size(1):  # shuffle so caller order differs from CSR order
        edge_index = edge_index[:, torch.randperm(edge_index.size(1), generator=gen)]
    return edge_index.to(device), (n_src, n_dst)


def undirected(edge_index: torch.Tensor) -> torch.Tensor:
    """``edge_index`` with every edge also reversed: a symmetric multigraph (duplicates and
    self loops come twice, a super node's row becomes a hub source's row too)."""
    return torch.cat([edge_index, edge_index.flip(0)], 1)


def dense_adjacency(edge_index: torch.Tensor, n_src: int, n_dst: int, weight=None, dtype=torch.float64):
    """Dense [n_dst, n_src] adjacency counting duplicates (A[i, j] = sum of weights j->i)."""
    a = torch.zeros(n_dst, n_src, dtype=dtype)
    w = torch.ones(edge_index.size(1), dtype=dtype) if weight is None else weight.to(dtype)
    a.index_put_((edge_index[1].cpu(), edge_index[0].cpu()), w.cpu(), accumulate=True)
    return a


#: Small graphs for the float64 oracle tests: name -> (n_src, n_dst, m, seed, empty_rows).
#: Every non-empty one has self loops, duplicate edges and destinations without in-edges.
SMALL_GRAPH_SPECS = {
    "homogeneous": (20, 20, 70, 1, 3),
    "bipartite_wide": (17, 9, 50, 2, 2),  # has sources without out-edges
    "bipartite_tall": (6, 15, 40, 3, 4),
    "no_edges": (5, 4, 0, 4, 0),
}


def small_graphs():
    """name -> (edge_index, n_src, n_dst, Graph) for :data:`SMALL_GRAPH_SPECS`."""
    from gnn_fastpath import Graph

    out = {}
    for name, (n_src, n_dst, m, seed, empty) in SMALL_GRAPH_SPECS.items():
        ei, _ = random_edges(n_src, n_dst, m, seed=seed, empty_rows=empty, self_loops=m > 0, duplicates=m > 0)
        out[name] = (ei, n_src, n_dst, Graph.from_edge_index(ei, (n_src, n_dst)))
    return out
