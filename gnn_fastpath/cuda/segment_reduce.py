"""Launcher of the min/max aggregation kernels (``segment_reduce.cu``).

One call per pass: :func:`forward` and :func:`backward` take the Graph. Degree-aware: rows
with at least :data:`SPLIT_FROM` in-edges are cut into chunks of :data:`CHUNK` edges merged
with 64-bit atomics (the row-chunk work list, built once per graph and shared with the own
SpMM kernel); the other rows get a lane group each. Nothing here synchronises with the host
except building the work list on a graph's first use.

Dtypes: x is float32, float16 or bfloat16 (read as such: 16-byte loads are 8 halves), the
output ``out`` float32 or x's dtype (promote_types(x, w) as the op decides), weights float32
(the op converts them), aux int32. Gradients accumulate with float atomics: into dx / dw
directly when those are float32, else into float32 scratch buffers cast once at the end
(adding into 16-bit memory would round at every atomic).

Settings (:mod:`gnn_fastpath.config`, read by the plans, :func:`plan_forward` and
:func:`plan_backward`, whose keys hold them: a change takes effect at the next call):
``GNN_FASTPATH_SR_CHUNKS`` (feature chunks of 4 floats per lane; empty: :func:`rule_chunks`,
or with ``GNN_FASTPATH_TUNE=1`` the forward's count measured fastest per size class),
``GNN_FASTPATH_SR_BWD`` (atomic or source-major backward, :func:`backward_mode`),
``GNN_FASTPATH_SR_SCATTER`` (the atomic scatter's thread order, :func:`scatter_order`) and
``GNN_FASTPATH_VEC16``. The launchers take the plan (:mod:`gnn_fastpath.cuda.plans`).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from .. import config, tuning
from . import launch, plans, worklist

SOURCE = "segment_reduce.cu"
THREADS = 128
#: Threads per block of the atomic scatter (one thread per element, not per 4 elements: a
#: warp's atomics then touch one line of each winning source instead of 4).
ARG_THREADS = 256
#: Bytes per vector access of 16-bit feature rows (launch.bytes16; GNN_FASTPATH_VEC16 overrides):
#: 8, i.e. the float32 lane layout with 4 halves per lane; 16-byte accesses do not pay off
#: for this family.
VEC16_BYTES = 8
#: Tie-rule codes of the kernels (``-D`` defines, so the .cu and this module agree).
MODE_COUNT, MODE_FIRST, MODE_LAST, MODE_VALUE = 0, 1, 2, 3
#: Non-finite rules of the kernels: torch/PyG (NaN wins, inf kept) and DGL (NaN skipped,
#: non-finite extremes written as 0 with no winning edge).
KEEP, DROP = 0, 1
NON_FINITE = {"keep": KEEP, "drop": DROP}
KERNELS = launch.Family(SOURCE, {"SR_MODE_COUNT": MODE_COUNT, "SR_MODE_FIRST": MODE_FIRST,
                                 "SR_MODE_LAST": MODE_LAST, "SR_MODE_VALUE": MODE_VALUE,
                                 "SR_KEEP": KEEP, "SR_DROP": DROP, "SR_THREADS": THREADS})
#: Tie rule of the public op -> what the forward saves and the backward does.
MODES = {"split": MODE_COUNT, "even": MODE_COUNT, "first": MODE_FIRST, "last": MODE_LAST}
#: Rows with at least this many in-edges are cut into chunks: a group walks its row's edges
#: one after another, so the row length, not its rank, is what must be bounded.
SPLIT_FROM = 128
#: Edges per chunk of a long row.
CHUNK = 64
#: Without GNN_FASTPATH_SR_CHUNKS or the tuner: one feature chunk of VEC features per lane
#: where destinations have FEW_EDGES in-edges or more on average (FEW_EDGES_16BIT for 16-bit
#: rows), else CHUNKS_FEW (see :func:`rule_chunks`: long rows keep enough loads in flight with
#: one chunk, short rows need a second chunk's loads to hide the latency).
FEW_EDGES = 16
FEW_EDGES_16BIT = 4
CHUNKS_FEW = 2
#: Row loads per lane in flight in the forward (not 8: the registers for 8 cost occupancy).
LOADS = 4


#: Edges per item of the tie walk (rows from this many in-edges are cut): a group walks its
#: item's edges one after another, and one walking row anywhere keeps the whole kernel as
#: long as that chain, so the walk's items are shorter than the forward's where that is free:
#: where the walk's grid is at its wave cap (batch > 1), more items add no group. Below the
#: cap every extra item is one more group launched, so there the forward's items are kept.
WALK_CHUNK = 32


def walk_chunks(graph) -> worklist.RowChunks:
    """The tie walk's work list: every destination row, rows of :data:`WALK_CHUNK` or more
    in-edges cut into chunks of that many (built once per graph). Only for graphs that
    outlived a training step: on a sampled batch's graph, whose fan-out bounds its rows, the
    forward's list costs no host read, where this one could (fan-outs of 32 or more)."""
    return worklist.for_graph(graph, WALK_CHUNK, WALK_CHUNK, tag="split_row")


def row_chunks(graph, source_major: bool = False) -> worklist.RowChunks:
    """The degree-aware work list of ``graph``'s destination rows (or source rows); the own
    SpMM kernel walks the same list."""
    return worklist.for_graph(graph, CHUNK, SPLIT_FROM, source_major=source_major, interleave=True,
                              tag="split_row")


def forward(graph, x: Tensor, w: Optional[Tensor], sign: float, tie_break: str, non_finite: str,
            need_aux: bool, out: Tensor, max_chunks: Optional[int] = None) -> Optional[Tensor]:
    """``out`` [n_dst, F] = sign * max_k round_out((sign * w_k) * x[src_k]) per row; returns aux.

    ``max_chunks``: feature chunks per lane (None: the plan's, :func:`plan_forward`).

    ``x`` [n_src, F] float32/float16/bfloat16, ``w`` float32 [M] or None, ``out`` float32
    or x's dtype (messages are rounded to it, see segment_reduce.cu). The saved state is int32
    [n_dst * F + 1 + n_dst] (:func:`saved_state`): aux [n_dst, F], what the backward needs for
    the tie rule (the winning caller edge id; for split/even the winning edge's CSR position
    where one edge wins, else -1 - the tie count), the "walk all" flag and one "walks" flag
    per row (split/even); None
    without ``need_aux`` (value only).
    """
    F = x.size(1)
    device = x.device
    n_dst = graph.n_dst
    state = torch.empty(state_size(n_dst, F), dtype=torch.int32, device=device) if need_aux else None
    aux, walk_all, row_walks = saved_state(state, n_dst, F)
    if need_aux:
        state[n_dst * F:].zero_()  # the flags (split/even only; zero for the others too), in one fill
        graph.note_pass("forward")
    if n_dst == 0 or F == 0:
        return state
    if max_chunks is None:
        plan = _forward_plan(graph, x, w, sign, tie_break, non_finite, need_aux, out)
    else:
        plan = plan_forward(graph, x, w, need_aux, out).pick(str(max_chunks), "caller")
    max_chunks = int(plan.variant)
    kc = graph.kernel_csr()
    fcfg = launch.lane_groups(F, x, out, max_chunks=max_chunks, vec16_bytes=plan.vec16_bytes, resolved=True)
    vec, lanes, chunks, fblocks = fcfg
    mode = MODES[tie_break] if need_aux else MODE_VALUE
    nf = NON_FINITE[non_finite]
    tx, to = launch.ctype(x.dtype), launch.ctype(out.dtype)
    count = mode == MODE_COUNT
    flag, rows_flag = (walk_all, row_walks) if count else (None, None)
    zero_walks = int(count and tie_break == "split")  # the backward's scatter then never reads out
    # duplicate edges tying alone go along their first (unweighted, sorted rows: see the .cu)
    dup_ties = _duplicates(graph) if count and w is None and graph.sources_sorted else None
    if _pieces(graph, non_finite):
        _static_forward(graph, x, w, sign, mode, nf, zero_walks, fcfg, out, aux, flag, rows_flag)
        return state
    work = row_chunks(graph)
    n_rows = n_dst - work.n_split
    if not work.n_split:  # every row whole: row = group id
        KERNELS.kernel(device, "sr_fwd_rows", tx, to, *fcfg[:3], mode, nf, LOADS).launch(
            launch.group_grid(n_rows, lanes, fblocks, THREADS), THREADS, indptr=kc.indptr, indices=kc.indices,
            perm=kc.perm, x=x, w=w, rows=None, n_rows=n_rows, F=F, sign=sign, dup_ties=dup_ties,
            zero_walks=zero_walks, out=out, aux=aux, walk_all=flag, row_walks=rows_flag)
        return state
    # long rows' chunks and the light rows in one launch (one tail instead of two)
    packed = torch.zeros(work.n_split, F, dtype=torch.int64, device=device)
    items = _source_aligned_chunks(graph) if dup_ties is not None else work.items
    chunk_blocks = launch.group_grid(work.n_split_items, lanes, fblocks, THREADS)[0]
    row_blocks = launch.group_grid(n_rows, lanes, fblocks, THREADS)[0] if n_rows else 0
    KERNELS.kernel(device, "sr_fwd_split", tx, to, *fcfg[:3], mode, nf, LOADS).launch(
        (chunk_blocks + row_blocks, fblocks), THREADS, indptr=kc.indptr, indices=kc.indices, perm=kc.perm, x=x, w=w,
        rows=work.whole_rows, n_rows=n_rows, items=items, n_items=work.n_split_items, chunk_blocks=chunk_blocks, F=F,
        sign=sign, dup_ties=dup_ties, zero_walks=zero_walks, out=out, aux=aux, packed=packed, walk_all=flag,
        row_walks=rows_flag)
    KERNELS.kernel(device, "sr_fwd_unpack", to).launch(
        launch.cdiv(work.n_split * F, 256), 256, packed=packed, split=work.split, n_split=work.n_split, F=F,
        sign=sign, mode=mode, non_finite=nf, zero_walks=zero_walks, out=out, aux=aux, row_walks=rows_flag)
    return state


def _duplicates(graph) -> torch.Tensor:
    """int32 [1] on the device, once per graph whose rows' sources ascend: 1 when a row holds
    one source twice (two neighbouring CSR entries of a row share it), else 0. No host read:
    the forward's lanes with ties read it before they look for duplicates."""
    def build():
        kc = graph.kernel_csr()
        m = kc.indices.numel()
        if m < 2:
            return torch.zeros(1, dtype=torch.int32, device=kc.indices.device)
        first = torch.zeros(m, dtype=torch.bool, device=kc.indices.device)  # a row's first entry
        first.index_fill_(0, kc.indptr[:-1].clamp(max=m - 1).long(), True)  # (a clamped end only hides a pair)
        same = (kc.indices[1:] == kc.indices[:-1]) & ~first[1:]
        return same.any().to(torch.int32).reshape(1)

    return graph.memo(("segment_reduce", "duplicates"), build)


def _source_aligned_chunks(graph) -> torch.Tensor:
    """The forward's chunk items of split rows (the first ``n_split_items`` of
    :func:`row_chunks`) with every bound moved to the next change of source, once per graph:
    with ``dup_ties`` the chunks' merge counts a source's duplicates from the one chunk that
    holds them all (``sr_align_chunks``)."""
    def build():
        work, kc = row_chunks(graph), graph.kernel_csr()
        items = work.items[:work.n_split_items].clone()
        KERNELS.kernel(items.device, "sr_align_chunks").launch(
            launch.cdiv(work.n_split_items, 256), 256, items=items, n_items=work.n_split_items, indptr=kc.indptr,
            indices=kc.indices)
        return items

    return graph.memo(("segment_reduce", "source_aligned_chunks"), build)


#: Settings the forward's and the backward's plans read (part of their keys).
FORWARD_SETTINGS = ("GNN_FASTPATH_SR_CHUNKS", "GNN_FASTPATH_VEC16") + plans.TUNE_SETTINGS
BACKWARD_SETTINGS = ("GNN_FASTPATH_SR_BWD", "GNN_FASTPATH_SR_SCATTER", "GNN_FASTPATH_SR_CHUNKS",
                     "GNN_FASTPATH_VEC16") + plans.TUNE_SETTINGS


def plan_forward(graph, x: Tensor, w: Optional[Tensor], need_aux: bool, out: Tensor) -> plans.Plan:
    """The forward's plan: its variant is the feature chunks per lane (``"1"``, ``"2"``,
    ``"4"``): ``GNN_FASTPATH_SR_CHUNKS``, else :func:`rule_chunks`, and with
    ``GNN_FASTPATH_TUNE=1`` on an eager graph a pending tuner choice (fewer chunks issue fewer
    instructions per edge at once, more keep more loads in flight; which wins depends on the
    graph); ``vec16_bytes``: the 16-bit vector width (``GNN_FASTPATH_VEC16`` or
    :data:`VEC16_BYTES`)."""
    F = x.size(1)
    weighted = w is not None
    key = (F, bool(need_aux), weighted, plans.layout(x, out), plans.snapshot(*FORWARD_SETTINGS), graph.static)

    def build():
        params = (("vec16_bytes", launch.bytes16(VEC16_BYTES)),)
        chunks = config.setting("GNN_FASTPATH_SR_CHUNKS")
        if chunks is not None:
            return plans.Plan("segment_reduce.forward", str(chunks), "setting", rule=str(chunks), params=params)
        rule = str(rule_chunks(graph, x.dtype))
        tune = None
        if tuning.enabled() and not graph.static:
            tune = plans.Tune(("segment_reduce.forward", F, x.dtype, out.dtype, need_aux, weighted), ("1", "2", "4"),
                              forward_class, (F, x.dtype, out.dtype, need_aux, weighted))
        return plans.Plan("segment_reduce.forward", rule, "rule", rule=rule, params=params, tune=tune)

    return plans.resolve(graph, "segment_reduce.forward", key, build)


def forward_chunks(graph, x: Tensor, w: Optional[Tensor], sign: float, tie_break: str, non_finite: str,
                   need_aux: bool, out: Tensor) -> int:
    """Feature chunks per lane of the forward: the variant of :func:`plan_forward`'s plan (the
    tuner's choice settled with this call's inputs)."""
    return int(_forward_plan(graph, x, w, sign, tie_break, non_finite, need_aux, out).variant)


def _forward_plan(graph, x, w, sign, tie_break, non_finite, need_aux, out) -> plans.Plan:
    def run(variant):
        return forward(graph, x, w, sign, tie_break, non_finite, need_aux, out, int(variant))

    return plans.run(graph, plan_forward(graph, x, w, need_aux, out), x.device, run)


def rule_chunks(graph, dtype: Optional[torch.dtype] = None) -> int:
    """Feature chunks per lane without tuning, for rows of ``dtype`` (None: float32): 1 where
    destinations have :data:`FEW_EDGES` in-edges or more on average (16-bit rows:
    :data:`FEW_EDGES_16BIT`), else :data:`CHUNKS_FEW` (two chunks keep twice the loads in
    flight across the short rows). 16-bit rows keep one chunk down to shorter rows: there a
    second chunk pays off only on the shortest rows."""
    few = FEW_EDGES if dtype is None or dtype == torch.float32 else FEW_EDGES_16BIT
    return 1 if graph.num_edges >= few * max(graph.n_dst, 1) else CHUNKS_FEW


def forward_class(graph, F: int, x_dtype: torch.dtype, out_dtype: torch.dtype, need_aux: bool,
                  weighted: bool = False) -> str:
    """The tuner's size class (:func:`gnn_fastpath.tuning.size_class`) of the forward: the
    degree skew is the number of chunks the work list cut long rows into; the output dtype,
    whether the winner is saved and whether edges are weighted change the instructions per
    edge."""
    decision = f"segment_reduce.forward|out {str(out_dtype).replace('torch.', '')}|{'grad' if need_aux else 'value'}"
    if weighted:
        decision += "|weighted"
    return tuning.size_class(decision, graph.n_src, graph.n_dst, graph.num_edges, F, x_dtype,
                             row_chunks(graph).n_split_items)


def state_size(n_dst: int, F: int):
    """int32 elements of the saved state: aux, the "walk all" flag, one flag per row."""
    return n_dst * F + 1 + n_dst


def saved_state(state: Optional[Tensor], n_dst: int, F: int) -> Tuple[Optional[Tensor], ...]:
    """(aux [n_dst, F], walk_all [1], row_walks [n_dst]) views of the forward's saved state
    (three None for None)."""
    if state is None:
        return None, None, None
    a = n_dst * F
    return state[:a].view(n_dst, F), state[a:a + 1], state[a + 1:]


def _pieces(graph, non_finite: str) -> bool:
    """Whether the static launch cuts rows into pieces (:func:`worklist.virtual_rows`): on a
    static graph (compiled path), where no work list may be sized on the host. Not for DGL's
    ``"drop"`` rule, whose per-piece zeros would compete with the other pieces' extremes."""
    return graph.static and non_finite == "keep"


#: The static launch's row pieces (:func:`_virtual`).
PIECES = worklist.StaticGeometry("virtual_rows", SPLIT_FROM)


def static_geometry(non_finite: str) -> Tuple[worklist.StaticGeometry, ...]:
    """The work lists a static graph's launches read (what the operators are handed)."""
    return (PIECES,) if non_finite == "keep" else ()


def _virtual(graph):
    """(vindptr, owner) of the destination rows cut into pieces of at most SPLIT_FROM edges."""
    return worklist.static_geometry(graph, PIECES)


def _static_forward(graph, x, w, sign, mode, nf, zero_walks, fcfg, out, aux, walk_all, row_walks) -> None:
    """The forward over row pieces: each piece's extreme (and tie count or winning edge) by
    the whole-row kernel, then combined per row by torch scatter reductions; the pieces' empty
    tail goes to a spare row ``n_dst``."""
    kc = graph.kernel_csr()
    vindptr, owner = _virtual(graph)
    cap, F, n_dst = owner.numel(), x.size(1), graph.n_dst
    device = x.device
    piece_out = torch.empty(cap, F, dtype=out.dtype, device=device)
    piece_aux = torch.empty(cap, F, dtype=torch.int32, device=device) if aux is not None else None
    vec, lanes, chunks, fblocks = fcfg
    if cap:
        KERNELS.kernel(device, "sr_fwd_rows", launch.ctype(x.dtype), launch.ctype(out.dtype), *fcfg[:3], mode,
                       nf, LOADS).launch(launch.group_grid(cap, lanes, fblocks, THREADS), THREADS, indptr=vindptr,
                                  indices=kc.indices, perm=kc.perm, x=x, w=w, rows=None, n_rows=cap, F=F, sign=sign,
                                  dup_ties=None, zero_walks=zero_walks, out=piece_out, aux=piece_aux,
                                  walk_all=walk_all, row_walks=None)
    index = owner.unsqueeze(1).expand(cap, F)
    # float32 combine, exact for every output dtype (16-bit values widen and narrow exactly):
    # torch's 16-bit amax/amin atomics read the whole aligned 32-bit word around an element,
    # 2 bytes past the end of a tensor whose last element starts a word (compute-sanitizer
    # memcheck, bf16, torch 2.11)
    pieces = piece_out.float()
    value = torch.zeros(n_dst + 1, F, dtype=torch.float32, device=device).scatter_reduce_(
        0, index, pieces, "amax" if sign > 0 else "amin", include_self=False)
    out.copy_(value[:n_dst])
    if aux is None:
        return
    best = value.index_select(0, owner)
    tied = (pieces == best) | (pieces.isnan() & best.isnan())
    if mode == MODE_COUNT:
        # tied edges of the row: those of the pieces reaching its extreme (a piece's aux is its
        # one winner, or -1 - its tie count); the row's winner is the one of a single tied
        # piece with a single winner
        count = torch.where(piece_aux < 0, -1 - piece_aux, 1) * tied
        n = torch.zeros(n_dst + 1, F, dtype=torch.int32, device=device).index_add_(0, owner, count)
        winner = torch.full((n_dst + 1, F), -1, dtype=torch.int32, device=device).scatter_reduce_(
            0, index, torch.where(tied, piece_aux, -1), "amax")
        total = torch.where((n == 1) & (winner >= 0), winner, -1 - n)
        row_walks.copy_((total[:n_dst] < 0).any(1))  # empty rows too: the walk skips them
    else:  # the first (last) winning edge among the pieces reaching the extreme
        first = mode == MODE_FIRST
        none = torch.iinfo(torch.int32).max if first else -1
        total = torch.full((n_dst + 1, F), none, dtype=torch.int32, device=device).scatter_reduce_(
            0, index, torch.where(tied & (piece_aux >= 0), piece_aux, none), "amin" if first else "amax")
        total = torch.where(total == none, piece_aux.new_full((), -1), total)
    aux.copy_(total[:n_dst])


def backward(graph, x: Tensor, w: Optional[Tensor], sign: float, tie_break: str, out: Tensor, state: Tensor,
             grad_out: Tensor, need_dx: bool, need_dw: bool,
             mode: Optional[str] = None) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """(dx [n_src, F] or None, dw [M] or None) for the tie rule the forward used, from the
    state :func:`forward` saved.

    ``out`` and ``grad_out`` in the output's dtype, ``x`` in its own, ``w`` float32. dx comes
    back in x's dtype; dw float32 (the op casts it to the weight's dtype). ``mode``: how the
    single winners' gradients are scattered, ``"atomic"`` or ``"transposed"`` (None: the
    plan's, :func:`plan_backward`: the setting, :func:`backward_mode`, or with
    ``GNN_FASTPATH_TUNE=1`` the one measured fastest).
    """
    device = x.device
    F = x.size(1)
    graph.note_pass("backward")
    # float32 accumulators (the result itself for float32 x, else scratch cast once below)
    dx = torch.zeros(x.shape, dtype=torch.float32, device=device) if need_dx else None
    dw = torch.zeros(graph.num_edges, dtype=torch.float32, device=device) if need_dw else None
    if state.numel() == state_size(graph.n_dst, F) and graph.n_dst * F != 0:
        plan = plan_backward(graph, x, w, tie_break, out, state, grad_out, need_dx, need_dw)
        if mode is not None:
            plan = plan.pick(mode, "caller")
        else:
            def run(variant):
                return backward(graph, x, w, sign, tie_break, out, state, grad_out, need_dx, need_dw, variant)

            plan = plans.run(graph, plan, device, run)
        _backward(graph, x, w, sign, tie_break, out, *saved_state(state, graph.n_dst, F), grad_out, dx, dw, plan)
    return (None if dx is None else dx.to(x.dtype)), dw


#: How the backward scatters the gradients of single winners (see segment_reduce.cu):
#: atomics along the saved winners, or a source-major pass over the out-edges without atomics.
BACKWARDS = ("atomic", "transposed")
#: The rule (no GNN_FASTPATH_SR_BWD, no tuning): the source-major pass where sources have at
#: most this many out-edges on average: it beats the atomics on such sparse graphs only; on
#: denser ones reading aux per edge costs more than the atomics.
TRANSPOSED_MAX_MEAN_DEGREE = 3.0


def plan_backward(graph, x: Tensor, w: Optional[Tensor], tie_break: str, out: Tensor, state: Tensor,
                  grad_out: Tensor, need_dx: bool, need_dw: bool) -> plans.Plan:
    """The backward's plan: ``"atomic"`` or ``"transposed"`` (``GNN_FASTPATH_SR_BWD``, or
    :func:`backward_mode`, and with ``GNN_FASTPATH_TUNE=1`` where the source-major pass may run
    a pending tuner choice); ``scatter``: the atomic scatter's order (:func:`scatter_order`,
    for dx, where the atomic variant may run; else None); ``max_chunks``: the lane groups' feature chunks (``GNN_FASTPATH_SR_CHUNKS`` or
    :func:`rule_chunks`); ``vec16_bytes``: the 16-bit vector width."""
    F = x.size(1)
    weighted = w is not None
    key = (F, MODES[tie_break] == MODE_COUNT, bool(need_dx), bool(need_dw), weighted,
           plans.layout(x, out, grad_out, state), plans.snapshot(*BACKWARD_SETTINGS), graph.static,
           graph.outlived_a_step())

    def build():
        forced = config.setting("GNN_FASTPATH_SR_BWD")
        rule = backward_mode(graph, tie_break)
        tune = None
        if forced is None and _may_go_source_major(graph, tie_break) and tuning.enabled():
            tune = plans.Tune(("segment_reduce.backward", F, x.dtype, out.dtype, need_dx, need_dw, weighted),
                              BACKWARDS, backward_class, (F, x.dtype, out.dtype, weighted, need_dw))
        decided = "setting" if forced is not None and MODES[tie_break] == MODE_COUNT and not graph.static else "rule"
        # the scatter order matters to the atomic variant only (None: not decided here, the
        # variant a caller named decides it at its launch)
        atomic_may_run = rule == "atomic" or tune is not None
        params = (("scatter", scatter_order(graph, F, x.device) if need_dx and atomic_may_run else None),
                  ("max_chunks", config.setting("GNN_FASTPATH_SR_CHUNKS") or rule_chunks(graph, x.dtype)),
                  ("vec16_bytes", launch.bytes16(VEC16_BYTES)))
        return plans.Plan("segment_reduce.backward", rule, decided, rule=rule, params=params, tune=tune)

    return plans.resolve(graph, "segment_reduce.backward", key, build)


def backward_mode(graph, tie_break: str) -> str:
    """``"atomic"`` or ``"transposed"`` scatter of the single winners' gradients for ``graph``
    (``GNN_FASTPATH_SR_BWD`` forces one for split/even). The source-major pass compares CSR
    positions, which only split/even save; the compiled path's static graphs carry no
    source-major CSR: both always scatter with atomics. Unforced, the source-major pass is for
    graphs that outlived a training step (:meth:`Graph.outlived_a_step`): it needs the graph's
    transpose (or its symmetry detected), a one-time cost that a sampled batch, whose graph
    lives one step (and whose many leaf nodes make the mean out-degree small), would pay on
    every step."""
    if MODES[tie_break] != MODE_COUNT or graph.static:
        return "atomic"
    forced = config.setting("GNN_FASTPATH_SR_BWD")
    if forced is not None:
        return forced
    if not _may_go_source_major(graph, tie_break):
        return "atomic"
    return "transposed" if graph.num_edges <= TRANSPOSED_MAX_MEAN_DEGREE * max(graph.n_src, 1) else "atomic"


def _may_go_source_major(graph, tie_break: str) -> bool:
    """Whether the rule or the tuner may pick the source-major pass (see :func:`backward_mode`):
    split/even, on an eager graph that outlived a training step. The one test both use."""
    return MODES[tie_break] == MODE_COUNT and not graph.static and graph.outlived_a_step()


def backward_class(graph, F: int, x_dtype: torch.dtype, out_dtype: torch.dtype, weighted: bool = False,
                   need_dw: bool = False) -> str:
    """The tuner's size class of the backward: the degree skew is the forward's (the chunks of
    long destination rows, known from the forward; the source-major list would cost a
    transpose on graphs that never take that pass); weights and a weight gradient add work
    per element to both scatters."""
    decision = f"segment_reduce.backward|out {str(out_dtype).replace('torch.', '')}"
    decision += ("|weighted" if weighted else "") + ("|dw" if need_dw else "")
    return tuning.size_class(decision, graph.n_src, graph.n_dst, graph.num_edges, F, x_dtype,
                             row_chunks(graph).n_split_items)


def _source_walk(graph):
    """(work items, destination per out-edge, CSR position per out-edge) of the source-major
    pass. Symmetry is detected first (once per graph; this pass is taken where sources have
    few out-edges, or where the tuner measured it, so graphs of one step rarely come here):
    an undirected graph's source-major CSR is then its forward CSR, no transpose is built
    (:meth:`~gnn_fastpath.graph.Graph.source_csr`)."""
    graph.reverse_edges()
    scsr = graph.kernel_source_csr()
    return row_chunks(graph, source_major=True), scsr.indices, scsr.csr_pos


def _backward(graph, x, w, sign, tie_break, out, aux, walk_all, row_walks, grad_out, dx, dw, plan) -> None:
    F = x.size(1)
    mode = plan.variant
    device = x.device
    tx, to = launch.ctype(x.dtype), launch.ctype(out.dtype)
    kc = graph.kernel_csr()
    count = MODES[tie_break] == MODE_COUNT
    # first/last saved caller ids, whose source needs a per-graph table (split/even saved CSR
    # positions: the CSR gives the source)
    src_of = None if count else graph.memo(("segment_reduce", "caller_src_int32"),
                                           lambda: graph.caller_coo()[0].to(torch.int32))
    fcfg = launch.lane_groups(F, x, out, grad_out, aux, max_chunks=plan.max_chunks, vec16_bytes=plan.vec16_bytes,
                              resolved=True)
    vec, lanes, chunks, fblocks = fcfg
    if mode == "transposed":
        swork, s_dst, s_pos = _source_walk(graph)
        if swork.n_items:  # without sources there is nothing to scatter (dx stays 0)
            KERNELS.kernel(device, "sr_bwd_src", tx, to, *fcfg[:3]).launch(
                launch.group_grid(swork.n_items, lanes, fblocks, THREADS), THREADS, items=swork.items,
                n_items=swork.n_items, dst=s_dst, pos=s_pos, perm=kc.perm, w=w, x=x, F=F, aux=aux,
                walk_all=walk_all, grad_out=grad_out, dx=dx, dw=dw)
    else:
        _scatter(graph, aux, grad_out, to, kc.indices if count else src_of, count, w, x,
                 walk_all if count else None, dx, dw,
                 plan.scatter if plan.scatter is not None or dx is None else scatter_order(graph, F, device))
    if not count:
        return
    # split/even: the elements whose edges tie (or whose extreme is NaN) walk their rows
    walk = KERNELS.kernel(device, "sr_bwd_ties", tx, to, *fcfg[:3])
    resident = launch.resident_blocks(walk, THREADS) * THREADS // lanes
    if graph.static:  # the pieces of the forward as work items, each naming its real row
        vindptr, owner = _virtual(graph)
        items = torch.stack([owner.clamp(max=max(graph.n_dst - 1, 0)), vindptr[:-1].to(torch.int64),
                             vindptr[1:].to(torch.int64), torch.full_like(owner, -1)], 1).to(torch.int32)
        n_items = owner.numel()
    else:
        work = row_chunks(graph)
        if graph.outlived_a_step():  # shorter items where they are free: the grid is at its wave cap
            fine = walk_chunks(graph)
            if walk_batch(fine.n_items, lanes, fblocks, resident) > 1:
                work = fine
        items, n_items = work.items, work.n_items
    batch = walk_batch(n_items, lanes, fblocks, resident)
    walk.launch(launch.group_grid(launch.cdiv(n_items, batch), lanes, fblocks, THREADS), THREADS, items=items,
                n_items=n_items, batch=batch, indices=kc.indices, perm=kc.perm, x=x, w=w, F=F, sign=sign,
                count_zero_as_tie=int(tie_break == "split"), out=out, aux=aux, walk_all=walk_all,
                row_walks=row_walks, grad_out=grad_out, dx=dx, dw=dw)


#: Feature columns per slice of the sliced scatter: narrow enough that the slice of dx being
#: added to stays in the L2 on large graphs; wider slices gain nothing.
SCATTER_SLICE = 32
#: Hub sources (most out-edges) whose elements the sliced scatter adds into row copies, and
#: the copies per hub: in the sliced order a hub's many atomics on one row of dx would
#: contend; spread over the copies they do not. Graphs without hub sources lose nothing.
SCATTER_HUBS = 64
SCATTER_REPLICAS = 32


def scatter_order(graph, F: int, device: torch.device) -> str:
    """``"slices"`` or ``"rows"``: the thread order of the atomic scatter
    (``GNN_FASTPATH_SR_SCATTER`` forces one). Feature slices where dx is larger than the L2
    (row-major, each scattered atomic then misses it and costs a sector read and write-back
    in DRAM) and F spans at least two slices, on graphs that outlived a training step (the
    hub list is a one-time cost, see :func:`_hubs`) and are not static; row-major elsewhere."""
    forced = config.setting("GNN_FASTPATH_SR_SCATTER")
    if forced is not None:
        return forced
    if graph.static or not graph.outlived_a_step() or F < 2 * SCATTER_SLICE:
        return "rows"
    return "slices" if graph.n_src * F * 4 > launch.l2_bytes(device) else "rows"


def _hubs(graph, lookup: Tensor, key: str) -> Tuple[Tensor, Tensor]:
    """(target [len(lookup)] int32, hub_src [K] int32), once per graph and lookup table: the
    :data:`SCATTER_HUBS` sources with the most out-edges (K = at most that many) are the hubs;
    target is ``lookup`` (a source per CSR position or per caller edge) with each hub's
    source replaced by -1 - its hub number. On the device; the out-degrees are the Graph's
    (:meth:`~gnn_fastpath.graph.Graph.out_degree`, known from the build here)."""
    def build():
        dev = lookup.device
        hub_src = torch.topk(graph.out_degree(), min(SCATTER_HUBS, graph.n_src), sorted=False).indices
        number = torch.full((graph.n_src,), -1, dtype=torch.int32, device=dev)
        number[hub_src] = torch.arange(hub_src.numel(), dtype=torch.int32, device=dev)
        hub_of = number[lookup.long()]
        return torch.where(hub_of >= 0, -1 - hub_of, lookup).to(torch.int32), hub_src.to(torch.int32)

    return graph.memo(("segment_reduce", "hubs", key, SCATTER_HUBS), build)


def _scatter(graph, aux, grad_out, to, lookup, by_position, w, x, walk_all, dx, dw, order: str) -> None:
    """The atomic scatter of the single winners' gradients (``sr_bwd_arg``; ``to``: the C type
    of the output and of grad_out) in ``order`` (the plan's, :func:`scatter_order`); the
    sliced order sends the hubs' elements to row copies and adds them into dx after
    (``sr_hub_sum``)."""
    n_dst, F = aux.shape
    device = x.device
    slice_, rep, hub_src, n_hubs, replicas = 0, None, None, 0, 1
    if dx is not None and order == "slices":
        slice_ = SCATTER_SLICE
        lookup, hub_src = _hubs(graph, lookup, "position" if by_position else "caller")
        n_hubs, replicas = hub_src.numel(), SCATTER_REPLICAS
        rep = torch.zeros(replicas * n_hubs * F, dtype=torch.float32, device=device)
    total = n_dst * F if slice_ == 0 else launch.cdiv(F, slice_) * n_dst * slice_
    KERNELS.kernel(device, "sr_bwd_arg", launch.ctype(x.dtype), to).launch(
        launch.cdiv(total, ARG_THREADS), ARG_THREADS, arg=aux, grad_out=grad_out, src=lookup,
        perm=graph.kernel_csr().perm, by_position=int(by_position), w=w, x=x, total=total, n_dst=n_dst, F=F,
        slice=slice_, walk_all=walk_all, dx=dx, dw=dw, rep=rep, hub_src=hub_src, n_hubs=n_hubs, replicas=replicas)
    if n_hubs:
        KERNELS.kernel(device, "sr_hub_sum").launch(launch.cdiv(n_hubs * F, 256), 256, rep=rep, hub_src=hub_src,
                                                    n_hubs=n_hubs, replicas=replicas, F=F, dx=dx)


#: The walk's grid fills the GPU at least this many times over when every row walks
#: (training's ReLU features tie at 0 in most rows, 16-bit features often do): with fewer
#: waves the walks' uneven lengths leave the GPU idle behind the longest groups; more waves
#: launch more groups that, on the steps where little walks, only read their flags.
WALK_WAVES = 8


def walk_batch(n_items: int, lanes: int, feature_blocks: int, resident_groups: int) -> int:
    """Items per lane group of the tie walk (``sr_bwd_ties``): as many as keep
    :data:`WALK_WAVES` waves of groups when every item walks, at most one per lane. Where
    nothing walks (most steps on most graphs) the groups then only read one flag per item,
    with ``batch`` times fewer threads launched."""
    batch = n_items * feature_blocks // max(WALK_WAVES * resident_groups, 1)
    return max(1, min(lanes, batch))
