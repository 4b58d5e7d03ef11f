"""DGL GINConv under gnn_fastpath.enable(): spmm (sum, mean) and segment_reduce (max) with DGL's
tie and non-finite rules; stock semantics, fallbacks, devices.

Features and edge weights are integer-valued, so max meets ties between different edges
everywhere; the gradient comparisons check DGL's rule (the whole gradient to the last tied
edge with fn.copy_u, to the first with fn.u_mul_e and a per-edge scalar).
"""
from __future__ import annotations

import copy
import functools
import itertools

import pytest
import torch

import gnn_fastpath

from ..test_autocast import UNIT, _check_accuracy, _check_dtypes, _run

pytestmark = pytest.mark.dgl

KEY = "dgl.GINConv"
F_IN, F_OUT = 5, 4
AGGRS = ["sum", "mean", "max"]
KINDS = ["homo", "homo_int32", "bipartite_pair", "create_block", "create_block_pair", "to_block"]
WEIGHTS = [None, (-1,), (-1, 1)]


@functools.lru_cache(maxsize=None)
def _graph(dgl, kind):
    from .conftest import KINDS as BUILDERS

    return BUILDERS[kind][0](dgl)


def _pair(kind):
    from .conftest import KINDS as BUILDERS

    return BUILDERS[kind][1]


def build(aggr, apply=True, learn_eps=False, init_eps=0.25, activation=None, f_in=F_IN):
    from dgl.nn import GINConv

    torch.manual_seed(0)
    apply_func = torch.nn.Linear(f_in, F_OUT) if apply else None
    return GINConv(apply_func, aggr, init_eps=init_eps, learn_eps=learn_eps, activation=activation)


def tied(*shape, seed=0, low=-2, high=3):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed)).float()


def tied_features(g, pair, shape=(F_IN,), seed=10):
    src = tied(g.num_src_nodes(), *shape, seed=seed)
    return (src, tied(g.num_dst_nodes(), *shape, seed=seed + 1)) if pair else src


def weight_of(g, shape):
    if shape is None:
        return {}
    return dict(edge_weight=tied(*[g.num_edges() if d == -1 else d for d in shape], seed=31, low=1, high=3))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("aggr,weight,learn_eps", list(itertools.product(AGGRS, WEIGHTS, [False, True])))
def test_matches_stock(dgl, h, kind, aggr, weight, learn_eps):
    g = _graph(dgl, kind)
    conv = build(aggr, learn_eps=learn_eps, activation=torch.relu if learn_eps else None)
    before = h.graph_state(g)
    out = h.compare(conv, g, tied_features(g, _pair(kind)), weight_of(g, weight))
    assert out[0].shape == (g.num_dst_nodes(), F_OUT)
    assert h.same_graph_state(before, h.graph_state(g))
    assert h.fused_count(KEY) == 1 and gnn_fastpath.stats()[KEY]["fallback"] == {}


@pytest.mark.parametrize("aggr,weight", list(itertools.product(AGGRS, WEIGHTS)))
def test_extra_feature_dimensions_without_apply_func(dgl, h, aggr, weight):
    """[N, A, B] features and apply_func=None: the ops reduce every trailing element."""
    g = _graph(dgl, "to_block")
    out = h.compare(build(aggr, apply=False, learn_eps=True), g, tied_features(g, False, (3, 2)), weight_of(g, weight))
    assert out[0].shape == (g.num_dst_nodes(), 3, 2)


def _no_edges(dgl, n=6):
    return dgl.graph((torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64)), num_nodes=n)


@pytest.mark.parametrize("aggr", ["sum", "mean"])
def test_graph_without_edges(dgl, h, aggr):
    h.compare(build(aggr), _no_edges(dgl), tied(6, F_IN))
    assert h.fused_count(KEY) == 1


def test_ops_and_tie_rules_used(dgl, h, monkeypatch):
    calls = []
    for name in ("segment_reduce", "spmm"):
        original = getattr(gnn_fastpath.ops, name)
        monkeypatch.setattr(gnn_fastpath.ops, name,
                            lambda graph, x, *a, _n=name, _o=original, **k:
                            calls.append((_n, k.get("tie_break"), k.get("non_finite"), k.get("norm")))
                            or _o(graph, x, *a, **k))
    g = _graph(dgl, "homo")
    x, w = tied(g.num_nodes(), F_IN), torch.ones(g.num_edges())
    with h.fused():
        build("max")(g, x)
        build("max")(g, x, edge_weight=w)
        build("mean")(g, x, edge_weight=w)
        build("sum")(g, x)
    assert calls == [("segment_reduce", h.dgl_rule("copy_u"), "drop", None),
                     ("segment_reduce", h.dgl_rule("u_mul_e", broadcast=True), "drop", None),
                     ("spmm", None, None, "right"), ("spmm", None, None, "none")]


@pytest.mark.parametrize("weight,wrong", [(None, "other"), (None, "split"), ((-1,), "other"), ((-1, 1), "even")])
def test_wrong_tie_rule_would_fail(dgl, h, monkeypatch, weight, wrong):
    if wrong == "other":
        wrong = h.other_rule(h.dgl_rule("copy_u" if weight is None else "u_mul_e", broadcast=weight is not None))
    g = _graph(dgl, "to_block")
    conv = build("max")
    feat, kwargs = tied_features(g, False), weight_of(g, weight)
    h.compare(conv, g, feat, kwargs)
    original = gnn_fastpath.ops.segment_reduce
    monkeypatch.setattr(gnn_fastpath.ops, "segment_reduce",
                        lambda graph, x, reduce, edge_weight=None, tie_break="split", non_finite="keep":
                        original(graph, x, reduce, edge_weight, wrong,
                                 non_finite if wrong in ("first", "last") else "keep"))
    with pytest.raises(AssertionError, match="grad of"):
        h.compare(conv, g, feat, kwargs)


@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("weighted", [False, True])
def test_max_keeps_dgl_non_finite_semantics(dgl, bad, weighted):
    """DGL's max skips NaN messages and writes a non-finite maximum as 0."""
    from dgl.nn import GINConv

    g = dgl.graph((torch.tensor([0, 1, 2, 0, 3, 1]), torch.tensor([1, 2, 0, 2, 1, 3])), num_nodes=4)
    conv = GINConv(None, "max")
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    x[0] = float(bad)
    kw = {"edge_weight": torch.rand(g.num_edges())} if weighted else {}
    want = conv(g, x, **kw)
    gnn_fastpath.reset_stats()
    with gnn_fastpath.enabled(frameworks="dgl", cpu="reference"):
        got = conv(g, x, **kw)
    assert gnn_fastpath.stats()[KEY]["fused"]["reference"] == 1
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.data
def test_cora(dgl, h, shared_data):
    g, x = h.cora(dgl, shared_data)
    for aggr in AGGRS:
        h.compare(build(aggr, f_in=x.shape[1], learn_eps=True), g, x)
    assert h.fused_count(KEY) == 3


@pytest.mark.parametrize("aggr", AGGRS)
def test_bf16_module_cpu(dgl, aggr):
    g = _graph(dgl, "homo")
    conv, x, dtype, cpu = build(aggr, learn_eps=True), torch.randn(g.num_nodes(), F_IN), torch.bfloat16, \
        torch.device("cpu")
    call = ((), {"edge_weight": torch.rand(g.num_edges()) + 0.5})
    stock = _run(conv, call, x, device=cpu, mode="module", dtype=dtype, graph=g)
    gnn_fastpath.reset_stats()
    fused = _run(conv, call, x, device=cpu, mode="module", dtype=dtype, framework="dgl", graph=g)
    ref_call = ((), {"edge_weight": call[1]["edge_weight"].to(dtype)})
    ref = _run(copy.deepcopy(conv).to(dtype), ref_call, x.to(dtype), device=cpu, mode="float64", dtype=dtype, graph=g)
    _check_dtypes(fused, stock)
    _check_accuracy(fused, stock, ref, UNIT[dtype])
    assert gnn_fastpath.stats()[KEY]["fused"]["reference"] == 1


# --------------------------------------------------------------------------- fallbacks
def test_fallback_max_on_graph_without_edges(dgl, h):
    h.fallback_case(build("max"), _no_edges(dgl), tied(6, F_IN), "empty_graph", KEY)


def test_fallback_per_feature_edge_weight(dgl, h):
    g = _graph(dgl, "homo")
    h.fallback_case(build("sum"), g, tied(g.num_nodes(), F_IN), "edge_weight", KEY,
                    kwargs=dict(edge_weight=h.randn(g.num_edges(), F_IN)))


def test_fallback_float64(dgl, h):
    g = _graph(dgl, "homo")
    h.fallback_case(build("mean").double(), g, tied(g.num_nodes(), F_IN).double(), "dtype", KEY)


def test_fallback_cpu_in_stock_mode(dgl, h):
    g = _graph(dgl, "homo")
    h.fallback_case(build("max"), g, tied(g.num_nodes(), F_IN), "cpu", KEY, cpu="stock")


def test_fallback_forward_hook(dgl, h):
    g = _graph(dgl, "homo")
    conv = build("sum")
    conv.register_forward_pre_hook(lambda m, i: None)
    h.fallback_case(conv, g, tied(g.num_nodes(), F_IN), "hooks", KEY)


def test_fallback_one_tensor_on_bipartite_graph(dgl, h):
    """(1 + eps) * feat + neigh with N_src != N_dst rows: stock fails, so does the layer."""
    g = h.bipartite(dgl)
    h.fallback_case(build("sum"), g, tied(g.num_src_nodes(), F_IN), "input", KEY, expect_error=RuntimeError)


def test_fallback_one_dimensional_features(dgl, h):
    g = _graph(dgl, "homo")
    h.fallback_case(build("sum", apply=False), g, tied(g.num_nodes()), "input", KEY)


@pytest.mark.parametrize("aggr,error", [("max", None), ("mean", NotImplementedError)])
def test_fallback_several_edge_types(dgl, h, aggr, error):
    g = h.multi_etype(dgl)
    h.fallback_case(build(aggr), g, tied(g.num_nodes(), F_IN), "heterograph", KEY, expect_error=error)


# --------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("aggr", AGGRS)
@pytest.mark.parametrize("kind,weighted", [("homo", False), ("to_block", True), ("bipartite_pair", True),
                                           ("super_node", True)])
def test_cpu_graph_cuda_features(dgl, h, aggr, kind, weighted):
    if kind == "super_node":  # node 0 gets 300 more in-edges (the kernels' heavy rows)
        from zoo import random_edges

        ei, _ = random_edges(40, 40, 160, 6, empty_rows=2, super_node_degree=300)
        g, pair = dgl.graph((ei[0], ei[1]), num_nodes=40), False
    else:
        g, pair = _graph(dgl, kind), _pair(kind)
    conv = build(aggr, learn_eps=True, activation=torch.relu)
    op = "segment_reduce" if aggr == "max" else "spmm"
    h.check_cpu_graph_cuda_features(dgl, conv, g, tied_features(g, pair), weight_of(g, (-1,) if weighted else None),
                                    KEY, op)
