"""Launcher of the fused dot-product attention kernels (``dot_attention.cu``).

One call per pass: :func:`forward` and :func:`backward` take the Graph, pick the kernel
configuration, fetch the cached work lists, allocate outputs and launch on torch's current
stream. The autograd Function and the design note are in
:mod:`gnn_fastpath.ops.dot_attention`.

Storage types: q, k, v, edge_term and their gradients share one dtype TI (float32, float16 or
bfloat16); out and the attention weights (and so grad_out, grad_alpha) have dtype TO, TI or
float32. The kernels are instantiated for the pair (:func:`launch.ctype` names); statistics
(lse, delta), partial states and atomic accumulators are float32 whatever TI is.

Settings (:mod:`gnn_fastpath.config`, read by the plans, :func:`plan_forward` and
:func:`plan_backward`, whose keys hold them: a change takes effect at the next call):
``GNN_FASTPATH_DOT_BWD`` (``atomic`` or ``transposed`` dk/dv, or ``block``; unset: by the
graph, or timed), ``GNN_FASTPATH_DOT_FWD`` (``csr`` or ``block``; unset: by the graph, or
timed) and ``GNN_FASTPATH_VEC16``. The launchers take the plan (:mod:`gnn_fastpath.cuda.plans`).

Block-sparse tensor-core variant (:mod:`gnn_fastpath.cuda.block_attention`): for 16-bit q, k,
v without edge term or returned attention, on an eager graph that outlived a training step (its
layout is a one-time cost a sampled batch's graph would pay every step), the forward and (in
bfloat16) the backward can run on tensor cores over the graph's block-sparse layout instead.
The rule takes the block forward wherever it is offered, and the block backward where the
layout's windows share source rows (:func:`backward_mode`); the tuner times it against the CSR
kernels per size class and window sharing.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from .. import config, tuning
from . import block_attention, launch, plans, row_attention, worklist
# The family and the split-row merges, shared with block_attention (which cannot import this
# module: this one imports it).
from .dot_kernels import KERNELS, KERNELS_RNG, SOURCE, THREADS, merge_split_rows, sum_split_rows  # noqa: F401
from .dot_kernels import blocks as _blocks

#: Rows longer than this are cut into chunks of this many edges, each run by its own warp
#: and merged afterwards (super-node load balance).
CHUNK_EDGES = 256
#: Most elements of a node row one lane may hold (as floats in registers) per kernel. A lane group takes NH heads of a
#: row (NH = 1, 2, 4) within this budget, so a warp covers 32 / LPH * NH heads. NH=2 pays on
#: graphs of low mean in-degree (fewer, fuller warps), NH=1 on dense ones (more gathers in
#: flight); benchmarks/results has the measurements.
MAX_ROW_FLOATS = {"dot_fwd": 4, "dot_bwd_dst": 4, "dot_bwd_src": 4}
MAX_ROW_FLOATS_LOW_DEGREE = {"dot_fwd": 8, "dot_bwd_dst": 4, "dot_bwd_src": 4}
#: Mean in-degree below which a graph counts as low-degree for the choice above.
LOW_DEGREE = 16.0
#: Most elements one lane may hold per head (NH = 1); wider heads fall back to the reference.
MAX_FLOATS_PER_LANE = 16
#: Mean out-degree from which the source-major backward wins over atomics for float32 rows
#: (when ``GNN_FASTPATH_DOT_BWD`` is unset; 16-bit rows: see :func:`backward_mode`).
TRANSPOSED_MIN_MEAN_DEGREE = 4.0
_TEMPLATES = tuple(MAX_ROW_FLOATS)


@dataclass(frozen=True)
class Config:
    """How the kernels map a head onto lanes: VEC elements per vector access, LPH lanes per
    head, NV vectors per lane, EXACT when the head width D is exactly VEC * LPH * NV (no tail
    masking); ``nh`` maps each row kernel to its heads per lane group."""

    vec: int
    lph: int
    nv: int
    exact: bool
    nh: Tuple[Tuple[str, int], ...]

    def __post_init__(self):
        # nh as a dict, for the launches that read it on every call (not a field: eq and hash
        # stay those of the fields)
        object.__setattr__(self, "_nh", dict(self.nh))

    def heads_per_warp(self, kernel: str) -> int:
        return 32 // self.lph * self._nh[kernel]

    def args(self, kernel: str) -> tuple:
        """Template arguments of ``kernel``'s instantiation after its storage types."""
        return (self.vec, self.lph, self.nv, self._nh[kernel], self.exact)


@functools.lru_cache(maxsize=256)
def config_for(head_dim: int, vec: int, heads: int = 1, low_degree: bool = False) -> Optional[Config]:
    """The kernel variant for ``heads`` heads of width ``head_dim``; None when no variant
    serves it. ``vec``: elements per vector access, a divisor of ``head_dim`` the rows'
    alignment allows (:func:`launch.vector_width`: 4 for aligned float32, 8 for aligned
    16-bit rows, 1 for scalar accesses); ``low_degree``: the graph's mean in-degree is below
    :data:`LOW_DEGREE`."""
    if head_dim < 1 or heads < 1 or head_dim % vec:
        return None
    nvec = head_dim // vec
    lph = min(32, launch.next_pow2(nvec))
    nv = launch.cdiv(nvec, lph)
    floats = nv * vec
    if floats > MAX_FLOATS_PER_LANE:
        return None
    groups = launch.cdiv(heads, 32 // lph)  # head groups a warp would need for all heads
    budgets = MAX_ROW_FLOATS_LOW_DEGREE if low_degree else MAX_ROW_FLOATS
    nh = []
    for kernel in _TEMPLATES:
        n = 1
        while n < groups and n < 4 and 2 * n * floats <= budgets[kernel]:
            n *= 2
        nh.append((kernel, n))
    return Config(vec, lph, nv, nv * lph == nvec, tuple(nh))


def unsupported(H: int, D: int) -> Optional[str]:
    """Why the kernels cannot take heads of this shape, or None when they can."""
    if H < 1 or D < 1:
        return f"empty heads (H={H}, D={D})"
    if config_for(D, 1) is None:
        return f"head width D={D} above {MAX_FLOATS_PER_LANE * 32}"
    return None


#: The backward variants (GNN_FASTPATH_DOT_BWD): dk/dv by atomics in the destination pass, by a
#: source-major pass, or both passes on tensor cores (where :func:`block_offered`).
BACKWARDS = ("atomic", "transposed", "block")
#: The forward variants (GNN_FASTPATH_DOT_FWD): the CSR kernels, or tensor cores (where offered).
FORWARDS = ("csr", "block")


def block_offered(graph, q: Tensor, k: Tensor, v: Tensor, edge_term: Optional[Tensor], p: float, attention: bool,
                  out_dtype: Optional[torch.dtype], seed, forced: bool = False, backward: bool = False) -> bool:
    """Whether the block-sparse tensor-core kernels may run this call: inputs they take
    (:func:`block_attention.unsupported`; ``attention``: alpha is returned), an eager graph
    that outlived a training step (``forced``: whether or not) and that its layout holds
    (:func:`block_attention.usable`: with dropout, no parallel edges); dropout keyed by host
    integers (``seed``), not an rng tensor. A float16 ``backward`` takes float16 results only:
    a float32 grad_out enters its products rounded to float16, whose range (65504) a
    GradScaler-scaled gradient can exceed (bfloat16 has float32's range; de, which the
    float16 kernels scale per row, block_attention.cu's ba_scale_de)."""
    if graph.static or block_attention.unsupported(q, k, v, edge_term, attention, out_dtype) is not None:
        return False
    if backward and q.dtype == torch.float16 and out_dtype not in (None, torch.float16):
        return False
    if p > 0 and isinstance(seed, Tensor):
        return False
    if not (forced or graph.outlived_a_step()):
        return False
    return block_attention.usable(graph, p)


#: The block-sparse backward wins where windows share source rows; on a layout without sharing
#: (a large random graph) the source-major CSR pass is faster (benchmarks/RESULTS.md, tuning).
BLOCK_BACKWARD_MIN_SHARING = 1.05


def backward_mode(graph, block: bool = False, dtype: Optional[torch.dtype] = None) -> str:
    """``"atomic"``, ``"transposed"`` or ``"block"`` for ``graph`` and rows of ``dtype`` (None:
    float32) (``GNN_FASTPATH_DOT_BWD`` forces one; ``"block"`` only where ``block``,
    :func:`block_offered`).

    The rule: the block-sparse pass where offered and its layout shares source rows within
    windows (:attr:`BlockLayout.sharing` at least :data:`BLOCK_BACKWARD_MIN_SHARING`); else
    the source-major pass where sources have :data:`TRANSPOSED_MIN_MEAN_DEGREE`
    out-edges or more on average, and for 16-bit rows on every graph that outlived a training
    step: their atomic pass adds into float32 copies of dk and dv (zeroed, then cast), which
    costs more than the transpose on every benchmark graph in bfloat16, low-degree ones included
    (benchmarks/RESULTS.md, tuning). On a graph of one step (a
    sampled batch) the mean out-degree alone decides: 16-bit rows add no transpose there."""
    forced = config.setting("GNN_FASTPATH_DOT_BWD")
    if forced is not None and (forced != "block" or block):
        return forced
    if graph.static:  # compiled path: the shims pass no source-major CSR (one destination pass, atomics)
        return "atomic"
    if block and block_attention.layout(graph).sharing >= BLOCK_BACKWARD_MIN_SHARING:
        return "block"
    if dtype is not None and dtype != torch.float32 and graph.outlived_a_step():
        return "transposed"
    return "transposed" if graph.num_edges >= TRANSPOSED_MIN_MEAN_DEGREE * max(graph.n_src, 1) else "atomic"


def forward_algorithm(block: bool) -> str:
    """``"csr"`` or ``"block"`` (``GNN_FASTPATH_DOT_FWD`` forces one; ``"block"`` only where
    ``block``, :func:`block_offered`; the rule: block wherever offered, measured in
    block_attention.py)."""
    if not block:
        return "csr"
    forced = config.setting("GNN_FASTPATH_DOT_FWD")
    return forced if forced is not None else "block"


def _block_class(klass: str, graph, head_dim: int) -> str:
    """A size class of a choice the block kernels take part in: their speed depends on the window
    sharing (entries per distinct (window, column), to the nearest half) and the head width as
    much as on the sizes."""
    return f"{klass}|window sharing {round(block_attention.layout(graph).sharing * 2) / 2}|head {head_dim}"


def forward_class(graph, width: int, dtype: torch.dtype) -> str:
    """The tuner's size class of the forward (as :func:`backward_class`)."""
    return tuning.size_class("dot_attention.forward", graph.n_src, graph.n_dst, graph.num_edges, width, dtype,
                             _work(graph).n_split_items)


def backward_class(graph, width: int, dtype: torch.dtype) -> str:
    """The tuner's size class (:func:`gnn_fastpath.tuning.size_class`) of this backward on
    ``graph`` for rows of ``width`` = H * D in ``dtype``: the degree skew is the number of
    chunks the work list cut long rows into."""
    return tuning.size_class("dot_attention.backward", graph.n_src, graph.n_dst, graph.num_edges, width, dtype,
                             _work(graph).n_split_items)


def _kernel(cfg: Config, name: str, device: torch.device, *dtypes: torch.dtype,
            rng: Optional[Tensor] = None) -> launch.Kernel:
    """Kernel ``name`` for storage types ``dtypes`` (row kernels: TI, TO; helpers: their one
    type), instantiated for ``cfg`` when it is a row kernel; one small module per
    instantiation. A kernel with a dropout stream given ``rng`` (a tensor) comes from
    KERNELS_RNG."""
    types = tuple([launch.ctype(d) for d in dtypes])
    family = KERNELS if rng is None else KERNELS_RNG
    return family.kernel(device, name, *types, *(cfg.args(name) if name in _TEMPLATES else ()))


def static_geometry() -> Tuple[worklist.StaticGeometry, ...]:
    """The work lists a static graph's launches read (what the operators are handed)."""
    return (row_attention.static_work(CHUNK_EDGES),)


def _work(graph, source_major: bool = False) -> worklist.RowChunks:
    return row_attention.work(graph, CHUNK_EDGES, source_major)


def _config(graph, *tensors: Optional[Tensor]) -> Config:
    """The variant for these [*, H, D] rows: vector width from their dtypes and alignment
    (float32 alone: float4 when aligned, as before 16-bit support; 16-bit: 16-byte accesses)."""
    H, D = tensors[0].shape[1:]
    low_degree = graph.degree_stats().mean < LOW_DEGREE
    cfg = config_for(D, launch.vector_width(D, *tensors), H, low_degree)
    assert cfg is not None, "unsupported head width reached the kernels"  # unsupported() guards
    return cfg


def _forward_klass(graph, H: int, D: int, dtype: torch.dtype) -> str:
    return _block_class(forward_class(graph, H * D, dtype), graph, D)


def _backward_klass(graph, H: int, D: int, dtype: torch.dtype, block: bool) -> str:
    klass = backward_class(graph, H * D, dtype)
    return _block_class(klass, graph, D) if block else klass


#: Settings the forward's and the backward's plans read (part of their keys).
FORWARD_SETTINGS = ("GNN_FASTPATH_DOT_FWD", "GNN_FASTPATH_VEC16") + plans.TUNE_SETTINGS
BACKWARD_SETTINGS = ("GNN_FASTPATH_DOT_BWD", "GNN_FASTPATH_VEC16") + plans.TUNE_SETTINGS


def _signature(graph, q: Tensor, k: Tensor, v: Tensor, edge_term: Optional[Tensor], p: float, attention: bool,
               seed, *rows: Optional[Tensor]) -> tuple:
    """What :func:`block_offered`, the rules and the instantiation read of a call (a plan's key,
    with the settings): shapes, dtypes and alignment of the rows, dropout on or off and by
    host integers or a tensor, whether attention is returned, and the graph's changing state."""
    return (tuple(q.shape[1:]), plans.layout(q, k, v, edge_term, *rows), p > 0, bool(attention),
            isinstance(seed, Tensor), graph.static, graph.outlived_a_step())


# dtype -> an empty tensor of it (see _fresh_output)
_fresh_outputs: dict = {}


def _fresh_output(dtype: torch.dtype) -> Tensor:
    """An empty tensor standing for a forward's fresh output in its plan: its dtype, an aligned
    address (one per dtype, made once)."""
    out = _fresh_outputs.get(dtype)
    if out is None:
        out = _fresh_outputs[dtype] = torch.empty(0, dtype=dtype)
    return out


def plan_forward(graph, q: Tensor, k: Tensor, v: Tensor, edge_term: Optional[Tensor], p: float, return_attention,
                 out_dtype: Optional[torch.dtype], seed) -> plans.Plan:
    """The forward's plan: ``"block"`` or ``"csr"`` (``GNN_FASTPATH_DOT_FWD``, or
    :func:`forward_algorithm` of :func:`block_offered`; with ``GNN_FASTPATH_TUNE=1`` and the
    block kernels offered, a pending tuner choice between :data:`FORWARDS`), ``block`` (whether
    offered) and the CSR kernels' instantiation ``cfg``."""
    out = _fresh_output(out_dtype or q.dtype)
    attention = bool(return_attention)
    key = (_signature(graph, q, k, v, edge_term, p, attention, seed, out), plans.snapshot(*FORWARD_SETTINGS))

    def build():
        forced = config.setting("GNN_FASTPATH_DOT_FWD")
        block = forced != "csr" and block_offered(graph, q, k, v, edge_term, p, attention, out_dtype, seed,
                                                  forced == "block")
        algorithm = forward_algorithm(block)
        tune = None
        if block and forced is None and tuning.enabled():
            H, D = q.shape[1:]
            tune = plans.Tune(("dot_attention.forward", H, D, q.dtype), FORWARDS, _forward_klass, (H, D, q.dtype))
        return plans.Plan("dot_attention.forward", algorithm, "setting" if forced is not None else "rule",
                          rule=algorithm, params=(("block", block), ("cfg", _config(graph, q, k, v, edge_term, out))),
                          tune=tune)

    return plans.resolve(graph, "dot_attention.forward", key, build)


def plan_backward(graph, q: Tensor, k: Tensor, v: Tensor, edge_term: Optional[Tensor], out: Tensor,
                  grad_out: Tensor, attention: bool, p: float, seed) -> plans.Plan:
    """The backward's plan: ``GNN_FASTPATH_DOT_BWD``, else :func:`backward_mode` (``"block"``
    where :func:`block_offered`), and with ``GNN_FASTPATH_TUNE=1`` on an eager graph a pending
    tuner choice on a graph that outlived a training step (the block variant among the
    candidates where offered); ``block`` and the CSR
    kernels' instantiation ``cfg``. ``attention``: the call returned attention (or takes its
    gradient)."""
    key = (_signature(graph, q, k, v, edge_term, p, attention, seed, out, grad_out),
           plans.snapshot(*BACKWARD_SETTINGS))

    def build():
        forced = config.setting("GNN_FASTPATH_DOT_BWD")
        block = forced in (None, "block") and block_offered(graph, q, k, v, edge_term, p, attention, out.dtype,
                                                             seed, forced == "block", backward=True)
        mode = backward_mode(graph, block, q.dtype)
        tune = None
        # tuned on graphs used again only (as the rule: :func:`backward_mode`): a race could
        # pick the transposed pass on a graph of one step (a sampled batch), whose transpose and
        # source work list cost more host time than its kernels save
        if forced is None and not graph.static and tuning.enabled() and graph.outlived_a_step():
            H, D = q.shape[1:]
            tune = plans.Tune(("dot_attention.backward", H, D, q.dtype, block),
                              BACKWARDS if block else BACKWARDS[:2], _backward_klass, (H, D, q.dtype, block))
        decided = "setting" if forced is not None and (forced != "block" or block) else "rule"
        return plans.Plan("dot_attention.backward", mode, decided, rule=mode,
                          params=(("block", block), ("cfg", _config(graph, q, k, v, edge_term, out, grad_out))),
                          tune=tune)

    return plans.resolve(graph, "dot_attention.backward", key, build)


def forward(graph, q: Tensor, k: Tensor, v: Tensor, edge_term: Optional[Tensor], scale: float, p: float,
            seed: Union[int, Tensor], offset: Optional[int], return_attention,
            out_dtype: Optional[torch.dtype] = None,
            algorithm: Optional[str] = None) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Fused forward. Returns ``(out [N_dst, H, D], lse [N_dst, H] float32, alpha)``; out and
    ``alpha`` in ``out_dtype`` (default q's dtype); ``alpha`` [M, H] in caller order (softmax
    weights, or after dropout for ``"dropped"``) only when ``return_attention``, else None.
    The dropout stream: ints ``seed, offset``, or an int64 tensor [2] on q's GPU as ``seed``
    with ``offset`` None (read by the kernels: CUDA-graph safe; :func:`row_attention.philox_stream`).
    ``algorithm``: ``"csr"`` or ``"block"`` (None: the plan's, :func:`plan_forward`: the
    setting, :func:`forward_algorithm`, or with ``GNN_FASTPATH_TUNE=1`` the variant measured
    fastest)."""
    graph.note_pass("forward")
    plan = plan_forward(graph, q, k, v, edge_term, p, return_attention, out_dtype, seed)
    if algorithm is not None:
        plan = plan.pick(algorithm, "caller")
    else:
        def run(variant):
            return forward(graph, q, k, v, edge_term, scale, p, seed, offset, return_attention, out_dtype, variant)

        plan = plans.run(graph, plan, q.device, run)
    algorithm = plan.variant
    if algorithm == "block":
        out, lse = block_attention.forward(graph, q, k, v, scale, out_dtype, p, seed, offset)
        return out, lse, None
    device = q.device
    rng, seed, offset = row_attention.philox_stream(seed, offset, device)
    n_dst, H, D = q.shape
    ti, to = q.dtype, out_dtype or q.dtype
    f32 = dict(dtype=torch.float32, device=device)
    out = torch.empty((n_dst, H, D), dtype=to, device=device)
    lse = torch.empty((n_dst, H), **f32)
    alpha = torch.empty((graph.num_edges, H), dtype=to, device=device) if return_attention else None
    if n_dst == 0:
        return out, lse, alpha
    # raw logits: in place in a float32 alpha, else their own float32 buffer (never rounded)
    logits = None if alpha is None else alpha if to == torch.float32 else torch.empty((graph.num_edges, H), **f32)
    kc = graph.kernel_csr()
    work = _work(graph)
    row_attention.zero_skipped(work, alpha)
    cfg = plan.cfg
    part_acc = torch.empty((work.n_slots, H, D), **f32) if work.n_slots else None
    part_ml = torch.empty((work.n_slots, H, 2), **f32) if work.n_slots else None
    head_blocks = launch.cdiv(H, cfg.heads_per_warp("dot_fwd"))
    n_work = work.n_items * head_blocks
    _kernel(cfg, "dot_fwd", device, ti, to, rng=rng).launch(
        _blocks(n_work * 32), THREADS, indices=kc.indices, perm=kc.perm, items=work.items, n_work=n_work,
        head_blocks=head_blocks, q=q, k=k, v=v, edge_term=edge_term, out=out, lse=lse, part_acc=part_acc,
        part_ml=part_ml, logits=logits, H=H, D_rt=D, scale=scale, p=p, seed=seed, offset=offset, rng=rng)
    merge_split_rows(work.split, work.n_split, part_acc, part_ml, out, lse)
    if return_attention and alpha.numel():
        _kernel(cfg, "dot_alpha_from_logits", device, to, rng=rng).launch(
            _blocks(work.n_items * 32), THREADS, perm=kc.perm, items=work.items, n_items=work.n_items, lse=lse,
            logits=logits, alpha=alpha, H=H, dropped=int(return_attention == "dropped"), p=p, seed=seed,
            offset=offset, rng=rng)
    return out, lse, alpha


def backward(graph, q: Tensor, k: Tensor, v: Tensor, edge_term: Optional[Tensor], out: Tensor, lse: Tensor,
             grad_out: Tensor, alpha: Optional[Tensor], grad_alpha: Optional[Tensor], alpha_dropped: bool,
             scale: float, p: float, seed: Union[int, Tensor], offset: Optional[int], need_d_edge_term: bool,
             mode: Optional[str] = None):
    """Gradients ``(dq, dk, dv, d_edge_term)`` in q's dtype (d_edge_term None unless
    ``need_d_edge_term``). ``mode``: ``"atomic"``, ``"transposed"`` or ``"block"`` (None: the
    plan's, :func:`plan_backward`: the setting, :func:`backward_mode`, or with
    ``GNN_FASTPATH_TUNE=1`` the variant measured fastest for this size class).

    ``grad_out`` [N_dst, H, D] (and ``grad_alpha``, the gradient of the returned attention
    ``alpha``, None when there is none) have out's dtype. dk, dv come from atomics in the
    destination pass or from a source-major pass (:func:`backward_mode`); the atomics add
    into float32 (for 16-bit q: zeroed float32 buffers cast once at the end). The dropout
    stream as the forward's.
    """
    graph.note_pass("backward")
    device = q.device
    given_stream = (seed, offset)  # as given: the timed runs of a tuned choice take the same stream
    plan = plan_backward(graph, q, k, v, edge_term, out, grad_out, alpha is not None or grad_alpha is not None, p,
                         seed)
    if mode is not None:
        plan = plan.pick(mode, "caller")
    else:
        def run(variant):
            return backward(graph, q, k, v, edge_term, out, lse, grad_out, alpha, grad_alpha, alpha_dropped,
                            scale, p, *given_stream, need_d_edge_term, variant)

        plan = plans.run(graph, plan, device, run)
    mode = plan.variant
    if graph.static:
        mode = row_attention.backward_variant(mode, _work(graph))
    if mode == "block":
        dq, dk, dv = block_attention.backward(graph, q, k, v, out, lse, grad_out, scale, p, seed, offset)
        return dq, dk, dv, None
    rng, seed, offset = row_attention.philox_stream(seed, offset, device)
    n_dst, H, D = q.shape
    ti, to = q.dtype, out.dtype
    f32 = dict(dtype=torch.float32, device=device)
    kc = graph.kernel_csr()
    work = _work(graph)
    cfg = plan.cfg
    transposed = mode == "transposed"
    dq = torch.empty_like(q)
    if transposed:
        dk, dv = torch.empty_like(k), torch.empty_like(v)
    else:  # atomic targets: float32 (the gradients themselves for float32 inputs)
        dk, dv = torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)
    d_edge_term = torch.empty_like(edge_term) if (need_d_edge_term and edge_term is not None) else None
    row_attention.zero_skipped(work, d_edge_term)
    delta = torch.empty((n_dst, H), **f32) if transposed else None
    delta_alpha = None
    if grad_alpha is not None:
        delta_alpha = torch.zeros((n_dst, H), **f32)
        if alpha.numel():
            _kernel(cfg, "dot_delta_alpha", device, to).launch(
                _blocks(work.n_items * 32), THREADS, perm=kc.perm, items=work.items, n_items=work.n_items,
                alpha=alpha, grad_alpha=grad_alpha, delta_alpha=delta_alpha, H=H)
    if n_dst:
        head_blocks = launch.cdiv(H, cfg.heads_per_warp("dot_bwd_dst"))
        part_dq = torch.empty((work.n_slots, H, D), **f32) if work.n_slots else None
        n_work = work.n_items * head_blocks
        _kernel(cfg, "dot_bwd_dst", device, ti, to, rng=rng).launch(
            _blocks(n_work * 32), THREADS, indices=kc.indices, perm=kc.perm, items=work.items, n_work=n_work,
            head_blocks=head_blocks, q=q, k=k, v=v, edge_term=edge_term, out=out, grad_out=grad_out, lse=lse,
            grad_alpha=grad_alpha, delta_alpha=delta_alpha, grad_alpha_dropped=int(alpha_dropped), dq=dq,
            part_dq=part_dq, dk=None if transposed else dk, dv=None if transposed else dv,
            d_edge_term=d_edge_term, delta_out=delta, H=H, D_rt=D, scale=scale, p=p, seed=seed, offset=offset,
            rng=rng)
        if part_dq is not None:
            sum_split_rows(work.split, work.n_split, part_dq, dq)
    if transposed and k.shape[0]:
        scsr = graph.kernel_source_csr()
        swork = _work(graph, source_major=True)
        part_dk = torch.empty((swork.n_slots, H, D), **f32) if swork.n_slots else None
        part_dv = torch.empty((swork.n_slots, H, D), **f32) if swork.n_slots else None
        head_blocks = launch.cdiv(H, cfg.heads_per_warp("dot_bwd_src"))
        n_work = swork.n_items * head_blocks
        _kernel(cfg, "dot_bwd_src", device, ti, to, rng=rng).launch(
            _blocks(n_work * 32), THREADS, s_indices=scsr.indices, s_perm=scsr.perm, items=swork.items,
            n_work=n_work, head_blocks=head_blocks, q=q, k=k, v=v, edge_term=edge_term, grad_out=grad_out,
            lse=lse, delta=delta, grad_alpha=grad_alpha, grad_alpha_dropped=int(alpha_dropped), dk=dk, dv=dv,
            part_dk=part_dk, part_dv=part_dv, H=H, D_rt=D, scale=scale, p=p, seed=seed, offset=offset,
            rng=rng)
        if part_dk is not None:
            sum_split_rows(swork.split, swork.n_split, part_dk, dk)
            sum_split_rows(swork.split, swork.n_split, part_dv, dv)
    if not transposed and ti != torch.float32:
        dk, dv = dk.to(ti), dv.to(ti)  # the one rounding of the float32 sums
    return dq, dk, dv, d_edge_term
