"""PyG GATv2Conv: stock vs gnn_fastpath (reference ops on the CPU).

The checks GATv2Conv shares with GATConv are in test_gat_family.py; these are GATv2Conv's own."""
from __future__ import annotations

import itertools

import pytest

from .conftest import make_graph
from .gat_common import make_conv, make_x

MODULE_GRID = list(itertools.product([1, 2], [True, False], [True, False], [True, False], [True, False],
                                     [True, False]))


@pytest.mark.parametrize("heads,concat,share_weights,residual,bias,add_self_loops", MODULE_GRID)
def test_module_arguments(check, heads, concat, share_weights, residual, bias, add_self_loops):
    conv = make_conv("GATv2Conv", heads=heads, concat=concat, share_weights=share_weights, residual=residual,
                     bias=bias, add_self_loops=add_self_loops, negative_slope=0.1 if heads == 2 else 0.2)
    assert (conv.lin_r is conv.lin_l) == share_weights
    edge_index, _ = make_graph("tensor", 20, 20, 50, seed=heads)
    rw = [None, True][(concat + residual + bias) % 2]
    check.compare(conv, make_x(20), edge_index, return_attention_weights=rw)
