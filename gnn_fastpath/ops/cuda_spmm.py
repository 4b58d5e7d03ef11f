"""CUDA backend of :func:`gnn_fastpath.ops.spmm`: cuSPARSE SpMM with everything graph-specific
cached on the Graph.

Per Graph (``graph.memo``, so it all dies with the graph; a Graph is per device):

- the cuSPARSE CSR descriptor of the forward matrix A [n_dst, n_src] (int32 indices from
  ``graph.kernel_csr()``), its chosen algorithm per feature width (cuSPARSE's CSR
  algorithms or this package's own CSR kernel, whichever timed fastest) and its workspaces
  (see :mod:`gnn_fastpath.cuda.cusparse_spmm`);
- the normalised edge values, ``values_k = c_dst[row] * w[perm[k]] * c_src[col]`` in CSR
  order (``edge_norm.cu``): one fp32 [M] per norm without edge weights; with edge weights,
  per weight tensor, keyed by (tensor identity through a weak reference, ``_version``,
  ``data_ptr``) and bounded to :data:`WEIGHTED_ENTRIES` tensors per norm (a training loop
  that builds a new weight tensor every step keeps only the newest). In-place writes
  through ``tensor.data`` do not bump ``_version`` and are not noticed: write weights in
  place under ``torch.no_grad()`` instead (what optimizers do);
- for backward, with ``GNN_FASTPATH_SPMM_BWD=transposed`` (default): the transposed CSR
  A^T [n_src, n_dst] (``graph.source_csr()`` gives the structure; ``csr_pos`` permutes the
  values), i.e. per graph one int32 indptr [n_src+1] + int32 indices [M] + int32 csr_pos [M]
  (8 bytes per edge + 4 per source node, on top of the int64 ``source_csr`` the Graph
  itself caches, 24 bytes per edge) plus one fp32 [M] of transposed values per cached
  values entry; dX = A^T dY is then a plain non-transposed SpMM. With
  ``GNN_FASTPATH_SPMM_BWD=flag``: nothing extra; cuSPARSE runs
  ``CUSPARSE_OPERATION_TRANSPOSE`` on the forward matrix.

The gradient w.r.t. the edge weights is the SDDMM
``dw_e = c_dst[row] c_src[col] <dY[row], X[col]>`` (``gf_spmm_edge_grad``), in caller order.
Only the gradients autograd asks for are computed.
"""
from __future__ import annotations

import os
import weakref
from collections import Counter, OrderedDict
from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..cuda import edge_norm
from ..cuda.cusparse_spmm import CsrMatrix
from ..graph import Graph

#: (source scale, destination scale) codes per norm (edge_norm.SCALE_*).
SCALES = {"none": (0, 0), "left": (1, 0), "right": (0, 1), "both": (2, 2)}
#: Edge-weight tensors whose values stay cached per (graph, norm).
WEIGHTED_ENTRIES = 2
BWD_ENV = "GNN_FASTPATH_SPMM_BWD"
BWD_MODES = ("transposed", "flag")
#: What was built, by kind (tests check that cached state is reused, not rebuilt).
build_counts: Counter = Counter()
_MEMO_KEY = "gnn_fastpath.cuda_spmm"


def backward_mode() -> str:
    mode = os.environ.get(BWD_ENV, "transposed").strip().lower() or "transposed"
    if mode not in BWD_MODES:
        raise ValueError(f"{BWD_ENV} must be one of {', '.join(BWD_MODES)}; got {mode!r}")
    return mode


def _width(t: Tensor) -> int:
    """Features per node: the product of the trailing dimensions."""
    n = 1
    for d in t.shape[1:]:
        n *= d
    return n


class _Values:
    """Normalised edge values of one (norm, weight) and, lazily, their transposed order."""

    def __init__(self, values: Tensor, ref=None):
        self.values = values
        self.ref = ref
        self._transposed: Optional[Tensor] = None

    def transposed(self, cache: "SpmmCache") -> Tensor:
        if self._transposed is None:
            _, pos = cache.transposed()
            self._transposed = self.values.index_select(0, pos)
            build_counts["values_t"] += 1
        return self._transposed


class SpmmCache:
    """Everything SpMM keeps for one Graph (see the module docstring)."""

    def __init__(self, graph: Graph):
        kc = graph.kernel_csr()
        self._graph = weakref.ref(graph)
        self.indptr, self.indices, self.perm = kc.indptr, kc.indices, kc.perm
        self.n_src, self.n_dst = graph.n_src, graph.n_dst
        self.csr = CsrMatrix(kc.indptr, kc.indices, graph.n_dst, graph.n_src)
        self._out_degree: Optional[Tensor] = None
        self._csr_t = None
        self._unweighted = {}
        self._weighted = {}
        build_counts["csr"] += 1

    def out_degree(self) -> Tensor:
        if self._out_degree is None:
            self._out_degree = self._graph().out_degree().to(torch.int32)
        return self._out_degree

    def values(self, norm: str, edge_weight: Optional[Tensor]) -> _Values:
        src_mode, dst_mode = SCALES[norm]
        if edge_weight is None:
            entry = self._unweighted.get(norm)
            if entry is None:
                out_deg = self.out_degree() if src_mode else None
                entry = _Values(edge_norm.spmm_edge_values(self.indptr, self.indices, self.perm, out_deg, None,
                                                           src_mode, dst_mode))
                self._unweighted[norm] = entry
                build_counts["values"] += 1
            return entry
        lru = self._weighted.setdefault(norm, OrderedDict())
        key = (id(edge_weight), edge_weight._version, edge_weight.data_ptr())
        entry = lru.get(key)
        if entry is not None and entry.ref() is edge_weight:
            lru.move_to_end(key)
            return entry
        out_deg = self.out_degree() if src_mode else None
        w = edge_weight.detach().contiguous()
        entry = _Values(edge_norm.spmm_edge_values(self.indptr, self.indices, self.perm, out_deg, w, src_mode,
                                                   dst_mode), weakref.ref(edge_weight))
        lru[key] = entry
        lru.move_to_end(key)
        while len(lru) > WEIGHTED_ENTRIES:
            lru.popitem(last=False)
        build_counts["values_weighted"] += 1
        return entry

    def transposed(self):
        """(CsrMatrix of A^T, int32 csr_pos) built once per graph."""
        if self._csr_t is None:
            sc = self._graph().source_csr()
            indptr_t = sc.indptr.to(torch.int32)
            indices_t = sc.indices.to(torch.int32)
            pos = sc.csr_pos.to(torch.int32)
            self._csr_t = (CsrMatrix(indptr_t, indices_t, self.n_src, self.n_dst), pos)
            build_counts["csr_t"] += 1
        return self._csr_t

    def cached_bytes(self) -> int:
        """Device bytes held here (index copies, values, transposes, workspaces)."""
        total = self.csr.cached_bytes() - (self.indptr.numel() + self.indices.numel()) * 4  # owned by the Graph
        if self._out_degree is not None:
            total += self._out_degree.numel() * 4
        if self._csr_t is not None:
            total += self._csr_t[0].cached_bytes() + self._csr_t[1].numel() * 4
        entries = list(self._unweighted.values()) + [e for lru in self._weighted.values() for e in lru.values()]
        for e in entries:
            total += e.values.numel() * 4 + (e._transposed.numel() * 4 if e._transposed is not None else 0)
        return total


def spmm_cache(graph: Graph) -> SpmmCache:
    """The SpmmCache of ``graph`` (built on first use, kept in ``graph.memo``)."""
    return graph.memo(_MEMO_KEY, lambda: SpmmCache(graph))


class _SpmmFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, edge_weight: Optional[Tensor], graph: Graph, norm: str):
        cache = spmm_cache(graph)
        x2 = x.reshape(graph.n_src, _width(x))
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        entry = cache.values(norm, edge_weight)
        # allocated in its final shape so the op returns a fresh tensor, not a view
        out = torch.empty((graph.n_dst,) + tuple(x.shape[1:]), dtype=x2.dtype, device=x2.device)
        cache.csr.matmul(entry.values, x2, out.view(graph.n_dst, x2.size(1)))
        # the graph stays alive until backward (the cache reaches it through a weak reference)
        ctx.graph, ctx.cache, ctx.entry, ctx.norm, ctx.x_shape = graph, cache, entry, norm, x.shape
        ctx.save_for_backward(x2 if ctx.needs_input_grad[1] else None)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        cache, entry = ctx.cache, ctx.entry
        (x2,) = ctx.saved_tensors
        dy = grad_out.reshape(cache.n_dst, _width(grad_out))
        if not dy.is_contiguous():
            dy = dy.contiguous()
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = torch.empty(ctx.x_shape, dtype=dy.dtype, device=dy.device)
            dx2 = dx.view(cache.n_src, dy.size(1))
            # cuSPARSE cannot describe a multigraph with more edges than matrix entries, so
            # those always take the explicit transposed matrix (run by our own kernel).
            if backward_mode() == "transposed" or cache.csr.nnz > cache.n_src * cache.n_dst:
                csr_t, _ = cache.transposed()
                csr_t.matmul(entry.transposed(cache), dy, dx2)
            else:
                cache.csr.matmul(entry.values, dy, dx2, transpose=True)
        if ctx.needs_input_grad[1]:
            src_mode, dst_mode = SCALES[ctx.norm]
            out_deg = cache.out_degree() if src_mode else None
            dw = edge_norm.spmm_edge_grad(cache.indptr, cache.indices, cache.perm, out_deg, src_mode, dst_mode,
                                          dy, x2)
        return dx, dw, None, None


def spmm_cuda(graph: Graph, x: Tensor, edge_weight: Optional[Tensor] = None, norm: str = "none") -> Tensor:
    """CUDA ``spmm`` (arguments already checked by :func:`gnn_fastpath.ops.spmm`)."""
    return _SpmmFunction.apply(x, edge_weight, graph, norm)
