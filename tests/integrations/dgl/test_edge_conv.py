"""DGL EdgeConv under gnn_fastpath.enable(): ``max_j theta(x_i - x_j) + phi(x_i)`` as
``U_i - min_j W x_j`` over node-level data (one segment_reduce); stock semantics, DGL's tie
rule, fallbacks, devices."""
from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

import gnn_fastpath

from ..test_autocast import UNIT, _check_accuracy, _check_dtypes, _run

pytestmark = pytest.mark.dgl

KEY = "dgl.EdgeConv"
F_IN, F_OUT = 5, 4
KINDS = ["homo", "homo_int32", "bipartite_pair", "create_block", "create_block_pair", "to_block"]


@functools.lru_cache(maxsize=None)
def _graph(dgl, kind):
    from .conftest import KINDS as BUILDERS

    return BUILDERS[kind][0](dgl)


def _pair(kind):
    from .conftest import KINDS as BUILDERS

    return BUILDERS[kind][1]


def build(allow_zero_in_degree=True, exact=False, **kwargs):
    """EdgeConv; ``exact``: small integer weights and half-integer biases (every message
    computed exactly on both paths, so ties are ties on both)."""
    from dgl.nn import EdgeConv

    torch.manual_seed(0)
    conv = EdgeConv(F_IN, F_OUT, allow_zero_in_degree=allow_zero_in_degree, **kwargs)
    if exact:
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for lin in (conv.theta, conv.phi):
                lin.weight.copy_(torch.randint(-2, 3, lin.weight.shape, generator=gen))
                lin.bias.copy_(torch.randint(-2, 3, lin.bias.shape, generator=gen) + 0.5)
    return conv


def tied(*shape, seed=0):
    return torch.randint(-1, 2, shape, generator=torch.Generator().manual_seed(seed)).float()


def features(h, g, pair, shape=(F_IN,), seed=10, integer=False):
    make = (lambda *s, seed: tied(*s, seed=seed)) if integer else (lambda *s, seed: h.randn(*s, seed=seed))
    src = make(g.num_src_nodes(), *shape, seed=seed)
    return (src, make(g.num_dst_nodes(), *shape, seed=seed + 1)) if pair else src


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("exact", [False, True], ids=["float", "exact_ties"])
def test_matches_stock(dgl, h, kind, exact):
    g = _graph(dgl, kind)
    conv = build(exact=exact)
    before = h.graph_state(g)
    out = h.compare(conv, g, features(h, g, _pair(kind), integer=exact))
    assert out[0].shape == (g.num_dst_nodes(), F_OUT)
    assert h.same_graph_state(before, h.graph_state(g))
    assert h.fused_count(KEY) == 1 and gnn_fastpath.stats()[KEY]["fallback"] == {}


def test_empty_rows_are_zero(dgl, h):
    g = _graph(dgl, "homo")  # its last 3 nodes have no in-edges
    out = h.compare(build(), g, features(h, g, False))[0]
    assert out[-3:].abs().max() == 0


@pytest.mark.parametrize("kind", ["homo", "to_block"])
def test_extra_feature_dimensions(dgl, h, kind):
    g = _graph(dgl, kind)
    out = h.compare(build(exact=True), g, features(h, g, False, (3, F_IN), integer=True))
    assert out[0].shape == (g.num_dst_nodes(), 3, F_OUT)


def test_no_zero_in_degree_skips_the_mask(dgl, h):
    g = dgl.add_self_loop(_graph(dgl, "homo"))
    h.compare(build(allow_zero_in_degree=False), g, features(h, g, False))
    assert h.fused_count(KEY) == 1


def test_one_node_level_reduction(dgl, h, monkeypatch):
    """One segment_reduce(min) over [N_src, F_OUT] with DGL's rules; phi called as a submodule."""
    calls, phi_inputs = [], []
    original = gnn_fastpath.ops.segment_reduce
    monkeypatch.setattr(gnn_fastpath.ops, "segment_reduce",
                        lambda graph, x, reduce, **k: calls.append((tuple(x.shape), reduce, k))
                        or original(graph, x, reduce, **k))
    g = _graph(dgl, "to_block")
    conv = build()
    conv.phi.register_forward_hook(lambda m, i, o: phi_inputs.append(i[0].shape))
    with h.fused():
        conv(g, features(h, g, False))
    assert calls == [((g.num_src_nodes(), F_OUT), "min", dict(tie_break=h.dgl_rule("copy_e"), non_finite="drop"))]
    assert phi_inputs == [(g.num_dst_nodes(), F_IN)]


@pytest.mark.parametrize("wrong", ["other", "even"])
def test_wrong_tie_rule_would_fail(dgl, h, monkeypatch, wrong):
    """Exact ties everywhere: DGL's rule (the one the running build follows) is the one stock
    follows; the other one-edge rule, or an even split, gives other gradients."""
    if wrong == "other":
        wrong = h.other_rule(h.dgl_rule("copy_e"))
    g = _graph(dgl, "to_block")
    conv, feat = build(exact=True), features(h, g, False, integer=True)
    h.compare(conv, g, feat)
    original = gnn_fastpath.ops.segment_reduce
    monkeypatch.setattr(gnn_fastpath.ops, "segment_reduce",
                        lambda graph, x, reduce, edge_weight=None, tie_break="split", non_finite="keep":
                        original(graph, x, reduce, edge_weight, wrong, non_finite if wrong != "even" else "keep"))
    with pytest.raises(AssertionError, match="grad of"):
        h.compare(conv, g, feat)


def test_zero_in_degree_raises_like_stock(dgl, h):
    g = _graph(dgl, "homo")
    conv = build(allow_zero_in_degree=False)
    feat = features(h, g, False)
    with pytest.raises(dgl.DGLError) as ref:
        conv(g, feat)
    with h.fused(), pytest.raises(dgl.DGLError) as exc:
        conv(g, feat)
    assert str(exc.value) == str(ref.value)
    assert gnn_fastpath.stats().get(KEY, {"fallback": {}})["fallback"] == {}


@pytest.mark.data
def test_tolokers_subgraph(dgl, h, shared_data):
    """A real graph's degree skew. Tolokers has many nodes with equal features, whose messages
    tie in exact arithmetic: each path then decides those ties by its own rounding (see
    integrations/edge_conv.py), so a little noise makes the features distinct (the tie rule
    itself is checked with exact arithmetic above)."""
    from dgl.nn import EdgeConv

    g, x = h.tolokers(dgl, shared_data)
    x = x + 1e-3 * h.randn(*x.shape, seed=5)
    torch.manual_seed(0)
    h.compare(EdgeConv(x.shape[1], 8, allow_zero_in_degree=True), g, x)
    assert h.fused_count(KEY) == 1


def test_bf16_module_cpu(dgl):
    g = _graph(dgl, "homo")
    conv, x, dtype, cpu = build(), torch.randn(g.num_nodes(), F_IN), torch.bfloat16, torch.device("cpu")
    stock = _run(conv, ((), {}), x, device=cpu, mode="module", dtype=dtype, graph=g)
    fused = _run(conv, ((), {}), x, device=cpu, mode="module", dtype=dtype, framework="dgl", graph=g)
    ref = _run(copy.deepcopy(conv).to(dtype), ((), {}), x.to(dtype), device=cpu, mode="float64", dtype=dtype,
               graph=g)
    _check_dtypes(fused, stock)
    _check_accuracy(fused, stock, ref, UNIT[dtype])
    assert gnn_fastpath.stats()[KEY]["fused"]["reference"] == 1


# --------------------------------------------------------------------------- fallbacks
def test_fallback_batch_norm(dgl, h):
    """batch_norm normalises the [M, F] edge messages across edges: not node-level."""
    g = _graph(dgl, "homo")
    h.fallback_case(build(batch_norm=True), g, features(h, g, False), "batch_norm", KEY)


@pytest.mark.parametrize("case", ["sequential", "hook"])
def test_fallback_theta_not_a_plain_linear(dgl, h, case):
    g = _graph(dgl, "homo")
    conv = build()
    if case == "sequential":
        conv.theta = nn.Sequential(conv.theta)
    else:
        conv.theta.register_forward_hook(lambda m, i, o: None)
    h.fallback_case(conv, g, features(h, g, False), "theta", KEY)


def test_fallback_graph_without_edges(dgl, h):
    """DGL's backward of its max indexes edge 0 of a graph without edges (stock raises there)."""
    g = dgl.graph((torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64)), num_nodes=4)
    h.fallback_case(build(), g, h.randn(4, F_IN), "empty_graph", KEY)


def test_fallback_float64(dgl, h):
    g = _graph(dgl, "homo")
    h.fallback_case(build().double(), g, features(h, g, False).double(), "dtype", KEY)


def test_fallback_cpu_in_stock_mode(dgl, h):
    g = _graph(dgl, "homo")
    h.fallback_case(build(), g, features(h, g, False), "cpu", KEY, cpu="stock")


def test_fallback_one_tensor_on_bipartite_graph(dgl, h):
    g = h.bipartite(dgl)
    h.fallback_case(build(), g, h.randn(g.num_src_nodes(), F_IN), "input", KEY, expect_error=Exception)


def test_fallback_several_edge_types(dgl, h):
    g = h.multi_etype(dgl)
    h.fallback_case(build(), g, h.randn(g.num_nodes(), F_IN), "heterograph", KEY, expect_error=Exception)


def test_fallback_subclass_overriding_forward(dgl, h):
    from dgl.nn import EdgeConv

    class Mine(EdgeConv):
        def forward(self, g, feat):
            return super().forward(g, feat)

    g = _graph(dgl, "homo")
    torch.manual_seed(0)
    h.fallback_case(Mine(F_IN, F_OUT, allow_zero_in_degree=True), g, features(h, g, False), "subclass", KEY)


# --------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["homo", "to_block", "bipartite_pair", "super_node"])
def test_cpu_graph_cuda_features(dgl, h, kind):
    if kind == "super_node":
        from zoo import random_edges

        ei, _ = random_edges(40, 40, 160, 6, empty_rows=2, super_node_degree=300)
        g, pair = dgl.graph((ei[0], ei[1]), num_nodes=40), False
    else:
        g, pair = _graph(dgl, kind), _pair(kind)
    h.check_cpu_graph_cuda_features(dgl, build(exact=True), g, features(h, g, pair, integer=True), {}, KEY,
                                    "segment_reduce")
