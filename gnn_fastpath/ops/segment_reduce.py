"""Min/max neighbourhood aggregation: the public op and its autograd Function.

Layer -> op -> kernel: PyG ``SAGEConv(aggr="max"/"min")`` and DGL ``SAGEConv("pool")`` call
:func:`segment_reduce`; its CUDA path is :class:`SegmentReduceFunction`, one call per pass
into the launcher :mod:`gnn_fastpath.cuda.segment_reduce` (through :func:`_forward`/
:func:`_backward`), whose kernels are ``cuda/segment_reduce.cu``; under ``torch.compile`` the
same Function calls the operators ``torch.ops.gnn_fastpath.segment_reduce``/
``segment_reduce_backward`` (:mod:`.library`), whose implementations call the same two
functions; the reference is :func:`gnn_fastpath.reference.segment_reduce`.

What the forward saves: one int32 per output element, the winning edge (its caller id for
``"first"``/``"last"``, its CSR position for ``"split"``/``"even"``), which the backward
scatters the gradient along. ``"first"``/``"last"`` always have one; for
``"split"``/``"even"`` an element reached by several tied edges (or whose extreme is NaN)
saves ``-1 - n`` instead (``"split"`` also for a single winner at exactly 0, which torch's
rule halves), and only the rows holding such an element (one flag per row) are
re-walked in the backward to find the tied edges; one more flag, set when a weighted
message is ``-inf``, re-walks every row (torch's split rule sends a losing edge
``0 * inf = NaN`` through the product ``w * x``).
Nothing is saved when no input needs a gradient. For ``"split"``/``"even"`` the single
winners' gradients are scattered by atomics, or source-major without atomics (each source sums
the elements its out-edges won; ``GNN_FASTPATH_SR_BWD``, the tuner, or the rule on graphs
that outlived a training step and whose sources average at most 3 out-edges).

Dtypes (the reduced-precision contract): ``x`` float32, float16 or bfloat16 is read as it is;
the result has ``promote_types(x.dtype, edge_weight.dtype)`` (x's dtype without weights),
which is what ``w * x`` in torch gives; weights are read as float32 whatever their dtype.
Max/min only compare, so the 16-bit path is exact: each message is the float32 product
rounded once to the result dtype (torch's ``w * x`` in that dtype) and the extreme is one of
them. The gradients come back in the dtype of x and of the weights; the backward adds them
with float32 atomics into float32 scratch buffers cast once at the end, because adding into
16-bit memory would round at every atomic (and packed bf16x2 atomics would too).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .. import reference
from ..graph import GraphTensors
from ..cuda import segment_reduce as kernels
from ..reference._precision import product_dtype
from ._checks import as_rows, check_choice, check_features, check_graph, fresh_rows, graph_on, row_width
from . import library
from .dispatch import CUDA, CUDA_DTYPES, choose

REDUCES = ("max", "min")
TIE_BREAKS = reference.aggregation.TIE_BREAKS
NON_FINITE = reference.aggregation.NON_FINITE


def segment_reduce(graph, x: Tensor, reduce: str = "max", edge_weight: Optional[Tensor] = None,
                   tie_break: str = "split", non_finite: str = "keep") -> Tensor:
    r"""Element-wise max or min of source features over each destination's in-edges.

    .. math::
        o_{i,f} = \max_{j \in \mathcal{N}(i)} w_{ij}\, x_{j,f} \quad (\text{or } \min)

    Destinations with no in-edges get 0. The value never depends on ``tie_break``; the
    gradient of an extreme reached by several edges (ties: common after a ReLU, where many
    messages are exactly 0) does, and each framework does it its own way:

    - ``"split"`` (default, PyG): what ``torch.scatter_reduce(..., include_self=False)`` on a
      zero tensor does, which is PyG's ``MaxAggregation``/``SAGEConv(aggr="max")`` on a plain
      ``edge_index`` without torch-scatter: each tied edge gets ``g / (n + [o == 0])``, with
      ``n`` the number of tied edges. The ``[o == 0]`` term is torch's: the untouched zero of
      the output counts as one more tied candidate whenever the extreme is exactly 0.
    - ``"even"``: ``g / n`` to each tied edge (no framework does exactly this; offered as the
      plain rule).
    - ``"first"`` / ``"last"``: the whole ``g`` to one tied edge, the first / last in the
      caller's edge order. DGL 2.1 (CPU) ``update_all(fn.copy_u, fn.max)`` and
      ``fn.u_mul_e`` with per-feature edge data give it to the last; ``fn.u_mul_e`` with a
      broadcast ``[M]``/``[M, 1]`` edge weight (``SAGEConv('pool')`` with ``edge_weight``)
      to the first.

    NaN and infinity, also each framework's own way (``non_finite``):

    - ``"keep"`` (default, torch and PyG): a NaN message makes the extreme NaN; infinities are
      values like any other. With ``tie_break="split"`` every edge of a NaN extreme gets a NaN
      gradient, and a losing edge still gets torch's zero times the other factor: its weight
      gradient is NaN where its x is not finite, its x gradient NaN where its weight is not
      (torch's rule, 0 * inf); with the other rules a NaN extreme sends no gradient and
      losing edges send none.
    - ``"drop"`` (DGL 2.1 ``fn.max``/``fn.min``): NaN messages never win; an extreme that is
      not finite (all messages NaN, or an infinite one winning) is written as 0 and sends no
      gradient. Goes with ``tie_break="first"`` or ``"last"``.

    Args:
        graph (Graph): the graph.
        x (Tensor): [N_src, F] (or [N_src, *]) source features.
        reduce (str): ``"max"`` or ``"min"``.
        edge_weight (Tensor, optional): [M] per-edge multiplier in the caller's edge order,
            any floating dtype (may differ from ``x``'s: a float32 parameter with bf16
            features under autocast).
        tie_break (str): ``"split"``, ``"even"``, ``"first"`` or ``"last"`` (see above).
        non_finite (str): ``"keep"`` or ``"drop"`` (see above).

    Returns:
        [N_dst, F] (same trailing shape as ``x``), dtype ``promote_types(x.dtype,
        edge_weight.dtype)`` (``x.dtype`` without weights).
    """
    graph = check_graph(graph)
    check_features(graph, x, edge_weight)
    check_choice("reduce", reduce, REDUCES)
    check_choice("tie_break", tie_break, TIE_BREAKS)
    check_choice("non_finite", non_finite, NON_FINITE)
    if non_finite == "drop" and tie_break not in ("first", "last"):
        raise ValueError(f"non_finite='drop' (DGL's rule) goes with tie_break 'first' or 'last'; got {tie_break!r}")
    graph = graph_on(graph, x)
    if isinstance(graph, GraphTensors):
        # its backward follows the saved arg indices: no source-major CSR
        graph = graph.destination_major().with_geometry(kernels.static_geometry(non_finite))
        return graph.unpad(SegmentReduceFunction.apply(x, edge_weight, graph, reduce, tie_break, non_finite))
    out_dtype = product_dtype(x, edge_weight)
    # a result the kernels cannot store (float64 from a float64 weight) runs the reference
    if choose("segment_reduce", x.device, x.dtype if out_dtype in CUDA_DTYPES else out_dtype, graph) == CUDA:
        return SegmentReduceFunction.apply(x, edge_weight, graph, reduce, tie_break, non_finite)
    return reference.segment_reduce(graph, x, reduce, edge_weight, tie_break, non_finite)


def weight_fp32(edge_weight: Optional[Tensor]) -> Optional[Tensor]:
    """The weights as the kernels read them: detached, contiguous float32 (a copy only when
    the dtype differs)."""
    return None if edge_weight is None else edge_weight.detach().to(torch.float32).contiguous()


class SegmentReduceFunction(torch.autograd.Function):
    """Fused min/max aggregation; ``apply(x, edge_weight, graph, reduce, tie_break, non_finite)``.

    The result has :func:`~gnn_fastpath.reference._precision.product_dtype`; dx comes back in x's dtype, dw in the weight's.
    The one autograd route, eager and compiled: on a Graph it calls
    :func:`_forward`/:func:`_backward`, on a GraphTensors the operators (which call them).
    """

    @staticmethod
    def forward(ctx, x: Tensor, edge_weight: Optional[Tensor], graph, reduce: str, tie_break: str,
                non_finite: str = "keep"):
        x = x.contiguous()  # saved as the kernels read it
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        if isinstance(graph, GraphTensors):
            result, state = library.op("segment_reduce")(*graph.operands, x, edge_weight, reduce, tie_break,
                                                         non_finite, need_grad)
        else:
            result, state = _forward(graph, x, edge_weight, reduce, tie_break, non_finite, need_grad)
        if need_grad:
            ctx.reduce, ctx.tie_break, ctx.non_finite = reduce, tie_break, non_finite
            library.save(ctx, graph, x, edge_weight, result, state)
        return result

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        graph, (x, edge_weight, result, state) = library.saved(ctx)
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        args = (x, edge_weight, result, state, grad_out.contiguous(), ctx.reduce, ctx.tie_break, ctx.non_finite,
                need_x, need_w)
        if ctx.on_operators:
            dx, dw = library.present(library.op("segment_reduce_backward")(*graph.operands, *args), (need_x, need_w))
        else:
            dx, dw = _backward(graph, *args)
        return dx, dw, None, None, None, None


def _forward(graph, x, edge_weight, reduce, tie_break, non_finite, need_grad, use_reference=False):
    """(result, the kernels' arg state or None) on ``graph``: the launcher, with x as rows and
    the weights as float32; ``use_reference``: the reference op instead (the CPU operator; no
    state, its backward recomputes)."""
    if use_reference:
        with torch.no_grad():  # an operator's output records no autograd
            return reference.segment_reduce(graph, x, reduce, edge_weight, tie_break, non_finite), None
    x2 = as_rows(x, graph.n_src)
    result, result2 = fresh_rows(graph.n_dst, x, product_dtype(x, edge_weight))
    state = kernels.forward(graph, x2, weight_fp32(edge_weight), _sign(reduce), tie_break, non_finite, need_grad,
                            result2)
    return result, state if need_grad else None


def _backward(graph, x, edge_weight, result, state, grad_out, reduce, tie_break, non_finite, need_x, need_w,
              use_reference=False):
    """(dx in x's dtype or None, dw in the weight's dtype or None). ``use_reference``: by
    autograd through the reference op."""
    if use_reference:
        def run(x_, w):
            return (reference.segment_reduce(graph, x_, reduce, w, tie_break, non_finite),)

        return library.reference_grads(run, (x, edge_weight), (need_x, need_w), (grad_out,))
    width = row_width(x)
    x2 = x.reshape(graph.n_src, width).contiguous()
    g = grad_out.reshape(graph.n_dst, width).to(result.dtype).contiguous()
    dx, dw = kernels.backward(graph, x2, weight_fp32(edge_weight), _sign(reduce), tie_break,
                              result.view(graph.n_dst, width), state, g, need_x, need_w)
    return (None if dx is None else dx.view(x.shape), None if dw is None else dw.to(edge_weight.dtype))


def _sign(reduce: str) -> float:
    """min runs as max of the negated messages."""
    return 1.0 if reduce == "max" else -1.0


library.implement("segment_reduce", _forward, _backward)
