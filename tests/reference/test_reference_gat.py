"""GAT (additive) attention, reference and public op, against dense float64 math.

The oracle works on the (destination, edge) incidence: logits for every pair [n_dst, M, H]
from the per-node scores (z = s_j + t_i + u_e), a softmax masked by B[i, e] = (dst_e == i),
so every edge (duplicate or not) is its own column with its own edge score and weight; the
aggregation scales each column by the dropout mask / (1 - p) and the edge weight. Plain
vectorised torch; it never touches the package's CSR.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from gnn_fastpath import ops, reference
from gnn_fastpath.graph import Graph
from zoo import SMALL_GRAPH_SPECS, small_graphs

DT = torch.float64
IMPLS = {"ops": ops, "reference": reference}
H, D = 2, 3
SLOPE = 0.2


# ---------------------------------------------------------------------------- oracle
def gat_dense(ei, n_src, n_dst, x_src, s, t, u=None, w=None, slope=SLOPE, keep=None, p=0.0):
    """(out [n_dst, H, D], alpha [M, H], dropped [M, H]): alpha the softmax weights, dropped
    the weights the aggregation uses (alpha * keep / (1 - p) * w)."""
    m = ei.size(1)
    inc = ei[1].unsqueeze(0) == torch.arange(n_dst).unsqueeze(1)  # [n_dst, M]
    z = s[ei[0]].unsqueeze(0) + t.unsqueeze(1)  # [n_dst, M, H]
    if u is not None:
        z = z + u.unsqueeze(0)
    e = F.leaky_relu(z, slope)
    mask = inc.unsqueeze(-1)
    if m:
        shift = e.masked_fill(~mask, float("-inf")).amax(1, keepdim=True)
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift)).detach()
    else:
        shift = torch.zeros(n_dst, 1, e.size(-1), dtype=e.dtype)
    ex = torch.where(mask, torch.exp(torch.where(mask, e - shift, torch.zeros_like(e))), torch.zeros_like(e))
    denom = ex.sum(1, keepdim=True)
    prob = ex / torch.where(denom > 0, denom, torch.ones_like(denom))  # [n_dst, M, H]
    alpha = prob[ei[1], torch.arange(m)]
    scale = torch.ones(m, e.size(-1), dtype=e.dtype)
    if keep is not None:
        scale = scale * keep / (1.0 - p)
    if w is not None:
        scale = scale * w.unsqueeze(-1)
    out = torch.einsum("ieh,ehd->ihd", prob * scale.unsqueeze(0), x_src[ei[0]])
    return out, alpha, alpha * scale


# ---------------------------------------------------------------------------- inputs
@pytest.fixture(scope="module")
def graphs():
    return small_graphs()


def _inputs(n_src, n_dst, m, seed, dtype=DT):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, dtype=DT) * scale).to(dtype).requires_grad_()

    return {"x_src": r(n_src, H, D), "score_src": r(n_src, H), "score_dst": r(n_dst, H),
            "edge_score": r(m, H, scale=0.5),
            "edge_weight": (torch.rand(m, generator=gen, dtype=DT) + 0.5).to(dtype).requires_grad_()}


def _run(impl, g, inp, *, edge_score=True, edge_weight=True, return_attention=True, dropout=0.0, slope=SLOPE,
         **kw):
    return impl.gat_attention(g, inp["x_src"], inp["score_src"], inp["score_dst"],
                              inp["edge_score"] if edge_score else None, slope, return_attention, dropout,
                              inp["edge_weight"] if edge_weight else None, **kw)


def _oracle(ei, n_src, n_dst, inp, *, edge_score=True, edge_weight=True, slope=SLOPE, **kw):
    return gat_dense(ei, n_src, n_dst, inp["x_src"], inp["score_src"], inp["score_dst"],
                     inp["edge_score"] if edge_score else None, inp["edge_weight"] if edge_weight else None,
                     slope, **kw)


def _grads(out, alpha, leaves, seed):
    gen = torch.Generator().manual_seed(seed)
    go = torch.randn(out.shape, generator=gen, dtype=DT)
    ga = torch.randn(alpha.shape, generator=gen, dtype=DT)
    loss = (out * go).sum() + (alpha * ga).sum()
    return torch.autograd.grad(loss, leaves, allow_unused=True)


def test_graphs_have_the_awkward_cases(graphs):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    assert torch.unique(ei, dim=1).size(1) < ei.size(1)  # duplicates
    assert bool((ei[0] == ei[1]).any())  # self loops
    for name in ("homogeneous", "bipartite_wide", "bipartite_tall"):
        assert bool((graphs[name][3].in_degree() == 0).any())  # empty rows
    assert graphs["bipartite_wide"][1] != graphs["bipartite_wide"][2]


# ---------------------------------------------------------------------------- forward + every gradient
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("edge_score", [False, True], ids=["no_edge_score", "edge_score"])
@pytest.mark.parametrize("edge_weight", [False, True], ids=["no_edge_weight", "edge_weight"])
@pytest.mark.parametrize("return_attention", [True, "dropped"])
@pytest.mark.parametrize("name", list(SMALL_GRAPH_SPECS))
def test_matches_dense_oracle(graphs, impl, edge_score, edge_weight, return_attention, name):
    ei, n_src, n_dst, g = graphs[name]
    m = ei.size(1)
    inp = _inputs(n_src, n_dst, m, seed=list(SMALL_GRAPH_SPECS).index(name))
    out, alpha = _run(IMPLS[impl], g, inp, edge_score=edge_score, edge_weight=edge_weight,
                      return_attention=return_attention)
    want_out, want_alpha, want_dropped = _oracle(ei, n_src, n_dst, inp, edge_score=edge_score,
                                                 edge_weight=edge_weight)
    want_alpha = want_dropped if return_attention == "dropped" else want_alpha
    assert out.shape == (n_dst, H, D) and alpha.shape == (m, H)
    assert out.dtype == DT and alpha.dtype == DT and out.is_contiguous()
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(alpha, want_alpha, rtol=1e-10, atol=1e-12)
    used = [k for k in inp if (k != "edge_score" or edge_score) and (k != "edge_weight" or edge_weight)]
    leaves = [inp[k] for k in used]
    got = _grads(out, alpha, leaves, seed=7)
    want = _grads(want_out, want_alpha, leaves, seed=7)
    for key, a, b in zip(used, got, want):
        assert a is not None and torch.isfinite(a).all(), key
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda s: f"{key}: {s}")


@pytest.mark.parametrize("impl", list(IMPLS))
def test_out_without_return_attention(graphs, impl):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=3)
    out_only = _run(IMPLS[impl], g, inp, return_attention=False)
    assert isinstance(out_only, torch.Tensor) and out_only.is_contiguous()
    out, _ = _run(IMPLS[impl], g, inp)
    assert torch.equal(out_only, out)


def test_edge_weight_scales_after_the_softmax(graphs):
    """w scales each edge's weight after the softmax: alpha (True) does not see it, the
    aggregation and "dropped" do; w = 1 is no weight at all."""
    ei, n_src, n_dst, g = graphs["bipartite_wide"]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=4)
    out_w, alpha_w = _run(ops, g, inp)
    out, alpha = _run(ops, g, inp, edge_weight=False)
    torch.testing.assert_close(alpha_w, alpha, rtol=0, atol=0)
    assert not torch.allclose(out_w, out)
    ones = dict(inp, edge_weight=torch.ones(ei.size(1), dtype=DT))
    out1, dropped1 = _run(ops, g, ones, return_attention="dropped")
    torch.testing.assert_close(out1, out, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(dropped1, alpha, rtol=0, atol=0)


@pytest.mark.parametrize("slope", [0.0, 0.2, 1.0, -0.5])
def test_negative_slope(graphs, slope):
    ei, n_src, n_dst, g = graphs["bipartite_tall"]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=5)
    out, alpha = _run(ops, g, inp, slope=slope)
    want_out, want_alpha, _ = _oracle(ei, n_src, n_dst, inp, slope=slope)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(alpha, want_alpha, rtol=1e-10, atol=1e-12)


def test_large_logits_are_stable(graphs):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=8)
    with torch.no_grad():
        for k in ("score_src", "score_dst", "edge_score"):
            inp[k].mul_(200.0)
    out, alpha = _run(ops, g, inp)
    want_out, want_alpha, _ = _oracle(ei, n_src, n_dst, inp)
    assert torch.isfinite(out).all() and torch.isfinite(alpha).all()
    torch.testing.assert_close(out, want_out, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(alpha, want_alpha, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------- gradcheck
@pytest.fixture(scope="module")
def tiny():
    """5 sources, 4 destinations (one empty), a duplicate and a self loop."""
    ei = torch.tensor([[0, 1, 1, 4, 2, 3, 1, 0, 2],
                       [0, 1, 1, 0, 2, 2, 0, 2, 1]])
    return ei, 5, 4, Graph.from_edge_index(ei, (5, 4))


@pytest.mark.parametrize("return_attention", [False, True, "dropped"])
def test_gradcheck_every_input(tiny, return_attention):
    ei, n_src, n_dst, g = tiny
    inp = _inputs(n_src, n_dst, ei.size(1), seed=9)

    def f(x_src, s, t, u, w):
        return ops.gat_attention(g, x_src, s, t, u, 0.2, return_attention, 0.0, w)

    assert torch.autograd.gradcheck(f, tuple(inp.values()))


def test_gradcheck_without_optional_inputs(tiny):
    ei, n_src, n_dst, g = tiny
    inp = _inputs(n_src, n_dst, ei.size(1), seed=10)
    assert torch.autograd.gradcheck(lambda xs, s, t: ops.gat_attention(g, xs, s, t, return_attention=True),
                                    (inp["x_src"], inp["score_src"], inp["score_dst"]))


# ---------------------------------------------------------------------------- empty rows, empty graphs
@pytest.mark.parametrize("name", ["homogeneous", "bipartite_wide", "bipartite_tall"])
def test_empty_rows_exact_zero_no_nan(graphs, name):
    ei, n_src, n_dst, g = graphs[name]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=13)
    out, alpha = _run(ops, g, inp)
    empty = g.in_degree() == 0
    assert empty.any()
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    grads = dict(zip(inp, _grads(out, alpha, list(inp.values()), seed=1)))
    for key, gr in grads.items():
        assert torch.isfinite(gr).all(), key
    assert torch.equal(grads["score_dst"][empty], torch.zeros_like(grads["score_dst"][empty]))
    no_out = torch.bincount(ei[0], minlength=n_src) == 0  # sources without out-edges
    if no_out.any():
        assert not grads["x_src"][no_out].any() and not grads["score_src"][no_out].any()


@pytest.mark.parametrize("n_src,n_dst", [(0, 0), (5, 4), (3, 0), (0, 3)])
def test_no_edges(n_src, n_dst):
    g = Graph.from_edge_index(torch.empty(2, 0, dtype=torch.int64), (n_src, n_dst))
    inp = _inputs(n_src, n_dst, 0, seed=0)
    out, alpha = _run(ops, g, inp, dropout=0.5)
    assert out.shape == (n_dst, H, D) and alpha.shape == (0, H)
    assert not out.any()
    grads = torch.autograd.grad(out.sum(), list(inp.values()), allow_unused=True)
    for gr, x in zip(grads, inp.values()):
        assert gr is None or not gr.any()


# ---------------------------------------------------------------------------- weights
@pytest.mark.parametrize("name", ["homogeneous", "bipartite_wide", "bipartite_tall"])
def test_alpha_sums_to_one_per_destination(graphs, name):
    ei, n_src, n_dst, g = graphs[name]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=14)
    _, alpha = _run(ops, g, inp)
    assert bool((alpha > 0).all()) and bool((alpha <= 1).all())
    sums = torch.zeros(n_dst, H, dtype=DT).index_add_(0, ei[1], alpha.detach())
    has_edges = g.in_degree() > 0
    torch.testing.assert_close(sums[has_edges], torch.ones_like(sums[has_edges]), rtol=0, atol=1e-12)
    assert torch.equal(sums[~has_edges], torch.zeros_like(sums[~has_edges]))


def test_duplicates_are_separate_edges():
    """Equal scores: destination 0 has 1 -> 0 twice and 2 -> 0 once, so each edge gets 1/3;
    a distinct edge score or weight on one copy separates the copies."""
    ei = torch.tensor([[1, 2, 1, 0], [0, 0, 0, 1]])
    g = Graph.from_edge_index(ei, 3)
    vals = torch.randn(3, H, D, dtype=DT)
    zeros_s, zeros_t = torch.zeros(3, H, dtype=DT), torch.zeros(3, H, dtype=DT)
    out, alpha = ops.gat_attention(g, vals, zeros_s, zeros_t, return_attention=True)
    torch.testing.assert_close(alpha[:3], torch.full((3, H), 1 / 3, dtype=DT), rtol=0, atol=1e-15)
    torch.testing.assert_close(alpha[3], torch.ones(H, dtype=DT), rtol=0, atol=0)
    torch.testing.assert_close(out[0], (2 * vals[1] + vals[2]) / 3, rtol=1e-14, atol=1e-14)
    assert torch.equal(out[2], torch.zeros(H, D, dtype=DT))
    u = torch.zeros(4, H, dtype=DT)
    u[2] = 1.0
    _, alpha_u = ops.gat_attention(g, vals, zeros_s, zeros_t, u, return_attention=True)
    assert not torch.allclose(alpha_u[0], alpha_u[2])
    w = torch.tensor([1.0, 1.0, 3.0, 1.0], dtype=DT)
    out_w = ops.gat_attention(g, vals, zeros_s, zeros_t, edge_weight=w)
    torch.testing.assert_close(out_w[0], (4 * vals[1] + vals[2]) / 3, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("impl", list(IMPLS))
def test_edge_order_invariance(graphs, impl):
    """Permuting the caller's edges (with edge_score and edge_weight) permutes alpha and keeps
    out; both are read in caller order."""
    ei, n_src, n_dst, g = graphs["homogeneous"]
    m = ei.size(1)
    inp = _inputs(n_src, n_dst, m, seed=16)
    out, alpha = _run(IMPLS[impl], g, inp, return_attention="dropped")
    p = torch.randperm(m, generator=torch.Generator().manual_seed(3))
    gp = Graph.from_edge_index(ei[:, p], (n_src, n_dst))
    inp_p = dict(inp, edge_score=inp["edge_score"][p], edge_weight=inp["edge_weight"][p])
    out_p, alpha_p = _run(IMPLS[impl], gp, inp_p, return_attention="dropped")
    torch.testing.assert_close(out_p, out, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(alpha_p, alpha[p], rtol=1e-12, atol=1e-13)
    for key in ("edge_score", "edge_weight"):
        out_bad, _ = _run(IMPLS[impl], g, dict(inp, **{key: inp[key][p]}))
        assert not torch.allclose(out_bad, out), key


# ---------------------------------------------------------------------------- dropout
def test_dropout_zero_is_exact(graphs):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=17)
    out, dropped = _run(ops, g, inp, return_attention="dropped")
    out0, dropped0 = _run(ops, g, inp, dropout=0, return_attention="dropped")
    assert torch.equal(out0, out) and torch.equal(dropped0, dropped)


@pytest.fixture(scope="module")
def big_graph():
    """64 destinations with ~1000 in-edges each: M = 64000 edges."""
    gen = torch.Generator().manual_seed(21)
    n_src, n_dst, per = 300, 64, 1000
    src = torch.randint(0, n_src, (n_dst * per,), generator=gen)
    dst = torch.arange(n_dst).repeat_interleave(per)
    ei = torch.stack([src, dst])[:, torch.randperm(n_dst * per, generator=gen)]
    return ei, n_src, n_dst, Graph.from_edge_index(ei, (n_src, n_dst))


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_semantics(big_graph, p):
    """Inverted dropout on the softmax weights, then the edge weight: "dropped" returns
    alpha * keep / (1 - p) * w, out aggregates exactly those weights, True returns the
    weights before dropout; the mask has the right rate and follows torch's seed."""
    ei, n_src, n_dst, g = big_graph
    inp = _inputs(n_src, n_dst, ei.size(1), seed=22)
    with torch.no_grad():
        _, alpha = _run(ops, g, inp)
        torch.manual_seed(5)
        out, dropped = _run(ops, g, inp, dropout=p, return_attention="dropped")
        torch.manual_seed(5)
        out_t, undropped = _run(ops, g, inp, dropout=p, return_attention=True)
    torch.testing.assert_close(undropped, alpha, rtol=0, atol=0)
    torch.testing.assert_close(out_t, out, rtol=0, atol=0)  # same seed, same mask
    kept = dropped != 0
    frac = kept.double().mean().item()
    sigma = math.sqrt(p * (1 - p) / kept.numel())
    assert abs(frac - (1 - p)) < 6 * sigma, (frac, 1 - p)
    w = inp["edge_weight"].detach().unsqueeze(-1)
    torch.testing.assert_close(dropped[kept], (alpha * w)[kept] / (1 - p), rtol=1e-12, atol=0)
    # out is the oracle with the mask the returned weights imply, and so are its gradients
    want_out, _, want_dropped = _oracle(ei, n_src, n_dst, inp, keep=kept.to(DT), p=p)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dropped, want_dropped, rtol=1e-12, atol=0)
    torch.manual_seed(5)
    out_g, dropped_g = _run(ops, g, inp, dropout=p, return_attention="dropped")
    want_out, _, want_dropped = _oracle(ei, n_src, n_dst, inp, keep=kept.to(DT), p=p)
    leaves = list(inp.values())
    for a, b in zip(_grads(out_g, dropped_g, leaves, 3), _grads(want_out, want_dropped, leaves, 3)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_dropout_one_drops_everything(graphs):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=23)
    out, dropped = _run(ops, g, inp, dropout=1.0, return_attention="dropped")
    assert not out.any() and not dropped.any()


# ---------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("score_dtype", [torch.float32, "same"])
def test_16bit_dtypes(graphs, dtype, score_dtype):
    """16-bit features (float32 or 16-bit scores, weights): out and alpha in the features'
    dtype or out_dtype=float32, computed in float32 (= the float32 op on the same values,
    rounded once), gradients in each input's own dtype; an ambient autocast changes nothing."""
    ei, n_src, n_dst, g = graphs["homogeneous"]
    sdt = dtype if score_dtype == "same" else score_dtype
    base = _inputs(n_src, n_dst, ei.size(1), seed=24)
    inp = {k: v.detach().to(dtype if k == "x_src" else sdt).requires_grad_() for k, v in base.items()}
    f32 = {k: v.detach().float() for k, v in inp.items()}
    out, alpha = _run(ops, g, inp)
    want_out, want_alpha = _run(ops, g, f32)
    assert out.dtype == alpha.dtype == dtype
    assert torch.equal(out, want_out.to(dtype)) and torch.equal(alpha, want_alpha.to(dtype))
    out32, alpha32 = _run(ops, g, inp, out_dtype=torch.float32)
    assert out32.dtype == alpha32.dtype == torch.float32
    torch.testing.assert_close(out32, want_out, rtol=1e-6, atol=1e-7)
    grads = _grads(out32.double(), alpha32.double(), list(inp.values()), seed=2)
    for (key, x), gr in zip(inp.items(), grads):
        assert gr.dtype == x.dtype, key
    with torch.autocast("cpu", dtype=torch.bfloat16 if dtype == torch.float16 else torch.float16):
        out_ac, alpha_ac = _run(ops, g, inp)
    assert torch.equal(out_ac, out) and torch.equal(alpha_ac, alpha)


def test_float64_scores_promote_the_reference(graphs):
    """The reference computes in float64 when any input is float64; out stays x_src's dtype."""
    ei, n_src, n_dst, g = graphs["bipartite_wide"]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=25)
    x32 = dict(inp, x_src=inp["x_src"].detach().float())
    out = _run(reference, g, x32, return_attention=False)
    assert out.dtype == torch.float32
    want, _, _ = _oracle(ei, n_src, n_dst, dict(x32, x_src=x32["x_src"].double()))
    torch.testing.assert_close(out, want.float(), rtol=1e-6, atol=1e-7)
