"""torch.compile keeps the fused path: patched PyG layers trace onto the custom operators.

For every patched layer (and the argument variants that change what it traces), a 2-layer
model under ``enabled(frameworks="pyg", cpu="reference")`` compiled with
``backend="aot_eager"`` (fast on the CPU):

- has no more graph breaks than the stock model (torch._dynamo.explain);
- holds ``torch.ops.gnn_fastpath.<op>`` in its traced forward graph and ``<op>_backward`` in
  its backward graph (a backend recording AOTAutograd's graphs);
- gives the outputs and the input and parameter gradients of the uncompiled enabled model;
- counts the trace under ``stats()[layer]["compiled"]``;
- with ``dynamic=True`` compiles no more frames than stock over graphs of several sizes, and
  no new one per size.

Fallbacks under compilation (hooks, float64) trace the stock forward and say why. One test
runs the default inductor backend on the CPU. TorchScript of a model with patched layers is
covered by tests/test_switch.py::test_torchscript_while_enabled (scripting works while
enabled, the scripted calls run stock and are not counted as fused).

CUDA (``cuda`` marker): the same models under inductor, default mode and
``mode="reduce-overhead"``, against eager enabled on the GPU; CUDA-graph replays on graphs of
one size with new edges every step; attention dropout drawing a new mask every replay.
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import pytest
import torch

import gnn_fastpath
from gnn_fastpath.integrations import shim as shim_mod
from gnn_fastpath.ops import library

from .conftest import GRAD_FLOOR, assert_rel_close

pytestmark = pytest.mark.skipif(not library.AVAILABLE, reason="torch < 2.4: layers run stock under torch.compile")

F_IN, HID, F_OUT = 8, 8, 4
N, M = 24, 60
N_SRC, N_DST = 20, 12
RTOL = 1e-5
#: graphs of several sizes for the dynamic-shape tests: (n_src, n_dst, m)
SIZES = [(20, 20, 50), (27, 27, 70), (35, 35, 95)]
BIPARTITE_SIZES = [(20, 12, 40), (26, 15, 55), (33, 19, 75)]


def _pyg():
    import torch_geometric.nn as gnn

    return gnn


def _width(i):
    return i[0] if isinstance(i, tuple) else i


# --------------------------------------------------------------------------------- layers
@dataclass
class Case:
    """A patched layer variant: ``make(in, out)`` builds one layer (``in`` a pair for the
    bipartite variants), ``op`` the operator family it traces onto, ``extra`` the per-edge
    input the layer takes (``"edge_weight"`` [M], ``"edge_attr"`` [M, 3])."""

    make: Callable
    key: str
    op: str
    extra: Optional[str] = None
    bipartite: bool = False
    marks: List = field(default_factory=list)


def _gat(i, o, **kw):
    return _pyg().GATConv(i, o // 2, heads=2, **kw)


CASES: Dict[str, Case] = {
    "TransformerConv": Case(lambda i, o: _pyg().TransformerConv(i, o // 2, heads=2), "pyg.TransformerConv",
                            "dot_attention"),
    "GATConv": Case(lambda i, o: _gat(i, o), "pyg.GATConv", "gat_attention"),
    "GATConv-no_loops": Case(lambda i, o: _gat(i, o, add_self_loops=False), "pyg.GATConv", "gat_attention"),
    "GATConv-edge_dim-fill_mean": Case(lambda i, o: _gat(i, o, edge_dim=3, fill_value="mean"), "pyg.GATConv",
                                       "gat_attention", extra="edge_attr"),
    "GATv2Conv": Case(lambda i, o: _pyg().GATv2Conv(i, o // 2, heads=2), "pyg.GATv2Conv", "gatv2_attention"),
    "GCNConv": Case(lambda i, o: _pyg().GCNConv(i, o), "pyg.GCNConv", "spmm"),
    "GCNConv-cached": Case(lambda i, o: _pyg().GCNConv(i, o, cached=True), "pyg.GCNConv", "spmm"),
    "GCNConv-improved": Case(lambda i, o: _pyg().GCNConv(i, o, improved=True), "pyg.GCNConv", "spmm"),
    "GCNConv-edge_weight": Case(lambda i, o: _pyg().GCNConv(i, o), "pyg.GCNConv", "spmm", extra="edge_weight"),
    "SAGEConv-mean": Case(lambda i, o: _pyg().SAGEConv(i, o), "pyg.SAGEConv", "spmm"),
    "SAGEConv-max": Case(lambda i, o: _pyg().SAGEConv(i, o, aggr="max"), "pyg.SAGEConv", "segment_reduce"),
    "AGNNConv": Case(lambda i, o: _pyg().AGNNConv(requires_grad=True), "pyg.AGNNConv", "dot_attention"),
    "GINConv": Case(lambda i, o: _pyg().GINConv(torch.nn.Sequential(
        torch.nn.Linear(_width(i), o), torch.nn.ReLU(), torch.nn.Linear(o, o)), train_eps=True), "pyg.GINConv", "spmm"),
    "GraphConv-add": Case(lambda i, o: _pyg().GraphConv(i, o), "pyg.GraphConv", "spmm"),
    "GraphConv-max": Case(lambda i, o: _pyg().GraphConv(i, o, aggr="max"), "pyg.GraphConv", "segment_reduce"),
    "EdgeConv-linear": Case(lambda i, o: _pyg().EdgeConv(torch.nn.Linear(2 * _width(i), o)), "pyg.EdgeConv",
                            "segment_reduce"),
    "EdgeConv-sequential": Case(lambda i, o: _pyg().EdgeConv(torch.nn.Sequential(
        torch.nn.Linear(2 * _width(i), o), torch.nn.ReLU(), torch.nn.Linear(o, o))), "pyg.EdgeConv",
        "segment_reduce"),
    # bipartite pairs (x_src, x_dst), where the layer takes them
    "TransformerConv-bipartite": Case(lambda i, o: _pyg().TransformerConv(i, o // 2, heads=2), "pyg.TransformerConv",
                                      "dot_attention", bipartite=True),
    "GATConv-bipartite": Case(lambda i, o: _gat(i, o), "pyg.GATConv", "gat_attention", bipartite=True),
    "GATv2Conv-bipartite": Case(lambda i, o: _pyg().GATv2Conv(i, o // 2, heads=2), "pyg.GATv2Conv",
                                "gatv2_attention", bipartite=True),
    "SAGEConv-mean-bipartite": Case(lambda i, o: _pyg().SAGEConv(i, o), "pyg.SAGEConv", "spmm", bipartite=True),
    "SAGEConv-max-bipartite": Case(lambda i, o: _pyg().SAGEConv(i, o, aggr="max"), "pyg.SAGEConv",
                                   "segment_reduce", bipartite=True),
    "GINConv-bipartite": Case(lambda i, o: _pyg().GINConv(torch.nn.Linear(_width(i), o)), "pyg.GINConv", "spmm",
                              bipartite=True),
    "GraphConv-bipartite": Case(lambda i, o: _pyg().GraphConv(i, o), "pyg.GraphConv", "spmm", bipartite=True),
    "EdgeConv-bipartite": Case(lambda i, o: _pyg().EdgeConv(torch.nn.Linear(2 * _width(i), o)), "pyg.EdgeConv",
                               "segment_reduce", bipartite=True),
}


class Net(torch.nn.Module):
    """Two layers over one graph: ``b(relu(a(x, g)), g)``; the per-edge input, if any, to both."""

    def __init__(self, case: Case):
        super().__init__()
        self.a = case.make(F_IN, HID)
        self.b = case.make(HID, F_OUT)

    def forward(self, x, edge_index, extra: Optional[torch.Tensor] = None):
        args = () if extra is None else (extra,)
        return self.b(self.a(x, edge_index, *args).relu(), edge_index, *args)


class BipartiteNet(torch.nn.Module):
    """Two bipartite layers over one graph: ``b((relu(proj(x_src)), relu(a((x_src, x_dst)))))``."""

    def __init__(self, case: Case):
        super().__init__()
        self.a = case.make((F_IN, F_IN), HID)
        self.proj = torch.nn.Linear(F_IN, HID)
        self.b = case.make((HID, HID), F_OUT)

    def forward(self, x_src, x_dst, edge_index):
        h = self.a((x_src, x_dst), edge_index).relu()
        return self.b((self.proj(x_src).relu(), h), edge_index)


def make_model(case: Case, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = BipartiteNet(case) if case.bipartite else Net(case)
    with torch.no_grad():  # stock initialises biases (and GIN's eps) to 0: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.endswith("eps"):
                p.normal_(0, 0.5)
    return model


def make_inputs(case: Case, n_src: int, n_dst: int, m: int, seed: int = 0) -> tuple:
    """The model's inputs: features requiring grad, an edge_index with self loops (some
    destination rows empty) and duplicates, the per-edge input (requiring grad)."""
    from zoo import random_edges

    gen = torch.Generator().manual_seed(seed)
    edge_index, _ = random_edges(n_src, n_dst, m, seed=seed, empty_rows=2)
    if case.bipartite:
        return (torch.randn(n_src, F_IN, generator=gen).requires_grad_(),
                torch.randn(n_dst, F_IN, generator=gen).requires_grad_(), edge_index)
    x = torch.randn(n_src, F_IN, generator=gen).requires_grad_()
    if case.extra == "edge_weight":
        return x, edge_index, (torch.rand(edge_index.size(1), generator=gen) + 0.5).requires_grad_()
    if case.extra == "edge_attr":
        return x, edge_index, torch.randn(edge_index.size(1), 3, generator=gen).requires_grad_()
    return (x, edge_index)


def default_inputs(case: Case, seed: int = 0) -> tuple:
    return make_inputs(case, N_SRC, N_DST, M, seed) if case.bipartite else make_inputs(case, N, N, M, seed)


def fresh(inputs: tuple) -> tuple:
    return tuple(t.detach().clone().requires_grad_(t.requires_grad) if t.is_floating_point() else t for t in inputs)


def run(model, inputs: tuple, seed: int = 1) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """(output, gradients of every parameter and float input) of ``sum(w * out)``."""
    inputs = fresh(inputs)
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype).to(out.device)
    (out * w).sum().backward()
    grads = {f"param {_name(n)}": p.grad for n, p in model.named_parameters()}
    grads.update({f"input {i}": t.grad for i, t in enumerate(inputs) if t.is_floating_point()})
    return out.detach(), grads


def _name(parameter: str) -> str:
    """A parameter's name in the module (a compiled module's start with ``_orig_mod.``)."""
    return parameter[len("_orig_mod."):] if parameter.startswith("_orig_mod.") else parameter


def assert_same(actual, expected, rtol=RTOL):
    out, grads = actual
    out_e, grads_e = expected
    assert_rel_close(out, out_e, "output", rtol)
    assert grads.keys() == grads_e.keys()
    floor = GRAD_FLOOR * max(g.abs().max().item() for g in grads_e.values() if g is not None and g.numel())
    for name, e in grads_e.items():
        a = grads[name]
        assert (a is None) == (e is None), f"grad of {name}: {a is None} vs {e is None}"
        if e is not None:
            assert_rel_close(a, e, f"grad of {name}", rtol, floor)


class Recorder:
    """A backend recording the gnn_fastpath operators of AOTAutograd's forward and backward
    graphs (otherwise aot_eager: the graphs run as traced)."""

    def __init__(self):
        self.forward: set = set()
        self.backward: set = set()
        self.frames = 0

    def __call__(self, gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        self.frames += 1

        def recording(targets):
            def compiler(graph, _inputs):
                targets.update(str(n.target) for n in graph.graph.nodes if "gnn_fastpath" in str(n.target))
                return graph

            return compiler

        return aot_module_simplified(gm, example_inputs, fw_compiler=recording(self.forward),
                                     bw_compiler=recording(self.backward))


def enabled():
    return gnn_fastpath.enabled(frameworks="pyg", cpu="reference")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gnn_fastpath.FastpathFallbackWarning)
        yield
    torch._dynamo.reset()


#: GCNConv(cached=True) runs stock on its first compiled call (test_gcn_cached_under_compile)
CASE_PARAMS = [pytest.param(name, id=name, marks=c.marks) for name, c in CASES.items() if name != "GCNConv-cached"]


# ------------------------------------------------------------------- compiled == eager
@pytest.mark.parametrize("name", CASE_PARAMS)
def test_compiled_model_traces_the_operators(name):
    """(b) the operators in the traced forward and backward graphs, (c) outputs and gradients
    of the uncompiled enabled model, (d) the trace counted under stats()["compiled"], no
    eager call counted."""
    case = CASES[name]
    model = make_model(case)
    inputs = default_inputs(case)
    with enabled():
        expected = run(copy.deepcopy(model), inputs)
        gnn_fastpath.reset_stats()
        recorder = Recorder()
        compiled = torch.compile(copy.deepcopy(model), backend=recorder)
        actual = run(compiled, inputs)
        counts = gnn_fastpath.stats().get(case.key, {})
        again = run(compiled, inputs)  # the first call left the module in a usable state
    assert f"gnn_fastpath.{case.op}.default" in recorder.forward, recorder.forward
    assert f"gnn_fastpath.{case.op}_backward.default" in recorder.backward, recorder.backward
    assert recorder.frames == 1
    assert_same(actual, expected)
    assert_same(again, expected)
    assert counts.get("compiled") == {"reference": 2}, counts  # both layers, traced once
    assert counts["fused"] == {"cuda": 0, "reference": 0} and counts["fallback"] == {}, counts


@pytest.mark.parametrize("name", CASE_PARAMS)
def test_no_more_graph_breaks_than_stock(name):
    """(a) torch._dynamo.explain: the enabled model breaks no more often than stock."""
    case = CASES[name]
    model = make_model(case)
    inputs = default_inputs(case)
    stock = torch._dynamo.explain(copy.deepcopy(model))(*fresh(inputs))
    torch._dynamo.reset()
    with enabled():
        ours = torch._dynamo.explain(copy.deepcopy(model))(*fresh(inputs))
    assert ours.graph_break_count <= stock.graph_break_count, [str(r.reason)[:200] for r in ours.break_reasons]
    compiled = gnn_fastpath.stats().get(case.key, {}).get("compiled")
    assert compiled and set(compiled) == {"reference"}, compiled


# ------------------------------------------------------------------------ dynamic shapes
DYNAMIC_PARAMS = list(CASES)


def _frames_over_sizes(model, case, sizes) -> List[int]:
    """Frames compiled (cumulative, after each size) with dynamic=True, forward and backward."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, dynamic=True)
    frames = []
    for seed, (n_src, n_dst, m) in enumerate(sizes):
        out = compiled(*make_inputs(case, n_src, n_dst, m, seed))
        out.sum().backward()
        frames.append(counter.frame_count)
    torch._dynamo.reset()
    return frames


@pytest.mark.parametrize("name", DYNAMIC_PARAMS)
def test_new_graph_sizes_do_not_recompile(name):
    """(e) dynamic=True over three graph sizes: the enabled model compiles no frame after the
    first size and no more frames than stock over the same inputs."""
    case = CASES[name]
    sizes = BIPARTITE_SIZES if case.bipartite else SIZES
    model = make_model(case)
    stock = _frames_over_sizes(copy.deepcopy(model), case, sizes)
    with enabled():
        model(*make_inputs(case, *sizes[0]))  # eager first: per-process memos filled (see the cold-cache test)
        ours = _frames_over_sizes(copy.deepcopy(model), case, sizes)
    assert ours[-1] == ours[0], f"recompiled for new sizes: frames after each size {ours}"
    assert ours[-1] <= stock[-1], f"enabled {ours} vs stock {stock}"


def test_a_second_call_does_not_recompile():
    """The same inputs twice (and a third time): one compilation, counted once per layer in
    stats (the bookkeeping runs at trace time, outside the traced program: a counter mutated
    in traced code would be guarded on and recompile every call)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    case = CASES["SAGEConv-mean"]
    model = make_model(case)
    inputs = default_inputs(case)
    with enabled():
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(model, backend=counter)
        for _ in range(3):
            compiled(*fresh(inputs))
        counts = gnn_fastpath.stats()[case.key]["compiled"]
    assert counter.frame_count == 1
    assert counts == {"reference": 2}, counts


@pytest.mark.parametrize("name", ["TransformerConv", "EdgeConv-linear"])
def test_first_compile_in_a_fresh_process_is_the_only_one(name, monkeypatch):
    """With the shims' dtype memo empty (as in a fresh process): two calls, one compilation."""
    from torch._dynamo.testing import CompileCounterWithBackend

    monkeypatch.setattr(shim_mod, "_result_dtypes", {})
    case = CASES[name]
    model = make_model(case)
    inputs = default_inputs(case)
    with enabled():
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(model, backend=counter)
        for _ in range(2):
            compiled(*fresh(inputs))
    assert counter.frame_count == 1


def test_gcn_cached_under_compile():
    """GCNConv(cached=True): the first compiled call runs stock (reason ``compile``: the cache
    holds stock's looped edge_index, whose compacted order a traced graph cannot give), which
    builds the cache stock builds; the next call traces the fused path over that cache. Both
    give stock's values and gradients, and the caches equal stock's. (What stats() counts:
    test_in_forward_fallbacks_under_compile.)"""
    case = CASES["GCNConv-cached"]
    model = make_model(case)
    inputs = default_inputs(case)
    stock = copy.deepcopy(model)
    expected = [run(stock, inputs) for _ in range(2)]
    ours = copy.deepcopy(model)
    with enabled():
        recorder = Recorder()
        compiled = torch.compile(ours, backend=recorder)
        first = run(compiled, inputs)
        first_ops = set(recorder.forward)
        second = run(compiled, inputs)
    assert_same(first, expected[0])
    assert_same(second, expected[1])
    assert not first_ops, first_ops  # stock traced
    assert "gnn_fastpath.spmm.default" in recorder.forward, recorder.forward
    assert "gnn_fastpath.spmm_backward.default" in recorder.backward, recorder.backward
    for name in ("a", "b"):
        (index, weight), (s_index, s_weight) = getattr(ours, name)._cached_edge_index, \
            getattr(stock, name)._cached_edge_index
        assert torch.equal(index, s_index), name
        torch.testing.assert_close(weight, s_weight, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("how", ["GCNConv-cached", "GATConv-attention_weights"])
def test_in_forward_fallbacks_under_compile(how):
    """A fallback a shim decides inside its forward (GCNConv(cached=True)'s first compiled
    call; GATConv asked for attention weights with self loops) traces stock with no more graph
    breaks than stock and is counted under stats()["compiled"]; GCNConv's next (cached, fused)
    trace is counted too."""
    from torch_geometric.nn import GATConv, GCNConv

    torch.manual_seed(0)
    x, edge_index = default_inputs(CASES["GCNConv"])
    if how == "GCNConv-cached":
        conv, key = GCNConv(F_IN, F_OUT, cached=True), "pyg.GCNConv"

        def call(c, x, edge_index):
            return c(x, edge_index)
    else:
        conv, key = GATConv(F_IN, F_OUT, heads=2), "pyg.GATConv"

        def call(c, x, edge_index):
            return c(x, edge_index, return_attention_weights=True)[0]

    stock_conv = copy.deepcopy(conv)
    stock = torch._dynamo.explain(lambda x, e: call(stock_conv, x, e))(*fresh((x, edge_index)))
    torch._dynamo.reset()
    with enabled():
        ours_conv = copy.deepcopy(conv)
        ours = torch._dynamo.explain(lambda x, e: call(ours_conv, x, e))(*fresh((x, edge_index)))
        torch._dynamo.reset()
        gnn_fastpath.reset_stats()
        compiled_conv = copy.deepcopy(conv)
        compiled = torch.compile(lambda x, e: call(compiled_conv, x, e), backend="aot_eager")
        compiled(*fresh((x, edge_index)))
        first = dict(gnn_fastpath.stats().get(key, {}).get("compiled", {}))
        compiled(*fresh((x, edge_index)))
        later = dict(gnn_fastpath.stats().get(key, {}).get("compiled", {}))
    assert ours.graph_break_count <= stock.graph_break_count, (ours.graph_break_count, stock.graph_break_count)
    assert len(first) == 1 and next(iter(first)).startswith("fallback:"), first
    if how == "GCNConv-cached":
        assert later.get("reference", 0) >= 1, later


# ---------------------------------------------------------------------------- fallbacks
def _hooked(model):
    for layer in (model.a, model.b):
        layer.register_forward_hook(lambda module, args, out: out)
    return model


@pytest.mark.parametrize("how,reason", [("hook", "hooks"), ("float64", "dtype")])
def test_fallbacks_trace_the_stock_forward(how, reason):
    """A layer the fused path does not cover traces stock code: no operator in the graphs,
    stock's values and gradients, the reason under stats()["compiled"]."""
    case = CASES["GCNConv"]
    model = make_model(case)
    inputs = default_inputs(case)
    if how == "hook":
        model = _hooked(model)
    else:
        model = model.double()
        inputs = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    expected = run(copy.deepcopy(model), inputs)
    with enabled():
        recorder = Recorder()
        actual = run(torch.compile(copy.deepcopy(model), backend=recorder), inputs)
        counts = gnn_fastpath.stats()[case.key]
    assert not recorder.forward and not recorder.backward, (recorder.forward, recorder.backward)
    # stock GCN breaks the graph (PyG's self-loop removal): dynamo restarts its trace of the
    # frame, and every (re)trace of a layer is counted
    assert set(counts["compiled"]) == {f"fallback:{reason}"} and counts["compiled"][f"fallback:{reason}"] >= 2, counts
    assert counts["fused"] == {"cuda": 0, "reference": 0} and counts["fallback"] == {}, counts
    assert_same(actual, expected)


def test_attention_dropout_draws_a_new_mask_per_call():
    """Training-mode attention dropout under compile: each call draws its mask from torch's
    generator (two calls differ, the same seed repeats the call), and the backward follows
    the forward's mask (the same seed gives the same gradients)."""
    case = Case(lambda i, o: _gat(i, o, add_self_loops=False, dropout=0.5), "pyg.GATConv", "gat_attention")
    model = make_model(case).train()
    inputs = default_inputs(case)
    with enabled():
        compiled = torch.compile(model, backend="aot_eager")
        torch.manual_seed(10)
        first = run(compiled, inputs)
        second = run(compiled, inputs)
        torch.manual_seed(10)
        again = run(compiled, inputs)
        counts = gnn_fastpath.stats()[case.key]["compiled"]
    assert set(counts) == {"reference"}
    assert not torch.allclose(first[0], second[0])
    assert torch.equal(first[0], again[0])
    for k in first[1]:
        assert torch.equal(first[1][k], again[1][k]), k
    # dropout is on in the compiled graph: eval mode differs from both
    with enabled():
        evaluated = torch.compile(copy.deepcopy(model).eval(), backend="aot_eager")(*fresh(inputs))
    assert not torch.allclose(evaluated, first[0])


@pytest.mark.parametrize("name", ["GCNConv", "GATConv"])
def test_inductor_on_the_cpu(name):
    """The default backend (inductor) runs the operators' CPU implementations as extern calls:
    the enabled model's values and gradients."""
    case = CASES[name]
    model = make_model(case)
    inputs = default_inputs(case)
    with enabled():
        expected = run(copy.deepcopy(model), inputs)
        actual = run(torch.compile(copy.deepcopy(model)), inputs)
        counts = gnn_fastpath.stats()[case.key]["compiled"]
    assert set(counts) == {"reference"}, counts
    assert_same(actual, expected, rtol=1e-4)


# ------------------------------------------------------------------------------------ CUDA
def _to_cuda(inputs):
    return tuple(t.detach().cuda().requires_grad_(t.requires_grad) if t.is_floating_point() else t.cuda()
                 for t in inputs)


def _cuda_run(model, inputs, reduce_overhead: bool, seed: int = 1):
    """run() on the GPU; under CUDA graphs the step is marked and the results cloned before
    the next replay overwrites them."""
    if reduce_overhead:
        torch.compiler.cudagraph_mark_step_begin()
    inputs = fresh(inputs)
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out.shape, generator=gen, dtype=out.dtype).cuda()
    (out * w).sum().backward()
    grads = {f"param {_name(n)}": None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    grads.update({f"input {i}": t.grad.clone() for i, t in enumerate(inputs) if t.is_floating_point()})
    return out.detach().clone(), grads


CUDA_RTOL = 1e-4


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.parametrize("name", CASE_PARAMS)
def test_cuda_inductor_matches_eager(name, mode, no_cpu_only_torch_sparse):
    """Inductor on the GPU, default mode and CUDA graphs: values and gradients of the eager
    enabled model (the kernels), fused backend counted."""
    case = CASES[name]
    model = make_model(case).cuda()
    inputs = _to_cuda(default_inputs(case))
    ro = mode == "reduce-overhead"
    with gnn_fastpath.enabled(frameworks="pyg"):
        expected = _cuda_run(copy.deepcopy(model), inputs, False)
        gnn_fastpath.reset_stats()
        compiled = torch.compile(copy.deepcopy(model), mode=None if mode == "default" else mode)
        for _ in range(2 if ro else 1):  # a CUDA graph is recorded, then replayed
            actual = _cuda_run(compiled, inputs, ro)
            assert_same(actual, expected, CUDA_RTOL)
        counts = gnn_fastpath.stats()[case.key]
    assert set(counts["compiled"]) == {"cuda"}, counts


def _random_step_edges(n: int, m: int, loops: int, seed: int) -> torch.Tensor:
    """A new edge_index of exactly m edges over n nodes, ``loops`` of them self loops."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (m,), generator=gen)
    dst = torch.randint(0, n, (m,), generator=gen)
    # exactly ``loops`` self loops, on distinct nodes: where a node has two, stock's and the
    # fused loop weight (GCN with edge_weight) are each "any one of them" on CUDA
    dst = torch.where(src == dst, (dst + 1) % n, dst)
    nodes = torch.randperm(n, generator=gen)[:loops]
    src[:loops], dst[:loops] = nodes, nodes
    order = torch.randperm(m, generator=gen)
    return torch.stack([src[order], dst[order]])


REPLAY_CASES = ["GCNConv", "GCNConv-edge_weight", "GATConv", "GATConv-edge_dim-fill_mean", "GATv2Conv",
                "TransformerConv", "SAGEConv-mean", "SAGEConv-max", "GINConv", "GraphConv-max", "EdgeConv-linear",
                "AGNNConv"]


@pytest.mark.cuda
@pytest.mark.parametrize("name", REPLAY_CASES)
def test_cuda_graphs_replay_new_edges_every_step(name, no_cpu_only_torch_sparse):
    """mode="reduce-overhead" on graphs of one size (same N, same M) with new random edges,
    self loops included, every step: each step's outputs and gradients equal eager enabled's
    on that step's edges (a CUDA graph that kept a recorded step's structure would not), from
    one compilation, with CUDA graphs not skipped."""
    from torch._dynamo.utils import counters

    case = CASES[name]
    n, m = 300, 2000
    model = make_model(case).cuda()
    eager = copy.deepcopy(model)
    compiled_model = copy.deepcopy(model)
    counters.clear()
    with gnn_fastpath.enabled(frameworks="pyg"):
        compiled = torch.compile(compiled_model, mode="reduce-overhead")
        frames = []
        for step in range(5):
            base = make_inputs(case, n, n, 1, seed=step)
            edge_index = _random_step_edges(n, m, loops=n // 5, seed=100 + step)
            inputs = list(base)
            inputs[1] = edge_index
            if case.extra == "edge_weight":
                inputs[2] = (torch.rand(m) + 0.5).requires_grad_()
            elif case.extra == "edge_attr":
                inputs[2] = torch.randn(m, 3).requires_grad_()
            inputs = _to_cuda(tuple(inputs))
            expected = _cuda_run(eager, inputs, False)
            actual = _cuda_run(compiled, inputs, True)
            assert_same(actual, expected, CUDA_RTOL)
            frames.append(counters["stats"]["unique_graphs"])
    assert frames[-1] == frames[0], f"recompiled: unique graphs after each step {frames}"
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["GATConv-no_loops", "GATv2Conv", "TransformerConv"])
def test_cuda_graphs_draw_a_new_dropout_mask_every_replay(name, no_cpu_only_torch_sparse):
    """Attention dropout in training under reduce-overhead: the replays' outputs differ from
    one another (the rng tensor is drawn inside the graph), the same seed repeats a step, and
    without dropout (eval) every replay gives the same output."""
    base = CASES[name]

    def make(i, o):
        layer = base.make(i, o)
        layer.dropout = 0.5
        return layer

    case = Case(make, base.key, base.op)
    model = make_model(case).cuda().train()
    inputs = _to_cuda(default_inputs(case))
    with gnn_fastpath.enabled(frameworks="pyg"):
        compiled = torch.compile(model, mode="reduce-overhead")
        outs = [_cuda_run(compiled, inputs, True)[0] for _ in range(4)]
        torch.manual_seed(7)
        a = _cuda_run(compiled, inputs, True)
        torch.manual_seed(7)
        b = _cuda_run(compiled, inputs, True)
    for i in range(1, len(outs)):
        assert not torch.allclose(outs[i], outs[i - 1]), f"replay {i} repeated the previous mask"
    # the same mask (the kernels' sums may use atomics: equal up to rounding)
    assert_same(a, b, 1e-5)
    model.eval()
    torch._dynamo.reset()
    with gnn_fastpath.enabled(frameworks="pyg"):
        compiled = torch.compile(model, mode="reduce-overhead")
        evals = [_cuda_run(compiled, inputs, True)[0] for _ in range(3)]
    torch.testing.assert_close(evals[0], evals[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(evals[1], evals[2], rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
def test_cuda_fallback_under_compile_traces_stock(no_cpu_only_torch_sparse):
    """float64 on the GPU under compile: stock traced, reason counted, stock's values."""
    case = CASES["GCNConv"]
    model = make_model(case).cuda().double()
    inputs = tuple(t.double() if t.is_floating_point() else t for t in _to_cuda(default_inputs(case)))
    expected = _cuda_run(copy.deepcopy(model), inputs, False)
    with gnn_fastpath.enabled(frameworks="pyg"):
        actual = _cuda_run(torch.compile(copy.deepcopy(model)), inputs, False)
        counts = gnn_fastpath.stats()[case.key]["compiled"]
    assert set(counts) == {"fallback:dtype"} and counts["fallback:dtype"] >= 2, counts  # restarts count too
    assert_same(actual, expected, CUDA_RTOL)

