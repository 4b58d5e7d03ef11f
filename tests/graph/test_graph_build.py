"""Graph construction: orientation, perm, bipartite shapes, edge cases, derived data, validation.

Conventions checked here (see gnn_fastpath/graph/graph.py):
- PyG ``edge_index[0]`` are sources, ``edge_index[1]`` targets; CSR rows are targets;
- ``indices[indptr[i]:indptr[i+1]]`` are the sources of destination ``i``;
- ``perm[k]`` is the caller's edge id of CSR position ``k``.
"""
import warnings

import numpy as np
import pytest
import torch

from gnn_fastpath.graph import Graph
from gnn_fastpath.graph.convert import MAX_INFERRED_NODES, MAX_NODES, edge_index_to_coo
from zoo import random_edges


# ---------------------------------------------------------------------------- helpers
def _csr_as_edge_set(g: Graph):
    """Sorted list of (src, dst) pairs read back from the CSR."""
    dst = g.dst_index()
    return sorted(zip(g.indices.tolist(), dst.tolist()))


def _assert_consistent(g: Graph, edge_index: torch.Tensor, n_src: int, n_dst: int):
    """Full structural check of ``g`` against the caller's ``edge_index`` (PyG orientation)."""
    src, dst = edge_index[0].to(torch.int64), edge_index[1].to(torch.int64)
    m = src.numel()
    assert (g.n_src, g.n_dst, g.num_edges) == (n_src, n_dst, m)
    for t in (g.indptr, g.indices, g.perm):
        assert type(t) is torch.Tensor and t.dtype == torch.int64
    assert g.indptr.shape == (n_dst + 1,)
    assert g.indptr[0] == 0 and g.indptr[-1] == m
    assert bool((g.indptr[1:] >= g.indptr[:-1]).all())
    # in-degree of target i = number of edges whose edge_index[1] == i
    assert torch.equal(g.in_degree(), torch.bincount(dst, minlength=n_dst))
    assert torch.equal(g.out_degree(), torch.bincount(src, minlength=n_src))
    # perm is a permutation of the caller's edge ids, and lines up with (indices, dst_index)
    assert torch.equal(torch.sort(g.perm).values, torch.arange(m))
    assert torch.equal(src[g.perm], g.indices)
    assert torch.equal(dst[g.perm], g.dst_index())
    # rows sorted by source inside a row; duplicates keep caller order (stable)
    if m > 1:
        d, s, p = g.dst_index(), g.indices, g.perm
        same_row = d[1:] == d[:-1]
        assert bool((s[1:][same_row] >= s[:-1][same_row]).all())
        same_edge = same_row & (s[1:] == s[:-1])
        assert bool((p[1:][same_edge] > p[:-1][same_edge]).all())


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def zoo_graphs():
    """name -> (edge_index, (n_src, n_dst), Graph): built once for the module."""
    cases = {
        "homogeneous": random_edges(40, 40, 200, seed=1),
        "bipartite_wide": random_edges(50, 17, 150, seed=2, empty_rows=3),
        "bipartite_tall": random_edges(9, 60, 120, seed=3, empty_rows=5),
        "empty_rows": random_edges(30, 30, 60, seed=4, empty_rows=10),
        "super_node": random_edges(100, 100, 300, seed=5, super_node_degree=400),
        "single_edge": (torch.tensor([[3], [1]]), (5, 5)),
    }
    out = {}
    for name, (ei, (n_src, n_dst)) in cases.items():
        out[name] = (ei, (n_src, n_dst), Graph.from_edge_index(ei, (n_src, n_dst)))
    return out


ZOO_NAMES = ["homogeneous", "bipartite_wide", "bipartite_tall", "empty_rows", "super_node", "single_edge"]


# ---------------------------------------------------------------------------- orientation
def test_pyg_orientation_rows_are_targets():
    # 0 -> 1, 0 -> 2, 1 -> 2, 3 -> 0
    ei = torch.tensor([[0, 0, 1, 3], [1, 2, 2, 0]])
    g = Graph.from_edge_index(ei)
    assert (g.n_src, g.n_dst) == (4, 4)
    assert g.indptr.tolist() == [0, 1, 2, 4, 4]
    assert g.indices.tolist() == [3, 0, 0, 1]
    assert g.perm.tolist() == [3, 0, 1, 2]
    assert g.dst_index().tolist() == [0, 1, 2, 2]
    assert g.in_degree().tolist() == [1, 1, 2, 0]
    assert g.out_degree().tolist() == [2, 1, 0, 1]
    assert not g.is_bipartite
    assert g.device == torch.device("cpu")
    assert "n_src=4" in repr(g) and "num_edges=4" in repr(g)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_structure(zoo_graphs, name):
    ei, (n_src, n_dst), g = zoo_graphs[name]
    _assert_consistent(g, ei, n_src, n_dst)
    assert g.is_bipartite == (n_src != n_dst)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_dense_roundtrip(zoo_graphs, name):
    """The CSR holds exactly the caller's multiset of edges (duplicates counted)."""
    ei, (n_src, n_dst), g = zoo_graphs[name]
    want = sorted(zip(ei[0].tolist(), ei[1].tolist()))
    assert _csr_as_edge_set(g) == want


def test_perm_lines_up_edge_features(zoo_graphs):
    ei, (n_src, n_dst), g = zoo_graphs["homogeneous"]
    m = ei.size(1)
    # feature of an edge encodes (src, dst, caller id): read in CSR order through perm
    edge_feat = torch.stack([ei[0], ei[1], torch.arange(m)], 1).to(torch.float64) + 0.5
    csr_feat = edge_feat[g.perm]
    assert torch.equal(csr_feat[:, 0].long(), g.indices)
    assert torch.equal(csr_feat[:, 1].long(), g.dst_index())
    assert torch.equal(csr_feat[:, 2].long(), g.perm)
    # and back: scattering CSR values to perm restores caller order
    back = torch.empty_like(csr_feat)
    back[g.perm] = csr_feat
    assert torch.equal(back, edge_feat)


def test_duplicates_and_self_loops_kept():
    ei = torch.tensor([[2, 2, 1, 2, 0, 1], [1, 1, 1, 1, 0, 0]])
    g = Graph.from_edge_index(ei, 3)
    assert g.num_edges == 6
    assert g.indptr.tolist() == [0, 2, 6, 6]
    assert g.indices.tolist() == [0, 1, 1, 2, 2, 2]
    # duplicates of (2 -> 1) stay in caller order 0, 1, 3
    assert g.perm.tolist() == [4, 5, 2, 0, 1, 3]
    assert g.in_degree().tolist() == [2, 4, 0]


def test_self_loop_only_graph():
    ei = torch.arange(5).repeat(2, 1)
    g = Graph.from_edge_index(ei)
    assert g.indptr.tolist() == list(range(6))
    assert g.indices.tolist() == list(range(5))
    assert g.perm.tolist() == list(range(5))


# ---------------------------------------------------------------------------- dtypes and sizes
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8])
def test_integer_dtypes_give_same_graph(zoo_graphs, dtype):
    ei, (n_src, n_dst), ref = zoo_graphs["bipartite_wide"]
    g = Graph.from_edge_index(ei.to(dtype), (n_src, n_dst))
    for name in ("indptr", "indices", "perm"):
        assert getattr(g, name).dtype == torch.int64
        assert torch.equal(getattr(g, name), getattr(ref, name))


def test_default_num_nodes_is_max_id_plus_one():
    ei = torch.tensor([[0, 7], [3, 1]])
    g = Graph.from_edge_index(ei)
    assert (g.n_src, g.n_dst) == (8, 8)


def test_num_nodes_int_and_tensor_and_numpy():
    ei = torch.tensor([[0, 1], [1, 2]])
    for nn in (5, torch.tensor(5), np.int64(5), (5, 5), [5, 5]):
        g = Graph.from_edge_index(ei, nn)
        assert (g.n_src, g.n_dst) == (5, 5)
        assert g.indptr.tolist() == [0, 0, 1, 2, 2, 2]


def test_bipartite_num_nodes_pair():
    ei = torch.tensor([[0, 6, 6, 3], [1, 0, 1, 1]])
    g = Graph.from_edge_index(ei, (7, 2))
    assert (g.n_src, g.n_dst) == (7, 2) and g.is_bipartite
    assert g.indptr.tolist() == [0, 1, 4]
    assert g.indices.tolist() == [6, 0, 3, 6]
    assert g.out_degree().shape == (7,)
    _assert_consistent(g, ei, 7, 2)


def test_zero_nodes():
    ei = torch.empty(2, 0, dtype=torch.int64)
    for g in (Graph.from_edge_index(ei), Graph.from_edge_index(ei, 0), Graph.from_edge_index(ei, (0, 0))):
        assert (g.n_src, g.n_dst, g.num_edges) == (0, 0, 0)
        assert g.indptr.tolist() == [0]
        assert g.indices.numel() == 0 and g.perm.numel() == 0
        assert g.indices.dtype == torch.int64 and g.perm.dtype == torch.int64
        assert g.dst_index().numel() == 0
        assert g.in_degree().numel() == 0 and g.out_degree().numel() == 0
        assert g.degree_stats().max == 0 and g.degree_stats().mean == 0.0
        s = g.source_csr()
        assert s.indptr.tolist() == [0] and s.indices.numel() == 0 and s.csr_pos.numel() == 0
        k = g.kernel_csr()
        assert k.indptr.dtype == torch.int32 and k.indptr.tolist() == [0]
        ks = g.kernel_source_csr()
        assert ks.indptr.tolist() == [0] and ks.perm.numel() == 0 and ks.csr_pos.dtype == torch.int32
        src, dst = g.caller_coo()
        assert src.numel() == 0 and dst.numel() == 0


def test_zero_edges_with_nodes():
    ei = torch.empty(2, 0, dtype=torch.int32)
    g = Graph.from_edge_index(ei, (4, 6))
    assert (g.n_src, g.n_dst, g.num_edges) == (4, 6, 0)
    assert g.indptr.tolist() == [0] * 7
    assert g.in_degree().tolist() == [0] * 6
    assert g.out_degree().tolist() == [0] * 4
    assert g.degree_stats() == type(g.degree_stats())(0, 0.0)
    assert g.source_csr().indptr.tolist() == [0] * 5
    assert g.kernel_source_csr().indptr.tolist() == [0] * 5


# ---------------------------------------------------------------------------- PyG EdgeIndex and torch.sparse
# An EdgeIndex reaches the Graph through the PyG adapter that `import gnn_fastpath` registers.
def test_pyg_edge_index_sparse_size(pyg):
    from torch_geometric import EdgeIndex

    ei = torch.tensor([[0, 4, 4, 2], [1, 0, 1, 1]])
    g = Graph.of(EdgeIndex(ei, sparse_size=(5, 3)))
    assert (g.n_src, g.n_dst) == (5, 3)
    _assert_consistent(g, ei, 5, 3)
    ref = Graph.from_edge_index(ei, (5, 3))
    assert torch.equal(g.indptr, ref.indptr) and torch.equal(g.indices, ref.indices)
    assert torch.equal(g.perm, ref.perm)
    # explicit num_nodes wins over the EdgeIndex's sparse size
    g2 = Graph.of(EdgeIndex(ei, sparse_size=(5, 3)), (6, 4))
    assert (g2.n_src, g2.n_dst) == (6, 4)
    # without a sparse size: max id + 1 on both sides
    g3 = Graph.of(EdgeIndex(ei))
    assert (g3.n_src, g3.n_dst) == (5, 5)


def test_pyg_edge_index_partial_sparse_size(pyg):
    from torch_geometric import EdgeIndex

    ei = torch.tensor([[0, 1], [2, 0]])
    g = Graph.of(EdgeIndex(ei, sparse_size=(7, None)))
    assert (g.n_src, g.n_dst) == (7, 3)  # the unknown side from its own row: max id + 1
    _assert_consistent(g, ei, g.n_src, g.n_dst)
    g = Graph.of(EdgeIndex(ei, sparse_size=(None, 4)))
    assert (g.n_src, g.n_dst) == (2, 4)


def test_tensor_subclass_edge_index():
    class Tagged(torch.Tensor):
        pass

    ei = torch.tensor([[0, 0, 1, 3], [1, 2, 2, 0]])
    g = Graph.from_edge_index(ei.as_subclass(Tagged))
    _assert_consistent(g, ei, 4, 4)
    assert Graph.of(ei.as_subclass(Tagged), 5).n_dst == 5


def _sparse_quiet(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return fn()


def test_torch_sparse_csr_rows_are_targets():
    # adj_t [n_dst=3, n_src=5]: row i lists the sources of target i
    ei = torch.tensor([[4, 0, 2, 2, 1], [0, 1, 1, 2, 2]])  # (src, dst)
    adj_t = _sparse_quiet(lambda: torch.sparse_coo_tensor(ei.flip(0), torch.arange(5.0), (3, 5))
                          .coalesce().to_sparse_csr())
    g = Graph.from_sparse(adj_t)
    assert (g.n_src, g.n_dst) == (5, 3)
    assert g.indptr.tolist() == adj_t.crow_indices().tolist()
    assert g.indices.tolist() == adj_t.col_indices().tolist()
    # values in the adjacency's value order line up through perm
    assert torch.equal(adj_t.values()[g.perm], adj_t.values())
    assert g.perm.tolist() == list(range(5))
    # the caller's edge order is the CSR value order: (col, row) per stored value
    rows = torch.repeat_interleave(torch.arange(3), adj_t.crow_indices().diff())
    _assert_consistent(g, torch.stack([adj_t.col_indices(), rows]), 5, 3)
    assert sorted(zip(ei[0].tolist(), ei[1].tolist())) == _csr_as_edge_set(g)


def test_torch_sparse_csr_int32_indices():
    crow = torch.tensor([0, 2, 2, 3], dtype=torch.int32)
    col = torch.tensor([1, 3, 0], dtype=torch.int32)
    adj_t = _sparse_quiet(lambda: torch.sparse_csr_tensor(crow, col, torch.ones(3), (3, 4)))
    g = Graph.from_sparse(adj_t)
    assert (g.n_src, g.n_dst) == (4, 3)
    assert g.indptr.tolist() == [0, 2, 2, 3] and g.indptr.dtype == torch.int64
    assert g.indices.tolist() == [1, 3, 0]


def test_torch_sparse_coo_uncoalesced_keeps_value_order():
    # rows are targets; uncoalesced, with a duplicate, out of order
    rows = torch.tensor([2, 0, 2, 1, 2])
    cols = torch.tensor([1, 3, 0, 3, 1])
    vals = torch.tensor([10.0, 11.0, 12.0, 13.0, 14.0])
    adj_t = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, (3, 4))
    assert not adj_t.is_coalesced()
    g = Graph.from_sparse(adj_t)
    assert (g.n_src, g.n_dst) == (4, 3)
    assert g.indptr.tolist() == [0, 1, 2, 5]
    assert g.indices.tolist() == [3, 3, 0, 1, 1]
    # perm indexes the caller's value order
    assert adj_t._values()[g.perm].tolist() == [11.0, 13.0, 12.0, 10.0, 14.0]
    _assert_consistent(g, torch.stack([cols, rows]), 4, 3)


def test_torch_sparse_coo_coalesced_bipartite():
    ei, (n_src, n_dst) = random_edges(12, 7, 40, seed=8, duplicates=False, self_loops=False)
    ei = torch.unique(ei, dim=1)  # random sampling still repeats pairs; coalesce would merge them
    ei = ei[:, torch.randperm(ei.size(1))]
    adj_t = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.size(1)), (n_dst, n_src)).coalesce()
    g = Graph.from_sparse(adj_t)
    ref = Graph.from_edge_index(ei, (n_src, n_dst))
    assert torch.equal(g.indptr, ref.indptr) and torch.equal(g.indices, ref.indices)
    idx = adj_t.indices()
    assert torch.equal(idx[1][g.perm], g.indices) and torch.equal(idx[0][g.perm], g.dst_index())


# ---------------------------------------------------------------------------- degree stats
@pytest.mark.parametrize("name", ["homogeneous", "bipartite_wide", "empty_rows", "super_node"])
def test_degree_stats_matches_numpy(zoo_graphs, name):
    ei, (n_src, n_dst), g = zoo_graphs[name]
    deg = np.bincount(ei[1].numpy(), minlength=n_dst)
    s = g.degree_stats()
    assert s.max == int(deg.max()) and isinstance(s.max, int)
    assert s.mean == pytest.approx(deg.mean(), rel=1e-12)
    assert g.degree_stats() is s  # computed once


# ---------------------------------------------------------------------------- source CSR, kernel CSR, to()
@pytest.mark.parametrize("name", ZOO_NAMES)
def test_source_csr_consistency(zoo_graphs, name):
    ei, (n_src, n_dst), g = zoo_graphs[name]
    s = g.source_csr()
    m = g.num_edges
    assert s.indptr.shape == (n_src + 1,) and s.indptr.dtype == torch.int64
    assert torch.equal(s.indptr[1:] - s.indptr[:-1], torch.bincount(ei[0], minlength=n_src))
    # every CSR edge appears exactly once
    assert torch.equal(torch.sort(s.csr_pos).values, torch.arange(m))
    # csr_pos maps back: destination and source agree with the destination-major CSR
    assert torch.equal(s.indices, g.dst_index()[s.csr_pos])
    src_rows = torch.repeat_interleave(torch.arange(n_src), s.indptr[1:] - s.indptr[:-1])
    assert torch.equal(g.indices[s.csr_pos], src_rows)
    # destinations ascending within each source row
    if m > 1:
        same = src_rows[1:] == src_rows[:-1]
        assert bool((s.indices[1:][same] >= s.indices[:-1][same]).all())
    assert g.source_csr() is s


@pytest.mark.parametrize("name", ["homogeneous", "bipartite_tall", "single_edge"])
def test_kernel_csr_int32(zoo_graphs, name):
    g = zoo_graphs[name][2]
    k = g.kernel_csr()
    for field in ("indptr", "indices", "perm"):
        t = getattr(k, field)
        assert t.dtype == torch.int32
        assert torch.equal(t.long(), getattr(g, field))
    assert g.kernel_csr() is k


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_kernel_source_csr(zoo_graphs, name):
    g = zoo_graphs[name][2]
    s, k = g.source_csr(), g.kernel_source_csr()
    for field in ("indptr", "indices", "perm", "csr_pos"):
        assert getattr(k, field).dtype == torch.int32
    assert torch.equal(k.indptr.long(), s.indptr)
    assert torch.equal(k.indices.long(), s.indices)
    assert torch.equal(k.csr_pos.long(), s.csr_pos)
    assert torch.equal(k.perm.long(), g.perm[s.csr_pos])
    # each out-edge's caller id names the caller edge with that source and destination
    src, dst = g.caller_coo()
    rows = torch.repeat_interleave(torch.arange(g.n_src), s.indptr.diff())
    assert torch.equal(src[k.perm.long()], rows) and torch.equal(dst[k.perm.long()], k.indices.long())
    assert g.kernel_source_csr() is k


def test_int32_overflow_rejected_by_kernel_layouts():
    g = Graph(torch.tensor([0, 1]), torch.tensor([0]), torch.tensor([0]), 2**31, 1)
    assert not g.fits_int32()
    for build in (g.kernel_csr, g.kernel_source_csr):
        with pytest.raises(ValueError, match=r"int32 and support fewer than 2\*\*31"):
            build()


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_caller_coo(zoo_graphs, name):
    ei, _, g = zoo_graphs[name]
    src, dst = g.caller_coo()
    assert src.dtype == dst.dtype == torch.int64
    assert torch.equal(src, ei[0]) and torch.equal(dst, ei[1])
    assert g.caller_coo() is g.caller_coo()


def test_dst_index_cached(zoo_graphs):
    g = zoo_graphs["homogeneous"][2]
    assert g.dst_index() is g.dst_index()
    assert g.out_degree() is g.out_degree()


def test_memo():
    g = Graph.from_edge_index(torch.tensor([[0], [1]]))
    calls = []
    first = g.memo("k", lambda: calls.append(1) or object())
    assert g.memo("k", lambda: calls.append(1) or object()) is first
    assert calls == [1]


def test_to_same_device_returns_self(zoo_graphs):
    g = zoo_graphs["homogeneous"][2]
    assert g.to("cpu") is g
    assert g.to(torch.device("cpu")) is g
    assert g.to(g.device) is g


# ---------------------------------------------------------------------------- validation
def test_graph_init_checks():
    with pytest.raises(ValueError, match="indptr"):
        Graph(torch.zeros(3, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
              torch.zeros(0, dtype=torch.int64), 2, 3)
    with pytest.raises(ValueError, match="perm"):
        Graph(torch.tensor([0, 1]), torch.zeros(1, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), 1, 1)


@pytest.mark.parametrize("ei, num_nodes, pattern", [
    (torch.tensor([[0, 5], [1, 2]]), 5, r"edge_index \(source row\).*node id 5.*5 nodes"),
    (torch.tensor([[0, 1], [1, 9]]), 5, r"edge_index \(destination row\).*node id 9.*5 nodes"),
    (torch.tensor([[0, 3], [1, 2]]), (3, 4), r"source row.*node id 3.*3 nodes"),
    (torch.tensor([[0, 1], [3, 2]]), (5, 3), r"destination row.*node id 3.*3 nodes"),
    (torch.tensor([[0, -2], [1, 2]]), 5, r"edge_index \(source row\).*negative node id \(-2\)"),
    (torch.tensor([[0, 1], [-1, 2]]), None, r"edge_index \(destination row\).*negative node id \(-1\)"),
    (torch.tensor([[0, 1], [-1, 2]], dtype=torch.int32), 4, r"destination row.*negative.*-1"),
])
def test_bad_node_ids(ei, num_nodes, pattern):
    with pytest.raises(ValueError, match=pattern):
        Graph.from_edge_index(ei, num_nodes)


@pytest.mark.parametrize("ei, pattern", [
    (torch.zeros(3, 4, dtype=torch.int64), r"edge_index.*\[2, M\].*\(3, 4\)"),
    (torch.zeros(4, dtype=torch.int64), r"edge_index.*\[2, M\].*\(4,\)"),
    (torch.zeros(2, 3, 1, dtype=torch.int64), r"edge_index.*\[2, M\].*\(2, 3, 1\)"),
    (torch.zeros(2, 3), r"edge_index.*integer.*torch.float32"),
    (torch.zeros(2, 3, dtype=torch.float64), r"edge_index.*integer.*torch.float64"),
    (torch.zeros(2, 3, dtype=torch.bool), r"edge_index.*integer.*torch.bool"),
    ([[0, 1], [1, 0]], r"edge_index.*torch.Tensor.*list"),
    (np.zeros((2, 3), dtype=np.int64), r"edge_index.*torch.Tensor.*ndarray"),
])
def test_bad_edge_index(ei, pattern):
    with pytest.raises(ValueError, match=pattern):
        Graph.from_edge_index(ei)


def test_sparse_edge_index_rejected():
    adj = torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.ones(1), (2, 2))
    with pytest.raises(ValueError, match="edge_index.*layout"):
        Graph.from_edge_index(adj)


@pytest.mark.parametrize("num_nodes, pattern", [
    (-1, r"num_nodes must be >= 0, got -1"),
    (2.5, r"num_nodes must be an integer, got 2.5"),
    ("4", r"num_nodes must be an integer, got '4'"),
    (True, r"num_nodes must be an integer, got True"),
    (torch.tensor([3, 4]), r"num_nodes must be a single integer.*\(2,\)"),
    (torch.tensor(2.5), r"num_nodes must be an integer, got 2.5"),
    ((3, 4, 5), r"num_nodes must be an int or a pair.*\(3, 4, 5\)"),
    ((3,), r"num_nodes must be an int or a pair"),
    ((-1, 4), r"num_nodes\[0\] \(n_src\) must be >= 0, got -1"),
    ((4, 1.5), r"num_nodes\[1\] \(n_dst\) must be an integer, got 1.5"),
])
def test_bad_num_nodes(num_nodes, pattern):
    with pytest.raises(ValueError, match=pattern):
        Graph.from_edge_index(torch.tensor([[0, 1], [1, 0]]), num_nodes)


def test_num_nodes_too_small():
    with pytest.raises(ValueError, match=r"node id 2, out of range for 2 nodes"):
        Graph.from_edge_index(torch.tensor([[0, 2], [1, 0]]), 2)


@pytest.mark.parametrize("adj, pattern", [
    (torch.zeros(3, 3), r"adj_t must be sparse CSR or COO.*strided"),
    ([[1, 0]], r"adj_t must be a torch sparse tensor, got list"),
    (torch.sparse_coo_tensor(torch.zeros(3, 1, dtype=torch.int64), torch.ones(1), (2, 2, 2)),
     r"adj_t must be 2-D.*\(2, 2, 2\)"),
])
def test_bad_sparse(adj, pattern):
    with pytest.raises(ValueError, match=pattern):
        Graph.from_sparse(adj)


def test_sparse_out_of_range_names_adj_t():
    # a COO tensor built without invariant checks can hold ids past its size
    adj = torch.sparse_coo_tensor(torch.tensor([[0, 1], [0, 1]]), torch.ones(2), (2, 2))
    bad = torch.sparse_coo_tensor(torch.tensor([[0, 1], [0, 1]]), torch.ones(2), (2, 2), check_invariants=False)
    bad._indices()[1, 1] = 7
    assert Graph.from_sparse(adj).num_edges == 2
    with pytest.raises(ValueError, match=r"adj_t \(source row\).*node id 7"):
        Graph.from_sparse(bad)



# ---------------------------------------------------------------------------- inferred node counts (issue 15)
@pytest.mark.parametrize("bad_id", [2**40, 2**62, 2**63 - 1, MAX_INFERRED_NODES])
@pytest.mark.parametrize("row", [0, 1])
def test_huge_id_without_num_nodes_names_edge_index(bad_id, row):
    """An inferred count past MAX_INFERRED_NODES is a ValueError naming edge_index, the row
    and the id (it was an 8.8 TB allocation for 2**40, a storage overflow for 2**62)."""
    ei = torch.tensor([[0, 1], [1, 0]])
    ei[row, 1] = bad_id
    side = "source" if row == 0 else "destination"
    pattern = rf"edge_index \({side} row\) contains node id {bad_id}.*MAX_INFERRED_NODES.*Pass num_nodes"
    with pytest.raises(ValueError, match=pattern):
        Graph.from_edge_index(ei)
    with pytest.raises(ValueError, match=pattern):
        Graph.of(ei)


def test_huge_id_inferred_from_one_row_when_the_other_side_is_known():
    """An adapter that knows one side (PyG EdgeIndex) infers the other from its row: bounded too."""
    ei = torch.tensor([[0, 1], [2**40, 0]])
    with pytest.raises(ValueError, match=r"edge_index \(destination row\) contains node id 1099511627776"):
        edge_index_to_coo(ei, known=(5, None))
    assert edge_index_to_coo(ei, known=(5, 2**41))[2:] == (5, 2**41)  # known sizes are explicit
    with pytest.raises(ValueError, match=r"edge_index's n_src must be at most MAX_NODES"):
        edge_index_to_coo(ei, known=(MAX_NODES + 1, None))


def test_inferred_count_bound_is_inclusive():
    # max id MAX_INFERRED_NODES - 1 -> count MAX_INFERRED_NODES = 2**31 - 1: allowed (counts only,
    # no Graph is allocated here)
    ei = torch.tensor([[0, MAX_INFERRED_NODES - 1], [1, 0]])
    assert edge_index_to_coo(ei)[2:] == (MAX_INFERRED_NODES, MAX_INFERRED_NODES)
    assert MAX_INFERRED_NODES == 2**31 - 1


def test_huge_id_with_explicit_num_nodes_is_taken_as_given():
    """Explicit counts are honoured up to MAX_NODES (memory permitting, not allocated here)."""
    ei = torch.tensor([[0, 2**40], [1, 0]])
    assert edge_index_to_coo(ei, 2**41)[2:] == (2**41, 2**41)
    assert edge_index_to_coo(ei, (2**40 + 1, 2))[2:] == (2**40 + 1, 2)
    with pytest.raises(ValueError, match=r"num_nodes must be at most MAX_NODES = 2\*\*59, got 1152921504606846976"):
        Graph.from_edge_index(ei, 2**60)
    with pytest.raises(ValueError, match=r"num_nodes\[1\] \(n_dst\) must be at most MAX_NODES"):
        Graph.from_edge_index(ei, (2**41, 2**62))


def test_negative_ids_still_reported_as_negative_without_num_nodes():
    with pytest.raises(ValueError, match=r"edge_index \(source row\) contains a negative node id \(-5\)"):
        Graph.from_edge_index(torch.tensor([[-5], [-3]]))


# ---------------------------------------------------------------------------- meta device (issue 15)
@pytest.mark.parametrize("num_nodes", [None, 4, (4, 4)])
def test_meta_edge_index_names_edge_index(num_nodes):
    """A meta tensor holds no ids: ValueError naming edge_index and its device, not
    'Tensor.item() cannot be called on meta tensors' from inside torch."""
    ei = torch.tensor([[0, 1], [1, 0]], device="meta")
    pattern = r"edge_index is on meta, a device without data: its node ids cannot be read"
    with pytest.raises(ValueError, match=pattern):
        Graph.from_edge_index(ei, num_nodes)
    with pytest.raises(ValueError, match=pattern):
        Graph.of(ei, num_nodes)
    with pytest.raises(ValueError, match=pattern):  # empty too: one rule for every meta edge_index
        Graph.of(torch.empty(2, 0, dtype=torch.int64, device="meta"), num_nodes)


def test_meta_sparse_coo_and_num_nodes_name_the_argument():
    adj = torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.ones(1), (2, 2)).to("meta")
    with pytest.raises(ValueError, match=r"adj_t is on meta"):
        Graph.from_sparse(adj)
    with pytest.raises(ValueError, match=r"edge_index \(source row\) is on meta"):
        Graph.from_coo(torch.tensor([0, 1], device="meta"), torch.tensor([1, 0], device="meta"), 2, 2)
    with pytest.raises(ValueError, match=r"num_nodes is on meta"):
        Graph.of(torch.tensor([[0, 1], [1, 0]]), torch.tensor(2, device="meta"))


def test_graph_of_checks_tensor_num_nodes_like_from_edge_index():
    ei = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"num_nodes must be an integer, got 2.5"):
        Graph.of(ei, torch.tensor(2.5))  # was truncated to 2 silently
    assert Graph.of(ei, torch.tensor(3)).n_dst == 3


# ---------------------------------------------------------------------------- uint8 / int8 / bool ids (issue 15)
def test_uint8_edge_index_reads_values_as_ids_not_as_a_mask():
    ei = torch.tensor([[200, 255, 0, 255], [255, 200, 255, 1]])
    g8 = Graph.from_edge_index(ei.to(torch.uint8))
    ref = Graph.from_edge_index(ei)
    assert (g8.n_src, g8.n_dst) == (256, 256)
    for name in ("indptr", "indices", "perm"):
        assert torch.equal(getattr(g8, name), getattr(ref, name))
    _assert_consistent(g8, ei, 256, 256)


def test_int8_negative_ids_rejected():
    ei = torch.tensor([[0, -128], [1, 0]], dtype=torch.int8)
    with pytest.raises(ValueError, match=r"edge_index \(source row\) contains a negative node id \(-128\)"):
        Graph.from_edge_index(ei, 4)


@pytest.mark.parametrize("num_nodes", [None, 2, 5])
def test_bool_edge_index_rejected(num_nodes):
    ei = torch.tensor([[0, 1, 1], [1, 0, 1]], dtype=torch.bool)
    with pytest.raises(ValueError, match=r"edge_index must hold integer node ids, got dtype torch.bool.*mask"):
        Graph.from_edge_index(ei, num_nodes)
    with pytest.raises(ValueError, match=r"edge_index must hold integer node ids, got dtype torch.bool"):
        Graph.of(ei, num_nodes)


def test_stock_pyg_small_int_and_bool_edge_index(pyg):
    """Pins what stock PyG (2.8, CPU) does with these dtypes, which the decisions above follow:
    uint8/int8 give the int64 answer where stock computes (layers adding self loops widen the ids
    through torch.cat) and raise where it indexes with them directly; bool has no single meaning
    (read as ids 0/1 by GCNConv, rejected by SAGEConv). ``forward`` is called directly, so this is
    stock even while the gnn_fastpath layer shims are enabled."""
    from torch_geometric.nn import GATv2Conv, GCNConv, SAGEConv

    x = torch.randn(5, 8)
    ei = torch.tensor([[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 2]])
    for conv in (GCNConv(8, 4), GATv2Conv(8, 4, heads=2)):
        conv.eval()
        ref = conv.forward(x, ei)
        for dtype in (torch.uint8, torch.int8):
            torch.testing.assert_close(conv.forward(x, ei.to(dtype)), ref)
        # bool is read as node ids 0/1 (True -> 1): not the graph that was meant
        assert not torch.allclose(conv.forward(x, ei.to(torch.bool)), ref)
    sage = SAGEConv(8, 4)
    with pytest.raises(RuntimeError, match=r"int32 or int64"):
        sage.forward(x, ei.to(torch.uint8))
    with pytest.raises(ValueError, match=r"integer type"):
        sage.forward(x, ei.to(torch.bool))
