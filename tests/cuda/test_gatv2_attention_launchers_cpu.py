"""Dry launches of the gatv2_attention launchers on the CPU (see dry_launch.py): every path
reaches its kernels with matching arguments, and every instantiation compiles for sm_90."""
from __future__ import annotations

import pytest

from dry_launch import GRAPHS, graph, leaf
from gnn_fastpath.ops.gatv2_attention import GATv2AttentionFunction

@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("H,D", [(2, 64), (3, 100), (1, 256)])
@pytest.mark.parametrize("variant", ["atomic", "transposed"])
def test_gatv2_attention_launches(launches, monkeypatch, graph_name, H, D, variant):
    monkeypatch.setenv("GNN_FASTPATH_GATV2_BWD", variant)
    g = graph(*GRAPHS[graph_name])
    xs, xd, att, et = leaf(g.n_src, H, D), leaf(g.n_dst, H, D), leaf(H, D), leaf(g.num_edges, H, D)
    out, alpha = GATv2AttentionFunction.apply(xs, xd, att, et, g, 0.2, "dropped", 0.1, 7, 9)
    (out.sum() + alpha.sum()).backward()
    assert {"gatv2_fwd", "gatv2_alpha_from_logits", "gatv2_delta_alpha", "gatv2_bwd_dst"} <= set(launches)
    assert ("gatv2_bwd_src" in launches) == (variant == "transposed")
    assert ("gatv2_fwd_merge" in launches) == (graph_name != "plain")
    assert xs.grad.shape == xs.shape and et.grad.shape == et.shape and att.grad.shape == att.shape
