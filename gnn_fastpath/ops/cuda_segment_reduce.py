"""CUDA backend of :func:`gnn_fastpath.ops.segment_reduce` (min/max aggregation).

Forward is degree-aware (``segment_reduce.cu``): light destinations get a group of lanes
each (threads over features, 16-byte loads when F % 4 == 0), heavy ones (in-degree at least
:data:`HEAVY_MIN_DEGREE`) are cut into work items of :data:`HEAVY_CHUNK` edges merged with
64-bit atomics. The bucket lists and work items are built once per graph
(``graph.memo``; building them synchronises with the host once); calls never do.

What forward saves depends on the tie rule: ``"first"``/``"last"`` save the winning caller
edge id per output element (int32 [N_dst, F]); ``"split"``/``"even"`` save the number of tied
edges per output element (int32 [N_dst, F]) and backward re-walks the edges to find them.
Nothing is saved when no input needs a gradient.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..cuda import segment_reduce as sr
from ..graph import Graph

#: Destinations with at least this many in-edges are heavy, whatever the degree quantiles
#: say (``graph.buckets(quantile=0, min_heavy_degree=HEAVY_MIN_DEGREE)``): a group walks its
#: row's edges one after another, so the row length, not its rank, is what must be bounded.
HEAVY_MIN_DEGREE = 128
#: Edges per heavy work item.
HEAVY_CHUNK = 64
MODES = {"split": sr.MODE_COUNT, "even": sr.MODE_COUNT, "first": sr.MODE_FIRST, "last": sr.MODE_LAST}
#: What was built, by kind (tests check reuse).
build_counts: Counter = Counter()


class ReduceWork:
    """Per-graph launch data: int32 CSR, light/heavy destination lists, heavy work items."""

    def __init__(self, graph: Graph):
        kc = graph.kernel_csr()
        self.indptr, self.indices, self.perm = kc.indptr, kc.indices, kc.perm
        self.n_src, self.n_dst, self.num_edges = graph.n_src, graph.n_dst, graph.num_edges
        buckets = graph.buckets(quantile=0.0, min_heavy_degree=HEAVY_MIN_DEGREE)
        self.heavy_threshold = buckets.threshold
        heavy = buckets.heavy
        if heavy.numel() == 0:
            self.light_rows = self.heavy_rows = self.heavy_items = None
        else:
            self.light_rows = buckets.light.to(torch.int32)
            self.heavy_rows = heavy.to(torch.int32)
            starts, ends = graph.indptr[heavy], graph.indptr[heavy + 1]
            chunks = (ends - starts + HEAVY_CHUNK - 1) // HEAVY_CHUNK
            total = int(chunks.sum())  # the one host sync, at build time
            slot = torch.repeat_interleave(torch.arange(heavy.numel(), device=heavy.device), chunks,
                                           output_size=total)
            first = torch.cumsum(chunks, 0) - chunks
            j = torch.arange(total, device=heavy.device) - first[slot]
            start = starts[slot] + j * HEAVY_CHUNK
            end = torch.minimum(start + HEAVY_CHUNK, ends[slot])
            # chunk-major order: items running together belong to different rows, so their
            # atomics rarely meet on one address
            order = torch.sort(j * heavy.numel() + slot).indices
            self.heavy_items = torch.stack([slot, start, end], 1)[order].to(torch.int32).contiguous()
        # backward segments (row, start, end): every nonempty light row whole, heavy rows in items
        deg = graph.in_degree()
        light = buckets.light
        light = light[deg[light] > 0]
        segs = [torch.stack([light, graph.indptr[light], graph.indptr[light + 1]], 1)]
        if self.heavy_items is not None:
            items = self.heavy_items.long()
            segs.append(torch.stack([heavy[items[:, 0]], items[:, 1], items[:, 2]], 1))
        self.segments = torch.cat(segs).to(torch.int32).contiguous()
        self._src_of: Optional[Tensor] = None
        build_counts["work"] += 1

    def src_of(self) -> Tensor:
        """int32 [M]: the source id of each caller edge."""
        if self._src_of is None:
            src = torch.empty_like(self.indices)
            src[self.perm.long()] = self.indices
            self._src_of = src
            build_counts["src_of"] += 1
        return self._src_of


def reduce_work(graph: Graph) -> ReduceWork:
    return graph.memo(("gnn_fastpath.segment_reduce", HEAVY_MIN_DEGREE, HEAVY_CHUNK), lambda: ReduceWork(graph))


def _width(t: Tensor) -> int:
    """Features per node: the product of the trailing dimensions."""
    n = 1
    for d in t.shape[1:]:
        n *= d
    return n


class _SegmentReduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, edge_weight: Optional[Tensor], graph: Graph, reduce: str, tie_break: str):
        work = reduce_work(graph)
        x2 = x.reshape(graph.n_src, _width(x))
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        w = None if edge_weight is None else edge_weight.detach().contiguous()
        sign = 1.0 if reduce == "max" else -1.0
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        mode = MODES[tie_break]  # without need_grad the kernels compute the value only
        # allocated in its final shape so the op returns a fresh tensor, not a view
        result = torch.empty((graph.n_dst,) + tuple(x.shape[1:]), dtype=x2.dtype, device=x2.device)
        out, aux = sr.forward(work.indptr, work.indices, work.perm, x2, w, graph.n_dst, work.light_rows,
                              work.heavy_rows, work.heavy_items, sign, mode, need_grad,
                              out=result.view(graph.n_dst, x2.size(1)))
        if need_grad:
            ctx.work, ctx.graph, ctx.sign, ctx.mode, ctx.x_shape = work, graph, sign, mode, x.shape
            ctx.quirk = tie_break == "split"
            ctx.save_for_backward(x2, w, result, aux)
        return result

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        work = ctx.work
        x2, w, result, aux = ctx.saved_tensors
        out = result.view(work.n_dst, x2.size(1))
        dy = grad_out.reshape(work.n_dst, x2.size(1))
        if not dy.is_contiguous():
            dy = dy.contiguous()
        dx = torch.zeros_like(x2) if ctx.needs_input_grad[0] else None
        dw = torch.zeros(work.num_edges, dtype=x2.dtype, device=x2.device) if ctx.needs_input_grad[1] else None
        if ctx.mode == sr.MODE_COUNT:
            sr.backward_split(work.segments, work.indices, work.perm, x2, w, ctx.sign, ctx.quirk, out, aux, dy, dx,
                              dw)
        else:
            sr.backward_arg(aux, dy, work.src_of(), w, x2, dx, dw)
        if dx is not None:
            dx = dx.view(ctx.x_shape)
        return dx, dw, None, None, None


def segment_reduce_cuda(graph: Graph, x: Tensor, reduce: str = "max", edge_weight: Optional[Tensor] = None,
                        tie_break: str = "split") -> Tensor:
    """CUDA ``segment_reduce`` (arguments already checked by the public op)."""
    return _SegmentReduceFunction.apply(x, edge_weight, graph, reduce, tie_break)
