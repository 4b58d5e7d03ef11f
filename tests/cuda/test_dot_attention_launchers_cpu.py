"""Dry launches of the dot_attention launchers on the CPU (see dry_launch.py): every path
reaches its kernels with matching arguments, and every instantiation compiles for sm_90."""
from __future__ import annotations

import pytest

from dry_launch import GRAPHS, graph, leaf
from gnn_fastpath.ops.dot_attention import DotAttentionFunction

@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("H,D", [(4, 128), (2, 8), (3, 100), (1, 512)])
@pytest.mark.parametrize("variant", ["atomic", "transposed"])
def test_dot_attention_launches(launches, monkeypatch, graph_name, H, D, variant):
    monkeypatch.setenv("GNN_FASTPATH_DOT_BWD", variant)
    g = graph(*GRAPHS[graph_name])
    q, k, v, et = leaf(g.n_dst, H, D), leaf(g.n_src, H, D), leaf(g.n_src, H, D), leaf(g.num_edges, H, D)
    out, alpha = DotAttentionFunction.apply(q, k, v, et, g, 0.125, True, 0.1, 7, 9)
    (out.sum() + alpha.sum()).backward()
    assert {"dot_fwd", "dot_alpha_from_logits", "dot_delta_alpha", "dot_bwd_dst"} <= set(launches)
    assert ("dot_bwd_src" in launches) == (variant == "transposed")
    assert ("dot_fwd_merge" in launches) == (graph_name != "plain")
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and et.grad.shape == et.shape
