"""PyG GINConv: stock vs gnn_fastpath (spmm for sum/mean, segment_reduce for max/min; reference
ops on the CPU, the kernels under the cuda marker).

Features are integer-valued, so max/min meet tied extremes everywhere and the gradient
comparisons check the tie rule of each path (``"split"`` for PyG's scatter, ``"first"`` for
torch.sparse.mm); :func:`test_tie_rule_is_exercised` shows a wrong rule fails on them.
"""
from __future__ import annotations

import copy
import functools
import itertools

import pytest
import torch

import gnn_fastpath

from ..test_autocast import UNIT, _check_accuracy, _check_dtypes, _run
from .conftest import make_graph

KEY = "pyg.GINConv"
F_IN, F_OUT, N = 6, 5, 18
AGGRS = ["add", "sum", "mean", "max", "min"]
KINDS = ["tensor", "int32", "edge_index_obj", "coo", "csr"]


@pytest.fixture(autouse=True, scope="module")
def _string_aggregation_first(pyg):
    """PyG compiles GINConv's ``propagate`` at its first instantiation, with the fused sparse
    branch only if that instance fuses: make the first one a plain string aggregation."""
    from torch_geometric.nn import GINConv

    GINConv(torch.nn.Identity())


def _conv(aggr="add", eps=0.25, train_eps=False, f_in=F_IN, nn=None):
    from torch_geometric.nn import GINConv

    torch.manual_seed(0)
    nn = nn if nn is not None else torch.nn.Sequential(torch.nn.Linear(f_in, F_OUT), torch.nn.ReLU(),
                                                       torch.nn.Linear(F_OUT, F_OUT))
    return GINConv(nn, eps=eps, train_eps=train_eps, aggr=aggr)


def _tied(n, f=F_IN, seed=0):
    """Integer-valued features in {-2, ..., 2}: ties everywhere, many zeros."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, (n, f), generator=gen).float().requires_grad_()


@functools.lru_cache(maxsize=None)
def _graph(kind, n_src=N, n_dst=N, m=60, seed=0):
    """A graph input (built once) with zero in-degree rows, self loops and duplicates; a
    torch.sparse adjacency gets integer values in {1, 2} (weighted messages tie too)."""
    graph, nnz = make_graph(kind, n_src, n_dst, m, seed)
    if kind in ("coo", "csr"):
        coo = graph.to_sparse_coo().coalesce() if kind == "csr" else graph
        values = torch.randint(1, 3, (nnz,), generator=torch.Generator().manual_seed(seed + 100)).float()
        coo = torch.sparse_coo_tensor(coo.indices(), values, coo.shape).coalesce()
        graph = coo.to_sparse_csr() if kind == "csr" else coo
    return graph


def _stock_inputs(kind, x, edge_index, *rest):
    # Stock's gradients are wrong for an int32 edge_index on torch 2.13 CPU (the backward of
    # scatter with an expanded int32 index): compare against stock on the int64 copy.
    return ((x, edge_index.long(), *rest), {}) if kind == "int32" else None


# --------------------------------------------------------------------------- fused grids
@pytest.mark.parametrize("aggr,kind,train_eps", list(itertools.product(AGGRS, KINDS, [False, True])))
def test_aggregations_and_graph_inputs(check, aggr, kind, train_eps):
    conv = _conv(aggr, train_eps=train_eps)
    x, edge_index = _tied(N), _graph(kind, seed=int(train_eps))
    check.compare(conv, x, edge_index, stock_inputs=_stock_inputs(kind, x, edge_index))


@pytest.mark.parametrize("name", ["SumAggregation", "MeanAggregation", "MaxAggregation", "MinAggregation"])
@pytest.mark.parametrize("kind", ["tensor", "coo", "csr"])
def test_aggregation_modules(check, name, kind):
    """A plain aggregation module: stock does not fuse, so a torch.sparse adjacency's values
    are ignored and min/max split ties (scatter)."""
    from torch_geometric.nn import aggr

    conv = _conv(getattr(aggr, name)())
    assert not conv.fuse
    check.compare(conv, _tied(N, seed=4), _graph(kind, seed=5))


@pytest.mark.parametrize("aggr,kind", list(itertools.product(["add", "mean", "max"],
                                                             ["tensor", "edge_index_obj", "coo", "csr"])))
def test_bipartite(check, aggr, kind):
    n_src, n_dst = 20, 12
    x = (_tied(n_src, seed=6), _tied(n_dst, seed=7))
    check.compare(_conv(aggr, train_eps=True), x, _graph(kind, n_src, n_dst, seed=8))


@pytest.mark.parametrize("aggr", ["add", "max"])
def test_size_and_missing_target_side(check, aggr):
    """``size`` sets the target count; ``(x_src, None)`` has no root term, its target count from
    ``size`` or from ``x_src``."""
    n_src, n_dst = 15, 11
    edge_index = _graph("tensor", n_src, 8, seed=9)  # targets < 8: rows 8..10 stay empty
    conv = _conv(aggr, train_eps=True)
    out = check.compare(conv, (_tied(n_src), _tied(n_dst, seed=1)), edge_index, size=(n_src, n_dst))[2]
    assert out.shape == (n_dst, F_OUT)
    out = check.compare(conv, (_tied(n_src), None), edge_index, (n_src, n_dst))[2]
    assert out.shape == (n_dst, F_OUT)
    out = check.compare(conv, (_tied(n_src), None), edge_index)[2]
    assert out.shape == (n_src, F_OUT)


@pytest.mark.parametrize("nn", ["identity", "lambda"])
def test_nn_forms(check, nn):
    """``nn`` as given: an Identity module or a plain function."""
    conv = _conv("mean", nn=torch.nn.Identity() if nn == "identity" else (lambda t: 2 * t))
    check.compare(conv, _tied(N, seed=2), _graph("tensor", seed=2))


@pytest.mark.parametrize("aggr", ["add", "max"])
def test_empty_graph(check, aggr):
    check.compare(_conv(aggr), _tied(7), torch.empty(2, 0, dtype=torch.long))


@pytest.mark.parametrize("aggr", ["add", "mean", "max"])
def test_deterministic_segment_path(check, aggr):
    """Under deterministic algorithms on a target-sorted EdgeIndex stock reduces with
    torch._segment_reduce: sum and mean are fused, max runs stock (no tie rule to copy)."""
    from torch_geometric import EdgeIndex

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        conv = _conv(aggr)
    finally:
        torch.use_deterministic_algorithms(previous)
    edge_index, _ = make_graph("tensor", N, N, 60, 10)
    edge_index = EdgeIndex(edge_index, sparse_size=(N, N)).sort_by("col")[0]
    if aggr == "max":
        check.fallback(conv, _tied(N, seed=10), edge_index, reason="segment_ties")
    else:
        check.compare(conv, _tied(N, seed=10), edge_index)


@pytest.mark.parametrize("case,wrong", [("tensor", "even"), ("tensor", "first"), ("csr", "split")])
def test_tie_rule_is_exercised(check, monkeypatch, case, wrong):
    conv, edge_index, x = _conv("max", nn=torch.nn.Identity()), _graph(case, seed=1), _tied(N, seed=12)
    check.compare(conv, x, edge_index)
    original = gnn_fastpath.ops.segment_reduce
    monkeypatch.setattr(gnn_fastpath.ops, "segment_reduce",
                        lambda g, x, reduce="max", edge_weight=None, tie_break="split", **k:
                        original(g, x, reduce, edge_weight, wrong))
    with pytest.raises(AssertionError, match="grad of"):
        check.compare(conv, x, edge_index)


def test_ops_used(monkeypatch):
    calls = []
    for name in ("segment_reduce", "spmm"):
        original = getattr(gnn_fastpath.ops, name)
        monkeypatch.setattr(gnn_fastpath.ops, name,
                            lambda g, x, *a, _n=name, _o=original, **k: calls.append(_n) or _o(g, x, *a, **k))
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        for aggr in ("max", "min", "mean", "add"):
            _conv(aggr)(torch.randn(N, F_IN), _graph("tensor", seed=13))
    assert calls == ["segment_reduce", "segment_reduce", "spmm", "spmm"]
    assert gnn_fastpath.stats()[KEY] == {"fused": {"cuda": 0, "reference": 4}, "fallback": {}}


def test_cora(check, cora):
    for aggr in ("add", "max"):
        check.compare(_conv(aggr, f_in=cora.num_features, train_eps=True), cora.x.clone().requires_grad_(),
                      cora.edge_index)


@pytest.mark.parametrize("mode,dtype", [("module", torch.bfloat16), ("autocast", torch.bfloat16),
                                        ("autocast_x16", torch.bfloat16)])
@pytest.mark.parametrize("aggr", ["add", "max"])
def test_reduced_precision_cpu(pyg, mode, dtype, aggr):
    """Stock's dtypes and an error vs float64 within test_autocast.py's bounds."""
    conv, x, call = _conv(aggr, train_eps=True), torch.randn(N, F_IN), ((_graph("tensor"),), {})
    cpu = torch.device("cpu")
    stock = _run(conv, call, x, device=cpu, mode=mode, dtype=dtype)
    gnn_fastpath.reset_stats()
    fused = _run(conv, call, x, device=cpu, mode=mode, dtype=dtype, framework="pyg")
    base = copy.deepcopy(conv).to(dtype) if mode == "module" else conv
    ref = _run(base, call, x if mode == "autocast" else x.to(dtype), device=cpu, mode="float64", dtype=dtype)
    _check_dtypes(fused, stock)
    _check_accuracy(fused, stock, ref, UNIT[dtype])
    assert gnn_fastpath.stats()[KEY]["fused"]["reference"] == 1


@pytest.mark.parametrize("aggr", ["max", "min"])
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_non_finite_features(check, aggr, bad):
    """torch's scatter semantics (NaN wins, infinities are values): values and gradients,
    NaN positions included."""
    x = torch.randn(N, F_IN)
    x[0, :3] = float(bad)
    conv = _conv(aggr, nn=torch.nn.Identity())
    x_stock, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = conv(x_stock, _graph("tensor"))
    want.sum().backward()
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        got = conv(x_ours, _graph("tensor"))
    got.sum().backward()
    torch.testing.assert_close(got, want, equal_nan=True)
    torch.testing.assert_close(x_ours.grad, x_stock.grad, equal_nan=True)


# --------------------------------------------------------------------------- fallbacks
@pytest.mark.parametrize("case", ["softmax", "std", "flow", "size_mismatch", "batched_x", "float64", "hook",
                                  "cpu_stock", "subclass", "sparse_values_grad", "eps_device"])
def test_fallbacks(check, case):
    n = 12
    edge_index, x, kwargs, cpu = _graph("tensor", n, n), _tied(n), {}, "reference"
    conv, reason = _conv("max"), case
    if case in ("softmax", "std"):
        from torch_geometric import EdgeIndex

        conv, reason = _conv(case), "aggr"
        edge_index = EdgeIndex(edge_index, sparse_size=(n, n)).sort_by("col")[0].as_subclass(torch.Tensor)
    elif case == "flow":
        from torch_geometric.nn import GINConv

        conv = GINConv(torch.nn.Identity(), flow="target_to_source")
    elif case == "size_mismatch":  # stock raises
        reason, kwargs = "size", dict(size=(n, n + 3))
    elif case == "batched_x":
        reason, x = "input", torch.randn(2, n, F_IN)
    elif case == "float64":
        conv, x, reason = conv.double(), x.double(), "dtype"
    elif case == "hook":
        conv.register_forward_hook(lambda m, i, o: None)
        reason = "hooks"
    elif case == "cpu_stock":
        reason, cpu = "cpu", "stock"
    elif case == "subclass":
        from torch_geometric.nn import GINConv

        class Doubled(GINConv):
            def message(self, x_j):
                return 2 * x_j

        conv = Doubled(torch.nn.Identity())
    elif case == "sparse_values_grad":
        adj = _graph("csr", n, n)
        edge_index = torch.sparse_csr_tensor(adj.crow_indices(), adj.col_indices(),
                                             adj.values().clone().requires_grad_(), adj.shape)
        conv, reason = _conv("add"), "sparse_grad"
    else:  # eps on the meta device: stock raises mixing devices
        conv.eps = torch.zeros(1, device="meta")
        reason = "device"
    check.fallback(conv, x, edge_index, reason=reason, cpu=cpu, **kwargs)


# --------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("aggr,kind", [("add", "tensor"), ("mean", "csr"), ("max", "tensor"), ("min", "edge_index_obj"),
                                       ("add", "super_node"), ("max", "bipartite")])
def test_cuda_matches_stock(check, aggr, kind):
    import torch_geometric.typing

    conv = _conv(aggr, train_eps=True).cuda()
    if kind == "bipartite":
        x = (torch.randn(20, F_IN), torch.randn(12, F_IN))
        edge_index = _graph("tensor", 20, 12, seed=2)
    elif kind == "super_node":
        from zoo import random_edges

        x, edge_index = torch.randn(N, F_IN), random_edges(N, N, 60, 4, empty_rows=2, super_node_degree=300)[0]
    else:
        x, edge_index = _tied(N).detach(), _graph(kind, seed=3)
        if torch_geometric.typing.WITH_TORCH_SCATTER and aggr in ("max", "min"):
            x = torch.randn_like(x)  # stock's scatter_max gives a tie to an arbitrary edge
    xs = x if isinstance(x, tuple) else (x,)
    edge_index = edge_index.cuda()
    runs = []
    for enabled in (False, True):
        m = copy.deepcopy(conv)
        inputs = tuple(t.cuda().requires_grad_() for t in xs)
        arg = inputs if isinstance(x, tuple) else inputs[0]
        if enabled:
            with gnn_fastpath.enabled(frameworks="pyg"):
                out = m(arg, edge_index)
        else:
            out = m(arg, edge_index)
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).cuda()).sum().backward()
        runs.append((out, [p.grad for p in m.parameters()] + [t.grad for t in inputs]))
    (expected, expected_grads), (actual, actual_grads) = runs
    check.close(actual, expected, "output")
    floor = 1e-2 * max(g.abs().max().item() for g in expected_grads)
    for i, (a, e) in enumerate(zip(actual_grads, expected_grads)):
        check.close(a, e, f"grad {i}", floor=floor)
    assert gnn_fastpath.stats()[KEY]["fused"]["cuda"] == 1
