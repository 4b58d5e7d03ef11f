"""gcn_norm_values (PyTorch path) against PyG's own gcn_norm."""
import pytest
import torch

from gnn_fastpath import Graph
from gnn_fastpath.config import force_reference
from gnn_fastpath.ops.gcn_norm import gcn_norm_values
from zoo import random_edges


def _pyg():
    pyg = pytest.importorskip("torch_geometric")
    from torch_geometric.nn.conv.gcn_conv import gcn_norm
    from torch_geometric.utils import add_remaining_self_loops

    return pyg, gcn_norm, add_remaining_self_loops


@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_pyg_gcn_norm(improved, weighted, seed):
    _, gcn_norm, add_remaining_self_loops = _pyg()
    n = 50
    edge_index, _ = random_edges(n, n, 400, seed=seed, self_loops=False, empty_rows=4)
    gen = torch.Generator().manual_seed(seed)
    w = torch.rand(edge_index.size(1), generator=gen, dtype=torch.float64) + 0.1 if weighted else None
    want_index, want = gcn_norm(edge_index, w, n, improved=improved, add_self_loops=True, dtype=torch.float64)
    fill = 2.0 if improved else 1.0
    looped, looped_w = add_remaining_self_loops(edge_index, w, fill, n)
    assert torch.equal(looped, want_index)
    graph = Graph.from_edge_index(looped, n)
    # PyG's edge_index path ignores `improved` without edge weights (all weights 1)
    got = gcn_norm_values(graph, looped_w, improved=improved and weighted, dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_existing_loops_keep_their_weight():
    """add_remaining_self_loops keeps an input loop's own weight; new loops get the fill."""
    _, gcn_norm, add_remaining_self_loops = _pyg()
    n = 30
    edge_index, _ = random_edges(n, n, 200, seed=5, self_loops=True)
    w = torch.rand(edge_index.size(1), dtype=torch.float64) + 0.5
    _, want = gcn_norm(edge_index, w, n, improved=True, add_self_loops=True, dtype=torch.float64)
    looped, looped_w = add_remaining_self_loops(edge_index, w, 2.0, n)
    got = gcn_norm_values(Graph.from_edge_index(looped, n), looped_w, improved=True)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_improved_without_weights_fills_loops_with_two():
    n = 20
    edge_index, _ = random_edges(n, n, 100, seed=6, self_loops=False)
    edge_index = edge_index[:, edge_index[0] != edge_index[1]]
    loops = torch.arange(n).repeat(2, 1)
    looped = torch.cat([edge_index, loops], 1)
    w = torch.cat([torch.ones(edge_index.size(1), dtype=torch.float64), torch.full((n,), 2.0, dtype=torch.float64)])
    graph = Graph.from_edge_index(looped, n)
    torch.testing.assert_close(gcn_norm_values(graph, None, improved=True, dtype=torch.float64),
                               gcn_norm_values(graph, w), rtol=1e-12, atol=1e-12)


def test_gradient_matches_pyg():
    _, gcn_norm, add_remaining_self_loops = _pyg()
    n = 40
    edge_index, _ = random_edges(n, n, 300, seed=2, self_loops=False)
    w0 = torch.rand(edge_index.size(1), dtype=torch.float64) + 0.1
    looped, looped_w0 = add_remaining_self_loops(edge_index, w0, 1.0, n)
    g = torch.randn(looped.size(1), dtype=torch.float64)
    a = looped_w0.clone().requires_grad_(True)
    from torch_geometric.nn.conv.gcn_conv import gcn_norm as pyg_norm

    (pyg_norm(looped, a, n, add_self_loops=False)[1] * g).sum().backward()
    b = looped_w0.clone().requires_grad_(True)
    with force_reference():
        (gcn_norm_values(Graph.from_edge_index(looped, n), b) * g).sum().backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=1e-10, atol=1e-12)


def test_rejects_bipartite():
    edge_index, _ = random_edges(5, 7, 20)
    with pytest.raises(ValueError, match="homogeneous"):
        gcn_norm_values(Graph.from_edge_index(edge_index, (5, 7)))
