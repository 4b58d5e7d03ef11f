"""Python launchers of the fused dot-product attention kernels (dot_attention.cu).

Nothing here decides semantics or autograd (that is :mod:`gnn_fastpath.ops.cuda_dot`): these
functions pick a kernel configuration, build the per-graph chunk lists once (cached with the
Graph through ``graph.memo``), allocate outputs and launch on torch's current stream. No call
synchronises with the GPU; the chunk lists are built (with a few host syncs) on a graph's
first use only.
"""
from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from .loader import get_kernel, launch, ptr

SOURCE = "dot_attention.cu"
#: Rows longer than this are cut into chunks of this many edges, each run by its own warp
#: and merged afterwards (super-node load balance).
CHUNK_EDGES = 256
_THREADS = 256


# ------------------------------------------------------------------------------- configs
#: Most floats of a node row one lane may hold per kernel. A lane group takes NH heads of a
#: row (NH = 1, 2, 4) within this budget, so a warp covers 32 / LPH * NH heads. Measured on
#: an H200 (H=4, D=128): NH=2 pays on graphs of low mean in-degree (fewer, fuller warps; less
#: per-row overhead), NH=1 on dense ones (more warps, more gathers in flight).
MAX_ROW_FLOATS = {"dot_fwd": 4, "dot_bwd_dst": 4, "dot_bwd_src": 4}
MAX_ROW_FLOATS_LOW_DEGREE = {"dot_fwd": 8, "dot_bwd_dst": 4, "dot_bwd_src": 4}
#: Mean in-degree below which a graph counts as low-degree for the choice above.
LOW_DEGREE = 16.0
#: Most floats one lane may hold per head (NH = 1); wider heads fall back to the reference.
MAX_FLOATS_PER_LANE = 16
_TEMPLATES = tuple(MAX_ROW_FLOATS)


@dataclass(frozen=True)
class Config:
    """How the kernels map a head onto lanes: VEC floats per load, LPH lanes per head, NV
    vectors per lane, EXACT when the head width D is exactly VEC * LPH * NV (no tail
    masking); ``nh`` maps each templated kernel to its heads per lane group."""

    vec: int
    lph: int
    nv: int
    exact: bool
    nh: Tuple[Tuple[str, int], ...]

    def heads_per_warp(self, kernel: str) -> int:
        return 32 // self.lph * dict(self.nh)[kernel]

    def name(self, kernel: str) -> str:
        return (f"{kernel}<{self.vec}, {self.lph}, {self.nv}, {dict(self.nh)[kernel]}, "
                f"{'true' if self.exact else 'false'}>")


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.lru_cache(maxsize=256)
def config_for(head_dim: int, aligned: bool, heads: int = 1, low_degree: bool = False) -> Optional[Config]:
    """The kernel variant for ``heads`` heads of width ``head_dim``; None when no variant
    serves it.

    ``aligned``: every feature row starts on a 16-byte boundary (all pointers 16-byte
    aligned and ``head_dim % 4 == 0``); then loads are float4. ``low_degree``: the graph's
    mean in-degree is below :data:`LOW_DEGREE`.
    """
    if head_dim < 1 or heads < 1:
        return None
    vec = 4 if aligned and head_dim % 4 == 0 else 1
    nvec = head_dim // vec
    lph = min(32, _next_pow2(nvec))
    nv = -(-nvec // lph)
    floats = nv * vec
    if floats > MAX_FLOATS_PER_LANE:
        return None
    groups = -(-heads // (32 // lph))  # head groups a warp would need for all heads
    budgets = MAX_ROW_FLOATS_LOW_DEGREE if low_degree else MAX_ROW_FLOATS
    nh = []
    for kernel in _TEMPLATES:
        n = 1
        while n < groups and n < 4 and 2 * n * floats <= budgets[kernel]:
            n *= 2
        nh.append((kernel, n))
    return Config(vec, lph, nv, nv * lph == nvec, tuple(nh))


def aligned(*tensors: Optional[Tensor]) -> bool:
    """True when every given tensor's data starts on a 16-byte boundary."""
    return all(t is None or t.data_ptr() % 16 == 0 for t in tensors)


_kernels: dict = {}


def _kernel(cfg: Config, name: str, device: torch.device):
    """Kernel ``name``: a templated kernel (instantiated for ``cfg``, one small module per
    instantiation, compiled on first use) or an extern "C" helper kernel."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (cfg, name, index)
    kernel = _kernels.get(key)
    if kernel is None:
        full = cfg.name(name) if name in _TEMPLATES else name
        exprs = (full,) if name in _TEMPLATES else ()
        kernel = _kernels[key] = get_kernel(SOURCE, full, torch.device("cuda", index), exprs)
    return kernel


def _grid(n_threads: int) -> Tuple[int]:
    return ((n_threads + _THREADS - 1) // _THREADS,)


# ------------------------------------------------------------------------------- chunk lists
@dataclass(frozen=True)
class ChunkList:
    """Rows of a CSR cut into chunks of at most ``chunk_edges`` edges (built on the GPU).

    ``records`` int32 [n_chunks, 4] holds (row, first edge, end edge, slot) per chunk: slot
    -1 when the chunk is the whole row (results written directly), else its partial slot.
    Chunks of split ("heavy") rows come first, then every other row (empty rows included)
    in order. ``heavy_row[r]`` (int32) owns slots ``[slot_ptr[r], slot_ptr[r+1])``.
    """

    records: Tensor
    heavy_row: Tensor
    slot_ptr: Tensor
    n_chunks: int
    n_heavy: int
    n_slots: int
    chunk_edges: int


def build_chunk_list(indptr: Tensor, chunk_edges: int = CHUNK_EDGES) -> ChunkList:
    """Chunk list of a CSR with row offsets ``indptr`` (on the GPU; host syncs: a few)."""
    device = indptr.device
    indptr = indptr.to(torch.int64)
    deg = indptr[1:] - indptr[:-1]
    n_ch = torch.clamp((deg + chunk_edges - 1) // chunk_edges, min=1)
    heavy = n_ch > 1
    heavy_row = torch.nonzero(heavy).flatten()
    light_row = torch.nonzero(~heavy).flatten()
    heavy_nc = n_ch[heavy_row]
    slot_ptr = torch.zeros(heavy_row.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(heavy_nc, 0, out=slot_ptr[1:])
    n_slots = int(slot_ptr[-1])
    owner = torch.repeat_interleave(torch.arange(heavy_row.numel(), device=device), heavy_nc,
                                    output_size=n_slots)
    local = torch.arange(n_slots, device=device) - slot_ptr[owner]
    h_row = heavy_row[owner]
    h_begin = indptr[h_row] + local * chunk_edges
    h_end = torch.minimum(h_begin + chunk_edges, indptr[h_row + 1])
    records = torch.stack([
        torch.cat([h_row, light_row]),
        torch.cat([h_begin, indptr[light_row]]),
        torch.cat([h_end, indptr[light_row + 1]]),
        torch.cat([torch.arange(n_slots, device=device),
                   torch.full((light_row.numel(),), -1, dtype=torch.int64, device=device)]),
    ], 1).to(torch.int32).contiguous()
    return ChunkList(records, heavy_row.to(torch.int32), slot_ptr.to(torch.int32), records.shape[0],
                     heavy_row.numel(), n_slots, chunk_edges)


@dataclass(frozen=True)
class SourceLists:
    """int32 source-major CSR for the transposed backward plus its chunk list: ``dst`` is
    each out-edge's destination, ``cid`` its caller edge id."""

    dst: Tensor
    cid: Tensor
    chunks: ChunkList


class DotGraph:
    """What the kernels need of one Graph, built once and cached with it (``graph.memo``):
    int32 CSR (``indices``, ``perm``), the destination chunk list, whether the graph has
    a low mean in-degree, and (lazily, for the transposed backward) the source lists."""

    def __init__(self, graph):
        kcsr = graph.kernel_csr()
        # Weakly: this object lives in graph.memo, and a strong reference back would make a
        # cycle that keeps the Graph's GPU buffers alive until a full garbage collection.
        self._graph = weakref.ref(graph)
        self.indices = kcsr.indices
        self.perm = kcsr.perm
        self.chunks = build_chunk_list(graph.indptr)
        self.low_degree = graph.degree_stats().mean < LOW_DEGREE
        self._src: Optional[SourceLists] = None

    @property
    def src(self) -> SourceLists:
        if self._src is None:
            graph = self._graph()
            s = graph.source_csr()
            self._src = SourceLists(s.indices.to(torch.int32), graph.perm[s.csr_pos].to(torch.int32),
                                    build_chunk_list(s.indptr))
        return self._src


def dot_graph(graph) -> DotGraph:
    """The cached :class:`DotGraph` of ``graph``."""
    return graph.memo(("dot_attention", CHUNK_EDGES), lambda: DotGraph(graph))


# ------------------------------------------------------------------------------- launches
def _f(x: float) -> np.float32:
    return np.float32(x)


def _u64(x: int) -> np.uint64:
    return np.uint64(x & 0xFFFFFFFFFFFFFFFF)


def forward(cfg: Config, dg: DotGraph, q: Tensor, k: Tensor, v: Tensor, t: Optional[Tensor], scale: float,
            p: float, seed: int, offset: int, want_logits: bool):
    """Run the forward kernels. Returns ``(out, lse, logits)``; ``logits`` [M, H] (caller
    order, raw e_ij) only when ``want_logits``, else None."""
    device = q.device
    n_dst, H, D = q.shape
    chunks = dg.chunks
    out = torch.empty((n_dst, H, D), dtype=torch.float32, device=device)
    lse = torch.empty((n_dst, H), dtype=torch.float32, device=device)
    logits = torch.empty((dg.indices.numel(), H), dtype=torch.float32, device=device) if want_logits else None
    if n_dst == 0:
        return out, lse, logits
    part_acc = part_ml = None
    if chunks.n_slots:
        part_acc = torch.empty((chunks.n_slots, H, D), dtype=torch.float32, device=device)
        part_ml = torch.empty((chunks.n_slots, H, 2), dtype=torch.float32, device=device)
    head_blocks = -(-H // cfg.heads_per_warp("dot_fwd"))
    n_work = chunks.n_chunks * head_blocks
    launch(_kernel(cfg, "dot_fwd", device), _grid(n_work * 32), (_THREADS,),
           (ptr(dg.indices), ptr(dg.perm), ptr(chunks.records), np.int64(n_work), np.int32(head_blocks), ptr(q),
            ptr(k), ptr(v), ptr(t), ptr(out), ptr(lse), ptr(part_acc), ptr(part_ml), ptr(logits), np.int32(H),
            np.int32(D), _f(scale), _f(p), _u64(seed), _u64(offset)), device)
    if chunks.n_heavy:
        n = chunks.n_heavy * H * D
        launch(_kernel(cfg, "dot_fwd_merge", device), _grid(n), (_THREADS,),
               (ptr(chunks.heavy_row), ptr(chunks.slot_ptr), np.int64(chunks.n_heavy), ptr(part_acc),
                ptr(part_ml), ptr(out), ptr(lse), np.int32(H), np.int32(D)), device)
    return out, lse, logits


def finalize_attention(cfg: Config, dg: DotGraph, lse: Tensor, logits: Tensor, dropped: bool, p: float,
                       seed: int, offset: int) -> Tensor:
    """Turn raw logits (in place) into alpha (or alpha * dropout multiplier); returns it."""
    if logits.numel() == 0:
        return logits
    H = logits.shape[1]
    chunks = dg.chunks
    launch(_kernel(cfg, "dot_alpha_finalize", lse.device), _grid(chunks.n_chunks * 32), (_THREADS,),
           (ptr(dg.perm), ptr(chunks.records), np.int64(chunks.n_chunks), ptr(lse), ptr(logits), np.int32(H),
            np.int32(1 if dropped else 0), _f(p), _u64(seed), _u64(offset)), lse.device)
    return logits


def attention_grad_rowsum(cfg: Config, dg: DotGraph, n_dst: int, attn: Tensor, dattn: Tensor) -> Tensor:
    """G [n_dst, H] = sum over each destination's in-edges of attn * dattn (caller order)."""
    H = attn.shape[1]
    gsum = torch.zeros((n_dst, H), dtype=torch.float32, device=attn.device)
    if attn.numel():
        chunks = dg.chunks
        launch(_kernel(cfg, "dot_alpha_grad_rowsum", attn.device), _grid(chunks.n_chunks * 32), (_THREADS,),
               (ptr(dg.perm), ptr(chunks.records), np.int64(chunks.n_chunks), ptr(attn), ptr(dattn), ptr(gsum),
                np.int32(H)), attn.device)
    return gsum


def _sum_partials(cfg: Config, chunks: ChunkList, part: Tensor, dst: Tensor) -> None:
    row_len = dst[0].numel() if dst.numel() else 0
    n = chunks.n_heavy * row_len
    if n:
        launch(_kernel(cfg, "dot_sum_partials", dst.device), _grid(n), (_THREADS,),
               (ptr(chunks.heavy_row), ptr(chunks.slot_ptr), np.int64(chunks.n_heavy), ptr(part), ptr(dst),
                np.int64(row_len)), dst.device)


def backward(cfg: Config, dg: DotGraph, transposed: bool, q: Tensor, k: Tensor, v: Tensor, t: Optional[Tensor],
             out: Tensor, dout: Tensor, lse: Tensor, dattn: Optional[Tensor], gsum: Optional[Tensor],
             dattn_dropped: bool, want_dt: bool, scale: float, p: float, seed: int, offset: int):
    """Gradients ``(dq, dk, dv, dt)`` (dt None unless ``want_dt``).

    ``transposed`` False: atomic mode (dk, dv added along in-edges inside the destination
    pass); True: a source-major pass over the transposed CSR computes dk, dv (no atomics).
    ``dattn``/``gsum``: gradient of the returned attention and its row sums G, or None.
    """
    device = q.device
    n_dst, H, D = q.shape
    chunks = dg.chunks
    dq = torch.empty_like(q)
    dk = torch.empty_like(k) if transposed else torch.zeros_like(k)
    dv = torch.empty_like(v) if transposed else torch.zeros_like(v)
    dt = torch.empty_like(t) if (want_dt and t is not None) else None
    delta = torch.empty((n_dst, H), dtype=torch.float32, device=device) if transposed else None
    if n_dst:
        head_blocks = -(-H // cfg.heads_per_warp("dot_bwd_dst"))
        part_dq = (torch.empty((chunks.n_slots, H, D), dtype=torch.float32, device=device)
                   if chunks.n_slots else None)
        n_work = chunks.n_chunks * head_blocks
        launch(_kernel(cfg, "dot_bwd_dst", device), _grid(n_work * 32), (_THREADS,),
               (ptr(dg.indices), ptr(dg.perm), ptr(chunks.records), np.int64(n_work), np.int32(head_blocks), ptr(q),
                ptr(k), ptr(v), ptr(t), ptr(out), ptr(dout), ptr(lse), ptr(dattn), ptr(gsum),
                np.int32(1 if dattn_dropped else 0), ptr(dq), ptr(part_dq), ptr(None if transposed else dk),
                ptr(None if transposed else dv), ptr(dt), ptr(delta), np.int32(H), np.int32(D), _f(scale), _f(p),
                _u64(seed), _u64(offset)), device)
        if part_dq is not None:
            _sum_partials(cfg, chunks, part_dq, dq)
    if transposed and k.shape[0]:
        src = dg.src
        sc = src.chunks
        part_dk = part_dv = None
        if sc.n_slots:
            part_dk = torch.empty((sc.n_slots, H, D), dtype=torch.float32, device=device)
            part_dv = torch.empty((sc.n_slots, H, D), dtype=torch.float32, device=device)
        head_blocks = -(-H // cfg.heads_per_warp("dot_bwd_src"))
        n_work = sc.n_chunks * head_blocks
        launch(_kernel(cfg, "dot_bwd_src", device), _grid(n_work * 32), (_THREADS,),
               (ptr(src.dst), ptr(src.cid), ptr(sc.records), np.int64(n_work), np.int32(head_blocks), ptr(q),
                ptr(k), ptr(v), ptr(t), ptr(dout), ptr(lse), ptr(delta), ptr(dattn),
                np.int32(1 if dattn_dropped else 0), ptr(dk), ptr(dv), ptr(part_dk), ptr(part_dv), np.int32(H),
                np.int32(D), _f(scale), _f(p), _u64(seed), _u64(offset)), device)
        if part_dk is not None:
            _sum_partials(cfg, sc, part_dk, dk)
            _sum_partials(cfg, sc, part_dv, dv)
    return dq, dk, dv, dt
