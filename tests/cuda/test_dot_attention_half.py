"""Fused dot-product attention in float16 and bfloat16 against the float64 reference.

Both sides see the SAME 16-bit inputs: q, k, v, edge_term are drawn in float32, rounded to
T, and the reference runs on their exact float64 upcasts; the incoming gradients g_out
(and g_alpha) are drawn in the outputs' dtype and upcast the same way. So every difference
is an error of the kernels, and the bound follows from what they round:

- every logit, softmax statistic, weighted sum and gradient sum is float32: errors of about
  eps32 * (number of terms in a 256-edge chunk)^(1/2) relative to the row's terms, ~1e-6,
  independent of the degree up to rounding (split rows add one merge); we allow
  ``EPS32_ACC`` = 2**-14 relative, which also covers the cancellation of the super node
  (its output is ~100x smaller than its terms);
- out and alpha are rounded once to out_dtype: relative error <= u_out, the unit roundoff
  (2**-8 bfloat16, 2**-11 float16, 0 for a float32 out_dtype);
- each gradient is rounded once to T: <= u_T relative; in the backward, the saved out and
  alpha are read in out_dtype, so Delta_i = <O_i, dO_i> and sum_j A_ij dA_ij carry a
  relative error u_out of their terms, which reaches de_ij = alpha_ij (dalpha_ij - Delta_i)
  as ~u_out |dalpha - Delta| (random rounding signs), i.e. another O(u_out) relative error
  of dq, dk, d_edge_term.

That last error does not cancel where the exact gradient does (a destination with one
in-edge has de = 0 exactly, a source whose out-edges all lead to such destinations dk = 0),
so it is bounded by the tensor's scale, not the row's. The same holds for the float32
accumulation itself: an exactly cancelling gradient row is reproduced only to ~eps32 of its
TERMS, not of its (zero) value. small_graph has such rows: destinations 113..119 get in-edges
only from the hub source, so without an edge term all their logits are equal, dalpha_ij =
Delta_i and dq = 0 exactly; the float64 reference returns ~1e-16 noise there and the kernel
0 (its first GPU run failed exactly there with a float32 out_dtype, where u_out = 0 left no
tensor-scale term). The terms are bounded by the tensor's scale, hence EPS32_ACC joins u_out
in the gradients' tensor-scale term.

Rounding into the subnormal range is not relative: it adds up to half the subnormal spacing,
tiny_T = 2**-25 float16 (2**-134 bfloat16, 2**-150 float32), whatever the value. float16's
normal range ends at 6.1e-5, so the super node's attention weights (110k in-edges: alpha ~
1e-5) and their edge-term gradients are subnormal halves with errors of up to 3e-8, a relative
~5e-3 > u (failed on the first GPU run with errors <= 2**-25). Hence, per row r of each tensor
(first dimension: node or edge), with mag_r = max |want_r|, M = max |want| over the tensor and
tiny = tiny of the dtype of ``got``:

    max |got_r - want_r| <= C * ((u + EPS32_ACC) * mag_r + u_saved * M + tiny),   C = 4,

u = u_out for out and alpha (u_saved = 0), u = u_T and u_saved = u_out + EPS32_ACC for the
gradients; and over the whole tensor ||got - want||_F <= C * ((u + u_saved + EPS32_ACC) *
||want||_F + tiny * sqrt(numel)). A dropped edge or a wrong scale still changes a row by a
good fraction of its magnitude, far above C * (u + EPS32_ACC) * mag_r, and changes values
far above tiny. Accumulating in 16-bit memory (or
16-bit registers) would give errors growing like sqrt(degree) * u and fail on the hub
source (700 out-edges) and the super node (900 in-edges, 110k on the large graph).
"""
from __future__ import annotations

import pytest
import torch

from gnn_fastpath import reference
from gnn_fastpath.ops import CUDA, dispatch, dot_attention
from test_dot_kernels import _graph, _with_hub_source
from zoo import random_edges

pytestmark = pytest.mark.cuda

HALF = (torch.float16, torch.bfloat16)
MODES = ("atomic", "transposed")
#: unit roundoff of each stored dtype (float32 results: only the accumulation term)
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 0.0}
EPS32_ACC = 2.0**-14
C = 4.0


def subnormal_roundoff(dtype):
    """Largest absolute error of rounding into ``dtype``'s subnormal range: half its spacing."""
    info = torch.finfo(dtype)
    return info.smallest_normal * info.eps / 2


def assert_half_close(name, got, want, u, u_saved=0.0):
    """``got`` (any dtype) within C * (u + EPS32_ACC) of the float64 ``want`` per row
    (relative to the row's largest magnitude) plus C * u_saved of the tensor's largest
    magnitude plus C * (the subnormal roundoff of got's dtype), and normwise (module docstring)."""
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    if want.numel() == 0:
        return
    rel = C * (u + EPS32_ACC)
    tiny = C * subnormal_roundoff(got.dtype)
    err = (got.double() - want).reshape(want.shape[0], -1)
    mag = want.reshape(want.shape[0], -1).abs().amax(1)
    row_err = err.abs().amax(1)
    bound = rel * mag + C * u_saved * mag.max() + tiny
    bad = row_err > bound
    if bad.any():
        r = int(bad.nonzero()[0])
        ratio = float(row_err[r] / mag[r]) if mag[r] > 0 else float("inf")
        raise AssertionError(f"{name}: {int(bad.sum())} rows over the bound; row {r}: max error "
                             f"{float(row_err[r]):.3e}, magnitude {float(mag[r]):.3e} (ratio {ratio:.3e} > {rel:.3e}; "
                             f"bound {float(bound[r]):.3e})")
    total = err.norm().item()
    rel_all = rel + C * u_saved
    allowed = rel_all * want.norm().item() + tiny * want.numel() ** 0.5
    assert total <= allowed, f"{name}: normwise error {total:.3e} > {rel_all:.3e} * ||want|| + tiny ({allowed:.3e})"


def fused(graph, q, k, v, scale=None, edge_term=None, return_attention=False, dropout=0.0, out_dtype=None):
    """The public op, asserted to have run the fused kernels (not the reference)."""
    with dispatch.recording() as call:
        res = dot_attention(graph, q, k, v, scale, edge_term, return_attention, dropout, out_dtype=out_dtype)
    assert call.backend == CUDA, f"dot_attention ran on {call.backend}, not the CUDA kernels"
    return res


def inputs(graph, H, D, dtype, edge_term=True, seed=0):
    """q, k, v (, edge_term) drawn in float32 and rounded to ``dtype``."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(n):
        return torch.randn(n, H, D, device="cuda", generator=gen).to(dtype)

    return randn(graph.n_dst), randn(graph.n_src), randn(graph.n_src), randn(graph.num_edges) if edge_term else None


def run(fn, graph, xs, scale, return_attention, out_dtype, upcast=False, grad_seed=7):
    """fn on leaves made of ``xs`` (float64 copies when ``upcast``); returns out, alpha and the
    gradients of <out, g_out> (+ <alpha, g_alpha>), g_* drawn in the fused outputs' dtype
    ``out_dtype`` and upcast for the reference, so both get the same numbers."""
    leaves = [None if x is None else (x.double() if upcast else x).detach().requires_grad_() for x in xs]
    res = fn(graph, *leaves[:3], scale, leaves[3], return_attention, 0.0, out_dtype=None if upcast else out_dtype)
    out, alpha = res if return_attention else (res, None)
    gen = torch.Generator(device="cuda").manual_seed(grad_seed)
    g_out = torch.randn(out.shape, device="cuda", generator=gen).to(out_dtype)
    loss = (out.double() * g_out.double()).sum()
    if alpha is not None:
        g_alpha = torch.randn(alpha.shape, device="cuda", generator=gen).to(out_dtype)
        loss = loss + (alpha.double() * g_alpha.double()).sum()
    loss.backward()
    return out, alpha, [None if x is None else x.grad for x in leaves]


def compare(graph, H, D, dtype, out_dtype=None, mode="atomic", monkeypatch=None, edge_term=True, scale=None,
            return_attention=False, seed=0):
    if monkeypatch is not None:
        monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", mode)
        monkeypatch.setenv("GNN_FASTPATH_DOT_FWD", "csr")  # these are the CSR kernels' tests (test_block_attention)
    to = out_dtype or dtype
    xs = inputs(graph, H, D, dtype, edge_term, seed)
    out, alpha, grads = run(fused, graph, xs, scale, return_attention, to)
    want_out, want_alpha, want_grads = run(reference.dot_attention, graph, xs, scale, return_attention, to,
                                           upcast=True)
    tag = f"{dtype} -> {to}, H={H} D={D} t={edge_term} mode={mode}"
    assert out.dtype == to and out.is_contiguous(), tag
    u_out, u_in = UNIT_ROUNDOFF[to], UNIT_ROUNDOFF[dtype]
    assert_half_close(f"out ({tag})", out, want_out, u_out)
    if return_attention:
        assert alpha.dtype == to
        assert_half_close(f"attention ({tag})", alpha, want_alpha, u_out)
    for name, g, w in zip(("dq", "dk", "dv", "dt"), grads, want_grads):
        if w is not None:
            assert g.dtype == dtype, f"{name} ({tag}): dtype {g.dtype}"
            # tensor-scale term: saved out read in out_dtype, and cancelling rows (docstring)
            assert_half_close(f"{name} ({tag})", g, w, u_in, u_saved=u_out + EPS32_ACC)
    return out, grads


# ------------------------------------------------------------------------------- graphs
@pytest.fixture(scope="module")
def small_graph():
    """Bipartite 150 -> 120: a 900-edge super node (split rows), 7 empty rows, self loops,
    duplicate edges and a hub source with 700 out-edges (split source rows, many atomics)."""
    ei, sizes = random_edges(150, 120, 2500, seed=3, empty_rows=7, super_node_degree=900)
    return _graph(*_with_hub_source(ei, sizes))


@pytest.fixture(scope="module")
def sparse_graph():
    """Low mean in-degree (two heads per lane group where the register budget allows)."""
    ei, sizes = random_edges(3000, 2500, 10000, seed=13, empty_rows=20, super_node_degree=2000)
    return _graph(ei, sizes)


@pytest.fixture(scope="module")
def super_graph():
    """Bipartite, one destination with >= 100k in-edges, empty rows, a 5000-edge hub source."""
    ei, sizes = random_edges(3000, 2500, 40000, seed=11, empty_rows=40, super_node_degree=110_000)
    return _graph(*_with_hub_source(ei, sizes, hub=2, degree=5000))


# ------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("out_dtype", [None, torch.float32], ids=["T", "f32"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("D", [8, 32, 64, 100, 128, 256])
def test_grid_small_graph(small_graph, D, dtype, out_dtype, mode, monkeypatch):
    H = 3 if D in (8, 100) else 2
    compare(small_graph, H, D, dtype, out_dtype, mode, monkeypatch, edge_term=D % 64 != 0,
            return_attention=D in (32, 100), seed=D)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("H,D,out_dtype", [(4, 128, None), (8, 64, torch.float32), (3, 100, None), (2, 256, None)])
def test_low_degree_graph(sparse_graph, H, D, out_dtype, dtype, mode, monkeypatch):
    compare(sparse_graph, H, D, dtype, out_dtype, mode, monkeypatch, edge_term=H % 2 == 0, return_attention=H == 3)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("H,D,out_dtype", [(2, 128, None), (1, 64, torch.float32), (2, 32, None)])
def test_super_node_graph(super_graph, H, D, out_dtype, dtype, mode, monkeypatch):
    assert int(super_graph.in_degree().max()) >= 100_000
    out, _ = compare(super_graph, H, D, dtype, out_dtype, mode, monkeypatch, edge_term=D != 32,
                     return_attention=D == 32)
    empty = super_graph.in_degree() == 0
    assert empty.any() and (out[empty] == 0).all()


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("D,shift", [(128, 1), (128, 4), (100, 4), (6, 1)])
def test_misaligned_rows(small_graph, dtype, D, shift, monkeypatch):
    """Rows ``shift`` elements past a 16-byte boundary: 8-byte accesses (shift 4, D % 4 == 0)
    or scalar ones (shift 1) instead of 16-byte ones; same values, same bound."""

    def shifted(x):
        buf = torch.empty(x.numel() + shift, device=x.device, dtype=x.dtype)
        y = buf[shift:].view(x.shape)
        y.copy_(x)
        return y

    xs = [shifted(x) for x in inputs(small_graph, 2, D, dtype, seed=5)]
    assert xs[0].data_ptr() % 16 != 0
    for mode in MODES:
        monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", mode)
        out, _, grads = run(fused, small_graph, xs, None, False, dtype)
        want_out, _, want_grads = run(reference.dot_attention, small_graph, xs, None, False, dtype, upcast=True)
        u = UNIT_ROUNDOFF[dtype]
        assert_half_close(f"out D={D} shift={shift}", out, want_out, u)
        for name, g, w in zip(("dq", "dk", "dv", "dt"), grads, want_grads):
            assert_half_close(f"{name} D={D} shift={shift} {mode}", g, w, u, u_saved=u + EPS32_ACC)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_float32_out_dtype_is_not_rounded(small_graph, dtype):
    """out_dtype=float32 writes the float32 result directly: rounding it to T gives the T result."""
    xs = inputs(small_graph, 2, 64, dtype, seed=2)
    out_t, alpha_t = fused(small_graph, *xs[:3], None, xs[3], True, out_dtype=None)
    out_f, alpha_f = fused(small_graph, *xs[:3], None, xs[3], True, out_dtype=torch.float32)
    assert out_f.dtype == alpha_f.dtype == torch.float32 and out_t.dtype == alpha_t.dtype == dtype
    assert torch.equal(out_f.to(dtype), out_t) and torch.equal(alpha_f.to(dtype), alpha_t)
    assert not torch.equal(out_f, out_f.to(dtype).float())  # some values are not representable in T


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_autocast_changes_nothing(small_graph, dtype, mode, monkeypatch):
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", mode)
    xs = inputs(small_graph, 2, 32, dtype, seed=9)
    want = run(fused, small_graph, xs, None, True, dtype)
    for ac in HALF:
        with torch.autocast("cuda", dtype=ac):
            got = run(fused, small_graph, xs, None, True, dtype)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        for a, b in zip(got[2], want[2]):
            if mode == "transposed":  # deterministic: no atomics
                assert torch.equal(a, b)
            else:
                assert_half_close("grad under autocast", a, b.double(), UNIT_ROUNDOFF[dtype])


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_dropout_half_matches_float32_mask(small_graph, dtype):
    """Philox mask is independent of the dtype: the dropped attention's zeros are where the
    float32 run's are (same seed)."""
    xs = inputs(small_graph, 2, 32, dtype, seed=4)
    torch.manual_seed(123)
    _, d16 = fused(small_graph, *xs[:3], None, xs[3], "dropped", 0.3)
    torch.manual_seed(123)
    _, d32 = fused(small_graph, *[x.float() for x in xs[:3]], None, xs[3].float(), "dropped", 0.3)
    assert d16.dtype == dtype and torch.equal(d16 == 0, d32 == 0)
    assert_half_close("dropped attention", d16, d32.double(), UNIT_ROUNDOFF[dtype])


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_non_finite_inputs_propagate(small_graph, dtype):
    """A NaN in one key makes its destinations' rows NaN (as float32 and torch do), others stay finite."""
    xs = inputs(small_graph, 2, 32, dtype, edge_term=False, seed=6)
    k = xs[1].clone()
    k[3, 0, 0] = float("nan")
    out = fused(small_graph, xs[0], k, xs[2])
    out32 = fused(small_graph, xs[0].float(), k.float(), xs[2].float())
    assert torch.equal(out.isnan(), out32.isnan()) and out.isnan().any()
    assert_half_close("finite rows", torch.nan_to_num(out, 0.0), torch.nan_to_num(out32, 0.0).double(),
                      UNIT_ROUNDOFF[dtype])
