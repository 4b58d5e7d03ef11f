r"""Fused GAT attention in float16 and bfloat16 against the float64 reference.

Every check compares the kernels on 16-bit inputs with ``gnn_fastpath.reference`` run in
float64 on the SAME values (upcast), so input rounding is not an error here; what is left
(the model of test_gatv2_attention_half.py, adapted to GAT's scalar logits):

- *Outputs* (out, alpha) in ``out_dtype`` with unit roundoff u_O (2**-8 bfloat16, 2**-11
  float16, 2**-24 float32). The kernels compute in float32 and round once at the store; the
  float32 part (logits, exp, online-softmax rescaling, chunk merges) is bounded by eps =
  2**-14 of the row's absolute magnitude. Row r = (node, head), a D-vector; A_r = sum_j
  alpha_rj w_rj |x_src j| bounds the row and its partial sums, so
      ||out_r - want_r|| <= c (u_O + eps) ||A_r||,
      |alpha_e - want_e| <= c ((u_O + eps) |want_e| + eta_O),
  eta_O the absolute part of rounding to out_dtype (half the subnormal spacing: float16
  weights of the super node's ~1e5 edges are subnormals).
- *Gradients* in the dtype of their tensor (u_T: x_src; u_S: each score tensor's and the
  edge weight's own dtype): float32 sums cast once, so u ||want_r|| plus float32 noise, which
  we allow as eps-relative to the row and to the tensor's root-mean-square row norm. The
  backward also reads the saved out and the returned alpha rounded to u_O: delta_i = <dO_i,
  O_i> (+ sum_j alpha_ij grad_alpha_ij) is off by at most
      delta_err_i = u_O (sum_d |dO_i O_i| + sum_j alpha_ij |grad_alpha_ij|),
  which shifts de_ij by alpha_ij delta_err_i =: W_ij and dz_ij by at most W_ij (|LeakyReLU'|
  <= 1 for the slope 0.2). dz enters d score_src (sum over a source's out-edges of W), d
  score_dst (over a destination's in-edges) and d edge_score (W itself); dx_src = sum f alpha
  dO and d edge_weight = sum_h alpha g do not depend on delta. So
      ||g_r - want_r|| <= c [ (u + eps) (||want_r|| + rms_r' ||want_r'||) + ||B_r|| ].
  Rows: [N, H, D] tensors per (node, head); [N, H] and [M, H] tensors per node or edge
  (the error vector over heads, bounded by the norm of B over heads); edge_weight per edge.
c = 4 everywhere (the derivation gives 1 to 2 for each term; the rest is margin).
Graphs: bipartite with empty rows, self loops, duplicate edges, a destination split into
chunks (600 extra in-edges) and a split source row (700 out-edges); a 3000-node graph with a
100k-in-edge super node and a 5000-out-edge hub source. D in {8, 32, 64, 100, 128, 256} and
odd widths; out_dtype T and float32; scores and edge weight in T and in float32 (parameters or
float32 projections under autocast); both backward variants (atomic, transposed).
"""
from __future__ import annotations

import math

import pytest
import torch

from gnn_fastpath import Graph, reference
from gnn_fastpath.cuda import gat_attention as kernels
from gnn_fastpath.ops import gat_attention
from test_gatv2_kernels import _with_hub_source
from zoo import random_edges

pytestmark = pytest.mark.cuda

DEVICE = torch.device("cuda")
HALF = (torch.float16, torch.bfloat16)
U = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
EPS = 2.0**-14
#: Half the subnormal spacing: the absolute part of rounding to each dtype (module docstring).
ETA = {torch.float16: 2.0**-25, torch.bfloat16: 2.0**-134, torch.float32: 2.0**-150}
C = 4.0
VARIANTS = kernels.BACKWARDS
SLOPE = 0.2
#: Extra in-edges of the super node of ``big``.
SUPER_DEGREE = 100_000
NAMES = ("x_src", "score_src", "score_dst", "edge_score", "edge_weight")


# ------------------------------------------------------------------------------- graphs
@pytest.fixture(scope="module")
def small():
    """(Graph, edge_index) as in test_gat_kernels.small_graph."""
    n_src, n_dst = 120, 90
    ei, _ = random_edges(n_src, n_dst, 900, seed=3, empty_rows=5, super_node_degree=600)
    ei = _with_hub_source(ei, n_dst - 5).to(DEVICE)
    return Graph.from_edge_index(ei, num_nodes=(n_src, n_dst)), ei


@pytest.fixture(scope="module")
def big():
    """3000 nodes, destination 0 with SUPER_DEGREE extra in-edges, a 5000-out-edge hub source."""
    n = 3000
    ei, _ = random_edges(n, n, 30_000, seed=5, empty_rows=40, super_node_degree=SUPER_DEGREE)
    ei = _with_hub_source(ei, n - 40, hub=7, degree=5000, seed=2).to(DEVICE)
    return Graph.from_edge_index(ei, num_nodes=n), ei


# ------------------------------------------------------------------------------- helpers
def _inputs(graph, H, D, dtype, score_dtype, out_dtype, extras=True, seed=0, offset=0):
    """Leaves (x_src in ``dtype``; scores, edge score and weight in ``score_dtype``; the edge
    ones None without ``extras``), grad_out and grad_alpha in ``out_dtype``. ``offset``: x_src
    starts that many elements into its storage (misaligned rows)."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def randn(*shape, scale=1.0, dt=score_dtype, off=0):
        n = math.prod(shape)
        t = (torch.randn(n + off, device=DEVICE, generator=gen) * scale).to(dt)[off:]
        return t.view(*shape).requires_grad_()

    xs = randn(graph.n_src, H, D, dt=dtype, off=offset)
    s, t = randn(graph.n_src, H), randn(graph.n_dst, H)
    u = randn(graph.num_edges, H, scale=0.5) if extras else None
    w = ((torch.rand(graph.num_edges, device=DEVICE, generator=gen) + 0.5).to(score_dtype).requires_grad_()
         if extras else None)
    g_out = torch.randn(graph.n_dst, H, D, device=DEVICE, generator=gen).to(out_dtype)
    g_alpha = torch.randn(graph.num_edges, H, device=DEVICE, generator=gen).to(out_dtype)
    return (xs, s, t, u, w), g_out, g_alpha


def _leaves(ins):
    return [t for t in ins if t is not None]


def _run(graph, ins, g_out, g_alpha, out_dtype):
    """(out, alpha, grads) of the op; loss = <out, g_out> + <alpha, g_alpha> (float64 sums of
    the exact products, so the incoming gradients are exactly g_out and g_alpha)."""
    xs, s, t, u, w = ins
    out, alpha = gat_attention(graph, xs, s, t, u, SLOPE, True, 0.0, w, out_dtype=out_dtype)
    loss = (out.double() * g_out.double()).sum()
    if g_alpha is not None:
        loss = loss + (alpha.double() * g_alpha.double()).sum()
    return out, alpha, torch.autograd.grad(loss, _leaves(ins))


def _reference(graph, ei, ins, g_out, g_alpha):
    """float64: out, alpha, grads, and the magnitudes of the bound (module docstring)."""
    ins64 = [None if t is None else t.detach().double().requires_grad_() for t in ins]
    xs, s, t, u, w = ins64
    out, alpha = reference.gat_attention(graph, xs, s, t, u, SLOPE, True, 0.0, w)
    loss = (out * g_out.double()).sum()
    if g_alpha is not None:
        loss = loss + (alpha * g_alpha.double()).sum()
    grads = torch.autograd.grad(loss, _leaves(ins64))
    with torch.no_grad():
        src, dst = ei[0], ei[1]
        alpha, out = alpha.detach(), out.detach()
        aw = alpha * (w.detach().unsqueeze(-1) if w is not None else 1.0)
        A = torch.zeros_like(out).index_add_(0, dst, aw.unsqueeze(-1) * xs.detach()[src].abs())
        delta_err = (g_out.double() * out).abs().sum(-1)  # [N_dst, H], per unit u_O
        if g_alpha is not None:
            delta_err.index_add_(0, dst, alpha * g_alpha.double().abs())
        W = alpha * delta_err[dst]  # [M, H]
    return out, alpha, grads, dict(A=A, W=W, src=src, dst=dst)


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


def _compare(tag, got, want, ins, out_dtype):
    out, alpha, grads = got
    rout, ralpha, rgrads, m = want
    uo = U[out_dtype]
    assert out.dtype == alpha.dtype == out_dtype, f"{tag}: output dtypes {out.dtype}, {alpha.dtype}"
    _check_rows(f"{tag} out", out, rout, C * (uo + EPS) * m["A"].norm(dim=-1))
    _check_rows(f"{tag} alpha", alpha.unsqueeze(-1), ralpha.unsqueeze(-1),
                C * ((uo + EPS) * ralpha.abs() + ETA[out_dtype]))
    W = uo * m["W"]  # [M, H]
    n_src, n_dst = rgrads[0].shape[0], ins[2].shape[0]
    H = W.shape[1]
    zeros = dict(dtype=torch.float64, device=W.device)
    B = {
        "x_src": torch.zeros(rgrads[0].shape[:2], **zeros),
        "score_src": torch.zeros(n_src, H, **zeros).index_add_(0, m["src"], W).norm(dim=-1),
        "score_dst": torch.zeros(n_dst, H, **zeros).index_add_(0, m["dst"], W).norm(dim=-1),
        "edge_score": W.norm(dim=-1),
        "edge_weight": torch.zeros(W.shape[0], **zeros),
    }
    names = [n for n, t in zip(NAMES, ins) if t is not None]
    for name, g, r, x in zip(names, grads, rgrads, _leaves(ins)):
        assert g.dtype == x.dtype, f"{tag} d{name}: dtype {g.dtype}, expected {x.dtype}"
        if g.dim() == 1:  # edge_weight: one value per edge
            g, r = g.unsqueeze(-1), r.unsqueeze(-1)
        rows = r.norm(dim=-1)
        rms = rows.pow(2).mean().sqrt() if rows.numel() else 0.0
        _check_rows(f"{tag} d{name}", g, r, C * ((U[x.dtype] + EPS) * (rows + rms) + B[name]))


def _check(monkeypatch, graph_and_ei, H, D, dtype, out_fp32, extras=True, scores_fp32=False, alpha_grad=True,
           seed=0, offset=0, vw=None):
    graph, ei = graph_and_ei
    out_dtype = torch.float32 if out_fp32 else dtype
    score_dtype = torch.float32 if scores_fp32 else dtype
    ins, g_out, g_alpha = _inputs(graph, H, D, dtype, score_dtype, out_dtype, extras, seed, offset)
    g_alpha = g_alpha if alpha_grad else None
    if vw is not None:
        assert kernels._config(D, ins[0].detach()).vw == vw
    want = _reference(graph, ei, ins, g_out, g_alpha)
    for variant in VARIANTS:
        monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", variant)
        got = _run(graph, ins, g_out, g_alpha, out_dtype)
        tag = f"{dtype} out={out_dtype} scores={score_dtype} H={H} D={D} extras={extras} {variant}"
        _compare(tag, got, want, ins, out_dtype)


# ------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("extras", [False, True])
@pytest.mark.parametrize("D", [8, 32, 64, 100, 128, 256])
@pytest.mark.parametrize("out_fp32", [False, True])
@pytest.mark.parametrize("dtype", HALF)
def test_small_graph(monkeypatch, small, dtype, out_fp32, D, extras):
    _check(monkeypatch, small, 2, D, dtype, out_fp32, extras, seed=D + 7 * extras)


@pytest.mark.parametrize("H,D", [(1, 32), (3, 100), (4, 64), (8, 256), (3, 6), (2, 7)])
@pytest.mark.parametrize("dtype", HALF)
def test_heads_and_odd_widths(monkeypatch, small, dtype, H, D):
    _check(monkeypatch, small, H, D, dtype, False, True, seed=H * 100 + D)


@pytest.mark.parametrize("H,D,extras", [(2, 64, False), (1, 32, True), (4, 100, True), (2, 256, False),
                                        (1, 8, False)])
@pytest.mark.parametrize("out_fp32", [False, True])
@pytest.mark.parametrize("dtype", HALF)
def test_super_node(monkeypatch, big, dtype, out_fp32, H, D, extras):
    assert int(big[0].in_degree().max()) >= SUPER_DEGREE
    _check(monkeypatch, big, H, D, dtype, out_fp32, extras, seed=D)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("alpha_grad", [False, True])
def test_float32_scores(monkeypatch, small, big, dtype, alpha_grad):
    """Autocast's case: 16-bit features, float32 scores and edge weight (parameters, or
    float32 reductions); their gradients come back in float32."""
    _check(monkeypatch, small, 2, 64, dtype, False, True, scores_fp32=True, alpha_grad=alpha_grad, seed=3)
    _check(monkeypatch, big, 4, 64, dtype, True, True, scores_fp32=True, alpha_grad=alpha_grad, seed=4)


@pytest.mark.parametrize("offset,vw", [(0, 8), (4, 4), (2, 2), (1, 1)])
@pytest.mark.parametrize("dtype", HALF)
def test_vector_widths_and_misaligned_rows(monkeypatch, small, dtype, offset, vw):
    """With GNN_FASTPATH_VEC16=16, 16-byte aligned rows take 8 elements per lane; rows offset
    by 8, 4 or 2 bytes narrower vectors (by default the float32 lane layout, 4 per lane)."""
    monkeypatch.setenv("GNN_FASTPATH_VEC16", "16")
    _check(monkeypatch, small, 2, 64, dtype, False, True, seed=offset, offset=offset, vw=vw)


@pytest.mark.parametrize("dtype", HALF)
def test_autocast_changes_nothing(monkeypatch, small, dtype):
    """Forward bit-identical under an ambient autocast of the other 16-bit dtype; gradients
    equal up to the summation order of atomics (split-row chunks, d score_dst in the
    transposed variant, d edge_weight): eps times the element and the tensor's rms, plus one
    unit of the gradient's dtype for the final rounding (as test_gatv2_attention_half)."""
    graph, _ = small
    for variant in VARIANTS:
        monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", variant)
        ins, g_out, _ = _inputs(graph, 2, 64, dtype, torch.float32, dtype, True, seed=9)
        plain = _run(graph, ins, g_out, None, None)
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16 if dtype == torch.float16 else torch.float16):
            under = _run(graph, ins, g_out, None, None)
        assert torch.equal(plain[0], under[0]) and torch.equal(plain[1], under[1])
        for a, b in zip(plain[2], under[2]):
            assert a.dtype == b.dtype
            u = U[a.dtype]
            a, b = a.double(), b.double()
            noise = EPS * (a.abs() + a.pow(2).mean().sqrt())
            assert ((a - b).abs() <= 2 * u * a.abs() + noise).all()


@pytest.mark.parametrize("dtype", HALF)
def test_dropout_mask_matches_float32(small, dtype):
    """The Philox mask depends on (seed, offset, edge, head) only: the same as float32's."""
    graph, _ = small
    ins, _, _ = _inputs(graph, 2, 64, dtype, dtype, torch.float32, True, seed=12)
    xs, s, t, u, w = [x.detach() for x in ins]
    torch.manual_seed(77)
    _, dropped = gat_attention(graph, xs, s, t, u, SLOPE, "dropped", 0.3, w, out_dtype=torch.float32)
    torch.manual_seed(77)
    _, dropped32 = gat_attention(graph, xs.float(), s.float(), t.float(), u.float(), SLOPE, "dropped", 0.3,
                                 w.float())
    assert torch.equal(dropped != 0, dropped32 != 0)
    assert torch.allclose(dropped, dropped32, rtol=1e-4, atol=1e-7)


def test_out_dtype_is_checked(small):
    graph, _ = small
    ins, _, _ = _inputs(graph, 2, 32, torch.bfloat16, torch.bfloat16, torch.bfloat16, False)
    for bad in (torch.float16, torch.float64):
        with pytest.raises(ValueError, match="out_dtype"):
            gat_attention(graph, *ins[:3], out_dtype=bad)
