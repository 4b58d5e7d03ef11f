"""PyG GATConv and GATv2Conv: the stock-vs-fused and fallback checks both layers share, run
for each layer (reference ops on the CPU). Checks only one layer has live in its own file."""
from __future__ import annotations

import itertools

import pytest
import torch

import gnn_fastpath
from gnn_fastpath import Graph

from .conftest import make_graph
from .gat_common import F_DST, F_IN, F_SRC, LAYERS, make_conv, make_x

#: The projection a layer applies to the source features (the messages' values).
SOURCE_PROJECTION = {"GATConv": "lin", "GATv2Conv": "lin_l"}

FILLS = ["mean", 0.5, None, "tensor", "max", "add", "min", "mul", 2]


@pytest.mark.parametrize("fill_value", FILLS)
@pytest.mark.parametrize("edge_dim", [3, "1d"])
@pytest.mark.parametrize("bipartite", [None, "more_src"])
@pytest.mark.parametrize("layer", LAYERS)
def test_edge_attr_and_fill_value(check, layer, bipartite, edge_dim, fill_value):
    n_src, n_dst = (18, 18) if bipartite is None else (19, 11)
    one_d = edge_dim == "1d"
    if fill_value == "tensor":
        fill_value = torch.tensor(0.7) if one_d else torch.tensor([0.1, -0.2, 0.3])
    conv = make_conv(layer, in_channels=(F_SRC, F_DST) if bipartite else F_IN, heads=2,
                     edge_dim=1 if one_d else 3, fill_value=fill_value)
    edge_index, m = make_graph("tensor", n_src, n_dst, 45, seed=3)
    if bipartite:  # targets below min(N_src, N_dst): stock can reduce fill_value over them
        edge_index = edge_index[:, edge_index[1] < n_dst]
        m = edge_index.size(1)
    edge_attr = torch.randn(m, requires_grad=True) if one_d else torch.randn(m, 3, requires_grad=True)
    x = (make_x(n_src, F_SRC), make_x(n_dst, F_DST)) if bipartite else make_x(n_src)
    check.compare(conv, x, edge_index, edge_attr, return_attention_weights=True)


# A torch.sparse adjacency with add_self_loops falls back (test_fallback_arguments); an int32
# edge_index is compared with stock on its int64 copy, whose returned edge_index is int64.
GRAPH_GRID = [(kind, bipartite, loops, rw)
              for kind, bipartite, loops, rw in itertools.product(
                  ["tensor", "int32", "edge_index_obj", "coo", "csr"], [None, "more_dst", "more_src"],
                  [True, False], [None, True])
              if not (loops and kind in ("coo", "csr")) and not (kind == "int32" and rw)]
#: Whether a layer's graph-input grid runs with a residual projection (as before the fold).
GRAPH_RESIDUAL = {"GATConv": True, "GATv2Conv": False}


@pytest.mark.parametrize("kind,bipartite,add_self_loops,rw", GRAPH_GRID)
@pytest.mark.parametrize("layer", LAYERS)
def test_graph_inputs(check, layer, kind, bipartite, add_self_loops, rw):
    n_src, n_dst = {None: (18, 18), "more_dst": (11, 19), "more_src": (19, 11)}[bipartite]
    # fill_value "mean" (the default) would make stock fail when N_dst > N_src: a number here.
    conv = make_conv(layer, in_channels=(F_SRC, F_DST) if bipartite else F_IN, heads=2,
                     add_self_loops=add_self_loops, edge_dim=2,
                     fill_value=0.5 if bipartite == "more_dst" else "mean", residual=GRAPH_RESIDUAL[layer])
    edge_index, m = make_graph(kind, n_src, n_dst, 45, seed=n_dst)
    x = (make_x(n_src, F_SRC), make_x(n_dst, F_DST)) if bipartite else make_x(n_src)
    edge_attr = torch.randn(m, 2, requires_grad=True)
    kwargs = dict(edge_attr=edge_attr, return_attention_weights=rw)
    # Stock's gradients are wrong for int32 edge_index on torch 2.13 CPU (scatter_add_'s
    # backward with an expanded int32 index): compare against stock on the int64 copy.
    stock_inputs = ((x, edge_index.long()), kwargs) if kind == "int32" else None
    check.compare(conv, x, edge_index, stock_inputs=stock_inputs, **kwargs)


@pytest.mark.parametrize("layer", LAYERS)
def test_returned_edge_index_with_loops_matches_stock(check, layer):
    conv = make_conv(layer, heads=2)
    edge_index, _ = make_graph("tensor", 15, 15, 40)
    _, _, out = check.compare(conv, make_x(15), edge_index, return_attention_weights=True)
    ei = out[1][0]
    is_loop = edge_index[0] == edge_index[1]
    n_loops = int(is_loop.sum())
    assert n_loops > 0 and not bool(is_loop.all())
    assert ei.size(1) == edge_index.size(1) - n_loops + 15
    assert torch.equal(ei[:, -15:], torch.arange(15).repeat(2, 1))


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("edge_dim", [None, 2])
@pytest.mark.parametrize("layer", LAYERS)
def test_dropout_eval_and_zero(check, layer, edge_dim, training):
    conv = make_conv(layer, heads=2, dropout=0.0 if training else 0.6, edge_dim=edge_dim)
    conv.train(training)
    edge_index, m = make_graph("tensor", 15, 15, 40)
    edge_attr = () if edge_dim is None else (torch.randn(m, edge_dim),)
    check.compare(conv, make_x(15), edge_index, *edge_attr, return_attention_weights=True)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layer", LAYERS)
def test_dropout_distribution(layer, bias):
    """Training with p > 0: stock returns alpha *after* dropout; so does the fused path:
    about p of the weights zeroed, the rest scaled by 1 / (1 - p), and the output is the
    aggregate of exactly the returned weights (plus the bias)."""
    torch.manual_seed(0)
    p = 0.5
    conv = make_conv(layer, heads=2, dropout=p, bias=bias)
    edge_index, _ = make_graph("tensor", 200, 200, 1500)
    x = torch.randn(200, F_IN)
    conv.eval()
    with torch.no_grad():
        _, (_, alpha_eval) = conv(x, edge_index, return_attention_weights=True)
        conv.train()
        _, (_, alpha_stock) = conv(x, edge_index, return_attention_weights=True)
        with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
            out, (ei, alpha_fused) = conv(x, edge_index, return_attention_weights=True)
        xs = getattr(conv, SOURCE_PROJECTION[layer])(x).view(-1, 2, 4)
        manual = torch.zeros(200, 2, 4).index_add_(0, ei[1], alpha_fused.unsqueeze(-1) * xs[ei[0]]).view(200, 8)
        if bias:
            manual = manual + conv.bias
    assert gnn_fastpath.stats()[f"pyg.{layer}"]["fused"]["reference"] == 1
    for alpha in (alpha_stock, alpha_fused):
        kept = alpha != 0
        assert abs(kept.float().mean().item() - (1 - p)) < 0.04
        torch.testing.assert_close(alpha[kept], alpha_eval[kept] / (1 - p), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out, manual, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layer", LAYERS)
def test_looped_graph_built_once(layer, monkeypatch):
    conv = make_conv(layer, heads=2, edge_dim=2)
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
    assert gnn_fastpath.stats()[f"pyg.{layer}"]["fused"]["reference"] == 4
    looped = Graph.of(edge_index, num_nodes=(16, 16))._memo[("pyg", "replace_self_loops", 16)]
    assert looped.graph.num_edges == m - int((edge_index[0] == edge_index[1]).sum()) + 16


@pytest.mark.parametrize("layer", LAYERS)
def test_state_dict_unchanged(layer):
    conv = make_conv(layer, heads=2, edge_dim=3, residual=True)
    before = {k: v.clone() for k, v in conv.state_dict().items()}
    edge_index, m = make_graph("tensor", 12, 12, 30)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        conv(torch.randn(12, F_IN), edge_index, torch.randn(m, 3))
    after = conv.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    assert [n for n, _ in conv.named_buffers()] == []
    assert gnn_fastpath.stats()[f"pyg.{layer}"]["fused"]["reference"] == 1


@pytest.mark.parametrize("layer", LAYERS)
def test_cora(check, cora, layer):
    conv = make_conv(layer, in_channels=cora.num_features, out_channels=8, heads=2)
    check.compare(conv, cora.x.clone().requires_grad_(), cora.edge_index, return_attention_weights=True)


@pytest.mark.parametrize("layer", LAYERS)
def test_tolokers(check, tolokers, layer):
    x, edge_index = tolokers
    conv = make_conv(layer, in_channels=x.size(1), out_channels=8, heads=2, residual=True, concat=False)
    check.compare(conv, x.clone().requires_grad_(), edge_index)


# --------------------------------------------------------------------------- fallbacks
@pytest.mark.parametrize("layer", LAYERS)
def test_fallback_lazy_then_fused(check, layer):
    conv = make_conv(layer, in_channels=-1, residual=True)
    edge_index, _ = make_graph("tensor", 12, 12, 30)
    x = torch.randn(12, F_IN)
    _, fused = check.fallback(conv, x, edge_index, reason="lazy", calls=1)
    check.compare(fused, x.requires_grad_(), edge_index)


@pytest.mark.parametrize("override", ["message", "forward"])
@pytest.mark.parametrize("layer", LAYERS)
def test_fallback_subclass(check, layer, override):
    """A subclass that overrides a method runs stock (its override included): counted under
    the PyG class it derives from."""
    import torch_geometric.nn

    base = getattr(torch_geometric.nn, layer)
    if override == "message":
        class Mine(base):
            def message(self, x_j, alpha):  # PyG reads message's signature: spelled out
                return 2 * super().message(x_j, alpha)
    else:
        class Mine(base):
            def forward(self, *args, **kwargs):
                return super().forward(*args, **kwargs) + 1

    edge_index, _ = make_graph("tensor", 12, 12, 30)
    check.fallback(Mine(F_IN, 4), torch.randn(12, F_IN), edge_index, reason="subclass")


SHARED_FALLBACKS = ["aggr_mean", "flow", "sparse_self_loops", "fill_beyond_min", "fill_bad_string",
                    "return_attention_int", "x_3d"]
FALLBACKS = {
    "GATConv": SHARED_FALLBACKS + ["fill_bad_tensor_ignored", "edge_attr_rows", "edge_attr_3d", "size_mismatch",
                                   "size_with_none", "att_src_shape"],
    # GATv2Conv has no size argument, and asserts where GATConv ignores edge_attr or x_dst=None.
    "GATv2Conv": SHARED_FALLBACKS + ["x_dst_none", "edge_attr_without_edge_dim"],
}


@pytest.mark.parametrize("layer,case", [(layer, case) for layer in LAYERS for case in FALLBACKS[layer]])
def test_fallback_arguments(check, layer, case):
    n, m_default = 12, 30
    edge_index, m = make_graph("tensor", n, n, m_default)
    x = torch.randn(n, F_IN)
    kwargs, conv, reason = {}, make_conv(layer, heads=2), None
    if case == "aggr_mean":
        reason, conv = "aggr", make_conv(layer, heads=2, aggr="mean")
    elif case == "flow":
        reason, conv = "flow", make_conv(layer, heads=2, flow="target_to_source")
    elif case == "sparse_self_loops":
        reason = "sparse_self_loops"
        edge_index, _ = make_graph("csr", n, n, m_default)
    elif case == "fill_beyond_min":  # bipartite, a kept edge targets node >= min(N_src, N_dst): stock raises
        reason = "fill_value"
        conv = make_conv(layer, in_channels=(F_SRC, F_DST), edge_dim=2)
        edge_index, m = make_graph("tensor", 8, 14, 40)
        x = (torch.randn(8, F_SRC), torch.randn(14, F_DST))
        kwargs["edge_attr"] = torch.randn(m, 2)
    elif case == "fill_bad_string":  # stock raises
        reason, conv = "fill_value", make_conv(layer, edge_dim=2, fill_value="median")
        kwargs["edge_attr"] = torch.randn(m, 2)
    elif case == "return_attention_int":
        reason, kwargs["return_attention_weights"] = "return_attention_weights", 1
    elif case == "x_3d":
        reason, x = "input", torch.randn(2, n, F_IN)
    elif case == "fill_bad_tensor_ignored":  # stock's expand raises, even for an edge_attr it then ignores
        reason, conv = "fill_value", make_conv(layer, fill_value=torch.tensor([1.0, 2.0, 3.0]))
        kwargs["edge_attr"] = torch.randn(m, 2)
    elif case == "edge_attr_rows":  # stock raises
        reason, conv = "edge_attr", make_conv(layer, edge_dim=2)
        kwargs["edge_attr"] = torch.randn(m + 1, 2)
    elif case == "edge_attr_3d":
        reason, conv = "edge_attr", make_conv(layer, edge_dim=2, add_self_loops=False)
        kwargs["edge_attr"] = torch.randn(m, 1, 2)
    elif case == "size_mismatch":  # stock raises
        reason, kwargs["size"] = "size", (n, n + 1)
    elif case == "size_with_none":  # stock's min(size) raises with add_self_loops
        reason, kwargs["size"] = "size", (None, n)
    elif case == "att_src_shape":
        reason = "attn"
        conv.att_src = torch.nn.Parameter(torch.randn(1, 1, 4))  # broadcasts over heads in stock
    elif case == "x_dst_none":  # stock asserts
        reason, conv, x = "input", make_conv(layer, in_channels=(F_IN, F_IN)), (x, None)
    elif case == "edge_attr_without_edge_dim":  # stock asserts
        reason, kwargs["edge_attr"] = "edge_attr", torch.randn(m, 2)
    check.fallback(conv, x, edge_index, reason=reason, **kwargs)
