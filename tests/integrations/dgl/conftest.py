"""Fixtures for the DGL shim tests: graphs of every shape, stock-vs-fused comparison, data.

Everything here is reached through fixtures (``h`` for the helpers), so the test modules
import nothing from this file.
"""
from __future__ import annotations

import contextlib
import copy
import os
import types
import warnings

import numpy as np
import pytest
import torch

import gnn_fastpath
from zoo import random_edges

#: Tolerance of every stock-vs-fused comparison (fp32): relative to the reference's scale.
RTOL = 1e-5


def fused(cpu: str = "reference"):
    """The switch as the tests use it (only the DGL shims, so PyG's state does not matter)."""
    return gnn_fastpath.enabled(frameworks="dgl", cpu=cpu)


@pytest.fixture(autouse=True)
def _fresh_stats():
    gnn_fastpath.disable()
    gnn_fastpath.reset_stats()
    yield
    gnn_fastpath.disable()


# --------------------------------------------------------------------------- tie rules
def dgl_rule(message: str, broadcast: bool = False) -> str:
    """The tie rule the DGL build running these tests follows on the CPU (probed)."""
    from gnn_fastpath.integrations.dgl import ties

    return ties.tie_break(torch.device("cpu"), message, broadcast)


def other_rule(rule: str) -> str:
    """The other one-edge tie rule: forcing it must change the gradients of tied inputs."""
    return {"first": "last", "last": "first"}[rule]


# --------------------------------------------------------------------------- graphs
def _split(edge_index, idtype):
    return edge_index[0].to(idtype), edge_index[1].to(idtype)


def homo(dgl, n=40, m=160, seed=0, idtype=torch.int64, empty_rows=0, self_loops=True, duplicates=True):
    ei, _ = random_edges(n, n, m, seed, empty_rows=empty_rows, self_loops=self_loops, duplicates=duplicates)
    return dgl.graph(_split(ei, idtype), num_nodes=n, idtype=idtype)


def bipartite(dgl, n_src=30, n_dst=20, m=120, seed=1, idtype=torch.int64, empty_rows=0):
    ei, _ = random_edges(n_src, n_dst, m, seed, empty_rows=empty_rows)
    return dgl.heterograph({("_U", "_E", "_V"): _split(ei, idtype)},
                           num_nodes_dict={"_U": n_src, "_V": n_dst}, idtype=idtype)


def create_block(dgl, n_src=30, n_dst=12, m=100, seed=2, idtype=torch.int64, empty_rows=0):
    ei, _ = random_edges(n_src, n_dst, m, seed, empty_rows=empty_rows)
    return dgl.create_block(_split(ei, idtype), num_src_nodes=n_src, num_dst_nodes=n_dst, idtype=idtype)


def to_block(dgl, n=50, m=220, seed=3, n_seeds=15, idtype=torch.int64, empty_rows=0):
    """A message-flow block: the in-edges of some seed nodes, compacted by dgl.to_block."""
    g = homo(dgl, n, m, seed, idtype, empty_rows=empty_rows)
    seeds = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:n_seeds]
    if empty_rows:  # keep a zero-in-degree destination among the seeds
        seeds = torch.cat([seeds[seeds < n - empty_rows][: n_seeds - 1], torch.tensor([n - 1])])
    frontier = dgl.in_subgraph(g, seeds.to(idtype))
    return dgl.to_block(frontier, seeds.to(idtype))


#: Graph kinds of the grids: (builder, whether the layer takes a (src, dst) feature pair).
KINDS = {
    "homo": (lambda dgl, **k: homo(dgl, empty_rows=3, **k), False),
    "homo_int32": (lambda dgl, **k: homo(dgl, idtype=torch.int32, seed=5, **k), False),
    "bipartite_pair": (lambda dgl, **k: bipartite(dgl, empty_rows=2, **k), True),
    "create_block": (lambda dgl, **k: create_block(dgl, empty_rows=1, **k), False),
    "create_block_pair": (lambda dgl, **k: create_block(dgl, idtype=torch.int32, **k), True),
    "to_block": (lambda dgl, **k: to_block(dgl, empty_rows=2, **k), False),
}


def multi_etype(dgl, n=10):
    g = torch.Generator().manual_seed(7)
    a = (torch.randint(0, n, (30,), generator=g), torch.randint(0, n, (30,), generator=g))
    b = (torch.randint(0, n, (20,), generator=g), torch.randint(0, n, (20,), generator=g))
    return dgl.heterograph({("n", "a", "n"): a, ("n", "b", "n"): b}, num_nodes_dict={"n": n})


# --------------------------------------------------------------------------- comparison
def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def features(g, in_feats, pair: bool, seed=10, dtype=torch.float32):
    """Input features for ``g``: one tensor [N_src, F] or a pair ([N_src, F_src], [N_dst, F_dst])."""
    if pair:
        f_src, f_dst = in_feats if isinstance(in_feats, tuple) else (in_feats, in_feats)
        return (randn(g.num_src_nodes(), f_src, seed=seed, dtype=dtype),
                randn(g.num_dst_nodes(), f_dst, seed=seed + 1, dtype=dtype))
    return randn(g.num_src_nodes(), in_feats, seed=seed, dtype=dtype)


def leaves_of(feat):
    return list(feat) if isinstance(feat, tuple) else [feat]


def run(module, g, feat, kwargs=None, mode=None, seed=123, grad=True):
    """Call ``module(g, feat, **kwargs)`` stock (mode None) or under ``fused(mode)``.

    Inputs are cloned into fresh leaves, the RNG is reseeded before the call (so feature
    dropout draws the same numbers both ways). Returns (outputs tuple, gradients of a fixed
    random projection of all outputs w.r.t. every parameter, the features and the tensor
    kwargs that require grad).
    """
    kwargs = dict(kwargs or {})
    clone = lambda t: t.detach().clone().requires_grad_(t.is_floating_point())  # noqa: E731
    feat = tuple(clone(t) for t in feat) if isinstance(feat, tuple) else clone(feat)
    leaves = leaves_of(feat)
    for key, value in list(kwargs.items()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            kwargs[key] = clone(value)
            leaves.append(kwargs[key])
    torch.manual_seed(seed)
    ctx = contextlib.nullcontext() if mode is None else fused(mode)
    with ctx:
        out = module(g, feat, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    if not grad:
        return outs, None
    loss = sum((o * randn(*o.shape, seed=99 + i, dtype=o.dtype).to(o.device)).sum() for i, o in enumerate(outs))
    params = [p for p in module.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params + leaves, allow_unused=True)
    return outs, grads


def assert_close(actual, expected, what="", rtol=RTOL):
    if expected is None or actual is None:
        assert actual is None and expected is None, f"{what}: one gradient is None"
        return
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    actual = actual.detach().cpu()
    expected = expected.detach().cpu()
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * max(scale, 1e-3), msg=lambda m: f"{what}: {m}")


def compare(module, g, feat, kwargs=None, mode="reference", seed=123):
    """Stock vs fused on the same module and inputs: outputs and all gradients close."""
    ref_out, ref_grads = run(module, g, feat, kwargs, None, seed)
    out, grads = run(module, g, feat, kwargs, mode, seed)
    assert len(out) == len(ref_out)
    for i, (a, b) in enumerate(zip(out, ref_out)):
        assert_close(a, b, f"output {i}")
    names = [n for n, p in module.named_parameters() if p.requires_grad]
    names += [f"input {i}" for i in range(len(grads) - len(names))]
    for name, a, b in zip(names, grads, ref_grads):
        assert_close(a, b, f"grad of {name}")
    return out


def graph_state(g):
    """Everything a fused call must leave alone: the feature frames' keys and tensors."""
    state = {}
    for name in ("srcdata", "dstdata", "edata"):
        frame = getattr(g, name)
        state[name] = {k: v for k, v in frame.items()}
    return state


def same_graph_state(before, after) -> bool:
    if before.keys() != after.keys():
        return False
    for name in before:
        if before[name].keys() != after[name].keys():
            return False
        if any(before[name][k] is not after[name][k] and not torch.equal(before[name][k], after[name][k])
               for k in before[name]):
            return False
    return True


def fallback_case(module, g, feat, reason, key, kwargs=None, expect_error=None, cpu="reference"):
    """Under fused(cpu): identical to stock (or the same error), one warning, counted per call."""
    if expect_error is None:
        ref, _ = run(module, g, feat, kwargs, None, grad=False)
    else:
        with pytest.raises(expect_error) as ref_exc:
            run(module, g, feat, kwargs, None, grad=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            if expect_error is None:
                out, _ = run(module, g, feat, kwargs, cpu, grad=False)
                for a, b in zip(out, ref):
                    assert torch.equal(a, b)
            else:
                with pytest.raises(expect_error) as exc:
                    run(module, g, feat, kwargs, cpu, grad=False)
                assert str(exc.value) == str(ref_exc.value)
    mine = [w for w in caught if issubclass(w.category, gnn_fastpath.FastpathFallbackWarning)]
    assert len(mine) == 1, [str(w.message) for w in mine]
    assert key in str(mine[0].message) and reason in str(mine[0].message)
    counts = gnn_fastpath.stats()[key]
    assert counts["fallback"] == {reason: 2}, counts
    assert counts["fused"] == {"cuda": 0, "reference": 0}, counts


def fused_count(key, backend="reference"):
    return gnn_fastpath.stats().get(key, {}).get("fused", {}).get(backend, 0)


def cuda_copy(module):
    return copy.deepcopy(module).cuda()


def check_cpu_graph_cuda_features(dgl, module, g, feat, kwargs, key, op):
    """A CPU DGL graph with CUDA features under enable(): matches stock run on CPU copies
    (DGL's PyPI build has no CUDA, so stock cannot run the mix) and ran fused on CUDA; without
    kernels for ``op`` the shim falls back and stock raises DGL's device error."""
    ref_out, ref_grads = run(module, g, feat, kwargs)
    gpu = cuda_copy(module)
    feat_gpu = tuple(t.cuda() for t in feat) if isinstance(feat, tuple) else feat.cuda()
    kwargs_gpu = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in (kwargs or {}).items()}
    if op in gnn_fastpath.ops.dispatch.OPS:
        out, grads = run(gpu, g, feat_gpu, kwargs_gpu, mode="stock")
        for a, b in zip(out, ref_out):
            assert a.is_cuda
            assert_close(a, b, "output")
        for a, b in zip(grads, ref_grads):
            assert_close(a, b, "gradient")
        assert gnn_fastpath.stats()[key]["fused"]["cuda"] > 0
    else:
        with pytest.raises(dgl.DGLError):
            run(gpu, g, feat_gpu, kwargs_gpu, mode="stock")
        assert gnn_fastpath.stats()[key]["fallback"] == {"no_kernel": 1}
    assert g.device.type == "cpu"


# --------------------------------------------------------------------------- data
def cora(dgl, shared_data):
    """Cora as a DGL graph with self loops plus features, from the raw Planetoid files."""
    folder = os.path.join(shared_data, "planetoid")
    if not os.path.exists(os.path.join(folder, "ind.cora.graph")):
        pytest.skip(f"Cora's raw Planetoid files are not in {folder}")
    try:
        from torch_geometric.io import read_planetoid_data
    except ImportError:
        pytest.skip("torch_geometric (the Planetoid reader) is not installed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = read_planetoid_data(folder, "cora")
    g = dgl.graph((data.edge_index[0], data.edge_index[1]), num_nodes=data.num_nodes)
    g = dgl.add_self_loop(dgl.remove_self_loop(g))
    return g, data.x.float()


def tolokers(dgl, shared_data, n_nodes=2500):
    """The Tolokers graph induced on its first ``n_nodes`` nodes (CPU-sized), both directions."""
    path = os.path.join(shared_data, "heterophilous", "tolokers.npz")
    if not os.path.exists(path):
        pytest.skip(f"tolokers.npz is not at {path}")
    z = np.load(path)
    pairs = torch.from_numpy(z["edges"])
    pairs = pairs[(pairs < n_nodes).all(1)]
    src = torch.cat([pairs[:, 0], pairs[:, 1]])
    dst = torch.cat([pairs[:, 1], pairs[:, 0]])
    g = dgl.graph((src, dst), num_nodes=n_nodes)
    x = torch.from_numpy(z["node_features"][:n_nodes]).float()
    return g, x


@pytest.fixture
def h():
    """The helpers above, as one namespace."""
    return types.SimpleNamespace(
        homo=homo, bipartite=bipartite, create_block=create_block, to_block=to_block, KINDS=KINDS,
        multi_etype=multi_etype, randn=randn, features=features, run=run, compare=compare,
        assert_close=assert_close, graph_state=graph_state, same_graph_state=same_graph_state,
        fallback_case=fallback_case, fused=fused, fused_count=fused_count, cuda_copy=cuda_copy,
        check_cpu_graph_cuda_features=check_cpu_graph_cuda_features,
        cora=cora, tolokers=tolokers, RTOL=RTOL, dgl_rule=dgl_rule, other_rule=other_rule)
