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

import contextlib
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, List, Optional, Tuple

import torch
from torch import Tensor

from . import cache
from .convert import _as_node_count, check_readable, edge_index_to_coo, sparse_to_coo, tensor_version

INT32_MAX = 2**31 - 1
_NO_GUARD = contextlib.nullcontext()  # reusable and reentrant


def _normal_tensors():
    """Build cached graph data as normal tensors even under ``torch.inference_mode``.

    A Graph (and what is memoised on it) outlives the call that built it; built from
    inference tensors it could never be saved for backward in a later training step.
    Outside inference mode tensors are normal already: no guard to enter (this runs for
    every build and memo of a new graph).
    """
    if torch.is_inference_mode_enabled():
        return torch.inference_mode(False)
    return _NO_GUARD


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


# device -> str(device), the cache's device key: str() formats it anew on every call
_device_keys: Dict[torch.device, str] = {}


def _device_key(device: torch.device) -> str:
    key = _device_keys.get(device)
    if key is None:
        key = _device_keys[device] = str(device)
    return key


def _describe_tensor(obj: Tensor, num_nodes) -> Tuple[str, Hashable, Callable[[], "Graph"]]:
    if obj.layout in (torch.sparse_csr, torch.sparse_coo):
        return _device_key(obj.device), tensor_version(obj), lambda: Graph.from_sparse(obj)
    return _device_key(obj.device), tensor_version(obj), lambda: Graph.from_edge_index(obj, num_nodes)


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


@dataclass(frozen=True)
class EdgeFacts:
    """What the host knows about a new edge list after its one synchronisation.

    Attributes:
        id_range: ((min, max) source id, (min, max) target id); (0, -1) for no edges.
        grouped: whether the edges come grouped by target in ascending order (then the CSR
            keeps the caller's order and needs no sort).
        sources_sorted: whether, moreover, the sources ascend within each target's group.
        num_self_loops: edges with source == target.
        max_in_degree, max_out_degree: the longest destination and source rows.
    """

    id_range: Tuple[Tuple[int, int], Tuple[int, int]]
    grouped: bool
    sources_sorted: bool
    num_self_loops: int
    max_in_degree: int
    max_out_degree: int


def _check_range(lo: int, hi: int, bound: int, name: str) -> None:
    """ValueError naming ``name`` if an id is negative (``lo``) or ``>= bound`` (``hi``)."""
    if lo < 0:
        raise ValueError(f"{name} contains a negative node id ({lo})")
    if hi >= bound:
        raise ValueError(f"{name} contains node id {hi}, out of range for {bound} nodes")


def _builds_on_gpu(t: Tensor) -> bool:
    """Whether a graph over ``t`` is built by the GPU's build kernels (``t`` on CUDA, the
    kernels available); else by torch operations. (``benchmarks/dry.py`` answers True for CPU
    tensors, to count what a GPU's build issues.)"""
    if not t.is_cuda:
        return False
    from .. import cuda

    return cuda.available()


def _edge_facts(src: Tensor, dst: Tensor, n_src: int, n_dst: int, name: str
                ) -> Tuple[EdgeFacts, Tensor, Tensor]:
    """(facts, in-degree [n_dst], out-degree [n_src]) of int64 edge ids [M >= 1], the ids
    validated against the node counts (ValueError naming ``name``'s rows).

    On CUDA one kernel pass gathers every fact and one 64-byte read brings them to the host:
    the one host synchronisation of a new graph. On the CPU plain torch ops.
    """
    if _builds_on_gpu(src):
        from .. import cuda

        facts_t, in_degree, out_degree = cuda.edge_facts(src, dst, n_src, n_dst)
        s_lo, s_hi, d_lo, d_hi, unsorted, loops, max_in, max_out, unsorted_src = facts_t.tolist()  # the one sync
        _check_range(s_lo, s_hi, n_src, f"{name} (source row)")
        _check_range(d_lo, d_hi, n_dst, f"{name} (destination row)")
        return (EdgeFacts(((s_lo, s_hi), (d_lo, d_hi)), unsorted == 0, unsorted == 0 and unsorted_src == 0,
                          loops, max_in, max_out), in_degree, out_degree)
    check_readable(src, f"{name} (source row)")
    (s_lo, d_lo), (s_hi, d_hi) = (t.tolist() for t in torch.aminmax(torch.stack([src, dst]), dim=1))
    _check_range(s_lo, s_hi, n_src, f"{name} (source row)")
    _check_range(d_lo, d_hi, n_dst, f"{name} (destination row)")
    in_degree = torch.bincount(dst, minlength=n_dst)
    out_degree = torch.bincount(src, minlength=n_src)
    grouped = bool((dst[1:] >= dst[:-1]).all())
    sources_sorted = grouped and not bool(((dst[1:] == dst[:-1]) & (src[1:] < src[:-1])).any())
    # One read for the counts; the ids are in range and M >= 1, so both sides have nodes.
    loops, max_in, max_out = torch.stack([(src == dst).sum(), in_degree.max(), out_degree.max()]).tolist()
    return (EdgeFacts(((s_lo, s_hi), (d_lo, d_hi)), grouped, sources_sorted, loops, max_in, max_out),
            in_degree, out_degree)


def _indptr_of_sorted(rows: Tensor, order: Tensor, n_rows: int) -> Tensor:
    """indptr [n_rows+1] of the row ids ``rows[order]``, sorted ascending.

    On CUDA one kernel over the sorted ids (``bincount`` would synchronise there). On the
    CPU ``bincount`` of ``rows`` as they are: counts do not depend on the order, so the
    sorted copy is not needed.
    """
    if rows.numel() > 0 and _builds_on_gpu(rows):
        from .. import cuda

        return cuda.csr_indptr(rows[order], n_rows)
    return _indptr_by_counts(rows, n_rows)


def _indptr_by_counts(rows: Tensor, n_rows: int) -> Tensor:
    """indptr [n_rows+1] of row ids ``rows`` (any order) by ``bincount`` and ``cumsum``."""
    indptr = torch.zeros(n_rows + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(torch.bincount(rows, minlength=n_rows), 0, out=indptr[1:])
    return indptr


def _sort_into_csr(rows: Tensor, cols: Tensor, n_rows: int, n_cols: int,
                   indptr: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Sort edges by (row, col), stable, and return (indptr, sorted cols, order).

    Sorting by column inside a row makes neighbouring gathers hit neighbouring memory;
    stability keeps duplicate edges in caller order. ``indptr``: the row offsets when the
    caller has them already (from the degree counts).
    """
    if rows.numel() == 0:
        empty = torch.empty(0, dtype=torch.int64, device=rows.device)
        return torch.zeros(n_rows + 1, dtype=torch.int64, device=rows.device), empty, empty.clone()
    if n_cols > 0 and n_rows <= (2**62) // max(n_cols, 1):
        key = cols.add(rows, alpha=n_cols)  # rows * n_cols + cols in one op
        order = torch.sort(key, stable=True).indices
    else:  # keys would overflow int64: two stable passes
        order = torch.sort(cols, stable=True).indices
        order = order[torch.sort(rows[order], stable=True).indices]
    if indptr is None:
        indptr = _indptr_of_sorted(rows, order, n_rows)
    return indptr, cols[order], order


#: Graphs with at least this many edges detect symmetry when their source-major CSR is first
#: asked for (:meth:`Graph.source_csr`): the transpose of 4M edges holds about 100 MB.
DETECT_SYMMETRY_FROM = 1 << 22
_UNKNOWN = object()
#: The memo key of :meth:`Graph.note_pass`'s state.
_STEP = ("graph", "step")


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
        # The out-degrees counted by the build (int32 on CUDA), for out_degree().
        self._counted_out_degree: Optional[Tensor] = None
        self._kernel_csr: Optional[KernelCSR] = None
        self._device_copies: Dict[torch.device, "Graph"] = {}
        self._memo: Dict[object, object] = {}
        # Host facts known without a sync (see _set_facts); None: not known.
        self._degree_bounds: Tuple[Optional[int], Optional[int]] = (None, None)
        self._bounds_exact = False
        self._num_self_loops: Optional[int] = None
        # Whether each row's sources ascend (see sources_sorted); set by the builders.
        self._sources_sorted = False
        # Static: built from tensors inside a custom operator (graph.tensors.as_graph);
        # launch geometry from shapes only, nothing read back to the host.
        self._static = False

    @property
    def sources_sorted(self) -> bool:
        """Whether the source ids ascend within each destination row: the CSR was sorted by
        (destination, source) here, or the edges came in that order. Duplicate edges then sit
        next to each other, which the min/max kernels use (see ``segment_reduce.cu``). False
        where not known (a framework's own CSR, the static graphs of the compiled path)."""
        return self._sources_sorted

    @property
    def static(self) -> bool:
        """Whether this Graph came from tensors inside a custom operator (see
        :func:`gnn_fastpath.graph.tensors.as_graph`): kernels then choose their launch
        geometry from shapes alone, so that a recorded CUDA graph replays correctly on any
        graph of the same size."""
        return self._static

    def _set_facts(self, max_in: Optional[int], max_out: Optional[int], self_loops: Optional[int],
                   exact: bool = True) -> None:
        """Record host facts: the longest destination and source rows (exact, or upper
        bounds with ``exact=False``) and the number of self loops (None: unknown)."""
        self._degree_bounds = (max_in, max_out)
        self._bounds_exact = exact
        self._num_self_loops = self_loops

    # ------------------------------------------------------------------ building
    @classmethod
    def from_coo(cls, src: Tensor, dst: Tensor, n_src: int, n_dst: int, *, validate: bool = True,
                 name: str = "edge_index", degree_bounds: Optional[Tuple[int, int]] = None) -> "Graph":
        """Build from source and destination ids, integer [M] each, in the caller's edge order.

        With ``validate`` (the default) the ids are checked against the node counts
        (ValueError naming ``name``: ``"<name> (source row) ..."``) and the facts the kernels
        need on the host (id range, whether the edges come grouped by target, self loops,
        longest rows) are gathered in the same pass: on CUDA that is the graph's one host
        synchronisation. Edges that arrive grouped by target in ascending order (PyG's
        samplers return them so) keep their order: no sort.

        ``validate=False`` is for graphs derived from a validated one (e.g. with self loops
        added): no check, no synchronisation, always sorted; ``degree_bounds`` = (longest
        destination row, longest source row), upper bounds the caller knows, if any.
        """
        with _normal_tensors():
            src = src.to(torch.int64)
            dst = dst.to(torch.int64)
            if not validate or src.numel() == 0:
                indptr, indices, perm = _sort_into_csr(dst, src, n_dst, n_src)
                graph = cls(indptr, indices, perm, n_src, n_dst)
                graph._sources_sorted = True
                if src.numel() == 0:
                    graph._set_facts(0, 0, 0)
                elif degree_bounds is not None:
                    graph._set_facts(*degree_bounds, None, exact=False)  # either may be None
                return graph
            facts, in_degree, out_degree = _edge_facts(src, dst, n_src, n_dst, name)
            indptr = torch.zeros(n_dst + 1, dtype=torch.int64, device=src.device)
            torch.cumsum(in_degree, 0, dtype=torch.int64, out=indptr[1:])
            if facts.grouped:
                # A copy: ``src`` may be a view of the caller's edge_index, which the Graph
                # (cached against that very tensor) must neither keep alive nor share. Both
                # rows in one copy: grouped targets are already the destination of each CSR
                # edge (dst_index), and with perm the identity the caller's edge order is the
                # CSR's (caller_coo), so neither needs building later.
                indices, dst_index = torch.stack([src, dst]).unbind(0)
                perm = torch.arange(src.numel(), device=src.device)
            else:
                _, indices, perm = _sort_into_csr(dst, src, n_dst, n_src, indptr=indptr)
            graph = cls(indptr, indices, perm, n_src, n_dst)
            if facts.grouped:
                graph._dst_index = dst_index
                graph._memo["caller_coo"] = (indices, dst_index)
            graph._sources_sorted = facts.sources_sorted or not facts.grouped  # else sorted above
            graph._set_facts(facts.max_in_degree, facts.max_out_degree, facts.num_self_loops)
            # Widened to int64 by out_degree() when first asked: many graphs never are.
            graph._counted_out_degree = out_degree
        return graph

    @classmethod
    def from_csr(cls, indptr: Tensor, indices: Tensor, perm: Tensor, n_src: int, n_dst: int, *,
                 name: str = "csr") -> "Graph":
        """A Graph over a framework's own destination-major CSR (e.g. a DGL block's CSC):
        no sort, and on a GPU no host synchronisation.

        ``indptr`` [n_dst+1], ``indices`` [M] (source ids) and ``perm`` [M] (caller edge ids),
        any integer dtype. On the CPU the structure is checked (ValueError naming ``name``)
        and its longest rows are read, host work only; on a GPU it is trusted as the
        framework built it, and the longest rows are found when a kernel first needs them.
        """
        with _normal_tensors():
            indptr, indices, perm = (t.to(torch.int64) for t in (indptr, indices, perm))
            if indptr.numel() != n_dst + 1 or indices.shape != perm.shape or indices.dim() != 1:
                raise ValueError(f"{name}: indptr [{indptr.numel()}], indices {tuple(indices.shape)} and perm "
                                 f"{tuple(perm.shape)} do not describe {n_dst} destination rows")
            graph = cls(indptr, indices, perm, n_src, n_dst)
            if indptr.device.type == "cpu":
                m = indices.numel()
                deg = indptr[1:] - indptr[:-1]
                if int(indptr[0]) != 0 or int(indptr[-1]) != m or (n_dst and int(deg.min()) < 0):
                    raise ValueError(f"{name}: indptr is not a row-offset array over {m} edges")
                if m:
                    lo, hi = torch.aminmax(indices)
                    _check_range(int(lo), int(hi), n_src, f"{name} (source ids)")
                graph._set_facts(int(deg.max()) if n_dst else 0, None, None)
        return graph

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
        def build():
            counted, self._counted_out_degree = self._counted_out_degree, None
            if counted is not None:
                return counted.to(torch.int64)
            if self._static:  # bincount sizes its result on the host; a static graph reads nothing back
                ones = torch.ones(self.num_edges, dtype=torch.int64, device=self.device)
                return torch.zeros(self.n_src, dtype=torch.int64, device=self.device).index_add_(
                    0, self.indices.to(torch.int64), ones)
            return torch.bincount(self.indices, minlength=self.n_src)

        return self.memo("out_degree", build)

    def dst_index(self) -> Tensor:
        """int64 [M], the destination id of each CSR edge (cached); on a static graph in the
        index dtype of its own tensors (int32 kernel arrays on a GPU), as ``caller_coo()``
        writes both into tensors shaped like ``indices``."""
        if self._dst_index is None:
            with _normal_tensors():
                if self._static:
                    positions = torch.arange(self.num_edges, device=self.device)
                    self._dst_index = (torch.searchsorted(self.indptr.to(torch.int64), positions, right=True)
                                       - 1).to(self.indices.dtype)
                else:
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

    def degree_bound(self, source_major: bool = False) -> Optional[int]:
        """An upper bound on the longest destination row (or source row), known on the host
        without a synchronisation; None when the graph was built without it (e.g. a trusted
        CSR on a GPU). Work lists use it to skip their sizing sync when no row is long."""
        return self._degree_bounds[1 if source_major else 0]

    def num_self_loops(self) -> int:
        """How many edges have source == target (known from the build, else one host sync)."""
        if self._num_self_loops is None:
            if self.num_edges == 0:
                self._num_self_loops = 0
            else:
                self._num_self_loops = int((self.indices == self.dst_index()).sum())
        return self._num_self_loops

    def reverse_edges(self) -> Optional[Tensor]:
        """For a symmetric graph, int64 [M]: the CSR position of each CSR edge's reverse (the
        edge j -> i of edge i -> j; duplicates paired in CSR order, a self loop with itself);
        None when the graph is not symmetric (as a multiset of (src, dst) pairs; a bipartite
        graph, or a static one, never is). Detected once per graph and cached: in- against
        out-degrees first (one host read; most directed graphs stop there), then two sorts and
        one more read. It reads back to the host, so callers on a per-step path ask only for
        graphs that outlive a step (:meth:`gnn_fastpath.cuda.spmm.SpmmCache.undirected`).
        Backward passes of undirected graphs can walk the forward CSR through it instead of a
        transpose (:meth:`is_symmetric`)."""
        def build():
            if self.n_src != self.n_dst or self._static:
                return None
            m = self.num_edges
            if m == 0:
                return torch.empty(0, dtype=torch.int64, device=self.device)
            if not bool(torch.equal(self.in_degree().to(torch.int64), self.out_degree().to(torch.int64))):
                return None
            n = self.n_dst
            dst = self.dst_index().to(torch.int64)
            src = self.indices.to(torch.int64)
            forward = torch.sort(dst * n + src, stable=True)
            reverse = torch.sort(src * n + dst, stable=True)
            if not bool(torch.equal(forward.values, reverse.values)):
                return None
            rev = torch.empty(m, dtype=torch.int64, device=self.device)
            rev[forward.indices] = reverse.indices
            return rev

        return self.memo("reverse_edges", build)

    def reverse_edges_if_cheap(self, detect: bool = False) -> Optional[Tensor]:
        """:meth:`reverse_edges` where knowing it costs no host read on a per-step path: when
        symmetry is already known, or ``detect`` (a caller that chose to pay the detection),
        or the graph outlived a step (:meth:`outlived_a_step`: the reads pay over the steps
        that follow; a sampled batch's graph never does); else None, as for a directed graph."""
        reverse = self._memo.get("reverse_edges", _UNKNOWN)
        if reverse is not _UNKNOWN:
            return reverse
        return self.reverse_edges() if detect or self.outlived_a_step() else None

    def is_symmetric(self) -> bool:
        """Whether every edge i -> j has a reverse j -> i, counted with multiplicity (see
        :meth:`reverse_edges`)."""
        return self.reverse_edges() is not None

    def memo(self, key, build):
        """Cache ``build()`` under ``key`` for this graph's lifetime (derived, per-graph data)."""
        try:
            return self._memo[key]
        except KeyError:
            with _normal_tensors():
                value = self._memo[key] = build()
            return value

    def memo_get(self, key, default=None):
        """What :meth:`memo` (or :meth:`memo_set`) keeps under ``key``, or ``default``."""
        return self._memo.get(key, default)

    def memo_set(self, key, value) -> None:
        """Keep ``value`` under ``key`` (a value decided elsewhere, e.g. a tuned choice)."""
        self._memo[key] = value

    def note_pass(self, event: str) -> None:
        """Note a ``"forward"`` or ``"backward"`` kernel pass on this graph: a forward after a
        backward is the next training step (layers of one step run every forward, then every
        backward), so the graph outlived a step (:meth:`outlived_a_step`). Kernel variants
        whose one-time set-up (a transpose, a block layout, symmetry detection) only pays on
        a graph used again ask this; a sampled batch's graph lives one step."""
        step = self.memo(_STEP, dict)  # one dict per graph, updated in place
        state = step.get("state")
        if event == "backward" and state is None:
            step["state"] = "backward"
        elif event == "forward" and state == "backward":
            step["state"] = "outlived"

    def outlived_a_step(self) -> bool:
        """Whether this graph was used in a forward after a backward (:meth:`note_pass`)."""
        return self._memo.get(_STEP, {}).get("state") == "outlived"

    # ------------------------------------------------------------------ derived data
    def degree_stats(self) -> DegreeStats:
        """Max and mean of the destination in-degrees (computed once)."""
        if self._stats is None:
            mean = self.num_edges / self.n_dst if self.n_dst else 0.0
            if self._bounds_exact and self._degree_bounds[0] is not None:
                self._stats = DegreeStats(self._degree_bounds[0], mean)
            elif self.n_dst == 0:
                self._stats = DegreeStats(0, 0.0)
            else:
                self._stats = DegreeStats(int(self.in_degree().max()), mean)
        return self._stats

    def source_csr(self) -> SourceCSR:
        """The source-major CSR (transpose), built on first use and cached.

        An undirected graph (:meth:`reverse_edges`) is its own transpose: its rows and column
        ids are the forward CSR's (shared, not copied), and ``csr_pos`` is the reverse edges'
        positions: the rows and entries that sorting the transpose gives, in the forward CSR's
        order within a row (sorted by column, duplicates in CSR order, unless the graph was
        built from edges already grouped by destination, whose rows keep the caller's order;
        the kernels only sum over a row, so at most the order of float sums differs), and
        every source-major pass runs without the sort or the copies. That needs symmetry known: detected already (by a caller that asked,
        e.g. the SpMM backward of a graph that outlived a step), or detected here for graphs
        of :data:`DETECT_SYMMETRY_FROM` edges or more, whose transpose costs far more than the
        detection's host read, and for graphs that outlived a step
        (:meth:`reverse_edges_if_cheap`); a smaller graph that lives one step (a sampled
        batch) is never checked here."""
        if self._source_csr is None:
            reverse = self.reverse_edges_if_cheap(detect=self.num_edges >= DETECT_SYMMETRY_FROM)
            if reverse is not None:
                self._source_csr = SourceCSR(self.indptr, self.indices, reverse)
            else:
                with _normal_tensors():
                    indptr, dst_sorted, order = _sort_into_csr(self.indices, self.dst_index(), self.n_src,
                                                               self.n_dst)
                self._source_csr = SourceCSR(indptr, dst_sorted, order)
        return self._source_csr

    def fits_int32(self) -> bool:
        """Whether int32 kernels can index this graph (fewer than 2**31 edges and nodes)."""
        return self.indices.numel() <= INT32_MAX and self.n_src <= INT32_MAX and self.n_dst <= INT32_MAX

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
            if s.indices is self.indices:  # undirected: the forward CSR's int32 copies serve both
                kc = self.kernel_csr()
                indptr, indices = kc.indptr, kc.indices
            else:
                indptr, indices = s.indptr.to(torch.int32), s.indices.to(torch.int32)
            return KernelSourceCSR(indptr, indices, self.perm[s.csr_pos].to(torch.int32), s.csr_pos.to(torch.int32))

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
                copy = Graph(*(_copy_to(t, device) for t in (self.indptr, self.indices, self.perm)),
                             self.n_src, self.n_dst)
            copy._stats = self._stats
            copy._sources_sorted = self._sources_sorted
            copy._set_facts(*self._degree_bounds, self._num_self_loops, exact=self._bounds_exact)
            self._device_copies[device] = copy
        return copy


def _copy_to(t: Tensor, device: torch.device) -> Tensor:
    """``t`` on ``device``; a CPU tensor goes to a GPU through pinned memory without blocking
    the host (torch's pinned-memory cache keeps the staging buffer alive until the copy ran)."""
    if t.device.type == "cpu" and device.type == "cuda" and t.numel():
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
