"""NaN and infinity in min/max aggregation: each framework's own rule, value and gradient.

torch/PyG (``non_finite="keep"``): ``scatter_reduce(amax/amin, include_self=False)`` itself.
DGL 2.1 (``non_finite="drop"``): ``update_all(copy_u / u_mul_e, fn.max / fn.min)`` on the CPU.
The reference op is compared with each, NaN positions included (equal_nan); the GPU kernels
are compared with the reference in tests/cuda/test_segment_reduce_kernels.py.
"""
from __future__ import annotations

import pytest
import torch

from gnn_fastpath import Graph, reference, segment_reduce

NAN, INF = float("nan"), float("inf")
# dst 0 <- 0, 1; dst 1 <- 1, 2; dst 2 <- 0; dst 3 <- 3; dst 4 has no in-edge; dst 5 <- 4, 2, 4
SRC = torch.tensor([0, 1, 1, 2, 0, 3, 4, 2, 4])
DST = torch.tensor([0, 0, 1, 1, 2, 3, 5, 5, 5])
X = torch.tensor([[NAN, 1.0, -2.0], [2.0, NAN, INF], [3.0, 4.0, -INF], [NAN, NAN, NAN], [5.0, -INF, 1.0],
                  [0.5, 0.5, 0.5]])


def _graph():
    return Graph.from_edge_index(torch.stack([SRC, DST]), 6)


def _weights():
    return torch.tensor([1.0, NAN, 2.0, 1.0, INF, 1.0, -1.0, 1.0, 0.5])


@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("weighted", [False, True])
def test_keep_is_torch_scatter_reduce(reduce, weighted):
    x = X.clone().requires_grad_()
    w = _weights().requires_grad_() if weighted else None
    msg = x[SRC] * w.view(-1, 1) if weighted else x[SRC]
    want = torch.zeros(6, 3).scatter_reduce(0, DST.view(-1, 1).expand(-1, 3), msg, "a" + reduce,
                                            include_self=False)
    g_want = torch.autograd.grad(want.sum(), [x] + ([w] if weighted else []))
    x2 = X.clone().requires_grad_()
    w2 = _weights().requires_grad_() if weighted else None
    got = segment_reduce(_graph(), x2, reduce, w2, tie_break="split", non_finite="keep")
    g_got = torch.autograd.grad(got.sum(), [x2] + ([w2] if weighted else []))
    torch.testing.assert_close(got, want, equal_nan=True)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, equal_nan=True)


def _dgl_reduce(dgl, x, w, reduce):
    import dgl.function as fn

    g = dgl.graph((SRC, DST), num_nodes=6)
    g.srcdata["h"] = x
    red = fn.max if reduce == "max" else fn.min
    if w is None:
        g.update_all(fn.copy_u("h", "m"), red("m", "o"))
    else:
        g.edata["w"] = w.view(-1, 1)
        g.update_all(fn.u_mul_e("h", "w", "m"), red("m", "o"))
    return g.dstdata["o"]


@pytest.mark.dgl
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("weighted", [False, True])
def test_drop_is_dgl(dgl, reduce, weighted):
    """DGL: NaN messages never win; a non-finite extreme is 0 and sends no gradient; the
    tie rule is the one the running DGL build follows (probed: the first or the last edge).
    Gradients equal DGL's wherever DGL's are finite (see below for where they are not)."""
    x = X.clone().requires_grad_()
    w = _weights().requires_grad_() if weighted else None
    want = _dgl_reduce(dgl, x, w, reduce)
    g_want = torch.autograd.grad(want.sum(), [x] + ([w] if weighted else []))
    x2 = X.clone().requires_grad_()
    w2 = _weights().requires_grad_() if weighted else None
    from gnn_fastpath.integrations.dgl.ties import tie_break

    tie = tie_break(torch.device("cpu"), "u_mul_e" if weighted else "copy_u", broadcast=weighted, reduce=reduce)
    got = segment_reduce(_graph(), x2, reduce, w2, tie_break=tie, non_finite="drop")
    g_got = torch.autograd.grad(got.sum(), [x2] + ([w2] if weighted else []))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want)
    for a, b in zip(g_got, g_want):
        b = b.view(a.shape)
        # Ours flows only through winning (edge, feature) pairs and stays finite; DGL's dense
        # backward also multiplies losers' zeros by their NaN/inf (0 * inf = NaN) there.
        assert torch.isfinite(a).all()
        finite = torch.isfinite(b)
        torch.testing.assert_close(a[finite], b[finite])


@pytest.mark.parametrize("tie_break", ["even", "first", "last"])
def test_keep_with_one_edge_rules_sends_no_gradient_from_nan_extremes(tie_break):
    x = X.clone().requires_grad_()
    out = reference.segment_reduce(_graph(), x, "max", None, tie_break, "keep")
    out.sum().backward()
    assert torch.isnan(out[0, 0]) and torch.isinf(out[1, 2])  # NaN wins; +inf is a value
    assert torch.isfinite(x.grad).all()  # no NaN from the straight-through of infinite messages
    assert x.grad[2, 2] == 0 and x.grad[1, 2] == 2  # the +inf winner of dst 0 and dst 1 gets both gradients


def test_drop_needs_a_one_edge_tie_rule():
    with pytest.raises(ValueError, match="non_finite='drop'"):
        segment_reduce(_graph(), X, "max", tie_break="split", non_finite="drop")
    with pytest.raises(ValueError, match="non_finite must be one of"):
        segment_reduce(_graph(), X, "max", non_finite="ignore")
