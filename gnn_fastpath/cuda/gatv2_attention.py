"""Launcher of the fused GATv2 attention kernels (``gatv2_attention.cu``).

One call per pass: :func:`forward` and :func:`backward` take the Graph, pick the template
instantiation for the head width, fetch the cached work lists, allocate outputs and launch
on torch's current stream. The autograd Function and the design note are in
:mod:`gnn_fastpath.ops.gatv2_attention`.

Settings (:mod:`gnn_fastpath.config`, read by the plans, :func:`plan_forward` and
:func:`plan_backward`, whose keys hold them: a change takes effect at the next call):
``GNN_FASTPATH_GATV2_CHUNK`` (rows longer than this are cut into chunks),
``GNN_FASTPATH_GATV2_BWD`` (the backward variant, :data:`BACKWARDS`; empty: the rule, or with
``GNN_FASTPATH_TUNE=1`` the variant measured fastest for the size class),
``GNN_FASTPATH_VEC16``. The launchers take the plan (:mod:`gnn_fastpath.cuda.plans`).

Dtypes: features (x_src, x_dst, edge_term) in one storage dtype T (float32, float16,
bfloat16), ``att`` float32 (the op converts it), outputs in ``out_dtype`` (T or float32).
Gradients that atomics add into are accumulated in float32 scratch and cast to T once.

The lane layout, grids and split-row accumulators are shared with the GAT launcher
(:mod:`gnn_fastpath.cuda.row_attention`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .. import config, tuning
from . import launch, plans, row_attention, worklist
from .row_attention import MAX_D, SPECIALISED, SPECIALISED_16, Config  # noqa: F401 (this module's names)

SOURCE = "gatv2_attention.cu"
THREADS = row_attention.THREADS
#: Bytes per vector access of 16-bit feature rows (launch.bytes16; GNN_FASTPATH_VEC16 overrides):
#: 8, i.e. the float32 lane layout with 4 halves per lane; 16-byte accesses do not pay off
#: for this family.
VEC16_BYTES = 8
WARPS_PER_BLOCK = row_attention.WARPS_PER_BLOCK
MERGE_THREADS = 256
#: The kernels with the dropout key from the seed, offset scalars; KERNELS_RNG: from the rng
#: tensor (row_attention.stream_families), for the kernels that take a dropout stream.
KERNELS, KERNELS_RNG = row_attention.stream_families(
    SOURCE, {"GATV2_THREADS": THREADS, "GATV2_MERGE_THREADS": MERGE_THREADS},
    together=("gatv2_fwd", "gatv2_bwd_dst", "gatv2_bwd_src"))
#: Backward variants: the source gradient by atomics in the destination pass; a destination
#: pass, then a source-major pass over the transpose (the forward CSR itself on an undirected
#: graph); or, on an undirected graph only, both gradients in one pass over the forward CSR
#: (gatv2_bwd_undirected; elsewhere "fused" runs "transposed").
BACKWARDS = ("atomic", "transposed", "fused")
#: Cap on grid size (the kernels loop grid-stride over their work).
_MAX_BLOCKS = row_attention.MAX_BLOCKS
#: The forward and the source-major backward use a persistent grid (resident blocks only,
#: warps striding over the work items) when every resident warp gets at least this many
#: items (where items are many, striding saves launching a warp for each), else one warp per
#: item. The destination-major backward is always persistent, so its per-block datt atomics
#: stay few.
PERSISTENT_MIN_ITEMS_PER_WARP = 16


def _unroll(floats_per_lane: int) -> int:
    """Edges in flight per step: about 16 float registers per lane for the gathered rows
    (the same for 16-bit rows, which are held converted to float)."""
    return 4 if floats_per_lane <= 4 else 2 if floats_per_lane <= 8 else 1


def unsupported(H: int, D: int) -> Optional[str]:
    """Why the kernels cannot take heads of this shape, or None when they can."""
    return row_attention.unsupported(H, D, "GATv2")


def config_for(D: int, aligned: bool) -> Config:
    """The float32 instantiation for head width ``D``; ``aligned``: every row pointer is
    16-byte aligned."""
    return row_attention.config_for(D, aligned, _unroll, "GATv2")


def config_for_16bit(D: int, *tensors: Optional[Tensor]) -> Config:
    """The instantiation for 16-bit features of head width ``D``, read with the widest vector
    (8, 4, 2 or 1 elements: 16, 8, 4 or 2 bytes) that ``D`` and the alignment of every one of
    ``tensors`` (the pass's row tensors, 16-bit and float32 alike) allow."""
    return row_attention.config_for_16bit(D, *tensors, vec16_bytes=VEC16_BYTES, unroll=_unroll, family="GATv2")


def _config(D: int, *tensors: Optional[Tensor]) -> Config:
    """The instantiation for the storage dtype of ``tensors[0]`` (the features)."""
    if tensors[0].dtype == torch.float32:
        return config_for(D, launch.aligned16(*tensors))
    return config_for_16bit(D, *tensors)


def forward_config(cfg: Config, dtype: torch.dtype) -> Config:
    """The forward's instantiation: ``cfg`` with 4 edges in flight for specialised 16-bit rows.

    The 16-bit specialised forward keeps as many resident blocks per SM with U = 4 as with
    U = 2, without spills, so U = 4 doubles the bytes in flight for free (a 16-bit lane
    gathers half the bytes of a float32 lane per edge). The backward keeps U = 2: at U = 4 its
    registers would halve its resident blocks.
    """
    if dtype == torch.float32 or cfg.dc == 0:
        return cfg
    return replace(cfg, u=4)


def fused_config(cfg: Config) -> Config:
    """The one-pass undirected backward's instantiation: ``cfg`` with half the edges in flight
    (each edge gathers three rows, x_src, x_dst and grad_out, where a pass of the two-pass
    variant gathers one or two)."""
    return replace(cfg, u=max(1, cfg.u // 2))


#: The rule's one-pass backward: undirected graphs with at most this many in-edges per node
#: on average, in 16-bit (see :func:`backward_mode`).
FUSED_MAX_MEAN_DEGREE = 4.0


def backward_mode(graph, dtype: torch.dtype) -> str:
    """The backward variant for ``graph`` and rows of ``dtype`` without tuning
    (``GNN_FASTPATH_GATV2_BWD`` forces one).

    The rule: atomic, except ``"fused"`` (the one-pass backward) for 16-bit rows on an
    undirected graph that outlived a training step with at most :data:`FUSED_MAX_MEAN_DEGREE`
    in-edges per node. The atomic pass does half the arithmetic of the others and its
    atomics resolve in the L2, so it is the default; where rows have few edges and are
    16-bit, its float32 accumulator for dx_src (zeroed, then cast) weighs as much as the
    edges' work, and the one pass, which needs neither, wins. Symmetry is read (once per graph,
    host reads) only for such graphs, as the fused variant needs it anyway."""
    forced = config.setting("GNN_FASTPATH_GATV2_BWD")
    if forced:
        return forced
    if (dtype == torch.float32 or graph.static or graph.n_src != graph.n_dst
            or graph.num_edges > FUSED_MAX_MEAN_DEGREE * max(graph.n_dst, 1) or not graph.outlived_a_step()):
        return "atomic"
    return "fused" if graph.reverse_edges_if_cheap() is not None else "atomic"


def backward_class(graph, width: int, dtype: torch.dtype, undirected: bool, chunk: Optional[int] = None) -> str:
    """The tuner's size class (:func:`gnn_fastpath.tuning.size_class`) of this backward on
    ``graph``: undirected graphs (where the fused variant runs) are classes of their own.
    ``chunk``: the work list's chunk length (None: ``GNN_FASTPATH_GATV2_CHUNK``)."""
    decision = "gatv2_attention.backward" + ("|undirected" if undirected else "")
    return tuning.size_class(decision, graph.n_src, graph.n_dst, graph.num_edges, width, dtype,
                             _work(graph, chunk=chunk).n_split_items)


def reverse_ids(graph, detect: bool = False) -> Optional[Tensor]:
    """int32 [M]: the caller id of each CSR edge's reverse, for an undirected graph whose
    symmetry is known or cheap to know (:meth:`~gnn_fastpath.graph.Graph.reverse_edges_if_cheap`;
    ``detect``: pay the detection now); None otherwise. That is the source-major CSR's caller
    ids where the graph walks its forward CSR as its transpose (the transposed variant uses
    them too); only a transpose sorted before the symmetry was known takes a copy of its own."""
    if graph.static or graph.reverse_edges_if_cheap(detect) is None:
        return None
    scsr = graph.kernel_source_csr()
    if scsr.indices is graph.kernel_csr().indices:
        return scsr.perm
    return graph.memo("gatv2_reverse_ids", lambda: graph.perm[graph.reverse_edges()].to(torch.int32))


def _delta_alpha(work: worklist.RowChunks, kc, alpha: Tensor, grad_alpha: Tensor, n_dst: int, H: int) -> Tensor:
    """delta_alpha [n_dst, H] float32: each row's softmax-gradient term from the gradient of the
    returned attention (gatv2_delta_alpha)."""
    delta_alpha = torch.zeros(n_dst, H, dtype=torch.float32, device=alpha.device)
    k = KERNELS.kernel(alpha.device, "gatv2_delta_alpha", launch.ctype(alpha.dtype))
    k.launch(_blocks(work.n_items), THREADS, items=work.items, n_items=work.n_items, perm=kc.perm, alpha=alpha,
             grad_alpha=grad_alpha, H=H, delta_alpha=delta_alpha)
    return delta_alpha


def _datt_shared_bytes(need_att: bool, H: int, D: int, rng: Optional[Tensor]) -> int:
    """Dynamic shared memory of a backward pass for att's gradient (0: it adds into global
    memory): 48 KiB at most without an opt-in, the device key's static bytes included."""
    fits = H * D * 4 + (0 if rng is None else row_attention.RNG_SHARED_BYTES) <= 48 * 1024
    return H * D * 4 if need_att and fits else 0


def static_geometry() -> Tuple[worklist.StaticGeometry, ...]:
    """The work lists a static graph's launches read (what the operators are handed)."""
    return (row_attention.static_work(_chunk_setting(), order="degree"),)


@torch.compiler.assume_constant_result
def _chunk_setting() -> int:
    """``GNN_FASTPATH_GATV2_CHUNK``, read as a constant by traced code (the settings' parse
    cache does not trace). A value changed after tracing leaves the handed list unused: the
    launcher builds the list its plan names."""
    return config.setting("GNN_FASTPATH_GATV2_CHUNK")


def _work(graph, source_major: bool = False, chunk: Optional[int] = None) -> worklist.RowChunks:
    """The row-chunk work list for rows cut at ``chunk`` edges (the plan's; None:
    ``GNN_FASTPATH_GATV2_CHUNK``)."""
    if chunk is None:
        chunk = config.setting("GNN_FASTPATH_GATV2_CHUNK")
    return row_attention.work(graph, chunk, source_major, order="degree")


_blocks = row_attention.blocks


def _grid(kernel: launch.Kernel, n_work: int, shared_mem: int = 0, always_persistent: bool = False) -> int:
    """Blocks for a launch over ``n_work`` warp-sized work items (see PERSISTENT_MIN_ITEMS_PER_WARP)."""
    return row_attention.grid(kernel, n_work, PERSISTENT_MIN_ITEMS_PER_WARP, shared_mem, always_persistent)


#: Settings the forward's and the backward's plans read (part of their keys).
FORWARD_SETTINGS = ("GNN_FASTPATH_GATV2_CHUNK", "GNN_FASTPATH_VEC16")
BACKWARD_SETTINGS = ("GNN_FASTPATH_GATV2_BWD", "GNN_FASTPATH_GATV2_CHUNK", "GNN_FASTPATH_VEC16") \
    + plans.TUNE_SETTINGS


def plan_forward(graph, x_src: Tensor, x_dst: Tensor, att: Tensor, edge_term: Optional[Tensor],
                 out: Tensor) -> plans.Plan:
    """The forward's plan: one variant, its instantiation ``cfg`` (:func:`forward_config` of the
    rows' dtypes, alignment and ``GNN_FASTPATH_VEC16``) and the work list's ``chunk``
    (``GNN_FASTPATH_GATV2_CHUNK``)."""
    H, D = x_src.shape[1], x_src.shape[2]
    key = (H, D, plans.layout(x_src, x_dst, att, edge_term, out), plans.snapshot(*FORWARD_SETTINGS))

    def build():
        cfg = forward_config(_config(D, x_src, x_dst, att, edge_term, out), x_src.dtype)
        return plans.Plan("gatv2_attention.forward", "fused", "fixed",
                          params=(("cfg", cfg), ("chunk", config.setting("GNN_FASTPATH_GATV2_CHUNK"))))

    return plans.resolve(graph, "gatv2_attention.forward", key, build)


def plan_backward(graph, x_src: Tensor, x_dst: Tensor, att: Tensor, edge_term: Optional[Tensor], out: Tensor,
                  grad_out: Tensor, need_src: bool) -> plans.Plan:
    """The backward's plan. Without a source gradient to compute (or without rows or edges)
    the destination pass alone (``"atomic"``, fixed). Else ``GNN_FASTPATH_GATV2_BWD``, or the
    rule (:func:`backward_mode`), and with ``GNN_FASTPATH_TUNE=1`` on an eager graph that
    outlived a training step a pending tuner choice (only graphs used again weigh variants:
    a transpose or the symmetry detection pays over the steps that follow; a sampled batch's
    graph keeps atomics), between the three variants on an undirected graph, else the first
    two. Parameters: the instantiation ``cfg`` and the work list's ``chunk``."""
    H, D, T = x_src.shape[1], x_src.shape[2], x_src.dtype
    source = bool(need_src and graph.n_dst and graph.num_edges)
    key = (H, D, source, plans.layout(x_src, x_dst, att, edge_term, out, grad_out),
           plans.snapshot(*BACKWARD_SETTINGS), graph.static, graph.outlived_a_step())

    def build():
        chunk = config.setting("GNN_FASTPATH_GATV2_CHUNK")
        params = (("cfg", _config(D, x_src, x_dst, att, edge_term, out, grad_out)), ("chunk", chunk))
        if not source:
            return plans.Plan("gatv2_attention.backward", "atomic", "fixed", rule="atomic", params=params)
        forced = config.setting("GNN_FASTPATH_GATV2_BWD")
        rule = forced or backward_mode(graph, T)
        tune = None
        if not forced and not graph.static and tuning.enabled() and graph.outlived_a_step():
            undirected = graph.reverse_edges_if_cheap() is not None
            tune = plans.Tune(("gatv2_attention.backward", H * D, T, undirected),
                              BACKWARDS if undirected else BACKWARDS[:2], backward_class,
                              (H * D, T, undirected, chunk))
        return plans.Plan("gatv2_attention.backward", rule, "setting" if forced else "rule", rule=rule,
                          params=params, tune=tune)

    return plans.resolve(graph, "gatv2_attention.backward", key, build)


def forward(graph, x_src: Tensor, x_dst: Tensor, att: Tensor, edge_term: Optional[Tensor], slope: float,
            p: float, seed: Union[int, Tensor], offset: Optional[int], return_attention,
            out_dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Fused forward. Inputs contiguous on one GPU, graph on that GPU: x_src, x_dst,
    edge_term in one dtype T (float32/float16/bfloat16), att float32. The dropout stream:
    ints ``seed, offset``, or an int64 tensor [2] on that GPU as ``seed`` with ``offset`` None
    (read by the kernels: CUDA-graph safe; :func:`row_attention.philox_stream`).

    Returns (out [N_dst, H, D] in ``out_dtype`` (default T), lse [N_dst, H] float32, alpha
    [M, H] in ``out_dtype``, caller order, or None). ``return_attention``: False, True
    (softmax weights) or "dropped" (after dropout).
    """
    dev = x_src.device
    rng, seed, offset = row_attention.philox_stream(seed, offset, dev)
    n_dst, H, D = graph.n_dst, x_src.shape[1], x_src.shape[2]
    M = graph.num_edges
    out_dtype = x_src.dtype if out_dtype is None else out_dtype
    graph.note_pass("forward")
    buf = row_attention.forward_buffers(n_dst, M, H, D, out_dtype, dev, return_attention)
    out, lse, alpha, logits = buf.out, buf.lse, buf.alpha, buf.logits
    if n_dst == 0:
        return out, lse, alpha
    plan = plans.run(graph, plan_forward(graph, x_src, x_dst, att, edge_term, out))
    kc = graph.kernel_csr()
    work = _work(graph, chunk=plan.chunk)
    row_attention.zero_skipped(work, alpha)
    cfg = plan.cfg
    ti, to = launch.ctype(x_src.dtype), launch.ctype(out_dtype)
    has_et = edge_term is not None
    n_tiles = cfg.n_tiles(H)
    row_attention.with_chunks(buf, work)
    n_work = work.n_items * n_tiles
    stream = KERNELS if rng is None else KERNELS_RNG
    fwd = stream.kernel(dev, "gatv2_fwd", ti, to, *cfg.args(has_et))
    fwd.launch(_grid(fwd, n_work), THREADS, items=work.items, n_work=n_work, n_tiles=n_tiles,
               indices=kc.indices, perm=kc.perm, x_src=x_src, x_dst=x_dst, att=att, edge_term=edge_term, H=H,
               D_rt=D, slope=slope, p=p, seed=seed, offset=offset, rng=rng, out=out, lse=lse, part_acc=buf.part_acc,
               part_m=buf.part_m, part_l=buf.part_l, logits=logits)
    if work.n_split:
        row_attention.merge_chunks(KERNELS.kernel(dev, "gatv2_fwd_merge", to), MERGE_THREADS, buf, work)
    if return_attention and M:
        norm = stream.kernel(dev, "gatv2_alpha_from_logits", to)
        norm.launch(_blocks(work.n_items), THREADS, items=work.items, n_items=work.n_items, perm=kc.perm, lse=lse,
                    H=H, p=p, seed=seed, offset=offset, rng=rng, dropped=int(return_attention == "dropped"),
                    logits=logits, alpha=alpha)
    return out, lse, alpha


_accumulator = row_attention.accumulator
_finish_accumulator = row_attention.finish_accumulator


def backward(graph, x_src: Tensor, x_dst: Tensor, att: Tensor, edge_term: Optional[Tensor], out: Tensor,
             lse: Tensor, grad_out: Tensor, alpha: Optional[Tensor], grad_alpha: Optional[Tensor],
             alpha_dropped: bool, slope: float, p: float, seed: Union[int, Tensor], offset: Optional[int],
             needs: Tuple[bool, bool, bool, bool], mode: Optional[str] = None):
    """Gradients (dx_src, dx_dst, datt, d_edge_term), each None where ``needs`` says so.

    Dtypes as :func:`forward`'s: x_src, x_dst, edge_term in T, att float32; ``out`` (saved),
    ``grad_out`` [N_dst, H, D] contiguous, ``alpha`` and ``grad_alpha`` [M, H] (caller order,
    the gradient of the returned attention, None when there is none) in out's dtype; the
    dropout stream as the forward's. dx_src, dx_dst, d_edge_term come back in T, datt in
    float32 (the op casts it to att's dtype). ``mode``: one of :data:`BACKWARDS` (None: the
    plan's, :func:`plan_backward`: ``GNN_FASTPATH_GATV2_BWD``, else with ``GNN_FASTPATH_TUNE=1``
    on a graph that outlived a training step the variant measured fastest for this size class,
    else the rule, :func:`backward_mode`).
    """
    dev = x_src.device
    given_stream = (seed, offset)  # as given: the timed runs of a tuned choice take the same stream
    graph.note_pass("backward")
    rng, seed, offset = row_attention.philox_stream(seed, offset, dev)
    n_src, n_dst, M = graph.n_src, graph.n_dst, graph.num_edges
    H, D = x_src.shape[1], x_src.shape[2]
    T = x_src.dtype
    f32 = dict(dtype=torch.float32, device=dev)
    need_src, need_dst, need_att, need_et = needs
    need_et = need_et and edge_term is not None
    plan = plan_backward(graph, x_src, x_dst, att, edge_term, out, grad_out, need_src)
    if mode is not None:
        plan = plan.pick(mode, "caller")
    else:
        def run(variant):
            return backward(graph, x_src, x_dst, att, edge_term, out, lse, grad_out, alpha, grad_alpha,
                            alpha_dropped, slope, p, *given_stream, needs, variant)

        plan = plans.run(graph, plan, dev, run)
    mode = plan.variant
    if graph.static:
        mode = row_attention.backward_variant(mode, _work(graph, chunk=plan.chunk))
    if need_src and n_dst and M:
        if mode == "fused":
            reverse = reverse_ids(graph, detect=True)
            if reverse is not None:
                return _backward_fused(graph, x_src, x_dst, att, edge_term, out, lse, grad_out, alpha, grad_alpha,
                                       alpha_dropped, slope, p, seed, offset, rng, needs, reverse, plan)
            mode = "transposed"  # not undirected after all: the fused variant's fallback
    transposed = mode == "transposed"

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
    work = _work(graph, chunk=plan.chunk)
    row_attention.zero_skipped(work, d_edge_term)
    cfg = plan.cfg
    ti, to = launch.ctype(T), launch.ctype(out.dtype)
    has_et = edge_term is not None
    n_tiles = cfg.n_tiles(H)
    stream = KERNELS if rng is None else KERNELS_RNG

    delta_alpha = _delta_alpha(work, kc, alpha, grad_alpha, n_dst, H) if grad_alpha is not None and M else None
    dx_dst_acc, dst_index = _accumulator(dx_dst, graph, work, source_major=False)
    delta = torch.empty(n_dst, H, **f32) if transposed else None

    smem = _datt_shared_bytes(need_att, H, D, rng)
    n_work = work.n_items * n_tiles
    bwd = stream.kernel(dev, "gatv2_bwd_dst", ti, to, *cfg.args(has_et))
    bwd.launch(_grid(bwd, n_work, smem, always_persistent=True), THREADS, shared_mem=smem,
               items=work.items, n_work=n_work, n_tiles=n_tiles, indptr=kc.indptr, indices=kc.indices,
               perm=kc.perm, x_src=x_src, x_dst=x_dst, att=att, edge_term=edge_term, out=out, grad_out=grad_out,
               lse=lse, delta_alpha=delta_alpha, grad_alpha=grad_alpha, grad_alpha_dropped=int(alpha_dropped), H=H,
               D_rt=D, slope=slope, p=p, seed=seed, offset=offset, rng=rng, dx_src=dx_src_acc, dx_dst=dx_dst,
               dx_dst_acc=dx_dst_acc, acc_index=dst_index, d_edge_term=d_edge_term, datt=datt,
               datt_smem=int(smem > 0), delta_out=delta)
    _finish_accumulator(dx_dst, dx_dst_acc, work)
    if need_src and not transposed and dx_src is None:
        dx_src = dx_src_acc.to(T)  # the one cast of the float32 atomic sums

    if transposed and n_src:
        scsr = graph.kernel_source_csr()
        swork = _work(graph, source_major=True, chunk=plan.chunk)
        src_acc, src_index = _accumulator(dx_src, graph, swork, source_major=True)
        src = stream.kernel(dev, "gatv2_bwd_src", ti, to, *cfg.args(has_et))
        n_swork = swork.n_items * n_tiles
        src.launch(_grid(src, n_swork), THREADS, items=swork.items, n_work=n_swork, n_tiles=n_tiles,
                   s_indices=scsr.indices, s_perm=scsr.perm, x_src=x_src, x_dst=x_dst, att=att,
                   edge_term=edge_term, grad_out=grad_out, lse=lse, delta=delta, grad_alpha=grad_alpha,
                   grad_alpha_dropped=int(alpha_dropped), H=H, D_rt=D, slope=slope, p=p, seed=seed,
                   offset=offset, rng=rng, dx_src=dx_src, dx_src_acc=src_acc, acc_index=src_index)
        _finish_accumulator(dx_src, src_acc, swork)
    return dx_src, dx_dst, datt, d_edge_term


def _backward_fused(graph, x_src, x_dst, att, edge_term, out, lse, grad_out, alpha, grad_alpha, alpha_dropped,
                    slope, p, seed, offset, rng, needs, reverse, plan):
    """:func:`backward`'s ``"fused"`` variant on an undirected graph (``reverse``: the caller
    ids of the reverse edges, :func:`reverse_ids`): delta of every row, then one pass for
    both gradients of each node (gatv2_bwd_undirected). Arguments as :func:`backward`'s,
    the dropout stream already resolved (``rng``, ``seed``, ``offset``); ``plan`` the
    backward's (instantiation, chunk length)."""
    dev = x_src.device
    n, M = graph.n_dst, graph.num_edges
    H, D = x_src.shape[1], x_src.shape[2]
    T = x_src.dtype
    f32 = dict(dtype=torch.float32, device=dev)
    _, need_dst, need_att, need_et = needs
    need_et = need_et and edge_term is not None
    kc = graph.kernel_csr()
    work = _work(graph, chunk=plan.chunk)
    cfg = plan.cfg
    ti, to = launch.ctype(T), launch.ctype(out.dtype)
    n_tiles = cfg.n_tiles(H)
    stream = KERNELS if rng is None else KERNELS_RNG

    delta_alpha = _delta_alpha(work, kc, alpha, grad_alpha, n, H) if grad_alpha is not None else None
    delta = torch.empty(n, H, **f32)
    n_rows = n * n_tiles
    dk = KERNELS.kernel(dev, "gatv2_delta", to, cfg.vw, cfg.lh, cfg.k, cfg.dc)
    dk.launch(_blocks(n_rows), THREADS, n_work=n_rows, n_tiles=n_tiles, out=out, grad_out=grad_out,
              delta_alpha=delta_alpha, H=H, D_rt=D, delta=delta)

    dx_src = torch.empty(n, H, D, dtype=T, device=dev)
    dx_dst = torch.empty(n, H, D, dtype=T, device=dev) if need_dst else None
    datt = torch.zeros(H, D, **f32) if need_att else None
    d_edge_term = torch.empty(M, H, D, dtype=T, device=dev) if need_et else None
    src_acc, acc_index = _accumulator(dx_src, graph, work, source_major=False)
    dst_acc, _ = _accumulator(dx_dst, graph, work, source_major=False)
    smem = _datt_shared_bytes(need_att, H, D, rng)
    n_work = work.n_items * n_tiles
    fused = stream.kernel(dev, "gatv2_bwd_undirected", ti, to, *fused_config(cfg).args(edge_term is not None))
    fused.launch(_grid(fused, n_work, smem, always_persistent=True), THREADS, shared_mem=smem,
                 items=work.items, n_work=n_work, n_tiles=n_tiles, indices=kc.indices, perm=kc.perm,
                 s_perm=reverse, x_src=x_src, x_dst=x_dst, att=att, edge_term=edge_term, grad_out=grad_out,
                 lse=lse, delta=delta, grad_alpha=grad_alpha, grad_alpha_dropped=int(alpha_dropped), H=H, D_rt=D,
                 slope=slope, p=p, seed=seed, offset=offset, rng=rng, dx_src=dx_src, dx_src_acc=src_acc,
                 dx_dst=dx_dst, dx_dst_acc=dst_acc, acc_index=acc_index, d_edge_term=d_edge_term, datt=datt,
                 datt_smem=int(smem > 0))
    _finish_accumulator(dx_src, src_acc, work)
    _finish_accumulator(dx_dst, dst_acc, work)
    return dx_src, dx_dst, datt, d_edge_term
