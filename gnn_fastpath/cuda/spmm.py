"""Launcher of the SpMM family (``spmm.cu`` and cuSPARSE): everything graph-specific cached.

Per Graph (``graph.memo``, so it all dies with the graph; a Graph is per device), a
:class:`SpmmCache` holds:

- the cuSPARSE CSR descriptor of the forward matrix A [n_dst, n_src] (int32 indices from
  ``graph.kernel_csr()``), its chosen algorithm per feature width (cuSPARSE's CSR
  algorithms, the own CSR kernel or, for 16-bit features on a locally dense matrix, the
  block-sparse tensor-core kernel (:mod:`gnn_fastpath.cuda.block_spmm`), whichever timed
  fastest) and its workspaces (:mod:`gnn_fastpath.cuda.cusparse`);
- the normalised edge values, ``values_k = c_dst[row] * w[perm[k]] * c_src[col]`` in CSR
  order (``spmm_edge_values``): one fp32 [M] per norm without edge weights; with edge
  weights, per weight tensor, keyed by (tensor identity through a weak reference,
  ``_version``, ``data_ptr``) and bounded to :data:`WEIGHTED_ENTRIES` tensors per norm (a
  training loop that builds a new weight tensor every step keeps only the newest). In-place
  writes through ``tensor.data`` do not bump ``_version`` and are not noticed: write weights
  in place under ``torch.no_grad()`` instead (what optimizers do);
- for the backward of an undirected graph (``graph.reverse_edges()``: symmetric, detected
  once per graph) whose values are symmetric too, from the graph's second training step on
  (:meth:`SpmmCache.undirected`: never a host read on a per-step path): nothing,
  dX = A^T dY = A dY on the forward matrix (the transposed matrix of the first backward is
  dropped);
- otherwise, for the backward of a graph that outlived a training step (or any graph with
  ``GNN_FASTPATH_SPMM_BWD=transposed``; :func:`backward_route`): the transposed matrix A^T
  [n_src, n_dst] on ``graph.kernel_source_csr()`` plus one fp32 [M] of transposed values per
  cached values entry; dX = A^T dY is then a plain non-transposed SpMM. In a graph's first
  step (a sampled batch's only one), or with ``flag``: nothing extra; cuSPARSE runs
  ``CUSPARSE_OPERATION_TRANSPOSE`` on A (into a float32 C cast once when dX is 16-bit: its
  transposed product adds into C with atomics).

The gradient w.r.t. the edge weights is the SDDMM
``dw_e = c_dst[row] c_src[col] <dY[row], X[col]>`` (``spmm_edge_grad``), in caller order.
PyG's gcn_norm edge values (``spmm_gcn_degree``, ``spmm_gcn_values``) live here too.

Dtypes: X float32, float16 or bfloat16; the result in X's dtype or float32 (the op's
``out_dtype``); dY in the result's dtype and dX in X's; edge weights are read as float32 and
the normalised values stay float32 for the own kernel (cuSPARSE gets a cached copy in X's
dtype, :class:`gnn_fastpath.cuda.cusparse.EdgeValues`); the SDDMM returns float32. Every
product and sum is float32; atomically merged partial sums of long rows go to float32 memory
(a scratch row per split row when the output is 16-bit, cast once: adding into 16-bit memory
would round at every atomic).
"""
from __future__ import annotations

import weakref
from collections import Counter, OrderedDict
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from .. import config
from . import block_spmm, launch, plans, segment_reduce, worklist
from .cusparse import CsrMatrix, EdgeValues, NoAlgorithm, fp32_values

SOURCE = "spmm.cu"
#: Threads per block of the lane-group kernels.
THREADS = 128
#: Bytes per vector access of 16-bit feature rows (launch.bytes16; GNN_FASTPATH_VEC16 overrides):
#: 8, i.e. the float32 lane layout with 4 halves per lane; 16-byte accesses do not pay off
#: for this family.
VEC16_BYTES = 8
#: Degree-scale codes of the kernels (``-D`` defines, so the .cu and this module agree).
SCALE_NONE, SCALE_INVERSE, SCALE_RSQRT = 0, 1, 2
KERNELS = launch.Family(SOURCE, {"SPMM_SCALE_NONE": SCALE_NONE, "SPMM_SCALE_INVERSE": SCALE_INVERSE,
                                 "SPMM_SCALE_RSQRT": SCALE_RSQRT})
#: (source scale, destination scale) per DGL norm.
SCALES = {"none": (SCALE_NONE, SCALE_NONE), "left": (SCALE_INVERSE, SCALE_NONE),
          "right": (SCALE_NONE, SCALE_INVERSE), "both": (SCALE_RSQRT, SCALE_RSQRT)}
#: CSR edges per lane group in the SDDMM (edge-weight gradient).
EDGES_PER_GROUP = 16
#: Edge-weight tensors whose values stay cached per (graph, norm).
WEIGHTED_ENTRIES = 2
#: Relative difference up to which an edge's value and its reverse's count as equal for the
#: undirected backward (A^T = A): a few float32 roundings, as normalised values of a symmetric
#: graph are computed in different orders for the two directions (c_dst * w * c_src).
SYMMETRY_RTOL = 2.0 ** -21
#: What was built, by kind (tests check that cached state is reused, not rebuilt).
build_counts: Counter = Counter()
MEMO_KEY = "spmm"


def own_spmm(indices: Tensor, indptr: Tensor, work, values, b: Tensor, c: Tensor) -> None:
    """c = A @ b with the own kernels: short rows whole (``spmm_rows``), the chunks of long
    rows (``work``: row chunks of A's rows) added atomically into zeroed float32 rows (c's own
    when c is float32, else a scratch cast into c by ``spmm_split_store``). ``values``:
    float32 (or :class:`EdgeValues`); b and c float32/float16/bfloat16."""
    values = fp32_values(values)
    F = b.size(1)
    device = b.device
    tb, tc = launch.ctype(b.dtype), launch.ctype(c.dtype)
    fcfg = launch.lane_groups(F, b, c, max_chunks=2, vec16_bytes=VEC16_BYTES)
    vec, lanes, chunks, fblocks = fcfg
    n_rows = indptr.numel() - 1 - work.n_split
    if n_rows:
        KERNELS.kernel(device, "spmm_rows", tb, tc, *fcfg[:3]).launch(
            launch.group_grid(n_rows, lanes, fblocks, THREADS), THREADS, indptr=indptr, indices=indices,
            values=values, rows=work.whole_rows if work.n_split else None, n_rows=n_rows, x=b, F=F, out=c)
    if work.n_split:
        grid = launch.group_grid(work.n_split_items, lanes, fblocks, THREADS)
        if c.dtype == torch.float32:
            c.index_fill_(0, work.split_rows, 0.0)
            KERNELS.kernel(device, "spmm_chunks", tb, *fcfg[:3], False).launch(
                grid, THREADS, items=work.items, n_items=work.n_split_items, indices=indices, values=values, x=b,
                F=F, out=c)
        else:
            scratch = torch.zeros(work.n_split, F, dtype=torch.float32, device=device)
            KERNELS.kernel(device, "spmm_chunks", tb, *fcfg[:3], True).launch(
                grid, THREADS, items=work.items, n_items=work.n_split_items, indices=indices, values=values, x=b,
                F=F, out=scratch)
            KERNELS.kernel(device, "spmm_split_store", tc).launch(
                launch.cdiv(work.n_split * F, 256), 256, scratch=scratch, split=work.split, n_split=work.n_split,
                F=F, out=c)


class _Values:
    """Normalised edge values of one (norm, weight) (float32, plus the 16-bit copies cuSPARSE
    asks for) and, lazily, their transposed order."""

    def __init__(self, values: Tensor, ref=None):
        self.values = EdgeValues(values)
        self.ref = ref
        self._transposed: Optional[EdgeValues] = None
        self._symmetric: Optional[bool] = None
        self.backwards = 0  # backward passes that used this entry (see SpmmCache.undirected())
        self.reused = False  # a forward used it after one of them

    def symmetric(self, reverse: Tensor) -> bool:
        """Whether every edge's value equals its reverse edge's (``reverse``: the graph's
        :meth:`~gnn_fastpath.graph.Graph.reverse_edges`) up to :data:`SYMMETRY_RTOL`: then
        A^T = A. One host read per entry."""
        if self._symmetric is None:
            v = self.values.fp32
            self._symmetric = bool(torch.allclose(v, v.index_select(0, reverse), rtol=SYMMETRY_RTOL, atol=0.0))
            build_counts["symmetry_check"] += 1
        return self._symmetric

    def transposed(self, cache: "SpmmCache") -> EdgeValues:
        if self._transposed is None:
            self._transposed = EdgeValues(self.values.fp32.index_select(0, cache.transposed_positions()))
            build_counts["values_t"] += 1
        return self._transposed


class SpmmCache:
    """Everything SpMM keeps for one Graph (see the module docstring)."""

    def __init__(self, graph):
        kc = graph.kernel_csr()
        self._graph = weakref.ref(graph)  # the cache lives in graph.memo: no reference cycle
        self.kc = kc
        self.n_src, self.n_dst = graph.n_src, graph.n_dst
        self.csr = _matrix(self._graph, kc, graph.n_dst, graph.n_src, False)
        self._csr_t: Optional[CsrMatrix] = None
        self._unweighted = {}
        self._weighted = {}
        build_counts["csr"] += 1

    def out_degree(self) -> Tensor:
        graph = self._graph()
        return graph.memo(("spmm", "out_degree_int32"), lambda: graph.out_degree().to(torch.int32))

    def edge_values(self, norm: str, w: Optional[Tensor]) -> Tensor:
        """values [M] float32 in CSR order: c_dst[row] * w[perm] * c_src[col] (w float32)."""
        src_mode, dst_mode = SCALES[norm]
        m = self.kc.indices.numel()
        values = torch.empty(m, dtype=torch.float32, device=self.kc.indices.device)
        if m:
            KERNELS.kernel(values.device, "spmm_edge_values").launch(
                launch.cdiv(m, 256), 256, indptr=self.kc.indptr, indices=self.kc.indices, perm=self.kc.perm,
                out_deg=self.out_degree() if src_mode != SCALE_NONE else None, w=w, n_rows=self.n_dst,
                n_edges=m, src_mode=src_mode, dst_mode=dst_mode, values=values)
        return values

    def values(self, norm: str, edge_weight: Optional[Tensor]) -> _Values:
        if edge_weight is None:
            entry = self._unweighted.get(norm)
            if entry is None:
                entry = self._unweighted[norm] = _Values(self.edge_values(norm, None))
                build_counts["values"] += 1
            return entry
        lru = self._weighted.setdefault(norm, OrderedDict())
        key = (id(edge_weight), edge_weight._version, edge_weight.data_ptr())
        entry = lru.get(key)
        if entry is not None and entry.ref() is edge_weight:
            lru.move_to_end(key)
            return entry
        w = edge_weight.detach().to(torch.float32).contiguous()  # the kernels read weights as float32
        entry = _Values(self.edge_values(norm, w), weakref.ref(edge_weight))
        lru[key] = entry
        lru.move_to_end(key)
        while len(lru) > WEIGHTED_ENTRIES:
            lru.popitem(last=False)
        build_counts["values_weighted"] += 1
        return entry

    def undirected(self, entry: _Values, norm: str) -> bool:
        """Whether A^T = A for ``entry``'s values, decided without a host read on any per-step
        path. Only a graph used again after a backward (a forward that follows a backward: the
        next training step) is checked, so a graph that lives one step (a sampled batch, however
        many layers share it) never is; then it must be symmetric (detected once per graph, two
        host reads at most: :meth:`~gnn_fastpath.graph.Graph.reverse_edges`) and its values
        symmetric: by construction without edge weights for norm none or both, else checked once
        for a weights entry that is itself used again (weights made anew every step never are).
        The backward then multiplies by A itself, and the transposed matrix is dropped."""
        entry.backwards += 1
        graph = self._graph()
        if not graph.outlived_a_step():
            return False
        reverse = graph.reverse_edges()
        if reverse is None:
            return False
        if entry.ref is None:  # c_dst[row] * c_src[col] with in- = out-degree: equal both ways
            return norm in ("none", "both")
        return entry.reused and entry.symmetric(reverse)

    def note_forward(self, entry: _Values) -> None:
        """A forward on this graph (and entry): after a backward, that is the next step."""
        self._graph().note_pass("forward")
        if entry.backwards:
            entry.reused = True

    def drop_transposed(self, entry: _Values) -> None:
        """Free what the undirected backward no longer needs."""
        self._csr_t = None
        entry._transposed = None

    def transposed(self) -> CsrMatrix:
        """A^T on the graph's int32 source-major CSR, built once per graph."""
        if self._csr_t is None:
            graph = self._graph()
            sc = graph.kernel_source_csr()
            self._csr_t = _matrix(self._graph, sc, self.n_src, self.n_dst, True)
            build_counts["csr_t"] += 1
        return self._csr_t

    def transposed_positions(self) -> Tensor:
        return self._graph().kernel_source_csr().csr_pos


def _own_kernel(graph_ref, csr, source_major: bool):
    """The CsrMatrix's own-kernel callback. Its work list (the min/max kernels' list: same rows,
    same split; cached with the graph) is built on the first own-kernel product only: when
    cuSPARSE serves the matrix, as for most graphs of a size class whose timed choice was a
    cuSPARSE algorithm, a sampled graph never pays for it (a degree sort, and a host sync when
    a row is long enough to split). ``graph_ref`` is a weak reference: the cache lives in the
    graph's memo."""
    def run(values, b, c):
        work = segment_reduce.row_chunks(graph_ref(), source_major=source_major)
        own_spmm(csr.indices, csr.indptr, work, values, b, c)

    return run


#: Edges per virtual row of a static matrix (:class:`OwnMatrix`).
VIRTUAL_ROW_EDGES = 128


#: The virtual rows of a static A (forward) and of A^T (backward, on the source-major CSR).
PIECES = (worklist.StaticGeometry("virtual_rows", VIRTUAL_ROW_EDGES),
          worklist.StaticGeometry("virtual_rows", VIRTUAL_ROW_EDGES, source_major=True))


def static_geometry() -> Tuple[worklist.StaticGeometry, ...]:
    """The work lists a static graph's products read (what the operators are handed)."""
    return PIECES


#: The work list of a CSR walked as whole rows (no row split): what ``own_spmm`` takes for
#: virtual rows, which are short by construction.
_WHOLE_ROWS = worklist.RowChunks(*(torch.empty(0, dtype=torch.int32),) * 4, 0, 0, 0)


class OwnMatrix:
    """A CSR matrix served by the own kernels only: what a static Graph (built inside a custom
    operator, see :mod:`gnn_fastpath.graph.tensors`) uses, since choosing a cuSPARSE algorithm
    times candidates on the host and a CUDA graph must not record that. No transposed product:
    the backward takes the explicit transposed matrix.

    Launch geometry from shapes alone: rows are cut into virtual rows of at most
    :data:`VIRTUAL_ROW_EDGES` edges (:func:`~gnn_fastpath.cuda.worklist.virtual_rows`), whose float32 partial sums are
    added into the result rows by ``index_add_``; so a super row (a hub source's row in the
    transposed product) is spread over many lane groups, as the degree-aware work
    list does for cached graphs, without the host read that sizes that list."""

    def __init__(self, indptr: Tensor, indices: Tensor, n_rows: int, pieces: Callable[[], Tuple[Tensor, Tensor]]):
        self.indptr, self.indices, self.n_rows = indptr, indices, n_rows
        self._pieces = pieces  # the virtual rows (the graph's static geometry), asked on first use
        self._virtual: Optional[Tuple[Tensor, Tensor]] = None

    def matmul(self, values, b: Tensor, c: Tensor, transpose: bool = False) -> Tensor:
        if transpose:
            raise NoAlgorithm("the own kernels take no transposed product")
        if self._virtual is None:
            vindptr, owner = self._pieces()
            self._virtual = vindptr, owner.clamp(max=max(self.n_rows - 1, 0))  # the empty tail adds 0
        vindptr, owner = self._virtual
        partial = torch.empty(owner.numel(), b.size(1), dtype=torch.float32, device=b.device)
        own_spmm(self.indices, vindptr, _WHOLE_ROWS, values, b, partial)
        if c.dtype == torch.float32:
            c.zero_().index_add_(0, owner, partial)
        else:
            c.copy_(torch.zeros(c.shape, dtype=torch.float32, device=c.device).index_add_(0, owner, partial))
        return c


class _BlockKernel:
    """The CsrMatrix's block-sparse candidate (:mod:`gnn_fastpath.cuda.block_spmm`): the layout
    is built on the first timed call (two host reads, inside the timed search) and kept only
    if the matrix is dense enough and the kernel won the timing."""

    def __init__(self, csr, n_rows: int, n_cols: int):
        self.csr, self.n_rows, self.n_cols = csr, n_rows, n_cols
        self.layout = None
        self.unsuited = False

    def offered(self, b: Tensor, c: Tensor) -> bool:
        return not self.unsuited and block_spmm.supported(b, c)

    def __call__(self, values: Tensor, b: Tensor, c: Tensor) -> None:
        if self.layout is None:
            if self.unsuited:
                raise NoAlgorithm("the block-sparse layout of this matrix is too sparse")
            if config.setting("GNN_FASTPATH_SPMM_ALG") == "block":  # forced: whatever the sharing
                self.layout = block_spmm.BlockLayout(self.csr.indptr, self.csr.indices, self.n_rows, self.n_cols)
            else:
                self.layout = block_spmm.layout_if_dense(self.csr.indptr, self.csr.indices, self.n_rows,
                                                         self.n_cols)
            build_counts["block_layout"] += 1
            if self.layout is None:
                self.unsuited = True
                raise NoAlgorithm("the block-sparse layout of this matrix is too sparse")
        block_spmm.matmul(self.layout, values, b, c)

    def release(self) -> None:
        self.layout = None


def _matrix(graph_ref, csr, n_rows: int, n_cols: int, source_major: bool):
    """The product's matrix: cuSPARSE with the own CSR kernel and (16-bit features) the
    block-sparse kernel as timed candidates, or the own kernel alone on a static graph."""
    if graph_ref().static:
        spec = PIECES[int(source_major)]
        return OwnMatrix(csr.indptr, csr.indices, n_rows, lambda: worklist.static_geometry(graph_ref(), spec))
    return CsrMatrix(csr.indptr, csr.indices, n_rows, n_cols, _own_kernel(graph_ref, csr, source_major),
                     _BlockKernel(csr, n_rows, n_cols))


def cache_of(graph) -> SpmmCache:
    """The SpmmCache of ``graph`` (built on first use, kept in ``graph.memo``)."""
    cache = graph.memo_get(MEMO_KEY)
    return cache if cache is not None else graph.memo(MEMO_KEY, lambda: SpmmCache(graph))


#: Settings the forward's and the backward's plans read (part of their keys).
FORWARD_SETTINGS = ("GNN_FASTPATH_SPMM_ALG", "GNN_FASTPATH_SPMM_CUSTOM") + plans.TUNE_SETTINGS
BACKWARD_SETTINGS = ("GNN_FASTPATH_SPMM_BWD", "GNN_FASTPATH_SPMM_ALG", "GNN_FASTPATH_VEC16")


def plan_forward(graph, x: Tensor, out: Tensor) -> plans.Plan:
    """The forward's plan: ``"own"`` on a static graph (:class:`OwnMatrix`), the algorithm
    ``GNN_FASTPATH_SPMM_ALG`` forces, else ``"searched"``: the matrix's timed algorithm search
    (:class:`gnn_fastpath.cuda.cusparse.CsrMatrix`, which measures on the matrix itself and
    keeps its choice per width and dtypes, like the tuner's measured choices)."""
    key = (x.size(1), plans.layout(x, out), plans.snapshot(*FORWARD_SETTINGS), graph.static)

    def build():
        if graph.static:
            return plans.Plan("spmm.forward", "own", "fixed", rule="own")
        forced = config.setting("GNN_FASTPATH_SPMM_ALG")
        if forced:
            return plans.Plan("spmm.forward", forced, "setting", rule=forced)
        return plans.Plan("spmm.forward", "searched", "tuner", rule="default",
                          params=(("own_kernel_timed", bool(config.setting("GNN_FASTPATH_SPMM_CUSTOM"))),))

    return plans.resolve(graph, "spmm.forward", key, build)


#: Graphs up to this many edges take cuSPARSE's transpose flag in their first training step
#: (``GNN_FASTPATH_SPMM_BWD=auto``). A bound, not a measured crossover: it keeps the flag's
#: atomic product to batch-sized graphs, where host time dominates; larger graphs build the
#: transpose at once, as before the rule.
FLAG_FIRST_STEP_MAX_EDGES = 1 << 22


def backward_route(graph) -> str:
    """``"transposed"`` or ``"flag"`` for dX = A^T dY on ``graph`` (``GNN_FASTPATH_SPMM_BWD``
    forces one). The rule (``auto``): the flag while the graph has not outlived a training step
    (:meth:`~gnn_fastpath.graph.Graph.outlived_a_step`) and has at most
    :data:`FLAG_FIRST_STEP_MAX_EDGES` edges, else the transpose. Building the transpose (a sort
    of the edges and its row offsets) costs host time that a sampled batch, which lives one
    step, never earns back; a graph used again builds it in its second step and keeps it. A
    static graph (:class:`OwnMatrix`, no cuSPARSE) and a multigraph with more edges than matrix
    entries, which cuSPARSE cannot describe, always take the transpose; so does ``auto`` where
    ``GNN_FASTPATH_SPMM_ALG`` forces the own or the block kernel, which run no transposed
    product."""
    setting = config.setting("GNN_FASTPATH_SPMM_BWD")
    if graph.static or graph.num_edges > graph.n_src * graph.n_dst:
        return "transposed"
    if setting != "auto":
        return setting
    if config.setting("GNN_FASTPATH_SPMM_ALG") in ("custom", "block"):  # forced own kernels: no flag product
        return "transposed"
    first_step = not graph.outlived_a_step() and graph.num_edges <= FLAG_FIRST_STEP_MAX_EDGES
    return "flag" if first_step else "transposed"


def plan_backward(graph, grad_out: Tensor, x: Optional[Tensor], need_dw: bool) -> plans.Plan:
    """The backward's plan: dX = A^T dY on the explicit cached transpose (``"transposed"``) or
    by cuSPARSE's transpose flag (``"flag"``), by :func:`backward_route`. (An undirected graph
    used again multiplies by A itself instead, decided per call from its values entry:
    :meth:`SpmmCache.undirected`.) ``vec16_bytes``: the vector width of the edge-weight
    gradient's 16-bit rows."""
    key = (grad_out.size(1), plans.layout(grad_out, x if need_dw else None), plans.snapshot(*BACKWARD_SETTINGS),
           graph.outlived_a_step())

    def build():
        setting = config.setting("GNN_FASTPATH_SPMM_BWD")
        variant = backward_route(graph)
        return plans.Plan("spmm.backward", variant, "setting" if variant == setting else "rule", rule=variant,
                          params=(("vec16_bytes", launch.bytes16(VEC16_BYTES)),))

    return plans.resolve(graph, "spmm.backward", key, build)


def forward(graph, x: Tensor, edge_weight: Optional[Tensor], norm: str, out: Tensor):
    """out [n_dst, F] = A x for contiguous x [n_src, F] (float32/float16/bfloat16) into
    ``out`` (x's dtype or float32); returns the values entry used (the backward needs it)."""
    plans.run(graph, plan_forward(graph, x, out))
    cache = cache_of(graph)
    entry = cache.values(norm, edge_weight)
    cache.note_forward(entry)
    cache.csr.matmul(entry.values, x, out)
    return entry


def backward(graph, entry: _Values, norm: str, x: Optional[Tensor], grad_out: Tensor, need_dx: bool,
             need_dw: bool, dx_dtype: Optional[torch.dtype] = None) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """(dx [n_src, F] in ``dx_dtype`` (x's; default grad_out's) or None, dw [M] float32 in
    caller order or None); ``x`` is needed for dw only."""
    cache = cache_of(graph)
    plan = plans.run(graph, plan_backward(graph, grad_out, x, need_dw))
    graph.note_pass("backward")
    dx = dw = None
    if need_dx:
        dx = torch.empty(cache.n_src, grad_out.size(1), dtype=dx_dtype or grad_out.dtype, device=grad_out.device)
        _transposed_product(cache, entry, norm, grad_out, dx, plan.variant)
    if need_dw:
        dw = edge_weight_grad(cache, norm, grad_out, x, plan.vec16_bytes)
    return dx, dw


def _transposed_product(cache: SpmmCache, entry: _Values, norm: str, grad_out: Tensor, dx: Tensor,
                        route: str) -> None:
    """dx = A^T grad_out: A itself where A^T = A (:meth:`SpmmCache.undirected`; the transposed
    matrix is then dropped), else ``route`` (the plan's, :func:`plan_backward`): the explicit
    transposed matrix or cuSPARSE's transpose flag."""
    if cache.undirected(entry, norm):
        cache.drop_transposed(entry)
        cache.csr.matmul(entry.values, grad_out, dx)
        return
    transposed = route == "transposed"
    if not transposed:
        try:
            cache.csr.matmul(entry.values, grad_out, dx, transpose=True)
        except NoAlgorithm:  # cuSPARSE takes no transposed product of these dtypes
            transposed = True
    if transposed:
        cache.transposed().matmul(entry.transposed(cache), grad_out, dx)


def edge_weight_grad(cache: SpmmCache, norm: str, grad_out: Tensor, x: Tensor,
                     vec16_bytes: Optional[int] = None) -> Tensor:
    """dw [M] float32 in caller order: c_dst[row] * c_src[col] * <grad_out[row], x[col]>
    (grad_out and x in their own dtypes, float32 products and sums); ``vec16_bytes``: the
    plan's 16-bit vector width (None: ``GNN_FASTPATH_VEC16`` or :data:`VEC16_BYTES`)."""
    src_mode, dst_mode = SCALES[norm]
    kc = cache.kc
    m = kc.indices.numel()
    F = x.size(1)
    fcfg = launch.lane_groups(F, grad_out, x, vec16_bytes=launch.bytes16(VEC16_BYTES) if vec16_bytes is None
                              else vec16_bytes, resolved=True)
    vec, lanes, chunks, fblocks = fcfg
    accumulate = fblocks > 1
    dw = (torch.zeros if accumulate or F == 0 else torch.empty)(m, dtype=torch.float32, device=x.device)
    if m == 0 or F == 0:
        return dw
    groups = launch.cdiv(m, EDGES_PER_GROUP)
    KERNELS.kernel(x.device, "spmm_edge_grad", launch.ctype(grad_out.dtype), launch.ctype(x.dtype), *fcfg[:3]).launch(
        launch.group_grid(groups, lanes, fblocks, THREADS), THREADS, indptr=kc.indptr, indices=kc.indices,
        perm=kc.perm, out_deg=cache.out_degree() if src_mode != SCALE_NONE else None, n_rows=cache.n_dst,
        n_edges=m, src_mode=src_mode, dst_mode=dst_mode, grad_out=grad_out, x=x, F=F, epg=EDGES_PER_GROUP,
        accumulate=int(accumulate), dw=dw)
    return dw


def gcn_norm(graph, w: Optional[Tensor], fill: float) -> Tensor:
    """PyG gcn_norm edge values [M] in caller order (see ops.gcn_norm_values); float32 from
    float32 weights ``w`` (or None)."""
    kc = graph.kernel_csr()
    n, m = graph.n_dst, graph.num_edges
    device = kc.indices.device
    dinv = torch.empty(n, dtype=torch.float32, device=device)
    out = torch.empty(m, dtype=torch.float32, device=device)
    if n:
        KERNELS.kernel(device, "spmm_gcn_degree").launch(
            launch.cdiv(n * 32, 256), 256, indptr=kc.indptr, indices=kc.indices, perm=kc.perm, w=w, n_rows=n,
            fill=fill, dinv=dinv)
    if m:
        KERNELS.kernel(device, "spmm_gcn_values").launch(
            launch.cdiv(m, 256), 256, indptr=kc.indptr, indices=kc.indices, perm=kc.perm, w=w, n_rows=n,
            n_edges=m, fill=fill, dinv=dinv, out=out)
    return out
