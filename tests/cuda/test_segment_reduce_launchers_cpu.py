"""Dry launches of the segment_reduce launchers on the CPU (see dry_launch.py): every path
reaches its kernels with matching arguments, and every instantiation compiles for sm_90,
for float32, float16 and bfloat16 features, with weights of the features' dtype and with
float32 weights (a float32 result of 16-bit features)."""
from __future__ import annotations

import pytest
import torch

from dry_launch import GRAPHS, graph, leaf
from gnn_fastpath.ops.segment_reduce import SegmentReduceFunction

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


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
    assert "sr_bwd_arg" in launches  # every rule scatters along the saved winner
    assert ("sr_bwd_ties" in launches) == (tie_break in ("split", "even"))  # split/even walk their ties
    with torch.no_grad():  # value only
        SegmentReduceFunction.apply(x, None, g, "max", tie_break, non_finite)
    assert x.grad.shape == x.shape and w.grad.shape == w.shape


@pytest.mark.parametrize("graph_name", ["plain", "bipartite_super"])
@pytest.mark.parametrize("F", [1, 3, 4, 64, 100, 512])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("w_dtype", ["same", torch.float32, None])
@pytest.mark.parametrize("tie_break,chunks", [("split", "1"), ("first", "2"), ("last", "4"), ("even", "4")])
def test_segment_reduce_launches_16bit(launches, monkeypatch, graph_name, F, dtype, w_dtype, tie_break, chunks):
    """16-bit x (8-wide rows, 4-wide and scalar), the result in x's dtype (weights of x's dtype
    or none) or float32 (float32 weights); gradients in the dtypes of x and w."""
    monkeypatch.setenv("GNN_FASTPATH_SR_CHUNKS", chunks)
    g = graph(*GRAPHS[graph_name])
    x = torch.randn(g.n_src, F, dtype=dtype).requires_grad_()
    w = None if w_dtype is None else torch.randn(g.num_edges, dtype=dtype if w_dtype == "same" else w_dtype)
    if w is not None:
        w.requires_grad_()
    out = SegmentReduceFunction.apply(x, w, g, "max", tie_break, "keep")
    assert out.dtype == (dtype if w is None else torch.promote_types(dtype, w.dtype))
    out.float().sum().backward()
    assert "sr_fwd_rows" in launches
    assert ("sr_fwd_chunks" in launches) == (graph_name != "plain")
    assert x.grad.dtype == dtype and x.grad.shape == x.shape
    if w is not None:
        assert w.grad.dtype == w.dtype and w.grad.shape == w.shape
