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
    if chunk == 1:
        assert launches == ["ba_fwd", "dot_fwd_merge", "ba_bwd_dst", "dot_sum_partials", "ba_bwd_src",
                            "dot_sum_partials", "dot_sum_partials"]
    else:
        assert launches == ["ba_fwd", "ba_bwd_dst", "ba_bwd_src"]
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
    used = torch.cat([torch.arange(int(f), int(f + n)) for _, f, n, _ in split.tolist()])
    assert torch.equal(torch.sort(used).values, torch.arange(used.numel()))  # each workspace row once


def test_cell_edge_ids():
    """Each cell holds its edge's caller id; an undirected graph's one layout holds the edge
    j -> i at cell (i, j) as destination-major and i -> j as source-major."""
    ei = torch.randint(0, 50, (2, 300), generator=torch.Generator().manual_seed(3))
    ei = torch.unique(torch.cat([ei, ei.flip(0)], 1), dim=1)
    ei = ei[:, torch.randperm(ei.shape[1], generator=torch.Generator().manual_seed(4))]  # caller order
    g = Graph.from_edge_index(ei, 50)
    assert g.is_symmetric()  # known: the source-major CSR is the forward one
    lay = block_attention.layout(g)
    assert block_attention.source_layout(g) is lay
    cols = lay.cols.view(-1, 16).long()
    window = torch.repeat_interleave(torch.arange(lay.n_windows), (lay.window_ptr[1:] - lay.window_ptr[:-1]).long())
    for source_major in (False, True):
        ids = block_attention.cell_edge_ids(g, source_major).view(-1, 16, 16).long()
        b, r, c = (ids >= 0).nonzero(as_tuple=True)
        row, col = window[b] * 16 + r, cols[b, c]
        src, dst = (row, col) if source_major else (col, row)
        e = ids[b, r, c]
        assert torch.equal(ei[0, e], src) and torch.equal(ei[1, e], dst)
        assert e.numel() == ei.shape[1]


def test_parallel_edges_up_to_255():
    ei = torch.tensor([[0, 1, 1, 2], [1, 2, 2, 0]])
    assert block_attention.usable(Graph.from_edge_index(ei, 3))
    many = torch.cat([ei, torch.tensor([[1], [2]]).repeat(1, 254)], 1)  # 256 edges 1 -> 2
    assert not block_attention.usable(Graph.from_edge_index(many, 3))
    assert not block_attention.usable(Graph.from_edge_index(ei, 3), p=0.1)  # dropout keys one edge per cell


def test_unsupported_names_the_reason():
    q = torch.randn(4, 2, 32).to(torch.bfloat16)
    assert "CUDA" in block_attention.unsupported(q, q, q, None, 0.0, False, None)  # a CPU tensor
    assert "float16/bfloat16" in block_attention.unsupported(q.float(), q.float(), q.float(), None, 0.0, False, None)
