"""The block-sparse layout (gnn_fastpath.cuda.block_layout), built on the CPU: blocks rebuild
the matrix (every entry once, duplicates added, each value rounded once to the features'
type), the row masks rebuild its pattern (attention) and parallel edges are found; the SpMM
launcher reaches its kernel with matching arguments for every instantiation, which NVRTC
compiles for sm_90 (dry launches, see dry_launch.py)."""
from __future__ import annotations

import pytest
import torch

from dry_launch import GRAPHS, graph
from gnn_fastpath import Graph
from gnn_fastpath.cuda import block_spmm
from gnn_fastpath.cuda.block_layout import BlockLayout
from zoo import random_edges


def _layout(g):
    kc = g.kernel_csr()
    return kc, BlockLayout(kc.indptr, kc.indices, g.n_dst, g.n_src)


def _dense_from_blocks(layout, blocks):
    """A [n_rows, n_cols] rebuilt from the blocks (float64)."""
    a = torch.zeros(layout.n_windows * 16, layout.n_cols + 1, dtype=torch.float64)
    values = blocks.double().view(layout.n_blocks, 16, 16)
    cols = layout.cols.view(layout.n_blocks, 16).long()
    window = torch.repeat_interleave(torch.arange(layout.n_windows),
                                     (layout.window_ptr[1:] - layout.window_ptr[:-1]).long())
    for b in range(layout.n_blocks):
        rows = window[b] * 16 + torch.arange(16)
        col = torch.where(cols[b] >= 0, cols[b], layout.n_cols)  # padding -> a spare column
        a[rows[:, None], col[None, :]] += values[b]
    assert a[:, layout.n_cols].abs().sum() == 0, "padding columns hold values"
    return a[:layout.n_rows, :layout.n_cols]


@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_blocks_rebuild_the_matrix(graph_name, dtype):
    g = graph(*GRAPHS[graph_name])
    kc, layout = _layout(g)
    values = torch.rand(g.num_edges, dtype=torch.float32) + 0.1
    blocks = layout.values(values, dtype)
    rows = torch.repeat_interleave(torch.arange(g.n_dst), (kc.indptr[1:] - kc.indptr[:-1]).long())
    want = torch.zeros(g.n_dst, g.n_src, dtype=torch.float64)
    want.index_put_((rows, kc.indices.long()), values.double(), accumulate=True)  # duplicates add
    got = _dense_from_blocks(layout, blocks)
    unit = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    torch.testing.assert_close(got, want, rtol=unit, atol=0)  # the sum, rounded once to dtype
    # windows own consecutive blocks, each column of a window once, sorted
    cols = layout.cols.view(layout.n_blocks, 16)
    for w in range(layout.n_windows):
        c = cols[layout.window_ptr[w]:layout.window_ptr[w + 1]].flatten()
        c = c[c >= 0]
        assert torch.equal(c, torch.unique(c))
    assert layout.values(values, dtype) is blocks  # cached per values tensor


@pytest.mark.parametrize("graph_name", list(GRAPHS))
def test_masks_rebuild_the_pattern(graph_name):
    g = graph(*GRAPHS[graph_name])
    src, dst = g.caller_coo()
    g = Graph.from_edge_index(torch.unique(torch.stack([src, dst]), dim=1), (g.n_src, g.n_dst))
    kc, layout = _layout(g)
    assert not layout.has_duplicates() and layout.counts() is None
    masks = layout.masks().view(layout.n_blocks, 16).long()
    bits = (masks[:, :, None] >> torch.arange(16)) & 1  # [block, row, slot]
    pattern = _dense_from_blocks(layout, bits.to(torch.float64).flatten())
    rows = torch.repeat_interleave(torch.arange(g.n_dst), (kc.indptr[1:] - kc.indptr[:-1]).long())
    want = torch.zeros(g.n_dst, g.n_src, dtype=torch.float64)
    want[rows, kc.indices.long()] = 1
    assert torch.equal(pattern, want)


def test_parallel_edges_are_counted():
    g = graph(*GRAPHS["plain"])  # random_edges draws some edges twice
    kc, layout = _layout(g)
    assert layout.has_duplicates()
    counts = layout.counts()
    assert counts.dtype == torch.uint8 and int(counts.max()) >= 2
    rows = torch.repeat_interleave(torch.arange(g.n_dst), (kc.indptr[1:] - kc.indptr[:-1]).long())
    want = torch.zeros(g.n_dst, g.n_src, dtype=torch.float64)
    want.index_put_((rows, kc.indices.long()), torch.ones(g.num_edges, dtype=torch.float64), accumulate=True)
    assert torch.equal(_dense_from_blocks(layout, counts.double()), want)
    masks = layout.masks().view(layout.n_blocks, 16).long()
    bits = ((masks[:, :, None] >> torch.arange(16)) & 1).flatten()
    assert torch.equal(bits.bool(), counts > 0)


def test_fill_and_the_density_gate():
    """Rows of one window sharing their sources fill blocks (the layout is offered); scattered
    sources share nothing (it is not)."""
    n = 512
    dst = torch.arange(n).repeat_interleave(16)
    local = (dst // 16) * 16 + torch.arange(16).repeat(n)  # each row: the 16 nodes of its window
    kc_local = _layout_of(local, dst, n)
    assert kc_local.fill == 1.0 and kc_local.sharing == 16.0
    assert block_spmm.layout_if_dense(*_csr(local, dst, n)) is not None
    spread = torch.randint(0, 100_000, (n * 16,), generator=torch.Generator().manual_seed(0))
    assert _layout_of(spread, dst, 100_000).sharing < 1.01  # every entry its own B row read
    assert block_spmm.layout_if_dense(*_csr(spread, dst, 100_000)) is None


def _csr(src, dst, n_src):
    from gnn_fastpath import Graph

    g = Graph.from_edge_index(torch.stack([src, dst]), (n_src, int(dst.max()) + 1))
    kc = g.kernel_csr()
    return kc.indptr, kc.indices, g.n_dst, g.n_src


def _layout_of(src, dst, n_src):
    return BlockLayout(*_csr(src, dst, n_src))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out", ["same", torch.float32])
@pytest.mark.parametrize("F", [8, 72, 512])
def test_dry_launch(launches, dtype, out, F):
    ei, nn = random_edges(70, 45, 400, seed=2, empty_rows=4)
    from gnn_fastpath import Graph

    g = Graph.from_edge_index(ei, nn)
    _, layout = _layout(g)
    b = torch.randn(g.n_src, F).to(dtype)
    c = torch.empty(g.n_dst, F, dtype=dtype if out == "same" else out)
    block_spmm.matmul(layout, torch.rand(g.num_edges), b, c)
    assert launches == ["bs_spmm"]


def test_supported():
    b = torch.randn(10, 64).to(torch.bfloat16)
    assert not block_spmm.supported(b, b)  # a CPU tensor: no tensor cores
    assert not block_spmm.supported(torch.randn(10, 64), torch.randn(10, 64))  # float32 features
