"""GPU memory and caches under data parallelism (``cuda`` marker: skipped without the kernels).

- Every buffer a fused forward and backward needs comes from PyTorch's caching allocator,
  never from CuPy's memory pool. Under DDP one process per GPU shares the device with NCCL
  and PyTorch's allocator: memory CuPy pooled would be invisible to
  ``torch.cuda.memory_allocated``/``max_memory_allocated``, to ``empty_cache()`` and to
  PyTorch's out-of-memory handling. The test runs each patched PyG layer fused on CUDA
  (forward and backward, on a graph with a super node so the split-row work lists and their
  workspaces are built, float32 and bfloat16) with a counting allocator installed as CuPy's,
  then checks that CuPy allocated nothing (the stack of any allocation is in the failure) and
  that its default pool holds nothing (``used_bytes() == total_bytes() == 0`` when nothing else
  in the process used CuPy; otherwise unchanged).
- Graph caches are per device: the same edges on two GPUs build two Graphs, one in each
  device's LRU (``gnn_fastpath.graph.cache``, keyed by ``str(device)``), each on its own GPU
  (needs two GPUs).
"""
from __future__ import annotations

import copy
import traceback

import pytest
import torch

import gnn_fastpath

pytestmark = pytest.mark.cuda

N, F_IN, M = 3000, 64, 20000


@pytest.fixture(autouse=True)
def _fresh(pyg):
    gnn_fastpath.disable()
    gnn_fastpath.reset_stats()
    yield
    gnn_fastpath.disable()
    gnn_fastpath.reset_stats()


@pytest.fixture
def cupy_allocations():
    """The CuPy allocations made while the test runs: a list of (bytes, stack)."""
    cupy = pytest.importorskip("cupy")
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    before = (pool.used_bytes(), pool.total_bytes())
    previous = cupy.cuda.get_allocator()
    calls = []

    def counting(size):
        calls.append((size, "".join(traceback.format_stack(limit=16))))
        return previous(size)

    cupy.cuda.set_allocator(counting)
    try:
        yield calls, pool, before
    finally:
        cupy.cuda.set_allocator(previous)


def _layers():
    from torch_geometric.nn import GATv2Conv, GCNConv, SAGEConv, TransformerConv

    return {
        "pyg.GATv2Conv": GATv2Conv(F_IN, 32, heads=4),
        "pyg.TransformerConv": TransformerConv(F_IN, 32, heads=4),
        "pyg.GCNConv": GCNConv(F_IN, 64),
        "pyg.SAGEConv": [SAGEConv(F_IN, 64, aggr="mean"), SAGEConv(F_IN, 64, aggr="max")],
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_layers_allocate_nothing_through_cupy(cupy_allocations, dtype):
    from zoo import random_edges

    calls, pool, (used0, total0) = cupy_allocations
    device = torch.device("cuda")
    gnn_fastpath.graph.cache.clear_cache()  # new Graphs: first-call paths (build, timing, workspaces)
    edge_index, _ = random_edges(N, N, M, seed=1, empty_rows=3, super_node_degree=8000, device=device)
    x = torch.randn(N, F_IN, device=device, dtype=dtype, requires_grad=True)
    expected_calls = {}
    with gnn_fastpath.enabled(frameworks="pyg"):
        for key, layers in _layers().items():
            for layer in layers if isinstance(layers, list) else [layers]:
                layer = layer.to(device=device, dtype=dtype)
                out = layer(x, edge_index)
                out.float().square().sum().backward()
                expected_calls[key] = expected_calls.get(key, 0) + 1
        torch.cuda.synchronize()
    stats = gnn_fastpath.stats()
    for key, n in expected_calls.items():
        assert stats[key] == {"fused": {"cuda": n, "reference": 0}, "fallback": {}}, stats
    assert not calls, (f"{len(calls)} CuPy allocation(s) ({sum(s for s, _ in calls)} bytes); the first from:\n"
                       + calls[0][1])
    assert (pool.used_bytes(), pool.total_bytes()) == (used0, total0)
    if (used0, total0) == (0, 0):
        assert pool.used_bytes() == 0 and pool.total_bytes() == 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (per-device graph caches)")
@pytest.mark.parametrize("set_device", [True, False], ids=["current-device-set", "current-device-0"])
def test_graph_cache_is_per_device(set_device):
    """``current-device-set``: each GPU's layers run with it as the current device, as in a DDP
    process (``torch.cuda.set_device(local_rank)``); ``current-device-0``: cuda:1's run while
    cuda:0 is current, so the fused path must follow the tensors' device."""
    from torch_geometric.nn import GCNConv, GATv2Conv
    from zoo import random_edges

    from gnn_fastpath.graph import Graph, cache

    cache.clear_cache()
    edge_index, _ = random_edges(N, N, M, seed=2, empty_rows=3)
    x = torch.randn(N, F_IN)
    torch.manual_seed(0)
    layers = [GCNConv(F_IN, 32), GATv2Conv(F_IN, 16, heads=2)]
    outs = {}
    with gnn_fastpath.enabled(frameworks="pyg"):
        for index in (0, 1):
            device = torch.device("cuda", index)
            ei, xd = edge_index.to(device), x.to(device)
            with torch.cuda.device(index if set_device else 0):
                outs[index] = [copy.deepcopy(layer).to(device)(xd, ei) for layer in layers]
            torch.cuda.synchronize(device)
            for out in outs[index]:
                assert out.device == device
    assert torch.cuda.current_device() == 0
    for index in (0, 1):
        key = f"cuda:{index}"
        assert cache.cached_count(key) >= 1, (key, {k: len(v) for k, v in cache._caches.items()})
        graphs = [entry[3] for entry in cache._caches[key].values() if isinstance(entry[3], Graph)]
        assert graphs, key
        assert all(g.indptr.device == torch.device("cuda", index) for g in graphs)
    assert cache.cached_count("cuda:0") + cache.cached_count("cuda:1") == cache.cached_count()
    stats = gnn_fastpath.stats()
    for key in ("pyg.GCNConv", "pyg.GATv2Conv"):
        assert stats[key] == {"fused": {"cuda": 2, "reference": 0}, "fallback": {}}, stats
    for a, b in zip(outs[0], outs[1]):
        torch.testing.assert_close(b.cpu(), a.cpu(), rtol=1e-5, atol=1e-5)
