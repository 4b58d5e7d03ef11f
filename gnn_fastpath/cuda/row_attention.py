"""Launcher glue of the row-attention kernel families (GATv2, GAT): what their launchers share.

Both walk the destination rows (or, in a source-major backward, the source rows) of the
row-chunk work list with one warp per (work item, head tile), in the lane layout of
``attention_common.cuh`` (``GfRow``, ``gf_lane``): :class:`Config` and the functions that pick
it from the head width, the dtype and the rows' alignment; the grid (one warp per item or a
persistent grid); and the float32 accumulators of split rows. Each family keeps its own
tuning (edges in flight, 16-bit vector width, persistence threshold) and passes it in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import launch, worklist

#: Threads per block of the row kernels.
THREADS = 256
WARPS_PER_BLOCK = THREADS // 32
#: Head widths with a compile-time specialisation (16-byte vector loads): D -> (VW, LH, K)
#: for float32 features (float4: 4 floats per lane and vector) ...
SPECIALISED = {32: (4, 8, 1), 64: (4, 16, 1), 128: (4, 32, 1), 256: (4, 32, 2)}
#: ... and for 16-bit features: 8 halves per 16-byte vector, so a head takes half the lanes
#: of float32 and a warp covers twice the heads (or edge slots) for the same registers per
#: lane; fewer shuffles and index broadcasts per byte moved than 8-byte (VW = 4) loads.
SPECIALISED_16 = {32: (8, 4, 1), 64: (8, 8, 1), 128: (8, 16, 1), 256: (8, 32, 1)}
#: Largest head width of the generic path: 32 lanes x 16 columns (scalar float32).
MAX_D = 512
#: Cap on grid size (the kernels loop grid-stride over their work).
MAX_BLOCKS = 1 << 30
#: Blocks (per column tile) of a merge over a static work list's split entries.
STATIC_MERGE_BLOCKS = 1024


@dataclass(frozen=True)
class Config:
    """One instantiation: VW floats per vector, LH lanes per head, K vectors per lane,
    DC the compile-time head width (0: runtime D), U edges in flight per step."""

    vw: int
    lh: int
    k: int
    dc: int
    u: int

    def n_tiles(self, H: int) -> int:
        return launch.cdiv(H, min(H, 32 // self.lh))

    def args(self, *extra) -> tuple:
        """Template arguments of a row kernel's instantiation (after its storage types)."""
        return (self.vw, self.lh, self.k, self.dc, self.u) + tuple(extra)


def unsupported(H: int, D: int, family: str) -> Optional[str]:
    """Why the row kernels cannot take heads of this shape, or None when they can."""
    if H < 1 or not 1 <= D <= MAX_D:
        return f"head shape H={H}, D={D} (the {family} kernels take 1 <= D <= {MAX_D})"
    if H * D >= 2**31:
        return f"H * D = {H * D} (the {family} kernels index rows with int32)"
    return None


def config_for(D: int, aligned: bool, unroll: Callable[[int], int], family: str = "row attention") -> Config:
    """The float32 instantiation for head width ``D``; ``aligned``: every row pointer is
    16-byte aligned; ``unroll``: edges in flight for a given number of floats per lane."""
    if aligned and D in SPECIALISED:
        vw, lh, k = SPECIALISED[D]
        return Config(vw, lh, k, D, unroll(vw * k))
    return generic(D, 1, unroll, family)


def config_for_16bit(D: int, *tensors: Optional[Tensor], vec16_bytes: int, unroll: Callable[[int], int],
                     family: str = "row attention") -> Config:
    """The instantiation for 16-bit features of head width ``D``, read with the widest vector
    (8, 4, 2 or 1 elements: 16, 8, 4 or 2 bytes) that ``D``, the family's default access width
    ``vec16_bytes`` (``GNN_FASTPATH_VEC16`` overrides it) and the alignment of every one of
    ``tensors`` (the pass's row tensors, 16-bit and float32 alike) allow."""
    widest = launch.bytes16(vec16_bytes) // 2
    for vw in (8, 4, 2):
        if vw <= widest and D % vw == 0 and launch.vector_ok(vw, *tensors):
            if vw == 8 and D in SPECIALISED_16:
                _, lh, k = SPECIALISED_16[D]
                return Config(vw, lh, k, D, unroll(vw * k))
            if vw == 4 and D in SPECIALISED:  # GNN_FASTPATH_VEC16=8: the float32 lane layout
                _, lh, k = SPECIALISED[D]
                return Config(vw, lh, k, D, unroll(vw * k))
            return generic(D, vw, unroll, family)
    return generic(D, 1, unroll, family)


def generic(D: int, vw: int, unroll: Callable[[int], int], family: str = "row attention") -> Config:
    """Runtime-D instantiation: vectors of ``vw`` elements (D a multiple of it), LH lanes per
    head (a power of two; at least 4 for the scalar float32 path; vector paths go down to 1,
    e.g. D = 8 halves: one 16-byte vector per lane, 32 edge slots per warp for H = 1), K
    vectors per lane."""
    if not 1 <= D <= MAX_D:
        raise ValueError(f"{family} kernels take head widths 1..{MAX_D}, got {D}")
    n_vec = D // vw
    lh = min(32, max(4 if vw == 1 else 1, launch.next_pow2(n_vec)))
    k = launch.next_pow2(launch.cdiv(n_vec, lh))
    return Config(vw, lh, k, 0, unroll(vw * k))


# ----------------------------------------------------------------------------------------
# Dropout stream (all three attention families).

#: Static shared memory of a GF_DEVICE_RNG=1 kernel: GfPhilox's key (attention_common.cuh).
RNG_SHARED_BYTES = 16


def stream_families(source: str, defines: Dict[str, int],
                    together: Sequence[str] = ()) -> Tuple[launch.Family, launch.Family]:
    """(scalar, device) kernel families of an attention source: the dropout key from the scalar
    ``seed, offset`` parameters (rng None), or read from the rng tensor (``GF_DEVICE_RNG=1``,
    attention_common.cuh's ``GfPhilox``), each compiled on first use. A compile-time choice,
    not a null test at run time: the device read (shared memory, a block barrier) changes the
    register allocation of the kernels, and the eager ones must keep theirs."""
    return (launch.Family(source, defines, together),
            launch.Family(source, {**defines, "GF_DEVICE_RNG": 1}, together))


def philox_stream(seed: Union[int, Tensor], offset: Optional[int],
                  device: Optional[torch.device] = None) -> Tuple[Optional[Tensor], int, int]:
    """(rng, seed, offset) kernel arguments of a dropout stream given as ints ``(seed, offset)``
    or as an int64 tensor [2] holding them, passed as ``seed`` with ``offset`` None.

    A tensor becomes ``rng`` (the kernels read it at launch: a CUDA graph replays the launch
    with the values the tensor holds then, where scalar arguments stay those of the capture)
    and the scalars 0; ints give ``rng`` None. No host synchronisation; the tensor is copied
    (a device copy, captured as such) only when it is not contiguous and 16-byte aligned,
    as the kernels read it with one 16-byte load.
    """
    if not isinstance(seed, Tensor):
        return None, int(seed), int(offset)
    if offset is not None:
        raise TypeError("pass the dropout stream as ints (seed, offset) or as a tensor seed with offset None")
    if seed.dtype != torch.int64 or seed.numel() != 2:
        raise ValueError(f"the dropout stream tensor holds (seed, offset): int64 [2], got {seed.dtype} "
                         f"{list(seed.shape)}")
    if device is not None and seed.device != device:
        raise ValueError(f"the dropout stream tensor is on {seed.device}, the inputs on {device}")
    rng = (seed if seed.dim() == 1 else seed.reshape(2)).contiguous()  # the tensor itself when it can
    if rng.data_ptr() % 16:
        rng = rng.clone(memory_format=torch.contiguous_format)  # a fresh allocation: aligned
    return rng, 0, 0


# ----------------------------------------------------------------------------------------
# Grids.

@dataclass
class ForwardBuffers:
    """What a row-attention forward writes: out [N_dst, H, D] (out dtype), lse [N_dst, H]
    float32, alpha [M, H] (out dtype) when attention is returned, logits [M, H] float32 for the
    raw logits behind alpha (alpha itself for a float32 alpha: normalised in place; rounding
    them to 16 bits would perturb exp(logit - lse)), and the chunk state of split rows
    (part_acc [S, H, D], part_m / part_l [S, H] float32; None without split rows)."""

    out: Tensor
    lse: Tensor
    alpha: Optional[Tensor]
    logits: Optional[Tensor]
    part_acc: Optional[Tensor] = None
    part_m: Optional[Tensor] = None
    part_l: Optional[Tensor] = None


def forward_buffers(n_dst: int, M: int, H: int, D: int, out_dtype: torch.dtype, device: torch.device,
                    return_attention) -> ForwardBuffers:
    """The outputs of a forward (chunk state not yet: :meth:`with_chunks` once the work list is known)."""
    f32 = dict(dtype=torch.float32, device=device)
    alpha = torch.empty(M, H, dtype=out_dtype, device=device) if return_attention else None
    logits = None
    if return_attention:
        logits = alpha if out_dtype == torch.float32 else torch.empty(M, H, **f32)
    return ForwardBuffers(torch.empty(n_dst, H, D, dtype=out_dtype, device=device), torch.empty(n_dst, H, **f32),
                          alpha, logits)


def work(graph, chunk: int, source_major: bool = False, order: str = "row") -> worklist.RowChunks:
    """The row-chunk work list of a row-attention pass: rows longer than ``chunk`` edges cut
    into chunks of ``chunk``, cached with the graph; on a static graph (compiled path) the
    list sized from shapes (:func:`worklist.build_static`), whose split rows the
    accumulators below and the merge kernels handle too."""
    if not graph.static:
        return worklist.for_graph(graph, chunk, chunk + 1, source_major=source_major, order=order)
    return worklist.static_geometry(graph, static_work(chunk, source_major, order))


def backward_variant(mode: str, work: worklist.RowChunks) -> str:
    """The backward variant to run on ``work``: ``mode``, except ``"atomic"`` (one destination
    pass) where the list leaves out the extra row of removed edges
    (:attr:`worklist.RowChunks.skips_last_row`): a source-major pass would walk those edges
    against their empty row's -inf ``lse``."""
    return "atomic" if work.skips_last_row else mode


def zero_skipped(work: worklist.RowChunks, *per_edge: Optional[Tensor]) -> None:
    """Zero the per-edge outputs (alpha, edge gradients) of a launch over ``work`` that leaves
    out the extra row: no kernel writes its edges' entries, and they are exactly 0."""
    if work.skips_last_row:
        for t in per_edge:
            if t is not None:
                t.zero_()


def static_work(chunk: int, source_major: bool = False, order: str = "row") -> worklist.StaticGeometry:
    """The static graph's work list :func:`work` reads (the operators are handed it)."""
    return worklist.StaticGeometry("row_chunks", chunk, source_major, order)


def with_chunks(buf: ForwardBuffers, work: worklist.RowChunks) -> ForwardBuffers:
    """``buf`` with the chunk state of ``work``'s split rows allocated (none without them)."""
    S = work.n_slots
    if S:
        H, D = buf.out.shape[1], buf.out.shape[2]
        f32 = dict(dtype=torch.float32, device=buf.out.device)
        buf.part_acc, buf.part_m, buf.part_l = torch.empty(S, H, D, **f32), torch.empty(S, H, **f32), \
            torch.empty(S, H, **f32)
    return buf


def merge_chunks(merge: launch.Kernel, threads: int, buf: ForwardBuffers, work: worklist.RowChunks) -> None:
    """Launch a family's ``*_fwd_merge`` kernel (``gf_merge_chunks``) over ``work``'s split rows:
    out and lse of each split row from its chunks' states."""
    H, D = buf.out.shape[1], buf.out.shape[2]
    # a static list has an entry for every row, most with no chunks: blocks stride over them
    n_blocks = min(work.n_split, STATIC_MERGE_BLOCKS if work.static else MAX_BLOCKS)
    merge.launch((n_blocks, min(launch.cdiv(H * D, 32), 65535)), threads, split=work.split,
                 n_split=work.n_split, part_acc=buf.part_acc, part_m=buf.part_m, part_l=buf.part_l, H=H, D=D,
                 out=buf.out, lse=buf.lse)


def blocks(n_warps: int) -> int:
    """Blocks of THREADS threads for one warp per work item."""
    return max(1, min(launch.cdiv(n_warps, WARPS_PER_BLOCK), MAX_BLOCKS))


def grid(kernel: launch.Kernel, n_work: int, min_items_per_warp: int, shared_mem: int = 0,
         always_persistent: bool = False) -> int:
    """Blocks for a launch over ``n_work`` warp-sized work items: a persistent grid
    (resident blocks only, warps striding over the items) when every resident warp gets at
    least ``min_items_per_warp`` items (or ``always_persistent``), else one warp per item."""
    resident = launch.resident_blocks(kernel, THREADS, shared_mem)
    if always_persistent or n_work >= resident * WARPS_PER_BLOCK * min_items_per_warp:
        return min(blocks(n_work), resident)
    return blocks(n_work)


# ----------------------------------------------------------------------------------------
# Split rows.

def split_index(graph, work: worklist.RowChunks, source_major: bool) -> Tensor:
    """int32 [n_slots]: the index in ``work.split_rows`` of each chunk slot's row (slots of
    one row are consecutive), cached with the graph; no host synchronisation."""
    if work.static:
        return work.slot_split

    def make():
        owner = torch.arange(work.n_split, device=work.split.device, dtype=torch.int32)
        return torch.repeat_interleave(owner, work.split[:, 2], output_size=work.n_slots)

    # work lists live in the graph's memo as long as the graph: id(work) names this one
    return graph.memo(("row_attention_split_index", source_major, id(work)), make)


def accumulator(out: Optional[Tensor], graph, work: worklist.RowChunks, source_major: bool):
    """(acc, acc_index): where the chunks of split rows add ``out``'s rows.

    float32 ``out``: into ``out`` itself (the kernel's float path), its split rows zeroed
    here; (None, None). 16-bit ``out``: a zeroed float32 [n_split, ...] scratch and the split
    row of each chunk slot (cast into ``out`` by :func:`finish_accumulator`). (None, None)
    too without split rows or without ``out``. A static list marks its split rows with a
    mask (every row has a split entry there), so the zeroing is a masked fill.
    """
    if out is None or not work.n_split:
        return None, None
    if out.dtype == torch.float32:
        if work.static:
            out.masked_fill_(work.split_mask.view((-1,) + (1,) * (out.dim() - 1)), 0.0)
        else:
            out.index_fill_(0, work.split_rows, 0.0)
        return None, None
    acc = torch.zeros((work.n_split,) + tuple(out.shape[1:]), dtype=torch.float32, device=out.device)
    return acc, split_index(graph, work, source_major)


def finish_accumulator(out: Optional[Tensor], acc: Optional[Tensor], work: worklist.RowChunks) -> None:
    """Cast the float32 sums of the split rows into the 16-bit ``out`` (once, after the kernel)."""
    if acc is None:
        return
    if work.static:  # every row has a scratch row: keep out's where the row is not split
        mask = work.split_mask.view((-1,) + (1,) * (out.dim() - 1))
        out.copy_(torch.where(mask, acc.to(out.dtype), out))
    else:
        out.index_copy_(0, work.split_rows, acc.to(out.dtype))
