"""PyG GATConv: stock vs gnn_fastpath (reference ops on the CPU; CUDA under the cuda marker).

The checks GATConv shares with GATv2Conv are in test_gat_family.py; these are GATConv's own."""
from __future__ import annotations

import copy
import functools
import itertools

import pytest
import torch

import gnn_fastpath

from .conftest import make_graph
from .gat_common import F_DST, F_IN, F_SRC, make_conv, make_x

KEY = "pyg.GATConv"
_conv = functools.partial(make_conv, "GATConv")


# lin: in_channels=int (one projection ``lin``); split: in_channels=(F, F), so a single x goes
# through ``lin_src`` and ``lin_dst`` separately.
MODULE_GRID = list(itertools.product([1, 2], [True, False], [True, False], [True, False], [True, False],
                                     ["lin", "split"]))


@pytest.mark.parametrize("heads,concat,residual,bias,add_self_loops,lin", MODULE_GRID)
def test_module_arguments(check, heads, concat, residual, bias, add_self_loops, lin):
    conv = _conv(in_channels=F_IN if lin == "lin" else (F_IN, F_IN), heads=heads, concat=concat,
                 residual=residual, bias=bias, add_self_loops=add_self_loops,
                 negative_slope=0.1 if heads == 2 else 0.2)
    assert (conv.lin is None) == (lin == "split")
    edge_index, _ = make_graph("tensor", 20, 20, 50, seed=heads)
    rw = [None, True][(concat + residual + bias) % 2]
    check.compare(conv, make_x(20), edge_index, return_attention_weights=rw)


@pytest.mark.parametrize("add_self_loops", [True, False])
@pytest.mark.parametrize("fill_value", ["mean", 0.5, "tensor", "max"])
def test_edge_attr_without_edge_dim_is_ignored(check, add_self_loops, fill_value):
    """Stock's edge_update uses edge_attr only with lin_edge: without edge_dim it runs the
    self-loop bookkeeping on it (remove, fill) and then ignores it. So does the fused path."""
    if fill_value == "tensor":
        fill_value = torch.tensor([1.0, 2.0])
    conv = _conv(heads=2, add_self_loops=add_self_loops, fill_value=fill_value)
    edge_index, m = make_graph("tensor", 16, 16, 40, seed=5)
    check.compare(conv, make_x(16), edge_index, torch.randn(m, 2, requires_grad=True), return_attention_weights=True)


@pytest.mark.parametrize("add_self_loops", [True, False])
@pytest.mark.parametrize("n_src,n_dst", [(14, 14), (16, 9), (9, 16)])
def test_pair_with_one_projection(check, add_self_loops, n_src, n_dst):
    """A module built with in_channels=int given an (x_src, x_dst) pair: ``lin`` projects both."""
    conv = _conv(heads=2, add_self_loops=add_self_loops, residual=True, fill_value=1.5, edge_dim=2)
    edge_index, m = make_graph("tensor", n_src, n_dst, 40, seed=n_src)
    x = (make_x(n_src), make_x(n_dst))
    check.compare(conv, x, edge_index, torch.randn(m, 2, requires_grad=True), return_attention_weights=True)


@pytest.mark.parametrize("size", [False, True])
@pytest.mark.parametrize("add_self_loops", [True, False])
@pytest.mark.parametrize("kind", ["tensor", "coo"])
def test_pair_without_targets(check, size, add_self_loops, kind):
    """``(x_src, None)``: the logit is the source term alone, no residual, and the output has
    ``size[1]`` rows (else one per source)."""
    if kind == "coo" and add_self_loops:
        pytest.skip("a torch.sparse adjacency with add_self_loops falls back")
    n_src = 15
    n_dst = 9 if size or kind == "coo" else n_src
    conv = _conv(in_channels=(F_SRC, F_DST), heads=2, add_self_loops=add_self_loops, residual=True,
                 edge_dim=2, fill_value="max" if size else "add")
    edge_index, m = make_graph(kind, n_src, n_dst, 40, seed=4)
    kwargs = dict(edge_attr=torch.randn(m, 2, requires_grad=True), return_attention_weights=True)
    if size:
        kwargs["size"] = (n_src, n_dst)
    _, _, out = check.compare(conv, (make_x(n_src, F_SRC), None), edge_index, **kwargs)
    assert out[0].shape == (n_dst, 8)


@pytest.mark.parametrize("bipartite", [False, True])
@pytest.mark.parametrize("add_self_loops", [True, False])
def test_size_argument(check, bipartite, add_self_loops):
    n_src, n_dst = (17, 10) if bipartite else (13, 13)
    conv = _conv(in_channels=(F_SRC, F_DST) if bipartite else F_IN, heads=2, add_self_loops=add_self_loops)
    edge_index, _ = make_graph("tensor", n_src, n_dst, 40, seed=7)
    x = (make_x(n_src, F_SRC), make_x(n_dst, F_DST)) if bipartite else make_x(n_src)
    check.compare(conv, x, edge_index, size=(n_src, n_dst), return_attention_weights=True)
    check.compare(conv, x, edge_index, None, (n_src, n_dst))  # positional, as stock's signature


def test_graph_without_edges(check):
    """No edges (and no loops added): stock's edge_update returns before lin_edge, whose
    gradients stay None; the output is the bias (and residual) alone."""
    conv = _conv(heads=2, add_self_loops=False, edge_dim=2, residual=True)
    edge_index = torch.empty(2, 0, dtype=torch.long)
    _, fused, out = check.compare(conv, make_x(6), edge_index, torch.randn(0, 2), return_attention_weights=True)
    assert fused.lin_edge.weight.grad is None
    assert out[1][1].shape == (0, 2)


def test_gat_model_with_edge_features(check):
    """PyG's GAT model (v2=False) with edge features: every layer fused, as stock."""
    from torch_geometric.nn.models import GAT

    torch.manual_seed(0)
    stock = GAT(F_IN, 8, num_layers=2, out_channels=3, heads=2, edge_dim=2).eval()
    model = copy.deepcopy(stock)
    edge_index, m = make_graph("tensor", 20, 20, 60)
    x, edge_attr = torch.randn(20, F_IN), torch.randn(m, 2)
    expected = stock(x, edge_index, edge_attr=edge_attr)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        actual = model(x, edge_index, edge_attr=edge_attr)
    assert gnn_fastpath.stats()[KEY] == {"fused": {"cuda": 0, "reference": 2}, "fallback": {}}
    check.close(actual, expected, "output")


# --------------------------------------------------------------------------- fallbacks
@pytest.mark.parametrize("add_self_loops", [True, False])
def test_fallback_torch_sparse_tensor(check, add_self_loops):
    """A torch_sparse.SparseTensor adjacency runs stock (set_diag for self loops, the
    attention returned as the SparseTensor's values), counted under "edge_index"."""
    torch_sparse = pytest.importorskip("torch_sparse")
    edge_index, _ = make_graph("tensor", 12, 12, 30, loops=False)
    adj_t = torch_sparse.SparseTensor.from_edge_index(edge_index.flip(0), sparse_sizes=(12, 12))
    check.fallback(_conv(heads=2, add_self_loops=add_self_loops), torch.randn(12, F_IN), adj_t,
                   reason="edge_index", return_attention_weights=True)


# --------------------------------------------------------------------------- GPU
def _cuda_run(module, args, kwargs, enabled):
    args = tuple(tuple(t.detach().clone().requires_grad_() if t is not None else None for t in a)
                 if isinstance(a, tuple) else a.detach().clone().requires_grad_() if a.is_floating_point() else a
                 for a in args)
    module.zero_grad(set_to_none=True)
    if enabled:
        with gnn_fastpath.enabled(frameworks="pyg"):
            out = module(*args, **kwargs)
    else:
        out = module(*args, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    out, alpha = outs[0], outs[1][1] if len(outs) > 1 else None
    gen = torch.Generator().manual_seed(7)
    loss = (out * torch.randn(out.shape, generator=gen).to(out.device)).sum()
    if alpha is not None:
        loss = loss + (alpha * torch.randn(alpha.shape, generator=gen).to(out.device)).sum()
    loss.backward()
    leaves = [t for a in args for t in (a if isinstance(a, tuple) else (a,)) if t is not None and t.requires_grad]
    return (out, alpha), [p.grad for p in module.parameters()] + [t.grad for t in leaves]


@pytest.mark.cuda
@pytest.mark.parametrize("case", ["plain", "edge_dim", "bipartite", "mean_heads", "super_node", "no_targets"])
def test_cuda_matches_stock(check, case):
    from zoo import random_edges

    n = 40
    edge_index, m = make_graph("tensor", n, n, 160, seed=1)
    x = (make_x(n),)
    kwargs = dict(return_attention_weights=True)
    if case == "plain":
        conv = _conv(heads=4, out_channels=32, residual=True)
    elif case == "edge_dim":
        conv = _conv(heads=2, out_channels=64, edge_dim=3)
        kwargs["edge_attr"] = torch.randn(m, 3)
    elif case == "bipartite":
        conv = _conv(in_channels=(F_SRC, F_DST), heads=2, out_channels=16, residual=True)
        edge_index, _ = make_graph("tensor", 30, 12, 100, seed=2)
        x = ((make_x(30, F_SRC), make_x(12, F_DST)),)
    elif case == "mean_heads":
        conv = _conv(heads=3, out_channels=8, concat=False)
    elif case == "super_node":  # target 0 gets 300 more in-edges (the kernels' heavy rows)
        conv = _conv(heads=2, out_channels=32)
        edge_index, _ = random_edges(n, n, 60, 4, empty_rows=2, super_node_degree=300)
    else:
        conv = _conv(in_channels=(F_SRC, F_DST), heads=2, out_channels=16, add_self_loops=False)
        edge_index, _ = make_graph("tensor", 30, 12, 100, seed=2)
        x = ((make_x(30, F_SRC), None),)
        kwargs["size"] = (30, 12)
    cuda = lambda t: (tuple(u.cuda() if u is not None else None for u in t) if isinstance(t, tuple)  # noqa: E731
                      else t.cuda())
    args = tuple(cuda(a) for a in x) + (edge_index.cuda(),)
    kwargs = {k: cuda(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    expected, expected_grads = _cuda_run(copy.deepcopy(conv).cuda(), args, kwargs, False)
    actual, actual_grads = _cuda_run(copy.deepcopy(conv).cuda(), args, kwargs, True)
    assert actual[0].is_cuda
    for a, e, what in zip(actual, expected, ("output", "attention")):
        check.close(a, e, what)
    floor = 1e-2 * max(g.abs().max().item() for g in expected_grads if g is not None)
    for i, (a, e) in enumerate(zip(actual_grads, expected_grads)):
        assert (a is None) == (e is None), i
        if e is not None:
            check.close(a, e, f"grad {i}", floor=floor)
    counts = gnn_fastpath.stats()[KEY]
    assert counts["fused"]["cuda"] > 0 and counts["fallback"] == {}, counts
