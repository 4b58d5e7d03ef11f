"""The dot-product attention reference (and the public op on CPU) in float16 and bfloat16.

The contract: 16-bit inputs are computed in float32, the result comes back in ``out_dtype``
(default the inputs' dtype, else float32), gradients in the inputs' dtype, float64 stays
float64, and an ambient autocast changes nothing. So a 16-bit call must equal, bit for bit,
the float32 reference on the upcast inputs rounded once to the result's dtype (and its
gradients the float32 gradients rounded once to the input dtype).
"""
import pytest
import torch

from gnn_fastpath import ops, reference
from zoo import small_graphs

HALF = (torch.float16, torch.bfloat16)
H, D = 2, 8
GRAPHS = small_graphs()


def _inputs(g, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, H, D, generator=gen).to(dtype) for n in (g.n_dst, g.n_src, g.n_src, g.num_edges)]


def _run(fn, g, xs, return_attention, out_dtype, grad_seed=1):
    """Outputs and input gradients of <out, g_out> (+ <alpha, g_alpha>) with g_* drawn in
    the outputs' dtype (as autograd hands them over)."""
    leaves = [x.detach().clone().requires_grad_() for x in xs]
    res = fn(g, *leaves[:3], 0.4, leaves[3], return_attention, 0.0, out_dtype)
    out, alpha = res if return_attention else (res, None)
    gen = torch.Generator().manual_seed(grad_seed)
    loss = (out.float() * torch.randn(out.shape, generator=gen).to(out.dtype).float()).sum()
    if alpha is not None:
        loss = loss + (alpha.float() * torch.randn(alpha.shape, generator=gen).to(alpha.dtype).float()).sum()
    loss.backward()
    return out, alpha, [x.grad for x in leaves]


@pytest.mark.parametrize("impl", [reference.dot_attention, ops.dot_attention], ids=["reference", "op"])
@pytest.mark.parametrize("out_dtype", [None, torch.float32], ids=["T", "f32"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("graph_name", list(GRAPHS))
def test_half_is_float32_math_rounded_once(impl, graph_name, dtype, out_dtype):
    g = GRAPHS[graph_name][3]
    xs = _inputs(g, dtype)
    want_dtype = out_dtype or dtype
    out, alpha, grads = _run(impl, g, xs, True, out_dtype)
    assert out.dtype == alpha.dtype == want_dtype
    assert all(gr.dtype == dtype for gr in grads)
    # the oracle: float32 on the upcast inputs; grad_out values are the same numbers
    # (drawn in want_dtype, then upcast), so the float32 gradients are rounded once to dtype
    ref_out, ref_alpha, ref_grads = _run(_f32_with_grad_dtype(want_dtype), g, [x.float() for x in xs], True, None)
    assert torch.equal(out, ref_out.to(want_dtype))
    assert torch.equal(alpha, ref_alpha.to(want_dtype))
    for gr, r in zip(grads, ref_grads):
        assert torch.equal(gr, r.to(dtype))


def _f32_with_grad_dtype(grad_dtype):
    """The float32 reference whose outputs pass through a rounding to ``grad_dtype`` only for
    drawing the incoming gradients: same values of g_out as the 16-bit run."""

    def fn(g, q, k, v, scale, t, return_attention, dropout, out_dtype):
        res = reference.dot_attention(g, q, k, v, scale, t, return_attention, dropout)
        return tuple(_GradIn.apply(r, grad_dtype) for r in res) if return_attention else _GradIn.apply(res, grad_dtype)

    return fn


class _GradIn(torch.autograd.Function):
    """Identity whose output has ``dtype`` (values rounded) and whose backward passes the
    gradient back in float32: the incoming gradients then match the 16-bit run exactly."""

    @staticmethod
    def forward(ctx, x, dtype):
        return x.to(dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.float(), None


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_autocast_changes_nothing(dtype):
    g = GRAPHS["homogeneous"][3]
    xs = _inputs(g, dtype, seed=3)
    want = _run(reference.dot_attention, g, xs, True, None)
    for ac_dtype in HALF:
        with torch.autocast("cpu", dtype=ac_dtype):
            got = _run(reference.dot_attention, g, xs, True, None)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        for a, b in zip(got[2], want[2]):
            assert torch.equal(a, b)


def test_float64_stays_float64_and_float32_result_of_float64_is_allowed_by_the_reference():
    g = GRAPHS["bipartite_wide"][3]
    xs = _inputs(g, torch.float64)
    out, alpha, grads = _run(reference.dot_attention, g, xs, True, None)
    assert out.dtype == alpha.dtype == torch.float64 and all(gr.dtype == torch.float64 for gr in grads)


@pytest.mark.parametrize("bad", [torch.float64, torch.float16, torch.int32, "float32"])
def test_op_rejects_other_out_dtypes(bad):
    g = GRAPHS["homogeneous"][3]
    q, k, v, _ = _inputs(g, torch.bfloat16)
    with pytest.raises(ValueError, match="out_dtype"):
        ops.dot_attention(g, q, k, v, out_dtype=bad)


def test_op_mixed_input_dtypes_rejected():
    g = GRAPHS["homogeneous"][3]
    q, k, v, _ = _inputs(g, torch.bfloat16)
    with pytest.raises(ValueError, match="dtype"):
        ops.dot_attention(g, q.float(), k, v)
