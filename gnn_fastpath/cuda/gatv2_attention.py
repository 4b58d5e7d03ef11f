"""Launcher of the fused GATv2 attention kernels (``gatv2_attention.cu``).

One call per pass: :func:`forward` and :func:`backward` take the Graph, pick the template
instantiation for the head width, fetch the cached work lists, allocate outputs and launch
on torch's current stream. The autograd Function and the design note are in
:mod:`gnn_fastpath.ops.gatv2_attention`.

Settings (:mod:`gnn_fastpath.config`, read per call): ``GNN_FASTPATH_GATV2_CHUNK`` (rows
longer than this are cut into chunks), ``GNN_FASTPATH_GATV2_BWD`` (``atomic`` or
``transposed`` source gradient).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import config
from . import launch, worklist

SOURCE = "gatv2_attention.cu"
THREADS = 256
WARPS_PER_BLOCK = THREADS // 32
MERGE_THREADS = 256
KERNELS = launch.Family(SOURCE, {"GATV2_THREADS": THREADS, "GATV2_MERGE_THREADS": MERGE_THREADS},
                        together=("gatv2_fwd", "gatv2_bwd_dst", "gatv2_bwd_src"))
#: Head widths with a compile-time specialisation (16-byte vector loads): D -> (VW, LH, K).
SPECIALISED = {32: (4, 8, 1), 64: (4, 16, 1), 128: (4, 32, 1), 256: (4, 32, 2)}
#: Largest head width of the generic (scalar) path: 32 lanes x 16 columns.
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
    return 4 if floats_per_lane <= 4 else 2 if floats_per_lane <= 8 else 1


def unsupported(H: int, D: int) -> Optional[str]:
    """Why the kernels cannot take heads of this shape, or None when they can."""
    if H < 1 or not 1 <= D <= MAX_D:
        return f"head shape H={H}, D={D} (the GATv2 kernels take 1 <= D <= {MAX_D})"
    if H * D >= 2**31:
        return f"H * D = {H * D} (the GATv2 kernels index rows with int32)"
    return None


def config_for(D: int, aligned: bool) -> Config:
    """The instantiation for head width ``D``; ``aligned``: every row pointer is 16-byte aligned."""
    if aligned and D in SPECIALISED:
        vw, lh, k = SPECIALISED[D]
        return Config(vw, lh, k, D, _unroll(vw * k))
    if not 1 <= D <= MAX_D:
        raise ValueError(f"GATv2 kernels take head widths 1..{MAX_D}, got {D}")
    lh = min(32, max(4, launch.next_pow2(D)))
    k = launch.next_pow2(launch.cdiv(D, lh))
    return Config(1, lh, k, 0, _unroll(k))


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
            p: float, seed: int, offset: int, return_attention) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Fused forward. Inputs contiguous fp32 on one GPU, graph on that GPU.

    Returns (out [N_dst, H, D], lse [N_dst, H], alpha [M, H] caller order or None).
    ``return_attention``: False, True (softmax weights) or "dropped" (after dropout).
    """
    dev = x_src.device
    n_dst, H, D = graph.n_dst, x_src.shape[1], x_src.shape[2]
    M = graph.num_edges
    f32 = dict(dtype=torch.float32, device=dev)
    out = torch.empty(n_dst, H, D, **f32)
    lse = torch.empty(n_dst, H, **f32)
    alpha = torch.empty(M, H, **f32) if return_attention else None
    if n_dst == 0:
        return out, lse, alpha
    kc = graph.kernel_csr()
    work = _work(graph)
    cfg = config_for(D, launch.aligned16(x_src, x_dst, att, edge_term))
    has_et = edge_term is not None
    n_tiles = cfg.n_tiles(H)
    S = work.n_slots
    part_acc = torch.empty(S, H, D, **f32) if S else None
    part_m = torch.empty(S, H, **f32) if S else None
    part_l = torch.empty(S, H, **f32) if S else None
    n_work = work.n_items * n_tiles
    fwd = KERNELS.kernel(dev, "gatv2_fwd", *cfg.args(has_et))
    fwd.launch(_grid(fwd, n_work), THREADS, items=work.items, n_work=n_work, n_tiles=n_tiles,
               indices=kc.indices, perm=kc.perm, x_src=x_src, x_dst=x_dst, att=att, edge_term=edge_term, H=H,
               D_rt=D, slope=slope, p=p, seed=seed, offset=offset, out=out, lse=lse, part_acc=part_acc,
               part_m=part_m, part_l=part_l, logits=alpha)
    if work.n_split:
        merge = KERNELS.kernel(dev, "gatv2_fwd_merge")
        merge.launch((min(work.n_split, _MAX_BLOCKS), min(launch.cdiv(H * D, 32), 65535)), MERGE_THREADS,
                     split=work.split, n_split=work.n_split, part_acc=part_acc, part_m=part_m, part_l=part_l,
                     H=H, D=D, out=out, lse=lse)
    if return_attention and M:
        norm = KERNELS.kernel(dev, "gatv2_alpha_from_logits")
        norm.launch(_blocks(work.n_items), THREADS, items=work.items, n_items=work.n_items, perm=kc.perm, lse=lse,
                    H=H, p=p, seed=seed, offset=offset, dropped=int(return_attention == "dropped"), alpha=alpha)
    return out, lse, alpha


def backward(graph, x_src: Tensor, x_dst: Tensor, att: Tensor, edge_term: Optional[Tensor], out: Tensor,
             lse: Tensor, grad_out: Tensor, alpha: Optional[Tensor], grad_alpha: Optional[Tensor],
             alpha_dropped: bool, slope: float, p: float, seed: int, offset: int,
             needs: Tuple[bool, bool, bool, bool]):
    """Gradients (dx_src, dx_dst, datt, d_edge_term), each None where ``needs`` says so.

    ``grad_out`` [N_dst, H, D] contiguous; ``grad_alpha`` [M, H] (caller order) is the
    gradient of the returned attention ``alpha`` (None when there is none).
    """
    dev = x_src.device
    n_src, n_dst, M = graph.n_src, graph.n_dst, graph.num_edges
    H, D = x_src.shape[1], x_src.shape[2]
    f32 = dict(dtype=torch.float32, device=dev)
    need_src, need_dst, need_att, need_et = needs
    need_et = need_et and edge_term is not None
    transposed = need_src and config.setting("GNN_FASTPATH_GATV2_BWD") == "transposed"

    dx_src = None
    if need_src:
        dx_src = torch.empty(n_src, H, D, **f32) if transposed else torch.zeros(n_src, H, D, **f32)
    dx_dst = torch.empty(n_dst, H, D, **f32) if need_dst else None
    datt = torch.zeros(H, D, **f32) if need_att else None
    d_edge_term = torch.empty(M, H, D, **f32) if need_et else None
    if n_dst == 0 or not any((need_src, need_dst, need_att, need_et)):
        if dx_src is not None:
            dx_src.zero_()
        return dx_src, dx_dst, datt, d_edge_term

    kc = graph.kernel_csr()
    work = _work(graph)
    cfg = config_for(D, launch.aligned16(x_src, x_dst, att, edge_term, out, grad_out))
    has_et = edge_term is not None
    n_tiles = cfg.n_tiles(H)

    delta_alpha = None
    if grad_alpha is not None and M:
        delta_alpha = torch.zeros(n_dst, H, **f32)
        k = KERNELS.kernel(dev, "gatv2_delta_alpha")
        k.launch(_blocks(work.n_items), THREADS, items=work.items, n_items=work.n_items, perm=kc.perm, alpha=alpha,
                 grad_alpha=grad_alpha, H=H, delta_alpha=delta_alpha)
    if dx_dst is not None and work.n_split:
        dx_dst.index_fill_(0, work.split_rows, 0.0)
    delta = torch.empty(n_dst, H, **f32) if transposed else None

    use_smem = need_att and H * D * 4 <= 48 * 1024
    smem = H * D * 4 if use_smem else 0
    n_work = work.n_items * n_tiles
    bwd = KERNELS.kernel(dev, "gatv2_bwd_dst", *cfg.args(has_et))
    bwd.launch(_grid(bwd, n_work, smem, always_persistent=True), THREADS, shared_mem=smem,
               items=work.items, n_work=n_work, n_tiles=n_tiles, indptr=kc.indptr, indices=kc.indices,
               perm=kc.perm, x_src=x_src, x_dst=x_dst, att=att, edge_term=edge_term, out=out, grad_out=grad_out,
               lse=lse, delta_alpha=delta_alpha, grad_alpha=grad_alpha, grad_alpha_dropped=int(alpha_dropped), H=H,
               D_rt=D, slope=slope, p=p, seed=seed, offset=offset, dx_src=None if transposed else dx_src,
               dx_dst=dx_dst, d_edge_term=d_edge_term, datt=datt, datt_smem=int(use_smem), delta_out=delta)

    if transposed and n_src:
        scsr = graph.kernel_source_csr()
        swork = _work(graph, source_major=True)
        if swork.n_split:
            dx_src.index_fill_(0, swork.split_rows, 0.0)
        src = KERNELS.kernel(dev, "gatv2_bwd_src", *cfg.args(has_et))
        n_swork = swork.n_items * n_tiles
        src.launch(_grid(src, n_swork), THREADS, items=swork.items, n_work=n_swork, n_tiles=n_tiles,
                   s_indices=scsr.indices, s_perm=scsr.perm, x_src=x_src, x_dst=x_dst, att=att,
                   edge_term=edge_term, grad_out=grad_out, lse=lse, delta=delta, grad_alpha=grad_alpha,
                   grad_alpha_dropped=int(alpha_dropped), H=H, D_rt=D, slope=slope, p=p, seed=seed,
                   offset=offset, dx_src=dx_src)
    return dx_src, dx_dst, datt, d_edge_term
