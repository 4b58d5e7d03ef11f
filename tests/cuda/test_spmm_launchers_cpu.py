"""Dry launches of the spmm launchers on the CPU (see dry_launch.py): every path
reaches its kernels with matching arguments, and every instantiation compiles for sm_90,
for float32, float16 and bfloat16 features, results in the features' dtype or float32,
weights of any of those dtypes."""
from __future__ import annotations

import pytest
import torch

from dry_launch import GRAPHS, graph, leaf
from gnn_fastpath.cuda import spmm as spmm_kernels
from gnn_fastpath.ops.spmm import SpmmFunction

@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("F", [1, 3, 64, 512])
@pytest.mark.parametrize("norm", ["none", "left", "right", "both"])
def test_spmm_launches(launches, monkeypatch, graph_name, F, norm):
    monkeypatch.setenv("GNN_FASTPATH_SPMM_BWD", "transposed")
    g = graph(*GRAPHS[graph_name])
    x, w = leaf(g.n_src, F), leaf(g.num_edges)
    SpmmFunction.apply(x, w, g, norm).sum().backward()
    assert {"spmm_edge_values", "spmm_rows", "spmm_edge_grad"} <= set(launches)
    assert ("spmm_chunks" in launches) == (graph_name != "plain")
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


@pytest.mark.parametrize("graph_name", ["plain", "bipartite_super"])
@pytest.mark.parametrize("F", [1, 3, 4, 64, 512])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("w_dtype,out_dtype", [("same", None), (torch.float32, None), (None, torch.float32),
                                               ("same", "same"), (torch.bfloat16, torch.float32)])
def test_spmm_launches_16bit(launches, monkeypatch, graph_name, F, dtype, w_dtype, out_dtype):
    """16-bit x; the result in x's dtype or float32 (explicit, or promoted by a float32
    weight); dY in the result's dtype, dX in x's, dw in the weight's."""
    monkeypatch.setenv("GNN_FASTPATH_SPMM_BWD", "transposed")
    g = graph(*GRAPHS[graph_name])
    x = torch.randn(g.n_src, F, dtype=dtype).requires_grad_()
    w = None if w_dtype is None else torch.rand(g.num_edges, dtype=dtype if w_dtype == "same" else w_dtype)
    if w is not None:
        w.requires_grad_()
    want = dtype if out_dtype == "same" else out_dtype
    if want is None:
        want = dtype if w is None else torch.promote_types(dtype, w.dtype)
    out = SpmmFunction.apply(x, w, g, "both", want)
    assert out.dtype == want
    out.float().sum().backward()
    assert {"spmm_rows", "spmm_edge_values"} <= set(launches)
    split = graph_name != "plain"
    # 16-bit outputs of split rows: float scratch + one cast; float32 outputs: atomics in place
    assert ("spmm_split_store" in launches) == split
    assert ("spmm_chunks" in launches) == split
    assert x.grad.dtype == dtype and x.grad.shape == x.shape
    if w is not None:
        assert "spmm_edge_grad" in launches and w.grad.dtype == w.dtype and w.grad.shape == w.shape


@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_norm_launches(launches, weighted):
    g = graph(True)
    spmm_kernels.gcn_norm(g, torch.rand(g.num_edges) if weighted else None, 2.0)
    assert launches == ["spmm_gcn_degree", "spmm_gcn_values"]


def test_csr_build_launch(launches):
    from gnn_fastpath.cuda import csr_indptr

    csr_indptr(torch.tensor([0, 0, 2, 5]), 7)
    assert launches == ["csr_indptr_from_sorted"]


def _symmetric_graph(n=30, seed=3):
    """Random pairs both ways (the symmetry tests of tests/graph check the detection)."""
    from gnn_fastpath import Graph

    gen = torch.Generator().manual_seed(seed)
    a, b = torch.randint(0, n, (2, 120), generator=gen)
    return Graph.from_coo(torch.cat([a, b]), torch.cat([b, a]), n, n)


def _built(before, *kinds):
    return {k: spmm_kernels.build_counts[k] - before.get(k, 0) for k in kinds}


@pytest.mark.parametrize("case", ["unweighted", "same_weights", "asymmetric_weights", "new_weights"])
def test_undirected_backward_from_the_second_step(launches, monkeypatch, case):
    """A symmetric graph with symmetric values (A^T = A): the first step's backward takes
    cuSPARSE's transpose flag (no transposed matrix built); from the next step on the forward
    matrix serves, and the transposed matrix is built only where the values are not symmetric. Unweighted values are symmetric by construction (no check); a weights entry
    is checked once when used again (asymmetric ones keep the transpose); weights made anew
    every step are never checked."""
    g = _symmetric_graph()
    m = g.num_edges
    # the dry launches compute nothing: weighted values come from torch here (ones, or by position)
    asym = case == "asymmetric_weights"
    original = spmm_kernels.SpmmCache.edge_values
    monkeypatch.setattr(spmm_kernels.SpmmCache, "edge_values", lambda cache, norm, w: (
        original(cache, norm, w) if w is None else
        torch.arange(m, dtype=torch.float32) if asym else torch.ones(m)))
    before = dict(spmm_kernels.build_counts)
    w = torch.rand(m) + 0.1
    x = leaf(g.n_src, 8)
    for step in range(3):
        weights = None if case == "unweighted" else (torch.rand(m) + 0.1 if case == "new_weights" else w)
        SpmmFunction.apply(x, weights, g, "none").sum().backward()
        built = _built(before, "csr_t", "symmetry_check")
        if step == 0:
            assert built == {"csr_t": 0, "symmetry_check": 0}
    if case == "unweighted":
        assert built == {"csr_t": 0, "symmetry_check": 0}  # step 2 on: the forward matrix
        assert spmm_kernels.cache_of(g)._csr_t is None
    elif case == "same_weights":
        assert built == {"csr_t": 0, "symmetry_check": 1}
        assert spmm_kernels.cache_of(g)._csr_t is None
    elif case == "asymmetric_weights":
        assert built == {"csr_t": 1, "symmetry_check": 1} and spmm_kernels.cache_of(g)._csr_t is not None
    else:
        assert built == {"csr_t": 1, "symmetry_check": 0} and spmm_kernels.cache_of(g)._csr_t is not None
    assert x.grad.shape == x.shape


def test_one_step_graph_is_never_checked(launches, monkeypatch):
    """A graph that lives one step, shared by two layers (forward, forward, backward, backward),
    costs no symmetry detection (no host read), symmetric or not."""
    from gnn_fastpath import Graph

    g = _symmetric_graph(seed=4)
    calls = []
    real = Graph.reverse_edges
    monkeypatch.setattr(Graph, "reverse_edges", lambda self: calls.append(1) or real(self))
    x = leaf(g.n_src, 8)
    h = SpmmFunction.apply(x, None, g, "both")
    SpmmFunction.apply(h, None, g, "both").sum().backward()
    assert calls == []
