"""Every patched layer, PyG and DGL, under ``torch.autocast`` and as a half module.

What is compared. For each layer configuration the same module (deep copies) and inputs run
(a) stock, (b) with ``enable()``, and (c) as a float64 copy with stock code and upcast
inputs (no autocast): the float64 evaluation of the *same* module (for a half module, of its
16-bit parameters and inputs, upcast). Checked:

- (a) and (b) return the same dtypes: every output leaf (attention weights included), the
  input gradient and every parameter gradient;
- accuracy against (c): ``err = max |y - y64| / max |y64|`` per tensor (outputs and
  gradients); the fused error may not exceed ``FACTOR * stock's error + SLACK * u``, where
  ``u`` is the unit roundoff of the 16-bit dtype (2**-8 bf16, 2**-11 fp16). Both paths run
  the same projections (same submodules, same autocast), so their shared error is the 16-bit
  rounding of the projections; the fused ops then compute in float32 and round once, where
  stock rounds its 16-bit messages, softmax or sums at every step, so the fused error is
  normally the smaller. ``FACTOR = 2`` absorbs rounding that lands differently (the fused
  result and stock's can fall on opposite sides of a 16-bit grid point), ``SLACK = 2``
  covers tensors where stock happens to be exact (e.g. a max/min that selects, where the
  fused result is also exact: 0 <= 2 * 0 + 2u);
- the stats count the call as fused on the expected backend, with no fallback.

DGL: DGL's PyPI build is CPU-only, so on the GPU stock cannot run (CUDA features on the CPU
graph); there the fused result is checked against the float64 module on the CPU with the
bounds ``err <= DGL_BOUND * u`` (outputs, 16u) and ``DGL_GRAD_BOUND * u`` (x.grad and the
parameter gradients taken as one vector, 128u; relative to the tensor's largest entry), and the dtypes against the rule derived from
DGL 2.1's code (documented in each DGL shim's docstring; :func:`_dgl_expected_dtype`). The
gradient bound is loose on purpose: gradients through a softmax are ill-conditioned (the
16-bit rounding of the projections moves LeakyReLU kinks and cancels in ``alpha (dalpha -
delta)``); measured on the CPU in bfloat16, stock DGL and the fused path alike reach 46u on
``GATv2Conv.fc_dst.weight`` and stay below 3u on every output. For a bfloat16 module the GPU
result is also held to the ``FACTOR``/``SLACK`` rule against stock DGL run on the CPU in
bfloat16 (same module, same inputs), with stock's dtypes.
On the CPU the half modules (bfloat16: DGL 2.1 has no float16 CPU kernels, so float16 runs
stock) are compared with stock DGL like the PyG ones; under CPU autocast the DGL layers run
stock (reason ``"autocast"``: DGL's sparse ops cast only under CUDA autocast).

CPU tests use ``enable(cpu="reference")``: the reference ops follow the same dtype contract
(16-bit inputs computed in float32, ``out_dtype`` honoured), so the dtype rules and the
accuracy claim are checked in CI; CPU autocast has other op lists than CUDA autocast (e.g.
``sum`` and ``exp`` stay 16-bit), and the shims follow stock there too.
"""
from __future__ import annotations

import contextlib
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import gnn_fastpath
from gnn_fastpath import FastpathFallbackWarning
from zoo import random_edges

FACTOR = 2.0
SLACK = 2.0
#: DGL on the GPU (no stock to compare with): bounds in units of u against float64.
DGL_BOUND = 16.0
DGL_GRAD_BOUND = 128.0
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
HALF = (torch.bfloat16, torch.float16)
N, F_IN, M = 40, 12, 200


# --------------------------------------------------------------------------- inputs
def _edge_index(n_src=N, n_dst=N, m=M, seed=0):
    return random_edges(n_src, n_dst, m, seed, empty_rows=2)[0]


def _pyg_cases():
    from torch_geometric.nn import GATConv, GATv2Conv, GCNConv, SAGEConv, TransformerConv

    ei = _edge_index()
    ea = torch.randn(ei.size(1), 3)
    att = {"return_attention_weights": True}
    return {
        "GATv2Conv": (lambda: GATv2Conv(F_IN, 8, heads=2), (ei,), att),
        "GATv2Conv(edge_dim,residual)": (lambda: GATv2Conv(F_IN, 8, heads=2, edge_dim=3, residual=True),
                                         (ei,), dict(att, edge_attr=ea)),
        "GATv2Conv(concat=False,share)": (lambda: GATv2Conv(F_IN, 8, heads=2, concat=False, share_weights=True),
                                          (ei,), {}),
        "GATConv": (lambda: GATConv(F_IN, 8, heads=2), (ei,), att),
        "GATConv(edge_dim,residual)": (lambda: GATConv(F_IN, 8, heads=2, edge_dim=3, residual=True),
                                       (ei,), dict(att, edge_attr=ea)),
        "GATConv(concat=False,lin_src/lin_dst)": (lambda: GATConv((F_IN, F_IN), 8, heads=2, concat=False),
                                                  (ei,), {}),
        "TransformerConv": (lambda: TransformerConv(F_IN, 8, heads=2), (ei,), att),
        "TransformerConv(edge_dim,beta)": (lambda: TransformerConv(F_IN, 8, heads=2, edge_dim=3, beta=True),
                                           (ei,), dict(att, edge_attr=ea)),
        "TransformerConv(concat=False,no_root)": (
            lambda: TransformerConv(F_IN, 8, heads=2, concat=False, root_weight=False), (ei,), {}),
        "GCNConv": (lambda: GCNConv(F_IN, 8), (ei,), {}),
        "GCNConv(edge_weight)": (lambda: GCNConv(F_IN, 8), (ei, torch.rand(ei.size(1)) + 0.5), {}),
        "GCNConv(normalize=False)": (lambda: GCNConv(F_IN, 8, normalize=False), (ei,), {}),
        "GCNConv(normalize=False,bias=False)": (lambda: GCNConv(F_IN, 8, normalize=False, bias=False), (ei,), {}),
        "SAGEConv(mean)": (lambda: SAGEConv(F_IN, 8), (ei,), {}),
        "SAGEConv(sum)": (lambda: SAGEConv(F_IN, 8, aggr="sum"), (ei,), {}),
        "SAGEConv(max)": (lambda: SAGEConv(F_IN, 8, aggr="max"), (ei,), {}),
        "SAGEConv(min,project,normalize)": (lambda: SAGEConv(F_IN, 8, aggr="min", project=True, normalize=True),
                                            (ei,), {}),
    }


PYG_CASES = ["GATv2Conv", "GATv2Conv(edge_dim,residual)", "GATv2Conv(concat=False,share)", "TransformerConv",
             "GATConv", "GATConv(edge_dim,residual)", "GATConv(concat=False,lin_src/lin_dst)",
             "TransformerConv(edge_dim,beta)", "TransformerConv(concat=False,no_root)", "GCNConv",
             "GCNConv(edge_weight)", "GCNConv(normalize=False)", "GCNConv(normalize=False,bias=False)",
             "SAGEConv(mean)", "SAGEConv(sum)", "SAGEConv(max)", "SAGEConv(min,project,normalize)"]


def _dgl_graph(dgl):
    src, dst = _edge_index()
    g = dgl.graph((src, dst), num_nodes=N)
    return dgl.add_self_loop(dgl.remove_self_loop(g))  # no zero in-degree (GATv2Conv, GraphConv)


def _dgl_cases(dgl):
    from dgl.nn import GATConv, GATv2Conv, GraphConv, SAGEConv

    g = _dgl_graph(dgl)
    w = {"edge_weight": torch.rand(g.num_edges()) + 0.5}
    return g, {
        "GATv2Conv": (lambda: GATv2Conv(F_IN, 8, 2, residual=True), F_IN, {"get_attention": True}),
        "GATv2Conv(identity_residual)": (lambda: GATv2Conv(16, 8, 2, residual=True, activation=F.elu), 16, {}),
        "GATConv": (lambda: GATConv(F_IN, 8, 2, residual=True), F_IN, {"get_attention": True}),
        "GATConv(edge_weight,bias)": (lambda: GATConv(F_IN, 8, 2), F_IN, w),
        "GATConv(identity_residual,no_bias)": (lambda: GATConv(16, 8, 2, residual=True, bias=False,
                                                               activation=F.elu), 16, {}),
        "GraphConv(both)": (lambda: GraphConv(F_IN, 8), F_IN, {}),
        "GraphConv(right,W_after)": (lambda: GraphConv(6, 8, norm="right"), 6, w),
        "GraphConv(none,W_before)": (lambda: GraphConv(F_IN, 8, norm="none"), F_IN, w),
        "GraphConv(left,W_after,no_bias)": (lambda: GraphConv(6, 8, norm="left", bias=False), 6, {}),
        "SAGEConv(mean)": (lambda: SAGEConv(F_IN, 8, "mean"), F_IN, {}),
        "SAGEConv(mean,W_after)": (lambda: SAGEConv(6, 8, "mean"), 6, w),
        "SAGEConv(gcn)": (lambda: SAGEConv(F_IN, 8, "gcn"), F_IN, {}),
        "SAGEConv(gcn,W_after)": (lambda: SAGEConv(6, 8, "gcn"), 6, {}),
        "SAGEConv(pool)": (lambda: SAGEConv(F_IN, 8, "pool"), F_IN, w),
    }


DGL_CASES = ["GATv2Conv", "GATv2Conv(identity_residual)", "GATConv", "GATConv(edge_weight,bias)",
             "GATConv(identity_residual,no_bias)", "GraphConv(both)", "GraphConv(right,W_after)",
             "GraphConv(none,W_before)", "GraphConv(left,W_after,no_bias)", "SAGEConv(mean)",
             "SAGEConv(mean,W_after)", "SAGEConv(gcn)", "SAGEConv(gcn,W_after)", "SAGEConv(pool)"]


def _dgl_expected_dtype(name: str, a: torch.dtype, x16: bool = False) -> torch.dtype:
    """The output dtype of stock DGL 2.1 under CUDA autocast (dtype ``a``), derived from its code
    (see the DGL shims' docstrings): gspmm/edge_softmax cast to ``a``; the float32 destination
    scale ("right"/"both"), the float32 bias after a float32 sum, the gcn division by float32
    degrees and an Identity residual of the float32 input give float32 (``x16``: the features
    are already ``a``, so that residual keeps ``a``). The attention is ``a``."""
    if name in ("GATv2Conv",):
        return a
    if name in ("GATv2Conv(identity_residual)", "GATConv(identity_residual,no_bias)"):
        return a if x16 else torch.float32
    if name == "GATConv(edge_weight,bias)":
        return torch.float32  # a + float32 bias (GATConv's explicit bias, without a linear residual)
    if name.startswith("GraphConv"):
        return a if "no_bias" in name else torch.float32  # none: a + float32 bias; right/both: float32
    if name.startswith("SAGEConv(gcn"):
        return torch.float32
    return a  # SAGE mean/pool: fc_self(h) + h_neigh, both a


# --------------------------------------------------------------------------- running
def _leaves(obj):
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in _leaves(item)]
    return [obj] if isinstance(obj, Tensor) and obj.is_floating_point() else []


def _cast(obj, dtype, device):
    if isinstance(obj, (tuple, list)):
        return type(obj)(_cast(o, dtype, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _cast(v, dtype, device) for k, v in obj.items()}
    if isinstance(obj, Tensor):
        obj = obj.to(device)
        return obj.to(dtype) if obj.is_floating_point() and dtype is not None else obj
    return obj


class Result:
    """Float output leaves, the input gradient and the parameter gradients of one run."""

    def __init__(self, outs, x_grad, grads):
        self.outs, self.x_grad, self.grads = outs, x_grad, grads

    def tensors(self):
        return [("out", i, t) for i, t in enumerate(self.outs)] + [("x.grad", 0, self.x_grad)] + \
               [(name, 0, g) for name, g in self.grads.items()]


def _run(module, call, x, *, device, mode, dtype, framework=None, graph=None):
    """One forward and backward. ``mode``: "autocast" (float32 module and inputs under
    ``torch.autocast(device, dtype)``), "autocast_x16" (the same with 16-bit node features, as
    a second layer receives them), "module" (module and inputs in ``dtype``, no autocast) or
    "float64"; ``framework`` set: run under ``enable()``."""
    m = copy.deepcopy(module)
    cast = {"autocast": None, "autocast_x16": None, "module": dtype, "float64": torch.float64}[mode]
    m = m.to(device) if cast is None else m.to(device=device, dtype=cast)
    x = _cast(x, dtype if mode == "autocast_x16" else cast, device).detach().requires_grad_(True)
    args, kwargs = _cast(call, cast, device)
    autocast = mode.startswith("autocast")
    ctx = torch.autocast(device.type, dtype=dtype) if autocast else contextlib.nullcontext()
    switch = (gnn_fastpath.enabled(frameworks=framework, cpu="reference") if framework
              else contextlib.nullcontext())
    with warnings.catch_warnings():
        if framework:
            warnings.simplefilter("error", FastpathFallbackWarning)
        with ctx, switch:
            out = m(graph, x, *args, **kwargs) if graph is not None else m(x, *args, **kwargs)
    leaves = _leaves(out)
    gen = torch.Generator().manual_seed(7)
    loss = sum((t.double() * torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.device)).sum()
               for t in leaves if t.requires_grad)
    loss.backward()
    grads = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
    return Result([t.detach() for t in leaves], x.grad, grads)


def _err(actual: Tensor, ref: Tensor) -> float:
    """max |actual - ref| / max |ref| (absolute where ref is all zeros)."""
    assert actual.shape == ref.shape
    if ref.numel() == 0:
        return 0.0
    a, r = actual.detach().double().cpu(), ref.detach().double().cpu()
    diff = (a - r).abs().max().item()
    scale = r.abs().max().item()
    return diff / scale if scale > 0 else diff


def _check_dtypes(fused: Result, stock: Result):
    assert [t.dtype for t in fused.outs] == [t.dtype for t in stock.outs], "output dtypes"
    assert fused.x_grad.dtype == stock.x_grad.dtype, "x.grad dtype"
    assert fused.grads.keys() == stock.grads.keys()
    for name, g in stock.grads.items():
        assert fused.grads[name].dtype == g.dtype, f"grad of {name}: {fused.grads[name].dtype} != {g.dtype}"


def _check_accuracy(fused: Result, stock: Result, ref: Result, u: float):
    """Fused error vs float64 <= FACTOR * stock's error + SLACK * u, tensor by tensor."""
    for (what, i, f), (_, _, s), (_, _, r) in zip(fused.tensors(), stock.tensors(), ref.tensors()):
        ef, es = _err(f, r), _err(s, r)
        assert ef <= FACTOR * es + SLACK * u, (f"{what}[{i}]: fused error {ef:.3e} > {FACTOR} x stock's "
                                               f"{es:.3e} + {SLACK}u")


def _fused_count(key: str, backend: str) -> int:
    return gnn_fastpath.stats().get(key, {"fused": {}})["fused"].get(backend, 0)


def _compare_pyg(name, device, mode, dtype, backend):
    module_factory, call, kwargs = _pyg_cases()[name]
    torch.manual_seed(0)
    module = module_factory()
    x = torch.randn(N, F_IN)
    call = (call, kwargs)
    stock = _run(module, call, x, device=device, mode=mode, dtype=dtype)
    key = f"pyg.{type(module).__name__}"
    gnn_fastpath.reset_stats()
    fused = _run(module, call, x, device=device, mode=mode, dtype=dtype, framework="pyg")
    stats = gnn_fastpath.stats()[key]
    assert stats["fused"].get(backend, 0) == 1 and not stats["fallback"], stats
    # the float64 evaluation of the same module: for a half module, of its rounded parameters
    half_module = mode == "module"
    base = copy.deepcopy(module).to(dtype) if half_module else module
    x64 = x if mode == "autocast" else x.to(dtype)
    ref = _run(base, _cast(call, dtype if half_module else None, "cpu"), x64, device=device,
               mode="float64", dtype=dtype)
    _check_dtypes(fused, stock)
    _check_accuracy(fused, stock, ref, UNIT[dtype])
    return fused, stock


@pytest.fixture(autouse=True)
def _clean(clean_fastpath):
    yield


# =========================================================================== CPU (CI)
CPU = torch.device("cpu")


@pytest.mark.parametrize("name", PYG_CASES)
@pytest.mark.parametrize("dtype", HALF)
def test_pyg_half_module_cpu(pyg, name, dtype):
    fused, _ = _compare_pyg(name, CPU, "module", dtype, "reference")
    assert all(t.dtype == dtype for t in fused.outs)
    assert fused.x_grad.dtype == dtype and all(g.dtype == dtype for g in fused.grads.values())


@pytest.mark.parametrize("name", PYG_CASES)
@pytest.mark.parametrize("mode", ["autocast", "autocast_x16"])
def test_pyg_cpu_autocast(pyg, name, mode):
    """CPU autocast (bfloat16): the shims follow stock's dtypes on the CPU too (CPU autocast
    keeps ``sum``/``exp`` in bf16, so e.g. TransformerConv's aggregate is bf16 there, float32
    under CUDA autocast); with bf16 features and float32 parameters too (a second layer)."""
    _compare_pyg(name, CPU, mode, torch.bfloat16, "reference")


def test_pyg_cpu_autocast_dtypes_follow_stock(pyg):
    """Spot-check the rules themselves: GATv2 aggregates in float32 (float32 ``att``), the
    unweighted GCN without normalisation in bf16 (no bias: bf16 out), SAGE max on the raw
    float32 input (bf16 out from ``lin_l``), TransformerConv in bf16 on the CPU."""
    expect = {"GATv2Conv": [torch.float32, torch.float32], "GCNConv(normalize=False,bias=False)": [torch.bfloat16],
              "GCNConv": [torch.float32], "SAGEConv(max)": [torch.bfloat16],
              "SAGEConv(min,project,normalize)": [torch.bfloat16],
              "TransformerConv": [torch.bfloat16, torch.bfloat16]}
    for name, dtypes in expect.items():
        fused, _ = _compare_pyg(name, CPU, "autocast", torch.bfloat16, "reference")
        assert [t.dtype for t in fused.outs] == dtypes, name
        assert fused.x_grad.dtype == torch.float32


def test_pyg_sparse_adjacency_with_other_dtype_runs_stock(pyg):
    """Stock multiplies a torch.sparse adjacency's float32 values by bf16 ``lin(x)`` under
    autocast: that product is stock's to decide (on the CPU it raises), reason "dtype"."""
    from torch_geometric.nn import GCNConv

    ei = _edge_index()
    adj = torch.sparse_coo_tensor(ei.flip(0), torch.rand(ei.size(1)), (N, N)).coalesce()
    conv, x = GCNConv(F_IN, 8), torch.randn(N, F_IN)
    with torch.autocast("cpu", dtype=torch.bfloat16), gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                conv(x, adj)
            except (NotImplementedError, RuntimeError):
                pass  # stock's own error
    assert gnn_fastpath.stats()["pyg.GCNConv"]["fallback"] == {"dtype": 1}


def test_result_dtype_rules():
    from gnn_fastpath.integrations.shim import linear_dtype, result_dtype

    def softmax_message(x, a):
        e = ((x * a).sum(-1) - 0).exp()
        return e, x * e.unsqueeze(-1)

    f32, bf16 = torch.float32, torch.bfloat16
    assert result_dtype(softmax_message, CPU, bf16, f32) == (f32, f32)
    assert result_dtype(softmax_message, CPU, bf16, bf16) == (bf16, bf16)
    x, w = torch.empty(0, 3), torch.empty(4, 3)
    assert linear_dtype(x, w) == f32
    with torch.autocast("cpu", dtype=bf16):
        assert linear_dtype(x, w) == bf16  # memoised per autocast state
    assert linear_dtype(x, w) == f32


@pytest.mark.dgl
@pytest.mark.parametrize("name", DGL_CASES)
def test_dgl_bf16_module_cpu(dgl, name):
    g, cases = _dgl_cases(dgl)
    factory, width, kwargs = cases[name]
    torch.manual_seed(0)
    module = factory()
    x = torch.randn(N, width)
    call = ((), kwargs)
    dtype = torch.bfloat16
    stock = _run(module, call, x, device=CPU, mode="module", dtype=dtype, graph=g)
    key = f"dgl.{type(module).__name__}"
    gnn_fastpath.reset_stats()
    fused = _run(module, call, x, device=CPU, mode="module", dtype=dtype, framework="dgl", graph=g)
    assert _fused_count(key, "reference") == 1, gnn_fastpath.stats()
    ref = _run(copy.deepcopy(module).to(dtype), _cast(call, dtype, CPU), x.to(dtype), device=CPU, mode="float64",
               dtype=dtype, graph=g)
    _check_dtypes(fused, stock)
    assert all(t.dtype == dtype for t in fused.outs)
    _check_accuracy(fused, stock, ref, UNIT[dtype])


@pytest.mark.dgl
def test_dgl_float16_cpu_and_cpu_autocast_run_stock(dgl):
    """DGL 2.1 has no float16 CPU kernels (stock raises: reason "dtype"); under CPU autocast
    DGL's sparse ops do not cast (stock mixes dtypes: reason "autocast", one warning)."""
    from dgl.nn import GraphConv, SAGEConv

    g = _dgl_graph(dgl)
    conv = GraphConv(F_IN, 8).half()
    with gnn_fastpath.enabled(frameworks="dgl", cpu="reference"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception):
            conv(g, torch.randn(N, F_IN, dtype=torch.float16))
    assert gnn_fastpath.stats()["dgl.GraphConv"]["fallback"] == {"dtype": 1}

    sage, x = SAGEConv(F_IN, 8, "mean"), torch.randn(N, F_IN)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = sage(g, x)
        with gnn_fastpath.enabled(frameworks="dgl", cpu="reference"), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = [sage(g, x) for _ in range(2)]
    ours = [w for w in caught if issubclass(w.category, FastpathFallbackWarning)]
    assert len(ours) == 1 and "autocast" in str(ours[0].message)
    assert gnn_fastpath.stats()["dgl.SAGEConv"]["fallback"] == {"autocast": 2}
    for t in got:
        assert t.dtype == want.dtype
        torch.testing.assert_close(t, want)


def test_float64_cpu_runs_stock_with_reason_dtype(pyg):
    from torch_geometric.nn import GATv2Conv

    conv = GATv2Conv(F_IN, 8, heads=2).double()
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        conv(torch.randn(N, F_IN, dtype=torch.float64), _edge_index())
    assert gnn_fastpath.stats()["pyg.GATv2Conv"]["fallback"] == {"dtype": 1}


# =========================================================================== GPU
CUDA = torch.device("cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("name", PYG_CASES)
@pytest.mark.parametrize("mode", ["autocast", "autocast_x16", "module"])
@pytest.mark.parametrize("dtype", HALF)
def test_pyg_gpu(pyg, name, mode, dtype):
    """Stock vs enable() on the GPU, under ``torch.autocast("cuda", dtype)`` (float32 or 16-bit
    features) and as a half module: stock's dtypes, accuracy vs float64 (module docstring),
    counted fused on "cuda"."""
    fused, _ = _compare_pyg(name, CUDA, mode, dtype, "cuda")
    if mode != "module" and name.startswith(("GATv2Conv", "TransformerConv")):
        # measured stock behaviour (benchmarks/results/2026-11-25-h200-autocast-dtypes.json)
        assert all(t.dtype == torch.float32 for t in fused.outs)


@pytest.mark.cuda
@pytest.mark.dgl
@pytest.mark.parametrize("name", DGL_CASES)
@pytest.mark.parametrize("mode", ["autocast", "autocast_x16", "module"])
@pytest.mark.parametrize("dtype", HALF)
def test_dgl_gpu(dgl, name, mode, dtype):
    """enable() on CUDA features (CPU DGL graph) vs the float64 module on the CPU; dtypes from
    the rule derived from DGL's code (stock DGL cannot run CUDA features here)."""
    g, cases = _dgl_cases(dgl)
    factory, width, kwargs = cases[name]
    torch.manual_seed(0)
    module = factory()
    x = torch.randn(N, width)
    call = ((), kwargs)
    key = f"dgl.{type(module).__name__}"
    fused = _run(module, call, x, device=CUDA, mode=mode, dtype=dtype, framework="dgl", graph=g)
    assert _fused_count(key, "cuda") == 1 and not gnn_fastpath.stats()[key]["fallback"], gnn_fastpath.stats()
    half_module = mode == "module"
    base = copy.deepcopy(module).to(dtype) if half_module else module
    ref = _run(base, _cast(call, dtype if half_module else None, CPU), x if mode == "autocast" else x.to(dtype),
               device=CPU, mode="float64", dtype=dtype, graph=g)
    expected = dtype if half_module else _dgl_expected_dtype(name, dtype, x16=mode == "autocast_x16")
    assert fused.outs[0].dtype == expected
    if len(fused.outs) > 1:  # get_attention: stock's edge_softmax output, in the autocast / module dtype
        assert fused.outs[1].dtype == dtype
    assert fused.x_grad.dtype == (torch.float32 if mode == "autocast" else dtype)
    for name_, p in base.named_parameters():
        assert fused.grads[name_].dtype == p.dtype
    u = UNIT[dtype]
    if half_module and dtype == torch.bfloat16:  # stock DGL runs bf16 on the CPU: hold the GPU to it
        stock = _run(module, call, x, device=CPU, mode="module", dtype=dtype, graph=g)
        _check_dtypes(fused, stock)
        _check_accuracy(fused, stock, ref, u)
    refs = dict(((w, j), s) for w, j, s in ref.tensors())
    for what, i, t in fused.tensors():
        if what == "out" or what == "x.grad":
            bound = (DGL_BOUND if what == "out" else DGL_GRAD_BOUND) * u
            assert _err(t, refs[(what, i)]) <= bound, f"{what}[{i}]: error {_err(t, refs[(what, i)]):.3e} > {bound:.3e}"
    # Parameter gradients as one vector: a bias gradient (e.g. GATv2Conv.fc_dst.bias) sums
    # softmax-gradient terms over every edge that cancel, so measured against its own largest
    # entry its 16-bit error has no bounded condition number (seen: 0.64 for one bf16 entry
    # whose terms are 100x larger); against the layer's whole parameter gradient it is bounded.
    names = sorted(fused.grads)
    got = torch.cat([fused.grads[n].detach().double().cpu().flatten() for n in names])
    want = torch.cat([refs[(n, 0)].detach().double().cpu().flatten() for n in names])
    assert _err(got, want) <= DGL_GRAD_BOUND * u, f"parameter gradients: error {_err(got, want):.3e}"


@pytest.mark.cuda
def test_float64_cuda_runs_stock_with_reason_dtype(pyg):
    from torch_geometric.nn import GATv2Conv, SAGEConv

    for conv in (GATv2Conv(F_IN, 8, heads=2), SAGEConv(F_IN, 8, aggr="max")):
        conv = conv.to(CUDA, torch.float64)
        x = torch.randn(N, F_IN, dtype=torch.float64, device=CUDA)
        want = conv(x, _edge_index().to(CUDA))
        with gnn_fastpath.enabled(frameworks="pyg"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = conv(x, _edge_index().to(CUDA))
        torch.testing.assert_close(got, want)
        assert gnn_fastpath.stats()[f"pyg.{type(conv).__name__}"]["fallback"] == {"dtype": 1}


@pytest.mark.cuda
@pytest.mark.dgl
def test_dgl_float64_cuda_runs_stock_with_reason_dtype(dgl):
    from dgl.nn import GraphConv

    g = _dgl_graph(dgl)
    conv = GraphConv(F_IN, 8).to(CUDA, torch.float64)
    with gnn_fastpath.enabled(frameworks="dgl"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.suppress(Exception):  # stock DGL (CPU build) cannot run CUDA features
            conv(g, torch.randn(N, F_IN, dtype=torch.float64, device=CUDA))
    assert gnn_fastpath.stats()["dgl.GraphConv"]["fallback"] == {"dtype": 1}
