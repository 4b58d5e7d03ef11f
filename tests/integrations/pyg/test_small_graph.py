"""The small-graph rule (integrations/small_graph.py) as a PyG layer call meets it: below the
layer's crossover it runs stock (counted under ``small_graph``, no warning), from it on the
fused path; ``GNN_FASTPATH_SMALL_GRAPH=off`` runs fused at every size; the rule reads the edge
count off every graph input PyG takes without building anything.

On this CPU machine the rule is exercised with the CUDA decision stood in for (the rule applies
only where the fused path would run on the GPU) and the fused path on the reference ops.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import gnn_fastpath
from gnn_fastpath import FastpathFallbackWarning

from .conftest import make_graph

N, F_IN = 12, 6


@pytest.fixture
def as_if_cuda(monkeypatch, clean_fastpath):
    """The small-graph rule sees the call as one whose fused path would run on the GPU; the
    fused forward then runs on the reference ops (``enable(cpu="reference")``), counted as
    ``fused.reference``."""
    import gnn_fastpath.integrations.shim as shim_module

    monkeypatch.setattr(shim_module, "_fused_on_cuda", lambda x: True)
    gnn_fastpath.enable(frameworks="pyg", cpu="reference")


@pytest.fixture
def table(monkeypatch):
    """A table of the test's own (the suite runs with the rule off: tests/conftest.py)."""
    from gnn_fastpath.integrations import small_graph

    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "auto")

    rows = {("pyg.SAGEConv", "spmm"): (_graph(30)[1] + 1) * F_IN, ("pyg.SAGEConv", "segment_reduce"): 1_000 * F_IN,
            ("pyg.GCNConv", "cached"): 500 * F_IN}
    monkeypatch.setattr(small_graph, "MIN_EDGE_FEATURES", rows)
    return rows


def _sage(**kw):
    from torch_geometric.nn import SAGEConv

    torch.manual_seed(0)
    return SAGEConv(F_IN, 4, **kw)


def _graph(m):
    """An edge_index of about ``m`` edges (self loops added) and its exact count."""
    return make_graph("tensor", N, N, m)


def _run(module, m):
    edge_index, _ = _graph(m)
    x = torch.randn(N, F_IN)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastpathFallbackWarning)  # small_graph never warns
        out = module(x, edge_index)
    expected = torch.nn.Module.__call__(module, x, edge_index)  # the stock forward
    return out, expected


def test_below_the_crossover_stock_runs_counted_not_warned(as_if_cuda, table):
    out, expected = _run(_sage(), 30)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fallback"] == {"small_graph": 1}
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fused"]["reference"] == 0


def test_from_the_crossover_on_the_fused_path_runs(as_if_cuda, table):
    m = next(m for m in range(31, 100) if _graph(m)[1] * F_IN == table[("pyg.SAGEConv", "spmm")])
    out, expected = _run(_sage(), m)
    torch.testing.assert_close(out, expected)
    entry = gnn_fastpath.stats()["pyg.SAGEConv"]
    assert entry["fused"]["reference"] == 1 and entry["fallback"] == {}


def test_the_threshold_follows_the_op_and_the_module(as_if_cuda, table):
    # max runs on segment_reduce, whose row says 1000 edges of F_IN features
    _run(_sage(aggr="max"), 300)
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fallback"] == {"small_graph": 1}
    # GCNConv: a row for cached=True only; without it the layer runs fused at every size
    from torch_geometric.nn import GCNConv

    _run(GCNConv(F_IN, 4), 30)
    _run(GCNConv(F_IN, 4, cached=True), 30)
    entry = gnn_fastpath.stats()["pyg.GCNConv"]
    assert entry["fused"]["reference"] == 1 and entry["fallback"] == {"small_graph": 1}


def test_off_runs_fused_at_every_size(as_if_cuda, table, monkeypatch):
    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "off")
    _run(_sage(), 5)
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fused"]["reference"] == 1
    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "sometimes")
    with pytest.raises(ValueError, match="GNN_FASTPATH_SMALL_GRAPH"):
        _run(_sage(), 5)


def test_the_rule_is_for_the_gpu_only(table, clean_fastpath):
    """On the reference backend (CPU tensors, enable(cpu="reference")) there is no host-time
    trade to make: the shims run at every size (which is what the CPU tests rely on)."""
    gnn_fastpath.enable(frameworks="pyg", cpu="reference")
    _run(_sage(), 5)
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fused"]["reference"] == 1


@pytest.mark.parametrize("kind", ["tensor", "edge_index", "coo", "csr"])
def test_edge_count_of_every_graph_input(kind):
    from gnn_fastpath.integrations.pyg.layers import edges

    edge_index, _ = make_graph("tensor", N, N, 40)
    m = edge_index.size(1)
    if kind == "edge_index":
        from torch_geometric import EdgeIndex

        graph = EdgeIndex(edge_index, sparse_size=(N, N))
    elif kind in ("coo", "csr"):
        adj = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(m), (N, N)).coalesce()
        m = adj._nnz()  # duplicates merged
        graph = adj if kind == "coo" else adj.to_sparse_csr()
    else:
        graph = edge_index
    x = torch.randn(N, F_IN)
    assert edges(x, graph) == m
    assert edges(x, edge_index=graph) == m
    assert edges(x) is None and edges(x, "not a graph") is None


def test_the_threshold_counts_edge_features(as_if_cuda, table):
    """The same edges with twice the feature width cross the row's edge features."""
    from torch_geometric.nn import SAGEConv

    edge_index, m = _graph(30)
    assert m * F_IN < table[("pyg.SAGEConv", "spmm")] <= m * 2 * F_IN
    SAGEConv(2 * F_IN, 4)(torch.randn(N, 2 * F_IN), edge_index)
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fused"]["reference"] == 1


def test_every_row_names_a_patched_layer_and_a_variant():
    """A row whose key matches no layer call would silently never apply."""
    from gnn_fastpath.integrations import small_graph
    from gnn_fastpath.integrations.pyg.layers import SHIMS

    keys = {s.key for s in SHIMS}
    assert small_graph.largest("pyg.SAGEConv") == max(small_graph.MIN_EDGE_FEATURES[("pyg.SAGEConv", v)]
                                                      for v in ("spmm", "segment_reduce"))
    assert small_graph.largest("pyg.GATv2Conv") is None
    for layer, variant in small_graph.MIN_EDGE_FEATURES:
        assert layer in keys and variant in ("spmm", "segment_reduce", "cached"), (layer, variant)
    assert all(s.edges is not None for s in SHIMS if s.key in {k for k, _ in small_graph.MIN_EDGE_FEATURES})
