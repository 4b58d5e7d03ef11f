"""Dry launches of the spmm launchers on the CPU (see dry_launch.py): every path
reaches its kernels with matching arguments, and every instantiation compiles for sm_90."""
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


@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_norm_launches(launches, weighted):
    g = graph(True)
    spmm_kernels.gcn_norm(g, torch.rand(g.num_edges) if weighted else None, 2.0)
    assert launches == ["spmm_gcn_degree", "spmm_gcn_values"]


def test_csr_build_launch(launches):
    from gnn_fastpath.cuda import csr_indptr

    csr_indptr(torch.tensor([0, 0, 2, 5]), 7)
    assert launches == ["csr_indptr_from_sorted"]
