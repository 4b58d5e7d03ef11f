"""DGL layers under torch.compile with gnn_fastpath enabled. DGL's graph operations do not
trace (stock itself breaks the graph at ``torch._C._to_dlpack`` and ``Tensor.item()`` inside
DGL, several times per layer), so a shim runs its eager path at one graph break of its own:
fewer breaks than stock, stock's results and gradients, fused per call (``stats()``: ``fused``
per call, ``compiled``: ``eager`` per trace)."""
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


class _Model(torch.nn.Module):
    """The layer between two linear layers, so the compiled graphs around it are real."""

    def __init__(self, conv, width):
        super().__init__()
        self.a, self.conv, self.b = torch.nn.Linear(8, 8), conv, torch.nn.Linear(width, 3)

    def forward(self, g, x):
        return self.b(self.conv(g, self.a(x).relu()).flatten(1))


WIDTH = {"GATv2Conv": 8, "GATConv": 8, "GraphConv": 6, "SAGEConv": 6, "AGNNConv": 8, "GINConv": 6, "EdgeConv": 6}


@pytest.mark.parametrize("name", ["GATv2Conv", "GATConv", "GraphConv", "SAGEConv", "AGNNConv", "GINConv", "EdgeConv"])
def test_one_graph_break_fused_and_stock_results(dgl, h, name):
    g = h.homo(dgl, n=30, m=120)
    torch.manual_seed(0)
    model = _Model(layers()[name](), WIDTH[name])
    x = h.randn(30, 8)
    want = model(g, x)
    want_grads = torch.autograd.grad(want.square().sum(), list(model.parameters()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch._dynamo.reset()
        stock = torch._dynamo.explain(model)(g, x)
        torch._dynamo.reset()
        with h.fused():
            enabled = torch._dynamo.explain(model)(g, x)
            torch._dynamo.reset()
            gnn_fastpath.reset_stats()
            got = torch.compile(model, backend="aot_eager")(g, x)
            got_grads = torch.autograd.grad(got.square().sum(), list(model.parameters()))
            counts = gnn_fastpath.stats()[f"dgl.{name}"]
        torch._dynamo.reset()
    # DGL's own breaks (the reason for the eager region) against the shim's one
    assert stock.graph_break_count > 1, stock.break_reasons
    assert enabled.graph_break_count == 1, enabled.break_reasons
    h.assert_close(got, want, "compiled output")
    for gg, wg in zip(got_grads, want_grads):
        h.assert_close(gg, wg, "compiled gradient")
    # traced once or more as "eager", and the eager call itself ran the fused (reference) path
    assert set(counts["compiled"]) == {"eager"} and counts["compiled"]["eager"] > 0, counts
    assert counts["fused"]["reference"] == 1 and counts["fallback"] == {}, counts
