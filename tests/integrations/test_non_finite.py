"""NaN and infinity in node features: every patched layer gives what stock gives, NaN and
inf positions included, in the output and the input gradient (issue 15).

CPU: the shims on the reference ops (``cpu="reference"``) against stock on the same inputs.
CUDA: the fused kernels against stock run on the GPU (PyG) or on CPU copies (DGL: its PyPI
build has no CUDA; the graph stays on the CPU, features on the GPU).
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import gnn_fastpath

BAD = ["nan", "inf", "-inf"]
EDGES = torch.tensor([[0, 1, 2, 0, 3, 1, 4, 4, 2], [1, 2, 0, 2, 1, 3, 3, 0, 4]])


def _pyg_layers():
    from torch_geometric.nn import GATConv, GATv2Conv, GCNConv, SAGEConv, TransformerConv

    return {"GATv2Conv": lambda: GATv2Conv(4, 3, heads=2), "GATConv": lambda: GATConv(4, 3, heads=2),
            "TransformerConv": lambda: TransformerConv(4, 3, heads=2),
            "GCNConv": lambda: GCNConv(4, 3), "SAGEConv-mean": lambda: SAGEConv(4, 3),
            "SAGEConv-max": lambda: SAGEConv(4, 3, aggr="max"), "SAGEConv-min": lambda: SAGEConv(4, 3, aggr="min")}


def _dgl_layers():
    from dgl.nn import GATConv, GATv2Conv, GraphConv, SAGEConv

    return {"GATv2Conv": lambda: GATv2Conv(4, 3, 2), "GATConv": lambda: GATConv(4, 3, 2),
            "GraphConv": lambda: GraphConv(4, 3),
            "SAGEConv-pool": lambda: SAGEConv(4, 3, "pool"), "SAGEConv-mean": lambda: SAGEConv(4, 3, "mean")}


def _features(bad, device="cpu"):
    torch.manual_seed(0)
    x = torch.randn(5, 4)
    x[0, :2] = float(bad)
    return x.to(device)


def _run(call, module, x):
    x = x.clone().requires_grad_()
    out = call(module, x)
    out.sum().backward()
    return out.detach(), x.grad


def _same(got, want):
    for a, b in zip(got, want):
        b = b.to(a.device)
        assert torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(torch.isinf(a), torch.isinf(b))
        torch.testing.assert_close(a, b, equal_nan=True, rtol=1e-4, atol=1e-5)


def _fused(call, module, x, device):
    gnn_fastpath.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error", gnn_fastpath.FastpathFallbackWarning)
        with gnn_fastpath.enabled(cpu="reference"):
            got = _run(call, module, x)
    fused = {k: v["fused"] for k, v in gnn_fastpath.stats().items()}
    backend = "cuda" if device == "cuda" else "reference"
    assert all(f[backend] >= 1 for f in fused.values()) and fused, fused
    return got


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer", ["GATv2Conv", "GATConv", "TransformerConv", "GCNConv", "SAGEConv-mean",
                                   "SAGEConv-max", "SAGEConv-min"])
@pytest.mark.parametrize("bad", BAD)
def test_pyg(pyg, device, layer, bad):
    module = _pyg_layers()[layer]().to(device)
    edge_index = EDGES.to(device)
    call = lambda m, x: m(x, edge_index)  # noqa: E731
    x = _features(bad, device)
    want = _run(call, copy.deepcopy(module), x)
    _same(_fused(call, copy.deepcopy(module), x, device), want)


@pytest.mark.dgl
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layer", ["GATv2Conv", "GATConv", "GraphConv", "SAGEConv-pool", "SAGEConv-mean"])
@pytest.mark.parametrize("bad", BAD)
def test_dgl(dgl, device, layer, bad):
    g = dgl.add_self_loop(dgl.graph((EDGES[0], EDGES[1]), num_nodes=5))
    module = _dgl_layers()[layer]()
    call = lambda m, x: m(g, x)  # noqa: E731
    want = _run(call, copy.deepcopy(module), _features(bad))  # stock DGL on the CPU
    got = _fused(call, copy.deepcopy(module).to(device), _features(bad, device), device)
    _same(got, want)
