"""The small-graph rule (integrations/small_graph.py) as a PyG layer call meets it: below the
layer's crossover it runs stock (counted under ``small_graph``, no warning), from it on the
fused path; ``GNN_FASTPATH_SMALL_GRAPH=off`` runs fused at every size; the rule reads the edge
count off every graph input PyG takes without building anything.

Under torch.compile without CUDA graphs the compiled entries send a traced call to stock
(``fallback:compiled_stock_faster``); with CUDA graphs the fused path is traced.

On this CPU machine the rule is exercised with the CUDA decision stood in for (the rule applies
only where the fused path would run on the GPU) and the fused path on the reference ops.
"""
from __future__ import annotations

import warnings
from collections import OrderedDict

import pytest
import torch

import gnn_fastpath
from gnn_fastpath import FastpathFallbackWarning

from .conftest import make_graph

N, F_IN = 12, 6


@pytest.fixture
def as_if_cuda(monkeypatch, clean_fastpath):
    """The small-graph rule sees the call as one whose fused path would run on the GPU; the
    fused forward then runs on the reference ops (``enable(cpu="reference")``), counted as
    ``fused.reference``."""
    import gnn_fastpath.integrations.shim as shim_module

    monkeypatch.setattr(shim_module, "_fused_on_cuda", lambda x: True)
    gnn_fastpath.enable(frameworks="pyg", cpu="reference")


@pytest.fixture
def table(monkeypatch):
    """A table of the test's own (the suite runs with the rule off: tests/conftest.py)."""
    from gnn_fastpath.integrations import small_graph

    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "auto")

    rows = {("pyg.SAGEConv", "spmm"): (_graph(30)[1] + 1) * F_IN, ("pyg.SAGEConv", "segment_reduce"): 1_000 * F_IN,
            ("pyg.GCNConv", "cached"): 500 * F_IN}
    monkeypatch.setattr(small_graph, "MIN_EDGE_FEATURES", rows)
    monkeypatch.setattr(small_graph, "NEW_GRAPH_MIN_EDGE_FEATURES", {})
    return rows


def _sage(**kw):
    from torch_geometric.nn import SAGEConv

    torch.manual_seed(0)
    return SAGEConv(F_IN, 4, **kw)


def _graph(m):
    """An edge_index of about ``m`` edges (self loops added) and its exact count."""
    return make_graph("tensor", N, N, m)


def _run(module, m):
    return _run_on(module, _graph(m)[0])


def _run_on(module, edge_index):
    """(the patched call's output, the stock forward's) on ``edge_index``."""
    x = torch.randn(N, F_IN)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastpathFallbackWarning)  # small_graph never warns
        out = module(x, edge_index)
    return out, torch.nn.Module.__call__(module, x, edge_index)


def test_below_the_crossover_stock_runs_counted_not_warned(as_if_cuda, table):
    out, expected = _run(_sage(), 30)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fallback"] == {"small_graph": 1}
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fused"]["reference"] == 0


def test_from_the_crossover_on_the_fused_path_runs(as_if_cuda, table):
    m = next(m for m in range(31, 100) if _graph(m)[1] * F_IN == table[("pyg.SAGEConv", "spmm")])
    out, expected = _run(_sage(), m)
    torch.testing.assert_close(out, expected)
    entry = gnn_fastpath.stats()["pyg.SAGEConv"]
    assert entry["fused"]["reference"] == 1 and entry["fallback"] == {}


def test_the_threshold_follows_the_op_and_the_module(as_if_cuda, table):
    # max runs on segment_reduce, whose row says 1000 edges of F_IN features
    _run(_sage(aggr="max"), 300)
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fallback"] == {"small_graph": 1}
    # GCNConv: a row for cached=True only; without it the layer runs fused at every size
    from torch_geometric.nn import GCNConv

    _run(GCNConv(F_IN, 4), 30)
    _run(GCNConv(F_IN, 4, cached=True), 30)
    entry = gnn_fastpath.stats()["pyg.GCNConv"]
    assert entry["fused"]["reference"] == 1 and entry["fallback"] == {"small_graph": 1}


def test_off_runs_fused_at_every_size(as_if_cuda, table, monkeypatch):
    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "off")
    _run(_sage(), 5)
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fused"]["reference"] == 1
    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "sometimes")
    with pytest.raises(ValueError, match="GNN_FASTPATH_SMALL_GRAPH"):
        _run(_sage(), 5)


def test_the_rule_is_for_the_gpu_only(table, clean_fastpath):
    """On the reference backend (CPU tensors, enable(cpu="reference")) there is no host-time
    trade to make: the shims run at every size (which is what the CPU tests rely on)."""
    gnn_fastpath.enable(frameworks="pyg", cpu="reference")
    _run(_sage(), 5)
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fused"]["reference"] == 1


@pytest.mark.parametrize("kind", ["tensor", "edge_index", "coo", "csr"])
def test_edge_count_of_every_graph_input(kind):
    from gnn_fastpath.integrations.pyg.layers import edges

    edge_index, _ = make_graph("tensor", N, N, 40)
    m = edge_index.size(1)
    if kind == "edge_index":
        from torch_geometric import EdgeIndex

        graph = EdgeIndex(edge_index, sparse_size=(N, N))
    elif kind in ("coo", "csr"):
        adj = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(m), (N, N)).coalesce()
        m = adj._nnz()  # duplicates merged
        graph = adj if kind == "coo" else adj.to_sparse_csr()
    else:
        graph = edge_index
    x = torch.randn(N, F_IN)
    assert edges(x, graph)[0] == m and edges(x, graph)[1] is graph
    assert edges(x, edge_index=graph)[0] == m
    assert edges(x) is None and edges(x, "not a graph") is None


def test_the_threshold_counts_edge_features(as_if_cuda, table):
    """The same edges with twice the feature width cross the row's edge features."""
    from torch_geometric.nn import SAGEConv

    edge_index, m = _graph(30)
    assert m * F_IN < table[("pyg.SAGEConv", "spmm")] <= m * 2 * F_IN
    SAGEConv(2 * F_IN, 4)(torch.randn(N, 2 * F_IN), edge_index)
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fused"]["reference"] == 1


def test_every_row_names_a_patched_layer_and_a_variant():
    """A row whose key matches no layer call would silently never apply."""
    from gnn_fastpath.integrations import small_graph
    from gnn_fastpath.integrations.pyg.layers import SHIMS

    keys = {s.key for s in SHIMS}
    assert small_graph.largest("pyg.SAGEConv") == max(small_graph.MIN_EDGE_FEATURES[("pyg.SAGEConv", v)]
                                                      for v in ("spmm", "segment_reduce"))
    assert small_graph.largest("pyg.GATv2Conv") is None
    for layer, variant in [*small_graph.MIN_EDGE_FEATURES, *small_graph.NEW_GRAPH_MIN_EDGE_FEATURES,
                           *small_graph.COMPILED_MIN_EDGE_FEATURES]:
        assert layer in keys and variant in ("spmm", "segment_reduce", "cached"), (layer, variant)
    ruled = {k for k, _ in [*small_graph.MIN_EDGE_FEATURES, *small_graph.COMPILED_MIN_EDGE_FEATURES]}
    assert all(s.edges is not None for s in SHIMS if s.key in ruled)


@pytest.fixture
def new_graph_table(monkeypatch):
    """GCNConv with a static entry of 10 edges and a new-graph entry of 1000 (x F_IN)."""
    from gnn_fastpath.integrations import small_graph

    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "auto")
    monkeypatch.setattr(small_graph, "MIN_EDGE_FEATURES", {("pyg.GCNConv", "spmm"): 10 * F_IN})
    monkeypatch.setattr(small_graph, "NEW_GRAPH_MIN_EDGE_FEATURES", {("pyg.GCNConv", "spmm"): 1000 * F_IN})
    return small_graph


def test_a_new_graph_runs_stock_until_it_counts_as_static(new_graph_table):
    """Between the two entries a graph input runs stock for its first STATIC_AFTER_CALLS calls
    (a sampled batch: a few layer calls, then it dies), then fused; another graph starts over,
    and so does the same tensor once changed in place (its version moves)."""
    from torch_geometric.nn import GCNConv

    sg = new_graph_table
    module = GCNConv(F_IN, 4)
    edge_index, m = _graph(40)

    def ask(graph_input, edges=m):
        return sg.blocker("pyg.GCNConv", "spmm", module, edges, F_IN, graph_input)

    assert [ask(edge_index) is not None for _ in range(sg.STATIC_AFTER_CALLS)] == [True] * sg.STATIC_AFTER_CALLS
    reason, detail = ask(_graph(40)[0])
    assert reason == "small_graph" and "new graph (call 1 on it)" in detail
    assert ask(edge_index) is None and ask(edge_index) is None  # static from here on
    edge_index.add_(0)  # in place: a changed graph is a new one
    assert ask(edge_index) is not None
    # below the static entry: stock however often the graph is called; from the new-graph
    # entry on: fused from the first call; no graph input known: the static entry alone
    assert all(ask(edge_index, edges=5) is not None for _ in range(2 * sg.STATIC_AFTER_CALLS))
    assert ask(_graph(40)[0], edges=1000) is None
    assert ask(None) is None


def test_the_call_count_forgets_old_and_dead_graphs(new_graph_table, monkeypatch):
    """Counts are kept for the last COUNTED_GRAPHS graph inputs (a sampled run asks about a new
    one per batch: the table stays that size), and a graph input that died does not hand its
    count to a new object that reuses its id."""
    sg = new_graph_table
    monkeypatch.setattr(sg, "_counts", OrderedDict())
    monkeypatch.setattr(sg, "COUNTED_GRAPHS", 4)
    kept, _ = _graph(40)
    assert [sg.calls_on(kept) for _ in range(3)] == [1, 2, 3]
    batches = [_graph(40)[0] for _ in range(6)]
    assert [sg.calls_on(b) for b in batches] == [1] * 6
    assert len(sg._counts) == 4 and id(kept) not in sg._counts
    assert sg.calls_on(kept) == 1  # dropped as the oldest: it starts over
    dead = _graph(40)[0]
    sg.calls_on(dead)
    key = id(dead)
    del dead
    stale = sg._counts[key]
    assert stale[0]() is None
    reused = _graph(40)[0]
    sg._counts[id(reused)] = stale  # as if the new tensor had been given the dead one's id
    assert sg.calls_on(reused) == 1
    assert sg.calls_on("not a tensor") == 1


def test_the_call_count_starts_over_when_the_edges_may_have_changed(new_graph_table, monkeypatch):
    """An in-place write (the version counter), a new storage or shape under the same object
    (``.data =``) and a sparse adjacency's index tensors each start the count over; an inference
    tensor (no version counter) is counted by its storage."""
    sg = new_graph_table
    monkeypatch.setattr(sg, "_counts", OrderedDict())
    edge_index, _ = _graph(40)
    assert [sg.calls_on(edge_index) for _ in range(3)] == [1, 2, 3]
    edge_index[0, 0] = 1
    assert sg.calls_on(edge_index) == 1
    edge_index.data = edge_index.data.clone()
    assert sg.calls_on(edge_index) == 1
    assert sg.calls_on(edge_index) == 2
    edge_index.data = edge_index.data[:, :-1]  # the same storage start, fewer edges
    assert sg.calls_on(edge_index) == 1
    with torch.inference_mode():
        frozen = _graph(40)[0].clone()
    assert [sg.calls_on(frozen) for _ in range(2)] == [1, 2]
    adj = torch.sparse_coo_tensor(_graph(40)[0], torch.ones(_graph(40)[0].size(1)), (40, 40)).coalesce()
    assert [sg.calls_on(adj) for _ in range(2)] == [1, 2]
    adj._indices()[0, 0] = 0
    assert sg.calls_on(adj) == 1


def test_the_new_graph_entry_is_off_with_the_rule(new_graph_table, monkeypatch):
    from torch_geometric.nn import GCNConv

    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "off")
    edge_index, m = _graph(40)
    assert new_graph_table.blocker("pyg.GCNConv", "spmm", GCNConv(F_IN, 4), m, F_IN, edge_index) is None


def test_largest_covers_the_new_graph_entries(new_graph_table):
    assert new_graph_table.largest("pyg.GCNConv") == 1000 * F_IN


def test_a_sampled_batch_runs_gcn_stock_and_a_static_graph_fused(as_if_cuda, new_graph_table):
    """Through the layer call: a new graph (each batch a new edge_index, a few layer calls
    each) runs stock under ``small_graph``; one graph called again and again runs fused once it
    counts as static."""
    from torch_geometric.nn import GCNConv

    sg = new_graph_table
    module = GCNConv(F_IN, 4)
    for _ in range(3):  # three batches, two layer calls each
        edge_index, _ = _graph(40)
        for _ in range(2):
            out, expected = _run_on(module, edge_index)
            torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    assert gnn_fastpath.stats()["pyg.GCNConv"]["fallback"] == {"small_graph": 6}
    edge_index, _ = _graph(40)
    for _ in range(sg.STATIC_AFTER_CALLS + 3):
        _run_on(module, edge_index)
    entry = gnn_fastpath.stats()["pyg.GCNConv"]
    assert entry["fallback"] == {"small_graph": 6 + sg.STATIC_AFTER_CALLS} and entry["fused"]["reference"] == 3


def test_static_graphs_taking_turns_count_as_static(as_if_cuda, new_graph_table):
    """Two graph inputs used in turn by one module (e.g. stored snapshots) are each counted
    through the module's memo: both run fused once called STATIC_AFTER_CALLS times."""
    from torch_geometric.nn import GCNConv

    sg = new_graph_table
    module = GCNConv(F_IN, 4)
    first, second = _graph(40)[0], _graph(40)[0]
    for _ in range(sg.STATIC_AFTER_CALLS + 2):
        _run_on(module, first)
        _run_on(module, second)
    entry = gnn_fastpath.stats()["pyg.GCNConv"]
    assert entry["fallback"] == {"small_graph": 2 * sg.STATIC_AFTER_CALLS} and entry["fused"]["reference"] == 4


def test_the_memo_answers_a_call_like_the_last_and_nothing_else(as_if_cuda, table, monkeypatch):
    """After the rule sent a plain conv(x, edge_index) call to stock, a call of the same form
    and features on a graph below the entry is answered from the module's memo (the rule's
    own checks are not run: replaced here by one that fails the test) and counted in stats();
    a call of another dtype, width or form, another module, a changed setting or table, or
    force_reference() asks the rule again."""
    import gnn_fastpath.integrations.shim as shim_module
    from gnn_fastpath import config
    from gnn_fastpath.integrations import small_graph

    module = _sage()
    edge_index, _ = _graph(30)
    x = torch.randn(N, F_IN)
    gnn_fastpath.reset_stats()
    assert module(x, edge_index).shape == (N, 4)  # the rule asked: stock, remembered
    assert id(module) in shim_module._memo

    def asked(*args, **kwargs):
        raise AssertionError("the rule was asked")

    with monkeypatch.context() as m:
        m.setattr(small_graph, "blocker", asked)
        for other in (edge_index, _graph(30)[0], _graph(10)[0]):
            out, expected = module(x, other), torch.nn.Module.__call__(module, x, other)
            torch.testing.assert_close(out, expected)
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fallback"] == {"small_graph": 4}
    gnn_fastpath.reset_stats()
    module(x, edge_index)
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fallback"] == {"small_graph": 1}
    assert shim_module._memo_stock_cell(module, (x, _graph(1000)[0]), {}) is None  # above the entry
    assert shim_module._memo_stock_cell(module, (x.double(), edge_index), {}) is None
    assert shim_module._memo_stock_cell(module, (torch.randn(N, F_IN + 1), edge_index), {}) is None
    monkeypatch.setenv("GNN_FASTPATH_DISABLE_CUDA", "1")
    assert shim_module._memo_stock_cell(module, (x, edge_index), {}) is None
    monkeypatch.delenv("GNN_FASTPATH_DISABLE_CUDA")
    assert shim_module._memo_stock_cell(module, (x, edge_index), {"size": None}) is None
    assert shim_module._memo_stock_cell(_sage(), (x, edge_index), {}) is None  # another module
    monkeypatch.setattr(small_graph, "MIN_EDGE_FEATURES", dict(small_graph.MIN_EDGE_FEATURES))
    assert shim_module._memo_stock_cell(module, (x, edge_index), {}) is None
    module(x, edge_index)
    assert shim_module._memo_stock_cell(module, (x, edge_index), {}) is not None
    with config.force_reference():
        assert shim_module._memo_stock_cell(module, (x, edge_index), {}) is None
    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "off")
    assert shim_module._memo_stock_cell(module, (x, edge_index), {}) is None
    gnn_fastpath.reset_stats()
    module(x, edge_index)
    assert gnn_fastpath.stats()["pyg.SAGEConv"]["fused"]["reference"] == 1


# ---------------------------------------------------------------------- under torch.compile
@pytest.fixture
def compiled_table(monkeypatch, clean_fastpath):
    """Traced calls count as CUDA ones (the fused path then traces the reference ops); SAGEConv
    max runs fused from 500 edges (x F_IN), GCNConv stock at every size."""
    import gnn_fastpath.integrations.shim as shim_module
    from gnn_fastpath.integrations import small_graph

    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "auto")
    monkeypatch.setattr(shim_module, "_traced_for_cuda", lambda x: True)
    rows = {("pyg.SAGEConv", "segment_reduce"): 500 * F_IN, ("pyg.GCNConv", "spmm"): None}
    monkeypatch.setattr(small_graph, "COMPILED_MIN_EDGE_FEATURES", rows)
    torch._dynamo.reset()
    gnn_fastpath.enable(frameworks="pyg", cpu="reference")
    yield rows
    torch._dynamo.reset()


def _compiled_run(module, m, **compile_kwargs):
    """(the compiled call's output, stock's, the layer's ``stats()["compiled"]``), traced whole."""
    edge_index, _ = _graph(m)
    x = torch.randn(N, F_IN)
    gnn_fastpath.reset_stats()
    torch._dynamo.reset()
    out = torch.compile(module, fullgraph=True, backend="aot_eager", **compile_kwargs)(x, edge_index)
    key = f"pyg.{type(module).__name__}"
    return out, torch.nn.Module.__call__(module, x, edge_index), gnn_fastpath.stats()[key].get("compiled")


def test_compiled_below_the_entry_traces_stock(compiled_table):
    from torch_geometric.nn import GCNConv

    out, expected, compiled = _compiled_run(_sage(aggr="max"), 100)
    torch.testing.assert_close(out, expected)
    assert compiled == {"fallback:compiled_stock_faster": 1}
    out, expected, compiled = _compiled_run(GCNConv(F_IN, 4), 30)  # None: stock at every size
    torch.testing.assert_close(out, expected)
    assert compiled == {"fallback:compiled_stock_faster": 1}


def test_compiled_from_the_entry_on_traces_fused(compiled_table):
    from torch_geometric.nn import GCNConv

    out, expected, compiled = _compiled_run(_sage(aggr="max"), 600)
    torch.testing.assert_close(out, expected)
    assert compiled == {"reference": 1}
    # the entry is per (layer, variant): SAGEConv mean has no row here (fused at every size),
    # GCNConv's row says stock at every size
    assert _compiled_run(_sage(), 5)[2] == {"reference": 1}
    assert _compiled_run(GCNConv(F_IN, 4), 600)[2] == {"fallback:compiled_stock_faster": 1}


def test_compiled_with_cuda_graphs_traces_fused(compiled_table, monkeypatch):
    """Under CUDA graphs the host work of the fused path is recorded once: traced fused."""
    from gnn_fastpath.ops import dispatch

    monkeypatch.setattr(dispatch, "compiling_with_cuda_graphs", lambda: True)
    out, expected, compiled = _compiled_run(_sage(aggr="max"), 100)
    torch.testing.assert_close(out, expected)
    assert compiled == {"reference": 1}


def test_compiled_entry_is_off_with_the_rule(compiled_table, monkeypatch):
    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "off")
    assert _compiled_run(_sage(aggr="max"), 100)[2] == {"reference": 1}


class _LayerLoop(torch.nn.Module):
    """Layers called in a loop, as PyG's models call them: where a layer's stock forward breaks
    the graph, dynamo runs this frame in Python and enters each layer call as a frame."""

    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x, edge_index):
        for layer in self.layers:
            x = layer(x, edge_index).relu()
        return x


def _compiled_steps(model, x, edge_index, steps=3):
    """(the last output, graph breaks, frames dynamo compiled) over ``steps`` compiled calls."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="eager")
    out = [compiled(x, edge_index) for _ in range(steps)][-1]
    return out, sum(counters["graph_break"].values()), counters["frames"]["total"]


def test_a_layer_stock_at_every_size_adds_no_frame_to_stocks(compiled_table):
    """GCNConv's stock forward breaks the graph (its self-loop removal) inside the model's layer
    loop, so dynamo enters each layer call at the top. Sent to stock at every size by the
    compiled rule, the layer call goes straight to stock's Module.__call__: the same graph
    breaks and compiled frames as stock's model (before, a frame of ours around each call added
    two breaks and a frame per layer), the same values, counted once per module."""
    from torch_geometric.nn import GCNConv

    from gnn_fastpath.integrations import shim as shim_module

    torch.manual_seed(0)
    model = _LayerLoop([GCNConv(F_IN, F_IN) for _ in range(3)])
    edge_index, _ = _graph(60)
    x = torch.randn(N, F_IN)
    gnn_fastpath.disable()
    expected, stock_breaks, stock_frames = _compiled_steps(model, x, edge_index)
    gnn_fastpath.enable(frameworks="pyg", cpu="reference")
    gnn_fastpath.reset_stats()
    shim_module._top_level_stock.clear()
    out, breaks, frames = _compiled_steps(model, x, edge_index)
    torch.testing.assert_close(out, expected)
    assert stock_breaks > 0 and (breaks, frames) == (stock_breaks, stock_frames)
    assert [entry[-1] for entry in shim_module._top_level_stock.values()] == [True] * 3
    assert set(gnn_fastpath.stats()["pyg.GCNConv"]["compiled"]) == {"fallback:compiled_stock_faster"}


def test_a_changed_setting_is_read_again_at_the_top(compiled_table, monkeypatch):
    """The answer for layer calls entered at the top is kept per module and compiled function
    but asked again when GNN_FASTPATH_SMALL_GRAPH changes (with torch._dynamo.reset(), as
    documented): off traces every layer fused."""
    from torch_geometric.nn import GCNConv

    torch.manual_seed(0)
    model = _LayerLoop([GCNConv(F_IN, F_IN) for _ in range(3)])
    edge_index, _ = _graph(60)
    x = torch.randn(N, F_IN)
    compiled = torch.compile(model, backend="eager")
    torch._dynamo.reset()
    compiled(x, edge_index)
    assert set(gnn_fastpath.stats()["pyg.GCNConv"]["compiled"]) == {"fallback:compiled_stock_faster"}
    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "off")
    torch._dynamo.reset()
    gnn_fastpath.reset_stats()
    compiled(x, edge_index)
    assert gnn_fastpath.stats()["pyg.GCNConv"]["compiled"] == {"reference": 3}  # each layer traced fused


def test_top_level_stock_is_asked_of_the_running_backend(compiled_table):
    """The question for a layer call entered at the top: stock at every size only without CUDA
    graphs (read from the running compiled function's callback) and for an entry of None."""
    from torch_geometric.nn import GCNConv

    from gnn_fastpath.integrations import shim as shim_module
    from gnn_fastpath.integrations.pyg.layers import SHIMS

    shims = {s.key: s for s in SHIMS}
    edge_index, _ = _graph(30)
    call = ((torch.randn(N, F_IN), edge_index), {})

    class Backend:
        config = {"triton.cudagraphs": False}

    class Callback:
        _torchdynamo_orig_backend = Backend()

    gcn, sage = GCNConv(F_IN, 4), _sage(aggr="max")
    assert shim_module._stock_at_every_size(shims["pyg.GCNConv"], gcn, *call, Callback())
    assert not shim_module._stock_at_every_size(shims["pyg.SAGEConv"], sage, *call, Callback())  # sized entry
    Backend.config = {"triton.cudagraphs": True}
    assert not shim_module._stock_at_every_size(shims["pyg.GCNConv"], gcn, *call, Callback())


def test_the_compiled_rule_is_for_the_gpu_only(monkeypatch, clean_fastpath):
    """A traced call on the reference ops (CPU tensors) runs fused whatever the table says."""
    from gnn_fastpath.integrations import small_graph

    monkeypatch.setenv("GNN_FASTPATH_SMALL_GRAPH", "auto")
    monkeypatch.setattr(small_graph, "COMPILED_MIN_EDGE_FEATURES", {("pyg.SAGEConv", "spmm"): None})
    gnn_fastpath.enable(frameworks="pyg", cpu="reference")
    assert _compiled_run(_sage(), 30)[2] == {"reference": 1}
