"""Dry launches of the block-sparse attention launcher on the CPU (see dry_launch.py): the
forward and both backward passes reach their kernels with matching arguments, and every
instantiation (float16/bfloat16, each head width the kernels take; simple graphs and
multigraphs, whose cells carry counts) compiles for sm_90; an
undirected graph's source pass walks the forward layout. Which calls may take the kernels at
all (block_attention.unsupported) is asked here too."""
from __future__ import annotations

import pytest
import torch

from dry_launch import GRAPHS, graph
from gnn_fastpath import Graph
from gnn_fastpath.cuda import block_attention


def _simple(g):
    """``g`` without its parallel edges (a block mask holds one edge per cell)."""
    src, dst = g.caller_coo()
    return Graph.from_edge_index(torch.unique(torch.stack([src, dst]), dim=1), (g.n_src, g.n_dst))


def _qkv(g, H, D, dtype):
    return [torch.randn(n, H, D).to(dtype) for n in (g.n_dst, g.n_src, g.n_src)]


@pytest.mark.parametrize("out", ["same", torch.float32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [16, 32, 48, 64, 128])
@pytest.mark.parametrize("simple", [True, False], ids=["simple", "multigraph"])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("chunk", [64, 1], ids=["whole", "split"])
def test_block_attention_launches(launches, monkeypatch, chunk, graph_name, simple, D, dtype, out):
    """``chunk``: blocks per work item (1: every window of two blocks or more is split, and
    the merge kernels run); ``out``: results in the inputs' dtype or float32 (autocast)."""
    monkeypatch.setattr(block_attention, "CHUNK_BLOCKS", chunk)
    g = graph(*GRAPHS[graph_name])
    g = _simple(g) if simple else g
    assert (block_attention.layout(g).counts() is None) == simple
    q, k, v = _qkv(g, 3, D, dtype)
    out_dtype = dtype if out == "same" else out
    p = 0.2 if simple else 0.0  # dropout: a simple graph's cells key one edge each
    o, lse = block_attention.forward(g, q, k, v, 0.25, out_dtype, p, 7, 9)
    assert o.shape == q.shape and o.dtype == out_dtype and lse.shape == (g.n_dst, 3) and lse.dtype == torch.float32
    dq, dk, dv = block_attention.backward(g, q, k, v, o, lse, torch.randn_like(o), 0.25, p, 7, 9)
    bits = ["ba_keep_bits"] if p else []  # dropout drawn once per pass
    if chunk == 1:
        assert launches == bits + ["ba_fwd", "dot_fwd_merge"] + bits + ["ba_bwd_dst", "dot_sum_partials", "ba_bwd_src",
                                                                        "dot_sum_partials", "dot_sum_partials"]
    else:
        assert launches == bits + ["ba_fwd"] + bits + ["ba_bwd_dst", "ba_bwd_src"]
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape and dk.dtype == dtype


def test_undirected_graph_shares_one_layout():
    ei = torch.randint(0, 60, (2, 400), generator=torch.Generator().manual_seed(1))
    ei = torch.unique(torch.cat([ei, ei.flip(0)], 1), dim=1)
    g = Graph.from_edge_index(ei, 60)
    assert g.is_symmetric()
    assert block_attention.source_layout(g) is block_attention.layout(g)
    directed = Graph.from_edge_index(ei[:, ei[0] < ei[1]], 60)
    assert block_attention.source_layout(directed) is not block_attention.layout(directed)


def test_split_windows_work_list(monkeypatch):
    """Chunks of CHUNK_BLOCKS blocks; each split window's rows own contiguous workspace rows, one
    per chunk; rows past the last row (the last window's padding) are merged from 0 rows."""
    monkeypatch.setattr(block_attention, "CHUNK_BLOCKS", 4)
    ei = torch.randint(0, 300, (2, 6000), generator=torch.Generator().manual_seed(2))
    g = Graph.from_edge_index(torch.unique(ei, dim=1), 300)
    lay = block_attention.layout(g)
    wk = block_attention.work(g, lay)
    blocks = (lay.window_ptr[1:] - lay.window_ptr[:-1]).long()
    chunks = (blocks + block_attention.CHUNK_BLOCKS - 1) // block_attention.CHUNK_BLOCKS
    items = wk.chunks.items.long()
    assert int((items[:, 2] - items[:, 1]).max()) <= block_attention.CHUNK_BLOCKS
    assert torch.equal(torch.bincount(items[:, 0], minlength=lay.n_windows), chunks.clamp(min=1))
    split = wk.split.long()
    assert (chunks > 1).any() and wk.n_part_rows == 16 * int(chunks[chunks > 1].sum())
    rows = split[:, 0]
    assert torch.equal(split[rows < 300, 2], chunks[rows[rows < 300] // 16])
    assert (split[rows >= 300, 2] == 0).all()
    has = (split[:, 2] > 0).to(torch.uint8)
    assert torch.equal(has, torch.sort(has, descending=True, stable=True).values)  # entries with rows first
    used = torch.cat([torch.arange(int(f), int(f + n)) for _, f, n, _ in split.tolist()])
    assert torch.equal(torch.sort(used).values, torch.arange(used.numel()))  # each workspace row once


@pytest.mark.parametrize("undirected", [True, False])
def test_dropout_cells(undirected):
    """Attention dropout sets one bit per edge in each layout: CSR entry k (edge src -> dst) is
    the cell (dst, src) of the destination-major layout and (src, dst) of the source-major one,
    also where both are one layout (an undirected graph, cell (i, j) holding j -> i and i -> j)."""
    ei = torch.randint(0, 50, (2, 300), generator=torch.Generator().manual_seed(3))
    ei = torch.unique(torch.cat([ei, ei.flip(0)], 1) if undirected else ei, dim=1)
    g = Graph.from_edge_index(ei[:, torch.randperm(ei.shape[1], generator=torch.Generator().manual_seed(4))], 50)
    assert g.is_symmetric() == undirected
    assert (block_attention.source_layout(g) is block_attention.layout(g)) == undirected
    kc = g.kernel_csr()
    dst = torch.repeat_interleave(torch.arange(g.n_dst), (kc.indptr[1:] - kc.indptr[:-1]).long())
    src = kc.indices.long()
    for lay, cells, row, col in ((block_attention.layout(g), block_attention.layout(g).position, dst, src),
                                 (block_attention.source_layout(g), block_attention._source_cells(g), src, dst)):
        window = torch.repeat_interleave(torch.arange(lay.n_windows), (lay.window_ptr[1:] - lay.window_ptr[:-1]).long())
        block, r, c = cells // 256, (cells // 16) % 16, cells % 16
        assert torch.equal(window[block] * 16 + r, row)
        assert torch.equal(lay.cols.long()[block * 16 + c], col)
        assert torch.unique(cells).numel() == g.num_edges


def test_dropout_launch(launches):
    ei = torch.unique(torch.randint(0, 40, (2, 200), generator=torch.Generator().manual_seed(5)), dim=1)
    g = Graph.from_edge_index(ei, 40)
    keep, keep_src = block_attention.dropout_bits(g, 3, 0.2, 7, 9, True)
    assert launches == ["ba_keep_bits"]
    assert keep.shape == (block_attention.layout(g).n_blocks * 16 * 3,)
    assert keep_src.shape == (block_attention.source_layout(g).n_blocks * 16 * 3,)


def test_parallel_edges_up_to_255():
    ei = torch.tensor([[0, 1, 1, 2], [1, 2, 2, 0]])
    assert block_attention.usable(Graph.from_edge_index(ei, 3))
    many = torch.cat([ei, torch.tensor([[1], [2]]).repeat(1, 254)], 1)  # 256 edges 1 -> 2
    assert not block_attention.usable(Graph.from_edge_index(many, 3))
    assert not block_attention.usable(Graph.from_edge_index(ei, 3), p=0.1)  # dropout keys one edge per cell


def test_unsupported_names_the_reason():
    q = torch.randn(4, 2, 32).to(torch.bfloat16)
    assert "CUDA" in block_attention.unsupported(q, q, q, None, False, None)  # a CPU tensor
    assert "float16/bfloat16" in block_attention.unsupported(q.float(), q.float(), q.float(), None, False, None)
