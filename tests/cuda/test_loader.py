"""CUDA loader: availability probing, source inlining, and (on a GPU) the CSR indptr kernel.

The CPU tests run everywhere. Tests marked ``cuda`` need CuPy and an NVIDIA GPU and are
skipped otherwise (see tests/conftest.py).
"""
import sys

import pytest
import torch

import gnn_fastpath
from gnn_fastpath import cuda
from gnn_fastpath.cuda import loader
from gnn_fastpath.graph import Graph, cached_count, clear_cache
from zoo import random_edges


@pytest.fixture
def fresh_probe(monkeypatch):
    """Forget the cached probe result for one test; monkeypatch restores it afterwards."""
    monkeypatch.setattr(loader, "_checked", False)
    monkeypatch.setattr(loader, "_reason", None)
    return monkeypatch


# ---------------------------------------------------------------------------- availability
def test_available_and_reason_agree():
    reason = cuda.unavailable_reason()
    assert cuda.available() == (reason is None)
    if reason is not None:
        assert isinstance(reason, str) and reason.strip()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_unavailable_without_gpu():
    assert cuda.available() is False
    reason = cuda.unavailable_reason()
    assert isinstance(reason, str) and reason
    assert "CUDA" in reason or "CuPy" in reason or "GNN_FASTPATH_DISABLE_CUDA" in reason


def test_disabled_by_environment(fresh_probe):
    fresh_probe.setenv("GNN_FASTPATH_DISABLE_CUDA", "1")
    assert cuda.available() is False
    assert cuda.unavailable_reason() == "disabled by GNN_FASTPATH_DISABLE_CUDA"


@pytest.mark.parametrize("value", ["", "0"])
def test_environment_zero_does_not_disable(fresh_probe, value):
    fresh_probe.setenv("GNN_FASTPATH_DISABLE_CUDA", value)
    assert "GNN_FASTPATH_DISABLE_CUDA" not in (cuda.unavailable_reason() or "")


def test_reason_when_cupy_missing(fresh_probe):
    fresh_probe.delenv("GNN_FASTPATH_DISABLE_CUDA", raising=False)
    fresh_probe.setattr(torch.cuda, "is_available", lambda: True)
    fresh_probe.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    assert cuda.available() is False
    reason = cuda.unavailable_reason()
    assert reason.startswith("CuPy is not importable (")
    assert "ImportError" in reason or "ModuleNotFoundError" in reason
    assert "gnn-fastpath[cuda12]" in reason


def test_reason_without_torch_gpu(fresh_probe):
    fresh_probe.delenv("GNN_FASTPATH_DISABLE_CUDA", raising=False)
    fresh_probe.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda.available() is False
    assert "torch.cuda.is_available() is False" in cuda.unavailable_reason()


def test_probe_is_cached(fresh_probe):
    fresh_probe.delenv("GNN_FASTPATH_DISABLE_CUDA", raising=False)
    calls = []
    fresh_probe.setattr(loader, "_probe", lambda: calls.append(1) or "nope")
    assert cuda.available() is False and cuda.available() is False
    assert cuda.unavailable_reason() == "nope"
    assert calls == [1]


def test_disable_is_read_on_every_call(fresh_probe):
    """GNN_FASTPATH_DISABLE_CUDA takes effect at the next call; the probe still runs once."""
    calls = []
    fresh_probe.setattr(loader, "_probe", lambda: calls.append(1) or None)
    fresh_probe.setenv("GNN_FASTPATH_DISABLE_CUDA", "1")
    assert cuda.unavailable_reason() == "disabled by GNN_FASTPATH_DISABLE_CUDA"
    fresh_probe.delenv("GNN_FASTPATH_DISABLE_CUDA")
    assert cuda.available() is True
    fresh_probe.setenv("GNN_FASTPATH_DISABLE_CUDA", "1")
    assert cuda.available() is False
    fresh_probe.setenv("GNN_FASTPATH_DISABLE_CUDA", "0")
    assert cuda.available() is True
    assert calls == [1]


# ---------------------------------------------------------------------------- read_source
def test_read_source_csr_build():
    text = cuda.read_source("csr_build.cu")
    assert 'extern "C" __global__ void csr_indptr_from_sorted' in text
    assert text.splitlines() == (loader.SOURCE_DIR / "csr_build.cu").read_text().splitlines()


def _package_sources():
    return sorted(p.name for p in loader.SOURCE_DIR.glob("*.cu"))


@pytest.mark.parametrize("name", _package_sources())
def test_package_sources_are_self_contained(name):
    text = cuda.read_source(name)
    for line in text.splitlines():
        s = line.strip()
        assert not (s.startswith('#include "') and s.endswith('.cuh"')), f"{name}: {line!r} left"
    raw = (loader.SOURCE_DIR / name).read_text()
    if '#include "attention_common.cuh"' in raw:
        assert "gf_softmax_rescale" in text and "gf_philox_uniform" in text
    if '#include "attention_common.cuh"' in raw or '#include "common.cuh"' in raw:
        # common.cuh, included directly or through attention_common.cuh, inlined exactly once
        assert "gf_group_sum" in text and text.count("#define GF_FULL_MASK") == 1


def test_read_source_inlines_cuh_includes(tmp_path, monkeypatch):
    common = (loader.SOURCE_DIR / "common.cuh").read_text()
    attention = (loader.SOURCE_DIR / "attention_common.cuh").read_text()
    assert '#include "common.cuh"\n' in attention  # the attention header builds on common.cuh
    (tmp_path / "common.cuh").write_text(common)
    (tmp_path / "attention_common.cuh").write_text(attention)
    (tmp_path / "leaf.cuh").write_text("#define LEAF_VALUE 42\n")
    (tmp_path / "inner.cuh").write_text('#pragma once\n  #include "leaf.cuh"\n__device__ int inner() { return LEAF_VALUE; }\n')
    (tmp_path / "kernel.cu").write_text(
        "// test kernel\n"
        "#include <cuda_fp16.h>\n"
        '#include "attention_common.cuh"\n'
        '#include "plain_header.h"\n'
        '    #include "inner.cuh"   \n'
        '#include "common.cuh"\n'  # already inlined through attention_common.cuh: dropped
        'extern "C" __global__ void k(float* x) { x[0] = gf_group_sum<32>(x[0]) + inner(); }\n'
    )
    monkeypatch.setattr(loader, "SOURCE_DIR", tmp_path)
    text = cuda.read_source("kernel.cu")
    lines = text.splitlines()
    # the attention helpers are inlined verbatim in place of the include line, with common.cuh
    # inlined verbatim in place of theirs
    before, after = attention.split('#include "common.cuh"\n', 1)
    assert before + common.rstrip("\n") + "\n" + after.rstrip("\n") in text
    assert text.count(common.rstrip("\n")) == 1  # each header once per source
    assert '#include "attention_common.cuh"' not in text and '#include "common.cuh"' not in text
    # nested includes are inlined recursively, surrounding whitespace tolerated
    assert "#define LEAF_VALUE 42" in lines
    assert "__device__ int inner() { return LEAF_VALUE; }" in lines
    assert not any(line.strip().startswith("#include") and '.cuh"' in line for line in lines)
    # system headers and non-.cuh includes are left alone
    assert "#include <cuda_fp16.h>" in lines
    assert '#include "plain_header.h"' in lines
    # order: comment, system include, helpers (common, then attention), plain include, inner, kernel
    assert lines[0] == "// test kernel"
    assert (text.index("gf_group_sum(float v") < text.index("gf_softmax_rescale(") < text.index("#define LEAF_VALUE")
            < text.index('extern "C"'))
    assert lines[-1].startswith('extern "C" __global__ void k')


def test_read_source_missing_file(tmp_path, monkeypatch):
    (tmp_path / "a.cu").write_text('#include "missing.cuh"\n')
    monkeypatch.setattr(loader, "SOURCE_DIR", tmp_path)
    with pytest.raises(FileNotFoundError):
        cuda.read_source("a.cu")


# ---------------------------------------------------------------------------- GPU part
def _indptr_oracle(rows, n_rows):
    counts = torch.bincount(rows.cpu(), minlength=n_rows)
    return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(counts, 0)])


def _sorted_rows_cases():
    gen = torch.Generator().manual_seed(0)
    cases = {}
    cases["random_dense"] = (torch.sort(torch.randint(0, 1000, (5000,), generator=gen)).values, 1000)
    cases["random_sparse"] = (torch.sort(torch.randint(0, 100000, (3000,), generator=gen)).values, 100000)
    # empty rows at the start, in the middle and at the end
    mid = torch.cat([torch.randint(10, 40, (200,), generator=gen), torch.randint(60, 90, (200,), generator=gen)])
    cases["gaps_start_middle_end"] = (torch.sort(mid).values, 100)
    cases["m1_first_row"] = (torch.tensor([0]), 7)
    cases["m1_middle_row"] = (torch.tensor([3]), 7)
    cases["m1_last_row"] = (torch.tensor([6]), 7)
    cases["m1_one_row"] = (torch.tensor([0]), 1)
    cases["all_in_one_row"] = (torch.full((777,), 5), 9)
    cases["every_row_once"] = (torch.arange(1025), 1025)
    cases["m_over_block"] = (torch.sort(torch.randint(0, 3, (70000,), generator=gen)).values, 3)
    cases["m0"] = (torch.empty(0, dtype=torch.int64), 5)
    cases["int32_rows"] = (torch.sort(torch.randint(0, 50, (300,), generator=gen)).values.int(), 60)
    return cases


_ROWS = _sorted_rows_cases()


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(_ROWS))
def test_csr_indptr_matches_bincount(case):
    rows, n_rows = _ROWS[case]
    got = cuda.csr_indptr(rows.cuda(), n_rows)
    assert got.device.type == "cuda" and got.dtype == torch.int64
    assert got.shape == (n_rows + 1,)
    assert torch.equal(got.cpu(), _indptr_oracle(rows.long(), n_rows))


@pytest.mark.cuda
def test_csr_indptr_on_non_default_stream():
    rows, n_rows = _ROWS["random_dense"]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        r = rows.cuda()
        got = cuda.csr_indptr(r, n_rows)
    stream.synchronize()
    assert torch.equal(got.cpu(), _indptr_oracle(rows, n_rows))


_GRAPH_CASES = {
    "homogeneous": dict(n_src=300, n_dst=300, m=3000, seed=1, empty_rows=20),
    "bipartite": dict(n_src=500, n_dst=70, m=2000, seed=2, empty_rows=5),
    "bipartite_tall": dict(n_src=40, n_dst=900, m=1500, seed=3, empty_rows=100),
    "super_node": dict(n_src=1000, n_dst=1000, m=20000, seed=4, super_node_degree=5000),
    "single_edge": None,
    "no_edges": dict(n_src=10, n_dst=12, m=0, seed=5),
}


def _case_edges(name):
    spec = _GRAPH_CASES[name]
    if spec is None:
        return torch.tensor([[3], [1]]), (5, 4)
    spec = dict(spec)
    return random_edges(spec.pop("n_src"), spec.pop("n_dst"), spec.pop("m"), spec.pop("seed"), **spec)


def _assert_same_graph(a: Graph, b: Graph):
    assert (a.n_src, a.n_dst, a.num_edges) == (b.n_src, b.n_dst, b.num_edges)
    for field in ("indptr", "indices", "perm"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype == torch.int64, field
        assert torch.equal(x.cpu(), y.cpu()), field


@pytest.mark.cuda
@pytest.mark.parametrize("sources", ["ascending", "descending"])
def test_cuda_build_knows_whether_grouped_sources_ascend(sources):
    """Edges grouped by target keep their order; the edge_facts kernel tells whether the
    sources ascend within each target (one descending pair is enough to say no)."""
    ei, _ = random_edges(300, 300, 3000, seed=1)
    sign = 1 if sources == "ascending" else -1
    ei = ei[:, torch.sort(ei[1] * 1000 + sign * ei[0]).indices]
    cpu, gpu = Graph.from_edge_index(ei, 300), Graph.from_edge_index(ei.cuda(), 300)
    assert torch.equal(gpu.perm.cpu(), torch.arange(ei.size(1)))  # kept as it came
    assert gpu.sources_sorted == cpu.sources_sorted == (sources == "ascending")


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(_GRAPH_CASES))
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_graph_build_on_cuda_matches_cpu(name, dtype, monkeypatch):
    ei, nn = _case_edges(name)
    calls = []
    real = gnn_fastpath.cuda.edge_facts
    monkeypatch.setattr(gnn_fastpath.cuda, "edge_facts", lambda *a: calls.append(a[2:]) or real(*a))
    cpu = Graph.from_edge_index(ei.to(dtype), nn)
    gpu = Graph.from_edge_index(ei.to(dtype).cuda(), nn)
    assert gpu.device.type == "cuda"
    for t in (gpu.indptr, gpu.indices, gpu.perm):
        assert t.is_cuda
    _assert_same_graph(gpu, cpu)
    if ei.size(1):
        assert calls, "the CUDA build did not gather its facts with the edge_facts kernel"
        # the same host facts as the CPU build
        assert (gpu.degree_bound(), gpu.degree_bound(True), gpu.num_self_loops(), gpu.sources_sorted) == (
            cpu.degree_bound(), cpu.degree_bound(True), cpu.num_self_loops(), cpu.sources_sorted)
    # derived data agrees too
    assert torch.equal(gpu.dst_index().cpu(), cpu.dst_index())
    sg, sc = gpu.source_csr(), cpu.source_csr()
    assert torch.equal(sg.indptr.cpu(), sc.indptr)
    assert torch.equal(sg.indices.cpu(), sc.indices)
    assert torch.equal(sg.csr_pos.cpu(), sc.csr_pos)
    kg = gpu.kernel_csr()
    assert kg.indptr.dtype == torch.int32 and kg.indptr.is_cuda
    sg_stats, sc_stats = gpu.degree_stats(), cpu.degree_stats()
    assert sg_stats.max == sc_stats.max
    assert sg_stats.mean == pytest.approx(sc_stats.mean, rel=1e-12)


@pytest.mark.cuda
def test_graph_to_cuda_is_cached():
    ei, nn = _case_edges("homogeneous")
    cpu = Graph.from_edge_index(ei, nn)
    gpu = cpu.to("cuda")
    assert gpu is not cpu and gpu.device.type == "cuda"
    assert cpu.to("cuda") is gpu
    assert cpu.to(torch.device("cuda", torch.cuda.current_device())) is gpu
    assert gpu.to(gpu.device) is gpu
    _assert_same_graph(gpu, cpu)


@pytest.mark.cuda
def test_graph_of_cuda_tensor_cached_per_device():
    clear_cache()
    try:
        ei, nn = _case_edges("bipartite")
        ei = ei.cuda()
        g = Graph.of(ei, nn)
        assert Graph.of(ei, nn) is g
        assert cached_count(ei.device) == 1
        ei[1, 0] = (ei[1, 0] + 1) % nn[1]
        g2 = Graph.of(ei, nn)
        assert g2 is not g
        _assert_same_graph(g2, Graph.from_edge_index(ei.cpu(), nn))
    finally:
        clear_cache()
