"""Row chunks: the one work list every kernel family walks.

A CSR row (a destination's in-edges, or a source's out-edges for a source-major pass) is
one work item, except long rows, which are cut into chunks of ``chunk`` edges so that no
warp or lane group walks a super node alone; the chunks' partial results are merged
afterwards (attention: a merge kernel over per-chunk workspace slots; min/max and SpMM:
atomics into the row). Built on the GPU once per graph and cached with it
(:func:`for_graph`). Building synchronises with the host once, to size the chunk list, unless
the graph knows on the host that no row is long enough to split (sampled mini-batches: a
fan-out bounds every destination row), which costs no synchronisation at all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

#: What the fourth field of a split row's chunk items holds.
TAGS = ("slot", "split_row")
#: How whole rows are ordered after the chunks: by row id, or longest first.
ORDERS = ("row", "degree")


@dataclass(frozen=True)
class RowChunks:
    """Work items over the rows of one CSR.

    Attributes:
        items: int32 [n_items, 4] = (row, edge begin, edge end, tag). The first
            ``n_split_items`` are chunks of split rows; their tag is the chunk's workspace
            slot (``tag="slot"``: slots of one row are consecutive) or the index of its row
            in ``split_rows`` (``tag="split_row"``). Every other row follows as one item with
            tag -1 (rows without edges included: they write zeros).
        split: int32 [n_split, 4] = (row, first slot, number of chunks, 0) per split row.
        split_rows: int64 [n_split], the split rows (for zeroing before atomic merges).
        whole_rows: int32 [n_rows - n_split], the rows done in one item, in item order.
        n_items, n_split_items, n_split: host counts.
        split_mask, slot_split: only in a static list (:func:`build_static`, where the split
            rows are not counted on the host): bool [n_rows], which rows are split, and int32
            [n_slots], the row of each chunk slot.
        skips_last_row: the last row's edges are in no item (its item is empty): a static
            list over a graph whose last row is the extra row of removed edges
            (:class:`StaticGeometry`, :data:`SKIP_LAST_ROW`). A launcher zeroes what it writes
            per edge (nothing visits those edges) and walks destinations only: the
            source-major CSR still holds the removed edges, and their empty row's ``lse`` is
            -inf.
    """

    items: Tensor
    split: Tensor
    split_rows: Tensor
    whole_rows: Tensor
    n_items: int
    n_split_items: int
    n_split: int
    split_mask: Optional[Tensor] = None
    slot_split: Optional[Tensor] = None
    skips_last_row: bool = False

    @property
    def static(self) -> bool:
        """Built by :func:`build_static`: sizes from shapes, split rows marked by ``split_mask``."""
        return self.split_mask is not None

    @property
    def n_slots(self) -> int:
        """Chunk workspace slots (one per chunk of a split row)."""
        return self.n_split_items


def build(indptr: Tensor, chunk: int, split_from: int, *, order: str = "row", interleave: bool = False,
          tag: str = "slot", max_degree: Optional[int] = None) -> RowChunks:
    """Row chunks of the CSR with row offsets ``indptr`` (any integer dtype, on the GPU).

    Rows with at least ``split_from`` edges are cut into chunks of ``chunk`` edges.
    ``order``: whole rows by row id (``"row"``) or longest first (``"degree"``; split rows
    then also longest first, stably). ``interleave``: chunk items ordered chunk-major
    (first chunks of every split row, then second chunks, ...) so that items running
    together belong to different rows and their atomics rarely meet on one address.
    ``max_degree``: an upper bound on the longest row, known on the host (None: unknown);
    below ``split_from`` no row is split and nothing is read back.
    """
    if chunk < 1 or split_from < 1:
        raise ValueError(f"chunk and split_from must be >= 1, got {chunk} and {split_from}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    if tag not in TAGS:
        raise ValueError(f"tag must be one of {TAGS}, got {tag!r}")
    dev = indptr.device
    indptr = indptr.to(torch.int64)
    n_rows = max(indptr.numel() - 1, 0)
    # (begin, end) of every row: a view of indptr, so that a gather of it (or a copy) brings
    # both bounds of a row at once.
    bounds = indptr.as_strided((n_rows, 2), (indptr.stride(0), indptr.stride(0)))
    if max_degree is not None and max_degree < split_from:
        return _whole_rows_only(indptr, bounds, order)
    # the one host sync: how many rows are split and into how many chunks
    deg = indptr[1:] - indptr[:-1]
    is_split = deg >= split_from
    chunks_per_row = torch.where(is_split, (deg + chunk - 1) // chunk, 0)
    n_split, n_slots = torch.stack([is_split.sum(), chunks_per_row.sum()]).tolist()
    if not n_split:
        return _whole_rows_only(indptr, bounds, order, deg)
    # Split rows first, then whole rows, each ascending: a stable sort of the 0/1 flags
    # instead of two nonzero() calls (each of which would synchronise).
    rows = torch.sort((~is_split).to(torch.uint8), stable=True).indices
    split_rows, whole_rows = rows[:n_split], rows[n_split:]
    if order == "degree":  # longest first, stably (ties keep row order)
        split_rows = split_rows[torch.sort(deg[split_rows], descending=True, stable=True).indices]
        whole_rows = whole_rows[torch.sort(deg[whole_rows], descending=True, stable=True).indices]

    n_chunks = (deg[split_rows] + chunk - 1) // chunk
    first = torch.cumsum(n_chunks, 0) - n_chunks
    owner = torch.repeat_interleave(torch.arange(split_rows.numel(), device=dev), n_chunks, output_size=n_slots)
    slot = torch.arange(n_slots, device=dev)
    local = slot - first[owner]
    row = split_rows[owner]
    begin = indptr[row] + local * chunk
    end = torch.minimum(begin + chunk, indptr[row + 1])
    chunk_items = torch.stack([row, begin, end, slot if tag == "slot" else owner], 1)
    if interleave:
        chunk_items = chunk_items[torch.sort(local * split_rows.numel() + owner).indices]

    whole_rows = whole_rows.to(torch.int32)
    items = torch.empty(n_slots + whole_rows.numel(), 4, dtype=torch.int32, device=dev)
    items[:n_slots] = chunk_items
    _write_whole_items(items[n_slots:], whole_rows, bounds[whole_rows])
    split = torch.stack([split_rows, first, n_chunks, torch.zeros_like(split_rows)], 1).to(torch.int32).contiguous()
    return RowChunks(items, split, split_rows, whole_rows, items.shape[0], n_slots, split_rows.numel())


def _write_whole_items(out: Tensor, rows: Tensor, bounds: Tensor) -> None:
    """Write the items (row, begin, end, -1) of whole rows ``rows`` (int32) with their
    ``bounds`` (int64 [n, 2]) into ``out`` (int32 [n, 4]): column writes into one int32
    buffer instead of stacking int64 columns and converting the result."""
    out[:, 0] = rows
    out[:, 1:3] = bounds
    out[:, 3].fill_(-1)  # a Python scalar assigned would first become a tensor


def _whole_rows_only(indptr: Tensor, bounds: Tensor, order: str, deg: Optional[Tensor] = None) -> RowChunks:
    """:func:`build`'s list when no row is split (the sampled-batch case): one item per row,
    without the chunk machinery, whose tensors would all be empty. ``deg``: the row lengths
    when the caller has them (only ``order="degree"`` needs them)."""
    dev = indptr.device
    n_rows = bounds.shape[0]
    items = torch.empty(n_rows, 4, dtype=torch.int32, device=dev)
    if order == "degree":  # longest first, stably (ties keep row order)
        if deg is None:
            deg = indptr[1:] - indptr[:-1]
        rows = torch.sort(deg, descending=True, stable=True).indices
        whole_rows = rows.to(torch.int32)
        _write_whole_items(items, whole_rows, bounds[rows])
    else:  # every row in row order: the bounds are indptr's as they stand
        whole_rows = torch.arange(n_rows, dtype=torch.int32, device=dev)
        _write_whole_items(items, whole_rows, bounds)
    split = torch.empty(0, 4, dtype=torch.int32, device=dev)
    return RowChunks(items, split, torch.empty(0, dtype=torch.int64, device=dev), whole_rows, n_rows, 0, 0)


def for_graph(graph, chunk: int, split_from: int, *, source_major: bool = False, order: str = "row",
              interleave: bool = False, tag: str = "slot") -> RowChunks:
    """:func:`build` over ``graph``'s destination rows (or source rows), cached with the graph."""
    key = ("row_chunks", source_major, chunk, split_from, order, interleave, tag)

    def make():
        indptr = graph.source_csr().indptr if source_major else graph.indptr
        return build(indptr, chunk, split_from, order=order, interleave=interleave, tag=tag,
                     max_degree=graph.degree_bound(source_major))

    return graph.memo(key, make)


def build_static(indptr: Tensor, nnz: int, chunk: int, split_from: int, order: str = "row") -> RowChunks:
    """Row chunks of a CSR with ``nnz`` edges, sized from shapes alone (no host read): the
    work list of the attention families on a static graph (compiled path, CUDA graphs).

    As :func:`build`, rows with at least ``split_from`` edges are cut into chunks of
    ``chunk`` edges (``split_from > chunk``: a split row has >= 2 chunks), but nothing is
    counted on the host, so every count is its bound and the lists are padded:

    * ``items`` [cap, 4], ``cap = n_rows + nnz // chunk`` (a row of d edges gives at most
      ``1 + d // chunk`` items), rows in ``order`` (``"row"``: by id; ``"degree"``: longest
      first, stably, as :func:`build` orders them, by one sort on the device): a whole row as
      one item with tag -1, a split row's chunks (consecutive) with tag = the item's index,
      which is also its workspace slot (so ``n_slots = cap``); the unused tail is empty chunk
      items (edges 0..0) of the last row in that order, each with its own unused slot: they
      add nothing and write only their own slot;
    * ``split`` [n_rows, 4] = (row, first slot, chunks, 0) for every row, the split rows first,
      then the others with 0 chunks: merges stop at the first of those (``gf_merge_chunks``,
      ``dot_fwd_merge``, ``dot_sum_partials``);
    * ``split_mask`` bool [n_rows] and ``slot_split`` int32 [cap] (each slot's row), for the
      split-row accumulators of :mod:`gnn_fastpath.cuda.row_attention`.
    """
    if chunk < 1 or split_from <= chunk:
        raise ValueError(f"build_static needs 1 <= chunk < split_from, got {chunk} and {split_from}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    dev = indptr.device
    n_rows = indptr.numel() - 1
    cap = n_rows + nnz // chunk
    if n_rows == 0:
        empty = torch.empty(0, 4, dtype=torch.int32, device=dev)
        none = torch.empty(0, dtype=torch.int32, device=dev)
        return RowChunks(empty, empty, none.to(torch.int64), none, 0, 0, 0, torch.zeros(0, dtype=torch.bool, device=dev),
                         none)
    ip = indptr.to(torch.int64)
    deg = ip[1:] - ip[:-1]
    is_split = deg >= split_from
    pieces = torch.where(is_split, (deg + chunk - 1) // chunk, 1)
    rows = torch.arange(n_rows, device=dev)
    # the rows in item order: ``ranked[k]`` is the k-th row laid out (identity in row order)
    ranked = torch.sort(deg, descending=True, stable=True).indices if order == "degree" else None
    laid = pieces if ranked is None else pieces[ranked]
    ends = torch.cumsum(laid, 0)
    v = torch.arange(cap, device=dev)
    at = torch.clamp(torch.searchsorted(ends, v, right=True), max=n_rows - 1)  # each item's rank
    owner = at if ranked is None else ranked[at]
    first = ends - laid  # first slot, by rank, then by row
    if ranked is not None:
        first = torch.empty_like(first).scatter_(0, ranked, first)
    used = v < ends[-1:]
    begin = torch.minimum(ip[owner] + (v - first[owner]) * chunk, ip[owner + 1])
    end = torch.minimum(begin + chunk, ip[owner + 1])
    zero = torch.zeros_like(v)
    tag = torch.where(is_split[owner] | ~used, v, -1)
    items = torch.stack([owner, torch.where(used, begin, zero), torch.where(used, end, zero), tag], 1)
    split = torch.stack([rows, first, torch.where(is_split, pieces, 0), torch.zeros_like(rows)], 1)
    # the split rows' entries first: a merge stops at the first entry without chunks, so it
    # costs what the split rows need, not a pass over every row (longest first already ranks them)
    split = split[ranked if ranked is not None else torch.sort((~is_split).to(torch.uint8), stable=True).indices]
    return RowChunks(items.to(torch.int32).contiguous(), split.to(torch.int32).contiguous(), rows,
                     rows.to(torch.int32), cap, cap, n_rows, is_split, owner.to(torch.int32))


def virtual_rows(indptr: Tensor, nnz: int, chunk: int) -> Tuple[Tensor, Tensor]:
    """The rows of a CSR with ``nnz`` edges cut into rows of at most ``chunk`` edges, with
    static shapes and no host read.

    Returns (``vindptr`` int32 [cap + 1], ``owner`` int64 [cap]): virtual row ``v`` holds the
    CSR edges ``vindptr[v]:vindptr[v+1]`` of row ``owner[v]``. ``cap = n_rows + nnz // chunk``
    bounds the number of pieces (a row of d edges gives max(1, ceil(d / chunk)) <= 1 + d //
    chunk of them); the unused tail is empty rows at offset ``nnz`` owned by row ``n_rows``
    (one past the last: a caller scatters them into a spare row or clamps them).

    The static counterpart of :func:`build` for CUDA graphs (see
    :mod:`gnn_fastpath.graph.tensors`): the split is not sized on the host.
    """
    n_rows = indptr.numel() - 1
    ip = indptr.to(torch.int64)
    deg = ip[1:] - ip[:-1]
    pieces = torch.clamp((deg + chunk - 1) // chunk, min=1)
    ends = torch.cumsum(pieces, 0)
    v = torch.arange(n_rows + nnz // chunk, device=indptr.device)
    owner = torch.clamp(torch.searchsorted(ends, v, right=True), max=max(n_rows - 1, 0))
    local = v - (ends[owner] - pieces[owner])
    used = v < ends[-1:]
    begin = torch.where(used, torch.minimum(ip[owner] + local * chunk, ip[owner + 1]), nnz)
    vindptr = torch.cat([begin, ip[-1:]]).to(torch.int32)
    return vindptr, torch.where(used, owner, n_rows)


# ----------------------------------------------------------------------------------------
# Static geometry handed to the operators.

#: The kinds of :class:`StaticGeometry`.
KINDS = ("row_chunks", "virtual_rows")
#: What the name of a list without the extra row adds to its :attr:`StaticGeometry.name`.
SKIP_LAST_ROW = "/skip_last"


@dataclass(frozen=True)
class StaticGeometry:
    """A work list of a static graph (:func:`build_static` or :func:`virtual_rows` over one
    CSR), as the compiled path passes it to the custom operators.

    A static graph is rebuilt inside every operator call, so a launcher that built its work
    list there would rebuild it (a dozen to forty torch operations, each a launch and host
    time) in every call. Instead the op layer builds the lists its family's launchers read
    with :meth:`build` in the caller's traced code, once per step (AOTAutograd merges the same
    list of layers sharing a graph, and Inductor fuses its operations), and hands them to the
    operators as tensors (:meth:`gnn_fastpath.graph.tensors.GraphTensors.with_geometry`); a
    launcher asks :func:`static_geometry`, which finds them, or builds them where nobody did
    (an operator called directly).

    Attributes:
        kind: ``"row_chunks"`` (:func:`build_static` with ``split_from = chunk + 1``, the
            attention families' list) or ``"virtual_rows"`` (:func:`virtual_rows`, SpMM's and
            min/max's pieces).
        chunk: the edges per chunk or piece.
        source_major: over the source-major CSR instead of the destination-major one.
        order: the row order of a ``"row_chunks"`` list (:func:`build_static`).

    A destination-major ``"row_chunks"`` list can leave the last row empty
    (:attr:`can_skip_last_row`; ``build(..., skip_last_row=True)``, named :attr:`name` +
    :data:`SKIP_LAST_ROW`): the extra row of edges a layer removed
    (:func:`gnn_fastpath.graph.tensors.from_coo`). Their results are sliced off, so walking
    them is waste, and a long row is worse: split into chunks of ``chunk`` edges, each chunk
    is one warp's serial walk, many times a sampled batch's work per warp, and the launch
    waits for the slowest warp.
    """

    kind: str
    chunk: int
    source_major: bool = False
    order: str = "row"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"StaticGeometry.kind must be one of {KINDS}, got {self.kind!r}")

    @property
    def name(self) -> str:
        """What the operators name it by, e.g. ``"row_chunks/dst/256/degree"``."""
        return f"{self.kind}/{'src' if self.source_major else 'dst'}/{self.chunk}/{self.order}"

    @property
    def can_skip_last_row(self) -> bool:
        """Whether the list can leave the last row out (destination-major row chunks)."""
        return self.kind == "row_chunks" and not self.source_major

    def build(self, indptr: Tensor, nnz: int, skip_last_row: bool = False) -> Tuple[Tensor, ...]:
        """The list's tensors for the CSR with row offsets ``indptr`` and ``nnz`` edges
        (traceable: no host read); ``skip_last_row``: the last row's item left empty."""
        if skip_last_row and not self.can_skip_last_row:
            raise ValueError(f"{self.name}: only destination-major row_chunks lists skip the last row")
        if self.kind == "row_chunks":
            if skip_last_row and indptr.numel() > 1:  # the last row ends where it begins
                indptr = torch.cat([indptr[:-1], indptr[-2:-1]])
            w = build_static(indptr, nnz, self.chunk, self.chunk + 1, self.order)
            return w.items, w.split, w.split_rows, w.whole_rows, w.split_mask, w.slot_split
        return virtual_rows(indptr, nnz, self.chunk)

    def restore(self, tensors: Tuple[Tensor, ...], skips_last_row: bool = False):
        """What a launcher reads: a :class:`RowChunks` (counts from the shapes, as
        :func:`build_static` sets them) or ``(vindptr, owner)``."""
        if self.kind == "row_chunks":
            items, split, split_rows, whole_rows, split_mask, slot_split = tensors
            cap = items.shape[0]
            return RowChunks(items, split, split_rows, whole_rows, cap, cap, split.shape[0], split_mask, slot_split,
                             skips_last_row)
        return tuple(tensors)



def static_geometry(graph, spec: StaticGeometry):
    """``spec``'s work list for the static ``graph``: the one handed in with the operator's
    graph tensors (:func:`gnn_fastpath.graph.tensors.as_graph` keeps it in the graph's memo
    under ``("geometry", spec.name)``), or its variant without the extra row (under
    ``spec.name + SKIP_LAST_ROW``, which the caller hands in for a graph with one), else
    built here; restored once per graph."""

    def make():
        tensors = graph.memo_get(("geometry", spec.name))
        if tensors is not None:
            return spec.restore(tensors)
        if spec.can_skip_last_row:
            tensors = graph.memo_get(("geometry", spec.name + SKIP_LAST_ROW))
            if tensors is not None:
                return spec.restore(tensors, skips_last_row=True)
        indptr = graph.source_csr().indptr if spec.source_major else graph.indptr
        return spec.restore(spec.build(indptr, graph.num_edges))

    return graph.memo(("static_geometry", spec.name), make)
