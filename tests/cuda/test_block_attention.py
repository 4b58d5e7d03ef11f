"""Dot-product attention on tensor cores (gnn_fastpath.cuda.block_attention) against the float64
reference, forward and every gradient, float16 and bfloat16, through the public op forced
onto it (GNN_FASTPATH_DOT_FWD=block, GNN_FASTPATH_DOT_BWD=block), on graphs with empty rows,
self loops, a super node, a hub source, bipartite shapes, locally dense windows, parallel
edges (counted per cell), and an undirected graph (whose dk/dv pass walks the forward layout).

Bound: test_dot_attention_half's, the CSR kernels' own (same inputs on both sides, errors
relative to each row's largest magnitude plus a tensor-scale term): the weights and de enter
the tensor-core products as two 16-bit parts (error ~u^2), so the results are rounded once, as
the CSR kernels round them. With float32 results (autocast) grad_out is rounded to T once for
the products: one more u_T on the gradients.
"""
from __future__ import annotations

import pytest
import torch

from gnn_fastpath import Graph, reference
from gnn_fastpath.cuda import block_attention
from test_dot_attention_half import EPS32_ACC, UNIT_ROUNDOFF, assert_half_close, inputs, run
from test_dot_attention_half import fused
from zoo import random_edges

pytestmark = pytest.mark.cuda

HALF = (torch.float16, torch.bfloat16)


def _simple(ei, sizes) -> Graph:
    """The graph of ``ei`` without parallel edges, on the GPU."""
    return Graph.from_edge_index(torch.unique(ei, dim=1).cuda(), num_nodes=sizes)


def _clustered(n=3000, m=60000, seed=0):
    gen = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, n, (m,), generator=gen)
    src = torch.clamp((dst // 64) * 64 + torch.randint(0, 64, (m,), generator=gen), max=n - 1)
    return torch.stack([src, dst]), (n, n)


def _hub(ei, sizes, hub=1, degree=700):
    gen = torch.Generator().manual_seed(1)
    dst = torch.randint(0, sizes[1], (degree,), generator=gen)
    return torch.cat([ei, torch.stack([torch.full_like(dst, hub), dst])], 1), sizes


def _undirected(n=800, m=6000, seed=4):
    ei, _ = random_edges(n, n, m, seed=seed, empty_rows=10)
    return torch.cat([ei, ei.flip(0)], 1), (n, n)


GRAPHS = {
    "small": lambda: _hub(*random_edges(150, 120, 2500, seed=3, empty_rows=7, super_node_degree=900)),
    "super": lambda: _hub(*random_edges(3000, 2500, 40000, seed=11, empty_rows=40, super_node_degree=20000),
                          hub=2, degree=5000),
    "homo": lambda: random_edges(200, 200, 3000, seed=5, empty_rows=3),
    "clustered": _clustered,
    "undirected": _undirected,
    "parallel": lambda: random_edges(300, 250, 6000, seed=6, empty_rows=5, super_node_degree=600),
}
#: Graphs kept with their parallel edges (counted per cell of the layout); the others are simple.
MULTIGRAPHS = ("parallel",)
_cache = {}


def _graph(name) -> Graph:
    if name not in _cache:
        ei, sizes = GRAPHS[name]()
        _cache[name] = Graph.from_edge_index(ei.cuda(), num_nodes=sizes) if name in MULTIGRAPHS else _simple(ei, sizes)
    return _cache[name]


def _compare(g, H, D, dtype, seed=0, scale=None):
    xs = inputs(g, H, D, dtype, edge_term=False, seed=seed)
    out, _, grads = run(fused, g, xs, scale, False, dtype)
    want_out, _, want_grads = run(reference.dot_attention, g, xs, scale, False, dtype, upcast=True)
    u = UNIT_ROUNDOFF[dtype]
    tag = f"{dtype} H={H} D={D}"
    assert out.dtype == dtype
    assert_half_close(f"out ({tag})", out, want_out, u)
    for name, got, want in zip(("dq", "dk", "dv"), grads, want_grads):
        assert got.dtype == dtype
        assert_half_close(f"{name} ({tag})", got, want, u, u_saved=u + EPS32_ACC)
    return out, grads


@pytest.fixture
def block(monkeypatch, dtype):
    """Both passes forced onto the block kernels; asserts they ran (a test with float16
    inputs and float32 results appends "csr backward" to the list it yields: that backward
    runs the CSR kernels, block_offered)."""
    monkeypatch.setenv("GNN_FASTPATH_DOT_FWD", "block")
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", "block")
    ran = []
    for name in ("forward", "backward"):
        original = getattr(block_attention, name)

        def spy(*args, _original=original, _name=name, **kwargs):
            ran.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(block_attention, name, spy)
    yield ran
    csr_backward = "csr backward" in ran
    kernels = [name for name in ran if name != "csr backward"]
    want = ["forward"] if csr_backward else ["forward", "backward"]
    assert kernels[:len(want)] == want and ("backward" in kernels) != csr_backward, f"the block kernels ran {ran}"


@pytest.mark.parametrize("chunk", [32, 2], ids=["chunks32", "chunks2"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("H,D", [(3, 16), (2, 32), (1, 48), (2, 64), (4, 128)])
@pytest.mark.parametrize("name", list(GRAPHS))
def test_matches_reference(block, monkeypatch, name, H, D, dtype, chunk):
    """``chunk``: blocks per work item (2: most windows are split into chunks, merged after)."""
    monkeypatch.setattr(block_attention, "CHUNK_BLOCKS", chunk)
    _compare(_graph(name), H, D, dtype, seed=D + H)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_rows_without_edges(block, dtype):
    """A destination without in-edges gets 0 (and lse -inf); a source without out-edges gets
    dk = dv = 0; every row is written (a NaN-filled allocator would show any row left)."""
    ei, (n_src, n_dst) = GRAPHS["small"]()
    g = _simple(ei, (n_src + 5, n_dst + 5))  # 5 sources without out-edges, 5 destinations without in-edges
    out, (dq, dk, dv, _) = _compare(g, 2, 64, dtype)
    empty_dst = g.in_degree() == 0
    empty_src = g.out_degree() == 0
    assert empty_dst.any() and empty_src.any()
    assert (out[empty_dst] == 0).all() and (dq[empty_dst] == 0).all()
    assert (dk[empty_src] == 0).all() and (dv[empty_src] == 0).all()
    _, lse = block_attention.forward(g, *inputs(g, 2, 64, dtype, edge_term=False)[:3], 0.125)
    assert torch.isneginf(lse[empty_dst]).all() and torch.isfinite(lse[~empty_dst]).all()


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_either_backward_follows_either_forward(monkeypatch, dtype):
    """lse means the same in both families: a CSR forward with the block backward, and the
    block forward with the CSR backward, give what one family gives alone (to rounding)."""
    g = _graph("clustered")
    xs = inputs(g, 2, 64, dtype, edge_term=False, seed=5)
    results = {}
    for fwd, bwd in (("csr", "transposed"), ("csr", "block"), ("block", "atomic"), ("block", "block")):
        monkeypatch.setenv("GNN_FASTPATH_DOT_FWD", fwd)
        monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", bwd)
        results[fwd, bwd] = run(fused, g, xs, None, False, dtype)
    want_out, _, want_grads = run(reference.dot_attention, g, xs, None, False, dtype, upcast=True)
    u = UNIT_ROUNDOFF[dtype]
    for (fwd, bwd), (out, _, grads) in results.items():
        assert_half_close(f"out {fwd}/{bwd}", out, want_out, u)
        for name, got, want in zip(("dq", "dk", "dv"), grads, want_grads):
            assert_half_close(f"{name} {fwd}/{bwd}", got, want, u, u_saved=u + EPS32_ACC)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", ["super", "undirected", "clustered"])
def test_dropout_drops_the_csr_kernels_edges(monkeypatch, name, dtype):
    """Attention dropout draws the CSR kernels' multipliers (Philox keyed by the caller's edge
    id and head): with one stream, block and CSR kernels give the same out and gradients up to
    their roundings (each within one rounding of the exact result: 2 u apart), in either
    combination of forward and backward; on the undirected graph the dk/dv pass reads its
    layout's cells as the reverse edges."""
    from gnn_fastpath.ops.dot_attention import DotAttentionFunction

    monkeypatch.setattr(block_attention, "CHUNK_BLOCKS", 2)  # split windows too
    g = _simple(*GRAPHS[name]())
    if name == "undirected":
        assert g.is_symmetric() and block_attention.source_layout(g) is block_attention.layout(g)
    xs = inputs(g, 2, 64, dtype, edge_term=False, seed=11)
    gen = torch.Generator(device="cuda").manual_seed(3)
    g_out = torch.randn(g.n_dst, 2, 64, device="cuda", generator=gen).to(dtype)
    results = {}
    for fwd, bwd in (("csr", "transposed"), ("block", "block"), ("csr", "block"), ("block", "atomic")):
        monkeypatch.setenv("GNN_FASTPATH_DOT_FWD", fwd)
        monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", bwd)
        leaves = [x.detach().requires_grad_() for x in xs[:3]]
        out = DotAttentionFunction.apply(*leaves, None, g, 0.125, False, 0.3, 1234, 5678, None)
        out.backward(g_out)
        results[fwd, bwd] = (out, [x.grad for x in leaves])
    plain = DotAttentionFunction.apply(*xs[:3], None, g, 0.125, False, 0.0, 0, 0, None)
    want_out, want_grads = results["csr", "transposed"]
    assert not torch.equal(want_out, plain)  # something was dropped
    u = UNIT_ROUNDOFF[dtype]
    for key in (("block", "block"), ("csr", "block"), ("block", "atomic")):
        out, grads = results[key]
        assert_half_close(f"out {key}", out, want_out.double(), 2 * u)
        for gname, got, want in zip(("dq", "dk", "dv"), grads, want_grads):
            assert_half_close(f"{gname} {key}", got, want.double(), 2 * u, u_saved=2 * u + EPS32_ACC)


def test_tuner_times_the_block_variants(monkeypatch, tmp_path):
    """With tuning on, a graph that outlived a step times the forward (csr, block) and the
    backward (atomic, transposed, block) per size class, window sharing and head width, keeps
    the fastest (the rule's pick where it is within the tuner's TIE of it), and the results
    match the reference. Each race runs at its class's first call (no wait for the allowance,
    no process budget: both are tests/test_tuning.py's)."""
    from gnn_fastpath import tuning

    monkeypatch.setenv("GNN_FASTPATH_TUNE", "1")
    monkeypatch.setenv("GNN_FASTPATH_TUNE_CACHE", str(tmp_path / "tuning.json"))
    monkeypatch.setattr(tuning, "FREE_MS", float("inf"))
    monkeypatch.setattr(tuning, "BUDGET_MS", float("inf"))
    tuning.forget()
    g = _simple(*_clustered(seed=12))
    xs = inputs(g, 2, 64, torch.bfloat16, edge_term=False, seed=4)
    for _ in range(2):  # the second step is the first the block variants are offered in
        out, _, grads = run(fused, g, xs, None, False, torch.bfloat16)
    records = {r["class"].split("|")[0]: r for r in tuning.listing()}
    assert set(records["dot_attention.forward"]["times_ms"]) == {"csr", "block"}
    assert "head 64" in records["dot_attention.forward"]["class"]
    block_bwd = [r for r in tuning.listing()
                 if r["class"].startswith("dot_attention.backward") and "head 64" in r["class"]]
    assert len(block_bwd) == 1 and set(block_bwd[0]["times_ms"]) == {"atomic", "transposed", "block"}
    for record in (records["dot_attention.forward"], block_bwd[0]):
        times = record["times_ms"]
        fastest = min(times, key=times.get)
        assert record["choice"] == fastest or (record["choice"] == record["default"]
                                               and times[record["choice"]] <= (1 + tuning.TIE) * times[fastest])
    want_out, _, want_grads = run(reference.dot_attention, g, xs, None, False, torch.bfloat16, upcast=True)
    u = UNIT_ROUNDOFF[torch.bfloat16]
    assert_half_close("out", out, want_out, u)
    for name, got, want in zip(("dq", "dk", "dv"), grads, want_grads):
        assert_half_close(name, got, want, u, u_saved=u + EPS32_ACC)


def test_multigraph_counts_parallel_edges():
    g = _graph("parallel")
    assert block_attention.layout(g).counts() is not None  # the graph has parallel edges
    assert int(block_attention.layout(g).counts().max()) >= 2


def test_calls_it_cannot_take_run_the_csr_kernels(monkeypatch):
    """Forced, the block kernels still leave edge terms, returned attention, float32, other head
    widths and dropout on a multigraph to the CSR kernels (a forced setting is a preference)."""
    monkeypatch.setenv("GNN_FASTPATH_DOT_FWD", "block")
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", "block")
    monkeypatch.setattr(block_attention, "forward", lambda *a, **k: pytest.fail("block forward ran"))
    monkeypatch.setattr(block_attention, "backward", lambda *a, **k: pytest.fail("block backward ran"))
    g = _graph("homo")
    q, k, v, t = [x.requires_grad_() for x in inputs(g, 2, 64, torch.bfloat16, edge_term=True)]
    multi = _graph("parallel")
    qm, km, vm = [x.requires_grad_() for x in inputs(multi, 2, 64, torch.bfloat16, edge_term=False)[:3]]
    for call in (lambda: fused(g, q, k, v, edge_term=t), lambda: fused(multi, qm, km, vm, dropout=0.1),
                 lambda: fused(g, q, k, v, return_attention=True)[0], lambda: fused(g, q.float(), k.float(), v.float()),
                 lambda: fused(g, q[..., :40], k[..., :40], v[..., :40])):
        call().float().sum().backward()


def test_offered_only_on_graphs_that_outlived_a_step(monkeypatch):
    """Unforced, a graph's first step runs the CSR kernels (a sampled batch never builds a
    layout); once the graph outlived a step, the rule takes the block kernels."""
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "0")
    ran = []
    for name in ("forward", "backward"):
        original = getattr(block_attention, name)
        monkeypatch.setattr(block_attention, name,
                            lambda *a, _o=original, _n=name, **k: (ran.append(_n), _o(*a, **k))[1])
    g = _simple(*_clustered(seed=9))
    xs = [x.detach().requires_grad_() for x in inputs(g, 2, 64, torch.bfloat16, edge_term=False)[:3]]
    for step in range(3):
        fused(g, *xs).float().sum().backward()
        assert ran == ([] if step == 0 else ["forward", "backward"] * step), f"step {step}: {ran}"
    with torch.no_grad():  # inference on a fresh graph: never a backward, never the layout
        fresh = _simple(*_clustered(seed=10))
        for _ in range(3):
            fused(fresh, *xs)
    assert len(ran) == 4 and ("block_attention", "layout") not in fresh._memo


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_float32_results(block, dtype):
    """out_dtype=float32 (what TransformerConv asks under autocast): out in float32, never
    rounded to 16 bits (the float32 bound); the float32 grad_out enters the products rounded to
    T (one more rounding of the gradients: u = 2 u_T)."""
    g = _graph("super")
    if dtype == torch.float16:
        block.append("csr backward")  # the float32 grad_out rounded to float16 could overflow
    xs = inputs(g, 2, 64, dtype, edge_term=False, seed=3)
    out, _, grads = run(fused, g, xs, None, False, torch.float32)
    want_out, _, want_grads = run(reference.dot_attention, g, xs, None, False, torch.float32, upcast=True)
    u = UNIT_ROUNDOFF[dtype]
    assert out.dtype == torch.float32
    assert_half_close("out", out, want_out, UNIT_ROUNDOFF[torch.float32])
    for name, got, want in zip(("dq", "dk", "dv"), grads, want_grads):
        assert got.dtype == dtype
        assert_half_close(name, got, want, 2 * u, u_saved=EPS32_ACC)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("name", ["homo", "undirected", "clustered"])
def test_gradients_beyond_float16_range(block, name, dtype):
    """de = alpha (dalpha - delta) past float16's 65504 while every gradient stays inside it
    (a GradScaler-scaled grad_out, 2**13 here, with v 16 x and q, k 1/16 x the unit scale):
    float16 rows divide de by powers of two (ba_scale_de); every gradient is finite and within
    the bound, as bfloat16's are."""
    g = _graph(name)
    H, D = 2, 64
    q, k, v = inputs(g, H, D, dtype, edge_term=False, seed=8)[:3]
    xs = [q * 2.0**-4, k * 2.0**-4, v * 2.0**4]  # exact: powers of two
    leaves = [x.detach().requires_grad_() for x in xs]
    refs = [x.detach().double().requires_grad_() for x in xs]
    out = fused(g, *leaves)
    gen = torch.Generator(device="cuda").manual_seed(9)
    g_out = (torch.randn(out.shape, device="cuda", generator=gen) * 2.0**13).to(dtype)
    (out.double() * g_out.double()).sum().backward()
    want_out, alpha = reference.dot_attention(g, *refs, None, None, True)
    (want_out * g_out.double()).sum().backward()
    with torch.no_grad():  # what makes the case: de past float16's range, the gradients inside it
        src, dst = g.indices, g.dst_index()
        dp = (g_out.double()[dst] * refs[2][src]).sum(-1)
        delta = (g_out.double() * want_out).sum(-1)
        de = alpha[g.perm] * (dp - delta[dst])
        assert de.abs().max() > 2 * 65504
        assert max(float(x.grad.abs().max()) for x in refs) < 65504 / 2
    u = UNIT_ROUNDOFF[dtype]
    for grad_name, got, want in zip(("dq", "dk", "dv"), (x.grad for x in leaves), (x.grad for x in refs)):
        assert got.dtype == dtype
        assert_half_close(f"{grad_name} ({dtype}, grad_out x 2**13)", got, want, u, u_saved=u + EPS32_ACC)
