"""A feature pair on a graph with one node type: DGL's ``srcdata`` and ``dstdata`` are one frame
there, so stock SAGEConv("gcn"), EdgeConv and AGNNConv, which write one key on both sides,
read the destination features at the sources too. Those calls run stock (reason ``input``);
on a bipartite graph (two node types) the same pair runs fused and matches stock."""
import pytest
import torch

LAYERS = ["SAGEConv(gcn)", "EdgeConv", "AGNNConv"]


def _build(name, f=5):
    from dgl.nn import AGNNConv, EdgeConv, SAGEConv

    torch.manual_seed(0)
    return {"SAGEConv(gcn)": lambda: SAGEConv(f, 3, "gcn"), "EdgeConv": lambda: EdgeConv(f, 3),
            "AGNNConv": lambda: AGNNConv()}[name]()


def _key(name):
    return "dgl." + name.split("(")[0]


@pytest.mark.parametrize("name", LAYERS)
def test_pair_on_one_node_type_runs_stock(dgl, h, name):
    g = dgl.add_self_loop(h.homo(dgl, n=12, m=40))
    n = g.num_nodes()
    h.fallback_case(_build(name), g, (h.randn(n, 5, seed=1), h.randn(n, 5, seed=2)), "input", _key(name))


@pytest.mark.parametrize("name", LAYERS)
def test_pair_on_bipartite_graph_is_fused(dgl, h, name):
    g = h.bipartite(dgl, n_src=14, n_dst=9, m=50)
    g = dgl.add_edges(g, torch.arange(9), torch.arange(9))  # every destination has an in-edge
    h.compare(_build(name), g, (h.randn(14, 5, seed=1), h.randn(9, 5, seed=2)))
    assert h.fused_count(_key(name)) == 1
