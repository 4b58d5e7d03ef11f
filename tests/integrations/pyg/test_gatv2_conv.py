"""PyG GATv2Conv: stock vs gnn_fastpath (reference ops on the CPU)."""
from __future__ import annotations

import itertools

import pytest
import torch

import gnn_fastpath
from gnn_fastpath import Graph

from .conftest import make_graph

F_IN, F_SRC, F_DST = 6, 5, 7


def _conv(**kwargs):
    from torch_geometric.nn import GATv2Conv

    kwargs.setdefault("in_channels", F_IN)
    kwargs.setdefault("out_channels", 4)
    return GATv2Conv(**kwargs)


def _x(n, f=F_IN):
    return torch.randn(n, f, requires_grad=True)


MODULE_GRID = list(itertools.product([1, 2], [True, False], [True, False], [True, False], [True, False],
                                     [True, False]))


@pytest.mark.parametrize("heads,concat,share_weights,residual,bias,add_self_loops", MODULE_GRID)
def test_module_arguments(check, heads, concat, share_weights, residual, bias, add_self_loops):
    conv = _conv(heads=heads, concat=concat, share_weights=share_weights, residual=residual, bias=bias,
                 add_self_loops=add_self_loops, negative_slope=0.1 if heads == 2 else 0.2)
    edge_index, _ = make_graph("tensor", 20, 20, 50, seed=heads)
    rw = [None, True][(concat + residual + bias) % 2]
    check.compare(conv, _x(20), edge_index, return_attention_weights=rw)


FILLS = ["mean", 0.5, None, "tensor", "max", "add", "min", "mul", 2]


@pytest.mark.parametrize("fill_value", FILLS)
@pytest.mark.parametrize("edge_dim", [3, "1d"])
@pytest.mark.parametrize("bipartite", [None, "more_src"])
def test_edge_attr_and_fill_value(check, fill_value, edge_dim, bipartite):
    n_src, n_dst = (18, 18) if bipartite is None else (19, 11)
    one_d = edge_dim == "1d"
    if fill_value == "tensor":
        fill_value = torch.tensor(0.7) if one_d else torch.tensor([0.1, -0.2, 0.3])
    conv = _conv(in_channels=(F_SRC, F_DST) if bipartite else F_IN, heads=2, edge_dim=1 if one_d else 3,
                 fill_value=fill_value)
    edge_index, m = make_graph("tensor", n_src, n_dst, 45, seed=3)
    if bipartite:  # targets below min(N_src, N_dst): stock can reduce fill_value over them
        edge_index = edge_index[:, edge_index[1] < n_dst]
        m = edge_index.size(1)
    edge_attr = torch.randn(m, requires_grad=True) if one_d else torch.randn(m, 3, requires_grad=True)
    x = (_x(n_src, F_SRC), _x(n_dst, F_DST)) if bipartite else _x(n_src)
    check.compare(conv, x, edge_index, edge_attr, return_attention_weights=True)


# A torch.sparse adjacency with add_self_loops falls back (test_fallback_arguments); an int32
# edge_index is compared with stock on its int64 copy, whose returned edge_index is int64.
GRAPH_GRID = [(kind, bipartite, loops, rw)
              for kind, bipartite, loops, rw in itertools.product(
                  ["tensor", "int32", "edge_index_obj", "coo", "csr"], [None, "more_dst", "more_src"],
                  [True, False], [None, True])
              if not (loops and kind in ("coo", "csr")) and not (kind == "int32" and rw)]


@pytest.mark.parametrize("kind,bipartite,add_self_loops,rw", GRAPH_GRID)
def test_graph_inputs(check, kind, bipartite, add_self_loops, rw):
    n_src, n_dst = {None: (18, 18), "more_dst": (11, 19), "more_src": (19, 11)}[bipartite]
    # fill_value "mean" (the default) would make stock fail when N_dst > N_src: a number here.
    conv = _conv(in_channels=(F_SRC, F_DST) if bipartite else F_IN, heads=2, add_self_loops=add_self_loops,
                 edge_dim=2, fill_value=0.5 if bipartite == "more_dst" else "mean")
    edge_index, m = make_graph(kind, n_src, n_dst, 45, seed=n_dst)
    x = (_x(n_src, F_SRC), _x(n_dst, F_DST)) if bipartite else _x(n_src)
    edge_attr = torch.randn(m, 2, requires_grad=True)
    kwargs = dict(edge_attr=edge_attr, return_attention_weights=rw)
    # Stock's gradients are wrong for int32 edge_index on torch 2.13 CPU (scatter_add_'s
    # backward with an expanded int32 index): compare against stock on the int64 copy.
    stock_inputs = ((x, edge_index.long()), kwargs) if kind == "int32" else None
    check.compare(conv, x, edge_index, stock_inputs=stock_inputs, **kwargs)


def test_returned_edge_index_with_loops_matches_stock(check):
    conv = _conv(heads=2)
    edge_index, _ = make_graph("tensor", 15, 15, 40)
    stock, _, out = check.compare(conv, _x(15), edge_index, return_attention_weights=True)
    ei = out[1][0]
    assert not bool((edge_index[0] == edge_index[1]).all())
    n_loops = int((edge_index[0] == edge_index[1]).sum())
    assert ei.size(1) == edge_index.size(1) - n_loops + 15
    assert torch.equal(ei[:, -15:], torch.arange(15).repeat(2, 1))


@pytest.mark.parametrize("training", [False, True])
def test_dropout_eval_and_zero(check, training):
    conv = _conv(heads=2, dropout=0.0 if training else 0.6)
    conv.train(training)
    edge_index, _ = make_graph("tensor", 15, 15, 40)
    check.compare(conv, _x(15), edge_index, return_attention_weights=True)


def test_dropout_distribution():
    """Training with p > 0: stock returns alpha *after* dropout; so does the fused path:
    about p of the weights zeroed, the rest scaled by 1 / (1 - p)."""
    torch.manual_seed(0)
    p = 0.5
    conv = _conv(heads=2, dropout=p)
    edge_index, _ = make_graph("tensor", 200, 200, 1500)
    x = torch.randn(200, F_IN)
    conv.eval()
    with torch.no_grad():
        _, (_, alpha_eval) = conv(x, edge_index, return_attention_weights=True)
        conv.train()
        _, (_, alpha_stock) = conv(x, edge_index, return_attention_weights=True)
        with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
            _, (_, alpha_fused) = conv(x, edge_index, return_attention_weights=True)
    assert gnn_fastpath.stats()["pyg.GATv2Conv"]["fused"]["reference"] == 1
    for alpha in (alpha_stock, alpha_fused):
        kept = alpha != 0
        assert abs(kept.float().mean().item() - (1 - p)) < 0.04
        torch.testing.assert_close(alpha[kept], alpha_eval[kept] / (1 - p), rtol=1e-5, atol=1e-7)


def test_looped_graph_built_once(check, monkeypatch):
    conv = _conv(heads=2, edge_dim=2)
    edge_index, m = make_graph("tensor", 16, 16, 40)
    x, edge_attr = torch.randn(16, F_IN), torch.randn(m, 2)
    builds = []
    original = Graph.from_coo.__func__
    monkeypatch.setattr(Graph, "from_coo", classmethod(lambda cls, *a, **k: builds.append(1) or original(cls, *a, **k)))
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        first = conv(x, edge_index, edge_attr)
        assert len(builds) == 2  # the input's Graph and its looped Graph
        for _ in range(3):
            torch.testing.assert_close(conv(x, edge_index, edge_attr), first, rtol=0, atol=0)
    assert len(builds) == 2
    looped = Graph.of(edge_index, num_nodes=(16, 16))._memo[("pyg", "replace_self_loops", 16)]
    assert looped.graph.num_edges == m - int((edge_index[0] == edge_index[1]).sum()) + 16


def test_cora(check, cora):
    conv = _conv(in_channels=cora.num_features, out_channels=8, heads=2)
    check.compare(conv, cora.x.clone().requires_grad_(), cora.edge_index, return_attention_weights=True)


def test_tolokers(check, tolokers):
    x, edge_index = tolokers
    conv = _conv(in_channels=x.size(1), out_channels=8, heads=2, residual=True, concat=False)
    check.compare(conv, x.clone().requires_grad_(), edge_index)


# --------------------------------------------------------------------------- fallbacks
def test_fallback_lazy_then_fused(check):
    conv = _conv(in_channels=-1, residual=True)
    edge_index, _ = make_graph("tensor", 12, 12, 30)
    x = torch.randn(12, F_IN)
    _, fused = check.fallback(conv, x, edge_index, reason="lazy", calls=1)
    check.compare(fused, x.requires_grad_(), edge_index)


def test_fallback_subclass(check):
    from torch_geometric.nn import GATv2Conv

    class Mine(GATv2Conv):
        def forward(self, x, edge_index, edge_attr=None, return_attention_weights=None):
            return super().forward(x, edge_index, edge_attr, return_attention_weights) + 1

    edge_index, _ = make_graph("tensor", 12, 12, 30)
    check.fallback(Mine(F_IN, 4), torch.randn(12, F_IN), edge_index, reason="subclass")


@pytest.mark.parametrize("case", ["aggr_mean", "flow", "sparse_self_loops", "x_dst_none", "fill_beyond_min",
                                  "fill_bad_string", "edge_attr_without_edge_dim", "return_attention_int",
                                  "x_3d"])
def test_fallback_arguments(check, case):
    n, m_default = 12, 30
    edge_index, m = make_graph("tensor", n, n, m_default)
    x = torch.randn(n, F_IN)
    kwargs, conv, reason = {}, _conv(heads=2), None
    if case == "aggr_mean":
        reason, conv = "aggr", _conv(heads=2, aggr="mean")
    elif case == "flow":
        reason, conv = "flow", _conv(heads=2, flow="target_to_source")
    elif case == "sparse_self_loops":
        reason = "sparse_self_loops"
        edge_index, _ = make_graph("csr", n, n, m_default)
    elif case == "x_dst_none":  # stock asserts
        reason, conv, x = "input", _conv(in_channels=(F_IN, F_IN)), (x, None)
    elif case == "fill_beyond_min":  # bipartite, a kept edge targets node >= min(N_src, N_dst): stock raises
        reason = "fill_value"
        conv = _conv(in_channels=(F_SRC, F_DST), edge_dim=2)
        edge_index, m = make_graph("tensor", 8, 14, 40)
        x = (torch.randn(8, F_SRC), torch.randn(14, F_DST))
        kwargs["edge_attr"] = torch.randn(m, 2)
    elif case == "fill_bad_string":  # stock raises
        reason, conv = "fill_value", _conv(edge_dim=2, fill_value="median")
        kwargs["edge_attr"] = torch.randn(m, 2)
    elif case == "edge_attr_without_edge_dim":  # stock asserts
        reason, kwargs["edge_attr"] = "edge_attr", torch.randn(m, 2)
    elif case == "return_attention_int":
        reason, kwargs["return_attention_weights"] = "return_attention_weights", 1
    elif case == "x_3d":
        reason, x = "input", torch.randn(2, n, F_IN)
    check.fallback(conv, x, edge_index, reason=reason, **kwargs)
