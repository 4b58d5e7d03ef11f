"""PyG GCNConv: stock vs gnn_fastpath (reference ops on the CPU)."""
from __future__ import annotations

import copy
import itertools

import pytest
import torch

import gnn_fastpath

from .conftest import make_graph

F_IN = 6
NORMS = [(True, True), (False, True), (False, False)]  # (add_self_loops, normalize)


def _conv(**kwargs):
    from torch_geometric.nn import GCNConv

    kwargs.setdefault("in_channels", F_IN)
    kwargs.setdefault("out_channels", 5)
    return GCNConv(**kwargs)


def _x(n):
    return torch.randn(n, F_IN, requires_grad=True)


def _weight(kind, m):
    if kind is None:
        return None
    w = torch.rand(m) + 0.1
    return w.requires_grad_(kind == "grad")


def _graph(kind, n, m=40, seed=0, random_values=True):
    graph, nnz = make_graph(kind, n, n, m, seed)
    if random_values and kind in ("coo", "csr"):  # weighted adjacency
        coo = graph.to_sparse_coo().coalesce() if kind == "csr" else graph
        gen = torch.Generator().manual_seed(seed)
        coo = torch.sparse_coo_tensor(coo.indices(), torch.rand(nnz, generator=gen) + 0.1, coo.shape).coalesce()
        graph = coo.to_sparse_csr() if kind == "csr" else coo
    return graph, nnz


@pytest.mark.parametrize("improved,norm,bias,weight", list(itertools.product(
    [False, True], NORMS, [True, False], [None, "plain", "grad"])))
def test_module_arguments(check, improved, norm, bias, weight):
    add_self_loops, normalize = norm
    conv = _conv(improved=improved, add_self_loops=add_self_loops, normalize=normalize, bias=bias)
    edge_index, m = _graph("tensor", 20, 50, seed=int(improved))
    check.compare(conv, _x(20), edge_index, _weight(weight, m))


@pytest.mark.parametrize("kind,norm,weight,improved", list(itertools.product(
    ["tensor", "int32", "edge_index_obj", "coo", "csr"], NORMS, [None, "grad"], [False, True])))
def test_graph_inputs(check, kind, norm, weight, improved):
    add_self_loops, normalize = norm
    conv = _conv(add_self_loops=add_self_loops, normalize=normalize, improved=improved)
    edge_index, m = _graph(kind, 18, seed=3)
    x, edge_weight = _x(18), _weight(weight, m)  # ignored by stock for torch.sparse inputs
    # Stock's gradients are wrong for int32 edge_index on torch 2.13 CPU (scatter_add_'s
    # backward with an expanded int32 index): compare against stock on the int64 copy.
    stock_inputs = ((x, edge_index.long(), edge_weight), {}) if kind == "int32" else None
    check.compare(conv, x, edge_index, edge_weight, stock_inputs=stock_inputs)


def _calls(module, enabled, inputs, n_calls=3):
    outs = []
    for _ in range(n_calls):
        if enabled:
            with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
                outs.append(module(*inputs))
        else:
            outs.append(module(*inputs))
    return outs


@pytest.mark.parametrize("kind,add_self_loops,weight", list(itertools.product(
    ["tensor", "edge_index_obj"], [True, False], [None, "plain"])))
def test_cached(check, kind, add_self_loops, weight):
    """cached=True: same outputs on every call, and the same cache contents as stock."""
    conv = _conv(cached=True, add_self_loops=add_self_loops, improved=True)
    edge_index, m = _graph(kind, 16, seed=5)
    inputs = (torch.randn(16, F_IN), edge_index, _weight(weight, m))
    stock, fused = copy.deepcopy(conv), copy.deepcopy(conv)
    expected = _calls(stock, False, inputs)
    actual = _calls(fused, True, inputs)
    assert gnn_fastpath.stats()["pyg.GCNConv"]["fused"]["reference"] == 3
    check.same(actual, expected)
    check.same(fused._cached_edge_index, stock._cached_edge_index, what="cache")
    # The cache is read from now on, whatever graph comes in (stock semantics):
    other, _ = _graph(kind, 16, seed=6)
    check.same(_calls(fused, True, (inputs[0], other, None), 1), _calls(stock, False, (inputs[0], other, None), 1))


@pytest.mark.parametrize("first", ["stock", "fused"])
def test_cached_switch_mid_training(check, first):
    """The cache one path fills is what the other reads."""
    conv = _conv(cached=True)
    edge_index, m = _graph("tensor", 16, seed=7)
    inputs = (torch.randn(16, F_IN), edge_index, _weight("plain", m))
    reference = _calls(copy.deepcopy(conv), False, inputs, 2)
    mixed = _calls(conv, first == "fused", inputs, 1) + _calls(conv, first == "stock", inputs, 1)
    check.same(mixed, reference)


def test_cache_read_when_set_without_cached_flag(check):
    conv = _conv(cached=False)
    edge_index, m = _graph("tensor", 12, seed=1)
    conv._cached_edge_index = (edge_index, torch.rand(m))
    check.compare(conv, _x(12), _graph("tensor", 12, seed=2)[0])


@pytest.mark.parametrize("kind", ["coo", "csr"])
def test_cached_sparse(check, kind):
    """First cached call on a torch.sparse adjacency runs stock (it builds the cached sparse
    tensor); later calls read that cache fused."""
    conv = _conv(cached=True)
    adj, _ = _graph(kind, 14, seed=2)
    x = torch.randn(14, F_IN)
    stock, fused = check.fallback(conv, x, adj, reason="cached_sparse", calls=1)
    check.same(fused._cached_edge_index, stock._cached_edge_index, what="cache")
    # (A module holding a sparse CSR cache cannot be deep-copied: compare the two directly.)
    expected = stock(x, adj)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        actual = fused(x, adj)
    assert gnn_fastpath.stats()["pyg.GCNConv"]["fused"]["reference"] == 1
    check.same(actual, expected)


def test_structural_norm_memoised(monkeypatch):
    from gnn_fastpath import ops

    calls = []
    original = ops.gcn_norm_values
    monkeypatch.setattr(ops, "gcn_norm_values", lambda *a, **k: calls.append(1) or original(*a, **k))
    conv = _conv()
    edge_index, m = _graph("tensor", 16, seed=4)
    x = torch.randn(16, F_IN)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        for _ in range(3):
            conv(x, edge_index)
        assert len(calls) == 1  # structural: once per graph
        for _ in range(3):
            conv(x, edge_index, torch.rand(m))
        assert len(calls) == 4  # with edge_weight: per call
        edge_index[1, 0] = (edge_index[1, 0] + 1) % 16  # in place: a new Graph, new weights
        conv(x, edge_index)
        assert len(calls) == 5


def test_cora(check, cora):
    conv = _conv(in_channels=cora.num_features, out_channels=16, cached=True)
    x = cora.x.clone().requires_grad_()
    stock, fused, _ = check.compare(conv, x, cora.edge_index)
    check.same(fused._cached_edge_index, stock._cached_edge_index, what="cache")
    check.compare(fused, x, cora.edge_index)  # reads the cache


def test_tolokers(check, tolokers):
    x, edge_index = tolokers
    conv = _conv(in_channels=x.size(1), out_channels=16, improved=True)
    check.compare(conv, x.clone().requires_grad_(), edge_index, torch.rand(edge_index.size(1), requires_grad=True))


# --------------------------------------------------------------------------- fallbacks
def test_fallback_message_and_aggregate_hook(check):
    """The fused message_and_aggregate path (a sparse adjacency) has hooks of its own; the
    hooks every layer shares are in test_generic_fallbacks.py."""
    conv = _conv()
    conv.register_message_and_aggregate_forward_pre_hook(lambda *args: None)
    edge_index, _ = _graph("csr", 12)
    check.fallback(conv, torch.randn(12, F_IN), edge_index, reason="hooks")


def test_fallback_lazy_then_fused(check):
    conv = _conv(in_channels=-1)
    edge_index, _ = _graph("tensor", 12)
    x = torch.randn(12, F_IN)
    _, fused = check.fallback(conv, x, edge_index, reason="lazy", calls=1)
    check.compare(fused, x.requires_grad_(), edge_index)


def test_fallback_subclass(check):
    from torch_geometric.nn import GCNConv

    class Mine(GCNConv):
        def forward(self, x, edge_index, edge_weight=None):
            return super().forward(x, edge_index, edge_weight).relu()

    edge_index, _ = _graph("tensor", 12)
    check.fallback(Mine(F_IN, 4), torch.randn(12, F_IN), edge_index, reason="subclass")


def test_fallback_float64(check):
    # Autocast and 16-bit features run fused (tests/integrations/test_autocast.py); float64 runs stock.
    edge_index, _ = _graph("tensor", 12)
    check.fallback(_conv().double(), torch.randn(12, F_IN, dtype=torch.float64), edge_index, reason="dtype")


@pytest.mark.parametrize("case", ["aggr_mean", "flow", "bipartite", "edge_weight_2d", "sparse_values_grad",
                                  "batched_x", "uncoalesced_coo"])
def test_fallback_arguments(check, case):
    n = 12
    edge_index, m = _graph("tensor", n)
    x = torch.randn(n, F_IN)
    args, conv, reason = [], _conv(), None
    if case == "aggr_mean":
        reason, conv = "aggr", _conv(aggr="mean")
    elif case == "flow":
        reason, conv = "flow", _conv(flow="target_to_source")
    elif case == "bipartite":  # stock raises
        reason, x = "bipartite", (x, x)
    elif case == "edge_weight_2d":  # stock broadcasts an [M, 1] weight
        reason, args = "edge_weight", [torch.rand(m, 1)]
    elif case == "sparse_values_grad":
        reason = "sparse_grad"
        adj, _ = _graph("csr", n)
        edge_index = torch.sparse_csr_tensor(adj.crow_indices(), adj.col_indices(),
                                             adj.values().clone().requires_grad_(), adj.shape)
    elif case == "batched_x":  # stock propagates along node_dim=-2
        reason, x = "input", torch.randn(2, n, F_IN)
    elif case == "uncoalesced_coo":
        reason = "edge_index"
        edge_index = torch.sparse_coo_tensor(edge_index.flip(0), torch.rand(m), (n, n))
    check.fallback(conv, x, edge_index, *args, reason=reason)
