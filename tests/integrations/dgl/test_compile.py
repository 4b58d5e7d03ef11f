"""DGL layers under torch.compile with gnn_fastpath enabled: DGL's graph operations do not
trace (stock itself breaks the graph at ``torch._C._to_dlpack`` and ``Tensor.item()`` inside
DGL), so the shims step aside there. They must add no graph break of their own, give stock's
results, and say why in ``stats()`` (``compiled``: ``fallback:compile``)."""
from __future__ import annotations

import warnings

import pytest
import torch

import gnn_fastpath

pytestmark = pytest.mark.dgl


def layers():
    from dgl.nn import AGNNConv, EdgeConv, GATConv, GATv2Conv, GINConv, GraphConv, SAGEConv

    return {
        "GATv2Conv": lambda: GATv2Conv(8, 4, num_heads=2, allow_zero_in_degree=True),
        "GATConv": lambda: GATConv(8, 4, num_heads=2, allow_zero_in_degree=True),
        "GraphConv": lambda: GraphConv(8, 6, allow_zero_in_degree=True),
        "SAGEConv": lambda: SAGEConv(8, 6, "mean"),
        "AGNNConv": lambda: AGNNConv(allow_zero_in_degree=True),
        "GINConv": lambda: GINConv(torch.nn.Linear(8, 6), "sum"),
        "EdgeConv": lambda: EdgeConv(8, 6, allow_zero_in_degree=True),
    }


@pytest.mark.parametrize("name", ["GATv2Conv", "GATConv", "GraphConv", "SAGEConv", "AGNNConv", "GINConv", "EdgeConv"])
def test_no_graph_break_of_its_own_and_stock_results(dgl, h, name):
    g = h.homo(dgl, n=30, m=120)
    torch.manual_seed(0)
    conv = layers()[name]()
    x = h.randn(30, 8)

    def f(x):
        return conv(g, x)

    want = f(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch._dynamo.reset()
        stock = torch._dynamo.explain(f)(x)
        torch._dynamo.reset()
        with h.fused():
            gnn_fastpath.reset_stats()
            enabled = torch._dynamo.explain(f)(x)
            torch._dynamo.reset()
            got = torch.compile(f, backend="eager")(x)
            counts = gnn_fastpath.stats()[f"dgl.{name}"]
        torch._dynamo.reset()
    assert stock.graph_break_count > 0  # DGL's own: the reason the shims step aside
    assert (enabled.graph_count, enabled.graph_break_count) == (stock.graph_count, stock.graph_break_count)
    h.assert_close(got, want, "compiled output")
    # every traced call stepped aside with the reason (counted per traced graph), none ran fused
    assert set(counts["compiled"]) == {"fallback:compile"} and counts["compiled"]["fallback:compile"] > 0, counts
    assert counts["fused"] == {"cuda": 0, "reference": 0} and counts["fallback"] == {}, counts
