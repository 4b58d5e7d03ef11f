"""DGL AGNNConv under gnn_fastpath.enable(): dot_attention with q = beta * normalize(feat_dst),
k = normalize(feat_src), v = feat_src; stock semantics, fallbacks, devices."""
from __future__ import annotations

import copy
import functools

import pytest
import torch

import gnn_fastpath

from ..test_autocast import UNIT, _check_accuracy, _check_dtypes, _run

pytestmark = pytest.mark.dgl

KEY = "dgl.AGNNConv"
F_IN = 6
KINDS = ["homo", "homo_int32", "bipartite_pair", "create_block", "create_block_pair", "to_block"]


@functools.lru_cache(maxsize=None)
def _graph(dgl, kind):
    """The conftest's graph kinds (zero in-degree rows, self loops, duplicates), built once."""
    from .conftest import KINDS as BUILDERS

    return BUILDERS[kind][0](dgl)


def _pair(kind):
    from .conftest import KINDS as BUILDERS

    return BUILDERS[kind][1]


def build(init_beta=1.5, learn_beta=True, allow_zero_in_degree=True):
    from dgl.nn import AGNNConv

    return AGNNConv(init_beta=init_beta, learn_beta=learn_beta, allow_zero_in_degree=allow_zero_in_degree)


def _features(h, g, pair, shape=(F_IN,), seed=10):
    feat = h.features(g, 1, pair, seed=seed)  # the right row counts
    src = h.randn(g.num_src_nodes(), *shape, seed=seed)
    src[1] = 0.0  # a zero row: normalised to 0 (eps), its cosines are 0
    if not pair:
        return src
    return src, h.randn(feat[1].shape[0], *shape, seed=seed + 1)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("init_beta,learn_beta", [(1.5, True), (1.0, False), (-2.0, True), (0.0, True)])
def test_matches_stock(dgl, h, kind, init_beta, learn_beta):
    g = _graph(dgl, kind)
    conv = build(init_beta, learn_beta)
    before = h.graph_state(g)
    out = h.compare(conv, g, _features(h, g, _pair(kind)))
    assert out[0].shape == (g.num_dst_nodes(), F_IN)
    assert h.same_graph_state(before, h.graph_state(g))
    assert h.fused_count(KEY) == 1 and gnn_fastpath.stats()[KEY]["fallback"] == {}


@pytest.mark.parametrize("kind", ["homo", "create_block_pair", "to_block"])
@pytest.mark.parametrize("shape", [(3, 4), (2, 2, 5)])
def test_heads_from_extra_dimensions(dgl, h, kind, shape):
    """[N, *, D]: u_dot_v reduces the last dimension, each position of * is a head."""
    g = _graph(dgl, kind)
    out = h.compare(build(), g, _features(h, g, _pair(kind), shape))
    assert out[0].shape == (g.num_dst_nodes(), *shape)


def test_op_and_heads(dgl, h, monkeypatch):
    calls = []
    original = gnn_fastpath.ops.dot_attention
    monkeypatch.setattr(gnn_fastpath.ops, "dot_attention",
                        lambda graph, q, k, v, scale=None, **kw: calls.append((q.shape, scale))
                        or original(graph, q, k, v, scale, **kw))
    g = _graph(dgl, "homo")
    with h.fused():
        build()(g, _features(h, g, False))
        build()(g, _features(h, g, False, (3, 4)))
    n = g.num_nodes()
    assert calls == [((n, 1, F_IN), 1.0), ((n, 3, 4), 1.0)]


def test_zero_in_degree_raises_like_stock(dgl, h):
    g = _graph(dgl, "homo")
    conv = build(allow_zero_in_degree=False)
    feat = _features(h, g, False)
    with pytest.raises(dgl.DGLError) as ref:
        conv(g, feat)
    with h.fused(), pytest.raises(dgl.DGLError) as exc:
        conv(g, feat)
    assert str(exc.value) == str(ref.value)
    assert gnn_fastpath.stats().get(KEY, {"fallback": {}})["fallback"] == {}
    g = dgl.add_self_loop(g)
    h.compare(conv, g, _features(h, g, False))


@pytest.mark.data
def test_cora(dgl, h, shared_data):
    g, x = h.cora(dgl, shared_data)
    h.compare(build(allow_zero_in_degree=False), g, x)
    assert h.fused_count(KEY) == 1


def test_bf16_module_cpu(dgl):
    """A bfloat16 module on the CPU: stock's dtypes, error vs float64 within test_autocast.py's
    bounds."""
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
def test_fallback_cpu_in_stock_mode(dgl, h):
    g = _graph(dgl, "homo")
    h.fallback_case(build(), g, _features(h, g, False), "cpu", KEY, cpu="stock")


def test_fallback_float64(dgl, h):
    g = _graph(dgl, "homo")
    h.fallback_case(build().double(), g, _features(h, g, False).double(), "dtype", KEY)


def test_fallback_beta_of_other_dtype(dgl, h):
    g = _graph(dgl, "homo")
    conv = build(learn_beta=False)
    conv.beta = conv.beta.double()
    h.fallback_case(conv, g, _features(h, g, False), "dtype", KEY, expect_error=Exception)


def test_fallback_forward_hook(dgl, h):
    g = _graph(dgl, "homo")
    conv = build()
    conv.register_forward_hook(lambda m, i, o: None)
    h.fallback_case(conv, g, _features(h, g, False), "hooks", KEY)


def test_fallback_one_tensor_on_bipartite_graph(dgl, h):
    """Stock sets no destination norm_h on a non-block bipartite graph and fails."""
    g = h.bipartite(dgl)
    h.fallback_case(build(), g, h.randn(g.num_src_nodes(), F_IN), "input", KEY, expect_error=Exception)


def test_fallback_pair_of_different_widths(dgl, h):
    g = h.bipartite(dgl)
    feat = (h.randn(g.num_src_nodes(), F_IN), h.randn(g.num_dst_nodes(), F_IN + 1))
    h.fallback_case(build(), g, feat, "input", KEY, expect_error=Exception)


def test_fallback_one_dimensional_features(dgl, h):
    """[N] features: stock normalises across the nodes (dim=-1); runs stock."""
    g = _graph(dgl, "homo")
    h.fallback_case(build(), g, h.randn(g.num_nodes()), "input", KEY)


def test_fallback_several_edge_types(dgl, h):
    g = h.multi_etype(dgl)
    h.fallback_case(build(), g, h.randn(g.num_nodes(), F_IN), "heterograph", KEY, expect_error=Exception)


# --------------------------------------------------------------------------- GPU
@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["homo", "to_block", "bipartite_pair", "super_node"])
def test_cpu_graph_cuda_features(dgl, h, kind):
    if kind == "super_node":  # node 0 gets 300 more in-edges (the kernels' chunked rows)
        from zoo import random_edges

        ei, _ = random_edges(40, 40, 160, 6, empty_rows=2, super_node_degree=300)
        g, pair = dgl.graph((ei[0], ei[1]), num_nodes=40), False
    else:
        g, pair = _graph(dgl, kind), _pair(kind)
    h.check_cpu_graph_cuda_features(dgl, build(), g, _features(h, g, pair), {}, KEY, "dot_attention")
