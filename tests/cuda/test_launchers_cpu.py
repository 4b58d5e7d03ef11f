"""Every launcher path, run on the CPU: op -> autograd Function -> launcher -> kernel launch.

No GPU here, so the launch itself is replaced by the argument check it always does first
(:meth:`gnn_fastpath.cuda.launch.Kernel.arguments`: every .cu parameter named, no unknown
name, each value convertible to its C type), and the compile by NVRTC (the ``nvidia-cuda-
nvrtc-cu12`` wheel; the compile check is skipped without it). The numbers the "kernels"
return are garbage; what is checked is that each forward and backward pass reaches its
kernels with arguments that match their parameter lists, for every template instantiation
the launchers pick, and that those instantiations compile for sm_90. The GPU tests check
the values.
"""
from __future__ import annotations

import types

import pytest
import torch

import nvrtc
from gnn_fastpath import Graph
from gnn_fastpath.cuda import launch, loader
from gnn_fastpath.cuda import spmm as spmm_kernels
from gnn_fastpath.cuda.cusparse import CsrMatrix
from gnn_fastpath.ops.dot_attention import DotAttentionFunction
from gnn_fastpath.ops.gatv2_attention import GATv2AttentionFunction
from gnn_fastpath.ops.segment_reduce import SegmentReduceFunction
from gnn_fastpath.ops.spmm import SpmmFunction
from zoo import random_edges

_compiled: dict = {}


def _compile(source, templates, defines, index):
    """Stands in for launch._module: NVRTC-compiles the module once (when NVRTC is here)."""
    key = (source, templates, defines)
    if key not in _compiled:
        ok, log = (True, "")
        if nvrtc.available():
            ok, log = nvrtc.compile_source(loader.read_source(source), templates,
                                           ["-std=c++17", *(f"-D{k}={v}" for k, v in defines)])
        _compiled[key] = (ok, log)
    ok, log = _compiled[key]
    assert ok, f"{source} {templates} does not compile:\n{log[:4000]}"
    return types.SimpleNamespace(get_function=lambda name: types.SimpleNamespace(ptr=0, name=name))


@pytest.fixture
def launches(monkeypatch):
    """Dry launches: names of the kernels launched, arguments checked, nothing run."""
    seen = []

    def dry(self, grid, block, *, shared_mem=0, **args):
        self.arguments(args)
        grid = grid if isinstance(grid, tuple) else (grid,)
        assert all(int(g) >= 1 for g in grid), f"{self.name}: empty grid {grid}"
        seen.append(self.name.split("<")[0])

    monkeypatch.setattr(launch, "_module", _compile)
    monkeypatch.setattr(launch, "_device_index", lambda device: 0)
    for family in launch.FAMILIES:  # compiled here with stubs: keep them out of the real caches
        monkeypatch.setattr(family, "_cache", {})
    monkeypatch.setattr(launch, "resident_blocks", lambda kernel, threads, shared_mem=0: 132)
    monkeypatch.setattr(launch.Kernel, "launch", dry)
    # cuSPARSE needs CuPy and a GPU: every product takes the matrix's own kernel instead
    monkeypatch.setattr(CsrMatrix, "matmul", lambda self, values, b, c, transpose=False: self._own_kernel(values, b, c))
    return seen


def _graph(super_node: bool, bipartite: bool = False):
    n_src, n_dst = (50, 31) if bipartite else (40, 40)
    ei, nn = random_edges(n_src, n_dst, 300, seed=3, empty_rows=3, super_node_degree=700 if super_node else 0)
    if super_node:  # a long source row too, for the source-major passes
        hub = torch.stack([torch.full((400,), 1), torch.randint(0, n_dst, (400,))])
        ei = torch.cat([ei, hub], 1)
    return Graph.from_edge_index(ei, nn)


GRAPHS = {"plain": (False, False), "super_node": (True, False), "bipartite_super": (True, True)}


def _leaf(*shape):
    return torch.randn(*shape).requires_grad_()


@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("H,D", [(2, 64), (3, 100), (1, 256)])
@pytest.mark.parametrize("variant", ["atomic", "transposed"])
def test_gatv2_attention_launches(launches, monkeypatch, graph_name, H, D, variant):
    monkeypatch.setenv("GNN_FASTPATH_GATV2_BWD", variant)
    g = _graph(*GRAPHS[graph_name])
    xs, xd, att, et = _leaf(g.n_src, H, D), _leaf(g.n_dst, H, D), _leaf(H, D), _leaf(g.num_edges, H, D)
    out, alpha = GATv2AttentionFunction.apply(xs, xd, att, et, g, 0.2, "dropped", 0.1, 7, 9)
    (out.sum() + alpha.sum()).backward()
    assert {"gatv2_fwd", "gatv2_alpha_from_logits", "gatv2_delta_alpha", "gatv2_bwd_dst"} <= set(launches)
    assert ("gatv2_bwd_src" in launches) == (variant == "transposed")
    assert ("gatv2_fwd_merge" in launches) == (graph_name != "plain")
    assert xs.grad.shape == xs.shape and et.grad.shape == et.shape and att.grad.shape == att.shape


@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("H,D", [(4, 128), (2, 8), (3, 100), (1, 512)])
@pytest.mark.parametrize("variant", ["atomic", "transposed"])
def test_dot_attention_launches(launches, monkeypatch, graph_name, H, D, variant):
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", variant)
    g = _graph(*GRAPHS[graph_name])
    q, k, v, et = _leaf(g.n_dst, H, D), _leaf(g.n_src, H, D), _leaf(g.n_src, H, D), _leaf(g.num_edges, H, D)
    out, alpha = DotAttentionFunction.apply(q, k, v, et, g, 0.125, True, 0.1, 7, 9)
    (out.sum() + alpha.sum()).backward()
    assert {"dot_fwd", "dot_alpha_from_logits", "dot_delta_alpha", "dot_bwd_dst"} <= set(launches)
    assert ("dot_bwd_src" in launches) == (variant == "transposed")
    assert ("dot_fwd_merge" in launches) == (graph_name != "plain")
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and et.grad.shape == et.shape


@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("F", [1, 3, 64, 100, 512])
@pytest.mark.parametrize("tie_break,non_finite", [("split", "keep"), ("even", "keep"), ("first", "keep"),
                                                  ("last", "keep"), ("first", "drop"), ("last", "drop")])
@pytest.mark.parametrize("chunks", ["1", "2", "4"])
def test_segment_reduce_launches(launches, monkeypatch, graph_name, F, tie_break, non_finite, chunks):
    monkeypatch.setenv("GNN_FASTPATH_SR_CHUNKS", chunks)
    g = _graph(*GRAPHS[graph_name])
    x, w = _leaf(g.n_src, F), _leaf(g.num_edges)
    SegmentReduceFunction.apply(x, w, g, "min", tie_break, non_finite).sum().backward()
    assert "sr_fwd_rows" in launches
    assert ("sr_fwd_chunks" in launches) == ("sr_fwd_unpack" in launches) == (graph_name != "plain")
    assert ("sr_bwd_ties" if tie_break in ("split", "even") else "sr_bwd_arg") in launches
    with torch.no_grad():  # value only
        SegmentReduceFunction.apply(x, None, g, "max", tie_break, non_finite)
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("F", [1, 3, 64, 512])
@pytest.mark.parametrize("norm", ["none", "left", "right", "both"])
def test_spmm_launches(launches, monkeypatch, graph_name, F, norm):
    monkeypatch.setenv("GNN_FASTPATH_SPMM_BWD", "transposed")
    g = _graph(*GRAPHS[graph_name])
    x, w = _leaf(g.n_src, F), _leaf(g.num_edges)
    SpmmFunction.apply(x, w, g, norm).sum().backward()
    assert {"spmm_edge_values", "spmm_rows", "spmm_edge_grad"} <= set(launches)
    assert ("spmm_chunks" in launches) == (graph_name != "plain")
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_norm_launches(launches, weighted):
    g = _graph(True)
    spmm_kernels.gcn_norm(g, torch.rand(g.num_edges) if weighted else None, 2.0)
    assert launches == ["spmm_gcn_degree", "spmm_gcn_values"]


def test_csr_build_launch(launches):
    from gnn_fastpath.cuda import csr_indptr

    csr_indptr(torch.tensor([0, 0, 2, 5]), 7)
    assert launches == ["csr_indptr_from_sorted"]
