"""GATv2 and dot-product attention (reference and public ops) against dense float64 math.

Two independent oracles:

- ``dense``: logits for every (destination, source) pair [n_dst, n_src, H] and a softmax
  masked by the dense adjacency of tests/zoo.py, weighted by its edge *counts*, so a pair
  present k times carries k times the mass and each copy gets 1/k of it (duplicates are
  separate edges). Used without edge terms.
- ``incidence``: logits for every (destination, edge) pair [n_dst, M, H] masked by the
  incidence matrix B[i, e] = (dst_e == i), so every edge (duplicate or not) is its own
  column and carries its own edge term. Used with edge terms.

Both are plain vectorised torch; neither touches the package's CSR.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from gnn_fastpath import ops, reference
from gnn_fastpath.graph import Graph
from zoo import SMALL_GRAPH_SPECS, dense_adjacency, small_graphs

DT = torch.float64
IMPLS = {"ops": ops, "reference": reference}
H, D = 2, 3


# ---------------------------------------------------------------------------- oracles
def _masked_softmax(logits, weight):
    """Softmax over dim 1 of ``logits`` [n, K, H] where ``weight`` [n, K] > 0, scaled by weight.

    Rows without any entry give all zeros (no NaN, zero gradient).
    """
    if logits.size(1) == 0:
        return logits * 0
    mask = (weight > 0).unsqueeze(-1)
    m = logits.masked_fill(~mask, float("-inf")).amax(1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    e = torch.where(mask, torch.exp(torch.where(mask, logits - m, torch.zeros_like(logits))),
                    torch.zeros_like(logits)) * weight.unsqueeze(-1)
    denom = e.sum(1, keepdim=True)
    return e / torch.where(denom > 0, denom, torch.ones_like(denom))


def _incidence(ei, n_dst):
    return (ei[1].unsqueeze(0) == torch.arange(n_dst).unsqueeze(1)).to(DT)  # [n_dst, M]


def gatv2_dense(ei, n_src, n_dst, x_src, x_dst, att, slope):
    a = dense_adjacency(ei, n_src, n_dst)  # counts duplicates
    z = x_src.unsqueeze(0) + x_dst.unsqueeze(1)  # [n_dst, n_src, H, D]
    logits = (F.leaky_relu(z, slope) * att).sum(-1)
    p = _masked_softmax(logits, a)  # [n_dst, n_src, H], mass of all copies of j -> i
    out = torch.einsum("ijh,jhd->ihd", p, x_src)
    alpha = p[ei[1], ei[0]] / a[ei[1], ei[0]].unsqueeze(-1)
    return out, alpha


def gatv2_incidence(ei, n_src, n_dst, x_src, x_dst, att, slope, edge_term):
    b = _incidence(ei, n_dst)
    xj = x_src[ei[0]]  # [M, H, D]
    z = xj.unsqueeze(0) + x_dst.unsqueeze(1) + edge_term.unsqueeze(0)  # [n_dst, M, H, D]
    logits = (F.leaky_relu(z, slope) * att).sum(-1)
    p = _masked_softmax(logits, b)
    out = torch.einsum("ieh,ehd->ihd", p, xj)
    alpha = p[ei[1], torch.arange(ei.size(1))]
    return out, alpha


def dot_dense(ei, n_src, n_dst, q, k, v, scale):
    a = dense_adjacency(ei, n_src, n_dst)
    logits = torch.einsum("ihd,jhd->ijh", q, k) * scale
    p = _masked_softmax(logits, a)
    out = torch.einsum("ijh,jhd->ihd", p, v)
    alpha = p[ei[1], ei[0]] / a[ei[1], ei[0]].unsqueeze(-1)
    return out, alpha


def dot_incidence(ei, n_src, n_dst, q, k, v, scale, edge_term):
    b = _incidence(ei, n_dst)
    ke = k[ei[0]] + edge_term
    ve = v[ei[0]] + edge_term
    logits = torch.einsum("ihd,ehd->ieh", q, ke) * scale
    p = _masked_softmax(logits, b)
    out = torch.einsum("ieh,ehd->ihd", p, ve)
    alpha = p[ei[1], torch.arange(ei.size(1))]
    return out, alpha


# ---------------------------------------------------------------------------- graphs
GRAPH_SPECS = SMALL_GRAPH_SPECS


@pytest.fixture(scope="module")
def graphs():
    return small_graphs()


def _has_duplicates(ei):
    return torch.unique(ei, dim=1).size(1) < ei.size(1)


def test_graphs_have_the_awkward_cases(graphs):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    assert _has_duplicates(ei)
    assert bool((ei[0] == ei[1]).any())  # self loops
    for name in ("homogeneous", "bipartite_wide", "bipartite_tall"):
        assert bool((graphs[name][3].in_degree() == 0).any())  # empty rows


def _inputs(n_src, n_dst, m, seed, kind):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=DT).requires_grad_()

    if kind == "gatv2":
        return {"x_src": r(n_src, H, D), "x_dst": r(n_dst, H, D), "att": r(H, D), "edge_term": r(m, H, D)}
    return {"q": r(n_dst, H, D), "k": r(n_src, H, D), "v": r(n_src, H, D), "edge_term": r(m, H, D)}


def _run(impl, kind, g, inp, *, edge_term, return_attention=True, dropout=0.0, slope=0.2, scale=None):
    et = inp["edge_term"] if edge_term else None
    if kind == "gatv2":
        return impl.gatv2_attention(g, inp["x_src"], inp["x_dst"], inp["att"], slope, et, return_attention, dropout)
    return impl.dot_attention(g, inp["q"], inp["k"], inp["v"], scale, et, return_attention, dropout)


def _oracle(kind, ei, n_src, n_dst, inp, *, edge_term, slope=0.2, scale=None):
    if kind == "gatv2":
        if edge_term:
            return gatv2_incidence(ei, n_src, n_dst, inp["x_src"], inp["x_dst"], inp["att"], slope, inp["edge_term"])
        return gatv2_dense(ei, n_src, n_dst, inp["x_src"], inp["x_dst"], inp["att"], slope)
    s = 1.0 / math.sqrt(D) if scale is None else scale
    if edge_term:
        return dot_incidence(ei, n_src, n_dst, inp["q"], inp["k"], inp["v"], s, inp["edge_term"])
    return dot_dense(ei, n_src, n_dst, inp["q"], inp["k"], inp["v"], s)


def _grads(out, alpha, inp, seed):
    gen = torch.Generator().manual_seed(seed)
    go = torch.randn(out.shape, generator=gen, dtype=DT)
    ga = torch.randn(alpha.shape, generator=gen, dtype=DT)
    loss = (out * go).sum() + (alpha * ga).sum()
    leaves = list(inp.values())
    return dict(zip(inp, torch.autograd.grad(loss, leaves, allow_unused=True)))


# ---------------------------------------------------------------------------- forward + backward vs oracles
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("kind", ["gatv2", "dot"])
@pytest.mark.parametrize("edge_term", [False, True], ids=["no_edge_term", "edge_term"])
@pytest.mark.parametrize("name", list(GRAPH_SPECS))
def test_matches_dense_oracle(graphs, impl, kind, edge_term, name):
    ei, n_src, n_dst, g = graphs[name]
    m = ei.size(1)
    inp = _inputs(n_src, n_dst, m, seed=list(GRAPH_SPECS).index(name), kind=kind)
    out, alpha = _run(IMPLS[impl], kind, g, inp, edge_term=edge_term)
    want_out, want_alpha = _oracle(kind, ei, n_src, n_dst, inp, edge_term=edge_term)
    assert out.shape == (n_dst, H, D) and alpha.shape == (m, H)
    assert out.dtype == DT and alpha.dtype == DT
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(alpha, want_alpha, rtol=1e-10, atol=1e-12)
    got = _grads(out, alpha, inp, seed=7)
    want = _grads(want_out, want_alpha, inp, seed=7)
    for key in inp:
        if key == "edge_term" and not edge_term:
            assert got[key] is None
            continue
        assert got[key] is not None, key
        assert torch.isfinite(got[key]).all(), key
        torch.testing.assert_close(got[key], want[key], rtol=1e-9, atol=1e-11, msg=lambda s: f"{key}: {s}")


@pytest.mark.parametrize("kind", ["gatv2", "dot"])
def test_out_without_return_attention_is_the_same_tensor_math(graphs, kind):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=3, kind=kind)
    out_only = _run(ops, kind, g, inp, edge_term=True, return_attention=False)
    assert isinstance(out_only, torch.Tensor)
    out, _ = _run(ops, kind, g, inp, edge_term=True, return_attention=True)
    assert torch.equal(out_only, out)
    assert out_only.is_contiguous()


@pytest.mark.parametrize("slope", [0.0, 0.2, 1.0, -0.5])
def test_gatv2_negative_slope(graphs, slope):
    ei, n_src, n_dst, g = graphs["bipartite_wide"]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=5, kind="gatv2")
    out, alpha = _run(ops, "gatv2", g, inp, edge_term=True, slope=slope)
    want_out, want_alpha = _oracle("gatv2", ei, n_src, n_dst, inp, edge_term=True, slope=slope)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(alpha, want_alpha, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scale", [None, 1.0, 0.05, 3.0])
def test_dot_scale(graphs, scale):
    ei, n_src, n_dst, g = graphs["bipartite_tall"]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=6, kind="dot")
    out, alpha = _run(ops, "dot", g, inp, edge_term=False, scale=scale)
    want_out, want_alpha = _oracle("dot", ei, n_src, n_dst, inp, edge_term=False, scale=scale)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(alpha, want_alpha, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["gatv2", "dot"])
def test_large_logits_are_stable(graphs, kind):
    """Logits in the hundreds: the softmax must shift by the row max, not overflow."""
    ei, n_src, n_dst, g = graphs["homogeneous"]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=8, kind=kind)
    with torch.no_grad():
        for t in inp.values():
            t.mul_(30.0)
    out, alpha = _run(ops, kind, g, inp, edge_term=True)
    want_out, want_alpha = _oracle(kind, ei, n_src, n_dst, inp, edge_term=True)
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


@pytest.mark.parametrize("return_attention", [False, True])
def test_gatv2_gradcheck(tiny, return_attention):
    ei, n_src, n_dst, g = tiny
    inp = _inputs(n_src, n_dst, ei.size(1), seed=9, kind="gatv2")

    def f(x_src, x_dst, att, et):
        return ops.gatv2_attention(g, x_src, x_dst, att, 0.2, et, return_attention)

    assert torch.autograd.gradcheck(f, (inp["x_src"], inp["x_dst"], inp["att"], inp["edge_term"]))


@pytest.mark.parametrize("return_attention", [False, True])
def test_dot_gradcheck(tiny, return_attention):
    ei, n_src, n_dst, g = tiny
    inp = _inputs(n_src, n_dst, ei.size(1), seed=10, kind="dot")

    def f(q, k, v, et):
        return ops.dot_attention(g, q, k, v, None, et, return_attention)

    assert torch.autograd.gradcheck(f, (inp["q"], inp["k"], inp["v"], inp["edge_term"]))


def test_gradcheck_without_edge_term(tiny):
    ei, n_src, n_dst, g = tiny
    a = _inputs(n_src, n_dst, ei.size(1), seed=11, kind="gatv2")
    assert torch.autograd.gradcheck(lambda xs, xd, at: ops.gatv2_attention(g, xs, xd, at),
                                    (a["x_src"], a["x_dst"], a["att"]))
    b = _inputs(n_src, n_dst, ei.size(1), seed=12, kind="dot")
    assert torch.autograd.gradcheck(lambda q, k, v: ops.dot_attention(g, q, k, v, 0.7), (b["q"], b["k"], b["v"]))


# ---------------------------------------------------------------------------- empty rows, empty graphs
@pytest.mark.parametrize("kind", ["gatv2", "dot"])
@pytest.mark.parametrize("name", list(GRAPH_SPECS))
def test_empty_rows_exact_zero_no_nan(graphs, kind, name):
    ei, n_src, n_dst, g = graphs[name]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=13, kind=kind)
    out, alpha = _run(ops, kind, g, inp, edge_term=True)
    empty = g.in_degree() == 0
    assert empty.any()
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    grads = _grads(out, alpha, inp, seed=1)
    for key, gr in grads.items():
        assert torch.isfinite(gr).all(), key
    dst_key = "x_dst" if kind == "gatv2" else "q"
    assert torch.equal(grads[dst_key][empty], torch.zeros_like(grads[dst_key][empty]))


@pytest.mark.parametrize("kind", ["gatv2", "dot"])
def test_zero_nodes(kind):
    g = Graph.from_edge_index(torch.empty(2, 0, dtype=torch.int64), 0)
    inp = _inputs(0, 0, 0, seed=0, kind=kind)
    out, alpha = _run(ops, kind, g, inp, edge_term=True)
    assert out.shape == (0, H, D) and alpha.shape == (0, H)
    out.sum().backward()


# ---------------------------------------------------------------------------- attention weights
@pytest.mark.parametrize("kind", ["gatv2", "dot"])
@pytest.mark.parametrize("name", ["homogeneous", "bipartite_wide", "bipartite_tall"])
def test_alpha_sums_to_one_per_destination(graphs, kind, name):
    ei, n_src, n_dst, g = graphs[name]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=14, kind=kind)
    _, alpha = _run(ops, kind, g, inp, edge_term=True)
    assert alpha.shape == (ei.size(1), H)
    assert bool((alpha > 0).all()) and bool((alpha <= 1).all())
    sums = torch.zeros(n_dst, H, dtype=DT).index_add_(0, ei[1], alpha.detach())
    has_edges = g.in_degree() > 0
    torch.testing.assert_close(sums[has_edges], torch.ones_like(sums[has_edges]), rtol=0, atol=1e-12)
    assert torch.equal(sums[~has_edges], torch.zeros_like(sums[~has_edges]))


@pytest.mark.parametrize("kind", ["gatv2", "dot"])
def test_duplicates_are_separate_edges(kind):
    """Uniform logits: destination 0 has 1 -> 0 twice and 2 -> 0 once, so each edge gets 1/3."""
    ei = torch.tensor([[1, 2, 1, 0], [0, 0, 0, 1]])
    g = Graph.from_edge_index(ei, 3)
    vals = torch.randn(3, H, D, dtype=DT)
    if kind == "gatv2":  # att = 0 makes every logit 0; x_src are the values
        out, alpha = ops.gatv2_attention(g, vals, torch.randn(3, H, D, dtype=DT), torch.zeros(H, D, dtype=DT),
                                         return_attention=True)
    else:  # q = 0 makes every logit 0
        out, alpha = ops.dot_attention(g, torch.zeros(3, H, D, dtype=DT), torch.randn(3, H, D, dtype=DT), vals,
                                       return_attention=True)
    torch.testing.assert_close(alpha[:3], torch.full((3, H), 1 / 3, dtype=DT), rtol=0, atol=1e-15)
    torch.testing.assert_close(alpha[3], torch.ones(H, dtype=DT), rtol=0, atol=0)
    torch.testing.assert_close(out[0], (2 * vals[1] + vals[2]) / 3, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(out[1], vals[0], rtol=0, atol=0)
    assert torch.equal(out[2], torch.zeros(H, D, dtype=DT))


@pytest.mark.parametrize("kind", ["gatv2", "dot"])
def test_duplicates_with_distinct_edge_terms(kind):
    """Copies of one (src, dst) pair with different edge terms get different weights."""
    ei = torch.tensor([[1, 1, 2], [0, 0, 0]])
    g = Graph.from_edge_index(ei, 3)
    inp = _inputs(3, 3, 3, seed=15, kind=kind)
    out, alpha = _run(ops, kind, g, inp, edge_term=True)
    want_out, want_alpha = _oracle(kind, ei, 3, 3, inp, edge_term=True)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(alpha, want_alpha, rtol=1e-12, atol=1e-13)
    assert not torch.allclose(alpha[0], alpha[1])


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("kind", ["gatv2", "dot"])
@pytest.mark.parametrize("name", ["homogeneous", "bipartite_wide"])
def test_edge_order_invariance(graphs, impl, kind, name):
    """Permuting the caller's edges (and edge terms with them) permutes alpha and keeps out."""
    ei, n_src, n_dst, g = graphs[name]
    m = ei.size(1)
    inp = _inputs(n_src, n_dst, m, seed=16, kind=kind)
    out, alpha = _run(IMPLS[impl], kind, g, inp, edge_term=True)
    p = torch.randperm(m, generator=torch.Generator().manual_seed(3))
    gp = Graph.from_edge_index(ei[:, p], (n_src, n_dst))
    inp_p = dict(inp, edge_term=inp["edge_term"][p])
    out_p, alpha_p = _run(IMPLS[impl], kind, gp, inp_p, edge_term=True)
    torch.testing.assert_close(out_p, out, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(alpha_p, alpha[p], rtol=1e-12, atol=1e-13)
    # and edge terms are read in caller order: shuffling them alone changes the result
    inp_bad = dict(inp, edge_term=inp["edge_term"][p])
    out_bad, _ = _run(IMPLS[impl], kind, g, inp_bad, edge_term=True)
    assert not torch.allclose(out_bad, out)


# ---------------------------------------------------------------------------- dropout
@pytest.mark.parametrize("kind", ["gatv2", "dot"])
def test_dropout_zero_is_exact(graphs, kind):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=17, kind=kind)
    out, alpha = _run(ops, kind, g, inp, edge_term=True)
    out0, alpha0 = _run(ops, kind, g, inp, edge_term=True, dropout=0.0, return_attention="dropped")
    assert torch.equal(out0, out) and torch.equal(alpha0, alpha)
    out0b, alpha0b = _run(ops, kind, g, inp, edge_term=True, dropout=0, return_attention=True)
    assert torch.equal(out0b, out) and torch.equal(alpha0b, alpha)


@pytest.fixture(scope="module")
def big_graph():
    """64 destinations with ~1000 in-edges each: M = 64000 edges."""
    gen = torch.Generator().manual_seed(21)
    n_src, n_dst, per = 300, 64, 1000
    src = torch.randint(0, n_src, (n_dst * per,), generator=gen)
    dst = torch.arange(n_dst).repeat_interleave(per)
    ei = torch.stack([src, dst])[:, torch.randperm(n_dst * per, generator=gen)]
    return ei, n_src, n_dst, Graph.from_edge_index(ei, (n_src, n_dst))


@pytest.mark.parametrize("kind", ["gatv2", "dot"])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_distribution(big_graph, kind, p):
    ei, n_src, n_dst, g = big_graph
    m = ei.size(1)
    inp = _inputs(n_src, n_dst, m, seed=22, kind=kind)
    with torch.no_grad():
        _, alpha = _run(ops, kind, g, inp, edge_term=True)
        out, dropped = _run(ops, kind, g, inp, edge_term=True, dropout=p, return_attention="dropped")
        _, undropped = _run(ops, kind, g, inp, edge_term=True, dropout=p, return_attention=True)
    torch.testing.assert_close(undropped, alpha, rtol=0, atol=0)  # True: weights before dropout
    kept = dropped != 0
    n = kept.numel()
    frac = kept.double().mean().item()
    sigma = math.sqrt(p * (1 - p) / n)
    assert abs(frac - (1 - p)) < 6 * sigma, (frac, 1 - p)
    # kept weights are scaled by 1 / (1 - p); dropped ones are exactly 0
    torch.testing.assert_close(dropped[kept], alpha[kept] / (1 - p), rtol=1e-12, atol=0)
    # expectation preserved: dropped weights still sum to ~1 per destination on average
    sums = torch.zeros(n_dst, H, dtype=DT).index_add_(0, ei[1], dropped)
    assert abs(sums.mean().item() - 1.0) < 0.02
    # the mask differs between heads and calls (it is random, not structural)
    assert not torch.equal(kept[:, 0], kept[:, 1])
    # out is exactly the dropped weights applied to the messages
    if kind == "gatv2":
        msgs = inp["x_src"][ei[0]]
    else:
        msgs = inp["v"][ei[0]] + inp["edge_term"]
    want = torch.zeros(n_dst, H, D, dtype=DT).index_add_(0, ei[1], dropped.unsqueeze(-1) * msgs.detach())
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("kind", ["gatv2", "dot"])
def test_dropout_gradient_follows_the_mask(graphs, impl, kind):
    """Backward with dropout equals the oracle with the same keep mask applied to alpha."""
    ei, n_src, n_dst, g = graphs["homogeneous"]
    p = 0.3
    inp = _inputs(n_src, n_dst, ei.size(1), seed=23, kind=kind)
    out, dropped = _run(IMPLS[impl], kind, g, inp, edge_term=True, dropout=p, return_attention="dropped")
    keep = (dropped.detach() != 0).to(DT)
    assert 0 < keep.mean() < 1
    _, want_alpha = _oracle(kind, ei, n_src, n_dst, inp, edge_term=True)
    want_dropped = want_alpha * keep / (1 - p)
    msgs = inp["x_src"][ei[0]] if kind == "gatv2" else inp["v"][ei[0]] + inp["edge_term"]
    want_out = torch.zeros(n_dst, H, D, dtype=DT).index_add(0, ei[1], want_dropped.unsqueeze(-1) * msgs)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dropped, want_dropped, rtol=1e-10, atol=1e-12)
    got = _grads(out, dropped, inp, seed=2)
    want = _grads(want_out, want_dropped, inp, seed=2)
    for key in inp:
        torch.testing.assert_close(got[key], want[key], rtol=1e-9, atol=1e-11, msg=lambda s: f"{key}: {s}")


@pytest.mark.parametrize("kind", ["gatv2", "dot"])
def test_dropout_one_drops_everything(graphs, kind):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    inp = _inputs(n_src, n_dst, ei.size(1), seed=24, kind=kind)
    out, dropped = _run(ops, kind, g, inp, edge_term=True, dropout=1.0, return_attention="dropped")
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(dropped, torch.zeros_like(dropped))
    grads = _grads(out, dropped, inp, seed=3)
    for key, gr in grads.items():
        assert gr is None or torch.isfinite(gr).all(), key
