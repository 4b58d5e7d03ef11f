"""GraphTensors (gnn_fastpath.graph.tensors): from_coo builds the same graph as Graph.from_coo,
traceably; removed edges sit in the extra destination row; as_graph / of_graph convert."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from gnn_fastpath import Graph
from gnn_fastpath.graph.tensors import N_OPERANDS, GraphTensors, as_graph, from_coo, of_graph

from zoo import random_edges

SHAPES = {"homogeneous": (13, 13, 40), "bipartite": (11, 7, 35), "more_dst": (5, 9, 25)}


@pytest.fixture(scope="module", params=list(SHAPES))
def coo(request):
    """(src, dst, n_src, n_dst): self loops, duplicates, two empty destination rows, shuffled."""
    n_src, n_dst, m = SHAPES[request.param]
    edge_index, _ = random_edges(n_src, n_dst, m, seed=len(request.param), empty_rows=2)
    return edge_index[0], edge_index[1], n_src, n_dst


@pytest.fixture(scope="module")
def built(coo):
    src, dst, n_src, n_dst = coo
    return from_coo(src, dst, n_src, n_dst), Graph.from_coo(src, dst, n_src, n_dst)


def _rows(indptr, values):
    """[multiset of values per row] of a CSR."""
    indptr = indptr.tolist()
    return [Counter(values[a:b].tolist()) for a, b in zip(indptr[:-1], indptr[1:])]


def _row_of_position(indptr):
    counts = (indptr[1:] - indptr[:-1]).to(torch.int64)
    return torch.repeat_interleave(torch.arange(counts.numel()), counts)


def test_dtypes_shapes_and_fields(built, coo):
    gt, _ = built
    src, dst, n_src, n_dst = coo
    m = src.numel()
    for t in gt.operands[:7]:
        assert t.dtype == torch.int32
    assert gt.indptr.shape == (n_dst + 1,) and gt.indices.shape == gt.perm.shape == (m,)
    assert gt.src_indptr.shape == (n_src + 1,)
    assert gt.src_indices.shape == gt.src_perm.shape == gt.src_csr_pos.shape == (m,)
    assert gt.n_src == n_src and gt.n_dst == n_dst and gt.num_edges == m and not gt.extra_row
    assert len(gt.operands) == N_OPERANDS and gt.operands[7] == n_src and gt.operands[8:] == ((), ())
    assert torch.equal(gt.coo[0], src) and torch.equal(gt.coo[1], dst)


def test_destination_csr_matches_graph_from_coo(built, coo):
    """Same row offsets; each row holds the same (source, caller edge) pairs as the eager
    Graph's; perm maps every CSR edge back to the caller's edge; rows keep caller order."""
    gt, g = built
    src, dst, _, _ = coo
    kc = g.kernel_csr()
    assert torch.equal(gt.indptr, kc.indptr)
    pairs = lambda indptr, idx, perm: _rows(indptr, idx.to(torch.int64) * 10**6 + perm.to(torch.int64))  # noqa: E731
    assert pairs(gt.indptr, gt.indices, gt.perm) == pairs(kc.indptr, kc.indices, kc.perm)
    perm = gt.perm.to(torch.int64)
    assert torch.equal(torch.sort(perm).values, torch.arange(src.numel()))
    assert torch.equal(src[perm], gt.indices.to(torch.int64))
    assert torch.equal(dst[perm], _row_of_position(gt.indptr))
    rows = _row_of_position(gt.indptr)
    same_row = rows[1:] == rows[:-1]
    assert bool((perm[1:][same_row] > perm[:-1][same_row]).all()), "a row does not keep the caller's order"


def test_source_csr_is_the_transpose(built, coo):
    gt, g = built
    src, dst, _, _ = coo
    sc = g.kernel_source_csr()
    assert torch.equal(gt.src_indptr, sc.indptr)
    pairs = lambda indptr, idx, perm: _rows(indptr, idx.to(torch.int64) * 10**6 + perm.to(torch.int64))  # noqa: E731
    assert pairs(gt.src_indptr, gt.src_indices, gt.src_perm) == pairs(sc.indptr, sc.indices, sc.perm)
    s_perm = gt.src_perm.to(torch.int64)
    assert torch.equal(torch.sort(s_perm).values, torch.arange(src.numel()))
    assert torch.equal(src[s_perm], _row_of_position(gt.src_indptr))
    assert torch.equal(dst[s_perm], gt.src_indices.to(torch.int64))
    # csr_pos: the position of the same caller edge in the destination-major CSR
    pos = gt.src_csr_pos.to(torch.int64)
    assert torch.equal(gt.perm.to(torch.int64)[pos], s_perm)
    assert torch.equal(torch.sort(pos).values, torch.arange(src.numel()))


def test_degrees_and_caller_coo(built, coo):
    gt, g = built
    src, dst, _, _ = coo
    assert torch.equal(gt.in_degree().to(torch.int64), g.in_degree())
    assert all(torch.equal(a, b) for a, b in zip(gt.caller_coo(), (src, dst)))
    # rebuilt from the CSR when the coo is not kept
    bare = gt._replace(coo=None)
    assert all(torch.equal(a, b) for a, b in zip(bare.caller_coo(), (src, dst)))


def test_destination_major_drops_the_transpose(built):
    gt, _ = built
    dm = gt.destination_major()
    assert dm.operands[:3] == gt.operands[:3] and dm.operands[3:7] == (None,) * 4 and dm.n_src == gt.n_src
    plain = from_coo(*gt.coo, gt.n_src, gt.n_dst, source_major=False)
    assert plain.src_indptr is None and torch.equal(plain.indptr, gt.indptr) and torch.equal(plain.perm, gt.perm)


@pytest.mark.parametrize("removed", [False, True])
def test_with_source_major_builds_the_transpose_from_coo_gives(coo, removed):
    """A graph built without its transpose gets from_coo's own when an op asks for it, once
    per memo store; a graph with one is returned as it is."""
    from gnn_fastpath.graph.tensors import Memo

    src, dst, n_src, n_dst = coo
    gone = ((src == dst) | (torch.arange(src.numel()) % 3 == 0)) if removed else None
    full = from_coo(src, dst, n_src, n_dst, removed=gone)
    plain = from_coo(src, dst, n_src, n_dst, removed=gone, source_major=False)._replace(store=Memo())
    built = plain.with_source_major()
    for name in ("src_indptr", "src_indices", "src_perm", "src_csr_pos"):
        assert torch.equal(getattr(built, name), getattr(full, name)), name
    assert plain.with_source_major() is built and full.with_source_major() is full


# ------------------------------------------------------------------------------- extra row
@pytest.fixture(scope="module")
def removed_case(coo):
    src, dst, n_src, n_dst = coo
    removed = (src == dst) | (torch.arange(src.numel()) % 3 == 0)
    assert 0 < int(removed.sum()) < src.numel()
    return removed, from_coo(src, dst, n_src, n_dst, removed=removed)


def test_removed_edges_sit_in_the_extra_row(coo, removed_case):
    src, dst, n_src, n_dst = coo
    removed, gt = removed_case
    kept_ids = torch.nonzero(~removed).flatten()
    assert gt.extra_row and gt.n_dst == n_dst and gt.indptr.numel() == n_dst + 2 and gt.num_edges == src.numel()
    last = gt.perm[int(gt.indptr[-2]):].to(torch.int64)
    assert sorted(last.tolist()) == torch.nonzero(removed).flatten().tolist()
    assert torch.equal(gt.indices[int(gt.indptr[-2]):].to(torch.int64), src[last])
    # the other rows: those of the graph built without the removed edges (caller ids mapped back)
    kept = from_coo(src[~removed], dst[~removed], n_src, n_dst)
    assert torch.equal(gt.indptr[:-1], kept.indptr)
    assert _rows(gt.indptr[:-1], gt.perm) == _rows(kept.indptr, kept_ids[kept.perm.to(torch.int64)])
    assert torch.equal(gt.in_degree(), kept.in_degree())
    # the caller's coo names the extra row as the removed edges' destination
    c_src, c_dst = gt.caller_coo()
    assert torch.equal(c_src, src) and torch.equal(c_dst, torch.where(removed, n_dst, dst))
    # the transpose lists removed edges too, towards the extra row
    s_perm = gt.src_perm.to(torch.int64)
    assert torch.equal(gt.src_indices.to(torch.int64), torch.where(removed, n_dst, dst)[s_perm])
    assert torch.equal(gt.perm.to(torch.int64)[gt.src_csr_pos.to(torch.int64)], s_perm)


def test_pad_and_unpad(removed_case, built):
    _, gt = removed_case
    t = torch.randn(gt.n_dst, 3)
    padded = gt.pad(t)
    assert padded.shape == (gt.n_dst + 1, 3) and torch.equal(padded[:-1], t) and not padded[-1].any()
    assert torch.equal(gt.unpad(padded), t)
    assert gt.pad(None) is None
    plain, _ = built
    assert plain.pad(t) is t and plain.unpad(t) is t


def test_no_removed_edge_gives_an_empty_extra_row(coo):
    src, dst, n_src, n_dst = coo
    gt = from_coo(src, dst, n_src, n_dst, removed=torch.zeros_like(src, dtype=torch.bool))
    plain = from_coo(src, dst, n_src, n_dst)
    assert gt.extra_row and int(gt.indptr[-1]) == int(gt.indptr[-2]) == src.numel()
    assert torch.equal(gt.indptr[:-1], plain.indptr) and torch.equal(gt.perm, plain.perm)


# ----------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("removed", [False, True])
def test_empty_graph(removed):
    empty = torch.empty(0, dtype=torch.int64)
    gt = from_coo(empty, empty, 4, 3, removed=torch.empty(0, dtype=torch.bool) if removed else None)
    assert gt.num_edges == 0 and gt.n_dst == 3
    assert torch.equal(gt.indptr, torch.zeros(3 + 1 + int(removed), dtype=torch.int32))
    assert torch.equal(gt.src_indptr, torch.zeros(5, dtype=torch.int32))
    assert gt.src_indices.numel() == gt.src_perm.numel() == gt.src_csr_pos.numel() == 0
    g = as_graph(gt)
    assert g.num_edges == 0 and g.static
    assert torch.equal(g.out_degree(), torch.zeros(4, dtype=torch.int64))
    assert torch.equal(gt.in_degree(), torch.zeros(3, dtype=torch.int32))


def test_out_of_range_ids_are_reported():
    src, dst = torch.tensor([0, 1, 5]), torch.tensor([0, 1, 2])
    with pytest.raises(RuntimeError, match="out of range"):
        from_coo(src, dst, 4, 3)
    with pytest.raises(RuntimeError, match="out of range"):
        from_coo(dst, src, 3, 4)


def test_from_coo_traces_without_graph_breaks(coo):
    """Built inside torch.compile (fullgraph: no break, dynamic shapes): the same tensors."""
    src, dst, n_src, n_dst = coo
    removed = src == dst

    def build(src, dst, removed):
        return tuple(t for t in from_coo(src, dst, n_src, n_dst, removed=removed).operands[:7])

    torch._dynamo.reset()
    compiled = torch.compile(build, backend="eager", fullgraph=True, dynamic=True)
    for s, d, r in ((src, dst, removed), (src[:-3], dst[:-3], removed[:-3])):
        for a, b in zip(compiled(s, d, r), build(s, d, r)):
            assert a.dtype == b.dtype and torch.equal(a, b)
    torch._dynamo.reset()


# ------------------------------------------------------------------ as_graph and of_graph
def test_as_graph_is_static_over_the_given_tensors(built, coo):
    gt, g = built
    src, dst, n_src, n_dst = coo
    sg = as_graph(gt)
    assert sg.static and not g.static
    assert (sg.n_src, sg.n_dst, sg.num_edges) == (n_src, n_dst, src.numel())
    kc = sg.kernel_csr()
    assert kc.indptr is gt.indptr and kc.indices is gt.indices and kc.perm is gt.perm
    ks = sg.kernel_source_csr()
    assert (ks.indptr, ks.indices, ks.perm, ks.csr_pos) == (gt.src_indptr, gt.src_indices, gt.src_perm,
                                                            gt.src_csr_pos)
    assert ks.indptr is gt.src_indptr and ks.csr_pos is gt.src_csr_pos
    assert sg.indptr.dtype == torch.int64  # widened on the CPU for torch's scatter ops
    assert torch.equal(sg.indptr, gt.indptr.to(torch.int64)) and torch.equal(sg.perm, gt.perm.to(torch.int64))
    assert torch.equal(sg.dst_index(), _row_of_position(gt.indptr))
    assert torch.equal(sg.out_degree(), g.out_degree()) and torch.equal(sg.in_degree(), g.in_degree())
    assert all(torch.equal(a, b) for a, b in zip(sg.caller_coo(), (src, dst)))
    assert sg.degree_stats().mean == pytest.approx(src.numel() / n_dst)
    # no source-major CSR: out-degrees counted from the indices
    sd = as_graph(gt.destination_major())
    assert torch.equal(sd.out_degree(), g.out_degree())


def test_as_graph_of_an_extra_row_graph_has_the_row(removed_case, coo):
    _, _, n_src, n_dst = coo
    _, gt = removed_case
    sg = as_graph(gt)
    assert sg.n_dst == n_dst + 1 and sg.static and sg.kernel_csr().indptr is gt.indptr


def test_of_graph_round_trip(built):
    gt, g = built
    og = of_graph(g)
    kc, ks = g.kernel_csr(), g.kernel_source_csr()
    assert og.indptr is kc.indptr and og.indices is kc.indices and og.perm is kc.perm
    assert og.src_indptr is ks.indptr and og.src_perm is ks.perm and og.src_csr_pos is ks.csr_pos
    assert og.n_src == g.n_src and og.n_dst == g.n_dst and not og.extra_row
    back = as_graph(og)
    for a, b in ((back.indptr, g.indptr), (back.indices, g.indices), (back.perm, g.perm)):
        assert torch.equal(a, b)
    assert torch.equal(back.out_degree(), g.out_degree())
    assert all(torch.equal(a, b) for a, b in zip(back.caller_coo(), g.caller_coo()))
    # and from_coo's tensors survive as_graph -> of_graph unchanged
    again = of_graph(as_graph(gt))
    assert all(a is b for a, b in zip(again.operands[:7], gt.operands[:7])) and again.n_src == gt.n_src
    assert of_graph(g, source_major=False).operands[3:7] == (None,) * 4


def test_graph_tensors_is_a_namedtuple_of_operands(built):
    gt, _ = built
    assert isinstance(gt, GraphTensors) and isinstance(gt, tuple)
    assert gt.memo("anything", lambda: 41 + 1) == 42
    assert gt.device == torch.device("cpu")
