"""The Graph: destination-major CSR plus what the kernels need, built once per graph.

Messages flow source -> destination. Row ``i`` of the CSR lists the in-edges of destination
``i``: ``indices[indptr[i]:indptr[i+1]]`` are their source ids and ``perm`` maps each CSR
position back to the caller's edge id (so per-edge tensors in caller order can be read in
CSR order as ``edge_tensor[perm]``).

:meth:`Graph.of` turns a graph input into its cached Graph: plain torch inputs here, every
other kind of object through an adapter registered with :func:`register_adapter` (the
integrations register theirs when ``gnn_fastpath`` is imported).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Hashable, List, Optional, Tuple

import torch
from torch import Tensor

from . import cache
from .convert import _as_node_count, check_readable, edge_index_to_coo, sparse_to_coo, tensor_version

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
    """int32 copies of the CSR arrays for CUDA kernels (built once per graph and device).

    ``indptr`` [n_dst+1], ``indices`` [M] (source ids), ``perm`` [M] (caller edge ids).
    """

    indptr: Tensor
    indices: Tensor
    perm: Tensor


@dataclass(frozen=True)
class KernelSourceCSR:
    """int32 source-major CSR for kernels that walk out-edges (built once per graph and device).

    Row ``j`` lists the out-edges of source ``j`` (destinations ascending):

    - ``indptr`` [n_src+1]: row offsets;
    - ``indices`` [M]: the destination id of each out-edge;
    - ``perm`` [M]: the caller's edge id of each out-edge;
    - ``csr_pos`` [M]: the position of each out-edge in the destination-major CSR.
    """

    indptr: Tensor
    indices: Tensor
    perm: Tensor
    csr_pos: Tensor


#: ``describe(obj, num_nodes) -> (device_key, version, build)``: see :func:`register_adapter`.
Describe = Callable[[object, object], Tuple[str, Hashable, Callable[[], "Graph"]]]
# (predicate, describe, what it accepts), newest last; Graph.of asks the newest first.
_adapters: List[Tuple[Callable[[object], bool], Describe, str]] = []


def register_adapter(predicate: Callable[[object], bool], describe: Describe, accepts: str = "") -> None:
    """Let :meth:`Graph.of` take objects for which ``predicate(obj)`` is true.

    ``describe(obj, num_nodes)`` returns ``(device_key, version, build)``: the cache's
    device key (``str(device)``), a hashable version that changes whenever ``obj``'s edges
    or node counts may have (see :func:`gnn_fastpath.graph.cache.cached`) and a
    zero-argument ``build()`` returning the Graph. ``obj`` must support weak references.
    Adapters registered later are asked first, before the plain tensor inputs, so one can
    take over a tensor subclass. ``accepts`` names the inputs in :meth:`Graph.of`'s error for
    unsupported objects (e.g. ``"a Foo graph (mypackage.foo)"``). Registering the same pair
    again does nothing.
    """
    if any(p is predicate and d is describe for p, d, _ in _adapters):
        return
    _adapters.append((predicate, describe, accepts))


def _describe_tensor(obj: Tensor, num_nodes) -> Tuple[str, Hashable, Callable[[], "Graph"]]:
    if obj.layout in (torch.sparse_csr, torch.sparse_coo):
        return str(obj.device), tensor_version(obj), lambda: Graph.from_sparse(obj)
    return str(obj.device), tensor_version(obj), lambda: Graph.from_edge_index(obj, num_nodes)


def _describe(obj, num_nodes) -> Tuple[str, Hashable, Callable[[], "Graph"]]:
    """(device key, version, builder) of a graph input; ValueError naming ``obj`` otherwise."""
    for predicate, describe, _ in reversed(_adapters):
        if predicate(obj):
            return describe(obj, num_nodes)
    if isinstance(obj, Tensor):
        return _describe_tensor(obj, num_nodes)
    kinds = ["an edge_index tensor [2, M]", "a torch.sparse COO/CSR adjacency", "a Graph"]
    kinds += [accepts for _, _, accepts in _adapters if accepts]
    raise ValueError(f"obj must be {', '.join(kinds[:-1])} or {kinds[-1]}, got {type(obj).__name__}")


def _check_ids(ids: Tensor, bound: int, name: str) -> None:
    """Raise ValueError naming ``name`` if any id is negative or >= bound (one host sync), or
    if ``ids`` cannot be read (meta device)."""
    if ids.numel() == 0:
        return
    check_readable(ids, name)
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

    Build one with :meth:`from_edge_index`, :meth:`from_sparse`, :meth:`from_coo`, or
    :meth:`of` (which also caches it for the object it came from).

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
        self._source_csr: Optional[SourceCSR] = None
        self._dst_index: Optional[Tensor] = None
        self._kernel_csr: Optional[KernelCSR] = None
        self._device_copies: Dict[torch.device, "Graph"] = {}
        self._memo: Dict[object, object] = {}

    # ------------------------------------------------------------------ building
    @classmethod
    def from_coo(cls, src: Tensor, dst: Tensor, n_src: int, n_dst: int, *, validate: bool = True,
                 name: str = "edge_index") -> "Graph":
        """Build from source and destination ids, integer [M] each, in the caller's edge order.

        ``name`` names the input in validation errors (``"<name> (source row) ..."``).
        """
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
        """Build from an ``edge_index`` [2, M] (row 0 sources, row 1 targets).

        Args:
            edge_index: integer tensor [2, M] (a tensor subclass is read as a plain tensor);
                int64/int32/int16/int8/uint8 ids, not bool, not on the meta device (see
                :func:`~gnn_fastpath.graph.convert.edge_index_to_coo`).
            num_nodes: ``None`` (``max id + 1`` over both rows, for both sides), an int
                (homogeneous), or ``(n_src, n_dst)`` (bipartite).

        An inferred count may not exceed :data:`~gnn_fastpath.graph.convert.MAX_INFERRED_NODES`
        (2**31 - 1; a larger id without ``num_nodes`` is a ValueError naming ``edge_index``
        and the id); an explicit ``num_nodes`` is taken as given up to
        :data:`~gnn_fastpath.graph.convert.MAX_NODES` (2**59), memory permitting.
        """
        src, dst, n_src, n_dst = edge_index_to_coo(edge_index, num_nodes)
        return cls.from_coo(src, dst, n_src, n_dst, name="edge_index")

    @classmethod
    def from_sparse(cls, adj_t: Tensor) -> "Graph":
        """Build from a ``torch.sparse`` CSR or COO adjacency ``adj_t`` [n_dst, n_src]."""
        src, dst, n_src, n_dst = sparse_to_coo(adj_t)
        return cls.from_coo(src, dst, n_src, n_dst, name="adj_t")

    @classmethod
    def of(cls, obj, num_nodes=None) -> "Graph":
        """The cached Graph of a graph input, building it on first use.

        ``obj`` is a Graph (returned as is), an ``edge_index`` [2, M] integer tensor (built
        with ``num_nodes`` as in :meth:`from_edge_index`), a ``torch.sparse`` COO/CSR
        adjacency [n_dst, n_src] (``num_nodes`` unused), or an object a registered adapter
        takes (:func:`register_adapter`; importing ``gnn_fastpath`` registers those of the
        integrations). The cache notices in-place changes (tensor version counters, or what
        the adapter's version tracks), holds its sources weakly and is bounded per device;
        see :mod:`gnn_fastpath.graph.cache`.
        """
        if isinstance(obj, Graph):
            return obj
        if isinstance(num_nodes, Tensor):  # a hashable cache key, checked as from_edge_index would
            num_nodes = _as_node_count(num_nodes, "num_nodes")
        device_key, version, build = _describe(obj, num_nodes)
        extra = tuple(num_nodes) if isinstance(num_nodes, (tuple, list)) else num_nodes
        return cache.cached(obj, version, build, device_key, extra)

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

    def caller_coo(self) -> Tuple[Tensor, Tensor]:
        """(src, dst), int64 [M] each: the source and destination id of every edge in the
        caller's edge order (memoised)."""

        def build():
            src = torch.empty_like(self.indices)
            src[self.perm] = self.indices
            dst = torch.empty_like(self.indices)
            dst[self.perm] = self.dst_index()
            return src, dst

        return self.memo("caller_coo", build)

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
        """Max and mean of the destination in-degrees (computed once)."""
        if self._stats is None:
            deg = self.in_degree()
            if deg.numel() == 0:
                self._stats = DegreeStats(0, 0.0)
            else:
                self._stats = DegreeStats(int(deg.max()), float(deg.to(torch.float64).mean()))
        return self._stats

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

    def _check_int32(self) -> None:
        if not self.fits_int32():
            raise ValueError(
                f"graph has {self.num_edges} edges and {max(self.n_src, self.n_dst)} nodes; "
                "the CUDA kernels index with int32 and support fewer than 2**31")

    def kernel_csr(self) -> KernelCSR:
        """int32 ``indptr``/``indices``/``perm`` for kernels (cached).

        Raises ValueError when the graph has 2**31 edges or more, which int32 kernels
        cannot index; callers fall back to the reference ops then.
        """
        if self._kernel_csr is None:
            self._check_int32()
            with _normal_tensors():
                self._kernel_csr = KernelCSR(self.indptr.to(torch.int32), self.indices.to(torch.int32),
                                             self.perm.to(torch.int32))
        return self._kernel_csr

    def kernel_source_csr(self) -> KernelSourceCSR:
        """int32 source-major CSR for kernels (see :class:`KernelSourceCSR`; memoised).

        Raises the same ValueError as :meth:`kernel_csr` when int32 cannot index the graph.
        """
        self._check_int32()

        def build():
            s = self.source_csr()
            return KernelSourceCSR(s.indptr.to(torch.int32), s.indices.to(torch.int32),
                                   self.perm[s.csr_pos].to(torch.int32), s.csr_pos.to(torch.int32))

        return self.memo("kernel_source_csr", build)

    def to(self, device) -> "Graph":
        """This graph on ``device``; the copy is made once and cached with the graph.

        This serves a graph input kept on the CPU while the features live on a GPU.
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
