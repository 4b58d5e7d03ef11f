"""DGL SAGEConv under gnn_fastpath.enable(): stock semantics (tie gradients included), fallbacks.

Features, edge weights and the pool projection are integer-valued, so the max of ``"pool"``
meets ties between different edges everywhere (and ties at the ReLU's zeros, which carry no
gradient further back); the gradient comparisons check DGL's tie rule: the whole gradient to
the last tied edge with ``fn.copy_u``, to the first with ``fn.u_mul_e`` and a per-edge
scalar weight.
"""
from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

import gnn_fastpath
from gnn_fastpath import Graph

pytestmark = pytest.mark.dgl

KEY = "dgl.SAGEConv"
AGGRS = ["mean", "gcn", "pool"]
KINDS = ["homo", "homo_int32", "bipartite_pair", "create_block", "create_block_pair", "to_block"]

# (name, in_feats, out_feats, constructor kwargs, forward extras)
CONFIGS = [
    ("shrink", 9, 4, {}, {}),                                         # fc_neigh before aggregation
    ("grow_relu", 4, 9, dict(activation=torch.relu), {}),             # fc_neigh after
    ("edge_weight_shrink", 9, 3, {}, dict(edge_weight=(-1,))),
    ("edge_weight_column_grow_no_bias", 3, 7, dict(bias=False), dict(edge_weight=(-1, 1))),
    ("dropout_layernorm", 6, 5, dict(feat_drop=0.3, norm="layernorm", activation=F.elu), {}),
]


def _tie_heavy(conv):
    """Integer-valued pool projection (so its outputs tie) and a nonzero gcn bias."""
    gen = torch.Generator().manual_seed(17)
    with torch.no_grad():
        if conv._aggre_type == "pool":
            conv.fc_pool.weight.copy_(torch.randint(-1, 2, conv.fc_pool.weight.shape, generator=gen))
            conv.fc_pool.bias.copy_(torch.randint(-1, 2, conv.fc_pool.bias.shape, generator=gen))
        if conv._aggre_type == "gcn" and conv.bias is not None:
            conv.bias.normal_(generator=gen)
    return conv


def build(in_feats, out_feats, aggr, seed=0, norm=None, **kwargs):
    from dgl.nn import SAGEConv

    torch.manual_seed(seed)
    if norm == "layernorm":
        norm = torch.nn.LayerNorm(out_feats)
    return _tie_heavy(SAGEConv(in_feats, out_feats, aggr, norm=norm, **kwargs))


def tied(*shape, seed=0, low=-2, high=3):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=gen).float()


def tied_features(g, in_feats, pair, seed=10):
    if pair:
        return tied(g.num_src_nodes(), in_feats, seed=seed), tied(g.num_dst_nodes(), in_feats, seed=seed + 1)
    return tied(g.num_src_nodes(), in_feats, seed=seed)


def call_kwargs(g, extras):
    shape = extras.get("edge_weight")
    if shape is None:
        return {}
    return dict(edge_weight=tied(*[g.num_edges() if d == -1 else d for d in shape], seed=31, low=1, high=3))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("aggr", AGGRS)
@pytest.mark.parametrize("name,in_feats,out_feats,ctor,extras", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_matches_stock(dgl, h, kind, aggr, name, in_feats, out_feats, ctor, extras):
    make, pair = h.KINDS[kind]
    g = make(dgl)
    conv = build(in_feats, out_feats, aggr, **ctor)
    before = h.graph_state(g)
    out = h.compare(conv, g, tied_features(g, in_feats, pair), call_kwargs(g, extras))
    assert out[0].shape == (g.num_dst_nodes(), out_feats)
    assert h.same_graph_state(before, h.graph_state(g))
    assert h.fused_count(KEY) == 1
    assert gnn_fastpath.stats()[KEY]["fallback"] == {}


def _no_edges(dgl, n=6):
    return dgl.graph((torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64)), num_nodes=n)


@pytest.mark.parametrize("aggr", ["mean", "gcn"])
@pytest.mark.parametrize("in_feats,out_feats", [(6, 3), (3, 6)])
def test_graph_without_edges(dgl, h, aggr, in_feats, out_feats):
    h.compare(build(in_feats, out_feats, aggr), _no_edges(dgl), tied(6, in_feats))
    assert h.fused_count(KEY) == 1


def test_fallback_pool_on_graph_without_edges(dgl, h):
    """DGL's max over a graph without edges returns zeros but sends every destination's
    gradient to source 0: pool runs stock there."""
    import dgl.function as fn

    g = _no_edges(dgl, 4)
    x = torch.randn(4, 2, requires_grad=True)
    with g.local_scope():
        g.srcdata["h"] = x
        g.update_all(fn.copy_u("h", "m"), fn.max("m", "n"))
        grad, = torch.autograd.grad(g.dstdata["n"], x, torch.ones(4, 2))
    assert grad[0].tolist() == [4.0, 4.0] and not grad[1:].any()  # the DGL behaviour
    h.fallback_case(build(5, 3, "pool"), _no_edges(dgl), tied(6, 5), "empty_graph", KEY)


@pytest.mark.parametrize("aggr", ["mean", "gcn"])
def test_fc_neigh_before_aggregation_only_when_it_shrinks(dgl, h, aggr, monkeypatch):
    """Stock applies fc_neigh before aggregating when in_feats > out_feats: the op sees that width."""
    widths = []
    spmm = gnn_fastpath.ops.spmm
    monkeypatch.setattr(gnn_fastpath.ops, "spmm", lambda graph, x, *a, **k: widths.append(x.shape[-1]) or
                        spmm(graph, x, *a, **k))
    g = h.homo(dgl)
    with h.fused():
        for in_feats, out_feats in ((9, 4), (4, 9), (6, 6)):
            build(in_feats, out_feats, aggr)(g, tied(g.num_nodes(), in_feats))
    assert widths == [4, 4, 6]


def test_ops_and_tie_rules_used(dgl, h, monkeypatch):
    calls = []
    original = gnn_fastpath.ops.segment_reduce
    monkeypatch.setattr(gnn_fastpath.ops, "segment_reduce",
                        lambda graph, x, reduce, edge_weight=None, tie_break="split", non_finite="keep":
                        calls.append((reduce, edge_weight is not None, tie_break, non_finite))
                        or original(graph, x, reduce, edge_weight, tie_break, non_finite))
    g = h.homo(dgl)
    conv = build(5, 3, "pool")
    with h.fused():
        conv(g, tied(g.num_nodes(), 5))
        conv(g, tied(g.num_nodes(), 5), edge_weight=torch.ones(g.num_edges()))
        conv(g, tied(g.num_nodes(), 5), edge_weight=torch.ones(g.num_edges(), 1))
    weighted = h.dgl_rule("u_mul_e", broadcast=True)
    assert calls == [("max", False, h.dgl_rule("copy_u"), "drop"), ("max", True, weighted, "drop"),
                     ("max", True, weighted, "drop")]


def _stock_max(dgl, g, x, w):
    import dgl.function as fn

    with g.local_scope():
        g.srcdata["h"] = x
        if w is None:
            g.update_all(fn.copy_u("h", "m"), fn.max("m", "n"))
        else:
            g.edata["w"] = w
            g.update_all(fn.u_mul_e("h", "w", "m"), fn.max("m", "n"))
        return g.dstdata["n"]


@pytest.mark.parametrize("weight", [None, (-1,), (-1, 1)])
@pytest.mark.parametrize("kind", ["homo", "to_block"])
def test_dgl_max_tie_rule(dgl, h, kind, weight):
    """DGL's own max gives a tie's gradient whole to one tied edge: the rule the probe read
    off this DGL build is the only one that reproduces it on these inputs (the test of the
    probe on real graphs: every other rule gives other gradients)."""
    rule = h.dgl_rule("copy_u" if weight is None else "u_mul_e", broadcast=weight is not None)
    g = h.KINDS[kind][0](dgl)
    x = tied(g.num_src_nodes(), 6, seed=3).requires_grad_()
    w = None if weight is None else tied(*[g.num_edges() if d == -1 else d for d in weight], seed=4,
                                         low=1, high=3).requires_grad_()
    inputs = [x] + ([w] if w is not None else [])
    out = _stock_max(dgl, g, x, w)
    grad_out = h.randn(*out.shape, seed=5)
    expected = torch.autograd.grad(out, inputs, grad_out)
    G = Graph.of(g)
    for tie_break in gnn_fastpath.reference.aggregation.TIE_BREAKS:
        ours = gnn_fastpath.ops.segment_reduce(G, x, "max", None if w is None else w.reshape(-1), tie_break)
        h.assert_close(ours, out, "value")
        grads = torch.autograd.grad(ours, inputs, grad_out)
        same = all(torch.allclose(a, b.reshape(a.shape)) for a, b in zip(grads, expected))
        assert same == (tie_break == rule), tie_break


@pytest.mark.parametrize("edge_weight,wrong", [(None, "other"), (None, "split"), ((-1,), "other"), ((-1,), "even")])
def test_wrong_tie_rule_would_fail(dgl, h, monkeypatch, edge_weight, wrong):
    """The comparisons above exercise the rule: forcing another one breaks them."""
    if wrong == "other":
        wrong = h.other_rule(h.dgl_rule("copy_u" if edge_weight is None else "u_mul_e",
                                        broadcast=edge_weight is not None))
    g = h.to_block(dgl, empty_rows=2)
    conv = build(5, 4, "pool")
    feat = tied_features(g, 5, False)
    kwargs = call_kwargs(g, dict(edge_weight=edge_weight))
    h.compare(conv, g, feat, kwargs)
    original = gnn_fastpath.ops.segment_reduce
    monkeypatch.setattr(gnn_fastpath.ops, "segment_reduce",
                        lambda graph, x, reduce, edge_weight=None, tie_break="split", non_finite="keep":
                        original(graph, x, reduce, edge_weight, wrong,
                                 non_finite if wrong in ("first", "last") else "keep"))
    with pytest.raises(AssertionError, match="grad of"):
        h.compare(conv, g, feat, kwargs)


def test_gcn_formula(dgl, h):
    """gcn: (sum of the in-neighbours' features + the node's own) / (in_degree + 1), checked
    against a dense computation (fc_neigh after aggregation, no bias)."""
    from zoo import dense_adjacency

    g = h.homo(dgl, empty_rows=3)
    conv = build(4, 6, "gcn", bias=False)
    x = tied(g.num_nodes(), 4)
    with h.fused():
        out = conv(g, x)
    src, dst = g.edges()
    a = dense_adjacency(torch.stack([src, dst]).long(), g.num_nodes(), g.num_nodes(), dtype=torch.float32)
    expected = conv.fc_neigh((a @ x + x) / (a.sum(1, keepdim=True) + 1))
    h.assert_close(out, expected, "gcn")
    assert h.fused_count(KEY) == 1


# --------------------------------------------------------------------------- fallbacks
def test_fallback_cpu_in_stock_mode(dgl, h):
    g = h.homo(dgl)
    h.fallback_case(build(5, 3, "pool"), g, tied(g.num_nodes(), 5), "cpu", KEY, cpu="stock")


def test_fallback_lstm(dgl, h):
    g = h.homo(dgl)
    h.fallback_case(build(5, 3, "lstm"), g, tied(g.num_nodes(), 5), "aggregator_type", KEY)


def test_fallback_float64(dgl, h):
    g = h.homo(dgl)
    h.fallback_case(build(5, 3, "mean").double(), g, tied(g.num_nodes(), 5).double(), "dtype", KEY)


def test_fallback_forward_hook(dgl, h):
    g = h.homo(dgl)
    conv = build(5, 3, "gcn")
    conv.register_forward_hook(lambda m, i, o: None)
    h.fallback_case(conv, g, tied(g.num_nodes(), 5), "hooks", KEY)


def test_fallback_subclass_overriding_forward(dgl, h):
    from dgl.nn import SAGEConv

    class Mine(SAGEConv):
        def forward(self, graph, feat, edge_weight=None):
            return super().forward(graph, feat, edge_weight)

    g = h.homo(dgl)
    torch.manual_seed(0)
    h.fallback_case(Mine(5, 3, "pool"), g, tied(g.num_nodes(), 5), "subclass", KEY)


@pytest.mark.parametrize("aggr", ["pool", "mean"])
def test_fallback_per_feature_edge_weight(dgl, h, aggr):
    g = h.homo(dgl)
    width = 5 if aggr == "pool" else 3  # pool: the fc_pool width; mean 5 -> 3: fc_neigh first
    h.fallback_case(build(5, 3, aggr), g, tied(g.num_nodes(), 5), "edge_weight", KEY,
                    kwargs=dict(edge_weight=h.randn(g.num_edges(), width)))


@pytest.mark.parametrize("aggr", ["mean", "pool"])
def test_fallback_extra_feature_dimensions(dgl, h, aggr):
    g = h.homo(dgl)
    h.fallback_case(build(5, 3, aggr), g, h.randn(g.num_nodes(), 2, 5), "input", KEY)


@pytest.mark.parametrize("aggr,error", [("mean", RuntimeError), ("gcn", "DGLError"), ("pool", RuntimeError)])
def test_fallback_one_tensor_on_bipartite_graph(dgl, h, aggr, error):
    """A single tensor on a non-block bipartite graph: stock fails (shapes), so does the layer."""
    g = h.bipartite(dgl)
    error = dgl.DGLError if error == "DGLError" else error
    h.fallback_case(build(5, 3, aggr), g, tied(g.num_src_nodes(), 5), "input", KEY, expect_error=error)


def test_fallback_gcn_pair_of_different_widths(dgl, h):
    g = h.bipartite(dgl)
    feat = (tied(g.num_src_nodes(), 5), tied(g.num_dst_nodes(), 4))
    h.fallback_case(build((5, 4), 3, "gcn"), g, feat, "input", KEY, expect_error=dgl.DGLError)


@pytest.mark.parametrize("aggr,error", [("pool", None), ("mean", NotImplementedError)])
def test_fallback_several_edge_types(dgl, h, aggr, error):
    g = h.multi_etype(dgl)
    h.fallback_case(build(5, 3, aggr), g, tied(g.num_nodes(), 5), "heterograph", KEY, expect_error=error)


# --------------------------------------------------------------------------- real graphs
@pytest.mark.data
def test_cora(dgl, h, shared_data):
    g, x = h.cora(dgl, shared_data)
    for aggr in AGGRS:
        h.compare(build(x.shape[1], 16, aggr, activation=torch.relu), g, x)
    assert h.fused_count(KEY) == 3


@pytest.mark.data
def test_tolokers_subgraph(dgl, h, shared_data):
    g, x = h.tolokers(dgl, shared_data)
    w = tied(g.num_edges(), seed=8, low=1, high=3)
    for aggr in ("pool", "gcn"):
        h.compare(build(x.shape[1], 8, aggr), g, x, dict(edge_weight=w))
    assert h.fused_count(KEY) == 2


# --------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("aggr", AGGRS)
@pytest.mark.parametrize("kind,weighted", [("homo", False), ("to_block", True), ("bipartite_pair", True),
                                           ("create_block", False), ("super_node", True)])
def test_cpu_graph_cuda_features(dgl, h, aggr, kind, weighted):
    """A CPU DGL graph with CUDA features (DGL's PyPI build is CPU-only: stock cannot run
    that mix, so the reference is stock on CPU copies of the module and inputs), tie-heavy."""
    if kind == "super_node":  # node 0 gets 300 more in-edges (the kernels' heavy rows)
        from zoo import random_edges

        ei, _ = random_edges(40, 40, 160, 6, empty_rows=2, super_node_degree=300)
        g, pair = dgl.graph((ei[0], ei[1]), num_nodes=40), False
    else:
        make, pair = h.KINDS[kind]
        g = make(dgl)
    conv = build(9, 4, aggr, activation=torch.relu)
    feat = tied_features(g, 9, pair)
    kwargs = call_kwargs(g, dict(edge_weight=(-1,) if weighted else None))
    op = "segment_reduce" if aggr == "pool" else "spmm"
    h.check_cpu_graph_cuda_features(dgl, conv, g, feat, kwargs, KEY, op)


@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("weighted", [False, True])
def test_pool_keeps_dgl_non_finite_semantics(dgl, bad, weighted):
    """The issue's case: x[0] = NaN (or inf). Stock DGL's max skips NaN messages and writes a
    non-finite maximum as 0, so only row 0 (through fc_self) is NaN; the fused path agrees."""
    from dgl.nn import SAGEConv

    torch.manual_seed(0)
    g = dgl.graph((torch.tensor([0, 1, 2, 0, 3, 1]), torch.tensor([1, 2, 0, 2, 1, 3])), num_nodes=4)
    conv = SAGEConv(5, 3, "pool")
    x = torch.randn(4, 5)
    x[0] = float(bad)
    kw = {"edge_weight": torch.rand(g.num_edges())} if weighted else {}
    want = conv(g, x, **kw)
    gnn_fastpath.reset_stats()
    with gnn_fastpath.enabled(frameworks="dgl", cpu="reference"):
        got = conv(g, x, **kw)
    assert gnn_fastpath.stats()[KEY]["fused"]["reference"] == 1
    torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.isfinite(want[1:]).all()  # the rows that do not own the NaN stay finite
