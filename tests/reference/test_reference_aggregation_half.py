"""Reference spmm / segment_reduce / gcn_norm_values with float16 and bfloat16 inputs (CPU).

The reduced-precision contract of the reference ops: 16-bit inputs are computed in float32
and the result is returned in its dtype (spmm: ``out_dtype``, default torch's
``promote_types(x, edge_weight)``; segment_reduce: ``promote_types(x, edge_weight)``;
gcn_norm_values: ``dtype`` / the weight's dtype); each gradient comes back in its input's
dtype; an ambient ``torch.autocast`` changes nothing.

Bounds (u = 2**-11 float16, 2**-8 bfloat16; the float64 oracle is evaluated on the same
16-bit inputs, upcast):
- spmm in float32: the float32 sum differs from the float64 one by at most ~deg * 2**-24 of
  sum |a x| (tiny here), so a 16-bit result is the float64 value rounded once:
  |got - want| <= u * |want| + 1e-6 * M, with M = sum |a x| per row; a float32 result is
  within 1e-6 * M.
- segment_reduce is exact: without weights (or with power-of-two weights, exact products)
  the result equals the float64 oracle rounded to the result dtype, bit for bit, and the
  tie-rule gradients route the same g / n shares (float32 division, rounded once).
"""
from __future__ import annotations

import pytest
import torch

from gnn_fastpath import ops, reference
from gnn_fastpath.ops.gcn_norm import gcn_norm_values
from zoo import small_graphs

HALF = (torch.float16, torch.bfloat16)
U = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
GRAPHS = small_graphs()
NAMES = [n for n in GRAPHS if n != "no_edges"]


def _leaf(t):
    return t.clone().requires_grad_(True)


def _spmm_bound(g, x, w, norm, want, u):
    """u * |want| + 1e-6 * M with M = the same spmm of |x| and |w| (row magnitudes)."""
    mag = reference.spmm(g, x.double().abs(), None if w is None else w.double().abs(), norm)
    return u * want.abs() + 1e-6 * mag


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("weight", [None, "same", torch.float32])
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
@pytest.mark.parametrize("impl", [ops, reference])
def test_spmm_half(name, dtype, weight, out_dtype, impl):
    _, n_src, n_dst, g = GRAPHS[name]
    gen = torch.Generator().manual_seed(0)
    x = _leaf(torch.randn(n_src, 8, generator=gen).to(dtype))
    w = None if weight is None else _leaf((torch.rand(g.num_edges, generator=gen) + 0.5)
                                          .to(dtype if weight == "same" else weight))
    out = impl.spmm(g, x, w, "both", out_dtype=out_dtype)
    expected_dtype = out_dtype or (dtype if w is None else torch.promote_types(dtype, w.dtype))
    assert out.dtype == expected_dtype
    want = reference.spmm(g, x.detach().double(), None if w is None else w.detach().double(), "both")
    u = U[dtype] if expected_dtype == dtype else 0.0
    bound = _spmm_bound(g, x.detach(), None if w is None else w.detach(), "both", want, u)
    assert ((out.double() - want).abs() <= bound).all()
    gout = torch.randn(out.shape, generator=gen).to(out.dtype)
    out.backward(gout)
    assert x.grad.dtype == dtype and (w is None or w.grad.dtype == w.dtype)
    # dX = A^T dY in float32, rounded once to x's dtype
    xd = x.detach().double().requires_grad_()
    wd = None if w is None else w.detach().double().requires_grad_()
    reference.spmm(g, xd, wd, "both").backward(gout.double())
    gx_mag = torch.autograd.grad(reference.spmm(g, xd, None if wd is None else wd.abs(), "both"), xd,
                                 gout.double().abs())[0]
    assert ((x.grad.double() - xd.grad).abs() <= U[dtype] * xd.grad.abs() + 1e-6 * gx_mag).all()
    if w is not None:
        tol = U[w.dtype] if w.dtype in U else 0.0
        assert torch.allclose(w.grad.double(), wd.grad, rtol=tol + 1e-5, atol=1e-5 * wd.grad.abs().max().item())


@pytest.mark.parametrize("dtype", HALF)
def test_spmm_out_dtype_checked(dtype):
    _, n_src, _, g = GRAPHS["homogeneous"]
    x = torch.randn(n_src, 4).to(dtype)
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    for impl in (ops, reference):
        for bad in (torch.float64, other):
            with pytest.raises(ValueError, match="out_dtype"):
                impl.spmm(g, x, None, "none", out_dtype=bad)


@pytest.mark.parametrize("dtype", HALF)
def test_spmm_ignores_autocast(dtype):
    _, n_src, _, g = GRAPHS["homogeneous"]
    x = torch.randn(n_src, 8).to(dtype)
    w = torch.rand(g.num_edges)
    plain = reference.spmm(g, x, w, "right")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = reference.spmm(g, x, w, "right")
    assert inside.dtype == plain.dtype == torch.float32 and torch.equal(inside, plain)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("tie_break", ["split", "even", "first", "last"])
@pytest.mark.parametrize("weight", [None, "same", torch.float32])
def test_segment_reduce_half_exact(name, dtype, reduce, tie_break, weight):
    """Small integers (many exact ties) and power-of-two weights: every product is exact, so
    the 16-bit result is the float64 one exactly and the gradients match to one rounding."""
    _, n_src, n_dst, g = GRAPHS[name]
    gen = torch.Generator().manual_seed(1)
    x = _leaf(torch.relu(torch.randint(-3, 4, (n_src, 5), generator=gen).float()).to(dtype))
    w = None
    if weight is not None:
        pick = torch.randint(0, 3, (g.num_edges,), generator=gen)
        w = _leaf(torch.tensor([-1.0, 0.5, 2.0])[pick].to(dtype if weight == "same" else weight))
    out = reference.segment_reduce(g, x, reduce, w, tie_break)
    want_dtype = dtype if w is None else torch.promote_types(dtype, w.dtype)
    assert out.dtype == want_dtype
    xd = x.detach().double().requires_grad_()
    wd = None if w is None else w.detach().double().requires_grad_()
    want = reference.segment_reduce(g, xd, reduce, wd, tie_break)
    assert torch.equal(out.double(), want.detach())
    gout = torch.randn(out.shape, generator=gen).to(out.dtype)
    out.backward(gout)
    want.backward(gout.double())
    assert x.grad.dtype == dtype
    assert ((x.grad.double() - xd.grad).abs() <= U[dtype] * xd.grad.abs()).all()
    if w is not None:
        assert w.grad.dtype == w.dtype
        uw = U.get(w.dtype, 2.0 ** -24)
        assert ((w.grad.double() - wd.grad).abs() <= 8 * uw * wd.grad.abs() + 1e-6).all()


@pytest.mark.parametrize("dtype", HALF)
def test_segment_reduce_rounds_messages_to_the_result(dtype):
    """A weight of x's dtype: each message is w * x rounded to that dtype (torch's product),
    so two products that round to one value tie."""
    _, n_src, _, g = GRAPHS["homogeneous"]
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(n_src, 6, generator=gen).to(dtype)
    w = torch.randn(g.num_edges, generator=gen).to(dtype)
    got = reference.segment_reduce(g, x, "max", w)
    msgs = (x[g.indices] * w[g.perm].unsqueeze(1))  # torch's 16-bit product
    want = torch.zeros(g.n_dst, 6, dtype=dtype).scatter_reduce(
        0, g.dst_index().unsqueeze(1).expand_as(msgs), msgs, "amax", include_self=False)
    assert got.dtype == dtype and torch.equal(got, want)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_norm_values_half(dtype, weighted):
    _, n_src, _, g = GRAPHS["homogeneous"]
    w = (torch.rand(g.num_edges) + 0.5).to(dtype) if weighted else None
    got = gcn_norm_values(g, w, dtype=None if weighted else dtype)
    want = gcn_norm_values(g, None if w is None else w.double(), dtype=None if weighted else torch.float64)
    assert got.dtype == dtype
    assert ((got.double() - want).abs() <= U[dtype] * want.abs() * 1.01).all()
