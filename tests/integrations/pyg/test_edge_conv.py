"""PyG EdgeConv and DynamicEdgeConv: stock vs gnn_fastpath.

- ``nn`` one Linear: node-level (``U_i + aggr_j V_j``), no edge tensor;
- ``nn`` a Sequential starting with a Linear: partial reorganisation (first Linear on the
  nodes, the rest per edge, messages reduced by the ops over the edge graph), switched by
  ``integrations.pyg.edge_conv.PARTIAL``;
- anything else: stock (reason ``nn``).

The graphs have duplicate edges (tied messages) and targets without in-edges.
"""
from __future__ import annotations

import copy
import functools
import itertools

import pytest
import torch
from torch import nn

import gnn_fastpath
from gnn_fastpath.integrations.pyg import edge_conv as shim

from ..test_autocast import UNIT, _check_accuracy, _check_dtypes, _run
from .conftest import make_graph

KEY = "pyg.EdgeConv"
F_IN, HIDDEN, F_OUT, N = 5, 8, 4, 18
AGGRS = ["max", "min", "add", "mean"]
KINDS = ["tensor", "int32", "edge_index_obj", "coo", "csr"]


def _linear(kind, f_in=F_IN, out=F_OUT, bias=True):
    torch.manual_seed(1)
    if kind == "pyg_linear":
        from torch_geometric.nn import Linear

        return Linear(2 * f_in, out, bias=bias)
    lin = nn.Linear(2 * f_in, out, bias=bias)
    return nn.Sequential(lin) if kind == "sequential" else lin


def _mlp(widening=False, extra=()):
    """Sequential(Linear(2F, H), ReLU, *extra, Linear(H, F_OUT)); H > 2F when ``widening``."""
    torch.manual_seed(2)
    h = 4 * F_IN if widening else HIDDEN
    return nn.Sequential(nn.Linear(2 * F_IN, h), nn.ReLU(), *extra, nn.Linear(h, F_OUT))


def _conv(net, aggr="max", **kwargs):
    from torch_geometric.nn import EdgeConv

    return EdgeConv(net, aggr=aggr, **kwargs)


def _x(n=N, seed=0, f=F_IN):
    return torch.randn(n, f, generator=torch.Generator().manual_seed(seed)).requires_grad_()


def _tied(n=N, seed=0):
    """Integer-valued features in {-1, 0, 1}: with :func:`_exact` weights every message is
    computed exactly on both paths, so messages equal in exact arithmetic tie on both.
    (With rounding, the two paths round the same exact value differently: BLAS may even round
    equal rows of one product differently by their position; a tie in one path, not in the
    other. See integrations/edge_conv.py.)"""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-1, 2, (n, F_IN), generator=gen).float().requires_grad_()


def _exact(conv):
    """Small integer weights and half-integer biases on every Linear of ``conv.nn`` (all float
    arithmetic exact; a message is never exactly 0 before a ReLU). After construction:
    EdgeConv resets ``nn``'s parameters."""
    gen = torch.Generator().manual_seed(21)
    net = conv.nn
    for m in ([net] if not isinstance(net, nn.Sequential) else list(net)):
        if isinstance(m, nn.Linear):
            with torch.no_grad():
                m.weight.copy_(torch.randint(-2, 3, m.weight.shape, generator=gen))
                if m.bias is not None:
                    m.bias.copy_(torch.randint(-2, 3, m.bias.shape, generator=gen) + 0.5)
    return conv


@functools.lru_cache(maxsize=None)
def _graph(kind, n_src=N, n_dst=N, m=60, seed=0):
    return make_graph(kind, n_src, n_dst, m, seed)[0]


def _stock_inputs(kind, x, edge_index):
    # Stock's gradients are wrong for an int32 edge_index on torch 2.13 CPU: compare against
    # stock on the int64 copy.
    return ((x, edge_index.long()), {}) if kind == "int32" else None


@pytest.fixture
def partial(monkeypatch):
    def set_mode(mode):
        monkeypatch.setattr(shim, "PARTIAL", mode)

    return set_mode


# --------------------------------------------------------------------------- one Linear
@pytest.mark.parametrize("aggr,kind", list(itertools.product(AGGRS, KINDS)))
def test_one_linear_graph_inputs(check, aggr, kind):
    conv = _conv(_linear("torch"), aggr)
    x, edge_index = _x(), _graph(kind)
    check.compare(conv, x, edge_index, stock_inputs=_stock_inputs(kind, x, edge_index))


@pytest.mark.parametrize("aggr,linear,bias", list(itertools.product(AGGRS, ["torch", "pyg_linear", "sequential"],
                                                                    [True, False])))
def test_one_linear_forms(check, aggr, linear, bias):
    check.compare(_conv(_linear(linear, bias=bias), aggr), _x(seed=1), _graph("tensor", seed=1))


@pytest.mark.parametrize("aggr", AGGRS)
def test_one_linear_bipartite(check, aggr):
    n_src, n_dst = 20, 12
    out = check.compare(_conv(_linear("torch"), aggr), (_x(n_src, seed=2), _x(n_dst, seed=3)),
                        _graph("tensor", n_src, n_dst, seed=2))[2]
    assert out.shape == (n_dst, F_OUT)
    assert out[-2:].abs().max() == 0  # targets without in-edges get 0 (not U_i)


def test_one_linear_builds_no_edge_tensor(monkeypatch):
    """Node-level: no [M, *] tensor of the message width, and the op sees [N_src, F_OUT]."""
    seen = []
    original = gnn_fastpath.ops.segment_reduce
    monkeypatch.setattr(gnn_fastpath.ops, "segment_reduce",
                        lambda g, x, *a, **k: seen.append((g.n_src, tuple(x.shape))) or original(g, x, *a, **k))
    edge_index = _graph("tensor")
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        _conv(_linear("torch"))(_x(), edge_index)
    assert seen == [(N, (N, F_OUT))]


@pytest.mark.parametrize("aggr", ["max", "min"])
def test_one_linear_ties_are_exercised(check, monkeypatch, aggr):
    """Sources with equal features tie (equal messages, extreme not 0): the "even" rule is
    stock's there, and a rule giving the tie to one edge gives other gradients."""
    conv, x, edge_index = _exact(_conv(_linear("torch"), aggr)), _tied(seed=4), _graph("tensor", seed=4)
    check.compare(conv, x, edge_index)
    original = gnn_fastpath.ops.segment_reduce
    monkeypatch.setattr(gnn_fastpath.ops, "segment_reduce",
                        lambda g, x, reduce="max", edge_weight=None, tie_break="split", **k:
                        original(g, x, reduce, edge_weight, "first"))
    with pytest.raises(AssertionError, match="grad of"):
        check.compare(conv, x, edge_index)


def test_known_difference_at_zero_extreme():
    """Documented: where the aggregated maximum is exactly 0 and tied, torch's scatter counts
    its untouched zero as one more candidate (stock loses that share of the gradient); the
    node-level path gives the tied edges g / n. Values agree; gradients differ only there:
    with every feature 0 every message is an exact 0 (tied extremes of 0), with node 0's
    features 1 the two tied messages into node 0 are not 0 and the gradients agree."""
    edge_index = torch.tensor([[1, 2, 0], [0, 0, 1]])  # target 0 has two sources, target 1 one
    conv = _conv(_linear("torch", bias=False))
    # exact arithmetic on both paths (BLAS may round equal rows differently by their position),
    # and no message of the "one" case is 0: [x_i, x_j - x_i] meets weights in Z + 1/4 and Z + 1/2
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        w = conv.nn.weight
        w.copy_(torch.randint(-2, 3, w.shape, generator=gen).float())
        w[:, :F_IN] += 0.25
        w[:, F_IN:] += 0.5
    grads = {}
    for case in ("zero", "one"):
        x = torch.zeros(3, F_IN)
        if case == "one":
            x[0] = 1.0
        x_stock, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
        want = conv(x_stock, edge_index)
        want.sum().backward()
        with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
            got = conv(x_ours, edge_index)
        got.sum().backward()
        torch.testing.assert_close(got, want)
        grads[case] = (x_ours.grad, x_stock.grad)
    assert not torch.allclose(*grads["zero"])
    torch.testing.assert_close(*grads["one"])


# --------------------------------------------------------------------------- partial
@pytest.mark.parametrize("aggr,kind", list(itertools.product(AGGRS, KINDS)))
def test_partial_graph_inputs(check, partial, aggr, kind):
    partial("auto")  # H = 8 <= 2F = 10: runs
    conv = _exact(_conv(_mlp(), aggr))
    x, edge_index = _tied(seed=5), _graph(kind, seed=5)  # exact arithmetic: ties everywhere
    check.compare(conv, x, edge_index, stock_inputs=_stock_inputs(kind, x, edge_index))


@pytest.mark.parametrize("aggr", AGGRS)
def test_partial_always_widening_and_bipartite(check, partial, aggr):
    partial("always")
    conv = _conv(_mlp(widening=True), aggr)
    check.compare(conv, _x(seed=6), _graph("tensor", seed=6))
    check.compare(conv, (_x(20, seed=7), _x(12, seed=8)), _graph("tensor", 20, 12, seed=7))


def test_partial_batch_norm_and_dropout(partial):
    """BatchNorm1d over the edge rows (train mode) and Dropout after the first Linear: the
    edge tensor has stock's rows in stock's order, so the statistics and the dropout mask
    (same RNG draws) agree."""
    partial("always")
    conv = _conv(_mlp(extra=(nn.BatchNorm1d(HIDDEN), nn.Dropout(0.3))))
    edge_index = _graph("tensor", seed=9)
    runs = []
    for enabled in (False, True):
        m, x = copy.deepcopy(conv), _x(seed=9)
        torch.manual_seed(11)
        if enabled:
            with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
                out = m(x, edge_index)
        else:
            out = m(x, edge_index)
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(3))).sum().backward()
        runs.append([out, x.grad] + [p.grad for p in m.parameters()] + [m.nn[2].running_mean])
    for a, e in zip(*runs[::-1]):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    assert gnn_fastpath.stats()[KEY]["fused"]["reference"] == 1


def test_partial_reduces_over_edge_graph(monkeypatch, partial):
    partial("always")
    seen = []
    original = gnn_fastpath.ops.segment_reduce
    monkeypatch.setattr(gnn_fastpath.ops, "segment_reduce",
                        lambda g, x, *a, **k: seen.append((g.n_src, tuple(x.shape))) or original(g, x, *a, **k))
    edge_index = _graph("tensor")
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        _conv(_mlp())(_x(), edge_index)
    m = edge_index.size(1)
    assert seen == [(m, (m, F_OUT))]


def test_partial_split_tie_rule_is_exercised(check, partial, monkeypatch):
    """Messages exactly 0 at a tied maximum (integer final bias): torch's scatter then counts
    its own zero as one more candidate; only stock's "split" rule on the messages reproduces
    the gradients, "even" does not."""
    partial("always")
    conv, x, edge_index = _exact(_conv(_mlp())), _tied(seed=12), _graph("tensor", seed=12)
    with torch.no_grad():
        conv.nn[-1].bias.sub_(0.5)  # integer: messages can be exactly 0
    check.compare(conv, x, edge_index)
    original = gnn_fastpath.ops.segment_reduce
    monkeypatch.setattr(gnn_fastpath.ops, "segment_reduce",
                        lambda g, x, reduce="max", edge_weight=None, tie_break="split", **k:
                        original(g, x, reduce, edge_weight, "even"))
    with pytest.raises(AssertionError, match="grad of"):
        check.compare(conv, x, edge_index)


def test_cora(check, cora):
    from torch_geometric.nn import EdgeConv

    torch.manual_seed(0)
    f = cora.num_features
    check.compare(EdgeConv(nn.Linear(2 * f, 16)), cora.x.clone().requires_grad_(), cora.edge_index)


def test_tolokers(check, tolokers, partial):
    from torch_geometric.nn import EdgeConv

    partial("always")
    x, edge_index = tolokers
    torch.manual_seed(0)
    f = x.size(1)
    conv = EdgeConv(nn.Sequential(nn.Linear(2 * f, 16), nn.ReLU(), nn.Linear(16, 8)), aggr="max")
    check.compare(conv, x.clone().requires_grad_(), edge_index)


@pytest.mark.parametrize("mode", ["module", "autocast", "autocast_x16"])
@pytest.mark.parametrize("net,aggr", [("linear", "max"), ("linear", "add"), ("mlp", "max"), ("mlp", "mean")])
def test_reduced_precision_cpu(pyg, partial, mode, net, aggr):
    """Stock's dtypes and an error vs float64 within test_autocast.py's bounds (bfloat16):
    the node terms are float32 and the message is rounded once (integrations/edge_conv.py)."""
    partial("always")
    dtype, cpu = torch.bfloat16, torch.device("cpu")
    conv = _conv(_linear("torch") if net == "linear" else _mlp(), aggr)
    x, call = torch.randn(N, F_IN), ((_graph("tensor"),), {})
    stock = _run(conv, call, x, device=cpu, mode=mode, dtype=dtype)
    gnn_fastpath.reset_stats()
    fused = _run(conv, call, x, device=cpu, mode=mode, dtype=dtype, framework="pyg")
    base = copy.deepcopy(conv).to(dtype) if mode == "module" else conv
    ref = _run(base, call, x if mode == "autocast" else x.to(dtype), device=cpu, mode="float64", dtype=dtype)
    _check_dtypes(fused, stock)
    _check_accuracy(fused, stock, ref, UNIT[dtype])
    assert gnn_fastpath.stats()[KEY]["fused"]["reference"] == 1


# --------------------------------------------------------------------------- fallbacks
class _Hooked:
    @staticmethod
    def first():
        net = _mlp()
        net[0].register_forward_hook(lambda m, i, o: None)
        return net

    @staticmethod
    def sequential():
        net = nn.Sequential(nn.Linear(2 * F_IN, F_OUT))
        net.register_forward_pre_hook(lambda m, i: None)
        return net


@pytest.mark.parametrize("case", ["nn_relu_first", "nn_mlp", "nn_function", "partial_never", "partial_auto_widening",
                                  "hook_first_linear", "hook_sequential", "width", "x_dst_none", "x_dst_width",
                                  "aggr", "flow", "float64", "cpu_stock", "subclass", "deterministic_max"])
def test_fallbacks(check, partial, case):
    x, edge_index, cpu, reason = _x(), _graph("tensor"), "reference", case
    partial("auto")
    conv = _conv(_linear("torch"))
    if case == "nn_relu_first":
        conv, reason = _conv(nn.Sequential(nn.ReLU(), nn.Linear(2 * F_IN, F_OUT))), "nn"
    elif case == "nn_mlp":
        from torch_geometric.nn import MLP

        conv, reason = _conv(MLP([2 * F_IN, HIDDEN, F_OUT])), "nn"
    elif case == "nn_function":
        conv, reason = _conv(lambda t: t[:, :F_OUT].relu()), "nn"
    elif case == "partial_never":
        partial("never")
        conv, reason = _conv(_mlp()), "partial_reorganisation"
    elif case == "partial_auto_widening":
        conv, reason = _conv(_mlp(widening=True)), "partial_reorganisation"
    elif case == "hook_first_linear":
        conv, reason = _conv(_Hooked.first()), "hooks"
    elif case == "hook_sequential":
        conv, reason = _conv(_Hooked.sequential()), "hooks"
    elif case == "width":  # stock raises (the Linear does not take 2F features)
        conv, reason = _conv(nn.Linear(2 * F_IN + 1, F_OUT)), "input"
    elif case == "x_dst_none":
        x, reason = (x, None), "input"
    elif case == "x_dst_width":
        x, reason = (x, _x(f=F_IN + 1)), "input"
    elif case == "aggr":
        conv = _conv(_linear("torch"), "softmax")
    elif case == "flow":
        conv = _conv(_linear("torch"), flow="target_to_source")
    elif case == "float64":
        conv, x, reason = conv.double(), x.double(), "dtype"
    elif case == "cpu_stock":
        reason, cpu = "cpu", "stock"
    elif case == "subclass":
        from torch_geometric.nn import EdgeConv

        class Mine(EdgeConv):
            def message(self, x_i, x_j):
                return self.nn(torch.cat([x_i, x_j], dim=-1))

        conv = Mine(_linear("torch"))
    else:
        from torch_geometric import EdgeIndex

        previous = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            conv = _conv(_mlp())
        finally:
            torch.use_deterministic_algorithms(previous)
        edge_index = EdgeIndex(edge_index, sparse_size=(N, N)).sort_by("col")[0]
        reason = "segment_ties"
    check.fallback(conv, x, edge_index, reason=reason, cpu=cpu)


# --------------------------------------------------------------------------- DynamicEdgeConv
def _dynamic(monkeypatch, net, k=4, aggr="max"):
    """A DynamicEdgeConv built without pyg-lib (PyG refuses unless WITH_KNN)."""
    import torch_geometric.typing
    from torch_geometric.nn import DynamicEdgeConv

    monkeypatch.setattr(torch_geometric.typing, "WITH_KNN", True)
    return DynamicEdgeConv(net, k=k, aggr=aggr)


def _brute_knn(x, y, ptr_x, ptr_y, k, cosine, num_workers):
    """pyg-lib's knn contract: for each row of y its k nearest rows of x (same batch),
    returned as [2, *] (row 0: y index, row 1: x index); ties by index."""
    bx = torch.zeros(x.size(0), dtype=torch.long) if ptr_x is None else \
        torch.repeat_interleave(torch.arange(ptr_x.numel() - 1), ptr_x.diff())
    by = torch.zeros(y.size(0), dtype=torch.long) if ptr_y is None else \
        torch.repeat_interleave(torch.arange(ptr_y.numel() - 1), ptr_y.diff())
    d = torch.cdist(y.detach().double(), x.detach().double())
    d[by[:, None] != bx[None, :]] = float("inf")
    kk = min(k, x.size(0))
    idx = torch.sort(d, dim=1, stable=True).indices[:, :kk]
    rows = torch.arange(y.size(0)).repeat_interleave(kk)
    cols = idx.reshape(-1)
    keep = torch.isfinite(d[rows, cols])
    return torch.stack([rows[keep], cols[keep]])


@pytest.fixture
def fake_knn():
    """``torch.ops.pyg.knn`` registered for this test only (brute force, CPU)."""
    lib = torch.library.Library("pyg", "FRAGMENT")
    lib.define("knn(Tensor x, Tensor y, Tensor? ptr_x, Tensor? ptr_y, int k, bool cosine, int num_workers) "
               "-> Tensor")
    lib.impl("knn", _brute_knn, "CompositeExplicitAutograd")
    yield
    lib._destroy()


def test_dynamic_fallback_without_knn(check, monkeypatch):
    conv = _dynamic(monkeypatch, _linear("torch"))
    check.fallback(conv, _x(), reason="knn")


@pytest.mark.parametrize("net,aggr,batched", [("linear", "max", False), ("linear", "mean", True),
                                              ("mlp", "max", True), ("mlp", "add", False)])
def test_dynamic_matches_stock(check, monkeypatch, fake_knn, partial, net, aggr, batched):
    partial("always")
    conv = _dynamic(monkeypatch, _linear("torch") if net == "linear" else _mlp(), aggr=aggr)
    batch = torch.tensor([0] * 7 + [1] * (N - 7)) if batched else None
    stock, fused, _ = check.compare(conv, _x(seed=13), batch)
    assert gnn_fastpath.stats()["pyg.DynamicEdgeConv"]["fused"]["reference"] == 1


def test_dynamic_pair(check, monkeypatch, fake_knn):
    conv = _dynamic(monkeypatch, _linear("torch"), k=3)
    check.compare(conv, (_x(20, seed=14), _x(9, seed=15)))


# --------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("net,aggr,kind", [("linear", "max", "tensor"), ("linear", "add", "csr"),
                                           ("linear", "mean", "super_node"), ("mlp", "max", "tensor"),
                                           ("mlp", "min", "super_node")])
def test_cuda_matches_stock(check, partial, net, aggr, kind):
    partial("always")
    if kind == "super_node":
        from zoo import random_edges

        edge_index = random_edges(N, N, 60, 4, empty_rows=2, super_node_degree=300)[0]
    else:
        edge_index = _graph(kind, seed=3)
    conv = _conv(_linear("torch") if net == "linear" else _mlp(), aggr).cuda()
    x, edge_index = _x().detach().cuda(), edge_index.cuda()
    runs = []
    for enabled in (False, True):
        m, xi = copy.deepcopy(conv), x.clone().requires_grad_()
        if enabled:
            with gnn_fastpath.enabled(frameworks="pyg"):
                out = m(xi, edge_index)
        else:
            out = m(xi, edge_index)
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).cuda()).sum().backward()
        runs.append((out, [p.grad for p in m.parameters()] + [xi.grad]))
    (expected, expected_grads), (actual, actual_grads) = runs
    check.close(actual, expected, "output")
    floor = 1e-2 * max(g.abs().max().item() for g in expected_grads)
    for i, (a, e) in enumerate(zip(actual_grads, expected_grads)):
        check.close(a, e, f"grad {i}", floor=floor)
    assert gnn_fastpath.stats()[KEY]["fused"]["cuda"] == 1
