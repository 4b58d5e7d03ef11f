"""A graph as tensors only: what the custom operators take, and how a compiled model builds it.

Under ``torch.compile`` no Python object may cross the compiled graph, and under CUDA graphs
(``mode="reduce-overhead"``) nothing may be computed on the host per step: a replay reruns
the recorded kernels on new data in the same buffers. So a compiled layer builds its graph
inside the traced region, with plain torch operations on the ``edge_index`` it was given
(:func:`from_coo`: two stable sorts and two ``searchsorted``; no host synchronisation, static
shapes), and passes the result, a :class:`GraphTensors`, to the custom operators of
:mod:`gnn_fastpath.ops.library`. AOTAutograd's common-subexpression elimination builds it
once per step when several layers share one ``edge_index``; what no operator reads (the
source-major CSR when every backward walks destinations) is dropped by dead-code elimination.

Inside an operator, :func:`as_graph` turns the tensors back into a :class:`Graph` for the
launchers: a *static* Graph, whose launch geometry depends on shapes only (no degree-aware
row splitting, no cuSPARSE algorithm timing, no host reads), so that a recorded CUDA graph
stays correct for every graph of the same size.

Edges removed by a layer (PyG drops existing self loops before adding its own) cannot leave
a static-shape edge list; :func:`from_coo` moves them to an extra destination row ``n_dst``
instead (``extra_row=True``), whose output the caller slices off, and the removed ones
receive exactly zero gradient. The attention families' work lists leave that row out
(:meth:`GraphTensors.with_geometry`), so their kernels never walk the removed edges; the
other kernels see them as ordinary edges of a row nobody reads.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .graph import INT32_MAX, DegreeStats, Graph, KernelCSR, KernelSourceCSR, SourceCSR
from ..cuda.worklist import SKIP_LAST_ROW


#: How many leading fields of :class:`GraphTensors` the operators take.
N_OPERANDS = 10
#: How many of them are the CSR tensors (the fields before ``n_src``).
N_CSR = 7


class GraphTensors(NamedTuple):
    """A graph as int32 tensors: destination-major CSR and, optionally, its transpose.

    Attributes:
        indptr: [n_dst + 1] row offsets (rows are destinations).
        indices: [M] the source id of each CSR edge.
        perm: [M] the caller's edge id of each CSR edge.
        src_indptr, src_indices, src_perm, src_csr_pos: the source-major CSR ([n_src + 1],
            [M] destination ids, [M] caller edge ids, [M] positions in the destination-major
            CSR), or None where no backward needs it.
        n_src: number of source nodes (a SymInt under dynamic shapes).
        geometry, geometry_names: the launchers' work lists built by the caller's traced code
            (:meth:`with_geometry`), one name per tensor: ``"<list name>.<i>"``.
    """

    indptr: Tensor
    indices: Tensor
    perm: Tensor
    src_indptr: Optional[Tensor]
    src_indices: Optional[Tensor]
    src_perm: Optional[Tensor]
    src_csr_pos: Optional[Tensor]
    n_src: int
    geometry: Tuple[Tensor, ...] = ()
    geometry_names: Tuple[str, ...] = ()
    #: Whether the last CSR row is the extra row of removed edges (see :func:`from_coo`);
    #: not an operand: the ops pad destination inputs by one row and slice it off the result.
    extra_row: bool = False
    #: (src, dst) int64 [M] in the caller's order, as the graph was built from (not an operand).
    coo: Optional[Tuple[Tensor, Tensor]] = None
    #: Where :meth:`memo` keeps derived values, shared by the graph's variants (``_replace``);
    #: None inside a compiled region, where AOTAutograd merges the same computation instead.
    store: Optional["Memo"] = None

    @property
    def operands(self) -> tuple:
        """The fields the custom operators take (:data:`N_OPERANDS` of them)."""
        return tuple(self)[:N_OPERANDS]

    @property
    def n_dst(self) -> int:
        """Destination nodes (the extra row of removed edges not counted)."""
        return self.indptr.shape[0] - 1 - int(self.extra_row)

    @property
    def num_edges(self) -> int:
        return self.indices.shape[0]

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    def fits_int32(self) -> bool:
        """Whether int32 kernels can index this graph (fewer than 2**31 edges and nodes), as
        :meth:`Graph.fits_int32`."""
        return max(self.num_edges, int(self.n_src), self.indptr.shape[0] - 1) <= INT32_MAX

    def memo(self, key, build):
        """What :meth:`Graph.memo` gives: kept in :attr:`store` (an eager graph, shared by the
        layers of a step), else built again (inside a compiled region the same computation on
        the same inputs is merged by AOTAutograd instead of cached)."""
        if self.store is None:
            return build()
        values = self.store.values
        if key not in values:
            values[key] = build()
        return values[key]

    def in_degree(self) -> Tensor:
        """int32 [n_dst], in-degree of each destination."""
        counts = self.indptr[1:] - self.indptr[:-1]
        return counts[: self.n_dst] if self.extra_row else counts

    def caller_coo(self) -> Tuple[Tensor, Tensor]:
        """(src, dst) int64 [M] in the caller's edge order (removed edges' dst is the extra row)."""
        if self.coo is not None and not self.extra_row:
            return self.coo
        return self.memo(("caller_coo",), self._caller_coo)

    def _caller_coo(self) -> Tuple[Tensor, Tensor]:
        m = self.num_edges
        rows = torch.searchsorted(self.indptr.to(torch.int64), torch.arange(m, device=self.device), right=True) - 1
        perm = self.perm.to(torch.int64)
        src = torch.empty(m, dtype=torch.int64, device=self.device).scatter_(0, perm, self.indices.to(torch.int64))
        dst = torch.empty(m, dtype=torch.int64, device=self.device).scatter_(0, perm, rows)
        return src, dst

    def destination_major(self) -> "GraphTensors":
        """The same graph without its source-major CSR (for ops whose backward never walks it)."""
        return self._replace(src_indptr=None, src_indices=None, src_perm=None, src_csr_pos=None)

    def with_source_major(self) -> "GraphTensors":
        """The same graph with its source-major CSR: itself where it has one, else built here
        from the caller's edges (an eager static graph leaves it out until an op needs it;
        :func:`from_coo` under compilation builds it, and dead-code elimination drops it where
        no operator reads it)."""
        if self.src_indptr is not None:
            return self

        def build():
            src, rows = self.caller_coo()
            s_indptr, s_indices, s_perm, s_csr_pos = _transpose(src, rows, self.perm.to(torch.int64), self.n_src)
            return self._replace(src_indptr=s_indptr, src_indices=s_indices, src_perm=s_perm, src_csr_pos=s_csr_pos)

        return self.memo(("with_source_major", self.geometry_names), build)

    def with_geometry(self, specs) -> "GraphTensors":
        """The same graph carrying the work lists ``specs`` describe
        (:class:`gnn_fastpath.cuda.worklist.StaticGeometry`: ``name``, ``source_major`` and
        ``build(indptr, nnz)``), built here, in the caller's (traced) code, so that an operator
        finds them instead of building them in every call. Lists it carries already, and
        source-major ones of a graph without its source-major CSR, are skipped. With an extra
        row, the destination-major row-chunk lists leave it out (``SKIP_LAST_ROW``): no
        kernel walks the removed edges."""
        key = ("with_geometry", tuple(spec.name for spec in specs), self.src_indptr is None, self.geometry_names)
        return self.memo(key, lambda: self._with_geometry(specs))

    def _with_geometry(self, specs) -> "GraphTensors":
        names, tensors = list(self.geometry_names), list(self.geometry)
        have = {name.rpartition(".")[0] for name in names}
        for spec in specs:
            skip = self.extra_row and spec.can_skip_last_row
            name = spec.name + SKIP_LAST_ROW if skip else spec.name
            indptr = self.src_indptr if spec.source_major else self.indptr
            if name in have or indptr is None:
                continue
            built = spec.build(indptr, self.num_edges, skip_last_row=skip)
            names += [f"{name}.{i}" for i in range(len(built))]
            tensors += built
            have.add(name)
        return self._replace(geometry=tuple(tensors), geometry_names=tuple(names))

    def pad(self, t: Optional[Tensor]) -> Optional[Tensor]:
        """A destination-indexed input [n_dst, ...] with the extra row's zero row appended
        (itself without an extra row)."""
        if t is None or not self.extra_row:
            return t
        return torch.cat([t, t.new_zeros((1,) + tuple(t.shape[1:]))])

    def unpad(self, t: Tensor) -> Tensor:
        """A destination-indexed result without the extra row."""
        return t[: self.n_dst] if self.extra_row else t


class Memo:
    """The derived values an eager :class:`GraphTensors` keeps (:meth:`GraphTensors.memo`):
    the layers of a step that share the graph build them once. Hashed by identity."""

    __slots__ = ("values",)

    def __init__(self):
        self.values: dict = {}


def _csr(rows: Tensor, cols: Tensor, n_rows: int) -> tuple:
    """(indptr, cols in row order, order), int32: a stable sort by row, so edges of one row
    keep the caller's order (duplicates included)."""
    order = torch.sort(rows.to(torch.int32), stable=True).indices
    indptr = torch.searchsorted(rows[order], torch.arange(n_rows + 1, device=rows.device, dtype=rows.dtype))
    return indptr.to(torch.int32), cols[order].to(torch.int32), order


def from_coo(src: Tensor, dst: Tensor, n_src: int, n_dst: int, *, removed: Optional[Tensor] = None,
             source_major: bool = True) -> GraphTensors:
    """The graph of edges ``src[e] -> dst[e]`` (integer [M] each, caller order), traceable.

    ``removed``: bool [M], edges the caller drops; they are moved to an extra destination row
    ``n_dst`` (so ``indptr`` has ``n_dst + 2`` entries and every destination-indexed input
    needs one more row, see the module docstring). ``source_major``: also build the transpose.

    Node ids must lie in range; under compilation they are checked on the device
    (``torch._assert_async``: a host check would synchronise every step).
    """
    src = src.to(torch.int64)
    dst = dst.to(torch.int64)
    if src.numel():
        ok = (src.min() >= 0) & (src.max() < n_src) & (dst.min() >= 0) & (dst.max() < n_dst)
        torch._assert_async(ok, "gnn_fastpath: edge_index holds a node id out of range")
    rows = dst if removed is None else torch.where(removed, n_dst, dst)
    n_rows = n_dst if removed is None else n_dst + 1
    extra = removed is not None
    indptr, indices, perm = _csr(rows, src, n_rows)
    if not source_major:
        return GraphTensors(indptr, indices, perm.to(torch.int32), None, None, None, None, n_src, extra_row=extra,
                            coo=(src, dst))
    return GraphTensors(indptr, indices, perm.to(torch.int32), *_transpose(src, rows, perm, n_src), n_src,
                        extra_row=extra, coo=(src, dst))


def _transpose(src: Tensor, rows: Tensor, perm: Tensor, n_src: int) -> tuple:
    """The source-major CSR fields of :class:`GraphTensors` (``src_indptr``, ``src_indices``,
    ``src_perm``, ``src_csr_pos``) of edges ``src[e] -> rows[e]`` whose destination-major CSR
    holds caller edge ``perm[p]`` at position ``p`` (int64)."""
    s_indptr, s_indices, s_order = _csr(src, rows, n_src)
    csr_pos = torch.empty_like(perm).scatter_(0, perm, torch.arange(perm.numel(), device=perm.device))
    return s_indptr, s_indices, s_order.to(torch.int32), csr_pos[s_order].to(torch.int32)


def of_graph(graph: Graph, source_major: bool = True) -> GraphTensors:
    """A built Graph's int32 tensors (eager; the operators' own tests use it)."""
    kc = graph.kernel_csr()
    if not source_major:
        return GraphTensors(kc.indptr, kc.indices, kc.perm, None, None, None, None, graph.n_src)
    sc = graph.kernel_source_csr()
    return GraphTensors(kc.indptr, kc.indices, kc.perm, sc.indptr, sc.indices, sc.perm, sc.csr_pos, graph.n_src)


def as_graph(gt: GraphTensors) -> Graph:
    """A static :class:`Graph` over the tensors of ``gt``, for the operators' implementations.

    No host synchronisation: degree facts come from shapes (the mean in-degree; row bounds of
    0, so no work list sized on the host splits a row: the kernels that split long rows here
    size their lists from shapes, :func:`gnn_fastpath.cuda.worklist.build_static` and
    :func:`~gnn_fastpath.cuda.worklist.virtual_rows`),
    the out-degrees from the source-major CSR (or, on first use, a scatter), the destination of
    each edge (on first use) from ``searchsorted``; the work lists handed in with ``gt``
    (:meth:`GraphTensors.with_geometry`) are kept in the memo under ``("geometry", name)``, where
    :func:`gnn_fastpath.cuda.worklist.static_geometry` finds them. On the CPU (the reference
    ops) the index tensors are widened to int64, as torch's scatter operations need.
    """
    on_cpu = gt.indptr.device.type == "cpu"
    wide = (lambda t: t.to(torch.int64)) if on_cpu else (lambda t: t)
    graph = Graph(wide(gt.indptr), wide(gt.indices), wide(gt.perm), int(gt.n_src), int(gt.indptr.shape[0] - 1))
    m, n_dst = graph.num_edges, graph.n_dst
    graph._set_facts(0, 0, None, exact=False)
    graph._stats = DegreeStats(-1, m / n_dst if n_dst else 0.0)
    graph._static = True
    graph._kernel_csr = KernelCSR(gt.indptr, gt.indices, gt.perm)
    # dst_index() and out_degree() are built on first use (Graph knows how without a host read):
    # every operator call builds its Graph anew, and most never ask
    if gt.src_indptr is not None:
        graph._source_csr = SourceCSR(wide(gt.src_indptr), wide(gt.src_indices), wide(gt.src_csr_pos))
        graph._memo["kernel_source_csr"] = KernelSourceCSR(gt.src_indptr, gt.src_indices, gt.src_perm,
                                                           gt.src_csr_pos)
        graph._memo["out_degree"] = (gt.src_indptr[1:] - gt.src_indptr[:-1]).to(torch.int64)
    lists: dict = {}
    for name, t in zip(gt.geometry_names, gt.geometry):
        lists.setdefault(name.rpartition(".")[0], []).append(t)
    for name, tensors in lists.items():
        graph._memo[("geometry", name)] = tuple(tensors)
    return graph
