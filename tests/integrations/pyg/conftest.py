"""Fixtures and the stock-vs-fused comparison shared by the PyG shim tests.

Every comparison runs the stock module and a deep copy of it under
``gnn_fastpath.enabled(frameworks="pyg", cpu="reference")`` on cloned inputs, then checks
outputs, every parameter gradient and every input gradient (within 1e-5 relative, fp32),
that the fused path ran, and that nothing fell back.
"""
from __future__ import annotations

import copy
import os
import warnings

import numpy as np
import pytest
import torch
from torch import Tensor

import gnn_fastpath
from gnn_fastpath import FastpathFallbackWarning

RTOL = 1e-5
#: Gradients are compared relative to at least this fraction of the largest gradient of the
#: run: some are mathematically zero (a key bias shifts every logit of a softmax equally)
#: and come out as float cancellation noise on either path.
GRAD_FLOOR = 1e-2


@pytest.fixture(autouse=True)
def _fresh_fastpath(pyg):
    """Every test starts and ends with the switch off and the counters cleared."""
    gnn_fastpath.disable()
    gnn_fastpath.reset_stats()
    yield
    gnn_fastpath.disable()
    gnn_fastpath.reset_stats()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tensors here are tiny: one intra-op thread avoids OpenMP hand-off costs that
    dominate on a shared 2-core CI box (a 20x20 linear took 0.6 ms with 2 threads)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# --------------------------------------------------------------------------- real graphs
@pytest.fixture(scope="session")
def tolokers(shared_data):
    """(x [N, 10], edge_index) of Tolokers induced on its first 1,500 nodes (CPU-sized)."""
    path = os.path.join(shared_data, "heterophilous", "tolokers.npz")
    if not os.path.exists(path):
        pytest.skip(f"Tolokers not found at {path}")
    data = np.load(path)
    n = 1500
    pairs = torch.from_numpy(data["edges"]).t()
    pairs = pairs[:, (pairs < n).all(0)]
    edge_index = torch.cat([pairs, pairs.flip(0)], 1)
    x = torch.from_numpy(data["node_features"][:n]).float()
    return x, edge_index


# --------------------------------------------------------------------------- comparison
def leaves(obj):
    """Tensors in a (nested) tuple/list output, in order."""
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in leaves(item)]
    return [obj]


def clone_inputs(obj):
    """Fresh copies of the inputs; float tensors that required grad become fresh leaves."""
    if isinstance(obj, tuple):
        return tuple(clone_inputs(o) for o in obj)
    if isinstance(obj, list):
        return [clone_inputs(o) for o in obj]
    if isinstance(obj, dict):
        return {k: clone_inputs(v) for k, v in obj.items()}
    if isinstance(obj, Tensor) and obj.is_floating_point() and obj.layout == torch.strided:
        return obj.detach().clone().requires_grad_(obj.requires_grad)
    if isinstance(obj, Tensor) and obj.layout != torch.strided:
        return obj.clone()  # stock flags a COO adjacency coalesced in place: keep runs apart
    return obj


def assert_rel_close(actual: Tensor, expected: Tensor, what: str, rtol: float = RTOL, floor: float = 0.0) -> None:
    """max |actual - expected| <= rtol * max(max |expected|, floor)."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if expected.numel() == 0:
        return
    a, e = actual.detach().double(), expected.detach().double()
    assert torch.equal(torch.isnan(a), torch.isnan(e)), f"{what}: NaN pattern differs"
    a, e = a.nan_to_num(), e.nan_to_num()
    err = (a - e).abs().max().item()
    scale = e.abs().max().item()
    assert err <= rtol * max(scale, floor), f"{what}: max |diff| {err:.3e} vs max |expected| {scale:.3e}"


def assert_same_output(actual, expected, what="output", rtol: float = RTOL) -> None:
    """Same structure; index tensors equal (and of the same type); floats close."""
    la, le = leaves(actual), leaves(expected)
    assert len(la) == len(le), f"{what}: {len(la)} leaves != {len(le)}"
    assert type(actual) is type(expected)
    for i, (a, e) in enumerate(zip(la, le)):
        name = f"{what}[{i}]"
        assert type(a) is type(e), f"{name}: {type(a).__name__} != {type(e).__name__}"
        if not isinstance(e, Tensor):
            assert a == e, name
            continue
        assert a.layout == e.layout, f"{name}: layout {a.layout} != {e.layout}"
        if e.layout != torch.strided:
            a, e = a.to_dense(), e.to_dense()
        if e.is_floating_point():
            assert_rel_close(a, e, name, rtol)
        else:
            assert torch.equal(a, e), f"{name}: index tensors differ"
            size = getattr(e, "sparse_size", None)
            if callable(size):
                assert a.sparse_size() == size(), f"{name}: EdgeIndex sparse sizes differ"


def _loss(out) -> Tensor:
    """A scalar touching every float output with fixed pseudo-random weights."""
    total = 0.0
    for i, t in enumerate(leaves(out)):
        if isinstance(t, Tensor) and t.is_floating_point() and t.layout == torch.strided and t.requires_grad:
            gen = torch.Generator().manual_seed(1000 + i)
            total = total + (t * torch.randn(t.shape, generator=gen, dtype=t.dtype)).sum()
    return total


def _run(module, args, kwargs, backward: bool):
    args, kwargs = clone_inputs(args), clone_inputs(kwargs)
    module.zero_grad(set_to_none=True)
    out = module(*args, **kwargs)
    grads = {}
    if backward:
        loss = _loss(out)
        if isinstance(loss, Tensor):
            loss.backward()
        grads = {f"param {n}": p.grad for n, p in module.named_parameters()}
        for i, t in enumerate(leaves(list(args) + list(kwargs.values()))):
            if isinstance(t, Tensor) and t.requires_grad:
                grads[f"input {i}"] = t.grad
    return out, grads


def compare(module, *args, backward: bool = True, rtol: float = RTOL, stock_inputs=None, **kwargs):
    """Stock vs fused on deep copies of ``module``; returns (stock module, fused module, fused out).

    ``stock_inputs``: ``(args, kwargs)`` for the stock run when they must differ (default:
    the same inputs).
    """
    stock_module, fused_module = copy.deepcopy(module), copy.deepcopy(module)
    expected, expected_grads = _run(stock_module, *(stock_inputs or (args, kwargs)), backward)
    key = f"pyg.{type(module).__name__}"
    before = gnn_fastpath.stats().get(key, {"fused": {"reference": 0}, "fallback": {}})
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastpathFallbackWarning)
        with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
            actual, actual_grads = _run(fused_module, args, kwargs, backward)
    counts = gnn_fastpath.stats()[key]
    assert counts["fused"]["reference"] > before["fused"]["reference"], counts
    assert counts["fallback"] == before["fallback"], counts
    assert_same_output(actual, expected, rtol=rtol)
    assert actual_grads.keys() == expected_grads.keys()
    floor = GRAD_FLOOR * max([g.abs().max().item() for g in expected_grads.values()
                              if g is not None and g.numel()] + [0.0])
    for name, e in expected_grads.items():
        a = actual_grads[name]
        assert (a is None) == (e is None), f"grad of {name}: {a is None} vs {e is None}"
        if e is not None:
            assert_rel_close(a, e, f"grad of {name}", rtol, floor)
    return stock_module, fused_module, actual


def expect_fallback(module, *args, reason: str, cpu: str = "reference", calls: int = 2, **kwargs):
    """The enabled module runs stock: same result (or the same exception) as stock, one
    warning for ``reason`` over ``calls`` calls, each call counted under ``reason``."""
    # A subclass counts under the PyG class it derives from (the patched one).
    key = next(f"pyg.{cls.__name__}" for cls in type(module).__mro__
               if cls.__module__.startswith("torch_geometric."))
    stock_module, fused_module = copy.deepcopy(module), copy.deepcopy(module)

    def call(m):
        torch.manual_seed(0)
        try:
            return m(*clone_inputs(args), **clone_inputs(kwargs)), None
        except Exception as exc:  # noqa: BLE001 - the stock error is part of the contract
            return None, exc

    expected = [call(stock_module) for _ in range(calls)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gnn_fastpath.enabled(frameworks="pyg", cpu=cpu):
            actual = [call(fused_module) for _ in range(calls)]
    ours = [w for w in caught if issubclass(w.category, FastpathFallbackWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert f"({reason}" in str(ours[0].message), str(ours[0].message)
    counts = gnn_fastpath.stats()[key]
    assert counts["fallback"] == {reason: calls}, counts
    assert counts["fused"] == {"cuda": 0, "reference": 0}, counts
    for (out, exc), (ref, ref_exc) in zip(actual, expected):
        if ref_exc is not None:
            assert type(exc) is type(ref_exc) and str(exc) == str(ref_exc), (exc, ref_exc)
        else:
            assert exc is None, exc
            assert_same_output(out, ref, rtol=0.0)
    return stock_module, fused_module


@pytest.fixture
def check():
    """The comparison helpers: ``check.compare(...)``, ``check.fallback(...)``."""

    class Check:
        pass

    c = Check()
    c.compare = compare
    c.fallback = expect_fallback
    c.same = assert_same_output
    c.close = assert_rel_close
    c.clone = clone_inputs
    return c


# --------------------------------------------------------------------------- graph inputs
def make_graph(kind: str, n_src: int, n_dst: int, m: int, seed: int = 0, *, loops: bool = True):
    """(edge_index-like input, number of edges) of one of the input kinds PyG accepts.

    ``kind``: ``"tensor"``, ``"edge_index_obj"`` (PyG EdgeIndex), ``"coo"``, ``"csr"``
    (torch.sparse adj_t [n_dst, n_src]), ``"int32"`` (an int32 edge_index).
    """
    from zoo import random_edges

    edge_index, _ = random_edges(n_src, n_dst, m, seed, self_loops=loops, empty_rows=2)
    if kind == "tensor":
        return edge_index, edge_index.size(1)
    if kind == "int32":
        return edge_index.to(torch.int32), edge_index.size(1)
    if kind == "edge_index_obj":
        from torch_geometric import EdgeIndex

        return EdgeIndex(edge_index, sparse_size=(n_src, n_dst)), edge_index.size(1)
    adj = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(edge_index.size(1)), (n_dst, n_src)).coalesce()
    if kind == "csr":
        adj = adj.to_sparse_csr()
    return adj, adj._nnz()


@pytest.fixture
def graph_input():
    return make_graph
