"""DGL GraphConv under gnn_fastpath.enable(): stock semantics, fallbacks, errors, devices."""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F

import gnn_fastpath
from gnn_fastpath import Graph

pytestmark = pytest.mark.dgl

KEY = "dgl.GraphConv"
NORMS = ["none", "left", "right", "both"]
KINDS = ["homo", "homo_int32", "bipartite_pair", "create_block", "create_block_pair", "to_block"]

# (name, in_feats, out_feats, constructor kwargs, forward extras)
CONFIGS = [
    ("shrink_weight_bias", 9, 4, {}, {}),                       # in > out: W before aggregation
    ("grow_weight_bias_relu", 4, 9, dict(activation=torch.relu), {}),  # in <= out: W after
    ("no_weight_no_bias", 5, 5, dict(weight=False, bias=False), {}),
    ("edge_weight_shrink", 9, 3, {}, dict(edge_weight=True)),
    ("edge_weight_grow_external_weight", 3, 7, dict(weight=False, activation=F.elu),
     dict(edge_weight=True, external_weight=True)),
    ("external_weight_shrink", 8, 2, dict(weight=False), dict(external_weight=True)),
]


def build(in_feats, out_feats, norm, seed=0, **kwargs):
    from dgl.nn import GraphConv

    torch.manual_seed(seed)
    conv = GraphConv(in_feats, out_feats, norm=norm, allow_zero_in_degree=True, **kwargs)
    if conv.bias is not None:  # stock inits the bias to 0: make it count
        with torch.no_grad():
            conv.bias.normal_()
    return conv


def call_kwargs(h, g, in_feats, out_feats, extras):
    kwargs = {}
    if extras.get("edge_weight"):
        kwargs["edge_weight"] = h.randn(g.num_edges(), seed=31).abs() + 0.1
    if extras.get("external_weight"):
        kwargs["weight"] = h.randn(in_feats, out_feats, seed=32)
    return kwargs


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name,in_feats,out_feats,ctor,extras", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_matches_stock(dgl, h, kind, norm, name, in_feats, out_feats, ctor, extras):
    make, pair = h.KINDS[kind]
    g = make(dgl)
    conv = build(in_feats, out_feats, norm, **ctor)
    feat = h.features(g, in_feats, pair)
    before = h.graph_state(g)
    out = h.compare(conv, g, feat, call_kwargs(h, g, in_feats, out_feats, extras))
    expected_width = out_feats if (conv.weight is not None or "external_weight" in extras) else in_feats
    assert out[0].shape == (g.num_dst_nodes(), expected_width)
    assert h.same_graph_state(before, h.graph_state(g))
    assert h.fused_count(KEY) == 1
    assert gnn_fastpath.stats()[KEY]["fallback"] == {}


@pytest.mark.parametrize("norm", NORMS)
def test_extra_feature_dimensions(dgl, h, norm):
    """Stock takes [N, *, in_feats]; the fused path too, edge weights included."""
    g = h.homo(dgl, empty_rows=2)
    for in_feats, out_feats in ((6, 3), (3, 6)):
        conv = build(in_feats, out_feats, norm)
        feat = h.randn(g.num_nodes(), 2, in_feats, seed=4)
        out = h.compare(conv, g, feat, dict(edge_weight=h.randn(g.num_edges(), seed=5)))
        assert out[0].shape == (g.num_nodes(), 2, out_feats)
    assert h.fused_count(KEY) == 2


@pytest.mark.parametrize("norm", NORMS)
def test_bipartite_graph_with_one_feature_tensor(dgl, h, norm):
    """Stock pairs a single tensor with itself on a (non-block) bipartite graph."""
    g = h.bipartite(dgl, empty_rows=2)
    out = h.compare(build(6, 3, norm), g, h.features(g, 6, False))
    assert out[0].shape == (g.num_dst_nodes(), 3) and h.fused_count(KEY) == 1


def test_zero_in_degree_raises_like_stock_and_is_checked_once(dgl, h, monkeypatch):
    g = h.homo(dgl, empty_rows=2)
    conv = build(5, 3, "both")
    conv.set_allow_zero_in_degree(False)
    feat = h.features(g, 5, False)
    with pytest.raises(dgl.DGLError) as ref:
        conv(g, feat)
    with h.fused(), pytest.raises(dgl.DGLError) as exc:
        conv(g, feat)
    assert str(exc.value) == str(ref.value)
    g = dgl.add_self_loop(g)
    conv = build(5, 3, "none")
    conv.set_allow_zero_in_degree(False)
    with h.fused():
        conv(g, feat)
        calls = []
        original = Graph.in_degree
        monkeypatch.setattr(Graph, "in_degree", lambda self: calls.append(1) or original(self))
        conv(g, feat)
    assert calls == [] and h.fused_count(KEY) == 2


def test_external_weight_with_own_weight_raises_like_stock(dgl, h):
    g = h.homo(dgl)
    conv = build(5, 3, "both")
    feat = h.features(g, 5, False)
    w = h.randn(5, 3)
    with pytest.raises(dgl.DGLError) as ref:
        conv(g, feat, weight=w)
    with h.fused(), pytest.raises(dgl.DGLError) as exc:
        conv(g, feat, weight=w)
    assert str(exc.value) == str(ref.value)


def test_weight_before_aggregation_only_when_it_shrinks(dgl, h, monkeypatch):
    """Stock multiplies by W first when in_feats > out_feats; the op sees the same width."""
    widths = []
    spmm = gnn_fastpath.ops.spmm
    monkeypatch.setattr(gnn_fastpath.ops, "spmm", lambda graph, x, *a, **k: widths.append(x.shape[-1]) or
                        spmm(graph, x, *a, **k))
    g = h.homo(dgl)
    with h.fused():
        build(9, 4, "both")(g, h.features(g, 9, False))
        build(4, 9, "both")(g, h.features(g, 4, False))
        build(6, 6, "both")(g, h.features(g, 6, False))
    assert widths == [4, 4, 6]


def test_edge_weight_does_not_enter_the_normalisation(dgl, h):
    """Scaling all edge weights by c scales the output (minus bias) by c, as in stock."""
    g = h.homo(dgl, empty_rows=2)
    conv = build(4, 4, "both", bias=False)
    feat = h.features(g, 4, False)
    w = h.randn(g.num_edges(), seed=3).abs()
    with h.fused():
        a = conv(g, feat, edge_weight=w)
        b = conv(g, feat, edge_weight=3 * w)
    h.assert_close(b, 3 * a)


def test_graph_frames_untouched(dgl, h):
    g = h.homo(dgl, empty_rows=2)
    g.ndata["x"] = torch.ones(g.num_nodes(), 3)
    before = h.graph_state(g)
    conv = build(5, 3, "both")
    with h.fused():
        conv(g, h.features(g, 5, False), edge_weight=torch.ones(g.num_edges()))
    assert h.fused_count(KEY) == 1
    assert h.same_graph_state(before, h.graph_state(g))
    assert set(g.ndata.keys()) == {"x"} and set(g.edata.keys()) == set()


# --------------------------------------------------------------------------- fallbacks
def test_fallback_cpu_in_stock_mode(dgl, h):
    g = h.homo(dgl)
    h.fallback_case(build(5, 3, "both"), g, h.features(g, 5, False), "cpu", KEY, cpu="stock")


def test_fallback_float64(dgl, h):
    g = h.homo(dgl)
    conv = build(5, 3, "both").double()
    h.fallback_case(conv, g, h.features(g, 5, False, dtype=torch.float64), "dtype", KEY)


def test_fallback_forward_hook(dgl, h):
    g = h.homo(dgl)
    conv = build(5, 3, "right")
    conv.register_forward_pre_hook(lambda m, i: None)
    h.fallback_case(conv, g, h.features(g, 5, False), "hooks", KEY)


def test_fallback_subclass_overriding_forward(dgl, h):
    from dgl.nn import GraphConv

    class Mine(GraphConv):
        def forward(self, graph, feat, weight=None, edge_weight=None):
            return super().forward(graph, feat, weight, edge_weight)

    g = h.homo(dgl)
    torch.manual_seed(0)
    conv = Mine(5, 3, allow_zero_in_degree=True)
    h.fallback_case(conv, g, h.features(g, 5, False), "subclass", KEY)


def test_fallback_per_feature_edge_weight(dgl, h):
    """Edge weights of shape [M, F] (stock broadcasts them per feature): stock runs."""
    g = h.homo(dgl)
    conv = build(5, 5, "left", weight=False)
    h.fallback_case(conv, g, h.features(g, 5, False), "edge_weight", KEY,
                    kwargs=dict(edge_weight=h.randn(g.num_edges(), 5)))


def test_fallback_several_edge_types(dgl, h):
    g = h.multi_etype(dgl)
    conv = build(5, 3, "both")
    h.fallback_case(conv, g, h.features(g, 5, False), "heterograph", KEY, expect_error=dgl.DGLError)


# --------------------------------------------------------------------------- bfloat16 accuracy
U_BF16 = 2.0 ** -8  # unit roundoff of bfloat16
#: Bound of :func:`rounding_excess` for a result rounded once: 1, plus the float32 error of
#: the value rounded (it can move a value next to a rounding midpoint to the other side).
ONCE = 1.1


def heterophilous(dgl, n=1500, m=15000, seed=0):
    """A stand-in for chameleon / squirrel / actor: power-law in- and out-degrees (hubs with
    hundreds of edges, most nodes with a few), duplicate edges, a self-loop on every node."""
    gen = torch.Generator().manual_seed(seed)

    def ends():
        weights = (torch.arange(n) + 1.0).pow(-0.7)[torch.randperm(n, generator=gen)]
        return torch.multinomial(weights, m, replacement=True, generator=gen)

    src, dst = ends(), ends()
    return dgl.add_self_loop(dgl.remove_self_loop(dgl.graph((src, dst), num_nodes=n)))


def bf16_run(conv, g, x, edge_weight, grad_out, mode):
    """One forward and backward of the bfloat16 ``conv`` (``mode``: None stock, "fused", or
    "float64": the same module, inputs and output gradient upcast, stock code). Returns the
    output and the gradients of x, the weight and the edge weights."""
    dtype = torch.float64 if mode == "float64" else torch.bfloat16
    conv = copy.deepcopy(conv).to(dtype)
    x = x.to(dtype, copy=True).requires_grad_(True)
    edge_weight = edge_weight.to(dtype, copy=True).requires_grad_(True)
    switch = gnn_fastpath.enabled(frameworks="dgl", cpu="reference") if mode == "fused" else contextlib.nullcontext()
    with switch:
        out = conv(g, x, edge_weight=edge_weight)
    out.backward(grad_out.to(dtype))
    return {"out": out.detach(), "x.grad": x.grad, "weight.grad": conv.weight.grad,
            "edge_weight.grad": edge_weight.grad}


def bf16_inputs(g, in_feats, out_feats, seed=0):
    """Dense real-valued features, positive edge weights and an output gradient, all bfloat16."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(g.num_nodes(), in_feats, generator=gen).bfloat16()
    w = (torch.rand(g.num_edges(), generator=gen) * 2 + 0.1).bfloat16()
    dy = torch.randn(g.num_nodes(), out_feats, generator=gen).bfloat16()
    return x, w, dy


def rounding_excess(actual, exact) -> float:
    """The largest ``|actual - exact| / (u |exact| + 2**-16 max |exact|)``: at most 1 when every
    entry is ``exact`` rounded once to bfloat16 (the small absolute term covers entries whose
    float32 sums cancel almost completely); each extra rounding of a larger term before a
    cancelling sum adds about its ratio to the result."""
    a, e = actual.double(), exact.double()
    return ((a - e).abs() / (U_BF16 * e.abs() + 2.0 ** -16 * e.abs().max())).max().item()


def relative_error(actual, exact) -> float:
    """``max |actual - exact| / max |exact|``, the measure of tests/integrations/test_autocast.py."""
    a, e = actual.double(), exact.double()
    return ((a - e).abs().max() / e.abs().max()).item()


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("in_feats,out_feats", [(300, 16), (16, 32)], ids=["W_before", "W_after"])
def test_bf16_module_rounds_once(dgl, h, norm, in_feats, out_feats):
    """A bfloat16 module with edge weights and a bias on a heterophilous stand-in: the fused
    output and the gradients of x, W and the edge weights are each the float64 result rounded
    once. Stock rounds the projected features (W before the aggregation) or the aggregate (W
    after) to bfloat16 first, the result again before adding the bias, and in its backward the
    propagated gradient; entries where the next sum cancels then carry many roundings of the
    larger terms."""
    g = heterophilous(dgl)
    conv = build(in_feats, out_feats, norm).bfloat16()
    x, w, dy = bf16_inputs(g, in_feats, out_feats)
    fused = bf16_run(conv, g, x, w, dy, "fused")
    exact = bf16_run(conv, g, x, w, dy, "float64")
    assert h.fused_count(KEY) == 1 and gnn_fastpath.stats()[KEY]["fallback"] == {}
    for name, t in fused.items():
        assert t.dtype == torch.bfloat16, name
        assert rounding_excess(t, exact[name]) <= ONCE, f"{name}: {rounding_excess(t, exact[name]):.2f}"


def paired_opposites(dgl, n_pairs=600, pairs_per_dst=12, in_feats=256, seed=0):
    """Heterophily at its sharpest: nodes 2p and 2p + 1 have nearly opposite features and send
    to the same destinations with the same edge weight, so each aggregate is a small
    remainder of large projected features. Returns (graph, x, edge_weight)."""
    gen = torch.Generator().manual_seed(seed)
    n = 2 * n_pairs
    pair = torch.randint(0, n_pairs, (n, pairs_per_dst), generator=gen).flatten()
    dst = torch.arange(n).repeat_interleave(pairs_per_dst)
    weight = torch.rand(pair.numel(), generator=gen) * 2 + 0.1
    g = dgl.graph((torch.cat([2 * pair, 2 * pair + 1]), torch.cat([dst, dst])), num_nodes=n)
    base = torch.randn(n_pairs, in_feats, generator=gen)
    x = torch.stack([base, -base + 0.05 * torch.randn(n_pairs, in_feats, generator=gen)], 1).flatten(0, 1)
    return g, x.bfloat16(), torch.cat([weight, weight]).bfloat16()


@pytest.mark.parametrize("norm", NORMS)
def test_bf16_cancelling_neighbours_as_accurate_as_stock(dgl, h, norm):
    """in_feats > out_feats with edge weights: stock rounds the projected features to bfloat16
    before the weighted sum, whose result is much smaller than its terms, so its error is
    many u of the output; the fused path aggregates them in float32 and rounds once (issue
    30, item 2: it had rounded them as stock does)."""
    g, x, w = paired_opposites(dgl)
    conv = build(x.shape[1], 8, norm).bfloat16()
    with torch.no_grad():
        conv.bias.mul_(0.01)  # of the output's size, so the error is the aggregate's
    dy = torch.randn(g.num_nodes(), 8, generator=torch.Generator().manual_seed(1)).bfloat16()
    stock, fused, exact = (bf16_run(conv, g, x, w, dy, mode) for mode in (None, "fused", "float64"))
    err_stock, err_fused = relative_error(stock["out"], exact["out"]), relative_error(fused["out"], exact["out"])
    assert err_stock > 4 * U_BF16  # the case is one that tells the two apart
    assert err_fused <= 2 * U_BF16 and err_fused < err_stock / 2, (err_fused, err_stock)
    for name in ("x.grad", "weight.grad", "edge_weight.grad"):
        assert relative_error(fused[name], exact[name]) <= relative_error(stock[name], exact[name]) + U_BF16, name


@pytest.mark.parametrize("in_feats,out_feats", [(300, 16), (16, 32)], ids=["W_before", "W_after"])
def test_bf16_on_matrix_units_with_float32_output(dgl, h, monkeypatch, in_feats, out_feats):
    """Where torch's 16-bit matmul can return float32 (CUDA), the products with W stay 16-bit
    operands on the matrix units (a float32-upcast product would cost many times stock's 16-bit
    one) and only the output is kept in float32. Emulated on the CPU: that matmul is
    ``torch.mm(..., out_dtype=torch.float32)``, counted here; the result stays as accurate as
    stock's or better, in stock's dtypes."""
    from gnn_fastpath.integrations.dgl import graph_conv as shim

    mm, calls = torch.mm, []

    def mm_out_dtype(a, b, *, out_dtype=None):
        if out_dtype is None:
            return mm(a, b)
        assert a.dtype == b.dtype == torch.bfloat16 and out_dtype == torch.float32
        calls.append((tuple(a.shape), tuple(b.shape)))
        return mm(a.double(), b.double()).float()  # exact products, float32 result

    monkeypatch.setattr(torch, "mm", mm_out_dtype)
    monkeypatch.setattr(shim, "_MM_OUT_DTYPE", {"cpu": True})
    g = heterophilous(dgl)
    conv = build(in_feats, out_feats, "both").bfloat16()
    x, w, dy = bf16_inputs(g, in_feats, out_feats)
    stock, fused, exact = (bf16_run(conv, g, x, w, dy, mode) for mode in (None, "fused", "float64"))
    assert len(calls) == 3  # forward, and the two products of the backward
    for name, t in fused.items():
        assert t.dtype == stock[name].dtype, name
        assert relative_error(t, exact[name]) <= relative_error(stock[name], exact[name]) + U_BF16, name


# --------------------------------------------------------------------------- real graphs
@pytest.mark.data
def test_cora(dgl, h, shared_data):
    g, x = h.cora(dgl, shared_data)
    for in_feats, out_feats in ((x.shape[1], 16), (16, 32)):
        conv = build(in_feats, out_feats, "both", activation=torch.relu)
        feat = x if in_feats == x.shape[1] else h.randn(g.num_nodes(), in_feats)
        h.compare(conv, g, feat)
    assert h.fused_count(KEY) == 2


@pytest.mark.data
def test_tolokers_subgraph(dgl, h, shared_data):
    g, x = h.tolokers(dgl, shared_data)
    for norm in ("both", "left"):
        conv = build(x.shape[1], 32, norm)
        h.compare(conv, g, x, dict(edge_weight=h.randn(g.num_edges(), seed=8).abs()))
    assert h.fused_count(KEY) == 2


# --------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["homo", "to_block", "bipartite_pair"])
def test_cpu_graph_cuda_features(dgl, h, kind):
    """A CPU DGL graph with CUDA features (DGL's PyPI build is CPU-only: stock cannot run
    that mix, so the reference is stock on CPU copies of the module and inputs).

    Without spmm CUDA kernels the shim falls back to stock ('no_kernel'), and stock DGL
    refuses CUDA features on a CPU graph with a DGLError ("Cannot assign node feature ...
    to a graph on device cpu").
    """
    make, pair = h.KINDS[kind]
    g = make(dgl)
    conv = build(9, 4, "both", activation=torch.relu)
    feat = h.features(g, 9, pair)
    kwargs = dict(edge_weight=h.randn(g.num_edges(), seed=6).abs())
    h.check_cpu_graph_cuda_features(dgl, conv, g, feat, kwargs, KEY, "spmm")
