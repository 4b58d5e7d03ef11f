"""Dry launches of the segment_reduce launchers on the CPU (see dry_launch.py): every path
reaches its kernels with matching arguments, and every instantiation compiles for sm_90,
for float32, float16 and bfloat16 features, with weights of the features' dtype and with
float32 weights (a float32 result of 16-bit features)."""
from __future__ import annotations

import pytest
import torch

from dry_launch import GRAPHS, graph, leaf
from zoo import random_edges
from gnn_fastpath import Graph
from gnn_fastpath.graph.tensors import as_graph, of_graph
from gnn_fastpath.ops.segment_reduce import SegmentReduceFunction

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("F", [1, 3, 64, 100, 512])
@pytest.mark.parametrize("tie_break,non_finite", [("split", "keep"), ("even", "keep"), ("first", "keep"),
                                                  ("last", "keep"), ("first", "drop"), ("last", "drop")])
@pytest.mark.parametrize("chunks", ["1", "2", "4"])
@pytest.mark.parametrize("bwd", ["atomic", "transposed"])
def test_segment_reduce_launches(launches, monkeypatch, graph_name, F, tie_break, non_finite, chunks, bwd):
    monkeypatch.setenv("GNN_FASTPATH_SR_CHUNKS", chunks)
    monkeypatch.setenv("GNN_FASTPATH_SR_BWD", bwd)
    g = graph(*GRAPHS[graph_name])
    x, w = leaf(g.n_src, F), leaf(g.num_edges)
    SegmentReduceFunction.apply(x, w, g, "min", tie_break, non_finite).sum().backward()
    # rows only, or long rows' chunks and light rows in one launch
    assert ("sr_fwd_rows" in launches) == (graph_name == "plain")
    assert ("sr_fwd_split" in launches) == ("sr_fwd_unpack" in launches) == (graph_name != "plain")
    # every rule scatters along the saved winner: by atomics, or for split/even (which save CSR
    # positions) source-major when asked
    source_major = bwd == "transposed" and tie_break in ("split", "even")
    assert ("sr_bwd_src" in launches) == source_major and ("sr_bwd_arg" in launches) != source_major
    assert ("sr_bwd_ties" in launches) == (tie_break in ("split", "even"))  # split/even walk their ties
    with torch.no_grad():  # value only
        SegmentReduceFunction.apply(x, None, g, "max", tie_break, non_finite)
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


@pytest.mark.parametrize("graph_name", ["plain", "bipartite_super"])
@pytest.mark.parametrize("F", [1, 3, 4, 64, 100, 512])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("w_dtype", ["same", torch.float32, None])
@pytest.mark.parametrize("tie_break,chunks,bwd", [("split", "1", "transposed"), ("first", "2", "atomic"),
                                                  ("last", "4", "atomic"), ("even", "4", "transposed"),
                                                  ("split", "2", "atomic")])
def test_segment_reduce_launches_16bit(launches, monkeypatch, graph_name, F, dtype, w_dtype, tie_break, chunks, bwd):
    """16-bit x (8-wide rows, 4-wide and scalar), the result in x's dtype (weights of x's dtype
    or none) or float32 (float32 weights); gradients in the dtypes of x and w; either backward
    scatter."""
    monkeypatch.setenv("GNN_FASTPATH_SR_CHUNKS", chunks)
    monkeypatch.setenv("GNN_FASTPATH_SR_BWD", bwd)
    g = graph(*GRAPHS[graph_name])
    x = torch.randn(g.n_src, F, dtype=dtype).requires_grad_()
    w = None if w_dtype is None else torch.randn(g.num_edges, dtype=dtype if w_dtype == "same" else w_dtype)
    if w is not None:
        w.requires_grad_()
    out = SegmentReduceFunction.apply(x, w, g, "max", tie_break, "keep")
    assert out.dtype == (dtype if w is None else torch.promote_types(dtype, w.dtype))
    out.float().sum().backward()
    assert ("sr_fwd_rows" in launches) == (graph_name == "plain")
    assert ("sr_fwd_split" in launches) == (graph_name != "plain")
    assert x.grad.dtype == dtype and x.grad.shape == x.shape
    if w is not None:
        assert w.grad.dtype == w.dtype and w.grad.shape == w.shape


def test_symmetric_graph_walks_its_own_csr(launches, monkeypatch):
    """The source-major backward of an undirected graph walks the forward CSR with the reverse
    edges' positions: no source-major CSR is built."""
    monkeypatch.setenv("GNN_FASTPATH_SR_BWD", "transposed")
    ei = graph(True).caller_coo()
    g = Graph.from_edge_index(torch.cat([torch.stack(ei), torch.stack(ei).flip(0)], 1), 40)
    assert g.is_symmetric()
    x = leaf(g.n_src, 64)
    SegmentReduceFunction.apply(x, None, g, "max", "split", "keep").sum().backward()
    assert "sr_bwd_src" in launches and "sr_bwd_arg" not in launches
    assert g.kernel_source_csr().indices is g.kernel_csr().indices


@pytest.mark.parametrize("mean_degree", [2, 8])
def test_backward_rule_and_setting(launches, monkeypatch, mean_degree):
    """The rule scatters with atomics, and takes the source-major pass where sources have few
    out-edges on a graph that outlived a training step (a forward after a backward: a sampled
    batch's graph, used by every layer of one step, never does); first/last and static graphs
    always scatter with atomics; the setting forces split/even."""
    from gnn_fastpath.cuda import segment_reduce as kernels

    monkeypatch.delenv("GNN_FASTPATH_SR_BWD", raising=False)
    ei, nn = random_edges(100, 100, 100 * mean_degree, seed=5)
    g = Graph.from_edge_index(ei, nn)
    x = leaf(g.n_src, 8)
    for layer in range(2):  # one step of two layers: forward, forward, backward, backward
        assert kernels.backward_mode(g, "split") == "atomic"
        h = SegmentReduceFunction.apply(x if layer == 0 else h, None, g, "max", "split", "keep")
    h.sum().backward()
    assert kernels.backward_mode(g, "split") == "atomic" and "sr_bwd_src" not in launches
    SegmentReduceFunction.apply(x, None, g, "max", "split", "keep").sum().backward()  # the next step
    want = "transposed" if mean_degree <= kernels.TRANSPOSED_MAX_MEAN_DEGREE else "atomic"
    assert kernels.backward_mode(g, "split") == want and ("sr_bwd_src" in launches) == (want == "transposed")
    monkeypatch.setenv("GNN_FASTPATH_SR_BWD", "transposed")
    assert kernels.backward_mode(g, "split") == kernels.backward_mode(g, "even") == "transposed"
    assert kernels.backward_mode(g, "first") == kernels.backward_mode(g, "last") == "atomic"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mean_degree", [2, 8, 32])
def test_feature_chunks_rule(launches, monkeypatch, mean_degree, dtype):
    """Without the setting or the tuner, the forward and the backward take the rule's feature
    chunks per lane for x's dtype: one where destinations have FEW_EDGES in-edges or more on
    average (FEW_EDGES_16BIT for 16-bit rows), else CHUNKS_FEW; no dtype reads as float32."""
    from gnn_fastpath.cuda import launch
    from gnn_fastpath.cuda import segment_reduce as kernels

    monkeypatch.delenv("GNN_FASTPATH_SR_CHUNKS", raising=False)
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "0")
    ei, nn = random_edges(100, 100, 100 * mean_degree, seed=5, self_loops=False)
    g = Graph.from_edge_index(ei, nn)
    sixteen = dtype != torch.float32
    assert kernels.FEW_EDGES_16BIT <= 8 < kernels.FEW_EDGES <= 32 and kernels.CHUNKS_FEW == 2
    want = {2: 2, 8: 1 if sixteen else 2, 32: 1}[mean_degree]
    assert kernels.rule_chunks(g, dtype) == want
    assert kernels.rule_chunks(g) == kernels.rule_chunks(g, torch.float32)
    asked, lane_groups = [], launch.lane_groups

    def record(F, *tensors, max_chunks=1, **kw):
        asked.append(max_chunks)
        return lane_groups(F, *tensors, max_chunks=max_chunks, **kw)

    monkeypatch.setattr(launch, "lane_groups", record)
    x = torch.randn(g.n_src, 64).to(dtype).requires_grad_()
    SegmentReduceFunction.apply(x, None, g, "max", "split", "keep").sum().backward()
    assert len(asked) == 2 and set(asked) == {want}  # the forward's, then the backward's


def test_no_sources_scatter_nothing(launches, monkeypatch):
    """Destinations but no source nodes (an edgeless bipartite batch): the source-major pass
    has no work item and is not launched (an empty grid would be a launch error)."""
    monkeypatch.setenv("GNN_FASTPATH_SR_BWD", "transposed")
    g = Graph.from_edge_index(torch.empty(2, 0, dtype=torch.int64), (0, 5))
    x = leaf(0, 8)
    out = SegmentReduceFunction.apply(x, None, g, "max", "split", "keep")
    out.sum().backward()
    assert out.shape == (5, 8) and x.grad.shape == (0, 8) and "sr_bwd_src" not in launches


@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("weighted", [False, True])
def test_unweighted_long_rows_cut_chunks_at_source_changes(launches, graph_name, weighted):
    """Unweighted counting rules on sorted rows collapse duplicate ties, which needs the
    long rows' chunks aligned to changes of source (sr_align_chunks, once per graph); weighted
    messages of duplicate edges differ, so they never collapse and never align."""
    g = graph(*GRAPHS[graph_name])
    assert g.sources_sorted
    x, w = leaf(g.n_src, 64), (leaf(g.num_edges) if weighted else None)
    SegmentReduceFunction.apply(x, w, g, "max", "split", "keep").sum().backward()
    assert ("sr_fwd_split" in launches) == (graph_name != "plain")
    assert ("sr_align_chunks" in launches) == (graph_name != "plain" and not weighted)


def test_walk_batch_keeps_waves_and_lanes():
    """Items per walking group: 1 while the grid is at most WALK_WAVES waves of groups, else
    as many as keep WALK_WAVES waves, at most one item per lane."""
    from gnn_fastpath.cuda.segment_reduce import WALK_WAVES, walk_batch

    resident = 8448
    assert walk_batch(1000, 32, 4, resident) == 1
    assert walk_batch(WALK_WAVES * resident * 10, 32, 1, resident) == 10
    assert walk_batch(169_343, 32, 2, resident) == 169_343 * 2 // (WALK_WAVES * resident)
    assert walk_batch(10**8, 32, 4, resident) == 32
    assert walk_batch(10**8, 8, 4, resident) == 8
    assert walk_batch(0, 32, 4, resident) == 1


def test_duplicates_flag_says_whether_a_row_repeats_a_source():
    """The forward's lanes with ties look for duplicate edges only where the graph has any:
    the per-graph flag (on the device, no host read) is 1 exactly when some row holds one
    source twice; sources repeated across rows, or at a row's end and the next row's start,
    do not count."""
    from gnn_fastpath.cuda.segment_reduce import _duplicates

    def flag(src, dst, n=4):  # a build that sorts each row's sources
        g = Graph.from_coo(torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64), n, n,
                           validate=False)
        assert g.sources_sorted
        return int(_duplicates(g))

    assert flag([0, 1, 2, 1], [0, 0, 1, 2]) == 0  # source 1 in two rows
    assert flag([1, 1, 2, 1], [0, 1, 1, 1]) == 1  # row 1: 1, 1, 2 after sorting
    assert flag([3, 3], [0, 1]) == 0  # row 0 ends with 3, row 1 starts with 3
    assert flag([2, 0, 2], [3, 3, 3]) == 1  # the last row
    assert flag([], []) == 0
    ei, nn = random_edges(60, 60, 400, seed=2)  # duplicates=True
    assert int(_duplicates(Graph.from_edge_index(ei, nn))) == 1
    ei, nn = random_edges(60, 60, 400, seed=2, duplicates=False, self_loops=False)
    simple = torch.unique(ei[1] * 60 + ei[0])
    assert int(_duplicates(Graph.from_edge_index(torch.stack([simple % 60, simple // 60]), nn))) == 0


@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("F", [3, 64, 100, 512])
@pytest.mark.parametrize("tie_break", ["split", "first"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sliced_scatter_launches(launches, monkeypatch, graph_name, F, tie_break, weighted, dtype):
    """The scatter in feature slices (forced) reaches sr_bwd_arg with the hub targets and adds
    the hub copies with sr_hub_sum, for CSR positions (split) and caller ids (first)."""
    monkeypatch.setenv("GNN_FASTPATH_SR_SCATTER", "slices")
    monkeypatch.setenv("GNN_FASTPATH_SR_BWD", "atomic")
    g = graph(*GRAPHS[graph_name])
    x = torch.randn(g.n_src, F, dtype=dtype).requires_grad_()
    w = leaf(g.num_edges) if weighted else None
    SegmentReduceFunction.apply(x, w, g, "max", tie_break, "keep").float().sum().backward()
    assert "sr_bwd_arg" in launches and "sr_hub_sum" in launches
    assert x.grad.shape == x.shape and x.grad.dtype == dtype


def test_scatter_order_rule(monkeypatch):
    """Feature slices where dx (n_src x F float32) outgrows the L2, on a graph that outlived a
    training step, for at least two slices of columns; row-major before that, for narrow rows,
    where dx fits and on static graphs; the setting forces either."""
    from gnn_fastpath.cuda import launch
    from gnn_fastpath.cuda import segment_reduce as kernels

    monkeypatch.delenv("GNN_FASTPATH_SR_SCATTER", raising=False)
    monkeypatch.setattr(launch, "l2_bytes", lambda device: 100 * 64 * 4 - 1)  # dx of F = 64 just outgrows it
    ei, nn = random_edges(100, 100, 800, seed=5)
    g = Graph.from_edge_index(ei, nn)
    cpu = torch.device("cpu")
    assert kernels.scatter_order(g, 64, cpu) == "rows"  # not yet used again
    for event in ("forward", "backward", "forward"):
        g.note_pass(event)
    assert g.outlived_a_step()
    assert kernels.scatter_order(g, 64, cpu) == "slices"
    monkeypatch.setattr(launch, "l2_bytes", lambda device: 0)
    assert kernels.scatter_order(g, 512, cpu) == "slices"
    assert kernels.scatter_order(g, 2 * kernels.SCATTER_SLICE - 1, cpu) == "rows"  # one slice: nothing gained
    static = as_graph(of_graph(g))
    for event in ("forward", "backward", "forward"):
        static.note_pass(event)
    assert static.static and kernels.scatter_order(static, 512, cpu) == "rows"
    monkeypatch.setattr(launch, "l2_bytes", lambda device: 100 * 64 * 4)
    assert kernels.scatter_order(g, 64, cpu) == "rows"
    monkeypatch.setenv("GNN_FASTPATH_SR_SCATTER", "slices")
    assert kernels.scatter_order(Graph.from_edge_index(ei, nn), 8, cpu) == "slices"
    monkeypatch.setenv("GNN_FASTPATH_SR_SCATTER", "rows")
    monkeypatch.setattr(launch, "l2_bytes", lambda device: 0)
    assert kernels.scatter_order(g, 64, cpu) == "rows"


def test_l2_size_without_torchs_property(monkeypatch):
    """torch before 2.5 has no ``L2_cache_size`` device property: the size then comes from
    CuPy's device attributes."""
    import sys
    import types

    from gnn_fastpath.cuda import launch

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace())
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=lambda index: types.SimpleNamespace(attributes={"L2CacheSize": 1000 + index})))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    launch._l2_bytes.cache_clear()
    try:
        assert launch.l2_bytes(torch.device("cuda", 3)) == 1003
    finally:
        launch._l2_bytes.cache_clear()


def test_hubs_are_the_sources_with_most_out_edges(monkeypatch):
    """The sliced scatter's hubs: the SCATTER_HUBS sources with the most out-edges; each lookup
    entry of a hub becomes -1 - its hub number, every other entry stays its source."""
    from gnn_fastpath.cuda import segment_reduce as kernels

    monkeypatch.setattr(kernels, "SCATTER_HUBS", 2)
    src = torch.tensor([5, 5, 5, 2, 2, 7, 0, 1, 5, 2, 3])
    dst = torch.tensor([0, 1, 2, 0, 3, 1, 2, 3, 3, 1, 0])
    g = Graph.from_edge_index(torch.stack([src, dst]), 8)
    lookup = g.kernel_csr().indices
    target, hub_src = kernels._hubs(g, lookup, "position")
    assert sorted(hub_src.tolist()) == [2, 5]
    number = {int(s): h for h, s in enumerate(hub_src.tolist())}
    want = [-1 - number[int(s)] if int(s) in number else int(s) for s in lookup]
    assert target.dtype == torch.int32 and target.tolist() == want
    assert kernels._hubs(g, lookup, "position")[0] is target  # once per graph
    few = Graph.from_edge_index(torch.tensor([[0], [1]]), 2)  # fewer sources than hubs
    assert sorted(kernels._hubs(few, few.kernel_csr().indices, "position")[1].tolist()) == [0, 1]
