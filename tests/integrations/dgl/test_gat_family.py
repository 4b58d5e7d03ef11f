"""DGL GATConv and GATv2Conv under gnn_fastpath.enable(): the stock-semantics, fallback and
device checks both layers share, run for each layer. Checks only GATConv has (its edge_weight,
its single ``fc``) live in test_gat_conv.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gnn_fastpath
from gnn_fastpath import Graph

from .gat_common import LAYERS, OUT, build, call_kwargs, in_feats_of

pytestmark = pytest.mark.dgl

# Per layer: (name, constructor kwargs, forward kwargs); in_feats is set per graph kind below.
# A forward kwarg ``edge_weight=True`` stands for a random positive weight per edge of the graph.
CONFIGS = {
    "GATConv": [
        ("plain", dict(num_heads=1), {}),
        ("heads3_linear_residual_attention", dict(num_heads=3, residual=True, activation=F.elu),
         dict(get_attention=True)),
        ("linear_residual_nobias", dict(num_heads=2, residual=True, bias=False), {}),
        ("identity_residual_bias", dict(num_heads=2, residual=True, identity=True), dict(get_attention=True)),
        ("identity_residual_nobias", dict(num_heads=2, residual=True, bias=False, identity=True), {}),
        ("bias_slope_activation", dict(num_heads=4, negative_slope=0.05, activation=torch.relu), {}),
        ("nobias", dict(num_heads=2, bias=False), dict(get_attention=True)),
        ("edge_weight_attention", dict(num_heads=2, residual=True), dict(edge_weight=True, get_attention=True)),
        ("edge_weight", dict(num_heads=3, identity=True, residual=True), dict(edge_weight=True)),
        ("dropouts_in_eval", dict(num_heads=2, feat_drop=0.5, attn_drop=0.5, residual=True, eval_mode=True),
         dict(get_attention=True, edge_weight=True)),
    ],
    "GATv2Conv": [
        ("plain", dict(num_heads=1), {}),
        ("heads3_residual_linear_attention", dict(num_heads=3, residual=True, activation=F.elu),
         dict(get_attention=True)),
        ("residual_identity_nobias", dict(num_heads=2, residual=True, bias=False, identity=True), {}),
        ("share_weights_residual_attention", dict(num_heads=2, share_weights=True, residual=True, bias=False),
         dict(get_attention=True)),
        ("slope_activation_share", dict(num_heads=4, negative_slope=0.05, activation=torch.relu,
                                        share_weights=True), {}),
        ("dropouts_in_eval", dict(num_heads=2, feat_drop=0.5, attn_drop=0.5, residual=True, eval_mode=True),
         dict(get_attention=True)),
    ],
}
CONFIG_GRID = [(layer, *config) for layer in LAYERS for config in CONFIGS[layer]]
KINDS = ["homo", "homo_int32", "bipartite_pair", "create_block", "create_block_pair", "to_block"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layer,name,ctor,call", CONFIG_GRID, ids=[f"{c[0]}-{c[1]}" for c in CONFIG_GRID])
def test_matches_stock(dgl, h, layer, name, ctor, call, kind):
    key = LAYERS[layer].key
    make, pair = h.KINDS[kind]
    g = make(dgl)
    ctor = dict(ctor)
    conv = build(dgl, layer, pair, ctor.pop("num_heads"), **ctor)
    feat = h.features(g, in_feats_of(conv, pair), pair)
    before = h.graph_state(g)
    out = h.compare(conv, g, feat, call_kwargs(h, g, call))
    assert out[0].shape == (g.num_dst_nodes(), conv._num_heads, OUT)
    if call.get("get_attention"):
        assert out[1].shape == (g.num_edges(), conv._num_heads, 1)
    assert h.same_graph_state(before, h.graph_state(g))
    assert h.fused_count(key) == 1
    assert gnn_fastpath.stats()[key]["fallback"] == {}


@pytest.mark.parametrize("layer", LAYERS)
def test_feature_dropout_in_training_draws_stock_random_numbers(dgl, h, layer):
    """feat_drop is called as stock calls it: same seed, same masks, same result."""
    for pair in (False, True):
        g = h.bipartite(dgl) if pair else h.homo(dgl, empty_rows=2)
        conv = build(dgl, layer, pair, 2, feat_drop=0.4, residual=True)
        h.compare(conv, g, h.features(g, in_feats_of(conv, pair), pair), dict(get_attention=True))


# GATConv without its output bias (it would make the p = 1 output nonzero and stand outside the
# aggregate); GATv2Conv's bias is in fc_src, which the manual aggregate applies.
@pytest.mark.parametrize("layer,ctor", [("GATConv", dict(bias=False)), ("GATv2Conv", {})], ids=list(LAYERS))
def test_attention_dropout_in_distribution(dgl, h, layer, ctor):
    """Training with attn_drop: each weight is kept with probability 1 - p, scaled by 1/(1 - p),
    then multiplied by the edge weight (GATConv); the output aggregates exactly the returned weights."""
    key = LAYERS[layer].key
    p = 0.3
    g = h.homo(dgl, n=300, m=6000)
    conv = build(dgl, layer, False, 2, attn_drop=p, **ctor)
    feat = h.features(g, conv._in_src_feats, False)
    weight = dict(edge_weight=h.randn(g.num_edges(), seed=6).abs() + 0.5) if LAYERS[layer].edge_weight else {}
    conv.eval()
    (_, alpha), _ = h.run(conv, g, feat, dict(get_attention=True), "reference", grad=False)
    conv.train()
    (out, dropped), _ = h.run(conv, g, feat, dict(get_attention=True, **weight), "reference", grad=False)
    kept = dropped != 0
    rate = kept.float().mean().item()
    assert abs(rate - (1 - p)) < 0.02, rate
    if weight:
        alpha = alpha * weight["edge_weight"].view(-1, 1, 1)
    torch.testing.assert_close(dropped[kept], alpha[kept] / (1 - p))
    src, dst = g.edges()
    feat_src = getattr(conv, LAYERS[layer].projection)(feat).view(-1, 2, OUT)
    manual = torch.zeros_like(out).index_add_(0, dst.long(), dropped * feat_src[src.long()])
    torch.testing.assert_close(out, manual, rtol=1e-5, atol=1e-6)
    conv.attn_drop.p = 1.0  # drops everything, like nn.Dropout(1.0)
    (out, dropped), _ = h.run(conv, g, feat, dict(get_attention=True), "reference", grad=False)
    assert not dropped.any() and not out.any()
    assert h.fused_count(key) == 3 and gnn_fastpath.stats()[key]["fallback"] == {}


@pytest.mark.parametrize("layer", LAYERS)
def test_keyword_arguments_and_submodule_hooks(dgl, h, layer):
    key = LAYERS[layer].key
    g = h.homo(dgl)
    conv = build(dgl, layer, False, 2, residual=True)
    seen = []
    getattr(conv, LAYERS[layer].projection).register_forward_hook(lambda m, i, o: seen.append(o.shape))
    feat = h.features(g, 6, False)
    weight = dict(edge_weight=h.randn(g.num_edges(), seed=2)) if LAYERS[layer].edge_weight else {}
    ref = conv(graph=g, feat=feat, **weight, get_attention=True)
    with h.fused():
        out = conv(graph=g, feat=feat, **weight, get_attention=True)
        positional = conv(g, feat, *weight.values(), True)
    for a, b, c in zip(out, ref, positional):
        h.assert_close(a, b)
        h.assert_close(c, b)
    assert len(seen) == 3 and h.fused_count(key) == 2


@pytest.mark.parametrize("layer", LAYERS)
def test_zero_in_degree_raises_like_stock_and_is_checked_once(dgl, h, monkeypatch, layer):
    key = LAYERS[layer].key
    g = h.homo(dgl, empty_rows=2)
    conv = build(dgl, layer, False, 2)
    conv.set_allow_zero_in_degree(False)
    feat = h.features(g, 6, False)
    with pytest.raises(dgl.DGLError) as ref:
        conv(g, feat)
    with h.fused(), pytest.raises(dgl.DGLError) as exc:
        conv(g, feat)
    assert str(exc.value) == str(ref.value)
    assert gnn_fastpath.stats().get(key, {"fallback": {}})["fallback"] == {}
    # a graph without zero in-degree: checked on the first call only (memoised on the Graph)
    g = dgl.add_self_loop(g)
    with h.fused():
        conv(g, feat)
        graph = Graph.of(g)
        calls = []
        original = Graph.in_degree
        monkeypatch.setattr(Graph, "in_degree", lambda self: calls.append(1) or original(self))
        conv(g, feat)
    assert calls == [] and h.fused_count(key) == 2
    assert graph.memo(("dgl", "has_zero_in_degree"), lambda: None) is False


@pytest.mark.parametrize("layer", LAYERS)
def test_graph_frames_and_state_dict_untouched(dgl, h, layer):
    key = LAYERS[layer].key
    g = h.homo(dgl, empty_rows=2)
    g.ndata["x"] = torch.ones(g.num_nodes(), 3)
    g.edata["w"] = torch.ones(g.num_edges())
    before = h.graph_state(g)
    conv = build(dgl, layer, False, 2, residual=True)
    state = {k: v.clone() for k, v in conv.state_dict().items()}
    weight = dict(edge_weight=g.edata["w"]) if LAYERS[layer].edge_weight else {}
    with h.fused():
        conv(g, h.features(g, 6, False), **weight, get_attention=True)
    assert h.fused_count(key) == 1
    assert h.same_graph_state(before, h.graph_state(g))
    assert set(g.ndata.keys()) == {"x"} and set(g.edata.keys()) == {"w"}
    after = conv.state_dict()
    assert list(after) == list(state) and all(torch.equal(after[k], state[k]) for k in state)


# --------------------------------------------------------------------------- fallbacks
@pytest.mark.parametrize("layer", LAYERS)
def test_fallback_cpu_in_stock_mode(dgl, h, layer):
    g = h.homo(dgl)
    h.fallback_case(build(dgl, layer, False, 2), g, h.features(g, 6, False), "cpu", LAYERS[layer].key, cpu="stock")


@pytest.mark.parametrize("layer", LAYERS)
def test_fallback_float64(dgl, h, layer):
    g = h.homo(dgl)
    conv = build(dgl, layer, False, 2).double()
    h.fallback_case(conv, g, h.features(g, 6, False, dtype=torch.float64), "dtype", LAYERS[layer].key)


#: A change to a built module that the fused path cannot honour: (change, fallback reason).
MODULE_CHANGES = {
    "forward_hook": (lambda conv: conv.register_forward_hook(lambda m, i, o: None), "hooks"),
    "attn_drop_not_dropout": (lambda conv: setattr(conv, "attn_drop", nn.Identity()), "attn_drop"),
    "leaky_relu_replaced": (lambda conv: setattr(conv, "leaky_relu", nn.ELU()), "leaky_relu"),
    "hook_on_attn_drop": (lambda conv: conv.attn_drop.register_forward_hook(lambda m, i, o: None), "hooks"),
}


@pytest.mark.parametrize("change", MODULE_CHANGES)
@pytest.mark.parametrize("layer", LAYERS)
def test_fallback_module_changed(dgl, h, layer, change):
    g = h.homo(dgl)
    conv = build(dgl, layer, False, 2)
    apply, reason = MODULE_CHANGES[change]
    apply(conv)
    h.fallback_case(conv, g, h.features(g, 6, False), reason, LAYERS[layer].key)


@pytest.mark.parametrize("layer", LAYERS)
def test_fallback_subclass_overriding_forward(dgl, h, layer):
    from dgl import nn as dglnn

    class Mine(getattr(dglnn, layer)):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    g = h.homo(dgl)
    torch.manual_seed(0)
    conv = Mine(6, OUT, 2, allow_zero_in_degree=True)
    h.fallback_case(conv, g, h.features(g, 6, False), "subclass", LAYERS[layer].key)


@pytest.mark.parametrize("layer", LAYERS)
def test_fallback_several_edge_types(dgl, h, layer):
    g = h.multi_etype(dgl)
    conv = build(dgl, layer, False, 2)
    conv.set_allow_zero_in_degree(False)
    h.fallback_case(conv, g, h.features(g, 6, False), "heterograph", LAYERS[layer].key, expect_error=dgl.DGLError)


@pytest.mark.parametrize("layer", LAYERS)
def test_fallback_feature_rows_mismatch(dgl, h, layer):
    """A single feature tensor on a non-block bipartite graph: stock reports its own error."""
    g = h.bipartite(dgl)
    conv = build(dgl, layer, False, 2)
    h.fallback_case(conv, g, h.features(g, 6, False), "input", LAYERS[layer].key, expect_error=dgl.DGLError)


# As before the fold: GATConv with a residual projection, GATv2Conv without.
@pytest.mark.parametrize("layer,ctor", [("GATConv", dict(residual=True)), ("GATv2Conv", {})], ids=list(LAYERS))
def test_graph_decided_fallback_runs_no_submodule_twice(dgl, monkeypatch, layer, ctor):
    """A fallback the dispatch decides from the graph (here a simulated int32 overflow) comes
    before feat_drop and the projections run, so stock runs them exactly once."""
    from dgl import nn as dglnn

    from gnn_fastpath.ops import dispatch

    real = dispatch.decide
    monkeypatch.setattr(dispatch, "decide", lambda device, dtype, graph=None, limit=None: (
        dispatch.Decision(dispatch.REFERENCE, "int32", "simulated") if graph is not None
        else real(device, dtype, graph, limit)))
    g = dgl.add_self_loop(dgl.graph((torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])), num_nodes=3))
    conv = getattr(dglnn, layer)(4, 2, 2, **ctor)
    projection = LAYERS[layer].projection
    calls = []
    getattr(conv, projection).register_forward_hook(lambda *args: calls.append(projection))
    x = torch.randn(3, 4)
    want = conv(g, x)
    calls.clear()
    gnn_fastpath.reset_stats()
    with gnn_fastpath.enabled(frameworks="dgl", cpu="reference"):
        got = conv(g, x)
    assert calls == [projection]  # stock's call only
    assert gnn_fastpath.stats()[LAYERS[layer].key]["fallback"] == {"int32": 1}
    torch.testing.assert_close(got, want)


# --------------------------------------------------------------------------- real graphs
@pytest.mark.data
@pytest.mark.parametrize("layer", LAYERS)
def test_cora(dgl, h, shared_data, layer):
    from dgl import nn as dglnn

    g, x = h.cora(dgl, shared_data)
    torch.manual_seed(0)
    conv = getattr(dglnn, layer)(x.shape[1], 8, 8, residual=True, activation=F.elu, feat_drop=0.6)
    h.compare(conv.train(), g, x, dict(get_attention=True))
    assert h.fused_count(LAYERS[layer].key) == 1


@pytest.mark.data
@pytest.mark.parametrize("layer", LAYERS)
def test_tolokers_subgraph(dgl, h, shared_data, layer):
    from dgl import nn as dglnn

    g, x = h.tolokers(dgl, shared_data)
    torch.manual_seed(0)
    conv = getattr(dglnn, layer)(x.shape[1], 16, 2, residual=True, allow_zero_in_degree=True)
    weight = dict(edge_weight=h.randn(g.num_edges(), seed=1).abs()) if LAYERS[layer].edge_weight else {}
    h.compare(conv, g, x, dict(get_attention=True, **weight))
    assert h.fused_count(LAYERS[layer].key) == 1


# --------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("layer,kind,edge_weight", [
    (layer, kind, edge_weight) for layer in LAYERS for kind in ["homo", "to_block", "bipartite_pair"]
    for edge_weight in ([False, True] if LAYERS[layer].edge_weight else [False])])
def test_cpu_graph_cuda_features(dgl, h, layer, kind, edge_weight):
    """A CPU DGL graph with CUDA features (DGL's PyPI build is CPU-only: stock cannot run
    that mix, so the reference is stock on CPU copies of the module and inputs)."""
    make, pair = h.KINDS[kind]
    g = make(dgl)
    conv = build(dgl, layer, pair, 3, residual=True, activation=F.elu)
    feat = h.features(g, in_feats_of(conv, pair), pair)
    kwargs = call_kwargs(h, g, dict(get_attention=True, edge_weight=edge_weight))
    h.check_cpu_graph_cuda_features(dgl, conv, g, feat, kwargs, LAYERS[layer].key, LAYERS[layer].op)
