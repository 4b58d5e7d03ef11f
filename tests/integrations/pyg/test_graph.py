"""integrations/pyg/graph.py's self-loop graphs against PyG's own ``remove_self_loops`` +
``add_self_loops``: the looped graph's edges in PyG's order, and what ``Looped`` gives its
callers (the kept edges' rows, their targets), with and without loops in the base graph."""
from __future__ import annotations

import pytest
import torch

from gnn_fastpath.graph import Graph
from gnn_fastpath.integrations.pyg.graph import replace_self_loops


def _stock(edge_index, n, edge_attr):
    from torch_geometric.utils import add_self_loops, remove_self_loops

    kept, attr = remove_self_loops(edge_index, edge_attr)
    looped, _ = add_self_loops(kept, num_nodes=n)
    return looped, kept, attr


@pytest.mark.parametrize("loops", [0, 5])
@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "unsorted"])
def test_looped_graph_is_pygs(loops, grouped):
    g = torch.Generator().manual_seed(loops + 2 * grouped)
    n, m = 30, 120
    src, dst = torch.randint(0, n, (m,), generator=g), torch.randint(0, n, (m,), generator=g)
    src = torch.where(src == dst, (src + 1) % n, src)  # no loops yet
    src[:loops] = dst[:loops]
    edge_index = torch.stack([src, dst])
    if grouped:
        edge_index = edge_index[:, torch.sort(edge_index[1], stable=True).indices]
    edge_attr = torch.randn(m, 3, generator=g)
    looped = replace_self_loops(Graph.from_edge_index(edge_index, n), n)
    want, kept, attr = _stock(edge_index, n, edge_attr)

    got_src, got_dst = looped.graph.caller_coo()
    assert torch.equal(torch.stack([got_src, got_dst]), want)
    assert looped.n_kept == kept.size(1) == m - loops and looped.num_loops == n
    assert torch.equal(looped.kept(edge_attr), attr)
    assert torch.equal(looped.kept_dst, kept[1]) and looped.kept_dst_max == int(kept[1].max())
    assert torch.equal(looped.loop_pos, torch.arange(m)[edge_index[0] == edge_index[1]])
    assert torch.equal(looped.loop_node, edge_index[0, looped.loop_pos])
    if not loops:  # every edge stays in its order: the caller's rows as they are
        assert looped.keep is None and looped.kept(edge_attr) is edge_attr
