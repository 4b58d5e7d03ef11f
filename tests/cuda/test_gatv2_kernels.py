"""Fused GATv2 attention kernels against the float64 reference.

Every numeric check is a relative error ||got - want|| / ||want|| < 1e-4 of the fp32 kernel
results against ``gnn_fastpath.reference.gatv2_attention`` run on float64 copies: the
output, the attention weights and the gradients of x_src, x_dst, att and edge_term, for both
source-gradient variants of the backward (atomic, transposed), and on undirected graphs for
the one-pass variant too (fused).
"""
from __future__ import annotations

import math

import pytest
import torch
from kernel_checks import assert_close

from gnn_fastpath import Graph, reference
from gnn_fastpath.cuda import gatv2_attention as kernels
from gnn_fastpath.cuda import launch
from gnn_fastpath.ops import backend_for, gatv2_attention
from zoo import random_edges, undirected

pytestmark = pytest.mark.cuda

VARIANTS = ("atomic", "transposed")
#: On an undirected graph: the one-pass backward as well.
UNDIRECTED_VARIANTS = VARIANTS + ("fused",)
#: The backward variant is a setting read at every backward (gnn_fastpath.config).
BWD_ENV = "GNN_FASTPATH_GATV2_BWD"
SLOPE = 0.2


# ------------------------------------------------------------------------------- helpers


def _with_hub_source(edge_index, n_dst, hub=1, degree=700, seed=1):
    """Add ``degree`` out-edges of source ``hub``: a split row of the source-major CSR."""
    gen = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, n_dst, (degree,), generator=gen)
    return torch.cat([edge_index, torch.stack([torch.full_like(dst, hub), dst])], 1)


def _inputs(graph: Graph, H, D, edge_term, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).requires_grad_()

    xs, xd = randn(graph.n_src, H, D), randn(graph.n_dst, H, D)
    att = randn(H, D, scale=1.0 / math.sqrt(D))
    et = randn(graph.num_edges, H, D, scale=0.5) if edge_term else None
    g_out = torch.randn(graph.n_dst, H, D, device="cuda", generator=gen)
    g_alpha = torch.randn(graph.num_edges, H, device="cuda", generator=gen)
    return xs, xd, att, et, g_out, g_alpha


def _leaves(xs, xd, att, et):
    return [t for t in (xs, xd, att, et) if t is not None]


def _grads(loss, leaves):
    return torch.autograd.grad(loss, leaves)


def _f64(ts):
    return [None if t is None else t.detach().double().requires_grad_() for t in ts]


def _run(graph, xs, xd, att, et, g_out, g_alpha=None, return_attention=False, dropout=0.0):
    """(out, alpha, grads) of the op; loss = <out, g_out> (+ <alpha, g_alpha>)."""
    res = gatv2_attention(graph, xs, xd, att, SLOPE, et, return_attention, dropout)
    out, alpha = res if return_attention else (res, None)
    loss = (out * g_out).sum()
    if g_alpha is not None:
        loss = loss + (alpha * g_alpha).sum()
    return out, alpha, _grads(loss, _leaves(xs, xd, att, et))


def _reference(graph, xs, xd, att, et, g_out, g_alpha=None, return_attention=False):
    xs, xd, att, et = _f64((xs, xd, att, et))
    res = reference.gatv2_attention(graph, xs, xd, att, SLOPE, et, return_attention, 0.0)
    out, alpha = res if return_attention else (res, None)
    loss = (out * g_out.double()).sum()
    if g_alpha is not None:
        loss = loss + (alpha * g_alpha.double()).sum()
    return out, alpha, _grads(loss, _leaves(xs, xd, att, et))


def _compare(tag, got, want, et):
    out, alpha, grads = got
    rout, ralpha, rgrads = want
    assert_close(f"{tag} out", out, rout)
    if ralpha is not None:
        assert_close(f"{tag} alpha", alpha, ralpha)
    names = ["dx_src", "dx_dst", "datt"] + (["dedge_term"] if et is not None else [])
    for name, g, r in zip(names, grads, rgrads):
        assert_close(f"{tag} {name}", g, r)


def spy_fused(monkeypatch):
    """A list that gets one entry per run of the one-pass undirected backward."""
    calls, real = [], kernels._backward_fused
    monkeypatch.setattr(kernels, "_backward_fused", lambda *a: calls.append(1) or real(*a))
    return calls


def _check_all_variants(monkeypatch, graph, H, D, edge_term, seed=0, return_attention=False, alpha_grad=False,
                        variants=VARIANTS):
    xs, xd, att, et, g_out, g_alpha = _inputs(graph, H, D, edge_term, seed)
    g_alpha = g_alpha if alpha_grad else None
    want = _reference(graph, xs, xd, att, et, g_out, g_alpha, return_attention)
    fused = spy_fused(monkeypatch)
    for variant in variants:
        monkeypatch.setenv(BWD_ENV, variant)
        got = _run(graph, xs, xd, att, et, g_out, g_alpha, return_attention)
        _compare(f"H={H} D={D} et={edge_term} {variant}", got, want, et)
        assert len(fused) == (variant == "fused"), "the fused variant did not run its kernel"
        fused.clear()


# ------------------------------------------------------------------------------- graphs
@pytest.fixture(scope="module")
def small_graph():
    """Bipartite, empty rows, self loops, duplicates, a destination row split into chunks
    (600 extra in-edges) and a split source row (700 out-edges of source 1)."""
    n_src, n_dst = 120, 90
    ei, _ = random_edges(n_src, n_dst, 900, seed=3, empty_rows=5, super_node_degree=600)
    ei = _with_hub_source(ei, n_dst - 5)
    return Graph.from_edge_index(ei.cuda(), num_nodes=(n_src, n_dst))


@pytest.fixture(scope="module")
def super_graph():
    """Homogeneous, 3000 nodes, destination 0 with 100k extra in-edges, a 5000-edge hub source."""
    n = 3000
    ei, _ = random_edges(n, n, 30_000, seed=5, empty_rows=40, super_node_degree=100_000)
    ei = _with_hub_source(ei, n - 40, hub=7, degree=5000, seed=2)
    return Graph.from_edge_index(ei.cuda(), num_nodes=n)


@pytest.fixture(scope="module")
def undirected_graph():
    """super_graph's kind both ways: 3000 nodes, a 40000-edge node (a split row both as
    destination and as source), empty rows, self loops and duplicates."""
    n = 3000
    ei, _ = random_edges(n, n, 20_000, seed=6, empty_rows=40, super_node_degree=20_000)
    graph = Graph.from_edge_index(undirected(ei).cuda(), num_nodes=n)
    assert graph.is_symmetric()
    return graph


# ------------------------------------------------------------------------------- tests
def test_dispatch_uses_kernels(small_graph):
    x = torch.zeros(small_graph.n_src, 2, 64, device="cuda")
    assert backend_for("gatv2_attention", x) == "cuda"


@pytest.mark.parametrize("edge_term", [False, True])
@pytest.mark.parametrize("D", [8, 32, 64, 100, 128, 256])
@pytest.mark.parametrize("H", [1, 2, 3, 4, 8])
def test_small_graph_grid(monkeypatch, small_graph, H, D, edge_term):
    _check_all_variants(monkeypatch, small_graph, H, D, edge_term, seed=H * 1000 + D)


@pytest.mark.parametrize("H,D,edge_term", [(2, 64, False), (1, 32, True), (4, 100, True), (8, 256, False)])
def test_super_node(monkeypatch, super_graph, H, D, edge_term):
    assert int(super_graph.in_degree().max()) >= 100_000
    _check_all_variants(monkeypatch, super_graph, H, D, edge_term, seed=D)


@pytest.mark.parametrize("edge_term", [False, True])
@pytest.mark.parametrize("D", [8, 32, 64, 100, 128, 256])
@pytest.mark.parametrize("H", [1, 3, 8])
def test_undirected_graph(monkeypatch, undirected_graph, H, D, edge_term):
    """Every variant, the one-pass backward included, on a symmetric multigraph."""
    _check_all_variants(monkeypatch, undirected_graph, H, D, edge_term, seed=H * 100 + D,
                        variants=UNDIRECTED_VARIANTS)


@pytest.mark.parametrize("H,D,edge_term", [(2, 64, True), (3, 16, False)])
def test_undirected_return_attention_and_its_gradient(monkeypatch, undirected_graph, H, D, edge_term):
    _check_all_variants(monkeypatch, undirected_graph, H, D, edge_term, seed=9, return_attention=True,
                        alpha_grad=True, variants=UNDIRECTED_VARIANTS)


def test_fused_needs_only_some_gradients(monkeypatch, undirected_graph):
    """x_dst or att frozen: the one-pass backward leaves their gradients out, the rest equal."""
    monkeypatch.setenv(BWD_ENV, "fused")
    fused = spy_fused(monkeypatch)
    H, D = 2, 64
    xs, xd, att, et, g_out, _ = _inputs(undirected_graph, H, D, True, seed=41)
    want = _reference(undirected_graph, xs, xd, att, et, g_out)[2]
    for frozen in (1, 2):
        leaves = [xs, xd, att, et]
        leaves[frozen] = leaves[frozen].detach()
        out = gatv2_attention(undirected_graph, leaves[0], leaves[1], leaves[2], SLOPE, leaves[3])
        live = [t for i, t in enumerate(leaves) if i != frozen]
        grads = torch.autograd.grad((out * g_out).sum(), live)
        for g, r in zip(grads, [r for i, r in enumerate(want) if i != frozen]):
            assert_close(f"frozen {frozen}", g, r)
    assert len(fused) == 2


@pytest.mark.parametrize("H,D,edge_term", [(2, 64, True), (3, 16, False), (1, 128, True), (3, 4, True)])
def test_return_attention_and_its_gradient(monkeypatch, small_graph, H, D, edge_term):
    _check_all_variants(monkeypatch, small_graph, H, D, edge_term, seed=7, return_attention=True,
                        alpha_grad=True)


def test_return_attention_without_its_gradient(monkeypatch, super_graph):
    _check_all_variants(monkeypatch, super_graph, 2, 64, False, seed=11, return_attention=True)


@pytest.mark.parametrize("H,D,edge_term", [(2, 64, True), (3, 100, False)])
def test_dropout(monkeypatch, super_graph, H, D, edge_term):
    _check_dropout(monkeypatch, super_graph, H, D, edge_term, VARIANTS)


def test_dropout_undirected(monkeypatch, undirected_graph):
    """The one-pass backward draws each reverse edge's mask from its own caller id."""
    _check_dropout(monkeypatch, undirected_graph, 2, 64, True, UNDIRECTED_VARIANTS)


def _check_dropout(monkeypatch, graph, H, D, edge_term, variants):
    p = 0.3
    xs, xd, att, et, g_out, g_alpha = _inputs(graph, H, D, edge_term, seed=13)

    torch.manual_seed(1234)
    out, dropped, _ = _run(graph, xs, xd, att, et, g_out, None, "dropped", p)
    keep = dropped != 0
    rate = keep.double().mean().item()
    assert abs(rate - (1 - p)) < 0.01, f"keep rate {rate:.4f}, expected {1 - p}"

    # float64 oracle with the mask implied by the returned weights
    xs64, xd64, att64, et64 = _f64((xs, xd, att, et))
    _, alpha64 = reference.gatv2_attention(graph, xs64, xd64, att64, SLOPE, et64, True, 0.0)
    dropped64 = alpha64 * keep.double() / (1 - p)
    src, dst = graph.indices, graph.dst_index()  # CSR order; alpha is in caller order
    msg = dropped64[graph.perm].unsqueeze(-1) * xs64[src]
    out64 = torch.zeros(graph.n_dst, H, D, dtype=torch.float64, device="cuda").index_add(0, dst, msg)
    assert_close("dropped alpha", dropped, dropped64)
    assert_close("dropout out", out, out64)
    leaves64 = _leaves(xs64, xd64, att64, et64)
    for with_alpha_grad in (False, True):
        loss64 = (out64 * g_out.double()).sum()
        if with_alpha_grad:
            loss64 = loss64 + (dropped64 * g_alpha.double()).sum()
        want = torch.autograd.grad(loss64, leaves64, retain_graph=True)
        fused = spy_fused(monkeypatch)
        for variant in variants:
            monkeypatch.setenv(BWD_ENV, variant)
            torch.manual_seed(1234)  # same seed -> same mask
            got_out, got_dropped, grads = _run(graph, xs, xd, att, et, g_out,
                                               g_alpha if with_alpha_grad else None, "dropped", p)
            assert torch.equal(got_dropped, dropped), "the dropout mask is not reproducible"
            names = ["dx_src", "dx_dst", "datt", "dedge_term"]
            for name, g, r in zip(names, grads, want):
                assert_close(f"dropout {variant} alpha_grad={with_alpha_grad} {name}", g, r)
            assert len(fused) == (variant == "fused")
            fused.clear()

    # return_attention=True with dropout returns the weights before dropout
    torch.manual_seed(1234)
    out_t, alpha_t = gatv2_attention(graph, xs, xd, att, SLOPE, et, True, p)
    assert_close("dropout out (return True)", out_t, out64)
    assert_close("alpha before dropout", alpha_t, alpha64)


def test_zero_edge_graph():
    graph = Graph.from_edge_index(torch.empty(2, 0, dtype=torch.int64, device="cuda"), num_nodes=(6, 4))
    H, D = 2, 64
    xs, xd, att, et, g_out, _ = _inputs(graph, H, D, True)
    out, alpha = gatv2_attention(graph, xs, xd, att, SLOPE, et, True, 0.1)
    assert out.shape == (4, H, D) and alpha.shape == (0, H)
    assert torch.equal(out, torch.zeros_like(out))
    grads = torch.autograd.grad((out * g_out).sum(), [xs, xd, att, et])
    for g, t in zip(grads, (xs, xd, att, et)):
        assert g.shape == t.shape and torch.equal(g, torch.zeros_like(g))


def test_empty_destination_set():
    graph = Graph.from_edge_index(torch.empty(2, 0, dtype=torch.int64, device="cuda"), num_nodes=(3, 0))
    xs = torch.randn(3, 1, 32, device="cuda", requires_grad=True)
    xd = torch.randn(0, 1, 32, device="cuda", requires_grad=True)
    att = torch.randn(1, 32, device="cuda", requires_grad=True)
    out = gatv2_attention(graph, xs, xd, att)
    assert out.shape == (0, 1, 32)
    out.sum().backward()
    assert torch.equal(xs.grad, torch.zeros_like(xs))


def test_cpu_graph_with_cuda_features(monkeypatch):
    ei, (n_src, n_dst) = random_edges(50, 40, 400, seed=9, empty_rows=3)
    cpu_graph = Graph.from_edge_index(ei, num_nodes=(n_src, n_dst))
    assert cpu_graph.device.type == "cpu"
    H, D = 2, 32
    xs, xd, att, et, g_out, _ = _inputs(cpu_graph.to("cuda"), H, D, True, seed=4)
    got = _run(cpu_graph, xs, xd, att, et, g_out)
    want = _reference(cpu_graph.to("cuda"), xs, xd, att, et, g_out)
    _compare("cpu graph", got, want, et)


def test_misaligned_rows_take_the_generic_path(monkeypatch, small_graph):
    H, D = 2, 64
    xs, xd, att, et, g_out, _ = _inputs(small_graph, H, D, True, seed=21)
    buf = torch.zeros(xs.numel() + 1, device="cuda")
    buf[1:] = xs.detach().flatten()
    xs_off = buf[1:].view_as(xs).requires_grad_()  # storage offset of 4 bytes
    assert xs_off.data_ptr() % 16 != 0
    got = _run(small_graph, xs_off, xd, att, et, g_out)
    want = _reference(small_graph, xs, xd, att, et, g_out)
    _compare("misaligned", got, want, et)


def test_runs_on_current_stream(small_graph):
    H, D = 2, 64
    xs, xd, att, et, g_out, _ = _inputs(small_graph, H, D, True, seed=5)
    base_out, _, base_grads = _run(small_graph, xs, xd, att, et, g_out)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(50_000_000)  # keeps `stream` busy: a kernel on another stream would run first
        xs2 = (xs.detach() * 1.0).requires_grad_()  # written on `stream` after the sleep
        out, _, grads = _run(small_graph, xs2, xd, att, et, g_out)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    assert torch.allclose(out, base_out, rtol=1e-5, atol=1e-6)
    for g, b in zip(grads, base_grads):
        assert torch.allclose(g, b, rtol=1e-4, atol=1e-5)


def test_no_edge_sized_tensor_in_forward_or_backward(monkeypatch):
    n, m, H, D = 4000, 1_500_000, 2, 64
    ei, _ = random_edges(n, n, m, seed=17)
    graph = Graph.from_edge_index(ei.cuda(), num_nodes=n)
    edge_bytes = graph.num_edges * H * D * 4  # ~1.3 GB
    xs, xd, att, _, g_out, _ = _inputs(graph, H, D, False)
    for variant in VARIANTS:  # warm-up: compile, per-graph work lists, source CSR
        monkeypatch.setenv(BWD_ENV, variant)
        _run(graph, xs, xd, att, None, g_out)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = gatv2_attention(graph, xs, xd, att, SLOPE)
    torch.cuda.synchronize()
    fwd_peak = torch.cuda.max_memory_allocated() - base
    assert fwd_peak < 0.02 * edge_bytes, f"forward allocated {fwd_peak / 2**20:.1f} MiB"
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.autograd.grad((out * g_out).sum(), [xs, xd, att])
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated() - base
    assert bwd_peak < 0.05 * edge_bytes, f"backward allocated {bwd_peak / 2**20:.1f} MiB"


def test_bad_backward_variant_is_reported(small_graph, monkeypatch):
    monkeypatch.setenv(BWD_ENV, "sideways")  # read (and rejected) at the backward
    xs, xd, att, _, g_out, _ = _inputs(small_graph, 1, 32, False)
    out = gatv2_attention(small_graph, xs, xd, att)
    with pytest.raises(ValueError, match="GNN_FASTPATH_GATV2_BWD"):
        (out * g_out).sum().backward()


# Grid shapes of the main kernels (gnn_fastpath.cuda.gatv2_attention._grid). Faking a GPU
# with room for two resident blocks (less than one multiprocessor holds) makes the
# persistent grids small, so each warp strides over many items.
GRIDS = {
    "one-warp-per-item": [(kernels, "PERSISTENT_MIN_ITEMS_PER_WARP", 2**40)],
    "persistent-striding": [(kernels, "PERSISTENT_MIN_ITEMS_PER_WARP", 0),
                            (launch, "resident_blocks", lambda k, threads, shared_mem=0: 2)],
}


@pytest.mark.parametrize("grid", list(GRIDS))
def test_grid_shapes(monkeypatch, small_graph, super_graph, undirected_graph, grid):
    for module, attr, value in GRIDS[grid]:
        monkeypatch.setattr(module, attr, value)
    _check_all_variants(monkeypatch, undirected_graph, 2, 64, True, seed=34, return_attention=True, alpha_grad=True,
                        variants=UNDIRECTED_VARIANTS)
    _check_all_variants(monkeypatch, super_graph, 2, 64, True, seed=31, return_attention=True, alpha_grad=True)
    _check_all_variants(monkeypatch, super_graph, 8, 256, False, seed=32)
    _check_all_variants(monkeypatch, small_graph, 3, 32, False, seed=33)
