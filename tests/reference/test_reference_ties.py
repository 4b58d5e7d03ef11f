"""Tie rules of the reference min/max aggregation against the frameworks' own autograd.

Inputs with many exact ties (small integers, as after a ReLU: lots of exact zeros). The
reference's ``tie_break`` rules must reproduce, bit for bit on these inputs:

- ``"split"``: torch ``scatter_reduce(include_self=False)`` on zeros (PyG's scatter path);
- ``"even"``: g / (number of tied edges), checked against the formula;
- ``"first"``/``"last"``: DGL's ``update_all`` with ``fn.max``/``fn.min``, whichever of the two
  the DGL build running the tests follows for the message (``fn.copy_u``, ``fn.u_mul_e`` with
  [M, F] edge data or a broadcast [M] / [M, 1] weight): DGL's plain loop keeps the first tied
  edge, its libxsmm kernel (AVX-512 CPUs, no broadcast) the last. The rule comes from
  :func:`gnn_fastpath.integrations.dgl.ties.tie_break`, so this is also the test of that probe
  on random tied inputs.
"""
import pytest
import torch

from gnn_fastpath import Graph, segment_reduce
from gnn_fastpath.reference import segment_reduce as ref_segment_reduce
from zoo import random_edges

TIE_BREAKS = ("split", "even", "first", "last")


def _tied_inputs(seed, n_src=40, n_dst=30, m=300, f=6, weighted=False, dtype=torch.float64):
    edge_index, _ = random_edges(n_src, n_dst, m, seed=seed, empty_rows=3)
    gen = torch.Generator().manual_seed(seed)
    x = torch.relu(torch.randint(-2, 3, (n_src, f), generator=gen)).to(dtype)  # many exact zeros
    w = torch.randint(1, 3, (edge_index.size(1),), generator=gen).to(dtype) if weighted else None
    return edge_index, x, w


def _grads(fn, x, w, seed=1):
    x = x.clone().requires_grad_(True)
    w = None if w is None else w.clone().requires_grad_(True)
    out = fn(x, w)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    out.backward(g)
    return out.detach(), x.grad, None if w is None else w.grad


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_split_is_torch_scatter_reduce(reduce, weighted, seed):
    edge_index, x, w = _tied_inputs(seed, weighted=weighted)
    n_dst = 30
    graph = Graph.from_edge_index(edge_index, (40, n_dst))
    src, dst = edge_index

    def stock(x, w):  # PyG scatter(reduce="max") without torch-scatter
        msg = x[src] if w is None else x[src] * w.view(-1, 1)
        idx = dst.view(-1, 1).expand_as(msg)
        return msg.new_zeros(n_dst, msg.size(1)).scatter_reduce_(0, idx, msg, "a" + reduce, include_self=False)

    want = _grads(stock, x, w)
    got = _grads(lambda x, w: ref_segment_reduce(graph, x, reduce, w, "split"), x, w)
    for a, b in zip(want, got):
        if a is not None:
            torch.testing.assert_close(b, a, rtol=0, atol=1e-12)


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_even_splits_by_tie_count(reduce, weighted, seed):
    """``"even"``: g / n to each of the n tied edges. (Not compared with
    ``torch._segment_reduce``: its CPU backward for 2-D inputs in torch 2.13 sometimes hands
    the full gradient to every tied edge, e.g. one column of a row but not the next.)"""
    edge_index, x, w = _tied_inputs(seed, weighted=weighted)
    graph = Graph.from_edge_index(edge_index, (40, 30))
    out, gx, gw = _grads(lambda x, w: ref_segment_reduce(graph, x, reduce, w, "even"), x, w)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    src, dst = graph.indices, graph.dst_index()
    we = torch.ones(graph.num_edges, dtype=x.dtype) if w is None else w[graph.perm]
    msg = x[src] * we.view(-1, 1)
    tied = (msg == out[dst]).to(x.dtype)
    count = torch.zeros_like(out).index_add_(0, dst, tied)
    dmsg = tied * g[dst] / count[dst].clamp(min=1)
    want_gx = torch.zeros_like(x).index_add_(0, src, dmsg * we.view(-1, 1))
    torch.testing.assert_close(gx, want_gx, rtol=0, atol=1e-12)
    if w is not None:
        want_gw = torch.zeros_like(w)
        want_gw[graph.perm] = (dmsg * x[src]).sum(1)
        torch.testing.assert_close(gw, want_gw, rtol=0, atol=1e-12)


def _dgl_reduce(dgl, edge_index, n_src, n_dst, x, w, reduce, bipartite):
    import dgl.function as fn

    src, dst = edge_index
    if bipartite:
        g = dgl.create_block((src, dst), num_src_nodes=n_src, num_dst_nodes=n_dst)
    else:
        g = dgl.graph((src, dst), num_nodes=n_src)
    g.srcdata["h"] = x
    red = getattr(fn, reduce)
    if w is None:
        g.update_all(fn.copy_u("h", "m"), red("m", "o"))
    else:
        g.edata["w"] = w
        g.update_all(fn.u_mul_e("h", "w", "m"), red("m", "o"))
    return g.dstdata["o"]


@pytest.mark.dgl
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("case", ["copy_u", "u_mul_e_full", "u_mul_e_broadcast", "u_mul_e_1d"])
@pytest.mark.parametrize("bipartite", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dgl_rules(dgl, reduce, case, bipartite, seed):
    from gnn_fastpath.integrations.dgl.ties import tie_break

    message = "copy_u" if case == "copy_u" else "u_mul_e"
    rule = tie_break(torch.device("cpu"), message, broadcast=case in ("u_mul_e_broadcast", "u_mul_e_1d"), reduce=reduce)
    n = 40
    n_dst = 30 if bipartite else n
    edge_index, x, w = _tied_inputs(seed, n_src=n, n_dst=n_dst, weighted=case != "copy_u",
                                    dtype=torch.float32)
    graph = Graph.from_edge_index(edge_index, (n, n_dst))
    m, f = edge_index.size(1), x.size(1)
    if case == "u_mul_e_full":  # per-feature edge data: compare against a weight that is constant
        w_dgl = lambda w: w.view(-1, 1).expand(m, f)  # noqa: E731
    elif case == "u_mul_e_broadcast":
        w_dgl = lambda w: w.view(-1, 1)  # noqa: E731
    else:
        w_dgl = lambda w: w  # noqa: E731

    want = _grads(lambda x, w: _dgl_reduce(dgl, edge_index, n, n_dst, x, None if w is None else w_dgl(w),
                                           reduce, bipartite), x, w)
    got = _grads(lambda x, w: ref_segment_reduce(graph, x, reduce, w, rule), x, w)
    for a, b in zip(want, got):
        if a is not None:
            torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    # and the other single-edge rule really differs on these inputs (the test has teeth)
    other = "first" if rule == "last" else "last"
    alt = _grads(lambda x, w: ref_segment_reduce(graph, x, reduce, w, other), x, w)
    assert not torch.allclose(alt[1], want[1])


@pytest.mark.parametrize("tie_break", TIE_BREAKS)
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_rules_share_value_and_total_gradient(tie_break, reduce):
    """Every rule gives the same value, and routes each output's gradient to its tied edges."""
    edge_index, x, w = _tied_inputs(3, weighted=True)
    graph = Graph.from_edge_index(edge_index, (40, 30))
    base = ref_segment_reduce(graph, x, reduce, w, "split")
    out, gx, gw = _grads(lambda x, w: ref_segment_reduce(graph, x, reduce, w, tie_break), x, w)
    torch.testing.assert_close(out, base, rtol=0, atol=0)
    # empty rows (the last 3 destinations) are 0 and send nothing back
    assert torch.all(out[-3:] == 0)
    if tie_break in ("even", "first", "last"):
        # with one weight per edge, sum_e w_e * dmsg_e over tied edges recovers sum of g
        # on every nonempty row: check via the linearity identity <g, out> = <gx, x>
        # (out is positively homogeneous of degree 1 in x).
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
        torch.testing.assert_close((gx * x).sum(), (g * out).sum(), rtol=1e-10, atol=1e-10)


def test_public_op_passes_tie_break():
    edge_index, x, _ = _tied_inputs(4)
    graph = Graph.from_edge_index(edge_index, (40, 30))
    a = _grads(lambda x, w: segment_reduce(graph, x, "max", tie_break="first"), x, None)
    b = _grads(lambda x, w: ref_segment_reduce(graph, x, "max", None, "first"), x, None)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)
    with pytest.raises(ValueError, match="tie_break"):
        segment_reduce(graph, x, "max", tie_break="random")
