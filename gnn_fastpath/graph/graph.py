"""The Graph: destination-major CSR plus what the kernels need, built once per graph.

Messages flow source -> destination. Row ``i`` of the CSR lists the in-edges of destination
``i``: ``indices[indptr[i]:indptr[i+1]]`` are their source ids and ``perm`` maps each CSR
position back to the caller's edge id (so per-edge tensors in caller order can be read in
CSR order as ``edge_tensor[perm]``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

#: Default degree quantile above which a destination counts as heavy.
DEFAULT_HEAVY_QUANTILE = 0.99
#: A destination is never heavy below this in-degree, whatever the quantile says: small
#: rows are cheap for any mapping and splitting them only adds merge work.
DEFAULT_MIN_HEAVY_DEGREE = 256

INT32_MAX = 2**31 - 1


def _normal_tensors():
    """Build cached graph data as normal tensors even under ``torch.inference_mode``.

    A Graph (and what is memoised on it) outlives the call that built it; built from
    inference tensors it could never be saved for backward in a later training step.
    """
    return torch.inference_mode(False)


@dataclass(frozen=True)
class DegreeStats:
    """In-degree statistics of the destinations (host numbers, computed once)."""

    max: int
    mean: float
    skewness: float


@dataclass(frozen=True)
class DegreeBuckets:
    """Destinations split by in-degree for degree-aware launches.

    ``light`` and ``heavy`` are int64 destination ids (ascending); ``threshold`` is the
    smallest in-degree that counts as heavy.
    """

    light: Tensor
    heavy: Tensor
    threshold: int


@dataclass(frozen=True)
class SourceCSR:
    """Source-major CSR (the transpose), built lazily for backward passes.

    Row ``j`` lists the out-edges of source ``j``: ``indices`` are destination ids and
    ``csr_pos`` is each edge's position in the destination-major CSR.
    """

    indptr: Tensor
    indices: Tensor
    csr_pos: Tensor


@dataclass(frozen=True)
class KernelCSR:
    """int32 copies of the CSR arrays for CUDA kernels (built once per graph and device)."""

    indptr: Tensor
    indices: Tensor
    perm: Tensor


def _as_node_count(value, name: str) -> int:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a single integer, got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _check_ids(ids: Tensor, bound: int, name: str) -> None:
    """Raise ValueError naming ``name`` if any id is negative or >= bound (one host sync)."""
    if ids.numel() == 0:
        return
    lo, hi = torch.aminmax(ids)
    lo, hi = int(lo), int(hi)
    if lo < 0:
        raise ValueError(f"{name} contains a negative node id ({lo})")
    if hi >= bound:
        raise ValueError(f"{name} contains node id {hi}, out of range for {bound} nodes")


def _indptr_from_sorted(rows: Tensor, n_rows: int) -> Tensor:
    """indptr [n_rows+1] from row ids sorted ascending (CUDA kernel when available)."""
    if rows.is_cuda and rows.numel() > 0:
        from .. import cuda

        if cuda.available():
            return cuda.csr_indptr(rows, n_rows)
    counts = torch.bincount(rows, minlength=n_rows)
    indptr = torch.zeros(n_rows + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(counts, 0, out=indptr[1:])
    return indptr


def _sort_into_csr(rows: Tensor, cols: Tensor, n_rows: int, n_cols: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Sort edges by (row, col), stable, and return (indptr, sorted cols, order).

    Sorting by column inside a row makes neighbouring gathers hit neighbouring memory;
    stability keeps duplicate edges in caller order.
    """
    if rows.numel() == 0:
        empty = torch.empty(0, dtype=torch.int64, device=rows.device)
        return torch.zeros(n_rows + 1, dtype=torch.int64, device=rows.device), empty, empty.clone()
    if n_cols > 0 and n_rows <= (2**62) // max(n_cols, 1):
        key = rows * n_cols + cols
        order = torch.sort(key, stable=True).indices
    else:  # keys would overflow int64: two stable passes
        order = torch.sort(cols, stable=True).indices
        order = order[torch.sort(rows[order], stable=True).indices]
    sorted_rows = rows[order]
    return _indptr_from_sorted(sorted_rows, n_rows), cols[order], order


class Graph:
    """A graph as the kernels see it: destination-major CSR and cached derived data.

    Build one with :meth:`from_edge_index`, :meth:`from_sparse`, :meth:`from_dgl`, or
    :meth:`of` (which also caches it for the framework object it came from).

    Attributes:
        indptr (Tensor): int64 [n_dst + 1], row offsets (rows are destinations).
        indices (Tensor): int64 [M], the source id of each CSR edge.
        perm (Tensor): int64 [M], the caller's edge id of each CSR edge.
        n_src (int), n_dst (int): node counts (equal for homogeneous graphs).
    """

    def __init__(self, indptr: Tensor, indices: Tensor, perm: Tensor, n_src: int, n_dst: int):
        if indptr.numel() != n_dst + 1:
            raise ValueError(f"indptr must have n_dst + 1 = {n_dst + 1} entries, got {indptr.numel()}")
        if indices.shape != perm.shape:
            raise ValueError(f"indices {tuple(indices.shape)} and perm {tuple(perm.shape)} differ in shape")
        self.indptr = indptr
        self.indices = indices
        self.perm = perm
        self.n_src = int(n_src)
        self.n_dst = int(n_dst)
        self._stats: Optional[DegreeStats] = None
        self._buckets: Dict[Tuple[float, int], DegreeBuckets] = {}
        self._source_csr: Optional[SourceCSR] = None
        self._dst_index: Optional[Tensor] = None
        self._kernel_csr: Optional[KernelCSR] = None
        self._device_copies: Dict[torch.device, "Graph"] = {}
        self._memo: Dict[object, object] = {}

    # ------------------------------------------------------------------ building
    @classmethod
    def from_coo(cls, src: Tensor, dst: Tensor, n_src: int, n_dst: int, *, validate: bool = True,
                 name: str = "edge_index") -> "Graph":
        """Build from source and destination id vectors in the caller's edge order."""
        if validate:
            _check_ids(src, n_src, f"{name} (source row)")
            _check_ids(dst, n_dst, f"{name} (destination row)")
        with _normal_tensors():
            src = src.to(torch.int64)
            dst = dst.to(torch.int64)
            indptr, indices, perm = _sort_into_csr(dst, src, n_dst, n_src)
        return cls(indptr, indices, perm, n_src, n_dst)

    @classmethod
    def from_edge_index(cls, edge_index: Tensor, num_nodes=None) -> "Graph":
        """Build from a PyG ``edge_index`` [2, M] (row 0 sources, row 1 targets).

        Args:
            edge_index: integer tensor [2, M] or a PyG ``EdgeIndex``.
            num_nodes: ``None`` (``max id + 1``, or the ``EdgeIndex``'s sparse size), an int
                (homogeneous), or ``(n_src, n_dst)`` (bipartite).
        """
        from .convert import edge_index_to_coo

        src, dst, n_src, n_dst = edge_index_to_coo(edge_index, num_nodes)
        return cls.from_coo(src, dst, n_src, n_dst, name="edge_index")

    @classmethod
    def from_sparse(cls, adj_t: Tensor) -> "Graph":
        """Build from a ``torch.sparse`` CSR or COO adjacency ``adj_t`` [n_dst, n_src]."""
        from .convert import sparse_to_coo

        src, dst, n_src, n_dst = sparse_to_coo(adj_t)
        return cls.from_coo(src, dst, n_src, n_dst, name="adj_t")

    @classmethod
    def from_dgl(cls, g) -> "Graph":
        """Build from a DGL graph or block (one edge type; int32 or int64 ids)."""
        from .convert import dgl_to_coo

        src, dst, n_src, n_dst = dgl_to_coo(g)
        # Validated like any input: a malformed block (edges to destinations beyond
        # num_dst_nodes) must raise here, not write out of bounds in a kernel.
        return cls.from_coo(src, dst, n_src, n_dst, name="g")

    @classmethod
    def of(cls, obj, num_nodes=None) -> "Graph":
        """The cached Graph of a framework graph object, building it on first use.

        ``obj`` is an ``edge_index`` tensor, a PyG ``EdgeIndex``, a ``torch.sparse``
        adjacency or a DGL graph. The cache notices in-place changes (tensor versions, DGL
        graphs that gained or lost edges), holds its sources weakly and is bounded per
        device; see :mod:`gnn_fastpath.graph.cache`.
        """
        from .cache import graph_of

        return graph_of(obj, num_nodes)

    # ------------------------------------------------------------------ basic facts
    @property
    def num_edges(self) -> int:
        return self.indices.numel()

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    @property
    def is_bipartite(self) -> bool:
        return self.n_src != self.n_dst

    def __repr__(self) -> str:
        return (f"Graph(n_src={self.n_src}, n_dst={self.n_dst}, num_edges={self.num_edges}, "
                f"device={self.device})")

    def in_degree(self) -> Tensor:
        """int64 [n_dst], in-degree of each destination."""
        return self.indptr[1:] - self.indptr[:-1]

    def out_degree(self) -> Tensor:
        """int64 [n_src], out-degree of each source."""
        return self.memo("out_degree", lambda: torch.bincount(self.indices, minlength=self.n_src))

    def dst_index(self) -> Tensor:
        """int64 [M], the destination id of each CSR edge (cached)."""
        if self._dst_index is None:
            with _normal_tensors():
                self._dst_index = torch.repeat_interleave(
                    torch.arange(self.n_dst, device=self.device), self.in_degree(), output_size=self.num_edges)
        return self._dst_index

    def memo(self, key, build):
        """Cache ``build()`` under ``key`` for this graph's lifetime (derived, per-graph data)."""
        try:
            return self._memo[key]
        except KeyError:
            with _normal_tensors():
                value = self._memo[key] = build()
            return value

    # ------------------------------------------------------------------ derived data
    def degree_stats(self) -> DegreeStats:
        """Max, mean and (Fisher) skewness of the destination in-degrees."""
        if self._stats is None:
            deg = self.in_degree().to(torch.float64)
            if deg.numel() == 0:
                self._stats = DegreeStats(0, 0.0, 0.0)
            else:
                mean = deg.mean()
                centred = deg - mean
                var = (centred ** 2).mean()
                third = (centred ** 3).mean()
                var_f = float(var)
                skew = float(third) / var_f ** 1.5 if var_f > 0 else 0.0
                self._stats = DegreeStats(int(deg.max()), float(mean), skew)
        return self._stats

    def buckets(self, quantile: float = DEFAULT_HEAVY_QUANTILE,
                min_heavy_degree: int = DEFAULT_MIN_HEAVY_DEGREE) -> DegreeBuckets:
        """Split destinations into light and heavy by in-degree.

        A destination is heavy when its in-degree is at least
        ``max(quantile-th degree quantile, min_heavy_degree)``. Cached per arguments.
        """
        if not 0.0 <= quantile <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {quantile}")
        key = (float(quantile), int(min_heavy_degree))
        if key not in self._buckets:
            self._buckets[key] = self._split_by_degree(quantile, min_heavy_degree)
        return self._buckets[key]

    def _split_by_degree(self, quantile: float, min_heavy_degree: int) -> DegreeBuckets:
        with _normal_tensors():
            deg = self.in_degree()
            if deg.numel() == 0:
                q = 0
            else:
                # torch.quantile is limited to 2**24 elements: use a sorted pick instead.
                k = min(deg.numel() - 1, int(math.ceil(quantile * (deg.numel() - 1))))
                q = int(torch.sort(deg).values[k])
            threshold = max(q, int(min_heavy_degree), 1)
            is_heavy = deg >= threshold
            ids = torch.arange(self.n_dst, device=self.device)
            return DegreeBuckets(ids[~is_heavy], ids[is_heavy], threshold)

    def source_csr(self) -> SourceCSR:
        """The source-major CSR (transpose), built on first use and cached."""
        if self._source_csr is None:
            with _normal_tensors():
                indptr, dst_sorted, order = _sort_into_csr(self.indices, self.dst_index(), self.n_src, self.n_dst)
            self._source_csr = SourceCSR(indptr, dst_sorted, order)
        return self._source_csr

    def fits_int32(self) -> bool:
        """Whether int32 kernels can index this graph (fewer than 2**31 edges and nodes)."""
        return self.num_edges <= INT32_MAX and max(self.n_src, self.n_dst) <= INT32_MAX

    def kernel_csr(self) -> KernelCSR:
        """int32 ``indptr``/``indices``/``perm`` for kernels (cached).

        Raises ValueError when the graph has 2**31 edges or more, which int32 kernels
        cannot index; callers fall back to the reference ops then.
        """
        if self._kernel_csr is None:
            if not self.fits_int32():
                raise ValueError(
                    f"graph has {self.num_edges} edges and {max(self.n_src, self.n_dst)} nodes; "
                    "the CUDA kernels index with int32 and support fewer than 2**31")
            with _normal_tensors():
                self._kernel_csr = KernelCSR(self.indptr.to(torch.int32), self.indices.to(torch.int32),
                                             self.perm.to(torch.int32))
        return self._kernel_csr

    def to(self, device) -> "Graph":
        """This graph on ``device``; the copy is made once and cached with the graph.

        This serves a DGL graph kept on the CPU while features live on the GPU.
        """
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device == self.device:
            return self
        copy = self._device_copies.get(device)
        if copy is None:
            with _normal_tensors():
                copy = Graph(self.indptr.to(device), self.indices.to(device), self.perm.to(device),
                             self.n_src, self.n_dst)
            copy._stats = self._stats
            self._device_copies[device] = copy
        return copy
