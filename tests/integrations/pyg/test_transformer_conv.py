"""PyG TransformerConv: stock vs gnn_fastpath (reference ops on the CPU)."""
from __future__ import annotations

import itertools

import pytest
import torch

import gnn_fastpath

from .conftest import make_graph

F_IN, F_SRC, F_DST = 6, 5, 7


def _conv(**kwargs):
    from torch_geometric.nn import TransformerConv

    kwargs.setdefault("in_channels", F_IN)
    kwargs.setdefault("out_channels", 4)
    return TransformerConv(**kwargs)


def _x(n, f=F_IN):
    return torch.randn(n, f, requires_grad=True)


MODULE_GRID = list(itertools.product([1, 3], [True, False], [True, False], [True, False], [True, False],
                                     [None, 3]))


@pytest.mark.parametrize("heads,concat,beta,root_weight,bias,edge_dim", MODULE_GRID)
def test_module_arguments(check, heads, concat, beta, root_weight, bias, edge_dim):
    conv = _conv(heads=heads, concat=concat, beta=beta, root_weight=root_weight, bias=bias, edge_dim=edge_dim)
    edge_index, m = make_graph("tensor", 20, 20, 50, seed=heads)
    edge_attr = torch.randn(m, 3, requires_grad=True) if edge_dim else None
    rw = [None, True, False][(heads + concat + beta) % 3]
    check.compare(conv, _x(20), edge_index, edge_attr, return_attention_weights=rw)


@pytest.mark.parametrize("kind", ["tensor", "int32", "edge_index_obj", "coo", "csr"])
@pytest.mark.parametrize("bipartite", [None, "more_dst", "more_src"])
@pytest.mark.parametrize("edge_dim", [None, 2])
@pytest.mark.parametrize("rw", [None, True])
def test_graph_inputs(check, kind, bipartite, edge_dim, rw):
    n_src, n_dst = {None: (18, 18), "more_dst": (11, 19), "more_src": (19, 11)}[bipartite]
    conv = _conv(in_channels=(F_SRC, F_DST) if bipartite else F_IN, heads=2, edge_dim=edge_dim, beta=True)
    edge_index, m = make_graph(kind, n_src, n_dst, 45, seed=n_src)
    x = (_x(n_src, F_SRC), _x(n_dst, F_DST)) if bipartite else _x(n_src)
    edge_attr = torch.randn(m, 2, requires_grad=True) if edge_dim else None
    kwargs = dict(edge_attr=edge_attr, return_attention_weights=rw)
    stock_inputs = None
    if kind == "int32":
        # Stock's gradients are wrong for int32 edge_index on torch 2.13 CPU (scatter_add_'s
        # backward with an expanded int32 index): compare against stock on the int64 copy.
        stock_inputs = ((x, edge_index.long()), kwargs)
    _, fused, out = check.compare(conv, x, edge_index, stock_inputs=stock_inputs, **kwargs)
    assert fused._alpha is None
    if rw:
        assert out[1][0] is not None


def test_return_attention_false_returns_tuple_like_stock(check):
    conv = _conv(heads=2)
    edge_index, _ = make_graph("tensor", 12, 12, 30)
    _, _, out = check.compare(conv, _x(12), edge_index, None, False)
    assert out[1][0] is edge_index


def test_alpha_reset_and_edge_index_identity():
    conv = _conv(heads=2)
    edge_index, _ = make_graph("tensor", 12, 12, 30)
    conv._alpha = torch.ones(3)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        out, (ei, alpha) = conv(torch.randn(12, F_IN), edge_index, return_attention_weights=True)
    assert conv._alpha is None
    assert ei is edge_index  # stock returns the input object itself
    assert alpha.shape == (edge_index.size(1), 2)


@pytest.mark.parametrize("training", [False, True])
def test_dropout_eval_and_zero(check, training):
    """p > 0 in eval and p = 0 in training: exactly stock."""
    conv = _conv(heads=2, dropout=0.0 if training else 0.6)
    conv.train(training)
    edge_index, _ = make_graph("tensor", 15, 15, 40)
    check.compare(conv, _x(15), edge_index, return_attention_weights=True)


def test_dropout_distribution():
    """Training with p > 0: alpha returned before dropout (as stock), the output right in
    expectation (stock's random stream cannot be matched)."""
    torch.manual_seed(0)
    p = 0.5
    conv = _conv(heads=2, dropout=p, root_weight=False)
    edge_index, _ = make_graph("tensor", 10, 10, 40, loops=False)
    x = torch.randn(10, F_IN)
    conv.eval()
    with torch.no_grad():
        expected, (_, alpha_eval) = conv(x, edge_index, return_attention_weights=True)
    conv.train()
    runs = 600
    with torch.no_grad():
        stock = torch.stack([conv(x, edge_index) for _ in range(runs)]).mean(0)
        with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
            _, (_, alpha) = conv(x, edge_index, return_attention_weights=True)
            fused = torch.stack([conv(x, edge_index) for _ in range(runs)]).mean(0)
            single = conv(x, edge_index)
    assert gnn_fastpath.stats()["pyg.TransformerConv"]["fused"]["reference"] == runs + 2
    torch.testing.assert_close(alpha, alpha_eval, rtol=1e-5, atol=1e-7)  # before dropout
    assert not torch.allclose(single, expected)  # dropout did something
    scale = expected.abs().max().item()
    assert (stock - expected).abs().max().item() < 0.15 * scale
    assert (fused - expected).abs().max().item() < 0.15 * scale


def test_cora(check, cora):
    conv = _conv(in_channels=cora.num_features, out_channels=8, heads=2, beta=True)
    check.compare(conv, cora.x.clone().requires_grad_(), cora.edge_index, return_attention_weights=True)


def test_tolokers(check, tolokers):
    x, edge_index = tolokers
    conv = _conv(in_channels=x.size(1), out_channels=8, heads=2, concat=False)
    check.compare(conv, x.clone().requires_grad_(), edge_index)


def test_edge_index_mutated_in_place(check):
    conv = _conv(heads=2)
    edge_index, _ = make_graph("tensor", 14, 14, 30)
    x = _x(14)
    check.compare(conv, x, edge_index)
    edge_index[0, :5] = torch.arange(5)  # in place: the cached Graph must notice
    check.compare(conv, x, edge_index)


# --------------------------------------------------------------------------- fallbacks
def test_fallback_lazy_then_fused(check):
    conv = _conv(in_channels=-1)
    edge_index, _ = make_graph("tensor", 12, 12, 30)
    x = torch.randn(12, F_IN)
    _, fused = check.fallback(conv, x, edge_index, reason="lazy", calls=1)
    check.compare(fused, x.requires_grad_(), edge_index)  # initialised now: fused


def test_fallback_subclass(check):
    from torch_geometric.nn import TransformerConv

    class Mine(TransformerConv):
        def forward(self, x, edge_index, edge_attr=None, return_attention_weights=None):
            return super().forward(x, edge_index, edge_attr, return_attention_weights) * 2

    class Plain(TransformerConv):
        pass

    edge_index, _ = make_graph("tensor", 12, 12, 30)
    check.fallback(Mine(F_IN, 4), torch.randn(12, F_IN), edge_index, reason="subclass")
    gnn_fastpath.reset_stats()
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        Plain(F_IN, 4)(torch.randn(12, F_IN), edge_index)
    assert gnn_fastpath.stats()["pyg.TransformerConv"]["fused"]["reference"] == 1


def test_fallback_float64(check):
    # Autocast and 16-bit features run fused (tests/integrations/test_autocast.py); float64 runs stock.
    edge_index = make_graph("tensor", 12, 12, 30)[0]
    check.fallback(_conv().double(), torch.randn(12, F_IN, dtype=torch.float64), edge_index, reason="dtype")


@pytest.mark.parametrize("case", ["aggr_mean", "flow", "edge_attr_without_edge_dim", "edge_dim_without_edge_attr",
                                  "uncoalesced_coo", "edge_index_size_mismatch", "csc", "bad_edge_index"])
def test_fallback_arguments(check, case):
    n, heads, out = 12, 2, 4
    edge_index, m = make_graph("tensor", n, n, 30)
    x = torch.randn(n, F_IN)
    kwargs = {}
    reason = {"aggr_mean": "aggr", "flow": "flow", "edge_index_size_mismatch": "size"}.get(case, None)
    conv = _conv(heads=heads, out_channels=out)
    if case == "aggr_mean":
        conv = _conv(heads=heads, out_channels=out, aggr="mean")
    elif case == "flow":
        conv = _conv(heads=heads, out_channels=out, flow="target_to_source")
    elif case == "edge_attr_without_edge_dim":
        reason, kwargs["edge_attr"] = "edge_attr", torch.randn(m, heads, out)
    elif case == "edge_dim_without_edge_attr":  # stock asserts
        reason, conv = "edge_attr", _conv(heads=heads, out_channels=out, edge_dim=3)
    elif case == "uncoalesced_coo":
        reason = "edge_index"
        edge_index = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(m), (n, n))
    elif case == "edge_index_size_mismatch":  # stock raises
        from torch_geometric import EdgeIndex

        edge_index = EdgeIndex(edge_index, sparse_size=(n + 1, n + 1))
    elif case == "csc":
        reason = "edge_index"
        edge_index = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(m), (n, n)).coalesce().to_sparse_csc()
    elif case == "bad_edge_index":  # out of range: stock raises its IndexError
        reason = "edge_index"
        edge_index = edge_index.clone()
        edge_index[0, 0] = n + 5
    check.fallback(conv, x, edge_index, reason=reason, **kwargs)
