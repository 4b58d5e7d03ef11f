"""The fallbacks every PyG shim shares (integrations/shim.py), for each patched layer.

Each case runs stock under enable(): identical to stock, one warning, every call counted.
Layer-specific fallbacks (arguments, subclasses, lazy parameters) live in each layer's file.
"""
from __future__ import annotations

import pytest
import torch

from .conftest import make_graph

F_IN = 6
N = 12


#: Each patched layer (its torch_geometric.nn name) and the constructor arguments it runs with.
LAYERS = {"GATv2Conv": {}, "GATConv": {}, "TransformerConv": {}, "GCNConv": {}, "SAGEConv": dict(aggr="max")}


def _layer(name, **kw):
    import torch_geometric.nn

    return getattr(torch_geometric.nn, name)(F_IN, 4, **LAYERS[name], **kw)


HOOKS = ["forward", "forward_pre", "propagate_forward_pre", "propagate_forward", "message_forward",
         "aggregate_forward_pre", "aggregate_forward", "edge_update_forward_pre", "edge_update_forward"]


def _inputs(dtype=torch.float32):
    edge_index, _ = make_graph("tensor", N, N, 30)
    return torch.randn(N, F_IN, dtype=dtype), edge_index


@pytest.mark.parametrize("layer", list(LAYERS))
def test_fallback_cpu_stock(check, layer):
    check.fallback(_layer(layer), *_inputs(), reason="cpu", cpu="stock")


@pytest.mark.parametrize("layer", list(LAYERS))
def test_fallback_float64(check, layer):
    check.fallback(_layer(layer).double(), *_inputs(torch.float64), reason="dtype")


@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("layer", list(LAYERS))
def test_fallback_hooks(check, layer, hook):
    conv = _layer(layer)
    getattr(conv, f"register_{hook}_hook")(lambda *args: None)
    check.fallback(conv, *_inputs(), reason="hooks")


@pytest.mark.parametrize("layer", list(LAYERS))
def test_fallback_explain(check, layer):
    from torch_geometric.explain.algorithm.utils import set_masks

    conv = _layer(layer)
    x, edge_index = _inputs()
    set_masks(conv, torch.randn(edge_index.size(1)), edge_index, apply_sigmoid=True)
    check.fallback(conv, x, edge_index, reason="explain")


@pytest.mark.parametrize("layer", list(LAYERS))
def test_fallback_decomposed_layers(check, layer):
    check.fallback(_layer(layer, decomposed_layers=2), *_inputs(), reason="decomposed_layers")


@pytest.mark.parametrize("layer", list(LAYERS))
def test_fallback_when_an_op_cannot_run_fused(check, layer, monkeypatch):
    """An op that learns only from the graph that it cannot run fused (the int32 limit)
    sends the layer to its stock code, counted under that reason and warned once: stats()
    reports what ran, not what the layer hoped for."""
    from gnn_fastpath.ops import dispatch

    real = dispatch.decide

    def decide(device, dtype, graph=None, limit=None):
        if graph is not None:  # the op's own decision, once it knows the graph
            return dispatch.Decision(dispatch.REFERENCE, "int32", "simulated graph of 2**31 edges")
        return real(device, dtype, graph, limit)

    monkeypatch.setattr(dispatch, "decide", decide)
    conv = _layer(layer)
    calls = []
    for sub in conv.modules():  # every submodule (the projections) runs once per call: stock's
        if sub is not conv:
            sub.register_forward_hook(lambda *args: calls.append(1))
    conv(*_inputs())  # one stock call (not enabled)
    per_call = len(calls)
    calls.clear()
    check.fallback(conv, *_inputs(), reason="int32")  # 2 stock calls + 2 enabled calls (hooks deep-copied)
    assert per_call > 0 and len(calls) == 4 * per_call  # the fused attempt ran no submodule before falling back


@pytest.mark.cuda
@pytest.mark.parametrize("layer", list(LAYERS))
def test_int32_limit_falls_back_on_cuda(layer, monkeypatch):
    """On the GPU, a graph too large for int32 kernels runs stock with reason ``int32``."""
    import copy
    import warnings

    import gnn_fastpath
    from gnn_fastpath import FastpathFallbackWarning, Graph

    monkeypatch.setattr(Graph, "fits_int32", lambda self: False)
    conv = _layer(layer).cuda()
    x, edge_index = (t.cuda() for t in _inputs())
    expected = copy.deepcopy(conv)(x, edge_index)
    gnn_fastpath.reset_stats()
    with warnings.catch_warnings(record=True) as caught, gnn_fastpath.enabled(frameworks="pyg"):
        warnings.simplefilter("always")
        out = conv(x, edge_index)
    counts = gnn_fastpath.stats()[f"pyg.{layer}"]
    assert counts["fallback"] == {"int32": 1} and counts["fused"] == {"cuda": 0, "reference": 0}, counts
    assert any(issubclass(w.category, FastpathFallbackWarning) and "(int32" in str(w.message) for w in caught)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
