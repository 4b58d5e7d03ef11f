"""Launcher of the fused GATv2 attention kernels (``gatv2_attention.cu``).

One call per pass: :func:`forward` and :func:`backward` take the Graph, pick the template
instantiation for the head width, fetch the cached work lists, allocate outputs and launch
on torch's current stream. The autograd Function and the design note are in
:mod:`gnn_fastpath.ops.gatv2_attention`.

Settings (:mod:`gnn_fastpath.config`, read per call): ``GNN_FASTPATH_GATV2_CHUNK`` (rows
longer than this are cut into chunks), ``GNN_FASTPATH_GATV2_BWD`` (``atomic`` or
``transposed`` source gradient).

Dtypes: features (x_src, x_dst, edge_term) in one storage dtype T (float32, float16,
bfloat16), ``att`` float32 (the op converts it), outputs in ``out_dtype`` (T or float32).
Gradients that atomics add into are accumulated in float32 scratch and cast to T once.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import config
from . import launch, worklist

SOURCE = "gatv2_attention.cu"
THREADS = 256
#: Bytes per vector access of 16-bit feature rows (launch.bytes16; GNN_FASTPATH_VEC16 overrides):
#: 8, i.e. the float32 lane layout with 4 halves per lane, measured faster than 16-byte
#: accesses on the H200 for this family (benchmarks/results/2026-11-25-h200-issue10).
VEC16_BYTES = 8
WARPS_PER_BLOCK = THREADS // 32
MERGE_THREADS = 256
KERNELS = launch.Family(SOURCE, {"GATV2_THREADS": THREADS, "GATV2_MERGE_THREADS": MERGE_THREADS},
                        together=("gatv2_fwd", "gatv2_bwd_dst", "gatv2_bwd_src"))
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
_MAX_BLOCKS = 1 << 30
#: The forward and the source-major backward use a persistent grid (resident blocks only,
#: warps striding over the work items) when every resident warp gets at least this many
#: items, else one warp per item (benchmarks/results: striding wins on graphs with many
#: rows, one warp per item on tolokers). The destination-major backward is always
#: persistent, so its per-block datt atomics stay few.
PERSISTENT_MIN_ITEMS_PER_WARP = 16


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

    def args(self, edge_term: bool) -> tuple:
        """Template arguments of the gatv2_fwd/bwd_dst/bwd_src instantiation."""
        return (self.vw, self.lh, self.k, self.dc, self.u, edge_term)


def _unroll(floats_per_lane: int) -> int:
    """Edges in flight per step: about 16 float registers per lane for the gathered rows
    (the same for 16-bit rows, which are held converted to float)."""
    return 4 if floats_per_lane <= 4 else 2 if floats_per_lane <= 8 else 1


def unsupported(H: int, D: int) -> Optional[str]:
    """Why the kernels cannot take heads of this shape, or None when they can."""
    if H < 1 or not 1 <= D <= MAX_D:
        return f"head shape H={H}, D={D} (the GATv2 kernels take 1 <= D <= {MAX_D})"
    if H * D >= 2**31:
        return f"H * D = {H * D} (the GATv2 kernels index rows with int32)"
    return None


def config_for(D: int, aligned: bool) -> Config:
    """The float32 instantiation for head width ``D``; ``aligned``: every row pointer is
    16-byte aligned."""
    if aligned and D in SPECIALISED:
        vw, lh, k = SPECIALISED[D]
        return Config(vw, lh, k, D, _unroll(vw * k))
    return _generic(D, 1)


def config_for_16bit(D: int, *tensors: Optional[Tensor]) -> Config:
    """The instantiation for 16-bit features of head width ``D``, read with the widest vector
    (8, 4, 2 or 1 elements: 16, 8, 4 or 2 bytes) that ``D`` and the alignment of every one of
    ``tensors`` (the pass's row tensors, 16-bit and float32 alike) allow."""
    widest = launch.bytes16(VEC16_BYTES) // 2
    for vw in (8, 4, 2):
        if vw <= widest and D % vw == 0 and launch.vector_ok(vw, *tensors):
            if vw == 8 and D in SPECIALISED_16:
                _, lh, k = SPECIALISED_16[D]
                return Config(vw, lh, k, D, _unroll(vw * k))
            if vw == 4 and D in SPECIALISED:  # GNN_FASTPATH_VEC16=8: the float32 lane layout
                _, lh, k = SPECIALISED[D]
                return Config(vw, lh, k, D, _unroll(vw * k))
            return _generic(D, vw)
    return _generic(D, 1)


def _generic(D: int, vw: int) -> Config:
    """Runtime-D instantiation: vectors of ``vw`` elements (D a multiple of it), LH lanes per
    head (a power of two; at least 4 for the scalar float32 path, as it always was; vector
    paths go down to 1, e.g. D = 8 halves: one 16-byte vector per lane, 32 edge slots per
    warp for H = 1), K vectors per lane."""
    if not 1 <= D <= MAX_D:
        raise ValueError(f"GATv2 kernels take head widths 1..{MAX_D}, got {D}")
    n_vec = D // vw
    lh = min(32, max(4 if vw == 1 else 1, launch.next_pow2(n_vec)))
    k = launch.next_pow2(launch.cdiv(n_vec, lh))
    return Config(vw, lh, k, 0, _unroll(vw * k))


def _config(D: int, *tensors: Optional[Tensor]) -> Config:
    """The instantiation for the storage dtype of ``tensors[0]`` (the features)."""
    if tensors[0].dtype == torch.float32:
        return config_for(D, launch.aligned16(*tensors))
    return config_for_16bit(D, *tensors)


def forward_config(cfg: Config, dtype: torch.dtype) -> Config:
    """The forward's instantiation: ``cfg`` with 4 edges in flight for specialised 16-bit rows.

    ptxas (sm_90, 256 threads) puts the 16-bit specialised forward at 113-128 registers with
    U = 4 and no spills, and at ~93 with U = 2: 2 resident blocks per SM either way, so U = 4
    doubles the bytes in flight for free (a 16-bit lane gathers half the bytes of a float32
    lane per edge). The backward keeps U = 2: at U = 4 it needs ~185 registers (1 block/SM).
    """
    if dtype == torch.float32 or cfg.dc == 0:
        return cfg
    return replace(cfg, u=4)


def _split_index(graph, work: worklist.RowChunks, source_major: bool) -> Tensor:
    """int32 [n_slots]: the index in ``work.split_rows`` of each chunk slot's row (slots of
    one row are consecutive), cached with the graph; no host synchronisation."""
    def make():
        owner = torch.arange(work.n_split, device=work.split.device, dtype=torch.int32)
        return torch.repeat_interleave(owner, work.split[:, 2], output_size=work.n_slots)

    # work lists live in the graph's memo as long as the graph: id(work) names this one
    return graph.memo(("gatv2_split_index", source_major, id(work)), make)


def _work(graph, source_major: bool = False) -> worklist.RowChunks:
    chunk = config.setting("GNN_FASTPATH_GATV2_CHUNK")
    return worklist.for_graph(graph, chunk, chunk + 1, source_major=source_major, order="degree")


def _blocks(n_warps: int) -> int:
    return max(1, min(launch.cdiv(n_warps, WARPS_PER_BLOCK), _MAX_BLOCKS))


def _grid(kernel: launch.Kernel, n_work: int, shared_mem: int = 0, always_persistent: bool = False) -> int:
    """Blocks for a launch over ``n_work`` warp-sized work items (see PERSISTENT_MIN_ITEMS_PER_WARP)."""
    resident = launch.resident_blocks(kernel, THREADS, shared_mem)
    if always_persistent or n_work >= resident * WARPS_PER_BLOCK * PERSISTENT_MIN_ITEMS_PER_WARP:
        return min(_blocks(n_work), resident)
    return _blocks(n_work)


def forward(graph, x_src: Tensor, x_dst: Tensor, att: Tensor, edge_term: Optional[Tensor], slope: float,
            p: float, seed: int, offset: int, return_attention,
            out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Fused forward. Inputs contiguous on one GPU, graph on that GPU: x_src, x_dst,
    edge_term in one dtype T (float32/float16/bfloat16), att float32.

    Returns (out [N_dst, H, D] in ``out_dtype`` (default T), lse [N_dst, H] float32, alpha
    [M, H] in ``out_dtype``, caller order, or None). ``return_attention``: False, True
    (softmax weights) or "dropped" (after dropout).
    """
    dev = x_src.device
    n_dst, H, D = graph.n_dst, x_src.shape[1], x_src.shape[2]
    M = graph.num_edges
    out_dtype = x_src.dtype if out_dtype is None else out_dtype
    f32 = dict(dtype=torch.float32, device=dev)
    out = torch.empty(n_dst, H, D, dtype=out_dtype, device=dev)
    lse = torch.empty(n_dst, H, **f32)
    alpha = torch.empty(M, H, dtype=out_dtype, device=dev) if return_attention else None
    if n_dst == 0:
        return out, lse, alpha
    # raw logits stay float32 (rounding them would perturb exp(logit - lse)); for a float32
    # alpha they are normalised in place
    logits = None
    if return_attention:
        logits = alpha if out_dtype == torch.float32 else torch.empty(M, H, **f32)
    kc = graph.kernel_csr()
    work = _work(graph)
    cfg = forward_config(_config(D, x_src, x_dst, att, edge_term, out), x_src.dtype)
    ti, to = launch.ctype(x_src.dtype), launch.ctype(out_dtype)
    has_et = edge_term is not None
    n_tiles = cfg.n_tiles(H)
    S = work.n_slots
    part_acc = torch.empty(S, H, D, **f32) if S else None
    part_m = torch.empty(S, H, **f32) if S else None
    part_l = torch.empty(S, H, **f32) if S else None
    n_work = work.n_items * n_tiles
    fwd = KERNELS.kernel(dev, "gatv2_fwd", ti, to, *cfg.args(has_et))
    fwd.launch(_grid(fwd, n_work), THREADS, items=work.items, n_work=n_work, n_tiles=n_tiles,
               indices=kc.indices, perm=kc.perm, x_src=x_src, x_dst=x_dst, att=att, edge_term=edge_term, H=H,
               D_rt=D, slope=slope, p=p, seed=seed, offset=offset, out=out, lse=lse, part_acc=part_acc,
               part_m=part_m, part_l=part_l, logits=logits)
    if work.n_split:
        merge = KERNELS.kernel(dev, "gatv2_fwd_merge", to)
        merge.launch((min(work.n_split, _MAX_BLOCKS), min(launch.cdiv(H * D, 32), 65535)), MERGE_THREADS,
                     split=work.split, n_split=work.n_split, part_acc=part_acc, part_m=part_m, part_l=part_l,
                     H=H, D=D, out=out, lse=lse)
    if return_attention and M:
        norm = KERNELS.kernel(dev, "gatv2_alpha_from_logits", to)
        norm.launch(_blocks(work.n_items), THREADS, items=work.items, n_items=work.n_items, perm=kc.perm, lse=lse,
                    H=H, p=p, seed=seed, offset=offset, dropped=int(return_attention == "dropped"),
                    logits=logits, alpha=alpha)
    return out, lse, alpha


def _accumulator(out: Optional[Tensor], graph, work: worklist.RowChunks, source_major: bool):
    """(acc, acc_index): where the chunks of split rows add ``out``'s rows.

    float32 ``out``: into ``out`` itself (the kernel's float path), its split rows zeroed
    here; (None, None). 16-bit ``out``: a zeroed float32 [n_split, ...] scratch and the split
    row of each chunk slot (cast into ``out`` by :func:`_finish_accumulator`). (None, None)
    too without split rows or without ``out``.
    """
    if out is None or not work.n_split:
        return None, None
    if out.dtype == torch.float32:
        out.index_fill_(0, work.split_rows, 0.0)
        return None, None
    acc = torch.zeros((work.n_split,) + tuple(out.shape[1:]), dtype=torch.float32, device=out.device)
    return acc, _split_index(graph, work, source_major)


def _finish_accumulator(out: Optional[Tensor], acc: Optional[Tensor], work: worklist.RowChunks) -> None:
    """Cast the float32 sums of the split rows into the 16-bit ``out`` (once, after the kernel)."""
    if acc is not None:
        out.index_copy_(0, work.split_rows, acc.to(out.dtype))


def backward(graph, x_src: Tensor, x_dst: Tensor, att: Tensor, edge_term: Optional[Tensor], out: Tensor,
             lse: Tensor, grad_out: Tensor, alpha: Optional[Tensor], grad_alpha: Optional[Tensor],
             alpha_dropped: bool, slope: float, p: float, seed: int, offset: int,
             needs: Tuple[bool, bool, bool, bool]):
    """Gradients (dx_src, dx_dst, datt, d_edge_term), each None where ``needs`` says so.

    Dtypes as :func:`forward`'s: x_src, x_dst, edge_term in T, att float32; ``out`` (saved),
    ``grad_out`` [N_dst, H, D] contiguous, ``alpha`` and ``grad_alpha`` [M, H] (caller order,
    the gradient of the returned attention, None when there is none) in out's dtype.
    dx_src, dx_dst, d_edge_term come back in T, datt in float32 (the op casts it to att's
    dtype).
    """
    dev = x_src.device
    n_src, n_dst, M = graph.n_src, graph.n_dst, graph.num_edges
    H, D = x_src.shape[1], x_src.shape[2]
    T = x_src.dtype
    f32 = dict(dtype=torch.float32, device=dev)
    need_src, need_dst, need_att, need_et = needs
    need_et = need_et and edge_term is not None
    transposed = need_src and config.setting("GNN_FASTPATH_GATV2_BWD") == "transposed"

    dx_src = dx_src_acc = None  # acc: what the atomic variant adds into (float32)
    if need_src:
        if transposed:
            dx_src = torch.empty(n_src, H, D, dtype=T, device=dev)
        else:
            dx_src_acc = torch.zeros(n_src, H, D, **f32)
            dx_src = dx_src_acc if T == torch.float32 else None  # 16-bit: cast at the end
    dx_dst = torch.empty(n_dst, H, D, dtype=T, device=dev) if need_dst else None
    datt = torch.zeros(H, D, **f32) if need_att else None
    d_edge_term = torch.empty(M, H, D, dtype=T, device=dev) if need_et else None
    if n_dst == 0 or not any((need_src, need_dst, need_att, need_et)):
        if dx_src is None and need_src:
            dx_src = dx_src_acc.to(T)
        elif dx_src is not None:
            dx_src.zero_()
        return dx_src, dx_dst, datt, d_edge_term

    kc = graph.kernel_csr()
    work = _work(graph)
    cfg = _config(D, x_src, x_dst, att, edge_term, out, grad_out)
    ti, to = launch.ctype(T), launch.ctype(out.dtype)
    has_et = edge_term is not None
    n_tiles = cfg.n_tiles(H)

    delta_alpha = None
    if grad_alpha is not None and M:
        delta_alpha = torch.zeros(n_dst, H, **f32)
        k = KERNELS.kernel(dev, "gatv2_delta_alpha", to)
        k.launch(_blocks(work.n_items), THREADS, items=work.items, n_items=work.n_items, perm=kc.perm, alpha=alpha,
                 grad_alpha=grad_alpha, H=H, delta_alpha=delta_alpha)
    dx_dst_acc, dst_index = _accumulator(dx_dst, graph, work, source_major=False)
    delta = torch.empty(n_dst, H, **f32) if transposed else None

    use_smem = need_att and H * D * 4 <= 48 * 1024
    smem = H * D * 4 if use_smem else 0
    n_work = work.n_items * n_tiles
    bwd = KERNELS.kernel(dev, "gatv2_bwd_dst", ti, to, *cfg.args(has_et))
    bwd.launch(_grid(bwd, n_work, smem, always_persistent=True), THREADS, shared_mem=smem,
               items=work.items, n_work=n_work, n_tiles=n_tiles, indptr=kc.indptr, indices=kc.indices,
               perm=kc.perm, x_src=x_src, x_dst=x_dst, att=att, edge_term=edge_term, out=out, grad_out=grad_out,
               lse=lse, delta_alpha=delta_alpha, grad_alpha=grad_alpha, grad_alpha_dropped=int(alpha_dropped), H=H,
               D_rt=D, slope=slope, p=p, seed=seed, offset=offset, dx_src=dx_src_acc, dx_dst=dx_dst,
               dx_dst_acc=dx_dst_acc, acc_index=dst_index, d_edge_term=d_edge_term, datt=datt,
               datt_smem=int(use_smem), delta_out=delta)
    _finish_accumulator(dx_dst, dx_dst_acc, work)
    if need_src and not transposed and dx_src is None:
        dx_src = dx_src_acc.to(T)  # the one cast of the float32 atomic sums

    if transposed and n_src:
        scsr = graph.kernel_source_csr()
        swork = _work(graph, source_major=True)
        src_acc, src_index = _accumulator(dx_src, graph, swork, source_major=True)
        src = KERNELS.kernel(dev, "gatv2_bwd_src", ti, to, *cfg.args(has_et))
        n_swork = swork.n_items * n_tiles
        src.launch(_grid(src, n_swork), THREADS, items=swork.items, n_work=n_swork, n_tiles=n_tiles,
                   s_indices=scsr.indices, s_perm=scsr.perm, x_src=x_src, x_dst=x_dst, att=att,
                   edge_term=edge_term, grad_out=grad_out, lse=lse, delta=delta, grad_alpha=grad_alpha,
                   grad_alpha_dropped=int(alpha_dropped), H=H, D_rt=D, slope=slope, p=p, seed=seed,
                   offset=offset, dx_src=dx_src, dx_src_acc=src_acc, acc_index=src_index)
        _finish_accumulator(dx_src, src_acc, swork)
    return dx_src, dx_dst, datt, d_edge_term
