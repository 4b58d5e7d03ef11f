"""spmm and segment_reduce (reference and public ops) against dense float64 math.

Oracles:
- spmm: ``D_dst^a  A_w  D_src^b  x`` with ``A_w`` the dense [n_dst, n_src] adjacency of
  tests/zoo.py (duplicates summed, weighted by edge_weight) and structural degrees taken
  from the unweighted dense adjacency, clamped to >= 1 (DGL GraphConv normalisation).
- segment_reduce without weights: max/min over the dense mask A > 0 (duplicates do not
  change an extreme); with weights: max/min over the dense [n_dst, M] incidence mask of
  the per-edge messages w_e * x_src[src_e] (every copy of a pair is its own candidate).
Destinations without in-edges are 0 in all of them.
"""
import pytest
import torch

from gnn_fastpath import ops, reference
from gnn_fastpath.graph import Graph
from zoo import SMALL_GRAPH_SPECS, dense_adjacency, small_graphs

DT = torch.float64
IMPLS = {"ops": ops, "reference": reference}
NORMS = ["none", "left", "right", "both"]
F_DIM = 4


# ---------------------------------------------------------------------------- oracles
def spmm_dense(ei, n_src, n_dst, x, edge_weight, norm):
    a_w = dense_adjacency(ei, n_src, n_dst, weight=edge_weight)
    a = dense_adjacency(ei, n_src, n_dst)
    in_deg = a.sum(1).clamp(min=1)
    out_deg = a.sum(0).clamp(min=1)
    flat = x.reshape(n_src, -1)
    if norm == "left":
        flat = flat / out_deg.unsqueeze(1)
    elif norm == "both":
        flat = flat / out_deg.sqrt().unsqueeze(1)
    out = a_w @ flat
    if norm == "right":
        out = out / in_deg.unsqueeze(1)
    elif norm == "both":
        out = out / in_deg.sqrt().unsqueeze(1)
    return out.reshape((n_dst,) + x.shape[1:])


def _masked_extreme(cand, mask, reduce):
    """max/min over dim 1 of ``cand`` [n, K, F] where ``mask`` [n, K]; 0 for empty rows."""
    if cand.size(1) == 0:
        return cand.sum(1) * 0  # zeros that still carry the autograd graph
    fill = float("-inf") if reduce == "max" else float("inf")
    m = mask.reshape(mask.shape + (1,) * (cand.dim() - 2))
    picked = torch.where(m, cand, torch.full_like(cand, fill))
    ext = picked.amax(1) if reduce == "max" else picked.amin(1)
    has = mask.any(1).reshape((-1,) + (1,) * (ext.dim() - 1))
    return torch.where(has, ext, torch.zeros_like(ext))


def reduce_dense(ei, n_src, n_dst, x, reduce, edge_weight=None):
    if edge_weight is None:
        mask = dense_adjacency(ei, n_src, n_dst) > 0  # [n_dst, n_src]
        cand = x.unsqueeze(0).expand((n_dst,) + x.shape)
    else:
        mask = ei[1].unsqueeze(0) == torch.arange(n_dst).unsqueeze(1)  # [n_dst, M]
        w = edge_weight.reshape((-1,) + (1,) * (x.dim() - 1))
        cand = (w * x[ei[0]]).unsqueeze(0).expand((n_dst, ei.size(1)) + x.shape[1:])
    return _masked_extreme(cand, mask, reduce)


# ---------------------------------------------------------------------------- graphs
GRAPH_SPECS = SMALL_GRAPH_SPECS


@pytest.fixture(scope="module")
def graphs():
    return small_graphs()


def test_graphs_have_the_awkward_cases(graphs):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    assert torch.unique(ei, dim=1).size(1) < ei.size(1)  # duplicates
    assert bool((ei[0] == ei[1]).any())  # self loops
    for name in ("homogeneous", "bipartite_wide", "bipartite_tall"):
        g = graphs[name][3]
        assert bool((g.in_degree() == 0).any())  # empty destination rows
    assert bool((graphs["bipartite_wide"][3].out_degree() == 0).any())  # isolated sources


def _x(n_src, seed, shape=(F_DIM,)):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((n_src,) + tuple(shape), generator=gen, dtype=DT).requires_grad_()


def _w(m, seed):
    gen = torch.Generator().manual_seed(seed + 1000)
    # positive and negative weights: min/max must see the sign flip
    return torch.randn(m, generator=gen, dtype=DT).requires_grad_()


def _grads(out, leaves, seed):
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=DT)
    return torch.autograd.grad((out * go).sum(), leaves, allow_unused=True)


# ---------------------------------------------------------------------------- spmm
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("name", list(GRAPH_SPECS))
def test_spmm_matches_dense(graphs, impl, norm, weighted, name):
    ei, n_src, n_dst, g = graphs[name]
    x = _x(n_src, seed=1)
    w = _w(ei.size(1), seed=1) if weighted else None
    out = IMPLS[impl].spmm(g, x, w, norm)
    want = spmm_dense(ei, n_src, n_dst, x, w, norm)
    assert out.shape == (n_dst, F_DIM) and out.dtype == DT
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    leaves = [x] + ([w] if weighted else [])
    got = _grads(out, leaves, seed=2)
    exp = _grads(want, leaves, seed=2)
    for a, b in zip(got, exp):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_spmm_explicit_small():
    # 0 -> 1 twice, 2 -> 1, 1 -> 0; destination 2 has no in-edges
    ei = torch.tensor([[0, 2, 0, 1], [1, 1, 1, 0]])
    g = Graph.from_edge_index(ei, 3)
    x = torch.tensor([[1.0], [10.0], [100.0]], dtype=DT)
    assert ops.spmm(g, x).flatten().tolist() == [10.0, 102.0, 0.0]
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=DT)
    assert ops.spmm(g, x, w).flatten().tolist() == [40.0, 1.0 + 200.0 + 3.0, 0.0]
    # right: divide by in-degree (3 for destination 1); left: divide x_j by out-degree
    assert ops.spmm(g, x, norm="right").flatten().tolist() == [10.0, 34.0, 0.0]
    assert ops.spmm(g, x, norm="left").flatten().tolist() == [10.0, 0.5 + 0.5 + 100.0, 0.0]


def test_spmm_trailing_dims(graphs):
    ei, n_src, n_dst, g = graphs["bipartite_wide"]
    x = _x(n_src, seed=3, shape=(2, 3))
    w = _w(ei.size(1), seed=3)
    for norm in NORMS:
        out = ops.spmm(g, x, w, norm)
        assert out.shape == (n_dst, 2, 3)
        torch.testing.assert_close(out, spmm_dense(ei, n_src, n_dst, x, w, norm), rtol=1e-12, atol=1e-12)


def test_spmm_gradcheck():
    ei = torch.tensor([[0, 1, 1, 4, 2, 3, 1, 0], [0, 1, 1, 0, 2, 2, 0, 2]])
    g = Graph.from_edge_index(ei, (5, 4))
    x = _x(5, seed=4, shape=(3,))
    w = _w(ei.size(1), seed=4)
    for norm in NORMS:
        assert torch.autograd.gradcheck(lambda x, w: ops.spmm(g, x, w, norm), (x, w))
        assert torch.autograd.gradcheck(lambda x: ops.spmm(g, x, None, norm), (x,))


@pytest.mark.parametrize("norm", NORMS)
def test_spmm_edge_order_invariance(graphs, norm):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    x = _x(n_src, seed=5)
    w = _w(ei.size(1), seed=5)
    out = ops.spmm(g, x, w, norm)
    p = torch.randperm(ei.size(1), generator=torch.Generator().manual_seed(1))
    out_p = ops.spmm(Graph.from_edge_index(ei[:, p], (n_src, n_dst)), x, w[p], norm)
    torch.testing.assert_close(out_p, out, rtol=1e-12, atol=1e-13)
    # weights are read in caller order: shuffling them alone changes the result
    assert not torch.allclose(ops.spmm(g, x, w[p], norm), out)


@pytest.mark.parametrize("norm", NORMS)
def test_spmm_weights_do_not_enter_degrees(graphs, norm):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    x = _x(n_src, seed=6).detach()
    w = torch.full((ei.size(1),), 3.0, dtype=DT)
    torch.testing.assert_close(ops.spmm(g, x, w, norm), 3.0 * ops.spmm(g, x, None, norm), rtol=1e-13, atol=1e-13)


# ---------------------------------------------------------------------------- segment_reduce
@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("name", list(GRAPH_SPECS))
def test_segment_reduce_matches_dense(graphs, impl, reduce, weighted, name):
    ei, n_src, n_dst, g = graphs[name]
    x = _x(n_src, seed=7)
    w = _w(ei.size(1), seed=7) if weighted else None
    out = IMPLS[impl].segment_reduce(g, x, reduce, w)
    want = reduce_dense(ei, n_src, n_dst, x, reduce, w)
    assert out.shape == (n_dst, F_DIM) and out.dtype == DT
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    leaves = [x] + ([w] if weighted else [])
    got = _grads(out, leaves, seed=8)
    exp = _grads(want, leaves, seed=8)
    for a, b in zip(got, exp):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_segment_reduce_explicit_small():
    ei = torch.tensor([[0, 2, 0, 1], [1, 1, 1, 0]])
    g = Graph.from_edge_index(ei, 3)
    x = torch.tensor([[1.0, -5.0], [10.0, 7.0], [-100.0, 3.0]], dtype=DT)
    assert ops.segment_reduce(g, x, "max").tolist() == [[10.0, 7.0], [1.0, 3.0], [0.0, 0.0]]
    assert ops.segment_reduce(g, x, "min").tolist() == [[10.0, 7.0], [-100.0, -5.0], [0.0, 0.0]]
    w = torch.tensor([1.0, -1.0, 2.0, 0.5], dtype=DT)
    # destination 1: messages 1*x0, -1*x2, 2*x0 -> max (100, 5), min (1, -10)
    assert ops.segment_reduce(g, x, "max", w).tolist() == [[5.0, 3.5], [100.0, -3.0], [0.0, 0.0]]
    assert ops.segment_reduce(g, x, "min", w).tolist() == [[5.0, 3.5], [1.0, -10.0], [0.0, 0.0]]


def test_segment_reduce_all_negative_row_is_not_clamped_to_zero():
    """include_self must be off: a row whose messages are all negative keeps its max < 0."""
    ei = torch.tensor([[0, 1], [0, 0]])
    g = Graph.from_edge_index(ei, 2)
    x = torch.tensor([[-3.0], [-2.0]], dtype=DT)
    assert ops.segment_reduce(g, x, "max").flatten().tolist() == [-2.0, 0.0]
    assert ops.segment_reduce(g, -x, "min").flatten().tolist() == [2.0, 0.0]


def test_segment_reduce_tie_gradient_is_split():
    """Duplicate edges are exact ties: each gets half the gradient, x_j gets it all."""
    ei = torch.tensor([[1, 1, 0], [0, 0, 0]])
    g = Graph.from_edge_index(ei, 2)
    x = torch.tensor([[0.0], [5.0]], dtype=DT, requires_grad=True)
    w = torch.ones(3, dtype=DT, requires_grad=True)
    ops.segment_reduce(g, x, "max", w).sum().backward()
    assert x.grad.flatten().tolist() == [0.0, 1.0]
    assert w.grad.tolist() == [2.5, 2.5, 0.0]


def test_segment_reduce_trailing_dims(graphs):
    ei, n_src, n_dst, g = graphs["bipartite_tall"]
    x = _x(n_src, seed=9, shape=(2, 3))
    w = _w(ei.size(1), seed=9)
    for reduce in ("max", "min"):
        out = ops.segment_reduce(g, x, reduce, w)
        assert out.shape == (n_dst, 2, 3)
        torch.testing.assert_close(out, reduce_dense(ei, n_src, n_dst, x, reduce, w), rtol=0, atol=0)


def test_segment_reduce_gradcheck():
    ei = torch.tensor([[0, 1, 1, 4, 2, 3, 1, 0], [0, 1, 1, 0, 2, 2, 0, 2]])
    g = Graph.from_edge_index(ei, (5, 4))
    x = _x(5, seed=10, shape=(3,))
    w = _w(ei.size(1), seed=10)
    for reduce in ("max", "min"):
        assert torch.autograd.gradcheck(lambda x, w: ops.segment_reduce(g, x, reduce, w), (x, w))
        assert torch.autograd.gradcheck(lambda x: ops.segment_reduce(g, x, reduce), (x,))


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_segment_reduce_edge_order_invariance(graphs, reduce):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    x = _x(n_src, seed=11)
    w = _w(ei.size(1), seed=11)
    out = ops.segment_reduce(g, x, reduce, w)
    p = torch.randperm(ei.size(1), generator=torch.Generator().manual_seed(2))
    out_p = ops.segment_reduce(Graph.from_edge_index(ei[:, p], (n_src, n_dst)), x, reduce, w[p])
    assert torch.equal(out_p, out)
    assert not torch.equal(ops.segment_reduce(g, x, reduce, w[p]), out)


# ---------------------------------------------------------------------------- empty rows and graphs
@pytest.mark.parametrize("op", ["spmm_none", "spmm_both", "max", "min"])
@pytest.mark.parametrize("name", list(GRAPH_SPECS))
def test_empty_rows_exact_zero_no_nan(graphs, op, name):
    ei, n_src, n_dst, g = graphs[name]
    x = _x(n_src, seed=12)
    w = _w(ei.size(1), seed=12)
    if op.startswith("spmm"):
        out = ops.spmm(g, x, w, op.split("_")[1])
    else:
        out = ops.segment_reduce(g, x, op, w)
    empty = g.in_degree() == 0
    assert empty.any()
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert torch.isfinite(out).all()
    gx, gw = _grads(out, [x, w], seed=13)
    assert torch.isfinite(gx).all() and torch.isfinite(gw).all()
    # sources with no out-edges receive no gradient
    isolated = g.out_degree() == 0
    assert torch.equal(gx[isolated], torch.zeros_like(gx[isolated]))


@pytest.mark.parametrize("op", ["spmm", "max", "min"])
def test_zero_nodes(op):
    g = Graph.from_edge_index(torch.empty(2, 0, dtype=torch.int64), 0)
    x = torch.zeros(0, F_DIM, dtype=DT, requires_grad=True)
    w = torch.zeros(0, dtype=DT, requires_grad=True)
    out = ops.spmm(g, x, w, "both") if op == "spmm" else ops.segment_reduce(g, x, op, w)
    assert out.shape == (0, F_DIM)
    out.sum().backward()
    assert x.grad.shape == (0, F_DIM)


def test_degree_norms_helper(graphs):
    ei, n_src, n_dst, g = graphs["bipartite_wide"]
    a = dense_adjacency(ei, n_src, n_dst)
    src, dst = reference.degree_norms(g, "both", DT)
    torch.testing.assert_close(src, a.sum(0).clamp(min=1).rsqrt(), rtol=1e-15, atol=0)
    torch.testing.assert_close(dst, a.sum(1).clamp(min=1).rsqrt(), rtol=1e-15, atol=0)
    assert reference.degree_norms(g, "none", DT) == (None, None)
    src, dst = reference.degree_norms(g, "left", torch.float32)
    assert dst is None and src.dtype == torch.float32
    src, dst = reference.degree_norms(g, "right", DT)
    assert src is None
    torch.testing.assert_close(dst, 1.0 / a.sum(1).clamp(min=1), rtol=1e-15, atol=0)


def test_float32_inputs_follow_dtype(graphs):
    ei, n_src, n_dst, g = graphs["homogeneous"]
    x = torch.randn(n_src, F_DIM)
    w = torch.rand(ei.size(1))
    out = ops.spmm(g, x, w, "both")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), spmm_dense(ei, n_src, n_dst, x.double(), w.double(), "both"),
                               rtol=1e-5, atol=1e-5)
    assert ops.segment_reduce(g, x, "max", w).dtype == torch.float32
