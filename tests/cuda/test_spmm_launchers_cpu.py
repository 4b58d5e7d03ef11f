"""Dry launches of the spmm launchers on the CPU (see dry_launch.py): every path
reaches its kernels with matching arguments, and every instantiation compiles for sm_90,
for float32, float16 and bfloat16 features, results in the features' dtype or float32,
weights of any of those dtypes."""
from __future__ import annotations

import pytest
import torch

from dry_launch import GRAPHS, graph, leaf
from gnn_fastpath.cuda import spmm as spmm_kernels
from gnn_fastpath.ops.spmm import SpmmFunction

@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("F", [1, 3, 64, 512])
@pytest.mark.parametrize("norm", ["none", "left", "right", "both"])
def test_spmm_launches(launches, monkeypatch, graph_name, F, norm):
    monkeypatch.setenv("GNN_FASTPATH_SPMM_BWD", "transposed")
    g = graph(*GRAPHS[graph_name])
    x, w = leaf(g.n_src, F), leaf(g.num_edges)
    SpmmFunction.apply(x, w, g, norm).sum().backward()
    assert {"spmm_edge_values", "spmm_rows", "spmm_edge_grad"} <= set(launches)
    assert ("spmm_chunks" in launches) == (graph_name != "plain")
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


@pytest.mark.parametrize("graph_name", ["plain", "bipartite_super"])
@pytest.mark.parametrize("F", [1, 3, 4, 64, 512])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("w_dtype,out_dtype", [("same", None), (torch.float32, None), (None, torch.float32),
                                               ("same", "same"), (torch.bfloat16, torch.float32)])
def test_spmm_launches_16bit(launches, monkeypatch, graph_name, F, dtype, w_dtype, out_dtype):
    """16-bit x; the result in x's dtype or float32 (explicit, or promoted by a float32
    weight); dY in the result's dtype, dX in x's, dw in the weight's."""
    monkeypatch.setenv("GNN_FASTPATH_SPMM_BWD", "transposed")
    g = graph(*GRAPHS[graph_name])
    x = torch.randn(g.n_src, F, dtype=dtype).requires_grad_()
    w = None if w_dtype is None else torch.rand(g.num_edges, dtype=dtype if w_dtype == "same" else w_dtype)
    if w is not None:
        w.requires_grad_()
    want = dtype if out_dtype == "same" else out_dtype
    if want is None:
        want = dtype if w is None else torch.promote_types(dtype, w.dtype)
    out = SpmmFunction.apply(x, w, g, "both", want)
    assert out.dtype == want
    out.float().sum().backward()
    assert {"spmm_rows", "spmm_edge_values"} <= set(launches)
    split = graph_name != "plain"
    # 16-bit outputs of split rows: float scratch + one cast; float32 outputs: atomics in place
    assert ("spmm_split_store" in launches) == split
    assert ("spmm_chunks" in launches) == split
    assert x.grad.dtype == dtype and x.grad.shape == x.shape
    if w is not None:
        assert "spmm_edge_grad" in launches and w.grad.dtype == w.dtype and w.grad.shape == w.shape


@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_norm_launches(launches, weighted):
    g = graph(True)
    spmm_kernels.gcn_norm(g, torch.rand(g.num_edges) if weighted else None, 2.0)
    assert launches == ["spmm_gcn_degree", "spmm_gcn_values"]


def test_csr_build_launch(launches):
    from gnn_fastpath.cuda import csr_indptr

    csr_indptr(torch.tensor([0, 0, 2, 5]), 7)
    assert launches == ["csr_indptr_from_sorted"]


@pytest.mark.parametrize("values", ["symmetric", "asymmetric"])
def test_undirected_backward_uses_the_forward_matrix(launches, monkeypatch, values):
    """On a symmetric graph with symmetric edge values (A^T = A) the backward multiplies by the
    forward matrix: no transposed CSR, descriptor or values are built; asymmetric values (here
    by edge position; DGL's "left"/"right" norms on any graph) take the transposed matrix."""
    from gnn_fastpath import Graph

    n = 30
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, n, (2, 120), generator=gen)
    g = Graph.from_coo(torch.cat([a, b]), torch.cat([b, a]), n, n)
    assert g.is_symmetric()
    # the dry launches compute nothing: the edge values come from torch here
    make = (lambda cache, norm, w: torch.ones(cache.kc.indices.numel())) if values == "symmetric" else \
        (lambda cache, norm, w: torch.arange(cache.kc.indices.numel(), dtype=torch.float32))
    monkeypatch.setattr(spmm_kernels.SpmmCache, "edge_values", make)
    before = dict(spmm_kernels.build_counts)
    x = leaf(n, 8)
    SpmmFunction.apply(x, None, g, "none").sum().backward()
    built = {k: spmm_kernels.build_counts[k] - before.get(k, 0) for k in ("csr_t", "values_t", "symmetry_check")}
    if values == "symmetric":
        assert built == {"csr_t": 0, "values_t": 0, "symmetry_check": 1}
    else:
        assert built == {"csr_t": 1, "values_t": 1, "symmetry_check": 1}
    assert x.grad.shape == x.shape
    SpmmFunction.apply(x, None, g, "none").sum().backward()  # the check is made once per values entry
    assert spmm_kernels.build_counts["symmetry_check"] - before.get("symmetry_check", 0) == 1
