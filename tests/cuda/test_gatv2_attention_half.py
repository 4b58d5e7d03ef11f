r"""Fused GATv2 attention in float16 and bfloat16 against the float64 reference.

Every check compares the kernels on 16-bit inputs with ``gnn_fastpath.reference`` run in
float64 on the SAME values (upcast), so input rounding is not an error here; what is left:

- *Outputs* (out, alpha) in ``out_dtype`` with unit roundoff u_O (2**-8 bfloat16, 2**-11
  float16, 2**-24 float32). The kernels compute in float32 and round once at the store:
  |round(a) - w| <= u_O |a| + |a - w|. The float32 part |a - w| (logits, exp, online-softmax
  rescaling, chunk merges) is bounded by eps = 2**-14 of the row's absolute magnitude, with a
  wide margin (the float32 kernel tests see ~1e-6; a sum of n terms drifts ~2**-24 sqrt(n) of
  its absolute sum: 2e-5 at n = 1e5), and does not grow with the degree beyond that.
  Row r = (node, head), a D-vector; A_r = sum_j alpha_rj |x_src j| (|.| elementwise) bounds
  both the row and its partial sums, so
      ||out_r - want_r|| <= c (u_O + eps) ||A_r||,
      |alpha_e - want_e| <= c ((u_O + eps) |want_e| + eta_O).
  eta_O is the absolute part of the rounding model, fl(a) = a (1 + d) + n with |d| <= u_O,
  |n| <= eta_O = half the subnormal spacing (2**-25 float16, 2**-134 bfloat16, 2**-150
  float32): below the smallest normal (6.1e-5 in float16) the spacing stops shrinking, so the
  relative error of a stored value is not bounded by u_O. It matters for float16 alpha of the
  100k-in-edge super node: its ~1e5 weights are ~1e-5 to 1e-7, float16 subnormals, whose
  round-to-nearest error of up to 3e-8 is up to 10% of the value. (A wrong scale of those
  weights, ~1e-5, is still far above c eta_O = 1.2e-7.) out rows are bounded by ||A_r|| (a
  row magnitude, not per element), which is far above eta_O, as are the gradient bounds'
  rms terms, so eta_O only enters alpha.
- *Gradients* in the dtype of their tensor (u_T: x_src, x_dst, edge_term; att's own dtype for
  datt): float32 sums cast once, so u_T ||want_r|| plus float32 noise, which we allow as
  eps-relative to the row and to the tensor's root-mean-square row norm (rows whose terms
  cancel keep the noise of their terms, about the size of a typical row). The backward also
  reads the saved out and the returned alpha rounded to u_O: delta_i = <dO_i, O_i> (+ sum_j
  alpha_ij grad_alpha_ij) is off by at most
      delta_err_i = u_O (sum_d |dO_i O_i| + sum_j alpha_ij |grad_alpha_ij|),
  which shifts de_ij by alpha_ij delta_err_i =: W_ij, hence dz_ij by at most W_ij ||att_h||
  (|LeakyReLU'| <= 1): B = W ||att_h|| for an edge_term row, sum over the row's in-edges
  (dx_dst) or out-edges (dx_src) of it, and ||sum_e W_e |LeakyReLU(z_e)| || for datt. So
      ||g_r - want_r|| <= c [ (u_T + eps) (||want_r|| + rms_r' ||want_r'||) + B_r ].
  grad_out is given in out_dtype and fed to the reference as the same values.
c = 4 everywhere (the derivation gives 1 to 2 for each term; the rest is margin).
Graphs: bipartite with empty rows, self loops, duplicate edges, a destination split into
chunks (600 extra in-edges) and a split source row (700 out-edges); a 3000-node graph with a
100k-in-edge super node and a 5000-out-edge hub source. D in {8, 32, 64, 100, 128, 256};
out_dtype T and float32; att in T and in float32 (a parameter under autocast); both
source-gradient variants (atomic, transposed); and a symmetric multigraph (the 20k-edge super
node both ways) with the one-pass undirected backward (fused) as well.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gnn_fastpath import Graph, reference
from gnn_fastpath.cuda import gatv2_attention as kernels
from gnn_fastpath.ops import gatv2_attention
from test_gatv2_kernels import _with_hub_source, spy_fused
from zoo import random_edges, undirected

pytestmark = pytest.mark.cuda

HALF = (torch.float16, torch.bfloat16)
U = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
EPS = 2.0**-14
#: Half the subnormal spacing: the absolute part of rounding to each dtype (module docstring).
ETA = {torch.float16: 2.0**-25, torch.bfloat16: 2.0**-134, torch.float32: 2.0**-150}
C = 4.0
VARIANTS = ("atomic", "transposed")
UNDIRECTED_VARIANTS = VARIANTS + ("fused",)
BWD_ENV = "GNN_FASTPATH_GATV2_BWD"
SLOPE = 0.2


# ------------------------------------------------------------------------------- graphs
@pytest.fixture(scope="module")
def small():
    """(Graph, edge_index) as in test_gatv2_kernels.small_graph."""
    n_src, n_dst = 120, 90
    ei, _ = random_edges(n_src, n_dst, 900, seed=3, empty_rows=5, super_node_degree=600)
    ei = _with_hub_source(ei, n_dst - 5).cuda()
    return Graph.from_edge_index(ei, num_nodes=(n_src, n_dst)), ei


@pytest.fixture(scope="module")
def big():
    """3000 nodes, destination 0 with 100k extra in-edges, a 5000-out-edge hub source."""
    n = 3000
    ei, _ = random_edges(n, n, 30_000, seed=5, empty_rows=40, super_node_degree=100_000)
    ei = _with_hub_source(ei, n - 40, hub=7, degree=5000, seed=2).cuda()
    return Graph.from_edge_index(ei, num_nodes=n), ei


@pytest.fixture(scope="module")
def sym():
    """3000 nodes, edges both ways: a 40000-edge node (split rows as destination and source),
    empty rows, self loops, duplicates."""
    n = 3000
    ei, _ = random_edges(n, n, 20_000, seed=6, empty_rows=40, super_node_degree=20_000)
    ei = undirected(ei).cuda()
    graph = Graph.from_edge_index(ei, num_nodes=n)
    assert graph.is_symmetric()
    return graph, ei


# ------------------------------------------------------------------------------- helpers
def _inputs(graph, H, D, dtype, att_dtype, out_dtype, edge_term, seed=0, offset=0):
    """Leaves in ``dtype`` (att in ``att_dtype``), grad_out and grad_alpha in ``out_dtype``.
    ``offset``: x_src starts that many elements into its storage (misaligned rows)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape, scale=1.0, dt=dtype, off=0):
        n = math.prod(shape)
        t = (torch.randn(n + off, device="cuda", generator=gen) * scale).to(dt)[off:]
        return t.view(*shape).requires_grad_()

    xs = randn(graph.n_src, H, D, off=offset)
    xd = randn(graph.n_dst, H, D)
    att = randn(H, D, scale=1.0 / math.sqrt(D), dt=att_dtype)
    et = randn(graph.num_edges, H, D, scale=0.5) if edge_term else None
    g_out = torch.randn(graph.n_dst, H, D, device="cuda", generator=gen).to(out_dtype)
    g_alpha = torch.randn(graph.num_edges, H, device="cuda", generator=gen).to(out_dtype)
    return xs, xd, att, et, g_out, g_alpha


def _leaves(*ts):
    return [t for t in ts if t is not None]


def _run(graph, xs, xd, att, et, g_out, g_alpha, out_dtype):
    """(out, alpha, grads) of the op; loss = <out, g_out> + <alpha, g_alpha> (float64 sums of
    the exact products, so the incoming gradients are exactly g_out and g_alpha)."""
    out, alpha = gatv2_attention(graph, xs, xd, att, SLOPE, et, True, 0.0, out_dtype=out_dtype)
    loss = (out.double() * g_out.double()).sum()
    if g_alpha is not None:
        loss = loss + (alpha.double() * g_alpha.double()).sum()
    return out, alpha, torch.autograd.grad(loss, _leaves(xs, xd, att, et))


def _reference(graph, ei, xs, xd, att, et, g_out, g_alpha):
    """float64: out, alpha, grads, and the magnitudes of the bound (module docstring):
    A (out rows), W [M, H] (delta error per unit u_O, times alpha) and z."""
    xs, xd, att, et = [None if t is None else t.detach().double().requires_grad_() for t in (xs, xd, att, et)]
    out, alpha = reference.gatv2_attention(graph, xs, xd, att, SLOPE, et, True, 0.0)
    loss = (out * g_out.double()).sum()
    if g_alpha is not None:
        loss = loss + (alpha * g_alpha.double()).sum()
    grads = torch.autograd.grad(loss, _leaves(xs, xd, att, et))
    with torch.no_grad():
        src, dst = ei[0], ei[1]
        alpha, out = alpha.detach(), out.detach()
        A = torch.zeros_like(out).index_add_(0, dst, alpha.unsqueeze(-1) * xs[src].abs())
        delta_err = (g_out.double() * out).abs().sum(-1)  # [N_dst, H], per unit u_O
        if g_alpha is not None:
            delta_err.index_add_(0, dst, alpha * g_alpha.double().abs())
        W = alpha * delta_err[dst]  # [M, H]
        z = xs[src] + xd[dst] + (et if et is not None else 0.0)
    return out, alpha, grads, dict(A=A, W=W, z=z, src=src, dst=dst, att=att.detach())


def _check_rows(name, got, want, tol):
    """Row norms (last dim) of got - want within ``tol`` (broadcast over the rows)."""
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    err = (got.double() - want).norm(dim=-1)
    tol = torch.as_tensor(tol, dtype=torch.float64, device=err.device).expand_as(err)
    bad = err > tol
    if bad.any():
        ratio = (err / tol.clamp_min(1e-300)).max().item()
        pytest.fail(f"{name}: {int(bad.sum())} of {bad.numel()} rows beyond the bound (worst err/bound {ratio:.2f})")


def _compare(tag, got, want, dtypes):
    """Every output and gradient of ``got`` against ``want`` within the module's bounds.
    ``dtypes``: (T, att dtype, out dtype)."""
    T, att_dtype, out_dtype = dtypes
    out, alpha, grads = got
    rout, ralpha, rgrads, m = want
    uo, ut = U[out_dtype], U[T]
    assert out.dtype == alpha.dtype == out_dtype, f"{tag}: output dtypes {out.dtype}, {alpha.dtype}"
    _check_rows(f"{tag} out", out, rout, C * (uo + EPS) * m["A"].norm(dim=-1))
    _check_rows(f"{tag} alpha", alpha.unsqueeze(-1), ralpha.unsqueeze(-1),
                C * ((uo + EPS) * ralpha.abs() + ETA[out_dtype]))

    W = uo * m["W"]  # [M, H]
    att_norm = m["att"].norm(dim=-1)  # [H]
    per_edge = W * att_norm
    B = {
        "dx_src": torch.zeros(rgrads[0].shape[:2], dtype=torch.float64, device=W.device).index_add_(0, m["src"], per_edge),
        "dx_dst": torch.zeros(rgrads[1].shape[:2], dtype=torch.float64, device=W.device).index_add_(0, m["dst"], per_edge),
        "datt": (W.unsqueeze(-1) * F.leaky_relu(m["z"], SLOPE).abs()).sum(0).norm(dim=-1),
        "d_edge_term": per_edge,
    }
    names = ["dx_src", "dx_dst", "datt"] + (["d_edge_term"] if len(grads) == 4 else [])
    for name, g, r in zip(names, grads, rgrads):
        u = U[att_dtype] if name == "datt" else ut
        want_dtype = att_dtype if name == "datt" else T
        assert g.dtype == want_dtype, f"{tag} {name}: dtype {g.dtype}, expected {want_dtype}"
        rows = r.norm(dim=-1)
        rms = rows.pow(2).mean().sqrt() if rows.numel() else 0.0
        _check_rows(f"{tag} {name}", g, r, C * ((u + EPS) * (rows + rms) + B[name]))


def _check(monkeypatch, graph_and_ei, H, D, dtype, out_fp32, edge_term, att_fp32=False, alpha_grad=True,
           seed=0, offset=0, vw=None, variants=VARIANTS):
    graph, ei = graph_and_ei
    out_dtype = torch.float32 if out_fp32 else dtype
    att_dtype = torch.float32 if att_fp32 else dtype
    xs, xd, att, et, g_out, g_alpha = _inputs(graph, H, D, dtype, att_dtype, out_dtype, edge_term, seed, offset)
    g_alpha = g_alpha if alpha_grad else None
    if vw is not None:
        assert kernels._config(D, xs.detach(), xd, att.detach().float(), et).vw == vw
    want = _reference(graph, ei, xs, xd, att, et, g_out, g_alpha)
    fused = spy_fused(monkeypatch)
    for variant in variants:
        monkeypatch.setenv(BWD_ENV, variant)
        got = _run(graph, xs, xd, att, et, g_out, g_alpha, out_dtype)
        tag = f"{dtype} out={out_dtype} att={att_dtype} H={H} D={D} et={edge_term} {variant}"
        _compare(tag, got, want, (dtype, att_dtype, out_dtype))
        assert len(fused) == (variant == "fused"), f"{tag}: the fused kernel did not run"
        fused.clear()


# ------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("edge_term", [False, True])
@pytest.mark.parametrize("D", [8, 32, 64, 100, 128, 256])
@pytest.mark.parametrize("out_fp32", [False, True])
@pytest.mark.parametrize("dtype", HALF)
def test_small_graph(monkeypatch, small, dtype, out_fp32, D, edge_term):
    _check(monkeypatch, small, 2, D, dtype, out_fp32, edge_term, seed=D + 7 * edge_term)


@pytest.mark.parametrize("H,D", [(1, 32), (3, 100), (4, 64), (8, 256), (3, 6), (2, 7)])
@pytest.mark.parametrize("dtype", HALF)
def test_heads_and_odd_widths(monkeypatch, small, dtype, H, D):
    _check(monkeypatch, small, H, D, dtype, False, True, seed=H * 100 + D)


@pytest.mark.parametrize("H,D,edge_term", [(2, 64, False), (1, 32, True), (4, 100, True), (2, 256, False),
                                           (1, 8, False)])
@pytest.mark.parametrize("out_fp32", [False, True])
@pytest.mark.parametrize("dtype", HALF)
def test_super_node(monkeypatch, big, dtype, out_fp32, H, D, edge_term):
    assert int(big[0].in_degree().max()) >= 100_000
    _check(monkeypatch, big, H, D, dtype, out_fp32, edge_term, seed=D)


@pytest.mark.parametrize("H,D,edge_term", [(2, 64, True), (1, 32, False), (3, 100, True), (1, 256, False),
                                           (2, 7, True)])
@pytest.mark.parametrize("out_fp32", [False, True])
@pytest.mark.parametrize("dtype", HALF)
def test_undirected_graph(monkeypatch, sym, dtype, out_fp32, H, D, edge_term):
    _check(monkeypatch, sym, H, D, dtype, out_fp32, edge_term, seed=H * 10 + D, variants=UNDIRECTED_VARIANTS)


@pytest.mark.parametrize("dtype", HALF)
def test_undirected_float32_att_and_vector_widths(monkeypatch, sym, dtype):
    """The one-pass backward with a float32 att (autocast's case), and with 8 elements per
    lane (GNN_FASTPATH_VEC16=16)."""
    _check(monkeypatch, sym, 2, 64, dtype, False, True, att_fp32=True, seed=5, variants=UNDIRECTED_VARIANTS)
    monkeypatch.setenv("GNN_FASTPATH_VEC16", "16")
    _check(monkeypatch, sym, 2, 64, dtype, True, True, seed=6, vw=8, variants=UNDIRECTED_VARIANTS)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("alpha_grad", [False, True])
def test_float32_att_parameter(monkeypatch, small, big, dtype, alpha_grad):
    """Autocast's case: 16-bit projections, float32 att; datt comes back in float32."""
    _check(monkeypatch, small, 2, 64, dtype, False, True, att_fp32=True, alpha_grad=alpha_grad, seed=3)
    _check(monkeypatch, big, 4, 64, dtype, True, False, att_fp32=True, alpha_grad=alpha_grad, seed=4)


@pytest.mark.parametrize("offset,vw", [(0, 8), (4, 4), (2, 2), (1, 1)])
@pytest.mark.parametrize("dtype", HALF)
def test_vector_widths_and_misaligned_rows(monkeypatch, small, dtype, offset, vw):
    """With GNN_FASTPATH_VEC16=16, 16-byte aligned rows take 8 elements per lane; rows offset
    by 8, 4 or 2 bytes narrower vectors. (By default GATv2 reads 16-bit rows with the float32
    lane layout, 4 elements per lane: every other test here runs that path.)"""
    monkeypatch.setenv("GNN_FASTPATH_VEC16", "16")
    _check(monkeypatch, small, 2, 64, dtype, False, True, seed=offset, offset=offset, vw=vw)


@pytest.mark.parametrize("dtype", HALF)
def test_autocast_changes_nothing(monkeypatch, small, dtype):
    """Forward bit-identical under an ambient autocast of the other 16-bit dtype; gradients
    equal up to the summation order of atomics, which differs from run to run with or
    without autocast (split-row chunks of dx_dst, and datt: per-block shared-memory then
    global float32 atomics). Two float32 sums of the same terms in different orders differ
    by float32 noise, allowed as eps times the element and the tensor's rms (the module's
    model); a 16-bit gradient is that float32 sum rounded once, so the two roundings may
    land one unit apart more: 2 u_T |a|. datt here is float32 (att a float32 parameter), so
    only the noise term applies to it: its entries (~10) differ by ~1e-6 = ~1e-7 relative,
    a few float32 ulps, under 1/100 of the noise term; autocast computing anything in 16 bits would
    move them by up to u_16 relative (4.9e-4 float16, 3.9e-3 bfloat16), beyond eps (6e-5)
    times |a| + rms (<= 3 |a|) for the larger entries."""
    graph, _ = small
    monkeypatch.setenv(BWD_ENV, "transposed")
    xs, xd, att, et, g_out, _ = _inputs(graph, 2, 64, dtype, torch.float32, dtype, True, seed=9)
    plain = _run(graph, xs, xd, att, et, g_out, None, None)
    with torch.autocast("cuda", dtype=torch.bfloat16 if dtype == torch.float16 else torch.float16):
        under = _run(graph, xs, xd, att, et, g_out, None, None)
    assert torch.equal(plain[0], under[0]) and torch.equal(plain[1], under[1])
    for a, b in zip(plain[2], under[2]):  # atomics: summation order may differ, then one rounding
        assert a.dtype == b.dtype
        u = U[a.dtype]
        a, b = a.double(), b.double()
        noise = EPS * (a.abs() + a.pow(2).mean().sqrt())  # float32 reordering (docstring)
        assert ((a - b).abs() <= 2 * u * a.abs() + noise).all()


@pytest.mark.parametrize("dtype", HALF)
def test_dropout_mask_matches_float32(small, dtype):
    """The Philox mask depends on (seed, offset, edge, head) only: the same as float32's."""
    graph, _ = small
    xs, xd, att, et, _, _ = _inputs(graph, 2, 64, dtype, dtype, torch.float32, True, seed=12)
    torch.manual_seed(77)
    _, dropped = gatv2_attention(graph, xs, xd, att, SLOPE, et, "dropped", 0.3, out_dtype=torch.float32)
    torch.manual_seed(77)
    _, dropped32 = gatv2_attention(graph, xs.float(), xd.float(), att.float(), SLOPE, et.float(), "dropped", 0.3)
    assert torch.equal(dropped != 0, dropped32 != 0)
    assert torch.allclose(dropped, dropped32, rtol=1e-4, atol=1e-7)


def test_out_dtype_is_checked(small):
    graph, _ = small
    xs, xd, att, et, _, _ = _inputs(graph, 2, 32, torch.bfloat16, torch.bfloat16, torch.bfloat16, False)
    for bad in (torch.float16, torch.float64):
        with pytest.raises(ValueError, match="out_dtype"):
            gatv2_attention(graph, xs, xd, att, out_dtype=bad)
