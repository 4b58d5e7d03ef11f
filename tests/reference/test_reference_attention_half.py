"""Reference GATv2 attention in half precision (CPU): dtypes and values.

The reference computes 16-bit inputs in float32 and rounds the result once to ``out_dtype``,
so against the float64 reference on the same 16-bit values (upcast) every element of out
and alpha is within u |want| + (float32 arithmetic, ~1e-6 of the row's magnitude), with u
the unit roundoff of out_dtype (2**-8 bfloat16, 2**-11 float16, 2**-24 float32). Gradients
come back in each input's dtype (float32 sums, one rounding): within 2 u of the float64
gradient of the same computation, plus float32 noise, relative to the tensor's scale.
"""
import pytest
import torch

from gnn_fastpath import ops, reference
from zoo import small_graphs

HALF = (torch.float16, torch.bfloat16)
U = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
H, D = 2, 8
FP32_NOISE = 1e-5


@pytest.fixture(scope="module")
def graphs():
    return small_graphs()


def _inputs(graph, dtype, att_dtype, seed=0, edge_term=True):
    gen = torch.Generator().manual_seed(seed)

    def leaf(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen).to(dt).requires_grad_()

    et = leaf(graph.num_edges, H, D) if edge_term else None
    return leaf(graph.n_src, H, D), leaf(graph.n_dst, H, D), leaf(H, D, dt=att_dtype), et


def _upcast(ts):
    return [None if t is None else t.detach().double().requires_grad_() for t in ts]


def _leaves(ts):
    return [t for t in ts if t is not None]


def _check(name, got, want, u):
    """|got - want| <= u |want| + FP32_NOISE * scale, elementwise (scale: want's max)."""
    assert got.shape == want.shape, name
    got, want = got.double(), want.double()
    scale = want.abs().max().item() if want.numel() else 0.0
    bound = u * want.abs() + FP32_NOISE * max(scale, 1e-30)
    worst = ((got - want).abs() - bound).max().item() if want.numel() else -1.0
    assert worst <= 0, f"{name}: error exceeds u |want| + noise by {worst:.3e} (u = {u:.2e})"


@pytest.mark.parametrize("name", ["homogeneous", "bipartite_wide", "bipartite_tall", "no_edges"])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("att_fp32", [False, True])
@pytest.mark.parametrize("out_fp32", [False, True])
def test_gatv2_half_values_and_dtypes(graphs, name, dtype, att_fp32, out_fp32):
    graph = graphs[name][3]
    att_dtype = torch.float32 if att_fp32 else dtype
    out_dtype = torch.float32 if out_fp32 else None
    xs, xd, att, et = _inputs(graph, dtype, att_dtype, seed=len(name))
    out, alpha = reference.gatv2_attention(graph, xs, xd, att, 0.2, et, True, 0.0, out_dtype=out_dtype)
    want_dtype = out_dtype or dtype
    assert out.dtype == alpha.dtype == want_dtype

    xs64, xd64, att64, et64 = _upcast((xs, xd, att, et))
    out64, alpha64 = reference.gatv2_attention(graph, xs64, xd64, att64, 0.2, et64, True, 0.0)
    u = U[want_dtype]
    _check("out", out, out64, u)
    _check("alpha", alpha, alpha64, u)

    g_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(want_dtype)
    g_alpha = torch.randn(alpha.shape, generator=torch.Generator().manual_seed(2)).to(want_dtype)
    grads = torch.autograd.grad((out.double() * g_out.double()).sum() + (alpha.double() * g_alpha.double()).sum(),
                                _leaves((xs, xd, att, et)), allow_unused=True)
    want = torch.autograd.grad((out64 * g_out.double()).sum() + (alpha64 * g_alpha.double()).sum(),
                               _leaves((xs64, xd64, att64, et64)), allow_unused=True)
    for leaf, g, w in zip(_leaves((xs, xd, att, et)), grads, want):
        if g is None:  # no edges: nothing reaches the inputs
            assert graph.num_edges == 0
            continue
        assert g.dtype == leaf.dtype
        _check(f"grad {tuple(leaf.shape)}", g, w, 2 * U[leaf.dtype])


@pytest.mark.parametrize("dtype", HALF)
def test_gatv2_half_ignores_autocast(graphs, dtype):
    graph = graphs["homogeneous"][3]
    xs, xd, att, et = _inputs(graph, dtype, torch.float32, seed=5)
    plain = reference.gatv2_attention(graph, xs, xd, att, 0.2, et, True, 0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = reference.gatv2_attention(graph, xs, xd, att, 0.2, et, True, 0.0)
    for p, a in zip(plain, under):
        assert p.dtype == a.dtype == dtype
        assert torch.equal(p, a)


def test_gatv2_float64_is_computed_in_float64(graphs):
    graph = graphs["homogeneous"][3]
    xs, xd, att, et = _inputs(graph, torch.float64, torch.float64, seed=6)
    out = reference.gatv2_attention(graph, xs, xd, att, 0.2, et)
    assert out.dtype == torch.float64
    out32 = reference.gatv2_attention(graph, xs, xd, att, 0.2, et, out_dtype=torch.float32)
    assert out32.dtype == torch.float32 and torch.equal(out32, out.float())


@pytest.mark.parametrize("dtype", HALF)
def test_gatv2_op_on_cpu_takes_half_and_checks_out_dtype(graphs, dtype):
    graph = graphs["bipartite_wide"][3]
    xs, xd, att, et = _inputs(graph, dtype, torch.float32, seed=7)
    out = ops.gatv2_attention(graph, xs, xd, att, 0.2, et)
    assert out.dtype == dtype
    out32, alpha32 = ops.gatv2_attention(graph, xs, xd, att, 0.2, et, return_attention=True,
                                         out_dtype=torch.float32)
    assert out32.dtype == alpha32.dtype == torch.float32
    out32.sum().backward()
    assert xs.grad.dtype == dtype and att.grad.dtype == torch.float32 and et.grad.dtype == dtype
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    for bad in (other, torch.float64, "float32"):
        with pytest.raises(ValueError, match="out_dtype"):
            ops.gatv2_attention(graph, xs, xd, att, 0.2, et, out_dtype=bad)
