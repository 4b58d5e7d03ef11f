"""PyG GraphConv: stock vs gnn_fastpath (spmm for add/mean, segment_reduce for max/min, with edge
weights; reference ops on the CPU, the kernels under the cuda marker).

Features and edge weights are integer-valued, so max/min meet ties between weighted messages
everywhere and the gradient comparisons (x, the weights, the parameters) check the tie rule.
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

KEY = "pyg.GraphConv"
F_IN, F_OUT, N = 6, 5, 18
AGGRS = ["add", "mean", "max", "min"]
KINDS = ["tensor", "int32", "edge_index_obj", "sorted_edge_index", "coo", "csr"]
WEIGHTS = [None, "plain", "grad"]


@pytest.fixture(autouse=True, scope="module")
def _string_aggregation_first(pyg):
    """PyG compiles the class's ``propagate`` at its first instantiation (fused branch only if
    that instance fuses): make the first one a plain string aggregation."""
    from torch_geometric.nn import GraphConv

    GraphConv(2, 2)


def _conv(aggr="add", in_channels=F_IN, **kwargs):
    from torch_geometric.nn import GraphConv

    torch.manual_seed(0)
    return GraphConv(in_channels, F_OUT, aggr=aggr, **kwargs)


def _tied(n, f=F_IN, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, (n, f), generator=gen).float().requires_grad_()


@functools.lru_cache(maxsize=None)
def _graph(kind, n_src=N, n_dst=N, m=60, seed=0):
    """A graph input (built once): zero in-degree rows, self loops, duplicates; torch.sparse
    adjacencies get integer values in {1, 2}; ``sorted_edge_index`` is an EdgeIndex sorted by
    target (stock's fused ``EdgeIndex.matmul`` path)."""
    if kind == "sorted_edge_index":
        edge_index = make_graph("edge_index_obj", n_src, n_dst, m, seed)[0]
        return edge_index.sort_by("col")[0]
    graph, nnz = make_graph(kind, n_src, n_dst, m, seed)
    if kind in ("coo", "csr"):
        coo = graph.to_sparse_coo().coalesce() if kind == "csr" else graph
        values = torch.randint(1, 3, (nnz,), generator=torch.Generator().manual_seed(seed + 100)).float()
        coo = torch.sparse_coo_tensor(coo.indices(), values, coo.shape).coalesce()
        graph = coo.to_sparse_csr() if kind == "csr" else coo
    return graph


def _num_edges(graph):
    return graph._nnz() if graph.layout != torch.strided else graph.size(1)


def _weight(kind, m, seed=3):
    if kind is None:
        return None
    w = torch.randint(1, 3, (m,), generator=torch.Generator().manual_seed(seed)).float()
    return w.requires_grad_(kind == "grad")


def _stock_inputs(kind, x, edge_index, *rest):
    # Stock's gradients are wrong for an int32 edge_index on torch 2.13 CPU: compare against
    # stock on the int64 copy.
    return ((x, edge_index.long(), *rest), {}) if kind == "int32" else None


def _fused_case(aggr, kind):
    return not (kind == "sorted_edge_index" and aggr in ("max", "min"))


# --------------------------------------------------------------------------- fused grids
@pytest.mark.parametrize("aggr,kind,weight", [c for c in itertools.product(AGGRS, KINDS, WEIGHTS)
                                              if _fused_case(c[0], c[1])])
def test_aggregations_graph_inputs_and_weights(check, aggr, kind, weight):
    conv = _conv(aggr)
    edge_index = _graph(kind)
    x, w = _tied(N), _weight(weight, _num_edges(edge_index))  # a torch.sparse input ignores w (as stock)
    check.compare(conv, x, edge_index, w, stock_inputs=_stock_inputs(kind, x, edge_index, w))


@pytest.mark.parametrize("aggr,bias", list(itertools.product(AGGRS, [True, False])))
def test_bipartite_size_and_missing_target_side(check, aggr, bias):
    n_src, n_dst = 15, 11
    edge_index = _graph("tensor", n_src, 8, seed=9)  # targets < 8: rows 8..10 stay empty
    conv = _conv(aggr, in_channels=(F_IN, 4), bias=bias)
    w = _weight("grad", edge_index.size(1))
    out = check.compare(conv, (_tied(n_src), _tied(n_dst, 4, seed=1)), edge_index, w, size=(n_src, n_dst))[2]
    assert out.shape == (n_dst, F_OUT)
    out = check.compare(conv, (_tied(n_src), None), edge_index, w, (n_src, n_dst))[2]
    assert out.shape == (n_dst, F_OUT)


@pytest.mark.parametrize("name", ["SumAggregation", "MeanAggregation", "MaxAggregation", "MinAggregation"])
@pytest.mark.parametrize("kind", ["sorted_edge_index", "csr"])
def test_aggregation_modules(check, name, kind):
    """A plain aggregation module: stock does not fuse, messages ``w * x_j`` everywhere (a
    torch.sparse adjacency's values ignored, edge_weight used)."""
    from torch_geometric.nn import aggr

    conv = _conv(getattr(aggr, name)())
    edge_index = _graph(kind, seed=5)
    check.compare(conv, _tied(N, seed=4), edge_index, _weight("grad", _num_edges(edge_index)))


@pytest.mark.parametrize("aggr", ["add", "max"])
def test_empty_graph(check, aggr):
    check.compare(_conv(aggr), _tied(7), torch.empty(2, 0, dtype=torch.long), torch.empty(0))


@pytest.mark.parametrize("wrong", ["even", "first", "last"])
def test_tie_rule_is_exercised(check, monkeypatch, wrong):
    conv, edge_index, x = _conv("max"), _graph("tensor", seed=1), _tied(N, seed=12)
    w = _weight("grad", edge_index.size(1))
    check.compare(conv, x, edge_index, w)
    original = gnn_fastpath.ops.segment_reduce
    monkeypatch.setattr(gnn_fastpath.ops, "segment_reduce",
                        lambda g, x, reduce="max", edge_weight=None, tie_break="split", **k:
                        original(g, x, reduce, edge_weight, wrong))
    with pytest.raises(AssertionError, match="grad of"):
        check.compare(conv, x, edge_index, w)


def test_ops_used(monkeypatch):
    calls = []
    for name in ("segment_reduce", "spmm"):
        original = getattr(gnn_fastpath.ops, name)
        monkeypatch.setattr(gnn_fastpath.ops, name,
                            lambda g, x, *a, _n=name, _o=original, **k: calls.append(_n) or _o(g, x, *a, **k))
    edge_index = _graph("tensor", seed=13)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        for aggr in AGGRS:
            _conv(aggr)(torch.randn(N, F_IN), edge_index, torch.rand(edge_index.size(1)))
    assert calls == ["spmm", "spmm", "segment_reduce", "segment_reduce"]
    assert gnn_fastpath.stats()[KEY] == {"fused": {"cuda": 0, "reference": 4}, "fallback": {}}


def test_cora(check, cora):
    for aggr in ("mean", "max"):
        check.compare(_conv(aggr, in_channels=cora.num_features), cora.x.clone().requires_grad_(),
                      cora.edge_index, torch.rand(cora.edge_index.size(1)).requires_grad_())


@pytest.mark.parametrize("mode", ["module", "autocast", "autocast_x16"])
@pytest.mark.parametrize("aggr,weighted", [("add", True), ("mean", False), ("max", True)])
def test_reduced_precision_cpu(pyg, mode, aggr, weighted):
    """Stock's dtypes and an error vs float64 within test_autocast.py's bounds (bfloat16)."""
    dtype, cpu = torch.bfloat16, torch.device("cpu")
    edge_index = _graph("tensor")
    call = ((edge_index, torch.rand(edge_index.size(1)) + 0.5) if weighted else (edge_index,), {})
    conv, x = _conv(aggr), torch.randn(N, F_IN)
    stock = _run(conv, call, x, device=cpu, mode=mode, dtype=dtype)
    gnn_fastpath.reset_stats()
    fused = _run(conv, call, x, device=cpu, mode=mode, dtype=dtype, framework="pyg")
    half = mode == "module"
    base = copy.deepcopy(conv).to(dtype) if half else conv
    ref_call = ((edge_index, call[0][1].to(dtype)) if weighted and half else call[0], {})
    ref = _run(base, ref_call, x if mode == "autocast" else x.to(dtype), device=cpu, mode="float64", dtype=dtype)
    _check_dtypes(fused, stock)
    _check_accuracy(fused, stock, ref, UNIT[dtype])
    assert gnn_fastpath.stats()[KEY]["fused"]["reference"] == 1


@pytest.mark.parametrize("aggr", ["max", "min"])
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_non_finite_features(aggr, bad):
    x = torch.randn(N, F_IN)
    x[0, :3] = float(bad)
    edge_index = _graph("tensor")
    w = torch.rand(edge_index.size(1)) + 0.5
    conv = _conv(aggr)
    x_stock, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = conv(x_stock, edge_index, w)
    want.sum().backward()
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        got = conv(x_ours, edge_index, w)
    got.sum().backward()
    torch.testing.assert_close(got, want, equal_nan=True)
    torch.testing.assert_close(x_ours.grad, x_stock.grad, equal_nan=True)


# --------------------------------------------------------------------------- fallbacks
@pytest.mark.parametrize("aggr", ["max", "min"])
def test_fallback_sorted_edge_index_max(check, aggr):
    """EdgeIndex.matmul's max/min: its backend (torch.sparse, torch-sparse, scatter) sets the tie rule."""
    check.fallback(_conv(aggr), _tied(N), _graph("sorted_edge_index"), reason="edge_index_reduce")


@pytest.mark.parametrize("case", ["softmax", "flow", "size_mismatch", "batched_x", "float64", "hook", "cpu_stock",
                                  "subclass", "weight_2d", "weight_float64", "sparse_values_grad"])
def test_fallbacks(check, case):
    n = 12
    edge_index, x, kwargs, cpu = _graph("tensor", n, n), _tied(n), {}, "reference"
    conv, reason, w = _conv("max"), case, None
    if case == "softmax":
        conv, reason = _conv("softmax"), "aggr"
    elif case == "flow":
        conv = _conv("add", flow="target_to_source")
    elif case == "size_mismatch":
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
        from torch_geometric.nn import GraphConv

        class Doubled(GraphConv):
            def message(self, x_j, edge_weight):
                return 2 * x_j

        conv = Doubled(F_IN, F_OUT)
    elif case == "weight_2d":  # stock's view(-1, 1) takes it; the fused path wants [M]
        w, reason = torch.rand(edge_index.size(1), 1), "edge_weight"
    elif case == "weight_float64":
        w, reason = torch.rand(edge_index.size(1), dtype=torch.float64), "dtype"
    else:
        adj = _graph("csr", n, n)
        edge_index = torch.sparse_csr_tensor(adj.crow_indices(), adj.col_indices(),
                                             adj.values().clone().requires_grad_(), adj.shape)
        conv, reason = _conv("add"), "sparse_grad"
    check.fallback(conv, x, edge_index, w, reason=reason, cpu=cpu, **kwargs)


# --------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("aggr,kind", [("add", "tensor"), ("mean", "sorted_edge_index"), ("add", "csr"),
                                       ("max", "tensor"), ("min", "edge_index_obj"), ("mean", "super_node")])
def test_cuda_matches_stock(check, aggr, kind, no_cpu_only_torch_sparse):
    import torch_geometric.typing

    if kind == "super_node":
        from zoo import random_edges

        edge_index = random_edges(N, N, 60, 4, empty_rows=2, super_node_degree=300)[0]
    else:
        edge_index = _graph(kind, seed=3)
    x = _tied(N).detach()
    if torch_geometric.typing.WITH_TORCH_SCATTER and aggr in ("max", "min"):
        x = torch.randn_like(x)  # stock's scatter_max gives a tie to an arbitrary edge
    w = torch.rand(_num_edges(edge_index)) + 0.5
    conv = _conv(aggr).cuda()
    edge_index, w = edge_index.cuda(), w.cuda()
    runs = []
    for enabled in (False, True):
        m = copy.deepcopy(conv)
        xi, wi = x.cuda().requires_grad_(), w.clone().requires_grad_()
        if enabled:
            with gnn_fastpath.enabled(frameworks="pyg"):
                out = m(xi, edge_index, wi)
        else:
            out = m(xi, edge_index, wi)
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).cuda()).sum().backward()
        runs.append((out, [p.grad for p in m.parameters()] + [xi.grad, wi.grad]))
    (expected, expected_grads), (actual, actual_grads) = runs
    check.close(actual, expected, "output")
    floor = 1e-2 * max(g.abs().max().item() for g in expected_grads if g is not None)
    for i, (a, e) in enumerate(zip(actual_grads, expected_grads)):
        assert (a is None) == (e is None)
        if e is not None:
            check.close(a, e, f"grad {i}", floor=floor)
    assert gnn_fastpath.stats()[KEY]["fused"]["cuda"] == 1
