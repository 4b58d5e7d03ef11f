"""benchmarks/dry.py: CPU tensors on the fused path's CUDA decisions. Its graph-build kernels are
emulated (launch recorded, outputs filled in), so a Graph built under it takes the GPU's build
branch: it must be the graph the CPU's build makes, facts included (which also runs the GPU
branch's host logic on any machine)."""
import time

import pytest
import torch

from benchmarks import dry
from gnn_fastpath.graph import Graph


def _edges(kind: str):
    g = torch.Generator().manual_seed(3)
    if kind == "grouped":  # a sampled batch: targets ascending, no self loops
        dst = torch.repeat_interleave(torch.arange(20), torch.randint(1, 6, (20,), generator=g))
        src = torch.randint(20, 80, (dst.numel(),), generator=g)
        return torch.stack([src, dst]), 80
    if kind == "grouped_sorted":
        ei, n = _edges("grouped")
        return ei[:, torch.sort(ei[1] * 1000 + ei[0]).indices], n
    if kind == "loops_unsorted":
        ei = torch.randint(0, 30, (2, 200), generator=g)
        ei[:, :7] = torch.arange(7)  # self loops
        return ei, 30
    if kind == "bipartite":
        return torch.stack([torch.randint(0, 50, (90,), generator=g), torch.randint(0, 12, (90,), generator=g)]), (50, 12)
    raise KeyError(kind)


@pytest.mark.parametrize("kind", ["grouped", "grouped_sorted", "loops_unsorted", "bipartite"])
def test_the_gpu_build_branch_makes_the_cpu_build_graph(kind):
    ei, n = _edges(kind)
    want = Graph.from_edge_index(ei, n)
    with dry.cuda_decisions() as rec:
        rec.active = True
        got = Graph.from_edge_index(ei.clone(), n)
    assert rec.launches["edge_facts"] == 1 and rec.host_reads == 1
    for field in ("indptr", "indices", "perm"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert (got.degree_bound(), got.degree_bound(True), got.num_self_loops(), got.sources_sorted) == (
        want.degree_bound(), want.degree_bound(True), want.num_self_loops(), want.sources_sorted)
    assert torch.equal(got.in_degree(), want.in_degree()) and torch.equal(got.out_degree(), want.out_degree())


@pytest.mark.parametrize("ei, n, where", [
    ([[0, 1, 9], [1, 2, 0]], 5, "source"),
    ([[0, -1, 2], [1, 2, 0]], 5, "source"),
    ([[0, 1, 2], [1, 7, 0]], (5, 5), "destination"),
    ([[0, 1, 2], [1, 3, 0]], (5, 3), "destination"),  # bipartite: 3 targets
], ids=["source_high", "source_negative", "destination_high", "bipartite_destination"])
def test_out_of_range_ids_are_caught_on_the_gpu_branch(ei, n, where):
    with dry.cuda_decisions() as rec, pytest.raises(ValueError, match=f"edge_index \\({where} row\\)"):
        rec.active = True
        Graph.from_edge_index(torch.tensor(ei), n)
    assert rec.launches["edge_facts"] == 1  # the facts came from the (emulated) kernel, not the CPU build


def test_everything_patched_is_restored():
    import gnn_fastpath.cuda as cuda
    from gnn_fastpath.cuda import launch
    from gnn_fastpath.graph import graph as graph_module

    before = (graph_module._builds_on_gpu, cuda.edge_facts, cuda.csr_indptr, launch.Kernel.launch)
    with dry.cuda_decisions():
        assert graph_module._builds_on_gpu(torch.zeros(1))
    assert (graph_module._builds_on_gpu, cuda.edge_facts, cuda.csr_indptr, launch.Kernel.launch) == before
    assert not graph_module._builds_on_gpu(torch.zeros(1))


def test_the_host_clock_leaves_out_the_emulated_kernels():
    ei, n = _edges("loops_unsorted")
    with dry.cuda_decisions() as rec:
        wall0, host0 = time.perf_counter(), rec.host_clock()
        Graph.from_edge_index(ei, n)
        wall, host = time.perf_counter() - wall0, rec.host_clock() - host0
    assert rec.emulated_s > 0
    assert host == pytest.approx(wall - rec.emulated_s, abs=1e-3) and host < wall


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["grouped", "grouped_sorted", "loops_unsorted", "bipartite"])
def test_the_emulated_facts_are_the_kernels(kind):
    """What dry.py fills in is what csr_build.cu computes, on the same edges."""
    import gnn_fastpath.cuda as cuda

    if not cuda.available():
        pytest.skip(f"the CUDA kernels do not run here: {cuda.unavailable_reason()}")
    ei, n = _edges(kind)
    n_src, n_dst = n if isinstance(n, tuple) else (n, n)
    got = cuda.edge_facts(ei[0].cuda(), ei[1].cuda(), n_src, n_dst)
    want = dry._true_edge_facts(ei[0], ei[1], n_src, n_dst)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu().to(torch.int64), w.to(torch.int64))


def test_a_derived_graph_takes_the_gpu_row_offsets():
    """Graphs built without validation (self loops added to a validated one) sort on the device
    and take their row offsets from the csr_indptr kernel: same CSR as the CPU's."""
    ei, n = _edges("loops_unsorted")
    want = Graph.from_coo(ei[0], ei[1], n, n, validate=False)
    with dry.cuda_decisions() as rec:
        rec.active = True
        got = Graph.from_coo(ei[0].clone(), ei[1].clone(), n, n, validate=False)
    assert rec.launches["csr_indptr_from_sorted"] == 1 and rec.host_reads == 0
    for field in ("indptr", "indices", "perm"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
