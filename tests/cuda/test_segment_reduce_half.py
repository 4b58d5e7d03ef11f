r"""Min/max aggregation in float16 and bfloat16 against the float64 reference.

The kernels run on 16-bit inputs; the float64 reference (``gnn_fastpath.reference``) runs on
the SAME values, upcast, so input rounding is not an error here. Unit roundoff u_T = 2**-11
(float16), 2**-8 (bfloat16), 2**-24 (float32).

- *Output.* Max/min only compare: each message is the float32 product w * x rounded once to
  the result dtype O = promote_types(x, w) (torch's ``w * x`` in O) and the extreme is one
  of them. Rounding is monotone, so max_k round(p_k) = round(max_k p_k): the result is the
  float64 one rounded to O. Without weights or with power-of-two weights the products are
  exact except where they fall into float16's subnormal range (|w x| < 2**-14, e.g. 0.25 x
  for a tiny x), where gradual underflow rounds them: there the result equals the float64
  one rounded to O bit for bit (``torch.equal``; comparing with the unrounded float64 value
  failed on the H200 for the big graph's few subnormal extremes). With arbitrary weights:
  |out - want| <= u_O |want| (+ half the smallest subnormal).
- *Gradients* (dx in x's dtype, dw in the weight's): each tied edge gets g / n (float32
  division), dx_j sums w_k g_k / n_k over its winning out-edges with float32 atomics into a
  float32 scratch, cast once; dw_k sums g / n * x over the winning features in float32, cast
  once. So |got - want| <= u_T |want| + (float32 part), the float32 part a few 2**-24 of the
  sum of the absolute terms. We allow
      |got - want| <= C (u_T |want| + EPS (|want| + rms(want))),    EPS = 2**-14, C = 4,
  the rms term covering elements whose terms cancel (their float32 noise is about the size
  of a typical element). grad_out is given in O and fed to the reference as the same values.
  Where the tie sets of kernel and reference must agree (the gradient is discontinuous in
  them), products are exact: no weights or power-of-two weights. Arbitrary weights are
  checked against the reference computed in float32 on the same inputs, which rounds the
  messages exactly as the kernels do (identical tie sets), with the same bound.

Graphs: bipartite with empty rows, self loops, duplicate edges and a destination cut into
chunks (600 extra in-edges); 3000 nodes with a 100k-in-edge super node. D in {8, 32, 64, 100,
128, 256} (8-wide, 4-wide loads; F = 100 takes 8-byte loads), max and min, every tie rule,
both non-finite rules, results in x's dtype and in float32 (float32 weights).
"""
from __future__ import annotations

import pytest
import torch

from gnn_fastpath import Graph, reference
from gnn_fastpath.cuda import segment_reduce as sr_kernels
from gnn_fastpath.ops import backend_for, segment_reduce
from zoo import random_edges
from test_segment_reduce_kernels import _run

pytestmark = pytest.mark.cuda

HALF = (torch.float16, torch.bfloat16)
U = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24}
EPS = 2.0 ** -14
C = 4.0
WIDTHS = (8, 32, 64, 100, 128, 256)
TIE_BREAKS = ("split", "even", "first", "last")


@pytest.fixture(scope="module")
def graphs():
    small_ei, small_n = random_edges(120, 90, 900, seed=3, empty_rows=5, super_node_degree=600)
    big_ei, big_n = random_edges(3000, 3000, 30_000, seed=5, empty_rows=40, super_node_degree=100_000)
    out = {"small": Graph.from_edge_index(small_ei.cuda(), small_n),
           "big": Graph.from_edge_index(big_ei.cuda(), big_n)}
    for g in out.values():
        assert sr_kernels.row_chunks(g).n_split > 0  # the chunked (64-bit atomic) path runs
    return out


# ------------------------------------------------------------------------------- helpers
def _inputs(graph, F, dtype, weight, ties, seed):
    """x in ``dtype``; weights None, power-of-two ("pow2", in x's dtype), power-of-two in
    float32 ("pow2_f32") or arbitrary ("rand" in x's dtype, "rand_f32")."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if ties:  # ReLU'd small integers: exact zeros and repeated values
        x = torch.relu(torch.randint(-3, 4, (graph.n_src, F), device="cuda", generator=gen).float())
    else:
        x = torch.randn(graph.n_src, F, device="cuda", generator=gen)
    x = x.to(dtype)
    w = None
    if weight is not None:
        w_dtype = torch.float32 if weight.endswith("_f32") else dtype
        if weight.startswith("pow2"):
            pick = torch.randint(0, 4, (graph.num_edges,), device="cuda", generator=gen)
            w = torch.tensor([-1.0, 0.5, 2.0, 0.25], device="cuda")[pick]
        else:
            w = torch.randn(graph.num_edges, device="cuda", generator=gen)
        w = w.to(w_dtype)
    out_dtype = dtype if w is None else torch.promote_types(dtype, w.dtype)
    g = torch.randn(graph.n_dst, F, device="cuda", generator=gen).to(out_dtype)
    return x, w, g


def _assert_grad(name, got, want, u):
    got, want = got.double(), want.double()
    finite = want[torch.isfinite(want)]
    rms = finite.pow(2).mean().sqrt() if finite.numel() else 0.0
    bound = C * (u * want.abs() + EPS * (want.abs() + rms))
    err = (got - want).abs()
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))  # equal infinities, NaN for NaN
    bad = ~((err <= bound) | same)
    assert not bad.any(), (f"{name}: {int(bad.sum())} elements off, worst {(err - bound)[bad].max().item():.3e} "
                           f"over the bound")


def _check(graph, F, dtype, reduce, tie_break, weight, ties, seed=0, non_finite="keep", inputs=None):
    x, w, g = inputs if inputs is not None else _inputs(graph, F, dtype, weight, ties, seed)
    assert backend_for("segment_reduce", x) == "cuda"
    got = _run(lambda x, w: segment_reduce(graph, x, reduce, w, tie_break, non_finite), x, w, g)
    exact = weight is None or weight.startswith("pow2")
    ref_x = x.double() if exact else x  # arbitrary weights: the reference in float32, same rounding
    ref_w = None if w is None else (w.double() if exact else w)
    want = _run(lambda x, w: reference.segment_reduce(graph, x, reduce, w, tie_break, non_finite), ref_x, ref_w,
                g.double() if exact else g)
    label = f"F={F}, {dtype}, {reduce}, {tie_break}, weight={weight}, ties={ties}, {non_finite}"
    out_dtype = dtype if w is None else torch.promote_types(dtype, w.dtype)
    assert got[0].dtype == out_dtype and got[1].dtype == dtype
    if exact:  # the float64 extreme rounded once to O (only subnormal products are inexact)
        want_out = want[0].to(out_dtype).double()
        assert torch.equal(got[0].double().nan_to_num(7.0), want_out.nan_to_num(7.0)), f"out ({label}) not exact"
    else:
        assert torch.equal(got[0], want[0]), f"out ({label}) differs from the same-rounding reference"
        want64 = reference.segment_reduce(graph, x.double(), reduce, w.double(), tie_break, non_finite)
        tiny = torch.finfo(out_dtype).smallest_normal * U[out_dtype]
        assert ((got[0].double() - want64).abs() <= U[out_dtype] * want64.abs() + tiny).all(), f"out ({label})"
    _assert_grad(f"dx ({label})", got[1], want[1], U[dtype])
    if w is not None:
        assert got[2].dtype == w.dtype
        _assert_grad(f"dw ({label})", got[2], want[2], U[w.dtype])


# ------------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("graph_name", ["small", "big"])
@pytest.mark.parametrize("F", WIDTHS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("weight", [None, "pow2", "pow2_f32", "rand", "rand_f32"])
def test_matches_reference(graphs, graph_name, F, dtype, reduce, weight):
    _check(graphs[graph_name], F, dtype, reduce, "split", weight, ties=False)


@pytest.mark.parametrize("graph_name", ["small", "big"])
@pytest.mark.parametrize("F", WIDTHS)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("tie_break", TIE_BREAKS)
@pytest.mark.parametrize("weight", [None, "pow2", "pow2_f32"])
def test_ties(graphs, graph_name, F, dtype, tie_break, weight):
    _check(graphs[graph_name], F, dtype, "max" if F % 64 else "min", tie_break, weight, ties=True, seed=1)


@pytest.mark.parametrize("graph_name", ["small", "big"])
@pytest.mark.parametrize("F", [64, 100])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("tie_break", TIE_BREAKS)
@pytest.mark.parametrize("weight", [None, "pow2_f32", "rand"])
def test_sliced_scatter(monkeypatch, graphs, graph_name, F, dtype, tie_break, weight):
    """The scatter in feature slices with hub row copies (forced; by rule only where dx
    outgrows the L2), 16-bit features and gradients, with and without ties."""
    monkeypatch.setenv("GNN_FASTPATH_SR_SCATTER", "slices")
    monkeypatch.setenv("GNN_FASTPATH_SR_BWD", "atomic")
    monkeypatch.setattr(sr_kernels, "SCATTER_HUBS", 4)
    monkeypatch.setattr(sr_kernels, "SCATTER_REPLICAS", 3)
    for ties in (False, True):
        _check(graphs[graph_name], F, dtype, "max", tie_break, weight, ties=ties and weight != "rand", seed=6)


@pytest.mark.parametrize("F", [8, 100])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("tie_break,non_finite", [("split", "keep"), ("first", "keep"), ("last", "keep"),
                                                  ("first", "drop"), ("last", "drop")])
def test_non_finite(graphs, F, dtype, tie_break, non_finite):
    """NaN and +-inf features (and weights of x's dtype) under torch's and DGL's rules."""
    graph = graphs["small"]
    x, w, g = _inputs(graph, F, dtype, "pow2", ties=False, seed=2)
    gen = torch.Generator(device="cuda").manual_seed(3)
    special = torch.tensor([float("nan"), float("inf"), -float("inf")], device="cuda", dtype=dtype)
    hit = torch.rand(x.shape, device="cuda", generator=gen) < 0.05
    x = torch.where(hit, special[torch.randint(0, 3, x.shape, device="cuda", generator=gen)], x)
    _check(graph, F, dtype, "max", tie_break, "pow2", ties=False, non_finite=non_finite, inputs=(x, w, g))


@pytest.mark.parametrize("dtype", HALF)
def test_no_grad_value_only_and_autocast(graphs, dtype):
    """The value-only forward (no aux) and an ambient autocast of the other 16-bit dtype
    change nothing."""
    graph = graphs["big"]
    x, w, _ = _inputs(graph, 64, dtype, "rand", ties=False, seed=4)
    with torch.no_grad():
        plain = segment_reduce(graph, x, "max", w)
        other = torch.bfloat16 if dtype == torch.float16 else torch.float16
        with torch.autocast("cuda", dtype=other):
            inside = segment_reduce(graph, x, "max", w)
    assert plain.dtype == inside.dtype == dtype and torch.equal(plain, inside)
    assert torch.equal(plain, reference.segment_reduce(graph, x, "max", w))


def test_misaligned_rows(graphs):
    """A view whose base is not 16-byte aligned takes scalar loads; still exact."""
    graph = graphs["small"]
    base = torch.randn(graph.n_src * 8 + 1, device="cuda").to(torch.bfloat16)
    xv = base[1:].view(graph.n_src, 8)
    assert torch.equal(segment_reduce(graph, xv, "min").double(), reference.segment_reduce(graph, xv.double(), "min"))
