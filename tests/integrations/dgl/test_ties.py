"""The probe of DGL's tie rule (:mod:`gnn_fastpath.integrations.dgl.ties`).

Its answer on real DGL is checked against DGL's own gradients on random tied inputs in
``tests/reference/test_reference_ties.py`` and the shim tests; here: the classification, the
per-key cache, the CPU stand-in for devices DGL cannot run on, and the fallback when a build
follows neither rule.
"""
from __future__ import annotations

import pytest
import torch

import gnn_fastpath
from gnn_fastpath import FastpathFallbackWarning
from gnn_fastpath.integrations.dgl import ties


@pytest.fixture(autouse=True)
def _fresh_rules():
    ties.forget()
    yield
    ties.forget()


def _positions(rule):
    """Per probe destination, the edge position of its first/last in-edge (edge order)."""
    dst = ties.probe_edges()[1].tolist()
    pick = 0 if rule == "first" else -1
    return [[e for e, d in enumerate(dst) if d == row][pick] for row in range(4)]


def test_probe_graph_tells_edge_order_from_source_order():
    edge_index = ties.probe_edges()
    src, dst = edge_index
    first, last = _positions("first"), _positions("last")
    for rule_positions in (first, last):
        winners = src[rule_positions]
        per_dst = [src[dst == d] for d in range(4)]
        assert winners.tolist() != [int(s.min()) for s in per_dst]
        assert winners.tolist() != [int(s.max()) for s in per_dst]
    # the edges of the destinations interleave: edge order is not destination-sorted
    assert dst.tolist() != sorted(dst.tolist())


@pytest.mark.parametrize("rule", ["first", "last"])
def test_classify(rule):
    edge_index = ties.probe_edges()
    assert ties.classify(edge_index, _positions(rule)) == rule


def test_classify_rejects_mixed_and_source_rules():
    edge_index = ties.probe_edges()
    mixed = _positions("first")[:2] + _positions("last")[2:]
    assert ties.classify(edge_index, mixed) is None
    src, dst = edge_index
    by_min_source = [int(((dst == d) & (src == src[dst == d].min())).nonzero()[0]) for d in range(4)]
    assert ties.classify(edge_index, by_min_source) is None
    assert ties.classify(edge_index, [-1] * 4) is None  # several edges got the gradient


@pytest.mark.dgl
@pytest.mark.parametrize("message,broadcast", [("copy_u", False), ("u_mul_e", False), ("u_mul_e", True),
                                               ("copy_e", False)])
@pytest.mark.parametrize("reduce", ["max", "min"])
def test_real_dgl_follows_one_rule(dgl, message, broadcast, reduce):
    assert ties.tie_break(torch.device("cpu"), message, broadcast, reduce) in ("first", "last")


@pytest.mark.dgl
def test_measured_once_per_key(dgl, monkeypatch):
    seen = []
    monkeypatch.setattr(ties, "_observe", lambda *key: seen.append(key) or "last")
    cpu = torch.device("cpu")
    assert ties.tie_break(cpu, "copy_u") == "last"
    assert ties.tie_break(cpu, "copy_u") == "last"
    assert len(seen) == 1
    ties.tie_break(cpu, "u_mul_e", broadcast=True)
    assert len(seen) == 2
    # DGL's libxsmm switch is part of the key: flipping it measures again
    flipped = not ties._libxsmm_switch()
    monkeypatch.setattr(dgl, "is_libxsmm_enabled", lambda: flipped)
    ties.tie_break(cpu, "copy_u")
    assert len(seen) == 3


@pytest.mark.dgl
def test_device_dgl_cannot_run_on_takes_the_cpu_rule(dgl, monkeypatch):
    def observe(device, message, broadcast, reduce):
        if device.type != "cpu":
            raise RuntimeError("Device API cuda is not enabled")  # DGL's CPU-only build
        return "first"

    monkeypatch.setattr(ties, "_observe", observe)
    assert ties.tie_break(torch.device("cuda", 0), "copy_u") == "first"


@pytest.mark.dgl
def test_unknown_rule_falls_back_to_stock(dgl, monkeypatch):
    """A build that follows neither rule: the max layers run stock, with reason tie_rule."""
    from dgl.nn import GINConv

    monkeypatch.setattr(ties, "_observe", lambda *key: None)
    with pytest.raises(gnn_fastpath.integrations.shim.Unsupported, match="neither"):
        ties.tie_break(torch.device("cpu"), "copy_u")
    g = dgl.graph((torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])))
    conv = GINConv(torch.nn.Linear(3, 2), "max")
    x = torch.randn(3, 3)
    want = conv(g, x)
    with gnn_fastpath.enabled(frameworks="dgl", cpu="reference"), pytest.warns(FastpathFallbackWarning, match="neither"):
        got = conv(g, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert gnn_fastpath.stats()["dgl.GINConv"]["fallback"] == {"tie_rule": 1}


def test_rejects_unknown_message():
    with pytest.raises(ValueError, match="message"):
        ties.tie_break(torch.device("cpu"), "u_add_v")
