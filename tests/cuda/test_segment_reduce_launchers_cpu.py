"""Dry launches of the segment_reduce launchers on the CPU (see dry_launch.py): every path
reaches its kernels with matching arguments, and every instantiation compiles for sm_90."""
from __future__ import annotations

import pytest
import torch

from dry_launch import GRAPHS, graph, leaf
from gnn_fastpath.ops.segment_reduce import SegmentReduceFunction

@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("F", [1, 3, 64, 100, 512])
@pytest.mark.parametrize("tie_break,non_finite", [("split", "keep"), ("even", "keep"), ("first", "keep"),
                                                  ("last", "keep"), ("first", "drop"), ("last", "drop")])
@pytest.mark.parametrize("chunks", ["1", "2", "4"])
def test_segment_reduce_launches(launches, monkeypatch, graph_name, F, tie_break, non_finite, chunks):
    monkeypatch.setenv("GNN_FASTPATH_SR_CHUNKS", chunks)
    g = graph(*GRAPHS[graph_name])
    x, w = leaf(g.n_src, F), leaf(g.num_edges)
    SegmentReduceFunction.apply(x, w, g, "min", tie_break, non_finite).sum().backward()
    assert "sr_fwd_rows" in launches
    assert ("sr_fwd_chunks" in launches) == ("sr_fwd_unpack" in launches) == (graph_name != "plain")
    assert ("sr_bwd_ties" if tie_break in ("split", "even") else "sr_bwd_arg") in launches
    with torch.no_grad():  # value only
        SegmentReduceFunction.apply(x, None, g, "max", tie_break, non_finite)
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
