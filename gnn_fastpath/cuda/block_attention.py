"""Launcher of dot-product attention on tensor cores (``block_attention.cu``) over the
block-sparse layout of the graph (:class:`gnn_fastpath.cuda.block_layout.BlockLayout`: masks,
and on a multigraph the parallel edges' counts), for 16-bit q, k, v, with attention dropout
(the CSR kernels' Philox multipliers, drawn once per call into a bit per cell and head).

It is a variant of the dot-attention op's forward and of its backward, next to the CSR
kernels of :mod:`gnn_fastpath.cuda.dot_attention`, which picks it (forced, by its rule or
timed by the tuner) only where :func:`unsupported` says nothing against it. It computes and
saves what the CSR kernels do (out, the float32 ``lse``; in the backward ``delta``), so either
backward follows either forward. The layouts (destination-major for the forward and dq, source-
major for dk/dv; one for both on an undirected graph) are built on the GPU once per graph and
kept with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import launch, worklist
from .block_layout import WINDOW, BlockLayout
from .dot_kernels import merge_split_rows, sum_split_rows

SOURCE = "block_attention.cu"
#: Warps per thread block: forward and dq pass, dk/dv pass (static shared memory per warp:
#: 4 staged 16-row tiles, 6 in the dk/dv pass).
WARPS, SRC_WARPS = 2, 1
KERNELS = launch.Family(SOURCE, {"BA_WARPS": WARPS, "BA_SRC_WARPS": SRC_WARPS})
DTYPES = (torch.float16, torch.bfloat16)
#: Head widths the kernels take: multiples of the mma's k = 16, up to 128 (registers: the
#: window's q fragments and a 16 x D float32 accumulator per warp).
MAX_HEAD_DIM = 128
# The rule (tuning off: dot_attention.forward_algorithm / backward_mode) takes the forward
# wherever it is offered, the backward where the layout's windows share source rows: without
# sharing (the least clustered graphs) the CSR source-major pass wins (benchmarks/RESULTS.md).
# The tuner, on by default, times both per size class.
#: Windows with more blocks than this are cut into chunks of this many blocks, one warp each,
#: merged afterwards (a super node's window, or a hub source's, would otherwise keep one warp
#: busy while the rest of the GPU idles).
CHUNK_BLOCKS = 64


def unsupported(q: Tensor, k: Tensor, v: Tensor, edge_term: Optional[Tensor], attention: bool,
                out_dtype: Optional[torch.dtype]) -> Optional[str]:
    """Why the block kernels cannot take this call, or None when they can: 16-bit q, k, v of
    one dtype on a GPU with bf16 mma (sm_80+), results in that dtype or float32 (autocast),
    head width a multiple of 16 up to :data:`MAX_HEAD_DIM`, 16-byte aligned, no edge term, no
    returned attention (``attention``: the call returns or takes a gradient of it). Dropout
    needs a graph without parallel edges (:func:`usable`)."""
    if q.dtype not in DTYPES or not q.is_cuda:
        return "the block kernels take float16/bfloat16 on CUDA"
    if (out_dtype or q.dtype) not in (q.dtype, torch.float32):
        return "the block kernels write results in the inputs' dtype or float32"
    if edge_term is not None or attention:
        return "edge terms and returned attention take the CSR kernels"
    D = q.size(2)
    if D % 16 or D > MAX_HEAD_DIM:
        return f"head width D={D} (the block kernels take multiples of 16 up to {MAX_HEAD_DIM})"
    if not launch.aligned16(q, k, v):
        return "rows not 16-byte aligned"
    if torch.cuda.get_device_capability(q.device)[0] < 8:
        return "no bf16 tensor-core mma before sm_80"
    return None


def layout(graph) -> BlockLayout:
    """The destination-major layout (rows: destinations, columns: sources), built once per graph."""
    def build():
        kc = graph.kernel_csr()
        return BlockLayout(kc.indptr, kc.indices, graph.n_dst, graph.n_src)

    return graph.memo(("block_attention", "layout"), build)


def source_layout(graph) -> BlockLayout:
    """The source-major layout (rows: sources, columns: destinations): the destination-major one
    on an undirected graph whose source CSR is its forward CSR, else the transpose's."""
    def build():
        kc, sc = graph.kernel_csr(), graph.kernel_source_csr()
        if sc.indices is kc.indices:
            return layout(graph)
        return BlockLayout(sc.indptr, sc.indices, graph.n_src, graph.n_dst)

    return graph.memo(("block_attention", "source_layout"), build)


@dataclass(frozen=True)
class Work:
    """The work list of one layout: ``chunks`` (:func:`gnn_fastpath.cuda.worklist.build` over
    the windows, a window's blocks counting as its edges, longest first) and ``split`` (int32
    [n_split, 4]: (row, first workspace row, rows, 0) per row of a split window, the form the
    dot family's merge kernels take; the entries past the last row, with 0 rows, last)."""

    chunks: worklist.RowChunks
    split: Tensor
    n_split: int
    n_part_rows: int


def work(graph, lay: BlockLayout) -> Work:
    """:class:`Work` of ``lay`` (one of ``graph``'s layouts), built once per graph and
    :data:`CHUNK_BLOCKS` (one host read)."""
    def build():
        chunks = worklist.build(lay.window_ptr, CHUNK_BLOCKS, CHUNK_BLOCKS + 1, order="degree")
        sp = chunks.split.long()
        r = torch.arange(WINDOW, device=sp.device)
        rows = sp[:, :1] * WINDOW + r
        first = sp[:, 1:2] * WINDOW + r * sp[:, 2:3]
        n = torch.where(rows < lay.n_rows, sp[:, 2:3], 0)
        split = torch.stack([rows, first, n, torch.zeros_like(n)], -1).view(-1, 4)
        # entries with rows first: the merges stop at the first entry without any
        split = split[torch.sort((split[:, 2] == 0).to(torch.uint8), stable=True).indices].to(torch.int32).contiguous()
        return Work(chunks, split, split.shape[0], chunks.n_slots * WINDOW)

    side = "destination" if lay is layout(graph) else "source"
    return graph.memo(("block_attention", "work", side, CHUNK_BLOCKS), build)


def _source_cells(graph) -> Tensor:
    """int64 [M]: each destination-major CSR entry's cell in the source-major layout (an
    undirected graph's one layout holds edge j -> i at cell (i, j) as destination-major and at
    (j, i) as source-major), built once per graph."""
    def build():
        sc = graph.kernel_source_csr()
        cells = torch.empty_like(source_layout(graph).position)
        cells[sc.csr_pos.long()] = source_layout(graph).position
        return cells

    return graph.memo(("block_attention", "source_cells"), build)


def dropout_bits(graph, H: int, p: float, seed: int, offset: int,
                 source_too: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """Attention dropout, drawn once per call: int32 [n_blocks * 16 * H] bit words of the
    destination-major layout (bit c of word (block * 16 + row) * H + head: that cell's edge is
    kept, by the CSR kernels' Philox multipliers of stream (seed, offset)), and (``source_too``)
    those of the source-major layout, else None. A graph without parallel edges (:func:`usable`)."""
    lay, kc = layout(graph), graph.kernel_csr()
    device = kc.perm.device
    keep = torch.zeros(lay.n_blocks * 16 * H, dtype=torch.int32, device=device)
    keep_src = torch.zeros(source_layout(graph).n_blocks * 16 * H, dtype=torch.int32, device=device) \
        if source_too else None
    n = graph.num_edges * H
    if n:
        KERNELS.kernel(device, "ba_keep_bits").launch(
            launch.cdiv(n, 256), 256, cells=lay.position, cells_src=_source_cells(graph) if source_too else None,
            perm=kc.perm, n_edges=graph.num_edges, H=H, p=p, seed=seed, offset=offset, keep=keep,
            keep_src=keep_src)
    return keep, keep_src


def usable(graph, p: float = 0.0) -> bool:
    """Whether the layout can hold the graph: at most 255 parallel edges between two nodes
    (a cell's uint8 count), none with dropout ``p`` (a cell keys one edge's multiplier)."""
    if p > 0:
        return not layout(graph).has_duplicates()
    try:
        layout(graph).counts()
        source_layout(graph).counts()
    except ValueError:
        return False
    return True


def _name(kernel: str, D: int, device: torch.device, *dtypes: torch.dtype) -> launch.Kernel:
    return KERNELS.kernel(device, kernel, *(launch.ctype(d) for d in dtypes), D)


def forward(graph, q: Tensor, k: Tensor, v: Tensor, scale: float, out_dtype: Optional[torch.dtype] = None,
            p: float = 0.0, seed: int = 0, offset: int = 0) -> Tuple[Tensor, Tensor]:
    """``(out [N_dst, H, D] in out_dtype (default q's), lse [N_dst, H] float32)`` (see
    :func:`unsupported` for the inputs; q, k, v contiguous), attention dropout ``p`` with the
    Philox stream ``(seed, offset)`` (the CSR kernels' multipliers). Every row written: a
    destination without in-edges gets 0 and -inf."""
    n_dst, H, D = q.shape
    out = torch.empty(q.shape, dtype=out_dtype or q.dtype, device=q.device)
    lse = torch.empty((n_dst, H), dtype=torch.float32, device=q.device)
    lay = layout(graph)
    wk = work(graph, lay)
    f32 = dict(dtype=torch.float32, device=q.device)
    part_acc = torch.empty((wk.n_part_rows, H, D), **f32) if wk.n_part_rows else None
    part_ml = torch.empty((wk.n_part_rows, H, 2), **f32) if wk.n_part_rows else None
    if wk.chunks.n_items * H:
        _name("ba_fwd", D, q.device, q.dtype, out.dtype).launch(
            launch.cdiv(wk.chunks.n_items * H, WARPS), 32 * WARPS, window_ptr=lay.window_ptr, cols=lay.cols,
            masks=lay.masks(), counts=lay.counts(), q=q, k=k, v=v, items=wk.chunks.items,
            n_items=wk.chunks.n_items, chunk_blocks=CHUNK_BLOCKS, n_rows=n_dst, H=H, scale=scale,
            keep_bits=dropout_bits(graph, H, p, seed, offset, False)[0] if p > 0 else None, p=p, out=out,
            lse=lse, part_acc=part_acc, part_ml=part_ml)
        merge_split_rows(wk.split, wk.n_split, part_acc, part_ml, out, lse)
    return out, lse


def backward(graph, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor,
             scale: float, p: float = 0.0, seed: int = 0, offset: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` in q's dtype from the forward's ``out`` and ``lse`` (either family's)
    and ``grad_out`` (contiguous, out's dtype): a destination pass (dq and delta = <out, dO>)
    over the destination-major layout, then a source pass (dk, dv, no atomics) over the
    source-major one. Every row written. A float32 ``grad_out`` is rounded to q's dtype first
    (the tensor-core products take 16-bit operands; delta takes the same, so that the gradient
    is the exact one of the rounded grad_out up to the products' own roundings)."""
    n_dst, H, D = q.shape
    n_src = k.size(0)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grad_out16 = grad_out if grad_out.dtype == q.dtype else grad_out.to(q.dtype)
    if not launch.aligned16(grad_out16, out):  # 16-byte copies of grad_out, pair loads of out
        grad_out16, out = grad_out16.clone(), out.clone()
    delta = torch.empty((n_dst, H), dtype=torch.float32, device=q.device)
    f32 = dict(dtype=torch.float32, device=q.device)
    keep, keep_src = dropout_bits(graph, H, p, seed, offset, True) if p > 0 else (None, None)
    lay = layout(graph)
    wk = work(graph, lay)
    if wk.chunks.n_items * H:
        part_dq = torch.empty((wk.n_part_rows, H, D), **f32) if wk.n_part_rows else None
        _name("ba_bwd_dst", D, q.device, q.dtype, out.dtype).launch(
            launch.cdiv(wk.chunks.n_items * H, WARPS), 32 * WARPS, window_ptr=lay.window_ptr, cols=lay.cols,
            masks=lay.masks(), counts=lay.counts(), q=q, k=k, v=v, out=out, grad_out16=grad_out16,
            lse=lse,
            items=wk.chunks.items, n_items=wk.chunks.n_items, chunk_blocks=CHUNK_BLOCKS, n_rows=n_dst, H=H,
            scale=scale, keep_bits=keep, p=p, dq=dq, delta=delta, part_dq=part_dq)
        sum_split_rows(wk.split, wk.n_split, part_dq, dq)
    src = source_layout(graph)
    swk = work(graph, src)
    if swk.chunks.n_items * H:
        part_dk = torch.empty((swk.n_part_rows, H, D), **f32) if swk.n_part_rows else None
        part_dv = torch.empty((swk.n_part_rows, H, D), **f32) if swk.n_part_rows else None
        _name("ba_bwd_src", D, q.device, q.dtype).launch(
            launch.cdiv(swk.chunks.n_items * H, SRC_WARPS), 32 * SRC_WARPS, window_ptr=src.window_ptr,
            cols=src.cols, masks=src.masks(), counts=src.counts(), q=q, k=k, v=v, grad_out16=grad_out16, lse=lse,
            delta=delta, items=swk.chunks.items, n_items=swk.chunks.n_items, chunk_blocks=CHUNK_BLOCKS, n_src=n_src,
            H=H, scale=scale, keep_bits=keep_src, p=p, dk=dk, dv=dv, part_dk=part_dk, part_dv=part_dv)
        sum_split_rows(swk.split, swk.n_split, part_dk, dk)
        sum_split_rows(swk.split, swk.n_split, part_dv, dv)
    return dq, dk, dv
