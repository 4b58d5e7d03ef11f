"""Fused dot-product attention kernels against the float64 reference.

Every check is a relative error ||got - want|| / ||want|| < 1e-4 of fp32 kernel results
against ``gnn_fastpath.reference.dot_attention`` on float64 copies: outputs, attention and
the gradients of q, k, v and edge_term, for both backward modes (atomic, transposed).
"""
from __future__ import annotations

import math

import pytest
import torch
from kernel_checks import assert_close

from gnn_fastpath import Graph, reference
from gnn_fastpath.cuda import dot_attention as dot_kernels
from gnn_fastpath.ops import CUDA, backend_for, dot_attention
from gnn_fastpath.ops import dispatch
from zoo import random_edges

pytestmark = pytest.mark.cuda

MODES = ("atomic", "transposed")


# ------------------------------------------------------------------------------- helpers


def dot_attention_cuda(graph, q, k, v, scale=None, edge_term=None, return_attention=False, dropout=0.0):
    """The public op, asserted to have run the fused kernels: a reference fallback here
    would compare the reference with itself."""
    with dispatch.recording() as call:  # a fallback raises dispatch.Unsupported in here
        res = dot_attention(graph, q, k, v, scale, edge_term, return_attention, dropout)
    assert call.backend == CUDA, f"dot_attention ran on {call.backend}, not the CUDA kernels"
    return res


def _graph(edge_index, sizes, device="cuda") -> Graph:
    return Graph.from_edge_index(edge_index.to(device), num_nodes=sizes)


def _with_hub_source(edge_index, sizes, hub=1, degree=700, seed=1):
    """Add ``degree`` out-edges of source ``hub`` (a heavy row of the source-major CSR)."""
    gen = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, sizes[1], (degree,), generator=gen)
    extra = torch.stack([torch.full_like(dst, hub), dst])
    return torch.cat([edge_index, extra], 1), sizes


def _inputs(graph: Graph, H, D, edge_term=True, seed=0, spread=1.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen) * spread

    q, k, v = randn(graph.n_dst, H, D), randn(graph.n_src, H, D), randn(graph.n_src, H, D)
    t = randn(graph.num_edges, H, D) if edge_term else None
    return q, k, v, t


def _run(fn, graph, q, k, v, t, scale, return_attention, dropout, grad_seed=7, dtype=None):
    """fn(...) on (copies of) the inputs; returns outputs and the input gradients of
    loss = <out, g_out> (+ <attention, g_attention>)."""
    leaves = [x.detach().to(dtype or x.dtype).requires_grad_() if x is not None else None for x in (q, k, v, t)]
    res = fn(graph, *leaves[:3], scale, leaves[3], return_attention, dropout)
    out, attn = (res if return_attention else (res, None))
    gen = torch.Generator(device="cuda").manual_seed(grad_seed)
    g_out = torch.randn(out.shape, device="cuda", generator=gen).to(out.dtype)
    loss = (out * g_out).sum()
    if attn is not None:
        g_attn = torch.randn(attn.shape, device="cuda", generator=gen).to(attn.dtype)
        loss = loss + (attn * g_attn).sum()
    loss.backward()
    grads = [x.grad if x is not None else None for x in leaves]
    return out, attn, grads


def _compare(graph, H, D, edge_term=True, scale=None, return_attention=False, mode="atomic", seed=0,
             monkeypatch=None, spread=1.0):
    if monkeypatch is not None:
        monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", mode)
    q, k, v, t = _inputs(graph, H, D, edge_term, seed, spread)
    out, attn, grads = _run(dot_attention_cuda, graph, q, k, v, t, scale, return_attention, 0.0)
    assert out.dtype == torch.float32 and out.is_contiguous()
    r_out, r_attn, r_grads = _run(reference.dot_attention, graph, q, k, v, t, scale, return_attention, 0.0,
                                  dtype=torch.float64)
    tag = f"H={H} D={D} t={edge_term} mode={mode}"
    assert_close(f"out ({tag})", out, r_out)
    if return_attention:
        assert_close(f"attention ({tag})", attn, r_attn)
    for name, g, r in zip(("dq", "dk", "dv", "dt"), grads, r_grads):
        if r is not None:
            assert_close(f"{name} ({tag})", g, r)
    return out


@pytest.fixture(scope="module")
def small_graph():
    ei, sizes = random_edges(150, 120, 2500, seed=3, empty_rows=7, super_node_degree=900)
    ei, sizes = _with_hub_source(ei, sizes)
    return _graph(ei, sizes)


@pytest.fixture(scope="module")
def homo_graph():
    ei, sizes = random_edges(200, 200, 3000, seed=5, empty_rows=3)
    return _graph(ei, sizes)


@pytest.fixture(scope="module")
def sparse_graph():
    """Low mean in-degree (the kernels then put two heads in a lane group), a split row."""
    ei, sizes = random_edges(3000, 2500, 10000, seed=13, empty_rows=20, super_node_degree=2000)
    g = _graph(ei, sizes)
    assert g.degree_stats().mean < dot_kernels.LOW_DEGREE
    return g


@pytest.fixture(scope="module")
def super_graph():
    """Bipartite, one destination with >= 100k in-edges, empty rows, a hub source."""
    ei, sizes = random_edges(3000, 2500, 40000, seed=11, empty_rows=40, super_node_degree=110_000)
    ei, sizes = _with_hub_source(ei, sizes, hub=2, degree=5000)
    return _graph(ei, sizes)


# ------------------------------------------------------------------------------- tests
def test_dispatch_uses_cuda_kernels(homo_graph):
    q, k, v, t = _inputs(homo_graph, 2, 32)
    assert backend_for("dot_attention", k) == "cuda"
    out = dot_attention(homo_graph, q, k, v, edge_term=t)
    want = reference.dot_attention(homo_graph, q.double(), k.double(), v.double(), None, t.double())
    assert_close("out", out, want)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("H", [1, 2, 4, 8])
@pytest.mark.parametrize("D", [8, 32, 64, 100, 128, 256])
def test_grid_small_graph(small_graph, D, H, mode, monkeypatch):
    _compare(small_graph, H, D, edge_term=(H + D // 8) % 2 == 0, mode=mode, monkeypatch=monkeypatch, seed=D + H)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("edge_term", [False, True])
def test_homogeneous_graph(homo_graph, edge_term, mode, monkeypatch):
    _compare(homo_graph, 4, 128, edge_term=edge_term, mode=mode, monkeypatch=monkeypatch)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("H,D,edge_term", [(4, 128, True), (2, 64, False), (1, 256, True), (3, 48, True)])
def test_super_node_graph(super_graph, H, D, edge_term, mode, monkeypatch):
    assert int(super_graph.in_degree().max()) >= 100_000
    out = _compare(super_graph, H, D, edge_term=edge_term, mode=mode, monkeypatch=monkeypatch)
    empty = super_graph.in_degree() == 0
    assert empty.any() and (out[empty] == 0).all()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("H,D,edge_term", [(4, 128, True), (3, 100, False), (8, 64, True), (2, 256, False)])
def test_low_degree_graph(sparse_graph, H, D, edge_term, mode, monkeypatch):
    _compare(sparse_graph, H, D, edge_term=edge_term, mode=mode, monkeypatch=monkeypatch,
             return_attention=(H == 3))


@pytest.mark.parametrize("D", [3, 6, 16, 128])
def test_odd_and_misaligned_rows(small_graph, D, monkeypatch):
    """D % 4 != 0 and 16-byte-misaligned (but contiguous) inputs take the scalar-load variant."""
    q, k, v, t = _inputs(small_graph, 2, D)

    def shifted(x):  # same values, data pointer 4 bytes past a 16-byte boundary
        buf = torch.empty(x.numel() + 1, device=x.device)
        y = buf[1:].view(x.shape)
        y.copy_(x)
        return y

    q, k, v, t = (shifted(x) for x in (q, k, v, t))
    assert q.data_ptr() % 16 != 0
    for mode in MODES:
        monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", mode)
        out, _, grads = _run(dot_attention_cuda, small_graph, q, k, v, t, None, False, 0.0)
        r_out, _, r_grads = _run(reference.dot_attention, small_graph, q, k, v, t, None, False, 0.0,
                                 dtype=torch.float64)
        assert_close(f"out D={D}", out, r_out)
        for name, g, r in zip(("dq", "dk", "dv", "dt"), grads, r_grads):
            assert_close(f"{name} D={D} {mode}", g, r)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("return_attention", [True, "dropped"])
def test_return_attention_and_its_gradient(small_graph, return_attention, mode, monkeypatch):
    _compare(small_graph, 4, 32, edge_term=True, scale=0.37, return_attention=return_attention, mode=mode,
             monkeypatch=monkeypatch)


@pytest.mark.parametrize("mode", MODES)
def test_return_attention_super_node(super_graph, mode, monkeypatch):
    _compare(super_graph, 2, 32, edge_term=False, return_attention=True, mode=mode, monkeypatch=monkeypatch)


def test_custom_scale(small_graph):
    _compare(small_graph, 2, 64, edge_term=True, scale=0.05)
    _compare(small_graph, 2, 64, edge_term=False, scale=1.3, spread=0.5)


@pytest.mark.parametrize("mode", MODES)
def test_dropout_consistency(small_graph, mode, monkeypatch):
    """Forward and backward use one Philox mask: kernel results equal float64 math with the
    mask read off the returned dropped attention."""
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", mode)
    p = 0.3
    H, D = 2, 32
    q, k, v, t = _inputs(small_graph, H, D, edge_term=True, seed=4)
    torch.manual_seed(123)
    out, dropped, grads = _run(dot_attention_cuda, small_graph, q, k, v, t, None, "dropped", p)
    torch.manual_seed(123)
    out2, dropped2, _ = _run(dot_attention_cuda, small_graph, q, k, v, t, None, "dropped", p)
    assert torch.equal(dropped, dropped2) and torch.equal(out, out2), "same seed must give the same mask"
    torch.manual_seed(123)
    _, alpha_pre, _ = _run(dot_attention_cuda, small_graph, q, k, v, t, None, True, p)

    # float64 oracle with the kernel's mask
    g = small_graph
    x64 = [x.detach().double().requires_grad_() for x in (q, k, v, t)]
    alpha64 = reference.dot_attention(g, *x64[:3], None, x64[3], True, 0.0)[1]  # caller order
    keep = (dropped.detach() > 0).double()
    live = alpha64.detach() > 1e-12
    frac = 1.0 - keep[live].mean().item()
    assert abs(frac - p) < 0.05, f"dropped fraction {frac:.3f} far from p={p}"
    assert_close("attention (True) with dropout", alpha_pre, alpha64)
    scale_mask = keep / (1.0 - p)
    a_drop = alpha64 * scale_mask
    assert_close("dropped attention", dropped, a_drop)
    msg = (x64[2][g.indices] + x64[3][g.perm])  # CSR order [M, H, D]
    w = a_drop[g.perm]  # CSR order
    out64 = torch.zeros(g.n_dst, H, D, dtype=torch.float64, device="cuda").index_add(
        0, g.dst_index(), w.unsqueeze(-1) * msg)
    assert_close("dropped output", out, out64)
    gen = torch.Generator(device="cuda").manual_seed(7)
    g_out = torch.randn(out.shape, device="cuda", generator=gen).double()
    g_attn = torch.randn(dropped.shape, device="cuda", generator=gen).double()
    ((out64 * g_out).sum() + (a_drop * g_attn).sum()).backward()
    for name, got, x in zip(("dq", "dk", "dv", "dt"), grads, x64):
        assert_close(f"{name} with dropout ({mode})", got, x.grad)


def test_dropout_one_drops_everything(small_graph):
    q, k, v, t = _inputs(small_graph, 2, 32)
    out, dropped, grads = _run(dot_attention_cuda, small_graph, q, k, v, t, None, "dropped", 1.0)
    assert (out == 0).all() and (dropped == 0).all()
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("mode", MODES)
def test_zero_edge_graph(mode, monkeypatch):
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", mode)
    g = _graph(torch.empty(2, 0, dtype=torch.int64), (5, 7))
    q, k, v, t = _inputs(g, 2, 32)
    out, attn, grads = _run(dot_attention_cuda, g, q, k, v, t, None, True, 0.0)
    assert out.shape == (7, 2, 32) and (out == 0).all()
    assert attn.shape == (0, 2)
    for grad, x in zip(grads, (q, k, v, t)):
        assert grad.shape == x.shape and (grad == 0).all()


def test_cpu_graph_with_cuda_features():
    ei, sizes = random_edges(90, 70, 800, seed=8, empty_rows=2)
    g_cpu = Graph.from_edge_index(ei, num_nodes=sizes)
    assert g_cpu.device.type == "cpu"
    q, k, v, t = _inputs(g_cpu, 2, 64)
    out, attn, grads = _run(dot_attention, g_cpu, q, k, v, t, None, True, 0.0)
    g_cuda = g_cpu.to("cuda")
    r_out, r_attn, r_grads = _run(reference.dot_attention, g_cuda, q, k, v, t, None, True, 0.0, dtype=torch.float64)
    assert_close("out", out, r_out)
    assert_close("attention", attn, r_attn)
    for name, got, want in zip(("dq", "dk", "dv", "dt"), grads, r_grads):
        assert_close(name, got, want)


@pytest.mark.parametrize("mode", MODES)
def test_non_default_stream(small_graph, mode, monkeypatch):
    """Kernels go on torch's current stream: inputs produced on a side stream by slow work
    are read only after that work finished."""
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", mode)
    H, D = 4, 64
    q0, k0, v0, t0 = _inputs(small_graph, H, D)
    want_out, _, want_grads = _run(dot_attention_cuda, small_graph, q0, k0, v0, t0, None, False, 0.0)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        slow = big
        for _ in range(8):  # keep the side stream busy before the inputs exist
            slow = slow @ big / 64.0
        zero = slow[:1, :1].sum() * 0.0
        q, k, v, t = (x + zero for x in (q0, k0, v0, t0))
        out, _, grads = _run(dot_attention_cuda, small_graph, q, k, v, t, None, False, 0.0)
    side.synchronize()
    assert torch.equal(out, want_out)
    for name, got, want in zip(("dq", "dk", "dv", "dt"), grads, want_grads):
        assert_close(name, got, want, tol=1e-6)


def test_forward_memory_has_no_edge_sized_tensors(monkeypatch):
    """Forward allocates out, lse and small chunk partials, never [M, H] or [M, H, D]."""
    ei, sizes = random_edges(20000, 20000, 200_000, seed=2, super_node_degree=30_000)
    g = _graph(ei, sizes)
    H, D = 4, 128
    q, k, v, _ = _inputs(g, H, D, edge_term=False)
    t = torch.randn(g.num_edges, H, D, device="cuda")
    dot_attention_cuda(g, q, k, v, None, t)  # compile, build the cached chunk lists
    torch.cuda.synchronize()
    edge_bytes = g.num_edges * H * D * 4
    out_bytes = g.n_dst * H * D * 4
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        out = dot_attention_cuda(g, q, k, v, None, t)
    torch.cuda.synchronize()
    delta = torch.cuda.max_memory_allocated() - base
    assert delta < out_bytes + edge_bytes // 20, f"forward peak {delta / 2**20:.1f} MiB"
    del out
    # backward (atomic): gradients plus partials, no edge-sized temporaries beyond dt
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", "atomic")
    xs = [x.detach().requires_grad_() for x in (q, k, v, t)]
    out = dot_attention_cuda(g, *xs[:3], None, xs[3])
    g_out = torch.randn_like(out)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out.backward(g_out)
    torch.cuda.synchronize()
    grad_bytes = sum(x.numel() * 4 for x in xs)
    delta = torch.cuda.max_memory_allocated() - base
    assert delta < grad_bytes + edge_bytes // 20, f"backward peak {delta / 2**20:.1f} MiB"


def test_chunk_list_covers_every_edge_once():
    ei, sizes = random_edges(500, 400, 6000, seed=9, empty_rows=5, super_node_degree=3000)
    g = _graph(ei, sizes)
    ch = dot_kernels._work(g)
    row, begin, end, slot = ch.items.long().unbind(1)
    assert (end - begin <= dot_kernels.CHUNK_EDGES).all() and (end >= begin).all()
    assert (end <= g.indptr[row + 1]).all() and (begin >= g.indptr[row]).all()
    counts = torch.zeros(g.num_edges + 1, dtype=torch.int64, device="cuda")
    for b, e in zip(begin.tolist(), end.tolist()):
        counts[b:e] += 1
    assert (counts[:-1] == 1).all()
    assert torch.equal(torch.sort(row.unique()).values, torch.arange(g.n_dst, device="cuda"))
    assert ch.n_split >= 1 and (slot[: ch.n_slots] >= 0).all() and (slot[ch.n_slots:] == -1).all()
    assert torch.equal(slot[: ch.n_slots], torch.arange(ch.n_slots, device="cuda"))


def test_64bit_offsets(gpu_memory_lock):
    """Rows and edge terms beyond 2**31 floats: H * D = 2048, 1.1M sources and 1.1M edges
    (about 80 GB: other workers' subprocesses wait, gpu_memory_lock)."""
    free, _ = torch.cuda.mem_get_info()
    if free < 80 * 2**30:
        pytest.skip("needs about 80 GB of free GPU memory")
    H, D = 16, 128
    n_src, n_dst, m = 1_100_000, 64, 1_100_000
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, n_src, (m,), generator=gen)
    src[:100] = n_src - 1 - torch.arange(100)  # the highest rows are touched
    dst = torch.randint(0, n_dst, (m,), generator=gen)
    g = _graph(torch.stack([src, dst]), (n_src, n_dst))
    q, k, v, t = _inputs(g, H, D, edge_term=True)
    assert k.numel() > 2**31 and t.numel() > 2**31
    xs = [x.requires_grad_() for x in (q, k, v, t)]
    out = dot_attention_cuda(g, *xs[:3], None, xs[3])
    g_out = torch.randn_like(out)
    out.backward(g_out)
    # float64 check on a few destinations (their edges only) ...
    rows = [0, 17, n_dst - 1]
    scale = 1.0 / math.sqrt(D)
    for i in rows:
        lo, hi = int(g.indptr[i]), int(g.indptr[i + 1])
        j, c = g.indices[lo:hi], g.perm[lo:hi]
        kk = k.detach()[j].double() + t.detach()[c].double()
        vv = v.detach()[j].double() + t.detach()[c].double()
        qi = q.detach()[i].double()
        alpha = torch.softmax(scale * (kk * qi).sum(-1), dim=0)  # [E, H]
        o = (alpha.unsqueeze(-1) * vv).sum(0)
        assert_close(f"out row {i}", out[i], o)
        go = g_out[i].double()
        dalpha = (vv * go).sum(-1)
        de = alpha * (dalpha - (o * go).sum(-1))
        assert_close(f"dq row {i}", xs[0].grad[i], scale * (de.unsqueeze(-1) * kk).sum(0))
        dt = alpha.unsqueeze(-1) * go + scale * de.unsqueeze(-1) * qi
        assert_close(f"dt row {i}", xs[3].grad[c], dt)
    # ... and dk, dv of the highest source, summed over all its out-edges
    j = n_src - 1
    sel = (g.indices == j).nonzero().flatten()
    dk = torch.zeros(H, D, dtype=torch.float64, device="cuda")
    dv = torch.zeros_like(dk)
    dst_of = g.dst_index()
    for e in sel.tolist():
        i = int(dst_of[e])
        lo, hi = int(g.indptr[i]), int(g.indptr[i + 1])
        jj, cc = g.indices[lo:hi], g.perm[lo:hi]
        kk = k.detach()[jj].double() + t.detach()[cc].double()
        vv = v.detach()[jj].double() + t.detach()[cc].double()
        qi, go = q.detach()[i].double(), g_out[i].double()
        alpha = torch.softmax(scale * (kk * qi).sum(-1), dim=0)
        o = (alpha.unsqueeze(-1) * vv).sum(0)
        de = alpha * ((vv * go).sum(-1) - (o * go).sum(-1))
        pos = e - lo
        dk += scale * de[pos].unsqueeze(-1) * qi
        dv += alpha[pos].unsqueeze(-1) * go
    assert_close("dk of the last source", xs[1].grad[j], dk)
    assert_close("dv of the last source", xs[2].grad[j], dv)
