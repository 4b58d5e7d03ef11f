"""Dry launches of the dot_attention launchers on the CPU (see dry_launch.py): every path
reaches its kernels with matching arguments, and every instantiation compiles for sm_90,
for float32, float16 and bfloat16 inputs with outputs in the input dtype or float32, with the
dropout key from scalars (from an rng tensor, the GF_DEVICE_RNG=1 module, over the main layouts)."""
from __future__ import annotations

import pytest
import torch

from dry_launch import GRAPHS, graph, leaf
from gnn_fastpath.cuda import block_attention
from gnn_fastpath.cuda import dot_attention as dot_kernels
from gnn_fastpath.cuda import launch
from gnn_fastpath.ops.dot_attention import DotAttentionFunction

# (input dtype, out_dtype): float32 as before, 16-bit with 16-bit or float32 results
DTYPES = [(torch.float32, None), (torch.float16, None), (torch.bfloat16, None), (torch.float16, torch.float32),
          (torch.bfloat16, torch.float32)]


def _ids(case):
    ti, to = case
    return f"{str(ti)[6:]}->{str(to or ti)[6:]}"


def _leaves(g, H, D, dtype):
    return [leaf(n, H, D).to(dtype).detach().requires_grad_() for n in (g.n_dst, g.n_src, g.n_src, g.num_edges)]


@pytest.mark.parametrize("dtypes", DTYPES, ids=_ids)
@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("H,D", [(4, 128), (2, 8), (3, 100), (1, 512)])
@pytest.mark.parametrize("variant", ["atomic", "transposed"])
def test_dot_attention_launches(launches, monkeypatch, graph_name, H, D, variant, dtypes):
    ti, to = dtypes
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", variant)
    g = graph(*GRAPHS[graph_name])
    q, k, v, et = _leaves(g, H, D, ti)
    out, alpha = DotAttentionFunction.apply(q, k, v, et, g, 0.125, True, 0.1, 7, 9, to)
    assert out.dtype == alpha.dtype == (to or ti)
    (out.float().sum() + alpha.float().sum()).backward()
    assert {"dot_fwd", "dot_alpha_from_logits", "dot_delta_alpha", "dot_bwd_dst"} <= set(launches)
    assert ("dot_bwd_src" in launches) == (variant == "transposed")
    assert ("dot_fwd_merge" in launches) == (graph_name != "plain")
    for x in (q, k, v, et):
        assert x.grad.shape == x.shape and x.grad.dtype == ti


@pytest.mark.parametrize("dtypes", DTYPES[1:], ids=_ids)
@pytest.mark.parametrize("D", [8, 16, 64, 6])
def test_dot_attention_half_low_degree_variants(launches, monkeypatch, D, dtypes):
    """Low mean in-degree (two heads per lane group where the budget allows) and no dropout,
    no attention: the plain forward/backward instantiations of 16-bit inputs compile too."""
    ti, to = dtypes
    g = graph(False)
    assert g.degree_stats().mean < dot_kernels.LOW_DEGREE
    q, k, v, et = _leaves(g, 8, D, ti)
    for variant in ("atomic", "transposed"):
        monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", variant)
        out = DotAttentionFunction.apply(q, k, v, None, g, 0.3, False, 0.0, 0, 0, to)
        assert out.dtype == (to or ti)
        out.float().sum().backward()
        assert q.grad.dtype == k.grad.dtype == v.grad.dtype == ti


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_vector_width_of_the_config(dtype):
    """16-byte accesses: float4 for aligned float32 rows (as before 16-bit support), 8 halves
    for aligned 16-bit rows (8-byte accesses when D is a multiple of 4 only), scalar else."""
    x = torch.zeros(4, 2, 128, dtype=dtype)
    wide = 16 // x.element_size()
    cfg = dot_kernels.config_for(128, wide, 2)
    assert cfg.vec == wide and cfg.vec * cfg.lph * cfg.nv == 128 and cfg.exact
    assert dot_kernels.config_for(100, 1, 2).vec == 1
    assert dot_kernels.config_for(100, 4, 2).exact is False
    assert dot_kernels.config_for(12, 8, 1) is None  # 8 does not divide 12


def _record_rng(monkeypatch):
    """{kernel name: (rng, seed, offset)} of every dry launch of a kernel with a dropout stream."""
    seen, dry = {}, launch.Kernel.launch
    def record(self, grid, block, **args):
        if "rng" in args:
            seen[self.name.split("<")[0]] = (args["rng"], args["seed"], args["offset"])
        dry(self, grid, block, **args)
    monkeypatch.setattr(launch.Kernel, "launch", record)
    return seen


def _stream_kernels(family):
    """Names of the kernels ``family`` compiled (the dry-launch fixture empties its cache per test)."""
    return {name for _, name, _ in family._cache}


@pytest.mark.parametrize("dtypes", DTYPES, ids=_ids)
@pytest.mark.parametrize("H,D", [(4, 64), (3, 100), (1, 512)])
@pytest.mark.parametrize("variant", ["atomic", "transposed"])
def test_rng_tensor(launches, monkeypatch, variant, H, D, dtypes):
    """The dropout stream as an int64 tensor [2] (seed, offset None), as under CUDA graphs: every
    kernel with a stream gets it as rng, with scalar seed = offset = 0, compiled with
    GF_DEVICE_RNG=1 (KERNELS_RNG); ints give rng None and the kernels without it (KERNELS)."""
    ti, to = dtypes
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", variant)
    g = graph(True)
    seen = _record_rng(monkeypatch)
    rng = torch.tensor([7, 9])
    q, k, v, et = _leaves(g, H, D, ti)
    out, alpha = DotAttentionFunction.apply(q, k, v, et, g, 0.125, "dropped", 0.1, rng, None, to)
    (out.float().sum() + alpha.float().sum()).backward()
    expected = {"dot_fwd", "dot_alpha_from_logits", "dot_bwd_dst"} | ({"dot_bwd_src"} if variant == "transposed"
                                                                      else set())
    assert set(seen) == expected
    assert all(r is rng and (sd, off) == (0, 0) for r, sd, off in seen.values())
    assert dict(dot_kernels.KERNELS_RNG.defines)["GF_DEVICE_RNG"] == 1 and "GF_DEVICE_RNG" not in \
        dict(dot_kernels.KERNELS.defines)
    assert _stream_kernels(dot_kernels.KERNELS_RNG) == expected
    assert not _stream_kernels(dot_kernels.KERNELS) & expected
    seen.clear()
    DotAttentionFunction.apply(q, k, v, None, g, 0.125, False, 0.1, 7, 9, to).float().sum().backward()
    assert set(seen) == expected - {"dot_alpha_from_logits"} and all(v == (None, 7, 9) for v in seen.values())
    assert expected - {"dot_alpha_from_logits"} <= _stream_kernels(dot_kernels.KERNELS)


def test_backward_rule(monkeypatch):
    """The rule without tuning: the source-major pass from a mean out-degree of
    TRANSPOSED_MIN_MEAN_DEGREE, and for 16-bit rows on any graph that outlived a step (their
    atomic pass adds into float32 copies of dk and dv; benchmarks/RESULTS.md, tuning); a graph of
    one step keeps the degree rule; block where offered and the layout's windows share source
    rows; static graphs
    atomic; a forced variant wins."""
    from gnn_fastpath import Graph
    from gnn_fastpath.graph.tensors import as_graph, of_graph

    src = torch.arange(64)
    sparse = Graph.from_edge_index(torch.stack([src, (src + 1) % 64]), 64)  # out-degree 1
    dense = graph(True)
    assert sparse.num_edges < dot_kernels.TRANSPOSED_MIN_MEAN_DEGREE * sparse.n_src
    assert dense.num_edges >= dot_kernels.TRANSPOSED_MIN_MEAN_DEGREE * dense.n_src
    for dtype in (None, torch.float32, torch.float16, torch.bfloat16):  # one step: by degree
        assert dot_kernels.backward_mode(sparse, False, dtype) == "atomic"
        assert dot_kernels.backward_mode(dense, False, dtype) == "transposed"
    for g in (sparse, dense):
        g.note_pass("backward"), g.note_pass("forward")
    assert dot_kernels.backward_mode(sparse, False, torch.float32) == "atomic"
    assert dot_kernels.backward_mode(sparse) == "atomic"
    for dtype in (torch.float16, torch.bfloat16):
        assert dot_kernels.backward_mode(sparse, False, dtype) == "transposed"
        assert dot_kernels.backward_mode(dense, False, dtype) == "transposed"
        # block where offered and its windows share source rows; the ring shares none
        assert block_attention.layout(dense).sharing >= dot_kernels.BLOCK_BACKWARD_MIN_SHARING
        assert dot_kernels.backward_mode(dense, True, dtype) == "block"
        assert block_attention.layout(sparse).sharing < dot_kernels.BLOCK_BACKWARD_MIN_SHARING
        assert dot_kernels.backward_mode(sparse, True, dtype) == "transposed"
    static = as_graph(of_graph(dense))
    assert static.static and dot_kernels.backward_mode(static, False, torch.bfloat16) == "atomic"
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", "atomic")
    assert dot_kernels.backward_mode(dense, False, torch.bfloat16) == "atomic"
