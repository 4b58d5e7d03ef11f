"""What a new Graph knows on the host from its build (the one read-back on a GPU), the
no-sort path for edges grouped by target, trusted framework CSRs, and sync-free work lists.

The GPU side (one synchronisation per new graph, none per cached one) is checked by
tests/integrations/test_sampled_syncs.py on the device.
"""
import gc
import threading
import weakref

import pytest
import torch

from gnn_fastpath.cuda import worklist
from gnn_fastpath.graph import Graph, cache
from zoo import random_edges


def _edge_set(g: Graph):
    return sorted(zip(g.indices.tolist(), g.dst_index().tolist(), g.perm.tolist()))


def _grouped(n=60, m=400, seed=0):
    """An edge_index grouped by target (ascending), sources in no order within a target, as
    PyG's neighbour samplers return it."""
    ei, _ = random_edges(n, n, m, seed=seed)
    order = torch.sort(ei[1], stable=True).indices
    return ei[:, order]


def test_grouped_edges_keep_the_callers_order():
    ei = _grouped()
    g = Graph.from_edge_index(ei, 60)
    assert torch.equal(g.perm, torch.arange(ei.size(1)))
    assert torch.equal(g.indices, ei[0])
    # the same graph as from a shuffled copy, which is sorted (edge ids mapped back)
    shuffle = torch.randperm(ei.size(1))
    h = Graph.from_edge_index(ei[:, shuffle], 60)
    assert sorted((s, d, int(shuffle[p])) for s, d, p in _edge_set(h)) == _edge_set(g)
    assert torch.equal(g.indptr, h.indptr)


def test_grouped_graph_does_not_share_or_hold_the_callers_tensor():
    ei = _grouped()
    g = Graph.of(ei, num_nodes=60)
    built = g.indices.clone()
    ei[0] = (ei[0] + 1) % 60  # the caller may write into its tensor; the Graph stays as built
    assert torch.equal(g.indices, built)
    ref = weakref.ref(ei)
    del ei
    gc.collect()
    assert ref() is None, "the cached Graph keeps the caller's edge_index alive"


def test_clearing_the_cache_while_sources_die_does_not_deadlock():
    """Regression: a cached value that held its own source made the source die inside
    clear_cache's lock, and the weakref callback waited on that lock forever."""
    keep = [_grouped(seed=s) for s in range(3)]
    for ei in keep:
        Graph.of(ei, num_nodes=60)
    del keep
    t = threading.Thread(target=cache.clear_cache, daemon=True)
    t.start()
    t.join(timeout=20)
    assert not t.is_alive(), "clear_cache deadlocked"


@pytest.mark.parametrize("grouped", [True, False])
def test_build_records_degree_bounds_and_self_loops(grouped):
    ei = _grouped() if grouped else random_edges(60, 60, 400, seed=1)[0]
    ei = torch.cat([ei, torch.tensor([[3, 7], [3, 7]])], 1)  # two self loops at least
    g = Graph.from_edge_index(ei, 60)
    src, dst = ei
    assert g.degree_bound() == int(torch.bincount(dst, minlength=60).max())
    assert g.degree_bound(source_major=True) == int(torch.bincount(src, minlength=60).max())
    assert g.num_self_loops() == int((src == dst).sum())
    assert g.degree_stats().max == g.degree_bound()
    assert g.degree_stats().mean == pytest.approx(ei.size(1) / 60)


def test_empty_graph_facts():
    g = Graph.from_edge_index(torch.empty(2, 0, dtype=torch.long), 5)
    assert (g.degree_bound(), g.degree_bound(True), g.num_self_loops()) == (0, 0, 0)


def test_derived_graph_carries_upper_bounds_only():
    ei = _grouped()
    g = Graph.from_coo(ei[0], ei[1], 60, 60, validate=False, degree_bounds=(99, None))
    assert g.degree_bound() == 99 and g.degree_bound(True) is None
    assert g.degree_stats().max == int(g.in_degree().max())  # a bound is not the exact max
    assert g.num_self_loops() == int((ei[0] == ei[1]).sum())


def test_a_graph_from_bare_arrays_knows_no_bounds():
    g = Graph.from_edge_index(_grouped(), 60)
    bare = Graph(g.indptr, g.indices, g.perm, 60, 60)
    assert bare.degree_bound() is None and bare.degree_stats().max == g.degree_bound()


def test_from_csr_is_taken_as_given_and_checked_on_the_cpu():
    ei = _grouped()
    ref = Graph.from_edge_index(ei, 60)
    g = Graph.from_csr(ref.indptr.int(), ref.indices.int(), ref.perm.int(), 60, 60)
    assert torch.equal(g.indptr, ref.indptr) and torch.equal(g.indices, ref.indices)
    assert g.indptr.dtype == torch.int64
    assert g.degree_bound() == ref.degree_bound()
    with pytest.raises(ValueError, match=r"blk \(source ids\) contains node id 59, out of range for 10"):
        Graph.from_csr(ref.indptr, ref.indices, ref.perm, 10, 60, name="blk")
    bad = ref.indptr.clone()
    bad[-1] += 1
    with pytest.raises(ValueError, match="blk: indptr is not a row-offset array"):
        Graph.from_csr(bad, ref.indices, ref.perm, 60, 60, name="blk")
    with pytest.raises(ValueError, match="do not describe 59 destination rows"):
        Graph.from_csr(ref.indptr, ref.indices, ref.perm, 60, 59, name="blk")


def _lists_equal(a: worklist.RowChunks, b: worklist.RowChunks):
    assert (a.n_items, a.n_split_items, a.n_split) == (b.n_items, b.n_split_items, b.n_split)
    for name in ("items", "split", "split_rows", "whole_rows"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("order", worklist.ORDERS)
def test_work_list_without_read_back_matches_the_counted_one(order):
    g = Graph.from_edge_index(_grouped(m=900), 60)
    bound = g.degree_bound()
    split_from = bound + 1  # no row long enough: the bound alone decides, nothing read back
    _lists_equal(worklist.build(g.indptr, 4, split_from, order=order, max_degree=bound),
                 worklist.build(g.indptr, 4, split_from, order=order))
    # a bound at or above split_from takes the counted path, with rows split as before
    split = worklist.build(g.indptr, 4, 8, order=order, max_degree=bound)
    _lists_equal(split, worklist.build(g.indptr, 4, 8, order=order))
    assert split.n_split == int((g.in_degree() >= 8).sum()) > 0


def test_for_graph_uses_the_graphs_bound():
    g = Graph.from_edge_index(_grouped(m=900), 60)
    work = worklist.for_graph(g, 4, g.degree_bound() + 1, source_major=False)
    assert work.n_split == 0 and work.n_items == 60


def test_sources_sorted_is_known_from_the_build():
    """Whether each row's sources ascend (the min/max kernels then find duplicate edges next
    to each other): true where the build sorted the rows, or the edges came so; false for
    grouped edges in another order and for a framework's own CSR (not checked)."""
    ei, _ = random_edges(60, 60, 400, seed=2)
    assert Graph.from_edge_index(ei, 60).sources_sorted  # sorted here
    assert Graph.from_coo(ei[0], ei[1], 60, 60, validate=False).sources_sorted
    order = torch.sort(ei[1] * 60 + ei[0]).indices
    g = Graph.from_edge_index(ei[:, order], 60)  # grouped and sorted: kept as it came
    assert torch.equal(g.perm, torch.arange(ei.size(1))) and g.sources_sorted
    grouped = _grouped()
    assert bool(((grouped[1][1:] == grouped[1][:-1]) & (grouped[0][1:] < grouped[0][:-1])).any())
    g = Graph.from_edge_index(grouped, 60)  # grouped, sources in no order: kept, not sorted
    assert torch.equal(g.perm, torch.arange(grouped.size(1))) and not g.sources_sorted
    assert not Graph.from_csr(g.indptr, g.indices, g.perm, 60, 60).sources_sorted
    assert Graph.from_edge_index(ei, 60).to("cpu").sources_sorted
