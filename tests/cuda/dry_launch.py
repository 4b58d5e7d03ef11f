"""Dry launches on the CPU: op -> autograd Function -> launcher -> kernel launch, with the
launch replaced by its argument check and the compile done by NVRTC (helpers for the
``test_*_launchers_cpu.py`` files, one per kernel family).

No GPU here, so the launch itself is replaced by the argument check it always does first
(:meth:`gnn_fastpath.cuda.launch.Kernel.arguments`: every .cu parameter named, no unknown
name, each value convertible to its C type), and the compile by NVRTC (the ``nvidia-cuda-
nvrtc-cu12`` wheel; the compile check is skipped without it). The numbers the "kernels"
return are garbage; what is checked is that each forward and backward pass reaches its
kernels with arguments that match their parameter lists, for every template instantiation
the launchers pick, and that those instantiations compile for sm_90. The GPU tests check
the values.
"""
from __future__ import annotations

import types

import pytest
import torch

import nvrtc
from gnn_fastpath import Graph
from gnn_fastpath.cuda import launch, loader
from gnn_fastpath.cuda.cusparse import CsrMatrix
from zoo import random_edges

_compiled: dict = {}


def compile_module(source, templates, defines, index):
    """Stands in for launch._module: NVRTC-compiles the module once (when NVRTC is here)."""
    key = (source, templates, defines)
    if key not in _compiled:
        ok, log = (True, "")
        if nvrtc.available():
            ok, log = nvrtc.compile_source(loader.read_source(source), templates,
                                           ["-std=c++17", *(f"-D{k}={v}" for k, v in defines)])
        _compiled[key] = (ok, log)
    ok, log = _compiled[key]
    assert ok, f"{source} {templates} does not compile:\n{log[:4000]}"
    return types.SimpleNamespace(get_function=lambda name: types.SimpleNamespace(ptr=0, name=name))


@pytest.fixture
def launches(monkeypatch):
    """Dry launches: names of the kernels launched, arguments checked, nothing run."""
    seen = []

    def dry(self, grid, block, *, shared_mem=0, **args):
        self.arguments(args)
        grid = grid if isinstance(grid, tuple) else (grid,)
        assert all(int(g) >= 1 for g in grid), f"{self.name}: empty grid {grid}"
        seen.append(self.name.split("<")[0])

    monkeypatch.setattr(launch, "_module", compile_module)
    monkeypatch.setattr(launch, "_device_index", lambda device: 0)
    for family in launch.FAMILIES:  # compiled here with stubs: keep them out of the real caches
        monkeypatch.setattr(family, "_cache", {})
    monkeypatch.setattr(launch, "resident_blocks", lambda kernel, threads, shared_mem=0: 132)
    monkeypatch.setattr(launch.Kernel, "launch", dry)
    # cuSPARSE needs CuPy and a GPU: every product takes the matrix's own kernel instead
    monkeypatch.setattr(CsrMatrix, "matmul", lambda self, values, b, c, transpose=False: self._own_kernel(values, b, c))
    return seen


def graph(super_node: bool, bipartite: bool = False):
    n_src, n_dst = (50, 31) if bipartite else (40, 40)
    ei, nn = random_edges(n_src, n_dst, 300, seed=3, empty_rows=3, super_node_degree=700 if super_node else 0)
    if super_node:  # a long source row too, for the source-major passes
        hub = torch.stack([torch.full((400,), 1), torch.randint(0, n_dst, (400,))])
        ei = torch.cat([ei, hub], 1)
    return Graph.from_edge_index(ei, nn)


def extra_row_graph():
    """(GraphTensors, removed) of :func:`graph`'s super-node graph with its loops and every
    fifth edge removed into the extra row: a row longer than a 256-edge chunk (a static list
    that walked it would split it)."""
    from gnn_fastpath.graph.tensors import from_coo

    src, dst = graph(True).caller_coo()
    n = int(torch.maximum(src.max(), dst.max())) + 1
    removed = (src == dst) | (torch.arange(src.numel()) % 5 == 0)
    return from_coo(src, dst, n, n, removed=removed), removed


def undirected_graph(super_node: bool):
    """:func:`graph`'s homogeneous graph with every edge also reversed (symmetric; the super
    node's row and the hub source's row split both ways), its symmetry detected."""
    g = graph(super_node)
    ei = torch.stack([g.indices, g.dst_index()])
    g = Graph.from_edge_index(torch.cat([ei, ei.flip(0)], 1), g.n_dst)
    assert g.is_symmetric()
    return g


GRAPHS = {"plain": (False, False), "super_node": (True, False), "bipartite_super": (True, True)}


def leaf(*shape):
    return torch.randn(*shape).requires_grad_()


