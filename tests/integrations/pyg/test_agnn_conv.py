"""PyG AGNNConv: stock vs gnn_fastpath (dot_attention with q = beta * x_norm, k = x_norm, v = x;
reference ops on the CPU, the kernels under the cuda marker)."""
from __future__ import annotations

import copy
import functools
import itertools

import pytest
import torch

import gnn_fastpath

from ..test_autocast import UNIT, _check_accuracy, _check_dtypes, _run
from .conftest import make_graph

KEY = "pyg.AGNNConv"
N, F_IN = 18, 6
KINDS = ["tensor", "int32", "edge_index_obj", "coo", "csr"]


def _conv(beta=1.7, **kwargs):
    from torch_geometric.nn import AGNNConv

    conv = AGNNConv(**kwargs)
    with torch.no_grad():
        conv.beta.fill_(beta)
    return conv


@functools.lru_cache(maxsize=None)
def _graph(kind, n=N, m=60, seed=0):
    """Graph inputs with self loops, duplicate edges and 2 targets without in-edges (built once)."""
    return make_graph(kind, n, n, m, seed)[0]


def _x(n=N, seed=0, f=F_IN):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, generator=gen)
    x[3] = 0.0  # a zero row: F.normalize's eps keeps it 0, its cosines are 0
    return x.requires_grad_()


def _stock_inputs(kind, x, edge_index):
    # Stock's gradients are wrong for an int32 edge_index on torch 2.13 CPU (scatter's backward
    # with an expanded int32 index): compare against stock on the int64 copy.
    return ((x, edge_index.long()), {}) if kind == "int32" else None


# --------------------------------------------------------------------------- fused grids
@pytest.mark.parametrize("kind,add_self_loops,requires_grad", list(itertools.product(KINDS, [True, False],
                                                                                     [True, False])))
def test_graph_inputs_and_arguments(check, kind, add_self_loops, requires_grad):
    conv = _conv(add_self_loops=add_self_loops, requires_grad=requires_grad)
    x, edge_index = _x(), _graph(kind)
    stock, fused, _ = check.compare(conv, x, edge_index, stock_inputs=_stock_inputs(kind, x, edge_index))
    if requires_grad:  # beta's gradient came back (compared inside check.compare)
        assert isinstance(conv.beta, torch.nn.Parameter)
    else:
        assert "beta" in dict(conv.named_buffers())


@pytest.mark.parametrize("beta", [0.0, -3.0, 25.0])
def test_beta_values(check, beta):
    """beta = 0 (uniform attention), negative, and large (sharp softmax)."""
    check.compare(_conv(beta=beta), _x(seed=1), _graph("tensor", seed=1))


def test_empty_rows_without_self_loops_are_zero(check):
    out = check.compare(_conv(add_self_loops=False), _x(seed=2), _graph("tensor", seed=2))[2]
    assert out[-2:].abs().max() == 0  # the last two targets have no in-edges


def test_graph_without_edges(check):
    check.compare(_conv(), _x(7), torch.empty(2, 0, dtype=torch.long))


def test_wide_features(check):
    """A width the kernels specialise differently (D = 100, masked generic variant)."""
    check.compare(_conv(), _x(f=100, seed=3), _graph("tensor", seed=3))


def test_graph_memoised_and_op_used(monkeypatch):
    calls = []
    original = gnn_fastpath.ops.dot_attention

    def spy(graph, q, k, v, scale=None, **kwargs):
        calls.append((graph, q.shape, scale))
        return original(graph, q, k, v, scale, **kwargs)

    monkeypatch.setattr(gnn_fastpath.ops, "dot_attention", spy)
    x, edge_index = _x(), _graph("tensor")
    conv = _conv()
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        conv(x, edge_index)
        conv(x, edge_index)
    assert [c[1:] for c in calls] == [((N, 1, F_IN), 1.0)] * 2
    assert calls[0][0] is calls[1][0]  # the looped graph is memoised on the input's Graph
    assert calls[0][0].num_edges == edge_index.size(1) - int((edge_index[0] == edge_index[1]).sum()) + N
    assert gnn_fastpath.stats()[KEY] == {"fused": {"cuda": 0, "reference": 2}, "fallback": {}}


def test_cora(check, cora):
    check.compare(_conv(), cora.x.clone().requires_grad_(), cora.edge_index)


def test_tolokers(check, tolokers):
    x, edge_index = tolokers
    check.compare(_conv(add_self_loops=False, beta=3.0), x.clone().requires_grad_(), edge_index)


# --------------------------------------------------------------------------- reduced precision
@pytest.mark.parametrize("mode,dtype", [("module", torch.bfloat16), ("module", torch.float16),
                                        ("autocast", torch.bfloat16), ("autocast_x16", torch.bfloat16)])
def test_reduced_precision_cpu(pyg, mode, dtype):
    """Stock's dtypes (outputs and every gradient) and an error vs float64 within the bounds of
    tests/integrations/test_autocast.py (a half module; CPU autocast with float32 or bf16 x)."""
    gnn_fastpath.reset_stats()
    conv, x, call = _conv(), torch.randn(N, F_IN), ((_graph("tensor"),), {})
    cpu = torch.device("cpu")
    stock = _run(conv, call, x, device=cpu, mode=mode, dtype=dtype)
    fused = _run(conv, call, x, device=cpu, mode=mode, dtype=dtype, framework="pyg")
    base = copy.deepcopy(conv).to(dtype) if mode == "module" else conv
    ref = _run(base, call, x if mode == "autocast" else x.to(dtype), device=cpu, mode="float64", dtype=dtype)
    _check_dtypes(fused, stock)
    _check_accuracy(fused, stock, ref, UNIT[dtype])
    assert gnn_fastpath.stats()[KEY]["fused"]["reference"] == 1


# --------------------------------------------------------------------------- fallbacks
def _duplicate_csr(n=N):
    """A CSR adjacency storing the entry (0 <- 1) twice (PyG's add_self_loops coalesces it)."""
    crow = torch.tensor([0, 2] + [3] * (n - 1))
    col = torch.tensor([1, 1, 0])
    return torch.sparse_csr_tensor(crow, col, torch.ones(3), (n, n))


def test_fallback_csr_with_duplicates(check):
    check.fallback(_conv(), _x(), _duplicate_csr(), reason="duplicates")


def test_csr_with_duplicates_without_self_loops_is_fused(check):
    """Without add_self_loops stock keeps both entries: two edges, as the Graph has."""
    check.compare(_conv(add_self_loops=False), _x(), _duplicate_csr())


@pytest.mark.parametrize("case", ["aggr", "flow", "pair", "batched_x", "float64", "hook", "cpu_stock",
                                  "subclass", "beta_dtype"])
def test_fallbacks(check, case):
    x, edge_index, kwargs, cpu = _x(), _graph("tensor"), {}, "reference"
    conv, reason = _conv(), case
    if case == "aggr":
        conv = _conv(aggr="mean")
    elif case == "flow":
        conv = _conv(flow="target_to_source")
    elif case == "pair":  # stock raises (F.normalize of a tuple)
        x, reason = (x, x), "input"
    elif case == "batched_x":
        x, reason = torch.randn(2, N, F_IN), "input"
    elif case == "float64":
        conv, x, reason = conv.double(), x.double(), "dtype"
    elif case == "hook":
        conv.register_forward_hook(lambda m, i, o: None)
        reason = "hooks"
    elif case == "cpu_stock":
        reason, cpu = "cpu", "stock"
    elif case == "subclass":
        from torch_geometric.nn import AGNNConv

        class Mine(AGNNConv):
            def message(self, x_j, x_norm_i, x_norm_j, index, ptr, size_i):
                return super().message(x_j, x_norm_i, x_norm_j, index, ptr, size_i)

        conv = Mine()
    else:  # a float64 beta buffer with float32 features
        conv = _conv(requires_grad=False)
        conv.beta = conv.beta.double()
        reason = "dtype"
    check.fallback(conv, x, edge_index, reason=reason, cpu=cpu, **kwargs)


# --------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("kind,add_self_loops", [("tensor", True), ("tensor", False), ("csr", True),
                                                 ("edge_index_obj", False), ("super_node", True)])
def test_cuda_matches_stock(check, kind, add_self_loops):
    if kind == "super_node":  # target 0 gets 300 more in-edges (the kernels' chunked rows)
        from zoo import random_edges

        edge_index = random_edges(N, N, 60, 4, empty_rows=2, super_node_degree=300)[0]
    else:
        edge_index = _graph(kind)
    conv = _conv(add_self_loops=add_self_loops).cuda()
    x = _x().detach().cuda()
    edge_index = edge_index.cuda()
    runs = []
    for enabled in (False, True):
        m = copy.deepcopy(conv)
        xi = x.clone().requires_grad_()
        if enabled:
            with gnn_fastpath.enabled(frameworks="pyg"):
                out = m(xi, edge_index)
        else:
            out = m(xi, edge_index)
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).cuda()).sum().backward()
        runs.append((out, xi.grad, m.beta.grad))
    (expected, *expected_grads), (actual, *actual_grads) = runs
    check.close(actual, expected, "output")
    for i, (a, e) in enumerate(zip(actual_grads, expected_grads)):
        check.close(a, e, f"grad {i}", floor=1e-2 * max(g.abs().max().item() for g in expected_grads))
    assert gnn_fastpath.stats()[KEY]["fused"]["cuda"] == 1
