"""Fused GAT (additive) attention kernels against the float64 reference.

Every numeric check is a relative error ||got - want|| / ||want|| < 1e-4 of the fp32 kernel
results against ``gnn_fastpath.reference.gat_attention`` run on float64 copies: the output,
the attention weights and the gradients of x_src, score_src, score_dst, edge_score and
edge_weight, for both backward variants (destination-major with atomics, source-major), on
graphs with super nodes (split rows both ways), empty rows, duplicates, self loops and
bipartite shapes, several H and D (specialised and generic widths).
"""
from __future__ import annotations

import pytest
import torch
from kernel_checks import assert_close

from gnn_fastpath import Graph, reference
from gnn_fastpath.cuda import gat_attention as kernels
from gnn_fastpath.cuda import launch
from gnn_fastpath.ops import backend_for, gat_attention
from test_gatv2_kernels import _with_hub_source
from zoo import random_edges

pytestmark = pytest.mark.cuda

DEVICE = torch.device("cuda")
VARIANTS = kernels.BACKWARDS
SLOPE = 0.2
#: Extra in-edges of the super node of ``super_graph``.
SUPER_DEGREE = 100_000
NAMES = ("x_src", "score_src", "score_dst", "edge_score", "edge_weight")


# ------------------------------------------------------------------------------- helpers
def _inputs(graph: Graph, H, D, edge_score=True, edge_weight=True, seed=0):
    """Leaves (x_src, score_src, score_dst, edge_score, edge_weight; None where absent),
    grad_out and grad_alpha."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device=DEVICE, generator=gen) * scale).requires_grad_()

    xs = randn(graph.n_src, H, D)
    s, t = randn(graph.n_src, H), randn(graph.n_dst, H)
    u = randn(graph.num_edges, H, scale=0.5) if edge_score else None
    w = (torch.rand(graph.num_edges, device=DEVICE, generator=gen) + 0.5).requires_grad_() if edge_weight else None
    g_out = torch.randn(graph.n_dst, H, D, device=DEVICE, generator=gen)
    g_alpha = torch.randn(graph.num_edges, H, device=DEVICE, generator=gen)
    return (xs, s, t, u, w), g_out, g_alpha


def _leaves(ins):
    return [t for t in ins if t is not None]


def _names(ins):
    return [n for n, t in zip(NAMES, ins) if t is not None]


def _run(graph, ins, g_out, g_alpha=None, return_attention=False, dropout=0.0):
    """(out, alpha, grads) of the op; loss = <out, g_out> (+ <alpha, g_alpha>)."""
    xs, s, t, u, w = ins
    res = gat_attention(graph, xs, s, t, u, SLOPE, return_attention, dropout, w)
    out, alpha = res if return_attention else (res, None)
    loss = (out * g_out).sum()
    if g_alpha is not None:
        loss = loss + (alpha * g_alpha).sum()
    return out, alpha, torch.autograd.grad(loss, _leaves(ins))


def _f64(ins):
    return [None if t is None else t.detach().double().requires_grad_() for t in ins]


def _reference(graph, ins, g_out, g_alpha=None, return_attention=False):
    ins = _f64(ins)
    xs, s, t, u, w = ins
    res = reference.gat_attention(graph, xs, s, t, u, SLOPE, return_attention, 0.0, w)
    out, alpha = res if return_attention else (res, None)
    loss = (out * g_out.double()).sum()
    if g_alpha is not None:
        loss = loss + (alpha * g_alpha.double()).sum()
    return out, alpha, torch.autograd.grad(loss, _leaves(ins))


def _compare(tag, got, want, ins):
    out, alpha, grads = got
    rout, ralpha, rgrads = want
    assert_close(f"{tag} out", out, rout)
    if ralpha is not None:
        assert_close(f"{tag} alpha", alpha, ralpha)
    for name, g, r in zip(_names(ins), grads, rgrads):
        assert g.dtype == dict(zip(_names(ins), _leaves(ins)))[name].dtype
        assert_close(f"{tag} d{name}", g, r)


def _check_all_variants(monkeypatch, graph, H, D, edge_score=True, edge_weight=True, seed=0,
                        return_attention=False, alpha_grad=False):
    ins, g_out, g_alpha = _inputs(graph, H, D, edge_score, edge_weight, seed)
    g_alpha = g_alpha if alpha_grad else None
    want = _reference(graph, ins, g_out, g_alpha, return_attention)
    for variant in VARIANTS:
        monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", variant)
        got = _run(graph, ins, g_out, g_alpha, return_attention)
        _compare(f"H={H} D={D} es={edge_score} ew={edge_weight} ra={return_attention} {variant}", got, want, ins)


# ------------------------------------------------------------------------------- graphs
@pytest.fixture(scope="module")
def small_graph():
    """Bipartite, empty rows, self loops, duplicates, a destination row split into chunks
    (600 extra in-edges) and a split source row (700 out-edges of source 1)."""
    n_src, n_dst = 120, 90
    ei, _ = random_edges(n_src, n_dst, 900, seed=3, empty_rows=5, super_node_degree=600)
    ei = _with_hub_source(ei, n_dst - 5)
    return Graph.from_edge_index(ei.to(DEVICE), num_nodes=(n_src, n_dst))


@pytest.fixture(scope="module")
def super_graph():
    """Homogeneous, 3000 nodes, destination 0 with SUPER_DEGREE extra in-edges, a 5000-edge
    hub source."""
    n = 3000
    ei, _ = random_edges(n, n, 30_000, seed=5, empty_rows=40, super_node_degree=SUPER_DEGREE)
    ei = _with_hub_source(ei, n - 40, hub=7, degree=5000, seed=2)
    return Graph.from_edge_index(ei.to(DEVICE), num_nodes=n)


# ------------------------------------------------------------------------------- tests
def test_dispatch_uses_kernels(small_graph):
    x = torch.zeros(small_graph.n_src, 2, 64, device=DEVICE)
    assert backend_for("gat_attention", x) == "cuda"


@pytest.mark.parametrize("extras", ["none", "both"])
@pytest.mark.parametrize("D", [8, 32, 64, 100, 128, 256, 7])
@pytest.mark.parametrize("H", [1, 2, 3, 4, 8])
def test_small_graph_grid(monkeypatch, small_graph, H, D, extras):
    _check_all_variants(monkeypatch, small_graph, H, D, extras == "both", extras == "both", seed=H * 1000 + D)


@pytest.mark.parametrize("edge_score,edge_weight", [(True, False), (False, True)])
def test_each_optional_input(monkeypatch, small_graph, edge_score, edge_weight):
    _check_all_variants(monkeypatch, small_graph, 3, 64, edge_score, edge_weight, seed=5, return_attention=True,
                        alpha_grad=True)


@pytest.mark.parametrize("H,D,extras", [(2, 64, False), (1, 32, True), (4, 100, True), (8, 256, False)])
def test_super_node(monkeypatch, super_graph, H, D, extras):
    assert int(super_graph.in_degree().max()) >= SUPER_DEGREE
    _check_all_variants(monkeypatch, super_graph, H, D, extras, extras, seed=D)


@pytest.mark.parametrize("return_attention", [True, "dropped"])
@pytest.mark.parametrize("H,D", [(2, 64), (3, 16), (1, 128), (3, 4)])
def test_return_attention_and_its_gradient(monkeypatch, small_graph, H, D, return_attention):
    _check_all_variants(monkeypatch, small_graph, H, D, seed=7, return_attention=return_attention, alpha_grad=True)


def test_return_attention_without_its_gradient(monkeypatch, super_graph):
    _check_all_variants(monkeypatch, super_graph, 2, 64, seed=11, return_attention=True)


def test_gradient_through_attention_only(monkeypatch, small_graph):
    """Only the returned attention carries a gradient (grad_out is None in the backward)."""
    ins, g_out, g_alpha = _inputs(small_graph, 2, 32, seed=12)
    xs, s, t, u, w = ins
    ins64 = _f64(ins)
    _, alpha64 = reference.gat_attention(small_graph, *ins64[:4], SLOPE, "dropped", 0.0, ins64[4])
    want = torch.autograd.grad((alpha64 * g_alpha.double()).sum(), _leaves(ins64), allow_unused=True)
    for variant in VARIANTS:
        monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", variant)
        _, alpha = gat_attention(small_graph, xs, s, t, u, SLOPE, "dropped", 0.0, w)
        got = torch.autograd.grad((alpha * g_alpha).sum(), _leaves(ins), allow_unused=True)
        for name, a, b in zip(NAMES, got, want):
            if b is None:  # x_src does not reach alpha
                assert a is None or not a.any(), name
            else:
                assert_close(f"{variant} d{name}", a, b)


@pytest.mark.parametrize("needs", ["x_src", "score_src", "score_dst", "edge_score", "edge_weight"])
def test_one_input_needs_a_gradient(monkeypatch, small_graph, needs):
    ins, g_out, _ = _inputs(small_graph, 2, 64, seed=13)
    ins = [t.detach().requires_grad_(n == needs) for n, t in zip(NAMES, ins)]
    ins64 = _f64(ins)
    out64 = reference.gat_attention(small_graph, *ins64[:4], SLOPE, False, 0.0, ins64[4])
    want = torch.autograd.grad((out64 * g_out.double()).sum(), ins64[NAMES.index(needs)])[0]
    for variant in VARIANTS:
        monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", variant)
        out = gat_attention(small_graph, *ins[:4], SLOPE, False, 0.0, ins[4])
        got = torch.autograd.grad((out * g_out).sum(), ins[NAMES.index(needs)])[0]
        assert_close(f"{variant} d{needs}", got, want)


@pytest.mark.parametrize("return_attention", ["dropped", True])
@pytest.mark.parametrize("H,D,extras", [(2, 64, True), (3, 100, False), (1, 8, True)])
def test_dropout(monkeypatch, super_graph, H, D, extras, return_attention):
    p = 0.3
    graph = super_graph
    ins, g_out, g_alpha = _inputs(graph, H, D, extras, extras, seed=13)
    xs, s, t, u, w = ins

    torch.manual_seed(1234)
    out, dropped = gat_attention(graph, xs, s, t, u, SLOPE, "dropped", p, w)
    keep = dropped != 0
    rate = keep.double().mean().item()
    assert abs(rate - (1 - p)) < 0.01, f"keep rate {rate:.4f}, expected {1 - p}"

    # float64 oracle with the mask implied by the returned weights (alpha * keep / (1 - p) * w)
    ins64 = _f64(ins)
    xs64, s64, t64, u64, w64 = ins64
    _, alpha64 = reference.gat_attention(graph, xs64, s64, t64, u64, SLOPE, True, 0.0)
    dropped64 = alpha64 * keep.double() / (1 - p)
    if w64 is not None:
        dropped64 = dropped64 * w64.unsqueeze(-1)
    src, dst = graph.indices, graph.dst_index()  # CSR order; alpha is in caller order
    msg = dropped64[graph.perm].unsqueeze(-1) * xs64[src]
    out64 = torch.zeros(graph.n_dst, H, D, dtype=torch.float64, device=DEVICE).index_add(0, dst, msg)
    assert_close("dropped alpha", dropped, dropped64)
    assert_close("dropout out", out, out64)
    returned64 = dropped64 if return_attention == "dropped" else alpha64
    for with_alpha_grad in (False, True):
        loss64 = (out64 * g_out.double()).sum()
        if with_alpha_grad:
            loss64 = loss64 + (returned64 * g_alpha.double()).sum()
        want = torch.autograd.grad(loss64, _leaves(ins64), retain_graph=True)
        for variant in VARIANTS:
            monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", variant)
            torch.manual_seed(1234)  # same seed -> same mask
            got_out, got_alpha, grads = _run(graph, ins, g_out, g_alpha if with_alpha_grad else None,
                                             return_attention, p)
            assert torch.equal(got_out, out), "the dropout mask is not reproducible"
            if return_attention == "dropped":
                assert torch.equal(got_alpha, dropped)
            else:
                assert_close("alpha before dropout", got_alpha, alpha64)
            for name, g, r in zip(_names(ins), grads, want):
                assert_close(f"dropout {variant} alpha_grad={with_alpha_grad} d{name}", g, r)


def test_dropout_mask_is_gatv2s(small_graph):
    """Same (seed, offset) machinery and counter (caller edge, head) as GATv2: with equal
    seeds the two ops drop the same (edge, head) weights."""
    H, D, p = 2, 32, 0.4
    ins, _, _ = _inputs(small_graph, H, D, seed=3)
    xs, s, t, _, _ = [None if x is None else x.detach() for x in ins]
    torch.manual_seed(77)
    _, dropped = gat_attention(small_graph, xs, s, t, None, SLOPE, "dropped", p)
    from gnn_fastpath.ops import gatv2_attention

    xd = torch.randn(small_graph.n_dst, H, D, device=DEVICE)
    att = torch.randn(H, D, device=DEVICE)
    torch.manual_seed(77)
    _, dropped_v2 = gatv2_attention(small_graph, xs, xd, att, SLOPE, None, "dropped", p)
    assert torch.equal(dropped != 0, dropped_v2 != 0)


def test_zero_edge_graph():
    graph = Graph.from_edge_index(torch.empty(2, 0, dtype=torch.int64, device=DEVICE), num_nodes=(6, 4))
    H, D = 2, 64
    ins, g_out, _ = _inputs(graph, H, D, seed=1)
    xs, s, t, u, w = ins
    out, alpha = gat_attention(graph, xs, s, t, u, SLOPE, True, 0.1, w)
    assert out.shape == (4, H, D) and alpha.shape == (0, H)
    assert torch.equal(out, torch.zeros_like(out))
    grads = torch.autograd.grad((out * g_out).sum(), _leaves(ins))
    for g, x in zip(grads, _leaves(ins)):
        assert g.shape == x.shape and torch.equal(g, torch.zeros_like(g))


def test_empty_destination_set():
    graph = Graph.from_edge_index(torch.empty(2, 0, dtype=torch.int64, device=DEVICE), num_nodes=(3, 0))
    xs = torch.randn(3, 1, 32, device=DEVICE, requires_grad=True)
    s = torch.randn(3, 1, device=DEVICE, requires_grad=True)
    t = torch.randn(0, 1, device=DEVICE, requires_grad=True)
    out = gat_attention(graph, xs, s, t)
    assert out.shape == (0, 1, 32)
    out.sum().backward()
    assert torch.equal(xs.grad, torch.zeros_like(xs)) and torch.equal(s.grad, torch.zeros_like(s))


def test_cpu_graph_with_cuda_features(monkeypatch):
    ei, (n_src, n_dst) = random_edges(50, 40, 400, seed=9, empty_rows=3)
    cpu_graph = Graph.from_edge_index(ei, num_nodes=(n_src, n_dst))
    assert cpu_graph.device.type == "cpu"
    ins, g_out, _ = _inputs(cpu_graph.to(DEVICE), 2, 32, seed=4)
    got = _run(cpu_graph, ins, g_out)
    want = _reference(cpu_graph.to(DEVICE), ins, g_out)
    _compare("cpu graph", got, want, ins)


def test_misaligned_rows_take_the_generic_path(monkeypatch, small_graph):
    H, D = 2, 64
    ins, g_out, _ = _inputs(small_graph, H, D, seed=21)
    xs = ins[0]
    buf = torch.zeros(xs.numel() + 1, device=DEVICE)
    buf[1:] = xs.detach().flatten()
    xs_off = buf[1:].view_as(xs).requires_grad_()  # storage offset of 4 bytes
    assert xs_off.data_ptr() % 16 != 0 and kernels._config(D, xs_off.detach()).dc == 0
    for variant in VARIANTS:
        monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", variant)
        got = _run(small_graph, [xs_off] + list(ins[1:]), g_out)
        want = _reference(small_graph, ins, g_out)
        _compare(f"misaligned {variant}", got, want, ins)


def test_float64_and_16bit_scores_with_float32_features(monkeypatch, small_graph):
    """Scores of another dtype are read as float32; their gradients come back in their dtype."""
    ins, g_out, _ = _inputs(small_graph, 2, 64, seed=22)
    for dt in (torch.float64, torch.bfloat16):
        mixed = [ins[0]] + [x.detach().to(dt).requires_grad_() for x in ins[1:]]
        for variant in VARIANTS:
            monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", variant)
            out, _, grads = _run(small_graph, mixed, g_out)
            assert out.dtype == torch.float32
            want = _reference(small_graph, mixed, g_out)
            assert_close(f"{dt} out", out, want[0])
            for name, g, r, x in zip(NAMES, grads, want[2], mixed):
                assert g.dtype == x.dtype
                assert_close(f"{dt} {variant} d{name}", g, r, tol=1e-4 if dt != torch.bfloat16 else 1e-2)


def test_runs_on_current_stream(small_graph):
    H, D = 2, 64
    ins, g_out, _ = _inputs(small_graph, H, D, seed=5)
    base_out, _, base_grads = _run(small_graph, ins, g_out)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(50_000_000)  # keeps `stream` busy: a kernel on another stream would run first
        xs2 = (ins[0].detach() * 1.0).requires_grad_()  # written on `stream` after the sleep
        out, _, grads = _run(small_graph, [xs2] + list(ins[1:]), g_out)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    assert torch.allclose(out, base_out, rtol=1e-5, atol=1e-6)
    for g, b in zip(grads, base_grads):
        assert torch.allclose(g, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_edge_sized_tensor_in_forward_or_backward(monkeypatch, variant):
    """Neither pass allocates anything of size [M, H] (let alone [M, H, D]) when no edge
    output is requested: beyond the node-sized tensors (out, lse, the chunk workspace of split
    rows, the gradients and their float32 scratch) peaks stay under a quarter of one [M, H]
    float32 tensor."""
    monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", variant)
    n, m, H, D = 4000, 1_500_000, 2, 64
    ei, _ = random_edges(n, n, m, seed=17)
    graph = Graph.from_edge_index(ei.to(DEVICE), num_nodes=n)
    slack = 0.25 * graph.num_edges * H * 4  # a quarter of one [M, H] float32 tensor, ~3 MB
    node = n * H * D * 4
    ins, g_out, _ = _inputs(graph, H, D, edge_score=False, edge_weight=False)
    xs, s, t, _, _ = ins
    _run(graph, ins, g_out)  # warm-up: compile, per-graph work lists, source CSR
    slots = kernels._work(graph).n_slots  # rows of ~400 in-edges: every row is split
    workspace = slots * (H * D + 2 * H) * 4
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = gat_attention(graph, xs, s, t, negative_slope=SLOPE)
    torch.cuda.synchronize()
    fwd_peak = torch.cuda.max_memory_allocated() - base
    assert fwd_peak < node + workspace + slack, f"forward allocated {fwd_peak / 2**20:.1f} MiB"
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    torch.autograd.grad((out * g_out).sum(), [xs, s, t])
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated() - base
    # grad_out (autograd's product), dx_src (and its float32 scratch for the atomics)
    assert bwd_peak < 3 * node + slack, f"backward allocated {bwd_peak / 2**20:.1f} MiB"


def test_bad_backward_variant_is_reported(small_graph, monkeypatch):
    monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", "sideways")  # read (and rejected) at the backward
    ins, g_out, _ = _inputs(small_graph, 1, 32, seed=0)
    out = gat_attention(small_graph, *ins[:3])
    with pytest.raises(ValueError, match="GNN_FASTPATH_GAT_BWD"):
        (out * g_out).sum().backward()


# Grid shapes of the main kernels (gnn_fastpath.cuda.row_attention.grid). Faking a GPU with
# room for two resident blocks (less than one multiprocessor holds) makes the persistent
# grids small, so each warp strides over many items.
GRIDS = {
    "one-warp-per-item": [(kernels, "PERSISTENT_MIN_ITEMS_PER_WARP", 2**40)],
    "persistent-striding": [(kernels, "PERSISTENT_MIN_ITEMS_PER_WARP", 0),
                            (launch, "resident_blocks", lambda k, threads, shared_mem=0: 2)],
}


@pytest.mark.parametrize("grid", list(GRIDS))
def test_grid_shapes(monkeypatch, small_graph, super_graph, grid):
    for module, attr, value in GRIDS[grid]:
        monkeypatch.setattr(module, attr, value)
    _check_all_variants(monkeypatch, super_graph, 2, 64, seed=31, return_attention=True, alpha_grad=True)
    _check_all_variants(monkeypatch, super_graph, 8, 256, False, False, seed=32)
    _check_all_variants(monkeypatch, small_graph, 3, 32, seed=33)
