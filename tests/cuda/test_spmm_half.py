r"""SpMM (own CSR kernels and cached cuSPARSE) and gcn_norm_values in float16 and bfloat16
against the float64 reference.

The kernels run on 16-bit inputs; the float64 reference runs on the SAME values, upcast, so
input rounding is not an error here. u_T = 2**-11 (float16), 2**-8 (bfloat16), 2**-24
(float32); O = the result dtype (``out_dtype``: x's dtype, or float32).

- *Output* out_i = sum_k a_k x_k (a_k = c_dst w_k c_src, float32). Both backends multiply and
  add in float32 and round once to O: |out - want| <= u_O |want| + (float32 part). The own
  kernel keeps a_k in float32; cuSPARSE needs A in B's type, so there a_k is rounded to T
  first: another u_T sum_k |a_k x_k|. With M_i = sum_k |a_k| |x_k| (the same spmm of |x|,
  |w|), which bounds every partial sum, and the float32 sums' drift (~2**-24 sqrt(deg) of
  M, independent of the degree up to that) inside EPS = 2**-14:
      |out - want| <= C (u_O |want| + (u_T + EPS) M),    C = 4.
  (u_T: the timed choice between cuSPARSE and the own kernel is made at run time, so the
  bound covers both; test_each_backend forces each.)
- *dX = A^T dY* (dY in O, given to the reference as the same values; dX in x's dtype): the
  same bound with u_T for the final rounding, u_O for a cuSPARSE A in dY's type, and
  M = A_abs^T |dY|. With ``GNN_FASTPATH_SPMM_BWD=flag`` cuSPARSE's transposed product adds
  into C with atomics, so it must get a float32 C (cast once): a 16-bit C rounds at every
  addition, an error growing with the out-degree that this bound (rightly) rejects.
- *dw_e = c_dst c_src <dY_i, x_j>*: a float32 dot product rounded once to the weight's
  dtype: |dw - want| <= C (u_w |want| + EPS M_e), M_e = c_dst c_src <|dY_i|, |x_j|>.
- *Underflow*: rounding to a dtype with gradual underflow is fl(v) = v (1 + d) + e with
  |d| <= u and |e| <= TINY = half the smallest subnormal (2**-25 for float16: the gcn_norm
  values w / deg of a 100k-degree node's self loops, ~1e-5, are float16 subnormals).
  Every bound gets that one absolute term per final rounding (TINY[O] or TINY[T]).

Graphs: bipartite with empty rows, self loops, duplicate edges and a 600-in-edge destination
(chunked, atomics into float32 scratch for 16-bit outputs) plus a hub source (the transposed
matrix is chunked too); 3000 nodes with a 100k-in-edge super node; a multigraph (more edges
than matrix entries: own kernel only). D in {8, 32, 64, 100, 128, 256}; out_dtype T and
float32; weights none, in T and in float32; both backward variants.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from gnn_fastpath import Graph, reference
from gnn_fastpath.cuda import cusparse
from gnn_fastpath.cuda import spmm as spmm_kernels
from gnn_fastpath.ops import backend_for, spmm
from gnn_fastpath.ops.gcn_norm import gcn_norm_values
from zoo import random_edges

pytestmark = pytest.mark.cuda

HALF = (torch.float16, torch.bfloat16)
U = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}
#: Half the smallest subnormal: the absolute error of rounding into the subnormal range.
TINY = {t: torch.finfo(t).smallest_normal * torch.finfo(t).eps / 2 for t in U}
EPS = 2.0 ** -14
C = 4.0
WIDTHS = (8, 32, 64, 100, 128, 256)
BWD_ENV = "GNN_FASTPATH_SPMM_BWD"


def _with_hub_source(ei, n_dst, hub=1, degree=700, seed=0):
    gen = torch.Generator().manual_seed(seed)
    dst = torch.randint(0, n_dst, (degree,), generator=gen)
    return torch.cat([ei, torch.stack([torch.full_like(dst, hub), dst])], 1)


def _small():
    ei, sizes = random_edges(120, 90, 900, seed=3, empty_rows=5, super_node_degree=600)
    return _with_hub_source(ei, 85), sizes


_SPECS = {
    "small": _small,
    "big": lambda: random_edges(3000, 3000, 30_000, seed=5, empty_rows=40, super_node_degree=100_000),
    # more edges than matrix entries: cuSPARSE cannot describe it, the own kernel runs
    "multigraph": lambda: random_edges(12, 10, 60, seed=6, super_node_degree=400),
}


@pytest.fixture(scope="module")
def graphs():
    out = {}
    for name, make in _SPECS.items():
        ei, sizes = make()
        out[name] = Graph.from_edge_index(ei.cuda(), sizes)
    return out


# ------------------------------------------------------------------------------- helpers
def _inputs(graph, F, dtype, weight, out_dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(graph.n_src, F, device="cuda", generator=gen).to(dtype)
    w = None
    if weight is not None:
        w = (torch.rand(graph.num_edges, device="cuda", generator=gen) * 2 - 0.5)  # mixed signs
        w = w.to(dtype if weight == "same" else weight)
    result = out_dtype or (dtype if w is None else torch.promote_types(dtype, w.dtype))
    g = torch.randn(graph.n_dst, F, device="cuda", generator=gen).to(result)
    return x, w, g


def _assert_within(name, got, want, bound):
    err = (got.double() - want).abs()
    bad = err > bound
    assert not bad.any(), f"{name}: {int(bad.sum())} elements off, worst excess {(err - bound)[bad].max().item():.3e}"


def _check(graph, F, dtype, norm, weight, out_dtype, seed=0):
    x, w, g = _inputs(graph, F, dtype, weight, out_dtype, seed)
    assert backend_for("spmm", x) == "cuda"
    xl = x.clone().requires_grad_(True)
    wl = None if w is None else w.clone().requires_grad_(True)
    out = spmm(graph, xl, wl, norm, out_dtype=out_dtype)
    result = out_dtype or (dtype if w is None else torch.promote_types(dtype, w.dtype))
    assert out.dtype == result
    out.backward(g)
    assert xl.grad.dtype == dtype and (wl is None or wl.grad.dtype == wl.dtype)

    xd = x.double().requires_grad_(True)
    wd = None if w is None else w.double().requires_grad_(True)
    want = reference.spmm(graph, xd, wd, norm)
    want.backward(g.double())
    # magnitudes: the same products on absolute values
    xa = x.double().abs().requires_grad_(True)
    wa = None if w is None else w.double().abs().requires_grad_(True)
    mag = reference.spmm(graph, xa, wa, norm)
    mag.backward(g.double().abs())
    label = f"F={F}, {dtype}, norm={norm}, weight={weight}, out_dtype={out_dtype}"
    _assert_within(f"out ({label})", out.detach(), want.detach(),
                   C * (U[result] * want.detach().abs() + (U[dtype] + EPS) * mag.detach()) + TINY[result])
    _assert_within(f"dx ({label})", xl.grad, xd.grad,
                   C * (U[dtype] * xd.grad.abs() + (U[result] + EPS) * xa.grad) + TINY[dtype])
    if w is not None:
        _assert_within(f"dw ({label})", wl.grad, wd.grad,
                       C * (U[w.dtype] * wd.grad.abs() + EPS * wa.grad) + TINY[w.dtype])


# ------------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("graph_name", ["small", "big", "multigraph"])
@pytest.mark.parametrize("F", WIDTHS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("weight", [None, "same", torch.float32])
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
@pytest.mark.parametrize("bwd", ["transposed", "flag"])
def test_matches_reference(monkeypatch, graphs, graph_name, F, dtype, weight, out_dtype, bwd):
    monkeypatch.setenv(BWD_ENV, bwd)
    _check(graphs[graph_name], F, dtype, "both", weight, out_dtype)


@pytest.mark.parametrize("norm", ["none", "left", "right"])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("F", [8, 100])
def test_norms(graphs, norm, dtype, F):
    _check(graphs["small"], F, dtype, norm, torch.float32, None)


@pytest.mark.parametrize("alg", ["default", "alg2", "custom"])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
@pytest.mark.parametrize("F", [8, 64, 100])
def test_each_backend(monkeypatch, alg, dtype, out_dtype, F):
    """cuSPARSE's 16-bit products (A in T) and the own kernel (A in float32), each forced on a
    fresh graph (nothing cached); its backward through cuSPARSE's transpose flag too."""
    monkeypatch.setenv("GNN_FASTPATH_SPMM_ALG", alg)
    monkeypatch.setenv(BWD_ENV, "flag" if alg != "custom" else "transposed")
    ei, sizes = random_edges(2000, 2000, 20_000, seed=2, empty_rows=10, super_node_degree=20_000)
    graph = Graph.from_edge_index(ei.cuda(), sizes)
    _check(graph, F, dtype, "both", "same", out_dtype, seed=7)
    chosen = spmm_kernels.cache_of(graph).csr.chosen_algorithms()
    value = {**cusparse._ALGS, **cusparse.algorithms()}[alg]
    fwd = [v for (op, f, b, c), v in chosen.items() if op == 0 and f == F and b == dtype]
    assert fwd == [value], chosen


def test_dtype_keyed_caches(graphs):
    """float32 and bfloat16 calls on one graph keep separate algorithm choices (keys carry
    the dtypes), share one float32 values entry, and convert A's values to bf16 once."""
    graph = graphs["big"]
    cache = spmm_kernels.cache_of(graph)
    x = torch.randn(graph.n_src, 64, device="cuda")
    spmm(graph, x, None, "both")
    spmm(graph, x.bfloat16(), None, "both")
    spmm(graph, x.bfloat16(), None, "both", out_dtype=torch.float32)
    keys = set(cache.csr.chosen_algorithms())
    assert {(0, 64, torch.float32, torch.float32), (0, 64, torch.bfloat16, torch.bfloat16),
            (0, 64, torch.bfloat16, torch.float32)} <= keys
    entry = cache.values("both", None)
    assert entry.values.fp32.dtype == torch.float32
    if torch.bfloat16 in entry.values._typed:  # made only if cuSPARSE ran in bf16
        typed = entry.values.typed(torch.bfloat16)
        spmm(graph, x.bfloat16(), None, "both")
        assert entry.values.typed(torch.bfloat16) is typed


@pytest.mark.parametrize("dtype", HALF)
def test_autocast_changes_nothing(graphs, dtype):
    """An ambient autocast of the other 16-bit dtype changes neither the result dtype nor the
    values. Not bit for bit: the small graph's 600-in-edge destination is split into chunks
    whose float32 partial sums are merged with atomics in a run-dependent order (the float32
    drift EPS of the module docstring; torch.equal failed on the H200 for that reason). Still
    tight enough to see autocast leak in: float16 x cast to bfloat16 moves each product by up
    to 2**-9, far outside C * EPS * M = 2**-12 M on most elements; a dtype change is checked
    exactly."""
    graph = graphs["small"]
    x, w, _ = _inputs(graph, 64, dtype, torch.float32, None, seed=3)
    plain = spmm(graph, x, w, "both")
    other = torch.bfloat16 if dtype == torch.float16 else torch.float16
    with torch.autocast("cuda", dtype=other):
        inside = spmm(graph, x, w, "both")
    assert plain.dtype == inside.dtype == torch.float32
    mag = reference.spmm(graph, x.double().abs(), w.double().abs(), "both")
    _assert_within("autocast", inside, plain.double(), C * EPS * mag)


@pytest.mark.parametrize("dtype", HALF)
def test_out_dtype_rejected(graphs, dtype):
    graph = graphs["small"]
    x = torch.randn(graph.n_src, 8, device="cuda").to(dtype)
    with pytest.raises(ValueError, match="out_dtype"):
        spmm(graph, x, out_dtype=torch.float64)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("improved", [False, True])
def test_gcn_norm_values(dtype, weighted, improved):
    """float32 arithmetic, one rounding to the requested dtype (or the weight's).

    The super node's self loops (about 33 random ones plus the added loop) get w / deg ~ 1e-5:
    float16 subnormals, whose rounding error is absolute (TINY = 2**-25), not relative;
    without that term 8 of them failed on the H200 by up to 1.5e-8. A wrong degree or a
    lost loop weight still moves such a value by ~1e-5, far outside the bound."""
    n = 3000
    ei, _ = random_edges(n, n, 30_000, seed=8, empty_rows=0, super_node_degree=100_000)
    loops = torch.arange(n)
    ei = torch.cat([ei, torch.stack([loops, loops])], 1).cuda()
    graph = Graph.from_edge_index(ei, n)
    w = (torch.rand(graph.num_edges, device="cuda") + 0.5).to(dtype) if weighted else None
    got = gcn_norm_values(graph, w, improved=improved, dtype=None if weighted else dtype)
    with warnings.catch_warnings():  # float64 runs the reference, with a one-time warning
        warnings.simplefilter("ignore")
        want = gcn_norm_values(graph, None if w is None else w.double(), improved=improved,
                               dtype=None if weighted else torch.float64)
    assert got.dtype == dtype
    _assert_within("gcn_norm", got, want, C * (U[dtype] + EPS) * want.abs() + TINY[dtype])
