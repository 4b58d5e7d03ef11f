"""DGL GATConv under gnn_fastpath.enable(): what only GATConv has (its edge_weight, its single
``fc`` for a feature pair). The checks it shares with GATv2Conv are in test_gat_family.py."""
from __future__ import annotations

import pytest
import torch

from .gat_common import build

pytestmark = pytest.mark.dgl

KEY = "dgl.GATConv"


def _build(dgl, pair, heads, **kwargs):
    return build(dgl, "GATConv", pair, heads, **kwargs)


@pytest.mark.parametrize("kind", ["bipartite_pair", "create_block_pair"])
@pytest.mark.parametrize("residual", [False, True])
def test_pair_with_one_projection(dgl, h, kind, residual):
    """A module built with in_feats=int given a (feat_src, feat_dst) pair: ``fc`` projects both."""
    make, _ = h.KINDS[kind]
    g = make(dgl)
    conv = _build(dgl, False, 2, residual=residual)
    assert hasattr(conv, "fc") and not hasattr(conv, "fc_src")
    feat = h.features(g, (6, 6), True)
    h.compare(conv, g, feat, dict(get_attention=True, edge_weight=h.randn(g.num_edges(), seed=3)))
    assert h.fused_count(KEY) == 1


def test_edge_weight_is_in_the_returned_attention(dgl, h):
    """Stock returns ``a * edge_weight`` (its graph.edata['a'] is reassigned): so does the fused path."""
    g = h.homo(dgl, empty_rows=2)
    conv = _build(dgl, False, 2).eval()
    feat = h.features(g, 6, False)
    w = h.randn(g.num_edges(), seed=4)
    with h.fused():
        _, plain = conv(g, feat, get_attention=True)
        _, weighted = conv(g, feat, edge_weight=w, get_attention=True)
    assert h.fused_count(KEY) == 2
    torch.testing.assert_close(weighted, plain * w.view(-1, 1, 1))


# --------------------------------------------------------------------------- fallbacks
def test_fallback_features_with_extra_dimensions(dgl, h):
    """Stock takes (N, *, F) features; the fused path takes 2-D ones."""
    g = h.homo(dgl)
    conv = _build(dgl, False, 2)
    h.fallback_case(conv, g, h.randn(g.num_nodes(), 3, 6), "input", KEY)


def test_fallback_single_feature_for_pair_module(dgl, h):
    """A module built with (src, dst) in_feats has no ``fc``: stock raises AttributeError."""
    g = h.homo(dgl)
    conv = _build(dgl, True, 2)
    h.fallback_case(conv, g, h.features(g, 7, False), "input", KEY, expect_error=AttributeError)


@pytest.mark.parametrize("case", ["column", "float64"])
def test_fallback_edge_weight(dgl, h, case):
    g = h.homo(dgl)
    conv = _build(dgl, False, 2)
    if case == "column":  # stock's tile/transpose does not broadcast against [E, H, 1]
        kwargs, reason, error = dict(edge_weight=h.randn(g.num_edges(), 1)), "edge_weight", RuntimeError
    else:
        kwargs, reason = dict(edge_weight=h.randn(g.num_edges(), dtype=torch.float64)), "dtype"
        error = dgl.DGLError  # stock: a float64 weight promotes the attention, gspmm refuses the mix
    h.fallback_case(conv, g, h.features(g, 6, False), reason, KEY, kwargs=kwargs, expect_error=error)
