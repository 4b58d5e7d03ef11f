"""cuSPARSE SpMM op (and gcn_norm_values) against the float64 reference.

Relative error ||got - want|| / ||want|| < 1e-4 of the fp32 CUDA results against
``gnn_fastpath.reference.spmm`` on float64 copies: the output and the gradients of x and of
the edge weights, for every norm, both backward variants (transposed CSR, transpose flag),
graphs with a super node (>= 100k in-edges), empty rows, bipartite shapes and no edges,
and F in {1, 7, 64, 512}. Plus: cache reuse and invalidation, streams.
"""
from __future__ import annotations

import pytest
import torch
from kernel_checks import assert_close

from gnn_fastpath import Graph, reference
from gnn_fastpath.cuda import cusparse
from gnn_fastpath.cuda import spmm as spmm_kernels
from gnn_fastpath.ops import backend_for, force_reference, spmm
from gnn_fastpath.ops.gcn_norm import gcn_norm_values
from zoo import random_edges

pytestmark = pytest.mark.cuda

NORMS = ("none", "left", "right", "both")
WIDTHS = (1, 7, 64, 512)
#: The SpMM backward variant, a setting read at every backward (gnn_fastpath.config).
BWD_ENV = "GNN_FASTPATH_SPMM_BWD"
BWD_MODES = ("transposed", "flag")




_GRAPHS = {
    "random": lambda: random_edges(300, 300, 3000, seed=1, empty_rows=20),
    "super": lambda: random_edges(2000, 2000, 20000, seed=2, empty_rows=10, super_node_degree=110_000),
    "bipartite": lambda: random_edges(500, 300, 4000, seed=3, empty_rows=5),
    "bipartite_wide_dst": lambda: random_edges(200, 700, 3000, seed=4, empty_rows=30),
    "no_edges": lambda: random_edges(50, 40, 0, seed=5, self_loops=False, duplicates=False),
    # more edges than matrix entries (a dense multigraph): cuSPARSE refuses its descriptor
    "multigraph": lambda: random_edges(12, 10, 60, seed=6, super_node_degree=400),
}
_cache = {}


def _graph(name):
    if name not in _cache:
        edge_index, (n_src, n_dst) = _GRAPHS[name]()
        _cache[name] = Graph.from_edge_index(edge_index.cuda(), (n_src, n_dst))
    return _cache[name]


def _run(fn, graph, x, w, g):
    x = x.clone().requires_grad_(True)
    w = None if w is None else w.clone().requires_grad_(True)
    out = fn(graph, x, w)
    out.backward(g)
    return out.detach(), x.grad, None if w is None else w.grad


def _check(graph, F, norm, weighted, seed=0, trailing=None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (graph.n_src, F) if trailing is None else (graph.n_src,) + trailing
    x = torch.randn(shape, device="cuda", generator=gen)
    w = torch.rand(graph.num_edges, device="cuda", generator=gen) + 0.25 if weighted else None
    out_shape = (graph.n_dst,) + tuple(shape[1:])
    g = torch.randn(out_shape, device="cuda", generator=gen)
    assert backend_for("spmm", x) == "cuda"
    return _compare(graph, x, w, g, norm, f"F={F}, norm={norm}, weighted={weighted}")


def _compare(graph, x, w, g, norm, what):
    """spmm on the kernels vs the float64 reference: out, dx, dw (with ``g`` as dY)."""
    got = _run(lambda gr, x, w: spmm(gr, x, w, norm), graph, x, w, g)
    want = _run(lambda gr, x, w: reference.spmm(gr, x, w, norm), graph, x.double(),
                None if w is None else w.double(), g.double())
    for name, a, b in zip(("out", "dx", "dw"), got, want):
        if b is not None:
            assert_close(f"{name} ({what})", a, b)
    return got


def _undirected(super_degree=0):
    """A symmetric multigraph on the GPU (random pairs both ways, self loops, duplicates;
    a super node when ``super_degree``)."""
    edge_index, (n, _) = random_edges(400, 400, 3000, seed=7, empty_rows=20, super_node_degree=super_degree)
    src, dst = edge_index
    return Graph.from_coo(torch.cat([src, dst]).cuda(), torch.cat([dst, src]).cuda(), n, n)


@pytest.mark.parametrize("super_degree", [0, 5000])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("weights", ["none", "symmetric", "asymmetric"])
def test_undirected_backward(super_degree, norm, weights):
    """A symmetric graph over two training steps (the same weight tensor): with symmetric
    values (norm none/both, symmetric or no weights) the second step's backward multiplies by
    the forward matrix and drops the transposed one; otherwise it keeps the transpose; every
    step matches the float64 reference."""
    graph = _undirected(super_degree)
    assert graph.is_symmetric()
    rev = graph.reverse_edges()
    gen = torch.Generator(device="cuda").manual_seed(1)
    w = None
    if weights != "none":
        w_csr = torch.rand(graph.num_edges, device="cuda", generator=gen) + 0.25
        if weights == "symmetric":
            w_csr = torch.minimum(w_csr, w_csr[rev])  # the same value on an edge and its reverse
        w = torch.empty_like(w_csr).scatter_(0, graph.perm.to(torch.int64), w_csr).requires_grad_()  # caller order
    for step in range(2):
        x = torch.randn(graph.n_src, 64, device="cuda", generator=gen, requires_grad=True)
        g = torch.randn(graph.n_dst, 64, device="cuda", generator=gen)
        out = spmm(graph, x, w, norm)
        out.backward(g)
        x_ref = x.detach().double().requires_grad_()
        w_ref = None if w is None else w.detach().double().requires_grad_()
        ref = reference.spmm(graph, x_ref, w_ref, norm)
        ref.backward(g.double())
        what = f"step {step}, norm={norm}, weights={weights}"
        assert_close(f"out ({what})", out.detach(), ref.detach())
        assert_close(f"dx ({what})", x.grad, x_ref.grad)
        if w is not None:
            assert_close(f"dw ({what})", w.grad, w_ref.grad)
            w.grad = None
    symmetric_values = norm in ("none", "both") and weights != "asymmetric"  # left/right: 1/deg differs
    assert (spmm_kernels.cache_of(graph)._csr_t is None) == symmetric_values


# ------------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("graph_name", list(_GRAPHS))
@pytest.mark.parametrize("F", WIDTHS)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_reference(graph_name, F, norm, weighted):
    _check(_graph(graph_name), F, norm, weighted)


@pytest.mark.parametrize("mode", BWD_MODES)
@pytest.mark.parametrize("graph_name", ["super", "bipartite", "bipartite_wide_dst", "multigraph"])
@pytest.mark.parametrize("norm", ["none", "both"])
def test_backward_variants(monkeypatch, mode, graph_name, norm):
    monkeypatch.setenv(BWD_ENV, mode)
    _check(_graph(graph_name), 64, norm, weighted=True, seed=3)


@pytest.mark.parametrize("alg", ["default", "alg1", "alg2", "alg3", "custom"])
@pytest.mark.parametrize("graph_name", ["super", "bipartite_wide_dst", "multigraph"])
@pytest.mark.parametrize("F", [7, 64])
def test_each_algorithm(monkeypatch, alg, graph_name, F):
    """Every algorithm (forced; a fresh Graph so nothing is cached), also those the timing
    leaves out (CSR_ALG1/ALG3 spread NaN across rows; their finite results are right)."""
    monkeypatch.setenv("GNN_FASTPATH_SPMM_ALG", alg)
    # the backward on the explicit transpose (its own matrix), so the forward matrix has
    # made exactly one choice: the one forced here
    monkeypatch.setenv("GNN_FASTPATH_SPMM_BWD", "transposed")
    edge_index, sizes = _GRAPHS[graph_name]()
    graph = Graph.from_edge_index(edge_index.cuda(), sizes)
    _check(graph, F, "both", weighted=True, seed=5)
    chosen = spmm_kernels.cache_of(graph).csr.chosen_algorithms()
    # a multigraph with more edges than matrix entries always runs the custom kernel
    expected = "custom" if graph_name == "multigraph" else alg
    assert list(chosen.values()) == [{**cusparse._ALGS, **cusparse.algorithms()}[expected]]


def test_trailing_dims():
    _check(_graph("random"), None, "both", weighted=True, trailing=(3, 5))


def test_only_requested_gradients():
    graph = _graph("random")
    x = torch.randn(graph.n_src, 16, device="cuda", requires_grad=True)
    w = torch.rand(graph.num_edges, device="cuda")  # no grad wanted
    spmm(graph, x, w, "both").sum().backward()
    assert x.grad is not None and w.grad is None
    x2 = torch.randn(graph.n_src, 16, device="cuda")
    w2 = torch.rand(graph.num_edges, device="cuda", requires_grad=True)
    spmm(graph, x2, w2, "left").sum().backward()
    assert w2.grad is not None


def test_output_fully_written_when_beta_is_zero():
    """cuSPARSE with beta = 0 must not read the (uninitialised) output: prefill it with NaN."""
    graph = _graph("random")
    cache = spmm_kernels.cache_of(graph)
    values = cache.values("both", None).values
    x = torch.randn(graph.n_src, 64, device="cuda")
    out = torch.full((graph.n_dst, 64), float("nan"), device="cuda")
    cache.csr.matmul(values, x, out)
    assert_close("out", out, reference.spmm(graph, x.double(), None, "both"))
    dx = torch.full((graph.n_src, 64), float("nan"), device="cuda")
    cache.csr.matmul(values, out, dx, transpose=True)
    assert torch.isfinite(dx).all()


# ------------------------------------------------------------------------------- caching
def test_cache_reused_across_calls():
    edge_index, (n, _) = random_edges(400, 400, 5000, seed=11)
    graph = Graph.from_edge_index(edge_index.cuda(), n)
    x = torch.randn(n, 32, device="cuda")
    w = torch.rand(graph.num_edges, device="cuda")
    spmm(graph, x, w, "both")
    spmm(graph, x, None, "right")
    builds, searches = dict(spmm_kernels.build_counts), cusparse.search_count
    cache = graph._memo[spmm_kernels.MEMO_KEY]
    for _ in range(3):
        a = spmm(graph, x, w, "both")
        b = spmm(graph, x, None, "right")
    assert dict(spmm_kernels.build_counts) == builds
    assert cusparse.search_count == searches
    assert graph._memo[spmm_kernels.MEMO_KEY] is cache
    assert_close("weighted", a, reference.spmm(graph, x.double(), w.double(), "both"))
    assert_close("unweighted", b, reference.spmm(graph, x.double(), None, "right"))
    # a new width chooses its algorithm once
    cusparse.clear_shared_choices()
    spmm(graph, torch.randn(n, 48, device="cuda"), None, "right")
    assert cusparse.search_count == searches + 1


def test_similar_graph_reuses_the_timed_choice():
    """A new graph of the same size bucket (a mini-batch step) runs without timing again."""
    cusparse.clear_shared_choices()
    first, (n, _) = random_edges(500, 500, 6000, seed=13)
    x = torch.randn(n, 40, device="cuda")
    spmm(Graph.from_edge_index(first.cuda(), n), x, None, "both")
    searches = cusparse.search_count
    second, _ = random_edges(500, 500, 6000, seed=14)
    g2 = Graph.from_edge_index(second.cuda(), n)
    got = spmm(g2, x, None, "both")
    assert cusparse.search_count == searches
    assert_close("reused choice", got, reference.spmm(g2, x.double(), None, "both"))


def test_new_graph_rebuilds():
    edge_index, (n, _) = random_edges(300, 300, 4000, seed=12)
    x = torch.randn(n, 16, device="cuda")
    g1 = Graph.from_edge_index(edge_index.cuda(), n)
    spmm(g1, x, None, "both")
    before = spmm_kernels.build_counts["csr"]
    edge_index2 = edge_index[:, : edge_index.size(1) // 2]
    g2 = Graph.from_edge_index(edge_index2.cuda(), n)
    got = spmm(g2, x, None, "both")
    assert spmm_kernels.build_counts["csr"] == before + 1
    assert_close("new graph", got, reference.spmm(g2, x.double(), None, "both"))


def test_in_place_edge_weight_change_is_noticed():
    graph = _graph("random")
    x = torch.randn(graph.n_src, 8, device="cuda")
    w = torch.rand(graph.num_edges, device="cuda")
    spmm(graph, x, w, "both")
    with torch.no_grad():
        w.mul_(3.0).add_(0.5)
    got = spmm(graph, x, w, "both")
    assert_close("after in-place change", got, reference.spmm(graph, x.double(), w.double(), "both"))
    w[::7] = -1.0
    got = spmm(graph, x, w, "none")
    assert_close("after item assignment", got, reference.spmm(graph, x.double(), w.double(), "none"))


def test_new_weight_tensor_at_same_address_is_noticed():
    """A fresh tensor that reuses a freed tensor's memory (version 0 again) is a new key."""
    graph = _graph("random")
    x = torch.randn(graph.n_src, 8, device="cuda")
    for step in range(5):
        w = torch.full((graph.num_edges,), float(step + 1), device="cuda")
        got = spmm(graph, x, w, "left")
        assert_close(f"step {step}", got, reference.spmm(graph, x.double(), w.double(), "left"))
        del w


def test_weighted_cache_is_bounded():
    graph = _graph("random")
    x = torch.randn(graph.n_src, 8, device="cuda")
    keep = [torch.rand(graph.num_edges, device="cuda") for _ in range(6)]
    for w in keep:
        spmm(graph, x, w, "both")
    cache = spmm_kernels.cache_of(graph)
    assert len(cache._weighted["both"]) <= spmm_kernels.WEIGHTED_ENTRIES


def test_two_calls_then_one_backward():
    """Backward of the first call uses its own values even after a second call with other weights."""
    graph = _graph("super")
    x = torch.randn(graph.n_src, 16, device="cuda", requires_grad=True)
    w1 = torch.rand(graph.num_edges, device="cuda", requires_grad=True)
    w2 = torch.rand(graph.num_edges, device="cuda", requires_grad=True)
    (spmm(graph, x, w1, "both").sum() + 2 * spmm(graph, x, w2, "both").sum()).backward()
    xr = x.detach().double().requires_grad_(True)
    r1, r2 = w1.detach().double().requires_grad_(True), w2.detach().double().requires_grad_(True)
    (reference.spmm(graph, xr, r1, "both").sum() + 2 * reference.spmm(graph, xr, r2, "both").sum()).backward()
    assert_close("dx", x.grad, xr.grad)
    assert_close("dw1", w1.grad, r1.grad)
    assert_close("dw2", w2.grad, r2.grad)


# ------------------------------------------------------------------------------- streams
def test_non_default_stream():
    graph = _graph("super")
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        x = torch.randn(graph.n_src, 64, device="cuda", requires_grad=True)
        w = torch.rand(graph.num_edges, device="cuda", requires_grad=True)
        out = spmm(graph, x, w, "both")
        g = torch.randn_like(out)
        out.backward(g)
        out2 = out * 1.0  # more work queued on the same stream after the op
    stream.synchronize()
    xr = x.detach().double().requires_grad_(True)
    wr = w.detach().double().requires_grad_(True)
    want = reference.spmm(graph, xr, wr, "both")
    want.backward(g.double())
    assert_close("out", out2, want)
    assert_close("dx", x.grad, xr.grad)
    assert_close("dw", w.grad, wr.grad)


# ------------------------------------------------------------------------------- gcn_norm
@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_norm_kernel_matches_torch(improved, weighted):
    edge_index, (n, _) = random_edges(3000, 3000, 30000, seed=7, super_node_degree=5000)
    loops = torch.arange(n).repeat(2, 1)
    looped = torch.cat([edge_index[:, edge_index[0] != edge_index[1]], loops], 1).cuda()
    graph = Graph.from_edge_index(looped, n)
    w = torch.rand(looped.size(1), device="cuda") + 0.1 if weighted else None
    got = gcn_norm_values(graph, w, improved)
    with force_reference():
        want = gcn_norm_values(graph, None if w is None else w.double(), improved, dtype=torch.float64)
    assert_close("gcn_norm", got, want, tol=1e-6)


def test_timing_leaves_out_the_algorithms_that_spread_nan():
    """CSR_ALG1 and CSR_ALG3 wrote NaN into rows that never read the NaN input row: the
    timed choice (what users get) never picks them (tests/integrations/test_non_finite.py)."""
    names = set(cusparse.algorithms())
    assert names >= {"default", "alg2"} and not names & {"alg1", "alg3"}
