"""Symmetric graphs (Graph.reverse_edges / is_symmetric): detected once per graph (degrees
first, the sorts only for balanced degrees), the reverse of every edge found exactly."""
from __future__ import annotations

import pytest
import torch

from gnn_fastpath.graph import Graph
from gnn_fastpath.graph.tensors import as_graph, from_coo
from gnn_fastpath.integrations.pyg.graph import _looped


def _undirected(n=40, m=150, seed=0, loops=5, duplicates=10):
    """A symmetric multigraph: random pairs both ways, some self loops, some duplicated pairs."""
    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randint(0, n, (2, m), generator=gen)
    dup = torch.randint(0, m, (duplicates,), generator=gen)
    a, b = torch.cat([a, a[dup]]), torch.cat([b, b[dup]])
    loop = torch.randint(0, n, (loops,), generator=gen)
    src = torch.cat([a, b, loop])
    dst = torch.cat([b, a, loop])
    order = torch.randperm(src.numel(), generator=gen)  # caller order unrelated to the pairs
    return src[order], dst[order], n


def _pairs(g: Graph):
    return g.dst_index().to(torch.int64), g.indices.to(torch.int64)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reverse_of_every_edge(seed):
    src, dst, n = _undirected(seed=seed)
    g = Graph.from_coo(src, dst, n, n)
    assert g.is_symmetric()
    rev = g.reverse_edges()
    d, s = _pairs(g)
    assert torch.equal(d[rev], s) and torch.equal(s[rev], d)  # edge i -> j's reverse is j -> i
    assert torch.equal(torch.sort(rev).values, torch.arange(g.num_edges))  # a permutation
    assert torch.equal(rev[rev], torch.arange(g.num_edges))  # duplicates paired one to one
    assert g.reverse_edges() is rev  # cached


def test_balanced_but_not_symmetric():
    """A directed cycle: every in-degree equals the out-degree, yet no edge has a reverse."""
    src, dst = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0])
    g = Graph.from_coo(src, dst, 4, 4)
    assert g.reverse_edges() is None and not g.is_symmetric()


def test_one_missing_reverse_or_duplicate():
    src, dst, n = _undirected()
    g = Graph.from_coo(src[1:], dst[1:], n, n)
    assert not g.is_symmetric()
    # a duplicated edge without a duplicated reverse is unbalanced as well
    g2 = Graph.from_coo(torch.cat([src, src[:1]]), torch.cat([dst, dst[:1]]), n, n)
    assert not g2.is_symmetric()


def test_unbalanced_degrees_stop_before_the_sorts(monkeypatch):
    """In- and out-degrees that differ settle it without sorting (most directed graphs, a
    sampled batch); bipartite and static graphs are never symmetric."""
    g = Graph.from_coo(torch.tensor([0, 0, 1]), torch.tensor([1, 2, 2]), 3, 3)
    sorts = []
    monkeypatch.setattr(torch, "sort", lambda *a, **k: sorts.append(1))
    assert g.reverse_edges() is None and sorts == []
    monkeypatch.undo()
    bip = Graph.from_coo(torch.tensor([0, 1]), torch.tensor([1, 0]), 3, 2)
    assert not bip.is_symmetric()
    src, dst, n = _undirected()
    static = as_graph(from_coo(src, dst, n, n))
    assert static.reverse_edges() is None


def test_graph_from_bare_csr():
    src, dst, n = _undirected()
    g = Graph.from_coo(src, dst, n, n)
    bare = Graph.from_csr(g.indptr, g.indices, g.perm, n, n)
    assert bare.is_symmetric()
    d, s = _pairs(bare)
    assert torch.equal(d[bare.reverse_edges()], s)


def test_empty_graph_is_symmetric():
    g = Graph.from_coo(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64), 5, 5)
    assert g.is_symmetric() and g.reverse_edges().numel() == 0


@pytest.mark.parametrize("remove_existing", [False, True])
def test_self_looped_graph(remove_existing):
    """PyG's self-loop handling (loops removed, one added per node) keeps a symmetric graph
    symmetric."""
    src, dst, n = _undirected()
    looped = _looped(Graph.from_coo(src, dst, n, n), n, remove_existing).graph
    assert looped.is_symmetric()
    d, s = _pairs(looped)
    assert torch.equal(d[looped.reverse_edges()], s)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_undirected_graph_is_its_own_source_csr(seed):
    """The source-major CSR of a symmetric graph is the forward CSR (shared arrays, no sort,
    no copies) with the reverse edges' positions, and equals the sorted transpose exactly:
    rows sorted by destination, duplicates in CSR order."""
    from gnn_fastpath.graph.graph import _sort_into_csr

    src, dst, n = _undirected(seed=seed)
    g = Graph.from_coo(src, dst, n, n)
    assert g.is_symmetric()  # known before the source-major CSR is asked for
    s = g.source_csr()
    assert s.indptr is g.indptr and s.indices is g.indices and s.csr_pos is g.reverse_edges()
    indptr, dst_sorted, order = _sort_into_csr(g.indices, g.dst_index(), n, n)
    assert torch.equal(s.indptr, indptr) and torch.equal(s.indices, dst_sorted) and torch.equal(s.csr_pos, order)
    k, kc = g.kernel_source_csr(), g.kernel_csr()
    assert k.indptr is kc.indptr and k.indices is kc.indices
    assert torch.equal(k.perm.long(), g.perm[order]) and torch.equal(k.csr_pos.long(), order)


def test_directed_graph_sorts_its_transpose():
    """A graph that is not symmetric keeps the sorted transpose (its own arrays)."""
    src, dst, n = _undirected(seed=3)
    g = Graph.from_coo(src[1:], dst[1:], n, n)  # one edge without its reverse
    assert not g.is_symmetric()
    s = g.source_csr()
    assert s.indices is not g.indices and s.indices.numel() == g.num_edges


def test_small_graph_is_not_checked_for_its_source_csr(monkeypatch):
    """Unknown symmetry: a graph below DETECT_SYMMETRY_FROM edges sorts its transpose without
    a detection (no host read: it may live one step); a larger one detects, once."""
    import gnn_fastpath.graph.graph as graph_module

    calls = []
    real = Graph.reverse_edges
    monkeypatch.setattr(Graph, "reverse_edges", lambda self: calls.append(1) or real(self))
    src, dst, n = _undirected(seed=4)
    g = Graph.from_coo(src, dst, n, n)
    assert g.source_csr().indices is not g.indices and calls == []
    monkeypatch.setattr(graph_module, "DETECT_SYMMETRY_FROM", 1)
    g = Graph.from_coo(src, dst, n, n)
    assert g.source_csr().indices is g.indices and calls == [1]
