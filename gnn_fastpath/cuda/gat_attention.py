"""Launcher of the fused GAT (additive) attention kernels (``gat_attention.cu``).

One call per pass: :func:`forward` and :func:`backward` take the Graph, pick the template
instantiation for the head width, fetch the cached work lists, allocate outputs and launch
on torch's current stream, with no host synchronisation (the work lists sync once per graph
when built). The autograd Function and the design note are in
:mod:`gnn_fastpath.ops.gat_attention`. The lane layout, grids and split-row accumulators are
the GATv2 family's (:mod:`gnn_fastpath.cuda.row_attention`).

Backward variant (:func:`backward_mode`): ``"atomic"`` (one destination-major pass; dx_src and
d score_src by atomics) or ``"transposed"`` (a source-major pass; d score_dst by scalar
atomics). The setting ``GNN_FASTPATH_GAT_BWD`` forces one; by default the rule or, with
``GNN_FASTPATH_TUNE=1``, the variant measured fastest for the size class. All of it is decided
in :func:`plan_forward` / :func:`plan_backward` (:mod:`gnn_fastpath.cuda.plans`: once per call
signature, kept on the Graph); the launchers take the plan.

Dtypes: x_src in storage dtype T (float32, float16, bfloat16); score_src, score_dst,
edge_score and edge_weight float32 (the op converts them); out and alpha in ``out_dtype`` (T
or float32). dx_src comes back in T (atomic sums in float32 scratch, cast once), the other
gradients in float32 (the op casts them to their tensors' dtypes).
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .. import config, tuning
from . import launch, plans, row_attention, worklist
from .row_attention import Config

SOURCE = "gat_attention.cu"
THREADS = row_attention.THREADS
MERGE_THREADS = 256
#: Bytes per vector access of 16-bit feature rows (launch.bytes16; GNN_FASTPATH_VEC16
#: overrides): 8, the float32 lane layout (4 halves per lane), as for GATv2, whose rows and
#: gathers these kernels share.
VEC16_BYTES = 8
#: The kernels with the dropout key from the seed, offset scalars; KERNELS_RNG: from the rng
#: tensor (row_attention.stream_families), for the kernels that take a dropout stream.
KERNELS, KERNELS_RNG = row_attention.stream_families(
    SOURCE, {"GAT_THREADS": THREADS, "GAT_MERGE_THREADS": MERGE_THREADS},
    together=("gat_fwd", "gat_bwd_dst", "gat_bwd_src", "gat_delta"))
#: Rows longer than this are cut into chunks of this many edges (super nodes); GATv2's default,
#: so both families share one cached work list per graph.
CHUNK_EDGES = 256
#: Persistent grid (resident blocks, warps striding over the items) when every resident warp
#: gets at least this many items, else one warp per item (as GATv2).
PERSISTENT_MIN_ITEMS_PER_WARP = 16
#: The backward variants; the setting ``GNN_FASTPATH_GAT_BWD`` forces one (empty:
#: :func:`backward_mode` decides).
BACKWARDS = ("atomic", "transposed")


def _unroll(floats_per_lane: int) -> int:
    """Edges in flight per step. A GAT lane holds no x_dst or att row (GATv2's does), so it
    keeps 4 gathered rows in flight up to 8 floats per lane (the float32 and 16-bit
    specialisations), 2 for the widest generic rows (16 floats per lane)."""
    return 4 if floats_per_lane <= 8 else 2


def unsupported(H: int, D: int) -> Optional[str]:
    """Why the kernels cannot take heads of this shape, or None when they can."""
    return row_attention.unsupported(H, D, "GAT")


def config_for(D: int, aligned: bool) -> Config:
    """The float32 instantiation for head width ``D`` (``aligned``: rows 16-byte aligned)."""
    return row_attention.config_for(D, aligned, _unroll, "GAT")


def config_for_16bit(D: int, *tensors: Optional[Tensor]) -> Config:
    """The instantiation for 16-bit rows of width ``D`` over ``tensors`` (their alignment)."""
    return row_attention.config_for_16bit(D, *tensors, vec16_bytes=VEC16_BYTES, unroll=_unroll, family="GAT")


def _config(D: int, *tensors: Optional[Tensor]) -> Config:
    """The instantiation for the storage dtype of ``tensors[0]`` (x_src) over the pass's row
    tensors ``tensors``."""
    if tensors[0].dtype == torch.float32:
        return config_for(D, launch.aligned16(*tensors))
    return config_for_16bit(D, *tensors)


#: The rule's source-major backward on graphs whose rows are skewed on one side only: the
#: longest row of one side at least this many times the longest of the other (see
#: :func:`backward_mode`).
TRANSPOSED_MIN_ROW_RATIO = 16
#: The rule's source-major backward for 16-bit rows where sources have at most this many
#: out-edges on average (see :func:`backward_mode`).
TRANSPOSED_16BIT_MAX_MEAN_DEGREE = 16.0
#: Hub sources alone (source rows the long side) take the source-major pass only where
#: sources have at least this many out-edges on average: below it the hub rows' atomics cost
#: less than the transposed gather (benchmarks/RESULTS.md, tuning).
TRANSPOSED_HUB_MIN_MEAN_DEGREE = 12.0


def backward_mode(graph, dtype: Optional[torch.dtype] = None) -> str:
    """``"atomic"`` or ``"transposed"`` for ``graph`` and rows of ``dtype`` (None: float32)
    (``GNN_FASTPATH_GAT_BWD`` forces one).

    The rule: atomic, one launch and no transpose to build, except on an eager graph that
    outlived a training step (the transpose is a one-time cost; the compiled path's static
    graphs carry none), where the source-major pass is taken

    - for 16-bit rows where sources have at most :data:`TRANSPOSED_16BIT_MAX_MEAN_DEGREE`
      out-edges on average: the atomic pass adds dx_src into a float32 copy (zeroed, then
      cast), which on such graphs weighs as much as the edges' own work;
    - where the longest row on one side is at least :data:`TRANSPOSED_MIN_ROW_RATIO` times
      the longest on the other: destination super nodes (the source-major pass walks the even
      side), or source super nodes on graphs of at least
      :data:`TRANSPOSED_HUB_MIN_MEAN_DEGREE` out-edges per source, whose dx_src rows the
      atomic pass would hit with one float4 atomic per edge and head (the source-major pass
      sums them in registers).

    The two row lengths are host facts of the build (or one read, once per graph that
    outlived a step)."""
    forced = config.setting("GNN_FASTPATH_GAT_BWD")
    if forced:
        return forced
    if graph.static or not graph.outlived_a_step():
        return "atomic"
    if (dtype is not None and dtype != torch.float32
            and graph.num_edges <= TRANSPOSED_16BIT_MAX_MEAN_DEGREE * max(graph.n_src, 1)):
        return "transposed"
    longest_dst, longest_src = _longest_rows(graph)
    if longest_dst >= TRANSPOSED_MIN_ROW_RATIO * max(longest_src, 1):
        return "transposed"
    hubs = longest_src >= TRANSPOSED_MIN_ROW_RATIO * max(longest_dst, 1)
    return "transposed" if hubs and graph.num_edges >= TRANSPOSED_HUB_MIN_MEAN_DEGREE * max(graph.n_src, 1) else "atomic"


def _longest_rows(graph) -> Tuple[int, int]:
    """(longest destination row, longest source row or an upper bound on it), once per graph:
    the exact in-degree maximum (:meth:`~gnn_fastpath.graph.Graph.degree_stats`) and the
    build's bound on the out-degrees, or one read of them where the build gave none."""
    def build():
        longest_src = graph.degree_bound(source_major=True)
        if longest_src is None:
            longest_src = int(graph.out_degree().max()) if graph.n_src and graph.num_edges else 0
        return graph.degree_stats().max, longest_src

    return graph.memo(("gat_attention", "longest rows"), build)


def backward_class(graph, width: int, dtype: torch.dtype) -> str:
    """The tuner's size class (:func:`gnn_fastpath.tuning.size_class`) of this backward on
    ``graph`` for rows of ``width`` = H * D in ``dtype``: the degree skew is the number of
    chunks the work list cut long rows into."""
    return tuning.size_class("gat_attention.backward", graph.n_src, graph.n_dst, graph.num_edges, width, dtype,
                             _work(graph).n_split_items)


def static_geometry() -> Tuple[worklist.StaticGeometry, ...]:
    """The work lists a static graph's launches read (what the operators are handed)."""
    return (row_attention.static_work(CHUNK_EDGES, order="degree"),)


def _work(graph, source_major: bool = False) -> worklist.RowChunks:
    return row_attention.work(graph, CHUNK_EDGES, source_major, order="degree")


def _grid(kernel: launch.Kernel, n_work: int) -> int:
    return row_attention.grid(kernel, n_work, PERSISTENT_MIN_ITEMS_PER_WARP)


#: Settings the forward's and the backward's plans read (part of their keys).
FORWARD_SETTINGS = ("GNN_FASTPATH_VEC16",)
BACKWARD_SETTINGS = ("GNN_FASTPATH_GAT_BWD", "GNN_FASTPATH_VEC16") + plans.TUNE_SETTINGS


def plan_forward(graph, x_src: Tensor, out: Tensor) -> plans.Plan:
    """The forward's plan: one variant, its instantiation (``cfg``, from the head width, the
    dtypes, the rows' alignment and ``GNN_FASTPATH_VEC16``) and the work list's chunk length."""
    H, D = x_src.shape[1], x_src.shape[2]
    key = (H, D, plans.layout(x_src, out), plans.snapshot(*FORWARD_SETTINGS))

    def build():
        return plans.Plan("gat_attention.forward", "fused", "fixed",
                          params=(("cfg", _config(D, x_src, out)), ("chunk", CHUNK_EDGES)))

    return plans.resolve(graph, "gat_attention.forward", key, build)


def plan_backward(graph, x_src: Tensor, out: Tensor, grad_out: Tensor) -> plans.Plan:
    """The backward's plan: ``GNN_FASTPATH_GAT_BWD``, else :func:`backward_mode` (and with
    ``GNN_FASTPATH_TUNE=1`` on an eager graph, a pending tuner choice between
    :data:`BACKWARDS`, settled by :func:`plans.run`); the instantiation ``cfg`` and the work
    list's chunk length."""
    H, D, T = x_src.shape[1], x_src.shape[2], x_src.dtype
    key = (H, D, plans.layout(x_src, out, grad_out), plans.snapshot(*BACKWARD_SETTINGS), graph.static,
           graph.outlived_a_step())

    def build():
        forced = config.setting("GNN_FASTPATH_GAT_BWD")
        rule = backward_mode(graph, T)
        tune = None
        # tuned on graphs used again only: a race could pick the transposed pass on a graph of
        # one step (a sampled batch), whose transpose and work list cost more host time than
        # its kernels save
        if not forced and not graph.static and tuning.enabled() and graph.outlived_a_step():
            tune = plans.Tune(("gat_attention.backward", H * D, T), BACKWARDS, backward_class, (H * D, T))
        return plans.Plan("gat_attention.backward", rule, "setting" if forced else "rule", rule=rule,
                          params=(("cfg", _config(D, x_src, out, grad_out)), ("chunk", CHUNK_EDGES)), tune=tune)

    return plans.resolve(graph, "gat_attention.backward", key, build)


def forward(graph, x_src: Tensor, score_src: Tensor, score_dst: Tensor, edge_score: Optional[Tensor],
            edge_weight: Optional[Tensor], slope: float, p: float, seed: Union[int, Tensor], offset: Optional[int],
            return_attention, out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Fused forward. Inputs contiguous on one GPU, graph on that GPU: x_src [N_src, H, D] in
    T; score_src [N_src, H], score_dst [N_dst, H], edge_score [M, H] and edge_weight [M]
    (caller order, optional) float32. The dropout stream: ints ``seed, offset``, or an int64
    tensor [2] on that GPU as ``seed`` with ``offset`` None (read by the kernels: CUDA-graph
    safe; :func:`row_attention.philox_stream`).

    Returns (out [N_dst, H, D] in ``out_dtype`` (default T), lse [N_dst, H] float32, alpha
    [M, H] in ``out_dtype``, caller order, or None). ``return_attention``: False, True
    (softmax weights) or "dropped" (after dropout, times edge_weight).
    """
    dev = x_src.device
    rng, seed, offset = row_attention.philox_stream(seed, offset, dev)
    n_dst, H, D = graph.n_dst, x_src.shape[1], x_src.shape[2]
    M = graph.num_edges
    out_dtype = x_src.dtype if out_dtype is None else out_dtype
    buf = row_attention.forward_buffers(n_dst, M, H, D, out_dtype, dev, return_attention)
    out, lse, alpha, logits = buf.out, buf.lse, buf.alpha, buf.logits
    if n_dst == 0:
        return out, lse, alpha
    plan = plans.run(graph, plan_forward(graph, x_src, out))
    kc = graph.kernel_csr()
    work = _work(graph)
    row_attention.zero_skipped(work, alpha)
    cfg = plan.cfg
    ti, to = launch.ctype(x_src.dtype), launch.ctype(out_dtype)
    n_tiles = cfg.n_tiles(H)
    row_attention.with_chunks(buf, work)
    n_work = work.n_items * n_tiles
    stream = KERNELS if rng is None else KERNELS_RNG
    fwd = stream.kernel(dev, "gat_fwd", ti, to, *cfg.args())
    fwd.launch(_grid(fwd, n_work), THREADS, items=work.items, n_work=n_work, n_tiles=n_tiles,
               indices=kc.indices, perm=kc.perm, x_src=x_src, score_src=score_src, score_dst=score_dst,
               edge_score=edge_score, edge_weight=edge_weight, H=H, D_rt=D, slope=slope, p=p, seed=seed,
               offset=offset, rng=rng, out=out, lse=lse, part_acc=buf.part_acc, part_m=buf.part_m, part_l=buf.part_l,
               logits=logits)
    if work.n_split:
        row_attention.merge_chunks(KERNELS.kernel(dev, "gat_fwd_merge", to), MERGE_THREADS, buf, work)
    if return_attention and M:
        norm = stream.kernel(dev, "gat_alpha_from_logits", to)
        norm.launch(row_attention.blocks(work.n_items), THREADS, items=work.items, n_items=work.n_items,
                    perm=kc.perm, lse=lse, H=H, p=p, seed=seed, offset=offset, rng=rng,
                    dropped=int(return_attention == "dropped"), logits=logits, alpha=alpha, edge_weight=edge_weight)
    return out, lse, alpha


def backward(graph, x_src: Tensor, score_src: Tensor, score_dst: Tensor, edge_score: Optional[Tensor],
             edge_weight: Optional[Tensor], out: Tensor, lse: Tensor, grad_out: Tensor, alpha: Optional[Tensor],
             grad_alpha: Optional[Tensor], alpha_dropped: bool, slope: float, p: float, seed: Union[int, Tensor],
             offset: Optional[int], needs: Tuple[bool, bool, bool, bool, bool], mode: Optional[str] = None):
    """Gradients (dx_src, d_score_src, d_score_dst, d_edge_score, d_edge_weight), each None
    where ``needs`` (in that order) says so or the tensor is absent.

    Inputs as :func:`forward`'s; ``out`` (saved), ``grad_out`` [N_dst, H, D] contiguous,
    ``alpha`` and ``grad_alpha`` [M, H] (caller order, the gradient of the returned attention,
    None when there is none) in out's dtype; the dropout stream as the forward's. dx_src comes
    back in T, the others in float32. ``mode``: ``"atomic"`` or ``"transposed"`` (None: the
    plan's, :func:`plan_backward`: the setting, :func:`backward_mode`, or with
    ``GNN_FASTPATH_TUNE=1`` the variant measured fastest for this size class).
    """
    dev = x_src.device
    given_stream = (seed, offset)  # as given: the timed runs of a tuned choice take the same stream
    rng, seed, offset = row_attention.philox_stream(seed, offset, dev)
    n_src, n_dst, M = graph.n_src, graph.n_dst, graph.num_edges
    H, D = x_src.shape[1], x_src.shape[2]
    T = x_src.dtype
    f32 = dict(dtype=torch.float32, device=dev)
    need_x, need_s, need_t, need_u, need_w = needs
    need_u = need_u and edge_score is not None
    need_w = need_w and edge_weight is not None

    d_s = torch.zeros(n_src, H, **f32) if need_s else None
    d_t = torch.zeros(n_dst, H, **f32) if need_t else None
    d_u = torch.empty(M, H, **f32) if need_u else None  # every (edge, head) written once
    d_w = torch.zeros(M, **f32) if need_w else None  # heads (and head tiles) add into it
    if M == 0 or not any((need_x, need_s, need_t, need_u, need_w)):
        dx = torch.zeros(n_src, H, D, dtype=T, device=dev) if need_x else None
        return dx, d_s, d_t, d_u, d_w

    plan = plan_backward(graph, x_src, out, grad_out)
    if mode is not None:
        plan = plan.pick(mode, "caller")
    else:
        def run(variant):
            return backward(graph, x_src, score_src, score_dst, edge_score, edge_weight, out, lse, grad_out, alpha,
                            grad_alpha, alpha_dropped, slope, p, *given_stream, needs, variant)

        plan = plans.run(graph, plan, dev, run)
    kc = graph.kernel_csr()
    work = _work(graph)
    mode = row_attention.backward_variant(plan.variant, work)
    row_attention.zero_skipped(work, d_u)
    cfg = plan.cfg
    ti, to = launch.ctype(T), launch.ctype(out.dtype)
    n_tiles = cfg.n_tiles(H)
    stream = KERNELS if rng is None else KERNELS_RNG  # gat_delta too: one module with the source-major pass

    delta_alpha = None
    if grad_alpha is not None:
        delta_alpha = torch.zeros(n_dst, H, **f32)
        k = KERNELS.kernel(dev, "gat_delta_alpha", to)
        k.launch(row_attention.blocks(work.n_items), THREADS, items=work.items, n_items=work.n_items, perm=kc.perm,
                 alpha=alpha, grad_alpha=grad_alpha, H=H, delta_alpha=delta_alpha)
    common = dict(x_src=x_src, score_src=score_src, score_dst=score_dst, edge_score=edge_score,
                  edge_weight=edge_weight, grad_out=grad_out, lse=lse, grad_alpha=grad_alpha,
                  grad_alpha_dropped=int(alpha_dropped), H=H, D_rt=D, slope=slope, p=p, seed=seed, offset=offset,
                  rng=rng, d_score_src=d_s, d_score_dst=d_t, d_edge_score=d_u, d_edge_weight=d_w)

    if mode == "atomic":
        dx_acc = torch.zeros(n_src, H, D, **f32) if need_x else None  # float4 atomics add into it
        n_work = work.n_items * n_tiles
        bwd = stream.kernel(dev, "gat_bwd_dst", ti, to, *cfg.args())
        bwd.launch(_grid(bwd, n_work), THREADS, items=work.items, n_work=n_work, n_tiles=n_tiles,
                   indices=kc.indices, perm=kc.perm, out=out, delta_alpha=delta_alpha, dx_src=dx_acc, **common)
        dx_src = None if dx_acc is None else dx_acc if T == torch.float32 else dx_acc.to(T)  # one rounding
        return dx_src, d_s, d_t, d_u, d_w

    # transposed: delta per destination, then one source-major pass
    delta = torch.empty(n_dst, H, **f32)
    n_rows = n_dst * n_tiles
    dk = stream.kernel(dev, "gat_delta", ti, to, *cfg.args())
    dk.launch(row_attention.blocks(n_rows), THREADS, n_work=n_rows, n_tiles=n_tiles, out=out, grad_out=grad_out,
              delta_alpha=delta_alpha, H=H, D_rt=D, delta=delta)
    scsr = graph.kernel_source_csr()
    swork = _work(graph, source_major=True)
    dx_src = torch.empty(n_src, H, D, dtype=T, device=dev) if need_x else None
    src_acc, src_index = row_attention.accumulator(dx_src, graph, swork, source_major=True)
    n_swork = swork.n_items * n_tiles
    src = stream.kernel(dev, "gat_bwd_src", ti, to, *cfg.args())
    src.launch(_grid(src, n_swork), THREADS, items=swork.items, n_work=n_swork, n_tiles=n_tiles,
               s_indices=scsr.indices, s_perm=scsr.perm, delta=delta, dx_src=dx_src, dx_src_acc=src_acc,
               acc_index=src_index, **common)
    row_attention.finish_accumulator(dx_src, src_acc, swork)
    return dx_src, d_s, d_t, d_u, d_w
