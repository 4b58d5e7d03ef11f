"""Dry launches of the gat_attention launchers on the CPU (see dry_launch.py): every path
reaches its kernels with matching arguments, and every instantiation compiles for sm_90:
float32 and 16-bit features (float16, bfloat16) with out_dtype T or float32, float32 or 16-bit
scores, edge_score and edge_weight, over every vector width the 16-bit path picks, for both
backward variants (destination-major with atomics, source-major), with and without dropout
(the key from scalars; from an rng tensor, the GF_DEVICE_RNG=1 module, over the main layouts),
return_attention True / "dropped" and a gradient on the returned attention."""
from __future__ import annotations

import pytest
import torch

from dry_launch import GRAPHS, graph, leaf
from gnn_fastpath import Graph
from gnn_fastpath.cuda import gat_attention as kernels
from gnn_fastpath.cuda import launch, row_attention
from gnn_fastpath.graph.tensors import as_graph, of_graph
from gnn_fastpath.ops import dispatch
from gnn_fastpath.ops.gat_attention import GATAttentionFunction


def _apply(g, xs, s, t, u, w, return_attention, p, out_dtype=None, seed=7, offset=9):
    return GATAttentionFunction.apply(xs, s, t, u, w, g, 0.2, return_attention, p, seed, offset, out_dtype)


def _record_rng(monkeypatch):
    """{kernel name: (rng, seed, offset)} of every dry launch of a kernel with a dropout stream."""
    seen, dry = {}, launch.Kernel.launch
    def record(self, grid, block, **args):
        if "rng" in args:
            seen[self.name.split("<")[0]] = (args["rng"], args["seed"], args["offset"])
        dry(self, grid, block, **args)
    monkeypatch.setattr(launch.Kernel, "launch", record)
    return seen


@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("H,D", [(2, 64), (3, 100), (1, 256), (8, 32), (2, 7)])
@pytest.mark.parametrize("variant", kernels.BACKWARDS)
def test_gat_attention_launches(launches, monkeypatch, graph_name, H, D, variant):
    monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", variant)
    g = graph(*GRAPHS[graph_name])
    xs, s, t = leaf(g.n_src, H, D), leaf(g.n_src, H), leaf(g.n_dst, H)
    u, w = leaf(g.num_edges, H), leaf(g.num_edges)
    out, alpha = _apply(g, xs, s, t, u, w, "dropped", 0.1)
    (out.sum() + alpha.sum()).backward()
    assert {"gat_fwd", "gat_alpha_from_logits", "gat_delta_alpha"} <= set(launches)
    assert ("gat_bwd_dst" in launches) == (variant == "atomic")
    assert ("gat_bwd_src" in launches) == ("gat_delta" in launches) == (variant == "transposed")
    assert ("gat_fwd_merge" in launches) == (graph_name != "plain")
    for x in (xs, s, t, u, w):
        assert x.grad is not None and x.grad.shape == x.shape and x.grad.dtype == x.dtype


@pytest.mark.parametrize("variant", kernels.BACKWARDS)
@pytest.mark.parametrize("return_attention", [False, True])
def test_optional_inputs_and_partial_gradients(launches, monkeypatch, variant, return_attention):
    """No edge_score / edge_weight, no dropout; only some inputs need a gradient."""
    monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", variant)
    g = graph(True)
    xs, s, t = leaf(g.n_src, 2, 32), leaf(g.n_src, 2), torch.randn(g.n_dst, 2)
    res = _apply(g, xs, s, t, None, None, return_attention, 0.0)
    out = res[0] if return_attention else res
    out.sum().backward()
    assert xs.grad.shape == xs.shape and s.grad.shape == s.shape and t.grad is None
    assert "gat_delta_alpha" not in launches  # no gradient on the attention
    xs2 = torch.randn(g.n_src, 2, 32)
    t2 = leaf(g.n_dst, 2)
    _apply(g, xs2, s.detach(), t2, None, None, False, 0.0).sum().backward()
    assert t2.grad.shape == t2.shape


def _leaf(*shape, dtype, offset=0):
    """A leaf of ``dtype``; ``offset`` elements into its storage (misaligned rows)."""
    n = 1
    for s in shape:
        n *= s
    return torch.randn(n + offset).to(dtype)[offset:].view(*shape).requires_grad_()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("out_fp32", [False, True])
@pytest.mark.parametrize("H,D,offset,vw", [(2, 64, 0, 8), (4, 32, 0, 8), (1, 256, 0, 8), (2, 128, 0, 8),
                                           (2, 8, 0, 8), (3, 100, 0, 4), (2, 64, 4, 4), (1, 6, 0, 2),
                                           (2, 7, 0, 1)])
@pytest.mark.parametrize("variant", kernels.BACKWARDS)
@pytest.mark.parametrize("vec16", ["16", "8"])
def test_gat_attention_launches_16bit(launches, monkeypatch, dtype, out_fp32, H, D, offset, vw, variant, vec16):
    monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", variant)
    monkeypatch.setenv("GNN_FASTPATH_VEC16", vec16)  # 8: at most 4 halves per access (float32 layout)
    vw = vw if vec16 == "16" else min(vw, 4)
    g = graph(True, True)  # split rows both ways: the float32 accumulators of chunked rows
    xs = _leaf(g.n_src, H, D, dtype=dtype, offset=offset)
    # scores: float32 parameters-like (autocast) or 16-bit, per out_fp32 to cover both
    sdt = torch.float32 if out_fp32 else dtype
    s, t, u, w = _leaf(g.n_src, H, dtype=sdt), _leaf(g.n_dst, H, dtype=dtype), _leaf(g.num_edges, H, dtype=sdt), \
        _leaf(g.num_edges, dtype=dtype)
    out_dtype = torch.float32 if out_fp32 else dtype
    assert kernels._config(D, xs.detach()).vw == vw
    out, alpha = _apply(g, xs, s, t, u, w, True, 0.1, out_dtype)
    assert out.dtype == alpha.dtype == out_dtype
    (out.float().sum() + alpha.float().sum()).backward()
    assert {"gat_fwd", "gat_fwd_merge", "gat_alpha_from_logits", "gat_delta_alpha"} <= set(launches)
    assert ("gat_bwd_src" in launches) == (variant == "transposed")
    for x in (xs, s, t, u, w):
        assert x.grad.shape == x.shape and x.grad.dtype == x.dtype


def test_gat_configs(monkeypatch):
    """The GATv2 lane layouts with GAT's edges in flight (4 rows up to 8 floats per lane)."""
    assert [kernels.config_for(D, True) for D in (32, 64, 128, 256, 100)] == [
        kernels.Config(4, 8, 1, 32, 4), kernels.Config(4, 16, 1, 64, 4), kernels.Config(4, 32, 1, 128, 4),
        kernels.Config(4, 32, 2, 256, 4), kernels.Config(1, 32, 4, 0, 4)]
    assert kernels.config_for(512, True) == kernels.Config(1, 32, 16, 0, 2)
    x16 = torch.zeros(4, 2, 64, dtype=torch.bfloat16)
    assert kernels.config_for_16bit(64, x16) == kernels.Config(4, 16, 1, 64, 4)  # float32 layout by default
    monkeypatch.setenv("GNN_FASTPATH_VEC16", "16")
    assert kernels.config_for_16bit(64, x16) == kernels.Config(8, 8, 1, 64, 4)
    assert kernels.config_for_16bit(7, x16).vw == 1


def _outlive(g):
    g.note_pass("backward"), g.note_pass("forward")  # a forward after a backward: the next step
    assert g.outlived_a_step()
    return g


def test_backward_mode(monkeypatch):
    """The rule: the atomic pass, except on a graph that outlived a step (not static), where
    the source-major pass is taken for 16-bit rows on sources with few out-edges, and in any
    dtype where destination rows are much longer than source rows, or source rows much longer
    than destination rows on a graph of many out-edges per source; a forced variant wins; a
    bad forced value is reported."""
    dense, sparse = graph(True), graph(False, True)
    assert dense.num_edges >= 20 * dense.n_src and sparse.num_edges < 20 * sparse.n_src
    for g in (dense, sparse):
        for dtype in (None, torch.float32, torch.float16, torch.bfloat16):
            assert kernels.backward_mode(g, dtype) == "atomic"  # a graph of one step (a sampled batch)
        _outlive(g)
        assert kernels.backward_mode(g) == kernels.backward_mode(g, torch.float32) == "atomic"
    # dense: many out-edges per source, and a hub source as long as the super node's row
    assert dense.num_edges > kernels.TRANSPOSED_16BIT_MAX_MEAN_DEGREE * dense.n_src
    assert kernels.backward_mode(dense, torch.bfloat16) == kernels.backward_mode(dense, torch.float16) == "atomic"
    assert sparse.num_edges <= kernels.TRANSPOSED_16BIT_MAX_MEAN_DEGREE * sparse.n_src
    for dtype in (torch.float16, torch.bfloat16):
        assert kernels.backward_mode(sparse, dtype) == "transposed"
    # destination skew: one destination row far longer than every source row
    n = 400
    src = torch.arange(4 * n) % n  # every source: 4 out-edges
    dst = torch.cat([torch.zeros(n, dtype=torch.int64), torch.randint(1, n, (3 * n,))])  # node 0: n in-edges
    skewed = _outlive(Graph.from_edge_index(torch.stack([src, dst]), n))
    assert skewed.degree_stats().max >= kernels.TRANSPOSED_MIN_ROW_RATIO * skewed.degree_bound(source_major=True)
    assert kernels.backward_mode(skewed) == kernels.backward_mode(skewed, torch.float32) == "transposed"
    # the skew on the source side: hub sources take the source-major pass only on graphs of
    # many out-edges per source
    flipped = _outlive(Graph.from_edge_index(torch.stack([dst, src]), n))
    assert flipped.num_edges < kernels.TRANSPOSED_HUB_MIN_MEAN_DEGREE * flipped.n_src
    assert kernels.backward_mode(flipped, torch.float32) == "atomic"
    many = torch.cat([torch.zeros(16 * n, dtype=torch.int64), torch.arange(n).repeat(12)])  # hub 0
    hubs = _outlive(Graph.from_edge_index(torch.stack([many, torch.arange(many.numel()) % n]), n))
    assert hubs.num_edges >= kernels.TRANSPOSED_HUB_MIN_MEAN_DEGREE * hubs.n_src
    assert hubs.degree_bound(source_major=True) >= kernels.TRANSPOSED_MIN_ROW_RATIO * hubs.degree_stats().max
    assert kernels.backward_mode(hubs, torch.float32) == "transposed"
    even = _outlive(Graph.from_edge_index(torch.stack([src, src.roll(7)]), n))  # 4 in- and 4 out-edges each
    assert kernels.backward_mode(even, torch.float32) == "atomic"
    assert kernels.backward_mode(Graph.from_edge_index(torch.stack([src, dst]), n)) == "atomic"  # one step
    static = as_graph(of_graph(skewed))
    assert static.static and kernels.backward_mode(static, torch.bfloat16) == "atomic"
    monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", "transposed")
    assert kernels.backward_mode(dense) == "transposed" and kernels.backward_mode(sparse) == "transposed"
    monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", "atomic")
    assert kernels.backward_mode(skewed) == kernels.backward_mode(sparse, torch.bfloat16) == "atomic"
    monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", "sideways")
    with pytest.raises(ValueError, match="GNN_FASTPATH_GAT_BWD"):
        kernels.backward_mode(dense)


def test_rule_runs_in_the_backward(launches, monkeypatch):
    """Without the setting or the tuner, the backward runs the rule's variant for x_src's
    dtype: on a bipartite graph of few out-edges per source that outlived a step, the atomic
    pass in float32 and the source-major pass in 16-bit."""
    monkeypatch.delenv("GNN_FASTPATH_GAT_BWD", raising=False)
    monkeypatch.setenv("GNN_FASTPATH_TUNE", "0")
    g = _outlive(graph(False, True))
    for dtype, variant in ((torch.float32, "atomic"), (torch.bfloat16, "transposed")):
        start = len(launches)
        xs = torch.randn(g.n_src, 2, 32).to(dtype).requires_grad_()
        s, t = leaf(g.n_src, 2), leaf(g.n_dst, 2)
        _apply(g, xs, s, t, None, None, False, 0.0).sum().backward()
        ran = launches[start:]
        assert ("gat_bwd_dst" in ran) == (variant == "atomic") and ("gat_bwd_src" in ran) == (variant == "transposed")


def test_registered_with_dispatch():
    assert "gat_attention" in dispatch.OPS
    assert dispatch.kernel_limit("gat_attention", (2, 64)) is None
    assert "GAT kernels take 1 <= D <= 512" in dispatch.kernel_limit("gat_attention", (2, 513))


def test_zero_edge_graph(launches):
    """No edges: zeros out and gradients, no kernel needed in the backward."""
    from gnn_fastpath import Graph

    g = Graph.from_edge_index(torch.empty(2, 0, dtype=torch.int64), num_nodes=(6, 4))
    xs, s, t, w = leaf(6, 2, 32), leaf(6, 2), leaf(4, 2), leaf(0)
    out, alpha = _apply(g, xs, s, t, None, w, True, 0.1)
    assert out.shape == (4, 2, 32) and alpha.shape == (0, 2)
    out.sum().backward()
    for x in (xs, s, t, w):
        assert x.grad.shape == x.shape and not x.grad.any()
    assert launches == ["gat_fwd"]


def _stream_kernels(family):
    """Names of the kernels ``family`` compiled (the dry-launch fixture empties its cache per test)."""
    return {name for _, name, _ in family._cache}


@pytest.mark.parametrize("dtype,H,D,vec16", [(torch.float32, 2, 64, "8"), (torch.float32, 3, 100, "8"),
                                             (torch.float32, 1, 256, "8"), (torch.bfloat16, 2, 64, "8"),
                                             (torch.bfloat16, 2, 64, "16"), (torch.float16, 2, 7, "8")])
@pytest.mark.parametrize("variant", kernels.BACKWARDS)
def test_rng_tensor(launches, monkeypatch, variant, dtype, H, D, vec16):
    """The dropout stream as an int64 tensor [2] (seed, offset None), as under CUDA graphs: every
    kernel with a stream gets it as rng, with scalar seed = offset = 0, compiled with
    GF_DEVICE_RNG=1 (KERNELS_RNG); ints give rng None and the kernels without it (KERNELS)."""
    monkeypatch.setenv("GNN_FASTPATH_GAT_BWD", variant)
    monkeypatch.setenv("GNN_FASTPATH_VEC16", vec16)
    g = graph(True)
    seen = _record_rng(monkeypatch)
    rng = torch.tensor([7, 9])
    xs, s, t, u, w = _leaf(g.n_src, H, D, dtype=dtype), leaf(g.n_src, H), leaf(g.n_dst, H), leaf(g.num_edges, H), \
        leaf(g.num_edges)
    out, alpha = _apply(g, xs, s, t, u, w, "dropped", 0.1, seed=rng, offset=None)
    (out.float().sum() + alpha.float().sum()).backward()
    bwd = {"gat_bwd_dst"} if variant == "atomic" else {"gat_bwd_src", "gat_delta"}
    assert set(seen) == {"gat_fwd", "gat_alpha_from_logits"} | (bwd - {"gat_delta"})
    assert all(r is rng and (sd, off) == (0, 0) for r, sd, off in seen.values())
    assert dict(kernels.KERNELS_RNG.defines)["GF_DEVICE_RNG"] == 1 and "GF_DEVICE_RNG" not in \
        dict(kernels.KERNELS.defines)
    assert _stream_kernels(kernels.KERNELS_RNG) == {"gat_fwd", "gat_alpha_from_logits"} | bwd
    assert not _stream_kernels(kernels.KERNELS) & _stream_kernels(kernels.KERNELS_RNG)
    seen.clear()
    _apply(g, xs, s, t, u, w, False, 0.1).float().sum().backward()
    assert set(seen) == {"gat_fwd"} | (bwd - {"gat_delta"}) and all(v == (None, 7, 9) for v in seen.values())
    assert {"gat_fwd"} | bwd <= _stream_kernels(kernels.KERNELS)


def test_philox_stream():
    """Ints pass through; a tensor becomes rng (a copy only when it is not 16-byte aligned)."""
    assert row_attention.philox_stream(7, 9) == (None, 7, 9)
    rng = torch.tensor([3, 2**62])
    assert row_attention.philox_stream(rng, None, rng.device) == (rng, 0, 0)
    odd = torch.arange(5)[1:3]  # 8 bytes past an aligned start
    moved, seed, offset = row_attention.philox_stream(odd, None)
    assert moved.data_ptr() % 16 == 0 and moved.tolist() == [1, 2] and (seed, offset) == (0, 0)
    with pytest.raises(TypeError):
        row_attention.philox_stream(rng, 9)
    with pytest.raises(ValueError, match="int64"):
        row_attention.philox_stream(rng.int(), None)
    with pytest.raises(ValueError, match="int64"):
        row_attention.philox_stream(torch.zeros(3, dtype=torch.int64), None)
    with pytest.raises(ValueError, match="inputs on"):
        row_attention.philox_stream(rng, None, torch.device("cuda", 0))
