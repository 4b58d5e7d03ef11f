"""A pure-torch neighbour sampler for PyG's ``NeighborLoader``, for the test suite only.

PyG's ``NeighborSampler`` samples with pyg-lib's ``torch.ops.pyg.neighbor_sample`` when
``torch_geometric.typing.WITH_PYG_LIB`` is set, else with torch-sparse, else it raises.
Neither has a wheel on PyPI for recent torch (building torch-sparse takes a 2-core machine
20 to 36 minutes), so when neither imports the test session (``tests/conftest.py``) calls
:func:`install`: it defines ``pyg::neighbor_sample`` with pyg-lib's schema through
``torch.library``, implemented here in plain torch, and sets the flags PyG reads. The real
``NeighborLoader`` / ``NeighborSampler`` then run unchanged: CSC conversion, the seeds'
batching, ``filter_data``, ``n_id`` / ``e_id`` / ``num_sampled_nodes`` / ``num_sampled_edges``
/ ``batch_size``; only the kernel is ours. The package never loads this file.

What it samples, as pyg-lib does (``pyg_lib/csrc/sampler/cpu/neighbor_kernel.cpp``),
homogeneous graphs, ``disjoint=False``, no time or edge weights:

- the nodes start as the seeds, in order; hop ``l`` visits the nodes that hop ``l - 1`` added
  (the seeds for the first), in order, and draws ``num_neighbors[l]`` of each one's incoming
  edges (CSC columns) uniformly without replacement (Floyd's algorithm, as pyg-lib), all of
  them when the fan-out is negative or at least the degree (in CSC order), or with
  replacement when ``replace``;
- a neighbour not sampled before is appended to the nodes (first appearance order), so each
  node is expanded at most once and no edge is drawn twice without replacement;
- returns ``(row, col, node, edge, num_sampled_nodes, num_sampled_edges)``: ``row`` the
  neighbour's local index, ``col`` the expanded node's (``csc=True``), ``node`` the global ids,
  ``edge`` the CSC positions (PyG maps them to edge ids through its permutation),
  ``num_sampled_nodes`` = [seeds, added by hop 1, ...], ``num_sampled_edges`` = [hop 1, ...].

Random draws come from torch's global CPU generator (``torch.manual_seed`` reproduces a batch,
as with pyg-lib and torch-sparse). Not supported (raises): temporal sampling, edge weights,
``disjoint=True``, heterogeneous graphs (``pyg::hetero_neighbor_sample`` is not defined);
``subgraph_type="induced"`` never reaches pyg-lib in PyG and still needs torch-sparse.
"""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor

#: pyg-lib's schema of the op (pyg_lib/csrc/sampler/neighbor.cpp), which PyG 2.8 calls positionally.
SCHEMA = ("neighbor_sample(Tensor rowptr, Tensor col, Tensor seed, int[] num_neighbors, "
          "Tensor? node_time=None, Tensor? edge_time=None, Tensor? seed_time=None, "
          "Tensor? edge_weight=None, bool csc=False, bool replace=False, bool directed=True, "
          "bool disjoint=False, str temporal_strategy='uniform', bool return_edge_id=True) "
          "-> (Tensor, Tensor, Tensor, Tensor?, int[], int[])")

#: The name of the backend in messages and in :func:`backend`'s answer.
NAME = "pure-torch test sampler (tests/pyg_sampler_shim.py)"

_lib = None          # the torch.library.Library that holds the definition (kept alive)
_installed = False   # install() set PyG's flags in this process


def _draw(deg: Tensor, k: int, replace: bool):
    """Positions (within each node's CSC column) of the edges to take, node by node.

    Returns ``(counts, positions)``: ``counts[i]`` edges for node ``i``, their positions in
    ``positions`` one node after the other."""
    n = deg.numel()
    if k < 0:
        counts = deg.clone()
    elif replace:
        counts = torch.where(deg > 0, torch.full_like(deg, k), torch.zeros_like(deg))
    else:
        counts = torch.clamp(deg, max=k)
    total = int(counts.sum())
    node = torch.repeat_interleave(torch.arange(n), counts)
    offset = torch.arange(total) - (torch.cumsum(counts, 0) - counts)[node]  # 0 .. counts[i]-1
    if k < 0 or total == 0:
        return counts, offset
    if replace:  # uniform over each node's column, independently
        u = torch.rand(total, dtype=torch.float64)
        return counts, (u * deg[node].to(torch.float64)).long().clamp_(max=deg[node] - 1)
    # Without replacement: whole columns where k >= degree; Floyd's k-of-d elsewhere.
    partial = deg > k
    positions = offset.clone()
    rows = partial.nonzero().flatten()
    if rows.numel():
        d = deg[rows]
        chosen = torch.empty(rows.numel(), k, dtype=torch.long)
        for j in range(k):
            top = d - k + j                                           # draw from 0 .. top
            r = (torch.rand(rows.numel(), dtype=torch.float64) * (top + 1).to(torch.float64)).long()
            r = torch.minimum(r, top)
            taken = (chosen[:, :j] == r[:, None]).any(1)
            chosen[:, j] = torch.where(taken, top, r)
        slot = torch.full((n,), -1, dtype=torch.long)
        slot[rows] = torch.arange(rows.numel())
        mask = partial[node]
        positions[mask] = chosen[slot[node[mask]], offset[mask]]
    return counts, positions


def sample(rowptr: Tensor, col: Tensor, seed: Tensor, num_neighbors: List[int], replace: bool = False):
    """Homogeneous, non-disjoint neighbour sampling over a CSC graph ``(rowptr, col)``: see the
    module's docstring. Returns ``(row, col, node, edge, num_sampled_nodes, num_sampled_edges)``
    with ``row`` the neighbours' local indices and ``col`` the expanded nodes'."""
    dtype = seed.dtype
    rowptr, col, seed = rowptr.long(), col.long(), seed.long()
    num_nodes = rowptr.numel() - 1
    local = torch.full((num_nodes,), -1, dtype=torch.long)
    local[seed] = torch.arange(seed.numel())
    nodes, rows, cols, edges = [seed], [], [], []
    num_sampled_nodes, num_sampled_edges = [seed.numel()], []
    begin, end = 0, seed.numel()
    for k in num_neighbors:
        frontier = nodes[-1]  # what the hop before added (the seeds first): local begin .. end - 1
        start = rowptr[frontier]
        counts, positions = _draw(rowptr[frontier + 1] - start, int(k), replace)
        expanded = torch.repeat_interleave(torch.arange(frontier.numel()), counts)
        edge = start[expanded] + positions
        neighbour = col[edge]
        # Neighbours not seen before join the nodes in order of first appearance.
        unseen = neighbour[local[neighbour] < 0]
        if unseen.numel():
            uniq, inverse = torch.unique(unseen, return_inverse=True)
            first = torch.full((uniq.numel(),), unseen.numel(), dtype=torch.long)
            first.scatter_reduce_(0, inverse, torch.arange(unseen.numel()), "amin")
            new = uniq[torch.argsort(first)]
        else:
            new = unseen
        local[new] = torch.arange(end, end + new.numel())
        nodes.append(new)
        rows.append(local[neighbour])
        cols.append(expanded + begin)
        edges.append(edge)
        num_sampled_nodes.append(new.numel())
        num_sampled_edges.append(edge.numel())
        begin, end = end, end + new.numel()
    empty = torch.empty(0, dtype=torch.long)
    out = [torch.cat(t) if t else empty for t in (rows, cols, nodes, edges)]
    return (*(t.to(dtype) for t in out), num_sampled_nodes, num_sampled_edges)


def neighbor_sample(rowptr: Tensor, col: Tensor, seed: Tensor, num_neighbors: List[int],
                    node_time: Optional[Tensor] = None, edge_time: Optional[Tensor] = None,
                    seed_time: Optional[Tensor] = None, edge_weight: Optional[Tensor] = None,
                    csc: bool = False, replace: bool = False, directed: bool = True, disjoint: bool = False,
                    temporal_strategy: str = "uniform", return_edge_id: bool = True):
    """The kernel of ``pyg::neighbor_sample`` (pyg-lib's argument list and results)."""
    unsupported = [name for name, value in (("node_time", node_time), ("edge_time", edge_time),
                                            ("seed_time", seed_time), ("edge_weight", edge_weight))
                   if value is not None]
    if disjoint:
        unsupported.append("disjoint=True")
    if not directed:
        unsupported.append("directed=False")
    if unsupported:
        raise NotImplementedError(f"{NAME} samples uniformly, non-disjoint, without time or weights; "
                                  f"got {', '.join(unsupported)}: install pyg-lib or torch-sparse for these")
    row, col_out, node, edge, num_nodes, num_edges = sample(rowptr, col, seed, list(num_neighbors), replace)
    if not csc:  # (row, col) = (expanded node, neighbour) in CSR terms
        row, col_out = col_out, row
    return row, col_out, node, (edge if return_edge_id else None), num_nodes, num_edges


def register_op() -> bool:
    """Define ``pyg::neighbor_sample`` with :func:`neighbor_sample` as its CPU kernel, once.
    False when another definition (pyg-lib's) is there already."""
    global _lib
    if _lib is not None:
        return True
    if hasattr(torch.ops.pyg, "neighbor_sample"):
        return False
    lib = torch.library.Library("pyg", "FRAGMENT")
    lib.define(SCHEMA)
    lib.impl("neighbor_sample", neighbor_sample, "CPU")
    _lib = lib
    return True


def real_backend() -> Optional[str]:
    """``"pyg-lib"`` or ``"torch-sparse"`` when PyG found one of them at import, else None."""
    import torch_geometric.typing as pyg_typing

    if _installed:
        return None
    if pyg_typing.WITH_PYG_LIB:
        return "pyg-lib"
    if pyg_typing.WITH_TORCH_SPARSE:
        return "torch-sparse"
    return None


def use_shim(pyg_typing) -> None:
    """Point PyG at the shim: ``WITH_PYG_LIB`` (the op's pyg-lib schema takes edge times and
    weights, so those two flags too). The op must be registered (:func:`register_op`)."""
    pyg_typing.WITH_PYG_LIB = True
    pyg_typing.WITH_EDGE_TIME_NEIGHBOR_SAMPLE = True
    pyg_typing.WITH_WEIGHTED_NEIGHBOR_SAMPLE = True


def install() -> bool:
    """Make PyG's NeighborLoader sample with the shim when neither pyg-lib nor torch-sparse
    imports; True when the shim is in use in this process."""
    global _installed
    if _installed:
        return True
    import torch_geometric.typing as pyg_typing

    if real_backend() is not None or not register_op():
        return False
    use_shim(pyg_typing)
    _installed = True
    return True


def installed() -> bool:
    return _installed
