"""DGL GATConv under gnn_fastpath.enable(): stock semantics, fallbacks, errors, devices."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gnn_fastpath
from gnn_fastpath import Graph

pytestmark = pytest.mark.dgl

KEY = "dgl.GATConv"
OUT = 4

# (name, constructor kwargs, forward kwargs); in_feats is set per graph kind below. A forward
# kwarg ``edge_weight=True`` stands for a random positive weight per edge of the graph.
CONFIGS = [
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
]


def build(dgl, pair, heads, identity=False, eval_mode=False, seed=0, **kwargs):
    from dgl.nn import GATConv

    torch.manual_seed(seed)
    if pair:
        in_feats = (7, heads * OUT if identity else 5)
    else:
        in_feats = heads * OUT if identity else 6
    conv = GATConv(in_feats, OUT, heads, allow_zero_in_degree=True, **kwargs)
    if kwargs.get("residual"):
        assert isinstance(conv.res_fc, nn.Linear) != identity
    with torch.no_grad():  # stock inits biases to 0: make them count
        for name, p in conv.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    return conv.eval() if eval_mode else conv.train()


def in_feats_of(conv, pair):
    return (conv._in_src_feats, conv._in_dst_feats) if pair else conv._in_src_feats


def call_kwargs(h, g, call):
    call = dict(call)
    if call.pop("edge_weight", False):
        call["edge_weight"] = h.randn(g.num_edges(), seed=5).abs() + 0.1
    return call


KINDS = ["homo", "homo_int32", "bipartite_pair", "create_block", "create_block_pair", "to_block"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name,ctor,call", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_matches_stock(dgl, h, kind, name, ctor, call):
    make, pair = h.KINDS[kind]
    g = make(dgl)
    ctor = dict(ctor)
    conv = build(dgl, pair, ctor.pop("num_heads"), **ctor)
    feat = h.features(g, in_feats_of(conv, pair), pair)
    before = h.graph_state(g)
    out = h.compare(conv, g, feat, call_kwargs(h, g, call))
    assert out[0].shape == (g.num_dst_nodes(), conv._num_heads, OUT)
    if call.get("get_attention"):
        assert out[1].shape == (g.num_edges(), conv._num_heads, 1)
    assert h.same_graph_state(before, h.graph_state(g))
    assert h.fused_count(KEY) == 1
    assert gnn_fastpath.stats()[KEY]["fallback"] == {}


@pytest.mark.parametrize("kind", ["bipartite_pair", "create_block_pair"])
@pytest.mark.parametrize("residual", [False, True])
def test_pair_with_one_projection(dgl, h, kind, residual):
    """A module built with in_feats=int given a (feat_src, feat_dst) pair: ``fc`` projects both."""
    make, _ = h.KINDS[kind]
    g = make(dgl)
    conv = build(dgl, False, 2, residual=residual)
    assert hasattr(conv, "fc") and not hasattr(conv, "fc_src")
    feat = h.features(g, (6, 6), True)
    h.compare(conv, g, feat, dict(get_attention=True, edge_weight=h.randn(g.num_edges(), seed=3)))
    assert h.fused_count(KEY) == 1


def test_edge_weight_is_in_the_returned_attention(dgl, h):
    """Stock returns ``a * edge_weight`` (its graph.edata['a'] is reassigned): so does the fused path."""
    g = h.homo(dgl, empty_rows=2)
    conv = build(dgl, False, 2).eval()
    feat = h.features(g, 6, False)
    w = h.randn(g.num_edges(), seed=4)
    with h.fused():
        _, plain = conv(g, feat, get_attention=True)
        _, weighted = conv(g, feat, edge_weight=w, get_attention=True)
    assert h.fused_count(KEY) == 2
    torch.testing.assert_close(weighted, plain * w.view(-1, 1, 1))


def test_feature_dropout_in_training_draws_stock_random_numbers(dgl, h):
    """feat_drop is called as stock calls it: same seed, same masks, same result."""
    for pair in (False, True):
        g = h.bipartite(dgl) if pair else h.homo(dgl, empty_rows=2)
        conv = build(dgl, pair, 2, feat_drop=0.4, residual=True)
        h.compare(conv, g, h.features(g, in_feats_of(conv, pair), pair), dict(get_attention=True))


def test_attention_dropout_in_distribution(dgl, h):
    """Training with attn_drop: each weight is kept with probability 1 - p, scaled by 1/(1 - p),
    then multiplied by the edge weight; the output aggregates exactly the returned weights."""
    p = 0.3
    g = h.homo(dgl, n=300, m=6000)
    conv = build(dgl, False, 2, attn_drop=p, bias=False)
    feat = h.features(g, conv._in_src_feats, False)
    w = h.randn(g.num_edges(), seed=6).abs() + 0.5
    conv.eval()
    (_, alpha), _ = h.run(conv, g, feat, dict(get_attention=True), "reference", grad=False)
    conv.train()
    (out, dropped), _ = h.run(conv, g, feat, dict(get_attention=True, edge_weight=w), "reference", grad=False)
    kept = dropped != 0
    rate = kept.float().mean().item()
    assert abs(rate - (1 - p)) < 0.02, rate
    torch.testing.assert_close(dropped[kept], (alpha * w.view(-1, 1, 1))[kept] / (1 - p))
    src, dst = g.edges()
    feat_src = conv.fc(feat).view(-1, 2, OUT)
    manual = torch.zeros_like(out).index_add_(0, dst.long(), dropped * feat_src[src.long()])
    torch.testing.assert_close(out, manual, rtol=1e-5, atol=1e-6)
    conv.attn_drop.p = 1.0  # drops everything, like nn.Dropout(1.0)
    (out, dropped), _ = h.run(conv, g, feat, dict(get_attention=True), "reference", grad=False)
    assert not dropped.any() and not out.any()
    assert h.fused_count(KEY) == 3 and gnn_fastpath.stats()[KEY]["fallback"] == {}


def test_keyword_arguments_and_submodule_hooks(dgl, h):
    g = h.homo(dgl)
    conv = build(dgl, False, 2, residual=True)
    seen = []
    conv.fc.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    feat = h.features(g, 6, False)
    w = h.randn(g.num_edges(), seed=2)
    ref = conv(graph=g, feat=feat, edge_weight=w, get_attention=True)
    with h.fused():
        out = conv(graph=g, feat=feat, edge_weight=w, get_attention=True)
        positional = conv(g, feat, w, True)
    for a, b, c in zip(out, ref, positional):
        h.assert_close(a, b)
        h.assert_close(c, b)
    assert len(seen) == 3 and h.fused_count(KEY) == 2


def test_zero_in_degree_raises_like_stock_and_is_checked_once(dgl, h, monkeypatch):
    g = h.homo(dgl, empty_rows=2)
    conv = build(dgl, False, 2)
    conv.set_allow_zero_in_degree(False)
    feat = h.features(g, 6, False)
    with pytest.raises(dgl.DGLError) as ref:
        conv(g, feat)
    with h.fused(), pytest.raises(dgl.DGLError) as exc:
        conv(g, feat)
    assert str(exc.value) == str(ref.value)
    assert gnn_fastpath.stats().get(KEY, {"fallback": {}})["fallback"] == {}
    # a graph without zero in-degree: checked on the first call only (memoised on the Graph)
    g = dgl.add_self_loop(g)
    with h.fused():
        conv(g, feat)
        graph = Graph.of(g)
        calls = []
        original = Graph.in_degree
        monkeypatch.setattr(Graph, "in_degree", lambda self: calls.append(1) or original(self))
        conv(g, feat)
    assert calls == [] and h.fused_count(KEY) == 2
    assert graph.memo(("dgl", "has_zero_in_degree"), lambda: None) is False


def test_graph_frames_and_state_dict_untouched(dgl, h):
    g = h.homo(dgl, empty_rows=2)
    g.ndata["x"] = torch.ones(g.num_nodes(), 3)
    g.edata["w"] = torch.ones(g.num_edges())
    before = h.graph_state(g)
    conv = build(dgl, False, 2, residual=True)
    state = {k: v.clone() for k, v in conv.state_dict().items()}
    with h.fused():
        conv(g, h.features(g, 6, False), edge_weight=g.edata["w"], get_attention=True)
    assert h.fused_count(KEY) == 1
    assert h.same_graph_state(before, h.graph_state(g))
    assert set(g.ndata.keys()) == {"x"} and set(g.edata.keys()) == {"w"}
    after = conv.state_dict()
    assert list(after) == list(state) and all(torch.equal(after[k], state[k]) for k in state)


# --------------------------------------------------------------------------- fallbacks
def test_fallback_cpu_in_stock_mode(dgl, h):
    g = h.homo(dgl)
    h.fallback_case(build(dgl, False, 2), g, h.features(g, 6, False), "cpu", KEY, cpu="stock")


def test_fallback_float64(dgl, h):
    g = h.homo(dgl)
    conv = build(dgl, False, 2).double()
    h.fallback_case(conv, g, h.features(g, 6, False, dtype=torch.float64), "dtype", KEY)


def test_fallback_forward_hook(dgl, h):
    g = h.homo(dgl)
    conv = build(dgl, False, 2)
    conv.register_forward_hook(lambda m, i, o: None)
    h.fallback_case(conv, g, h.features(g, 6, False), "hooks", KEY)


def test_fallback_subclass_overriding_forward(dgl, h):
    from dgl.nn import GATConv

    class Mine(GATConv):
        def forward(self, graph, feat, edge_weight=None, get_attention=False):
            return super().forward(graph, feat, edge_weight, get_attention)

    g = h.homo(dgl)
    torch.manual_seed(0)
    conv = Mine(6, OUT, 2, allow_zero_in_degree=True)
    h.fallback_case(conv, g, h.features(g, 6, False), "subclass", KEY)


def test_fallback_attn_drop_not_dropout(dgl, h):
    g = h.homo(dgl)
    conv = build(dgl, False, 2)
    conv.attn_drop = nn.Identity()
    h.fallback_case(conv, g, h.features(g, 6, False), "attn_drop", KEY)


def test_fallback_leaky_relu_replaced(dgl, h):
    g = h.homo(dgl)
    conv = build(dgl, False, 2)
    conv.leaky_relu = nn.ELU()
    h.fallback_case(conv, g, h.features(g, 6, False), "leaky_relu", KEY)


def test_fallback_hook_on_attn_drop(dgl, h):
    g = h.homo(dgl)
    conv = build(dgl, False, 2)
    conv.attn_drop.register_forward_hook(lambda m, i, o: None)
    h.fallback_case(conv, g, h.features(g, 6, False), "hooks", KEY)


def test_fallback_several_edge_types(dgl, h):
    g = h.multi_etype(dgl)
    conv = build(dgl, False, 2)
    conv.set_allow_zero_in_degree(False)
    h.fallback_case(conv, g, h.features(g, 6, False), "heterograph", KEY, expect_error=dgl.DGLError)


def test_fallback_feature_rows_mismatch(dgl, h):
    """A single feature tensor on a non-block bipartite graph: stock reports its own error."""
    g = h.bipartite(dgl)
    conv = build(dgl, False, 2)
    h.fallback_case(conv, g, h.features(g, 6, False), "input", KEY, expect_error=dgl.DGLError)


def test_fallback_features_with_extra_dimensions(dgl, h):
    """Stock takes (N, *, F) features; the fused path takes 2-D ones."""
    g = h.homo(dgl)
    conv = build(dgl, False, 2)
    h.fallback_case(conv, g, h.randn(g.num_nodes(), 3, 6), "input", KEY)


def test_fallback_single_feature_for_pair_module(dgl, h):
    """A module built with (src, dst) in_feats has no ``fc``: stock raises AttributeError."""
    g = h.homo(dgl)
    conv = build(dgl, True, 2)
    h.fallback_case(conv, g, h.features(g, 7, False), "input", KEY, expect_error=AttributeError)


@pytest.mark.parametrize("case", ["column", "float64"])
def test_fallback_edge_weight(dgl, h, case):
    g = h.homo(dgl)
    conv = build(dgl, False, 2)
    if case == "column":  # stock's tile/transpose does not broadcast against [E, H, 1]
        kwargs, reason, error = dict(edge_weight=h.randn(g.num_edges(), 1)), "edge_weight", RuntimeError
    else:
        kwargs, reason = dict(edge_weight=h.randn(g.num_edges(), dtype=torch.float64)), "dtype"
        error = dgl.DGLError  # stock: a float64 weight promotes the attention, gspmm refuses the mix
    h.fallback_case(conv, g, h.features(g, 6, False), reason, KEY, kwargs=kwargs, expect_error=error)


def test_graph_decided_fallback_runs_no_submodule_twice(dgl, monkeypatch):
    """A fallback the dispatch decides from the graph (here a simulated int32 overflow) comes
    before feat_drop and the projections run, so stock runs them exactly once."""
    from dgl.nn import GATConv

    from gnn_fastpath.ops import dispatch

    real = dispatch.decide
    monkeypatch.setattr(dispatch, "decide", lambda device, dtype, graph=None, limit=None: (
        dispatch.Decision(dispatch.REFERENCE, "int32", "simulated") if graph is not None
        else real(device, dtype, graph, limit)))
    g = dgl.add_self_loop(dgl.graph((torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])), num_nodes=3))
    conv = GATConv(4, 2, 2, residual=True)
    calls = []
    conv.fc.register_forward_hook(lambda *args: calls.append("fc"))
    x = torch.randn(3, 4)
    want = conv(g, x)
    calls.clear()
    gnn_fastpath.reset_stats()
    with gnn_fastpath.enabled(frameworks="dgl", cpu="reference"):
        got = conv(g, x)
    assert calls == ["fc"]  # stock's call only
    assert gnn_fastpath.stats()[KEY]["fallback"] == {"int32": 1}
    torch.testing.assert_close(got, want)


# --------------------------------------------------------------------------- real graphs
@pytest.mark.data
def test_cora(dgl, h, shared_data):
    g, x = h.cora(dgl, shared_data)
    from dgl.nn import GATConv

    torch.manual_seed(0)
    conv = GATConv(x.shape[1], 8, 8, residual=True, activation=F.elu, feat_drop=0.6)
    h.compare(conv.train(), g, x, dict(get_attention=True))
    assert h.fused_count(KEY) == 1


@pytest.mark.data
def test_tolokers_subgraph(dgl, h, shared_data):
    g, x = h.tolokers(dgl, shared_data)
    from dgl.nn import GATConv

    torch.manual_seed(0)
    conv = GATConv(x.shape[1], 16, 2, residual=True, allow_zero_in_degree=True)
    w = h.randn(g.num_edges(), seed=1).abs()
    h.compare(conv, g, x, dict(get_attention=True, edge_weight=w))
    assert h.fused_count(KEY) == 1


# --------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["homo", "to_block", "bipartite_pair"])
@pytest.mark.parametrize("edge_weight", [False, True])
def test_cpu_graph_cuda_features(dgl, h, kind, edge_weight):
    """A CPU DGL graph with CUDA features (DGL's PyPI build is CPU-only: stock cannot run
    that mix, so the reference is stock on CPU copies of the module and inputs)."""
    make, pair = h.KINDS[kind]
    g = make(dgl)
    conv = build(dgl, pair, 3, residual=True, activation=F.elu)
    feat = h.features(g, in_feats_of(conv, pair), pair)
    kwargs = call_kwargs(h, g, dict(get_attention=True, edge_weight=edge_weight))
    h.check_cpu_graph_cuda_features(dgl, conv, g, feat, kwargs, KEY, "gat_attention")
