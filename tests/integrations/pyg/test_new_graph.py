"""``GNN_FASTPATH_NEW_GRAPH=static``: a new ``edge_index`` runs on the graph a compiled layer
builds (:func:`gnn_fastpath.integrations.pyg.graph.static_graph`), with stock's results.

On the CPU the shims run the reference ops (``cpu="reference"``), as in the other shim tests:
what is checked here is the route (which graph each call gets, when the exact one takes over,
which calls keep it) and that every layer gives stock's output and gradients on it. That the
route reads nothing back from the GPU is counted on the device
(``tests/integrations/test_sampled_syncs.py``).
"""
from __future__ import annotations

import pytest
import torch

import gnn_fastpath
from gnn_fastpath.graph import Graph, GraphTensors
from gnn_fastpath.integrations.pyg import graph as pyg_graph

from zoo import random_edges
from .conftest import compare, expect_fallback

N, F = 24, 8


@pytest.fixture
def built(monkeypatch):
    """The static route on (the small-graph rule off); returns the list of static graphs built."""
    monkeypatch.setenv("GNN_FASTPATH_NEW_GRAPH", "static")
    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "off")
    graphs = []
    build = pyg_graph.traced_graph

    def counted(*args, **kwargs):
        graphs.append(build(*args, **kwargs))
        return graphs[-1]

    monkeypatch.setattr(pyg_graph, "traced_graph", counted)
    return graphs


@pytest.fixture(scope="module")
def _edges():
    ei, _ = random_edges(N, N, 90, seed=5, empty_rows=3)
    return ei


@pytest.fixture
def edges(_edges):
    """Edges with self loops, duplicates and empty rows: a new object per test (the static
    graphs are cached per object)."""
    return _edges.clone()


def _layers(pyg):
    nn = pyg.nn
    return {
        "gatv2": lambda: nn.GATv2Conv(F, F, heads=2),
        "gatv2_edge_attr": lambda: nn.GATv2Conv(F, F, heads=2, edge_dim=3, fill_value=0.5),
        "gat": lambda: nn.GATConv(F, F, heads=2),
        "transformer": lambda: nn.TransformerConv(F, F, heads=2),
        "gcn": lambda: nn.GCNConv(F, F),
        "gcn_weighted": lambda: nn.GCNConv(F, F),
        "sage_max": lambda: nn.SAGEConv(F, F, aggr="max"),
        "sage_mean": lambda: nn.SAGEConv(F, F),
        "gin": lambda: nn.GINConv(torch.nn.Linear(F, F)),
        "graph_conv": lambda: nn.GraphConv(F, F),
        "agnn": lambda: nn.AGNNConv(),
        "edge_conv": lambda: nn.EdgeConv(torch.nn.Linear(2 * F, F)),
    }


LAYERS = ["gatv2", "gatv2_edge_attr", "gat", "transformer", "gcn", "gcn_weighted", "sage_max", "sage_mean", "gin",
          "graph_conv", "agnn", "edge_conv"]


@pytest.mark.parametrize("layer", LAYERS)
def test_a_new_edge_index_runs_on_the_static_graph_with_stocks_results(pyg, built, edges, layer):
    torch.manual_seed(0)
    module = _layers(pyg)[layer]()
    x = torch.randn(N, F, requires_grad=True)
    kwargs = {}
    if layer == "gatv2_edge_attr":
        kwargs["edge_attr"] = torch.randn(edges.size(1), 3, requires_grad=True)
    if layer == "gcn_weighted":
        kwargs["edge_weight"] = torch.rand(edges.size(1), requires_grad=True)
    compare(module, x, edges, **kwargs)
    assert built and all(isinstance(g, GraphTensors) for g in built)


def test_layers_of_a_step_share_one_static_graph(pyg, built, edges):
    convs = [pyg.nn.GATv2Conv(F, F) for _ in range(3)]
    x = torch.randn(N, F)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        for conv in convs:
            x = conv(x, edges)
    assert len(built) == 1


def test_the_exact_graph_takes_over_after_the_static_calls(pyg, built, edges):
    conv = pyg.nn.GCNConv(F, F)
    x = torch.randn(N, F)
    expected = conv(x, edges)
    exact = []
    of = Graph.of

    def counted(*args, **kwargs):
        exact.append(1)
        return of(*args, **kwargs)

    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Graph, "of", counted)
            outs = [conv(x, edges) for _ in range(pyg_graph.STATIC_CALLS + 2)]
    assert len(built) == 1
    assert len(exact) == 2  # the calls after STATIC_CALLS
    for out in outs:
        torch.testing.assert_close(out, expected)


def test_an_in_place_write_builds_the_graph_again(pyg, built, edges):
    conv = pyg.nn.SAGEConv(F, F, aggr="max")
    x = torch.randn(N, F)
    ei = edges
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        conv(x, ei)
        ei[0, :10] = (ei[0, :10] + 1) % N
        out = conv(x, ei)
    assert len(built) == 2
    torch.testing.assert_close(out, conv(x, ei))


def test_an_edge_index_object_builds_its_static_graph(pyg, built, edges):
    if pyg_graph.EdgeIndex is None:
        pytest.skip("this PyG has no EdgeIndex")
    ei = pyg_graph.EdgeIndex(edges, sparse_size=(N, N))
    compare(pyg.nn.GCNConv(F, F), torch.randn(N, F, requires_grad=True), ei)
    assert len(built) == 1


@pytest.mark.parametrize("layer", ["gatv2", "gat"])
def test_attention_weights_of_a_looped_layer_keep_the_exact_graph(pyg, built, edges, layer):
    """PyG returns them over its compacted looped edge list, which the static graph does not
    have: those calls take the exact graph, and the weights come in stock's order."""
    module = _layers(pyg)[layer]()
    compare(module, torch.randn(N, F, requires_grad=True), edges, return_attention_weights=True)
    assert not built


@pytest.mark.parametrize("layer", ["gatv2", "gat"])
def test_a_fill_reduction_into_the_loops_keeps_the_exact_graph(pyg, built, edges, layer):
    """Stock cannot reduce ``edge_attr`` into loops that a kept edge's target lies beyond; only
    the exact graph knows without a read-back, so such calls take it (and fall back there)."""
    cls = pyg.nn.GATv2Conv if layer == "gatv2" else pyg.nn.GATConv
    compare(cls(F, F, edge_dim=3, fill_value="mean"), torch.randn(N, F, requires_grad=True), edges,
            edge_attr=torch.randn(edges.size(1), 3, requires_grad=True))
    ei = torch.stack([torch.randint(0, 8, (40,)), torch.randint(0, 14, (40,))])
    ei[1, 0] = 13  # beyond min(N_src, N_dst) = 8 loops
    gnn_fastpath.reset_stats()
    expect_fallback(cls((F, F), F, edge_dim=2, fill_value="mean"), (torch.randn(8, F), torch.randn(14, F)), ei,
                    edge_attr=torch.randn(40, 2), reason="fill_value")
    assert not built


def test_transformer_attention_weights_come_from_the_static_graph(pyg, built, edges):
    """No self loops added: the caller's edge order is the weights' order on either graph."""
    compare(pyg.nn.TransformerConv(F, F, heads=2), torch.randn(N, F, requires_grad=True), edges,
            return_attention_weights=True)
    assert len(built) == 1


def test_a_cached_gcn_builds_its_cache_on_the_exact_graph(pyg, built, edges):
    _, fused, _ = compare(pyg.nn.GCNConv(F, F, cached=True), torch.randn(N, F, requires_grad=True), edges)
    assert not built
    assert fused._cached_edge_index is not None


def test_a_node_id_out_of_range_names_edge_index(pyg, built, edges):
    conv = pyg.nn.GCNConv(F, F)
    ei = edges
    ei[1, 0] = N
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        with pytest.raises(RuntimeError, match="edge_index holds a node id out of range"):
            conv(torch.randn(N, F), ei)


def test_the_default_builds_the_exact_graph(pyg, built, edges, monkeypatch):
    monkeypatch.delenv("GNN_FASTPATH_NEW_GRAPH")
    compare(pyg.nn.GATv2Conv(F, F), torch.randn(N, F, requires_grad=True), edges)
    assert not built


def test_a_dead_edge_index_takes_its_static_graph_with_it(pyg, built):
    """The cache holds the caller's tensor weakly: nothing built from it may keep it alive
    (a sampled step's graph would otherwise stay in memory until the cache evicts it)."""
    import gc
    import weakref

    from gnn_fastpath.graph import cache

    conv = pyg.nn.GATv2Conv(F, F)
    ei, _ = random_edges(N, N, 60, seed=9)
    alive = weakref.ref(ei)
    entries = lambda: len(cache._caches.get(pyg_graph._STATIC_CACHE + "cpu", ()))  # noqa: E731
    before = entries()
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        conv(torch.randn(N, F), ei).sum().backward()
    assert built
    del ei
    gc.collect()
    assert alive() is None
    assert entries() == before


def test_derived_graphs_are_built_once_per_step(pyg, built, edges, monkeypatch):
    """The layers of a step share the static graph and what is derived from it: the looped
    graph and the launchers' work lists are built by the first layer only."""
    looped, geometry = [], []
    traced_looped, with_geometry = pyg_graph._traced_looped, GraphTensors._with_geometry
    monkeypatch.setattr(pyg_graph, "_traced_looped", lambda *a, **k: looped.append(1) or traced_looped(*a, **k))
    monkeypatch.setattr(GraphTensors, "_with_geometry", lambda self, specs: geometry.append(1) or with_geometry(self, specs))
    convs = [pyg.nn.GCNConv(F, F) for _ in range(3)]
    x = torch.randn(N, F)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        for conv in convs:
            x = conv(x, edges)
    assert len(built) == 1 and len(looped) == 1 and len(geometry) == 1


@pytest.fixture
def cuda_decisions(monkeypatch):
    """The ops' dispatch answers "cuda" for CPU tensors, as on a GPU: the layers take the
    fused path's CUDA decisions (``require``, ``choose`` with the graph); the custom operators
    the static graph goes through still run their CPU implementation (the reference ops), so
    values stay checkable."""
    from gnn_fastpath import cuda
    from gnn_fastpath.ops import dispatch

    decide = dispatch.decide
    monkeypatch.setattr(cuda, "unavailable_reason", lambda: None)
    monkeypatch.setattr(dispatch, "decide", lambda device, *a, **k: decide(torch.device("cuda"), *a, **k))


@pytest.mark.parametrize("layer", LAYERS)
def test_the_static_route_on_the_cuda_decisions(pyg, built, edges, cuda_decisions, layer):
    torch.manual_seed(0)
    module = _layers(pyg)[layer]()
    x = torch.randn(N, F)
    kwargs = {}
    if layer == "gatv2_edge_attr":
        kwargs["edge_attr"] = torch.randn(edges.size(1), 3)
    if layer == "gcn_weighted":
        kwargs["edge_weight"] = torch.rand(edges.size(1))
    expected = module(x, edges, **kwargs)
    with gnn_fastpath.enabled(frameworks="pyg"):
        out = module(x, edges, **kwargs)
    [counts] = [v for k, v in gnn_fastpath.stats().items() if k.startswith("pyg.")]
    assert counts["fused"]["cuda"] == 1 and not counts["fallback"], counts
    assert len(built) == 1
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
