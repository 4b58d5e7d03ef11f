"""Row chunks (``gnn_fastpath.cuda.worklist``) against a plain-Python oracle, on the CPU.

``worklist.build`` is torch code that runs on any device; the GPU tests of every kernel
family walk its lists on CUDA graphs.
"""
import random

import pytest
import torch

from gnn_fastpath import Graph
from gnn_fastpath.cuda import worklist


def _indptr(degrees):
    out = [0]
    for d in degrees:
        out.append(out[-1] + d)
    return out


def _degrees(seed, n, lo, hi, zeros=0, super_degree=0):
    rng = random.Random(seed)
    deg = [rng.randint(lo, hi) for _ in range(n)]
    for i in rng.sample(range(n), zeros):
        deg[i] = 0
    if super_degree:
        deg[rng.randrange(n)] = super_degree
    return deg


#: Row degrees: name -> list. Every config below splits from 2..8 edges on.
CASES = {
    "empty_rows": _degrees(1, 30, 0, 12, zeros=8),
    "one_super_row": _degrees(2, 25, 0, 4, zeros=3, super_degree=101),
    "all_split": _degrees(3, 12, 9, 30),
    "none_split": _degrees(4, 20, 0, 1),
    "boundaries": [5, 12, 0, 8, 1, 9, 4, 16, 7, 2, 3, 6, 11, 10, 13],  # every split_from, chunk multiples
    "no_edges": [0] * 7,
    "no_rows": [],
}
#: (chunk, split_from, order, interleave, tag): the families' shapes, scaled down
#: (GATv2: C, C+1, degree; dot: C, C+1, row; min/max and SpMM: interleaved, split_row),
#: plus rows split into a single chunk.
CONFIGS = {
    "gatv2": (4, 5, "degree", False, "slot"),
    "dot": (4, 5, "row", False, "slot"),
    "segment_reduce": (4, 8, "row", True, "split_row"),
    "single_chunks": (8, 2, "degree", True, "slot"),
}


def _oracle(indptr, chunk, split_from, order, interleave, tag):
    """(items, split, split_rows, whole_rows) as lists, from the layout the module documents."""
    n = len(indptr) - 1
    deg = [indptr[r + 1] - indptr[r] for r in range(n)]
    split_rows = [r for r in range(n) if deg[r] >= split_from]
    whole_rows = [r for r in range(n) if deg[r] < split_from]
    if order == "degree":  # longest first; sorted() is stable
        split_rows = sorted(split_rows, key=lambda r: -deg[r])
        whole_rows = sorted(whole_rows, key=lambda r: -deg[r])
    chunks, split, slot = [], [], 0
    for k, r in enumerate(split_rows):
        n_chunks = -(-deg[r] // chunk)
        split.append([r, slot, n_chunks, 0])
        for j in range(n_chunks):
            begin = indptr[r] + j * chunk
            chunks.append(((j, k), [r, begin, min(begin + chunk, indptr[r + 1]), slot if tag == "slot" else k]))
            slot += 1
    if interleave:  # chunk-major: every split row's first chunk, then every second chunk, ...
        chunks.sort(key=lambda c: c[0])
    items = [item for _, item in chunks] + [[r, indptr[r], indptr[r + 1], -1] for r in whole_rows]
    return items, split, split_rows, whole_rows


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("case", list(CASES))
def test_matches_oracle(case, config):
    chunk, split_from, order, interleave, tag = CONFIGS[config]
    indptr = _indptr(CASES[case])
    work = worklist.build(torch.tensor(indptr), chunk, split_from, order=order, interleave=interleave, tag=tag)
    items, split, split_rows, whole_rows = _oracle(indptr, chunk, split_from, order, interleave, tag)

    assert (work.items.dtype, work.split.dtype, work.split_rows.dtype, work.whole_rows.dtype) == (
        torch.int32, torch.int32, torch.int64, torch.int32)
    assert work.items.shape == (len(items), 4) and work.split.shape == (len(split), 4)
    assert work.items.tolist() == items
    assert work.split.tolist() == split
    assert work.split_rows.tolist() == split_rows
    assert work.whole_rows.tolist() == whole_rows
    n_split_items = sum(s[2] for s in split)
    assert (work.n_items, work.n_split_items, work.n_slots, work.n_split) == (
        len(items), n_split_items, n_split_items, len(split))

    # independent of the oracle: every edge in exactly one item, inside its own row; chunk
    # items first, at most `chunk` edges each; then each whole row once, in whole_rows order
    covered = [0] * indptr[-1]
    for row, begin, end, _ in items:
        assert indptr[row] <= begin <= end <= indptr[row + 1]
        for e in range(begin, end):
            covered[e] += 1
    assert all(c == 1 for c in covered)
    assert all(0 < end - begin <= chunk and t >= 0 for _, begin, end, t in items[:n_split_items])
    assert [it[0] for it in items[n_split_items:]] == whole_rows
    assert sorted(whole_rows + split_rows) == list(range(len(indptr) - 1))
    assert all(t == -1 for *_, t in items[n_split_items:])
    # any integer dtype of indptr gives the same list
    work32 = worklist.build(torch.tensor(indptr, dtype=torch.int32), chunk, split_from, order=order,
                            interleave=interleave, tag=tag)
    assert torch.equal(work32.items, work.items) and torch.equal(work32.split, work.split)


@pytest.mark.parametrize("order", worklist.ORDERS)
@pytest.mark.parametrize("seed", range(6))
def test_known_degree_bound_gives_the_sized_list(seed, order):
    """A host bound below split_from (no sizing read) gives exactly the list that counting
    the split rows gives, on random CSRs with empty rows and ties."""
    rng = random.Random(seed)
    deg = _degrees(seed, rng.randint(0, 40), 0, rng.randint(0, 9), zeros=0)
    indptr = torch.tensor(_indptr(deg), dtype=rng.choice([torch.int32, torch.int64]))
    split_from = max(deg, default=0) + rng.randint(1, 3)
    for max_degree in (max(deg, default=0), split_from - 1):
        for interleave, tag in ((False, "slot"), (True, "split_row")):
            fast = worklist.build(indptr, 4, split_from, order=order, interleave=interleave, tag=tag,
                                  max_degree=max_degree)
            sized = worklist.build(indptr, 4, split_from, order=order, interleave=interleave, tag=tag)
            items, split, split_rows, whole_rows = _oracle(indptr.tolist(), 4, split_from, order, interleave, tag)
            assert fast.items.tolist() == items and fast.whole_rows.tolist() == whole_rows
            assert split == split_rows == [] and fast.split.shape == (0, 4) and fast.split_rows.shape == (0,)
            for field in ("items", "split", "split_rows", "whole_rows"):
                a, b = getattr(fast, field), getattr(sized, field)
                assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) and a.is_contiguous()
            assert (fast.n_items, fast.n_split_items, fast.n_split) == (sized.n_items, 0, 0) == (len(deg), 0, 0)


def test_cases_are_what_they_say():
    def n_split(case, config="segment_reduce"):
        chunk, split_from, order, interleave, tag = CONFIGS[config]
        return worklist.build(torch.tensor(_indptr(CASES[case])), chunk, split_from, order=order).n_split

    assert 0 in CASES["empty_rows"] and 0 < n_split("empty_rows", "dot") < len(CASES["empty_rows"])
    assert n_split("one_super_row") == 1
    assert all(n_split("all_split", c) == len(CASES["all_split"]) for c in CONFIGS)
    assert all(n_split("none_split", c) == 0 for c in CONFIGS)


@pytest.mark.parametrize("tag", worklist.TAGS)
def test_tags(tag):
    indptr = _indptr(CASES["empty_rows"])
    work = worklist.build(torch.tensor(indptr), 3, 4, order="degree", interleave=True, tag=tag)
    chunk_items = work.items[: work.n_split_items].tolist()
    assert work.n_split >= 3
    for k, (row, first, n_chunks, zero) in enumerate(work.split.tolist()):
        assert row == work.split_rows[k] and zero == 0
        tags = [t for r, _, _, t in chunk_items if r == row]  # this row's chunks, in item order
        assert len(tags) == n_chunks == -(-(indptr[row + 1] - indptr[row]) // 3)
        if tag == "slot":  # consecutive workspace slots, the row's range in `split`
            assert tags == list(range(first, first + n_chunks))
        else:  # the index of the row in split_rows
            assert tags == [k] * n_chunks
    if tag == "slot":
        assert sorted(t for *_, t in chunk_items) == list(range(work.n_slots))


def test_degree_order_is_longest_first_and_stable():
    deg = CASES["empty_rows"]
    work = worklist.build(torch.tensor(_indptr(deg)), 3, 6, order="degree")
    for rows in (work.split_rows.tolist(), work.whole_rows.tolist()):
        keys = [(-deg[r], r) for r in rows]  # decreasing degree, ties by row id
        assert keys == sorted(keys) and len(set(deg[r] for r in rows)) < len(rows)  # ties occur
    plain = worklist.build(torch.tensor(_indptr(deg)), 3, 6, order="row")
    assert plain.whole_rows.tolist() == sorted(plain.whole_rows.tolist())
    assert plain.split_rows.tolist() == sorted(plain.split_rows.tolist())


def test_interleave_orders_chunks_chunk_major():
    indptr = _indptr([9, 2, 30, 0, 14, 5])
    work = worklist.build(torch.tensor(indptr), 4, 6, interleave=True, tag="split_row")
    local = [((b - indptr[r]) // 4, k) for r, b, _, k in work.items[: work.n_split_items].tolist()]
    assert local == sorted(local) and local[:3] == [(0, 0), (0, 1), (0, 2)]
    # without interleave, each split row's chunks are contiguous and in edge order
    rows = worklist.build(torch.tensor(indptr), 4, 6, tag="split_row").items[: work.n_split_items].tolist()
    assert [k for *_, k in rows] == sorted(k for *_, k in rows)
    assert [b for _, b, _, _ in rows] == sorted(b for _, b, _, _ in rows)


@pytest.mark.parametrize("kwargs", [dict(chunk=0), dict(split_from=0), dict(order="random"), dict(tag="row")])
def test_bad_arguments(kwargs):
    args = dict(chunk=4, split_from=5)
    args.update(kwargs)
    chunk, split_from = args.pop("chunk"), args.pop("split_from")
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        worklist.build(torch.tensor([0, 3, 10]), chunk, split_from, **args)


def test_for_graph_is_cached_per_graph_and_arguments():
    ei = torch.tensor([[0, 1, 2, 3, 3, 3, 3, 1], [1, 1, 1, 1, 0, 2, 0, 2]])
    graph = Graph.from_edge_index(ei, 4)
    work = worklist.for_graph(graph, 2, 3)
    assert worklist.for_graph(graph, 2, 3) is work
    assert work.items.tolist() == worklist.build(graph.indptr, 2, 3).items.tolist()
    source = worklist.for_graph(graph, 2, 3, source_major=True)
    assert source is not work and worklist.for_graph(graph, 2, 3, source_major=True) is source
    assert source.items.tolist() == worklist.build(graph.source_csr().indptr, 2, 3).items.tolist()
    assert worklist.for_graph(graph, 2, 3, tag="split_row") is not work
    assert worklist.for_graph(Graph.from_edge_index(ei, 4), 2, 3) is not work


# ------------------------------------------------------------------------- static lists
#: (chunk, split_from) of the attention families, scaled down: rows longer than chunk split.
STATIC_CONFIGS = {"chunk4": (4, 5), "chunk1": (1, 2), "chunk8": (8, 9)}


@pytest.mark.parametrize("config", list(STATIC_CONFIGS))
@pytest.mark.parametrize("case", list(CASES))
def test_static_list_matches_build(case, config):
    """build_static: the chunks of build()'s split rows and its whole rows, in row order, with
    the documented static padding; every size from shapes alone."""
    chunk, split_from = STATIC_CONFIGS[config]
    deg = CASES[case]
    indptr = _indptr(deg)
    n, nnz = len(deg), indptr[-1]
    work = worklist.build_static(torch.tensor(indptr, dtype=torch.int32), nnz, chunk, split_from)
    cap = n + nnz // chunk if n else 0
    assert work.static and (work.n_items, work.n_slots, work.n_split) == (cap, cap, n)
    assert work.items.shape == (cap, 4) and work.items.dtype == torch.int32
    assert work.split.shape == (n, 4) and work.slot_split.shape == (cap,)
    items = work.items.tolist()

    ref = worklist.build(torch.tensor(indptr), chunk, split_from, order="row")
    ref_split = {row: n_chunks for row, _, n_chunks, _ in ref.split.tolist()}
    assert work.split_mask.tolist() == [r in ref_split for r in range(n)]
    # used items: build's items as (row, begin, end), in row order; chunk items tagged with their
    # own index (= workspace slot), whole rows with -1
    expected = sorted((r, b, e) for r, b, e, _ in ref.items.tolist())
    got = [(r, b, e) for r, b, e, _ in items[: len(expected)]]
    assert got == expected
    for v, (row, begin, end, tag) in enumerate(items[: len(expected)]):
        assert tag == (v if row in ref_split else -1)
    # the padding tail: empty chunk items of the last row, each with its own slot
    for v, (row, begin, end, tag) in enumerate(items[len(expected):], start=len(expected)):
        assert (row, begin, end, tag) == (n - 1, 0, 0, v)
    # split entries: (row, first slot, chunks or 0), one per row, the split rows' first (merges stop
    # at the first entry without chunks); the first slot's item is the row's first chunk
    _assert_split_rows_first(work.split, n)
    for row, first, n_chunks, zero in work.split.tolist():
        assert zero == 0 and n_chunks == ref_split.get(row, 0)
        if n_chunks:
            assert [it[0] for it in items[first:first + n_chunks]] == [row] * n_chunks
            assert items[first][1] == indptr[row] and items[first + n_chunks - 1][2] == indptr[row + 1]
    # each used slot names its row
    assert [work.slot_split[v].item() for v in range(len(expected))] == [it[0] for it in items[: len(expected)]]


def _assert_split_rows_first(split, n: int) -> None:
    """One entry per row; every entry with chunks before every entry without."""
    rows, n_chunks = split[:, 0].tolist(), split[:, 2].tolist()
    assert sorted(rows) == list(range(n))
    assert n_chunks == sorted(n_chunks, key=lambda c: c == 0), n_chunks


@pytest.mark.parametrize("config", list(STATIC_CONFIGS))
@pytest.mark.parametrize("case", list(CASES))
def test_static_list_longest_first(case, config):
    """build_static(order="degree"): build()'s items in its longest-first order (split rows' chunks
    consecutive, each chunk tagged with its own index), the same split entries' chunk counts and
    the same rows split as in row order; the padding tail belongs to the last row laid out."""
    chunk, split_from = STATIC_CONFIGS[config]
    deg = CASES[case]
    indptr = _indptr(deg)
    n, nnz = len(deg), indptr[-1]
    t = torch.tensor(indptr, dtype=torch.int32)
    work = worklist.build_static(t, nnz, chunk, split_from, order="degree")
    by_row = worklist.build_static(t, nnz, chunk, split_from)
    cap = n + nnz // chunk if n else 0
    assert (work.n_items, work.n_slots, work.n_split) == (by_row.n_items, by_row.n_slots, by_row.n_split) == (cap, cap, n)
    assert torch.equal(work.split_mask, by_row.split_mask)
    items = work.items.tolist()
    used = sum(max(1, -(-d // chunk)) if d >= split_from else 1 for d in deg)
    rows_laid = []
    for row, _, _, _ in items[:used]:
        if not rows_laid or rows_laid[-1] != row:
            rows_laid.append(row)
    assert rows_laid == sorted(range(n), key=lambda r: -deg[r])  # longest first, ties by id (stable)
    assert sorted(tuple(it[:3]) for it in items[:used]) == sorted(tuple(it[:3]) for it in by_row.items.tolist()[:used])
    for v, (row, begin, end, tag) in enumerate(items[:used]):
        assert tag == (v if deg[row] >= split_from else -1)
    for v, (row, begin, end, tag) in enumerate(items[used:], start=used):
        assert (row, begin, end, tag) == (rows_laid[-1], 0, 0, v)
    _assert_split_rows_first(work.split, n)
    chunks_of = {row: n_chunks for row, _, n_chunks, _ in by_row.split.tolist()}
    for row, first, n_chunks, zero in work.split.tolist():
        assert zero == 0 and n_chunks == chunks_of[row]
        if n_chunks:
            assert [it[0] for it in items[first:first + n_chunks]] == [row] * n_chunks
            assert items[first][1] == indptr[row] and items[first + n_chunks - 1][2] == indptr[row + 1]
    assert work.slot_split[:used].tolist() == [it[0] for it in items[:used]]
    with pytest.raises(ValueError, match="order"):
        worklist.build_static(t, nnz, chunk, split_from, order="random")


def test_static_list_bound_is_tight():
    """Rows of chunk + 1 edges, each split into 2 chunks, come close to the bound n_rows +
    nnz // chunk; the items past the used ones are empty."""
    chunk = 4
    deg = [chunk + 1] * 6
    indptr = _indptr(deg)
    work = worklist.build_static(torch.tensor(indptr), indptr[-1], chunk, chunk + 1)
    used = sum(-(-d // chunk) for d in deg)
    assert used <= work.n_items == len(deg) + indptr[-1] // chunk
    assert work.items[used:, 1:3].abs().sum() == 0


@pytest.mark.parametrize("chunk,split_from", [(0, 1), (4, 4), (4, 2)])
def test_static_list_bad_arguments(chunk, split_from):
    with pytest.raises(ValueError, match="chunk < split_from"):
        worklist.build_static(torch.tensor([0, 3, 10]), 10, chunk, split_from)


def test_static_list_merge_emulation():
    """The kernels' reading of a static list, emulated: a sum over each item's edges written
    (whole rows) or added into its slot and merged per split entry (skipping 0-chunk entries)
    gives every row's sum, whatever the padding items do to their slots."""
    deg = _degrees(7, 40, 0, 30, zeros=5, super_degree=97)
    indptr = _indptr(deg)
    vals = torch.randn(indptr[-1], dtype=torch.float64)
    work = worklist.build_static(torch.tensor(indptr), indptr[-1], 8, 9)
    out = torch.full((len(deg),), float("nan"), dtype=torch.float64)
    slots = torch.full((work.n_slots,), float("nan"), dtype=torch.float64)
    for row, begin, end, tag in work.items.tolist():
        s = vals[begin:end].sum()
        if tag < 0:
            out[row] = s
        else:
            slots[tag] = s
    for row, first, n_chunks, _ in work.split.tolist():
        if n_chunks:
            out[row] = slots[first:first + n_chunks].sum()
    expected = torch.stack([vals[indptr[r]:indptr[r + 1]].sum() for r in range(len(deg))])
    assert torch.allclose(out, expected)


def test_row_attention_work_uses_the_static_list_on_static_graphs():
    from gnn_fastpath.cuda import row_attention
    from gnn_fastpath.graph.tensors import as_graph, from_coo

    ei = torch.tensor([[0, 1, 2, 3, 3, 3, 3, 1, 0, 2], [1, 1, 1, 1, 0, 2, 0, 2, 1, 1]])
    eager = Graph.from_edge_index(ei, 4)
    assert not row_attention.work(eager, 2).static
    static = as_graph(from_coo(ei[0], ei[1], 4, 4))
    work = row_attention.work(static, 2)
    assert work.static and row_attention.work(static, 2) is work
    assert work.split_mask.tolist() == [False, True, False, False]  # in-degrees 2, 6, 2, 0: row 1 has > 2
    assert row_attention.split_index(static, work, False) is work.slot_split
