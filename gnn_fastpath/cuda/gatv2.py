"""Python launchers of the fused GATv2 attention kernels (``gatv2_attention.cu``).

This module builds the per-graph work lists, picks the template instantiation for a head
width, sizes the grids and launches on torch's current stream. The autograd glue and the
design note are in :mod:`gnn_fastpath.ops.cuda_gatv2`.

Knobs (module constants, read when this module is imported; tests may patch them):

- ``CHUNK`` (env ``GNN_FASTPATH_GATV2_CHUNK``, default 256): rows with more edges than this
  are split into chunks of this many edges, each its own work item.
- ``BWD_DX_SRC`` (env ``GNN_FASTPATH_GATV2_BWD``, ``"atomic"`` or ``"transposed"``): how
  the backward pass forms the source gradient: atomics along in-edges inside the
  destination-major pass, or a separate source-major pass over the transposed CSR.
- ``PERSISTENT_MIN_ITEMS_PER_WARP``: when the forward uses a persistent grid (see ``_grid``).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from .loader import get_kernel, launch, ptr

SOURCE = "gatv2_attention.cu"
THREADS = 256
WARPS_PER_BLOCK = THREADS // 32
#: Rows longer than this many edges are split into chunks of this length.
CHUNK = int(os.environ.get("GNN_FASTPATH_GATV2_CHUNK", "256"))
#: Source-gradient strategy of the backward pass: "atomic" or "transposed".
BWD_DX_SRC = os.environ.get("GNN_FASTPATH_GATV2_BWD", "atomic")
BWD_CHOICES = ("atomic", "transposed")
#: Head widths with a compile-time specialisation (16-byte vector loads): D -> (VW, LH, K).
SPECIALISED = {32: (4, 8, 1), 64: (4, 16, 1), 128: (4, 32, 1), 256: (4, 32, 2)}
#: Largest head width of the generic (scalar) path: 32 lanes x 16 columns.
MAX_D = 512
#: Cap on forward grid size (the kernels loop grid-stride over their work).
_MAX_BLOCKS = 1 << 30
_MERGE_THREADS = 256  # must match GATV2_MERGE_THREADS in the .cu


# ---------------------------------------------------------------------------------------
# Template configuration.

@dataclass(frozen=True)
class Config:
    """One instantiation: VW floats per vector, LH lanes per head, K vectors per lane,
    DC the compile-time head width (0: runtime D), U edges in flight per step."""

    vw: int
    lh: int
    k: int
    dc: int
    u: int

    def heads_per_tile(self, H: int) -> int:
        return min(H, 32 // self.lh)

    def n_tiles(self, H: int) -> int:
        return -(-H // self.heads_per_tile(H))

    def names(self, edge_term: bool) -> Tuple[str, str, str]:
        args = f"{self.vw},{self.lh},{self.k},{self.dc},{self.u},{'true' if edge_term else 'false'}"
        return (f"gatv2_fwd<{args}>", f"gatv2_bwd_dst<{args}>", f"gatv2_bwd_src<{args}>")


def _unroll(floats_per_lane: int) -> int:
    return 4 if floats_per_lane <= 4 else 2 if floats_per_lane <= 8 else 1


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def supports(H: int, D: int) -> bool:
    """Whether the kernels take heads of this shape (else the op uses the reference)."""
    return H >= 1 and 1 <= D <= MAX_D and H * D < 2**31


def config_for(D: int, aligned: bool) -> Config:
    """The instantiation for head width ``D``; ``aligned``: every row pointer is 16-byte aligned."""
    if aligned and D in SPECIALISED:
        vw, lh, k = SPECIALISED[D]
        return Config(vw, lh, k, D, _unroll(vw * k))
    if not 1 <= D <= MAX_D:
        raise ValueError(f"GATv2 kernels take head widths 1..{MAX_D}, got {D}")
    lh = min(32, max(4, _next_pow2(D)))
    k = _next_pow2(-(-D // lh))
    return Config(1, lh, k, 0, _unroll(k))


def aligned(*tensors: Optional[Tensor]) -> bool:
    return all(t is None or t.data_ptr() % 16 == 0 for t in tensors)


_kernels = {}


def _kernel(device: torch.device, cfg: Config, edge_term: bool, which: str):
    """Kernel ``which`` ("fwd", "bwd_dst", "bwd_src" or an extern "C" name) of the module
    compiled for (cfg, edge_term): one module per instantiation set, built on first use."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, cfg, edge_term, which)
    kernel = _kernels.get(key)
    if kernel is None:
        names = cfg.names(edge_term)
        pos = {"fwd": 0, "bwd_dst": 1, "bwd_src": 2}.get(which)
        kernel = get_kernel(SOURCE, names[pos] if pos is not None else which, torch.device("cuda", index),
                            name_expressions=names)
        _kernels[key] = kernel
    return kernel


# ---------------------------------------------------------------------------------------
# Work lists (built once per graph and row layout, cached in graph.memo).

@dataclass(frozen=True)
class WorkList:
    """Work items over the rows of a CSR.

    ``items`` int32 [n_items, 4]: (row, edge begin, edge end, slot), slot = -1 for a row
    done in one item, else the chunk's workspace slot (0 .. n_split_chunks-1). Every row
    has at least one item (empty rows too: they write zeros). Chunks of split rows come
    first, then whole rows by decreasing length (long work starts early).
    ``split`` int32 [n_split, 4]: (row, first slot, number of chunks, 0) per split row;
    ``split_rows`` int64 [n_split] the same rows (for zeroing before atomics).
    """

    items: Tensor
    n_items: int
    split: Tensor
    n_split: int
    n_split_chunks: int
    split_rows: Tensor


def build_work_list(indptr: Tensor, chunk: int) -> WorkList:
    """Work items for the CSR rows of ``indptr`` (int64, on the GPU); a few host syncs."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    dev = indptr.device
    indptr = indptr.to(torch.int64)
    deg = indptr[1:] - indptr[:-1]
    is_split = deg > chunk
    split_rows = torch.nonzero(is_split).flatten()
    whole_rows = torch.nonzero(~is_split).flatten()
    # Longest first, stably (ties keep row order).
    split_rows = split_rows[torch.sort(deg[split_rows], descending=True, stable=True).indices]
    whole_rows = whole_rows[torch.sort(deg[whole_rows], descending=True, stable=True).indices]

    n_chunks = (deg[split_rows] + chunk - 1) // chunk
    first = torch.cumsum(n_chunks, 0) - n_chunks
    n_split_chunks = int(n_chunks.sum()) if split_rows.numel() else 0
    chunk_owner = torch.repeat_interleave(torch.arange(split_rows.numel(), device=dev), n_chunks,
                                          output_size=n_split_chunks)
    slot = torch.arange(n_split_chunks, device=dev)
    row = split_rows[chunk_owner]
    begin = indptr[row] + (slot - first[chunk_owner]) * chunk
    end = torch.minimum(begin + chunk, indptr[row + 1])
    split_items = torch.stack([row, begin, end, slot], 1)

    whole_items = torch.stack([whole_rows, indptr[whole_rows], indptr[whole_rows + 1],
                               torch.full_like(whole_rows, -1)], 1)
    items = torch.cat([split_items, whole_items]).to(torch.int32).contiguous()
    split = torch.stack([split_rows, first, n_chunks, torch.zeros_like(split_rows)], 1).to(torch.int32).contiguous()
    return WorkList(items, items.shape[0], split, split_rows.numel(), n_split_chunks, split_rows)


def dst_work(graph, chunk: Optional[int] = None) -> WorkList:
    """Work list over destination rows of ``graph`` (cached per chunk length)."""
    chunk = CHUNK if chunk is None else int(chunk)
    return graph.memo(("gatv2.dst_work", chunk), lambda: build_work_list(graph.indptr, chunk))


@dataclass(frozen=True)
class SourceLayout:
    """int32 transposed CSR for the source-major backward: destination id and caller edge
    id of each out-edge, plus its work list."""

    indices: Tensor
    perm: Tensor
    work: WorkList


def src_layout(graph, chunk: Optional[int] = None) -> SourceLayout:
    chunk = CHUNK if chunk is None else int(chunk)

    def build():
        s = graph.source_csr()
        return SourceLayout(s.indices.to(torch.int32), graph.perm[s.csr_pos].to(torch.int32),
                            build_work_list(s.indptr, chunk))

    return graph.memo(("gatv2.src_layout", chunk), build)


# ---------------------------------------------------------------------------------------
# Grid sizing.

def _sm_count(device: torch.device) -> int:
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_resident_cache = {}


def _resident_blocks(kernel, smem: int) -> int:
    """Blocks of THREADS threads of ``kernel`` that fit on one multiprocessor at once."""
    key = (id(kernel), smem)  # kernels live in _kernels: ids stay unique
    n = _resident_cache.get(key)
    if n is None:
        try:
            from cupy.cuda import driver

            func = getattr(kernel, "kernel", kernel)  # RawKernel -> cupy.cuda.Function
            n = int(driver.occupancyMaxActiveBlocksPerMultiprocessor(func.ptr, THREADS, smem))
        except Exception:  # older CuPy: estimate from the register count
            regs = max(8, -(-int(getattr(kernel, "num_regs", 64)) // 8) * 8)
            n = max(1, 65536 // (regs * THREADS))
        n = max(1, n)
        _resident_cache[key] = n
    return n


def _blocks_for(n_warps: int) -> int:
    return max(1, min(-(-n_warps // WARPS_PER_BLOCK), _MAX_BLOCKS))


#: The forward and the source-major backward use a persistent grid (resident blocks only,
#: warps striding over the work items) when every resident warp gets at least this many
#: items, else one warp per item. Measured on the H200 (H=2, D=64): striding was 10-20%
#: faster on graphs with many rows (arxiv-, roads-, pokec-like: far fewer block launches),
#: one warp per item on tolokers (13k heavy items, balanced best by the block scheduler).
#: (Dynamic fetching from an atomic counter was tried: no better, more registers.)
PERSISTENT_MIN_ITEMS_PER_WARP = 16


def _grid(kernel, n_work: int, device: torch.device, smem: int = 0, always_persistent: bool = False) -> int:
    """Blocks for a launch over ``n_work`` work items (see PERSISTENT_MIN_ITEMS_PER_WARP).
    ``always_persistent``: never more blocks than are resident at once (the destination-
    major backward, whose per-block datt atomics must stay few)."""
    resident = _resident_blocks(kernel, smem) * _sm_count(device)
    if always_persistent or n_work >= resident * WARPS_PER_BLOCK * PERSISTENT_MIN_ITEMS_PER_WARP:
        return min(_blocks_for(n_work), resident)
    return _blocks_for(n_work)


def _i32(v) -> np.int32:
    return np.int32(v)


def _i64(v) -> np.int64:
    return np.int64(v)


def _f32(v) -> np.float32:
    return np.float32(v)


def _u64(v) -> np.uint64:
    return np.uint64(v)


# ---------------------------------------------------------------------------------------
# Forward.

def forward(graph, x_src: Tensor, x_dst: Tensor, att: Tensor, edge_term: Optional[Tensor], slope: float,
            p: float, seed: int, offset: int, return_attention) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Fused forward. Inputs contiguous fp32 on one GPU, graph on that GPU.

    Returns (out [N_dst, H, D], lse [N_dst, H], alpha [M, H] caller order or None).
    ``return_attention``: False, True (softmax weights) or "dropped" (after dropout).
    """
    dev = x_src.device
    n_dst, H, D = graph.n_dst, x_src.shape[1], x_src.shape[2]
    M = graph.num_edges
    out = torch.empty(n_dst, H, D, dtype=torch.float32, device=dev)
    lse = torch.empty(n_dst, H, dtype=torch.float32, device=dev)
    alpha = torch.empty(M, H, dtype=torch.float32, device=dev) if return_attention else None
    if n_dst == 0:
        return out, lse, alpha
    kc = graph.kernel_csr()
    work = dst_work(graph)
    cfg = config_for(D, aligned(x_src, x_dst, att, edge_term))
    has_et = edge_term is not None
    n_tiles = cfg.n_tiles(H)
    S = work.n_split_chunks
    if S:
        ws_acc = torch.empty(S, H, D, dtype=torch.float32, device=dev)
        ws_m = torch.empty(S, H, dtype=torch.float32, device=dev)
        ws_l = torch.empty(S, H, dtype=torch.float32, device=dev)
    else:
        ws_acc = ws_m = ws_l = None
    n_work = work.n_items * n_tiles
    kernel = _kernel(dev, cfg, has_et, "fwd")
    launch(kernel, (_grid(kernel, n_work, dev),), (THREADS,), (
        ptr(work.items), _i64(n_work), _i32(n_tiles), ptr(kc.indices), ptr(kc.perm),
        ptr(x_src), ptr(x_dst), ptr(att), ptr(edge_term), _i32(H), _i32(D), _f32(slope),
        _f32(p), _u64(seed), _u64(offset), ptr(out), ptr(lse), ptr(ws_acc), ptr(ws_m), ptr(ws_l), ptr(alpha)), dev)
    if work.n_split:
        merge = _kernel(dev, cfg, has_et, "gatv2_fwd_merge")
        launch(merge, (min(work.n_split, _MAX_BLOCKS), min(-(-(H * D) // 32), 65535)), (_MERGE_THREADS,), (
            ptr(work.split), _i32(work.n_split), ptr(ws_acc), ptr(ws_m), ptr(ws_l), _i32(H), _i32(D),
            ptr(out), ptr(lse)), dev)
    if return_attention and M:
        norm = _kernel(dev, cfg, has_et, "gatv2_alpha_norm")
        launch(norm, (_blocks_for(work.n_items),), (THREADS,), (
            ptr(work.items), _i64(work.n_items), ptr(kc.perm), ptr(lse), _i32(H), _f32(p), _u64(seed),
            _u64(offset), _i32(1 if return_attention == "dropped" else 0), ptr(alpha)), dev)
    return out, lse, alpha


# ---------------------------------------------------------------------------------------
# Backward.

def backward(graph, x_src: Tensor, x_dst: Tensor, att: Tensor, edge_term: Optional[Tensor], out: Tensor,
             lse: Tensor, dout: Tensor, alpha: Optional[Tensor], galpha: Optional[Tensor], alpha_dropped: bool,
             slope: float, p: float, seed: int, offset: int, needs: Tuple[bool, bool, bool, bool],
             variant: Optional[str] = None):
    """Gradients (dx_src, dx_dst, datt, dedge_term), each None where ``needs`` says so.

    ``dout`` [N_dst, H, D] contiguous; ``galpha`` [M, H] (caller order) is the gradient of
    the returned attention (None when there is none), ``alpha`` the returned attention.
    ``variant``: "atomic" or "transposed" (default :data:`BWD_DX_SRC`).
    """
    variant = BWD_DX_SRC if variant is None else variant
    if variant not in BWD_CHOICES:
        raise ValueError(f"GATv2 backward variant must be one of {BWD_CHOICES}, got {variant!r} "
                         "(GNN_FASTPATH_GATV2_BWD)")
    dev = x_src.device
    n_src, n_dst, M = graph.n_src, graph.n_dst, graph.num_edges
    H, D = x_src.shape[1], x_src.shape[2]
    f32 = dict(dtype=torch.float32, device=dev)
    need_src, need_dst, need_att, need_et = needs
    need_et = need_et and edge_term is not None
    transposed = variant == "transposed" and need_src

    dx_src = None
    if need_src:
        dx_src = torch.empty(n_src, H, D, **f32) if transposed else torch.zeros(n_src, H, D, **f32)
    dx_dst = torch.empty(n_dst, H, D, **f32) if need_dst else None
    datt = torch.zeros(H, D, **f32) if need_att else None
    det = torch.empty(M, H, D, **f32) if need_et else None
    if n_dst == 0 or not any((need_src, need_dst, need_att, need_et)):
        if dx_src is not None:
            dx_src.zero_()
        return dx_src, dx_dst, datt, det

    kc = graph.kernel_csr()
    work = dst_work(graph)
    cfg = config_for(D, aligned(x_src, x_dst, att, edge_term, out, dout))
    has_et = edge_term is not None
    n_tiles = cfg.n_tiles(H)

    ga = None
    if galpha is not None and M:
        ga = torch.zeros(n_dst, H, **f32)
        dot = _kernel(dev, cfg, has_et, "gatv2_alpha_grad_dot")
        launch(dot, (_blocks_for(work.n_items),), (THREADS,), (
            ptr(work.items), _i64(work.n_items), ptr(kc.perm), ptr(alpha), ptr(galpha), _i32(H), ptr(ga)), dev)
    if dx_dst is not None and work.n_split:
        dx_dst.index_fill_(0, work.split_rows, 0.0)
    gbuf = torch.empty(n_dst, H, **f32) if transposed else None

    kernel = _kernel(dev, cfg, has_et, "bwd_dst")
    HD = H * D
    use_smem = need_att and HD * 4 <= 48 * 1024
    smem = HD * 4 if use_smem else 0
    n_work = work.n_items * n_tiles
    launch(kernel, (_grid(kernel, n_work, dev, smem, always_persistent=True),), (THREADS,), (
        ptr(work.items), _i64(n_work), _i32(n_tiles), ptr(kc.indptr), ptr(kc.indices), ptr(kc.perm),
        ptr(x_src), ptr(x_dst), ptr(att), ptr(edge_term), ptr(out), ptr(dout), ptr(lse), ptr(ga), ptr(galpha),
        _i32(1 if alpha_dropped else 0), _i32(H), _i32(D), _f32(slope), _f32(p), _u64(seed), _u64(offset),
        ptr(None if transposed else dx_src), ptr(dx_dst), ptr(det), ptr(datt), _i32(1 if use_smem else 0),
        ptr(gbuf)), dev, shared_mem=smem)

    if transposed and n_src:
        layout = src_layout(graph)
        swork = layout.work
        if swork.n_split:
            dx_src.index_fill_(0, swork.split_rows, 0.0)
        skernel = _kernel(dev, cfg, has_et, "bwd_src")
        n_swork = swork.n_items * n_tiles
        launch(skernel, (_grid(skernel, n_swork, dev),), (THREADS,), (
            ptr(swork.items), _i64(n_swork), _i32(n_tiles), ptr(layout.indices), ptr(layout.perm),
            ptr(x_src), ptr(x_dst), ptr(att), ptr(edge_term), ptr(dout), ptr(lse), ptr(gbuf), ptr(galpha),
            _i32(1 if alpha_dropped else 0), _i32(H), _i32(D), _f32(slope), _f32(p), _u64(seed), _u64(offset),
            ptr(dx_src)), dev)
    return dx_src, dx_dst, datt, det
