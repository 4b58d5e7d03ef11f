"""Graph from DGL graphs and blocks, and Graph.of caching of DGL objects.

DGL's convention is src -> dst with edges numbered by edge id; the Graph's CSR rows are the
destinations and ``perm`` maps CSR positions back to DGL edge ids.
"""
import gc

import pytest
import torch

from gnn_fastpath.graph import Graph, cache_size, cached_count, clear_cache, set_cache_size
from gnn_fastpath.integrations.dgl.graph import graph_from_dgl
from zoo import random_edges

pytestmark = pytest.mark.dgl


@pytest.fixture(autouse=True)
def _fresh_cache():
    size = cache_size()
    clear_cache()
    yield
    set_cache_size(size)
    clear_cache()


@pytest.fixture(scope="module")
def edges():
    return random_edges(25, 25, 80, seed=11, empty_rows=4)


def _same_csr(a: Graph, b: Graph) -> bool:
    return (torch.equal(a.indptr, b.indptr) and torch.equal(a.indices, b.indices)
            and torch.equal(a.perm, b.perm) and (a.n_src, a.n_dst) == (b.n_src, b.n_dst))


def test_dgl_orientation_matches_pyg(dgl, edges):
    ei, (n, _) = edges
    g = dgl.graph((ei[0], ei[1]), num_nodes=n)
    fg = graph_from_dgl(g)
    assert _same_csr(fg, Graph.from_edge_index(ei, n))
    # rows are DGL destinations: in-degrees agree with DGL's
    assert torch.equal(fg.in_degree(), g.in_degrees().long())
    assert torch.equal(fg.out_degree(), g.out_degrees().long())
    # perm maps CSR positions to DGL edge ids
    src, dst = g.edges(order="eid")
    assert torch.equal(src[fg.perm].long(), fg.indices)
    assert torch.equal(dst[fg.perm].long(), fg.dst_index())


def test_dgl_tiny_explicit(dgl):
    g = dgl.graph((torch.tensor([0, 0, 1, 3]), torch.tensor([1, 2, 2, 0])), num_nodes=5)
    fg = graph_from_dgl(g)
    assert fg.indptr.tolist() == [0, 1, 2, 4, 4, 4]
    assert fg.indices.tolist() == [3, 0, 0, 1]
    assert fg.perm.tolist() == [3, 0, 1, 2]


def test_dgl_edge_features_line_up(dgl, edges):
    ei, (n, _) = edges
    g = dgl.graph((ei[0], ei[1]), num_nodes=n)
    g.edata["w"] = torch.arange(g.num_edges(), dtype=torch.float64)
    fg = graph_from_dgl(g)
    w_csr = g.edata["w"][fg.perm]
    assert torch.equal(w_csr.long(), fg.perm)
    src, dst = g.find_edges(w_csr.long())
    assert torch.equal(src.long(), fg.indices) and torch.equal(dst.long(), fg.dst_index())


def test_dgl_int32_idtype(dgl, edges):
    ei, (n, _) = edges
    g = dgl.graph((ei[0].int(), ei[1].int()), num_nodes=n, idtype=torch.int32)
    assert g.idtype == torch.int32
    fg = graph_from_dgl(g)
    assert fg.indptr.dtype == fg.indices.dtype == fg.perm.dtype == torch.int64
    assert _same_csr(fg, Graph.from_edge_index(ei, n))
    assert Graph.of(g) is Graph.of(g)


def test_dgl_bipartite_heterograph(dgl):
    g = dgl.heterograph({("user", "rates", "item"): (torch.tensor([0, 4, 4, 2]), torch.tensor([1, 0, 1, 1]))},
                        num_nodes_dict={"user": 5, "item": 3})
    fg = graph_from_dgl(g)
    assert (fg.n_src, fg.n_dst) == (5, 3) and fg.is_bipartite
    assert fg.indptr.tolist() == [0, 1, 4, 4]
    assert fg.indices.tolist() == [4, 0, 2, 4]


def test_dgl_block(dgl, edges):
    ei, (n, _) = edges
    g = dgl.graph((ei[0], ei[1]), num_nodes=n)
    seeds = torch.tensor([0, 3, 5, 7])
    block = dgl.to_block(dgl.in_subgraph(g, seeds), dst_nodes=seeds)
    fg = graph_from_dgl(block)
    assert (fg.n_src, fg.n_dst) == (block.num_src_nodes(), block.num_dst_nodes())
    assert fg.n_dst == 4
    assert torch.equal(fg.in_degree(), block.in_degrees().long())
    # map back to original node ids: the block holds exactly the in-edges of the seeds
    src, dst = block.edges(order="eid")
    orig_src = block.srcdata[dgl.NID][src]
    orig_dst = block.dstdata[dgl.NID][dst]
    mask = torch.isin(ei[1], seeds)
    assert sorted(zip(orig_src.tolist(), orig_dst.tolist())) == sorted(
        zip(ei[0][mask].tolist(), ei[1][mask].tolist()))
    assert torch.equal(src[fg.perm].long(), fg.indices)
    # the cache serves blocks too
    assert Graph.of(block) is Graph.of(block)
    assert Graph.of(block) is not Graph.of(block.int())


def test_dgl_block_int32(dgl, edges):
    ei, (n, _) = edges
    g = dgl.graph((ei[0].int(), ei[1].int()), num_nodes=n, idtype=torch.int32)
    block = dgl.to_block(g, dst_nodes=torch.arange(n, dtype=torch.int32))
    assert block.idtype == torch.int32
    fg = Graph.of(block)
    assert fg.n_dst == n and fg.num_edges == g.num_edges()
    assert Graph.of(block) is fg


def test_dgl_multiple_edge_types_rejected(dgl):
    g = dgl.heterograph({("a", "x", "a"): ([0], [1]), ("a", "y", "a"): ([1], [0])})
    with pytest.raises(ValueError, match="g must have a single edge type, got 2"):
        graph_from_dgl(g)
    with pytest.raises(ValueError, match="g must have a single edge type, got 2"):
        Graph.of(g)


def test_dgl_cache_hit(dgl, edges):
    ei, (n, _) = edges
    g = dgl.graph((ei[0], ei[1]), num_nodes=n)
    fg = Graph.of(g)
    assert Graph.of(g) is fg
    assert cached_count("cpu") == 1
    g.ndata["h"] = torch.randn(n, 3)  # features do not touch the structure
    assert Graph.of(g) is fg


def test_dgl_rebuild_after_add_edges(dgl):
    g = dgl.graph((torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])), num_nodes=4)
    fg = Graph.of(g)
    g.add_edges(torch.tensor([3]), torch.tensor([1]))
    fg2 = Graph.of(g)
    assert fg2 is not fg
    assert fg2.num_edges == 4
    assert _same_csr(fg2, graph_from_dgl(g))
    assert fg2.in_degree().tolist() == [1, 2, 1, 0]


def test_dgl_rebuild_after_add_nodes(dgl):
    g = dgl.graph((torch.tensor([0, 1]), torch.tensor([1, 0])), num_nodes=2)
    fg = Graph.of(g)
    g.add_nodes(3)
    fg2 = Graph.of(g)
    assert fg2 is not fg and fg2.n_dst == 5


def test_dgl_rebuild_after_remove_then_add_same_count(dgl):
    # Same node and edge counts afterwards: only the structure identity tells them apart.
    g = dgl.graph((torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])), num_nodes=4)
    fg = Graph.of(g)
    g.remove_edges(torch.tensor([0]))
    g.add_edges(torch.tensor([3]), torch.tensor([1]))
    fg2 = Graph.of(g)
    assert fg2 is not fg
    assert sorted(zip(fg2.indices.tolist(), fg2.dst_index().tolist())) == [(1, 2), (2, 0), (3, 1)]
    assert _same_csr(fg2, Graph.from_edge_index(torch.stack([t.long() for t in g.edges(order="eid")]), 4))


class _Structure:
    """Stands in for DGL's structure object (``g._graph``), which DGL swaps on every change."""


class _FakeDGLGraph:
    """Just enough of the DGL graph API for Graph.of, with a structure object we control."""

    def __init__(self, src, dst, n):
        self.set_edges(src, dst, n)
        self.idtype = torch.int64
        self.device = torch.device("cpu")
        self.canonical_etypes = [("_N", "_E", "_N")]

    def set_edges(self, src, dst, n):
        """Like DGL's remove_edges then add_edges: two structure swaps, each freeing the last."""
        self._src, self._dst, self._n = torch.tensor(src), torch.tensor(dst), n
        self._graph = _Structure()
        self._graph = _Structure()

    def edges(self, order="eid"):
        return self._src, self._dst

    def num_src_nodes(self):
        return self._n

    def num_dst_nodes(self):
        return self._n

    def num_edges(self):
        return self._src.numel()


_FakeDGLGraph.__module__ = "dgl.fake_for_tests"  # what the DGL adapter's duck typing looks at


def test_dgl_rebuild_when_structure_address_is_recycled():
    """A cache entry must not be fooled by a new structure object at a recycled address.

    DGL frees the old structure when it swaps in a new one, and CPython hands the freed
    address to the next object of that size. A version keyed on ``id(structure)`` alone
    then matches the changed graph and returns the stale Graph.
    """
    stale = 0
    for _ in range(20):
        g = _FakeDGLGraph([0, 1, 2], [1, 2, 0], 4)
        fg = Graph.of(g)
        assert Graph.of(g) is fg
        g.set_edges([1, 2, 3], [2, 0, 1], 4)  # same counts, old structure freed here
        fg2 = Graph.of(g)
        stale += fg2 is fg
        assert sorted(zip(fg2.indices.tolist(), fg2.dst_index().tolist())) == [(1, 2), (2, 0), (3, 1)]
    assert stale == 0


def test_dgl_weak_reference(dgl, edges):
    ei, (n, _) = edges
    g = dgl.graph((ei[0], ei[1]), num_nodes=n)
    Graph.of(g)
    assert cached_count() == 1
    del g
    gc.collect()
    assert cached_count() == 0


def test_dgl_bound(dgl):
    set_cache_size(3)
    graphs = [dgl.graph((torch.tensor([0, s % 3]), torch.tensor([1, 2])), num_nodes=4) for s in range(10)]
    built = [Graph.of(g) for g in graphs]
    assert cached_count() <= 3
    assert Graph.of(graphs[-1]) is built[-1]


def test_malformed_block_is_rejected(dgl):
    """to_block with dst_nodes that miss some edges' targets gives a block whose edges point
    past num_dst_nodes: Graph raises ValueError naming `g` (a kernel would write out of bounds)."""
    frontier = dgl.graph((torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0])), num_nodes=4)
    block = dgl.to_block(frontier, dst_nodes=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"g \(destination row\) contains node id 3, out of range for 2"):
        graph_from_dgl(block)


def test_graph_from_dgl_rejects_plain_objects():
    with pytest.raises(ValueError, match="g must be a DGL graph, got Tensor"):
        graph_from_dgl(torch.zeros(2, 2))


def test_look_alikes_from_other_packages_are_not_dgl_graphs():
    """The adapter matches the dgl package only, not packages whose names start with it."""
    fake = _FakeDGLGraph([0], [1], 2)
    Graph.of(fake)  # the dgl one is taken
    other = type("Lookalike", (_FakeDGLGraph,), {"__module__": "dglke.models"})([0], [1], 2)
    with pytest.raises(ValueError, match="obj must be .*got Lookalike"):
        Graph.of(other)
