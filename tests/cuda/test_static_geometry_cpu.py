"""Static geometry handed to the operators (``worklist.StaticGeometry``,
``GraphTensors.with_geometry``): the compiled path builds each family's work lists once, in
traced code, and the launchers inside the operators read them instead of building their own.

Checked on the CPU: the handed lists equal the ones a launcher builds; they trace (fullgraph,
dynamic shapes); every family's public op hands its lists to its operators; and, with dry
launches (see dry_launch.py), no launcher builds a work list when they are handed.
"""
from __future__ import annotations

import pytest
import torch

from dry_launch import GRAPHS, extra_row_graph, graph
from gnn_fastpath.cuda import dot_attention, gat_attention, gatv2_attention, segment_reduce, spmm, worklist
from gnn_fastpath.graph.tensors import as_graph, from_coo, of_graph
from gnn_fastpath.ops import library
from gnn_fastpath.ops.dot_attention import DotAttentionFunction
from gnn_fastpath.ops.gat_attention import GATAttentionFunction
from gnn_fastpath.ops.gatv2_attention import GATv2AttentionFunction
from gnn_fastpath.ops.segment_reduce import SegmentReduceFunction
from gnn_fastpath.ops.spmm import SpmmFunction

SPECS = [worklist.StaticGeometry("row_chunks", 16), worklist.StaticGeometry("row_chunks", 16, source_major=True),
         worklist.StaticGeometry("virtual_rows", 8), worklist.StaticGeometry("virtual_rows", 8, source_major=True),
         worklist.StaticGeometry("row_chunks", 16, order="degree")]
#: family -> its cuda module's static_geometry() (segment_reduce's for non_finite="keep")
FAMILY_SPECS = {
    "gatv2_attention": gatv2_attention.static_geometry, "gat_attention": gat_attention.static_geometry,
    "dot_attention": dot_attention.static_geometry, "spmm": spmm.static_geometry,
    "segment_reduce": lambda: segment_reduce.static_geometry("keep"),
}


@pytest.fixture(scope="module", params=list(GRAPHS))
def graph_tensors(request):
    return of_graph(graph(*GRAPHS[request.param]))


def _fields(value):
    if isinstance(value, worklist.RowChunks):
        return [value.items, value.split, value.split_rows, value.whole_rows, value.n_items, value.n_split_items,
                value.n_split, value.split_mask, value.slot_split]
    return list(value)


def _same(a, b):
    fa, fb = _fields(a), _fields(b)
    assert len(fa) == len(fb)
    for x, y in zip(fa, fb):
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y)
        else:
            assert x == y


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_handed_lists_equal_the_ones_built_in_place(graph_tensors, spec):
    handed = as_graph(graph_tensors.with_geometry([spec]))
    assert handed.memo_get(("geometry", spec.name)) is not None
    _same(worklist.static_geometry(handed, spec), worklist.static_geometry(as_graph(graph_tensors), spec))
    # restored once per graph
    assert worklist.static_geometry(handed, spec) is worklist.static_geometry(handed, spec)


def test_with_geometry_names_each_tensor_and_skips_what_it_cannot_or_need_not_build(graph_tensors):
    gt = graph_tensors.with_geometry(SPECS[:1])
    assert gt.geometry_names == tuple(f"row_chunks/dst/16/row.{i}" for i in range(6)) and len(gt.geometry) == 6
    again = gt.with_geometry(SPECS)  # the list it has is not built twice
    assert again.geometry_names[:6] == gt.geometry_names and len(again.geometry) == 6 + 6 + 2 + 2 + 6
    assert all(a is b for a, b in zip(again.geometry[:6], gt.geometry))
    dm = graph_tensors.destination_major().with_geometry(SPECS)  # no transpose: no source-major list
    assert {n.rpartition(".")[0] for n in dm.geometry_names} == {"row_chunks/dst/16/row", "virtual_rows/dst/8/row",
                                                                   "row_chunks/dst/16/degree"}
    assert len(gt.operands) == len(graph_tensors.operands) and gt.operands[8] == gt.geometry


def test_unknown_kind_is_refused(graph_tensors):
    with pytest.raises(ValueError, match="kind"):
        worklist.static_geometry(as_graph(graph_tensors), worklist.StaticGeometry("rows", 4))


def test_lists_trace_without_graph_breaks():
    """Built by compiled code (fullgraph, dynamic shapes, AOTAutograd): the same tensors as eagerly."""
    ei = graph(True).caller_coo()
    n = int(ei[0].max()) + 1

    def lists(src, dst):
        return from_coo(src, dst, n, n).with_geometry(SPECS).geometry

    torch._dynamo.reset()
    compiled = torch.compile(lists, backend="aot_eager", fullgraph=True, dynamic=True)
    for m in (ei[0].numel(), ei[0].numel() - 37):
        got, want = compiled(ei[0][:m], ei[1][:m]), lists(ei[0][:m], ei[1][:m])
        assert len(got) == len(want) == 22
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b)
    torch._dynamo.reset()


def _leaf(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype).requires_grad_()


def _run_family(family, g, dtype=torch.float32):
    """One forward and backward of ``family``'s Function on graph ``g`` (a Graph or GraphTensors)."""
    H, D, F = 2, 32, 24
    n_src, n_dst = g.n_src, g.n_dst
    if family == "gatv2_attention":
        xs, xd, att = _leaf(n_src, H, D, dtype=dtype), _leaf(n_dst, H, D, dtype=dtype), _leaf(H, D)
        out = GATv2AttentionFunction.apply(xs, xd, att, None, g, 0.2, False, 0.0, 0, 0, None)
    elif family == "gat_attention":
        xs, s, t = _leaf(n_src, H, D, dtype=dtype), _leaf(n_src, H), _leaf(n_dst, H)
        out = GATAttentionFunction.apply(xs, s, t, None, None, g, 0.2, False, 0.0, 0, 0, None)
    elif family == "dot_attention":
        q, k, v = _leaf(n_dst, H, D, dtype=dtype), _leaf(n_src, H, D, dtype=dtype), _leaf(n_src, H, D, dtype=dtype)
        out = DotAttentionFunction.apply(q, k, v, None, g, 0.125, False, 0.0, 0, 0, None)
    elif family == "spmm":
        out = SpmmFunction.apply(_leaf(n_src, F, dtype=dtype), None, g, "none", None)
    else:
        out = SegmentReduceFunction.apply(_leaf(n_src, F, dtype=dtype), None, g, "max", "first", "keep")
    out.float().sum().backward()
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", list(FAMILY_SPECS))
def test_launchers_build_no_work_list_when_handed(launches, monkeypatch, graph_tensors, family, dtype):
    """The launchers of a static graph with its family's lists handed in run (forward and
    backward) without building a work list; without them, they build their own."""
    gt = graph_tensors if family == "spmm" else graph_tensors.destination_major()
    built = []
    for name in ("build_static", "virtual_rows"):
        real = getattr(worklist, name)
        monkeypatch.setattr(worklist, name, lambda *a, _real=real, _name=name: built.append(_name) or _real(*a))
    _run_family(family, as_graph(gt), dtype)
    assert built, "a static graph without handed lists builds its work lists in the launchers"
    built.clear()
    start = len(launches)
    handed = gt.with_geometry(FAMILY_SPECS[family]())
    built.clear()  # with_geometry itself builds them (the caller's traced code)
    _run_family(family, as_graph(handed), dtype)
    assert built == [] and len(launches) > start


@pytest.mark.parametrize("family", list(FAMILY_SPECS))
def test_public_ops_hand_their_lists_to_the_operators(monkeypatch, family):
    """On a GraphTensors (the compiled path) each family's op passes its launchers' lists to
    its forward and backward operators."""
    from gnn_fastpath import ops

    calls = []
    real_op = library.op

    def spy(name):
        target = real_op(name)

        def call(*args):
            calls.append((name, args[library.N_GRAPH - 1]))
            return target(*args)

        return call

    monkeypatch.setattr(library, "op", spy)
    gt = of_graph(graph(True))
    H, D, F = 2, 8, 6
    if family == "gatv2_attention":
        out = ops.gatv2_attention(gt, _leaf(gt.n_src, H, D), _leaf(gt.n_dst, H, D), _leaf(H, D))
    elif family == "gat_attention":
        out = ops.gat_attention(gt, _leaf(gt.n_src, H, D), _leaf(gt.n_src, H), _leaf(gt.n_dst, H))
    elif family == "dot_attention":
        out = ops.dot_attention(gt, _leaf(gt.n_dst, H, D), _leaf(gt.n_src, H, D), _leaf(gt.n_src, H, D))
    elif family == "spmm":
        out = ops.spmm(gt, _leaf(gt.n_src, F))
    else:
        out = ops.segment_reduce(gt, _leaf(gt.n_src, F), reduce="max")
    out.sum().backward()
    want = {spec.name for spec in FAMILY_SPECS[family]()}
    assert [name for name, _ in calls] == [family, f"{family}_backward"]
    for _, names in calls:
        assert {n.rpartition(".")[0] for n in names} == want


# ------------------------------------------------------------- the extra row of removed edges
@pytest.mark.parametrize("family", ["gatv2_attention", "gat_attention", "dot_attention"])
def test_extra_row_lists_leave_the_removed_edges_out(family):
    """An attention family's list handed for a graph with an extra row is the variant without
    that row: its items cover exactly the kept edges' CSR positions, the extra row's item is
    empty and no row is split for it; a launcher asking for the plain list finds it."""
    gt, removed = extra_row_graph()
    n_removed = int(removed.sum())
    assert n_removed > 256
    (spec,) = FAMILY_SPECS[family]()
    handed = gt.destination_major().with_geometry([spec])
    assert {n.rpartition(".")[0] for n in handed.geometry_names} == {spec.name + worklist.SKIP_LAST_ROW}
    work = worklist.static_geometry(as_graph(handed), spec)
    assert work.skips_last_row
    kept_end = int(gt.indptr[-2])
    assert kept_end == gt.num_edges - n_removed
    covered = torch.zeros(gt.num_edges, dtype=torch.int64)
    for row, begin, end, _ in work.items.tolist():
        covered[begin:end] += 1
        if row == gt.indptr.numel() - 2:
            assert begin == end
    assert torch.equal(covered, (torch.arange(gt.num_edges) < kept_end).long())
    assert not bool(work.split_mask[-1])
    # without an extra row the plain list is handed, and the same graph's list built in place
    # (no handed list) still walks the extra row
    plain = of_graph(graph(True)).destination_major().with_geometry([spec])
    assert {n.rpartition(".")[0] for n in plain.geometry_names} == {spec.name}
    built = worklist.static_geometry(as_graph(gt.destination_major()), spec)
    assert not built.skips_last_row and bool(built.split_mask[-1])


def test_only_destination_row_chunks_skip_the_last_row():
    gt, _ = extra_row_graph()
    for spec in (worklist.StaticGeometry("virtual_rows", 8), SPECS[1]):
        assert not spec.can_skip_last_row
        with pytest.raises(ValueError, match="skip the last row"):
            spec.build(gt.indptr, gt.num_edges, skip_last_row=True)
    handed = gt.with_geometry([worklist.StaticGeometry("virtual_rows", 8), SPECS[1]])
    assert handed.geometry_names and not any(worklist.SKIP_LAST_ROW in n for n in handed.geometry_names)


def test_extra_row_lists_trace_without_graph_breaks():
    """The list without the extra row is built by compiled code too (fullgraph, dynamic shapes):
    the same tensors as eagerly, for two edge counts."""
    gt, removed = extra_row_graph()
    src, dst = gt.coo
    n = gt.n_src

    def lists(src, dst, removed):  # the specs asked for in traced code, as the ops ask
        gt = from_coo(src, dst, n, n, removed=removed, source_major=False)
        return gt.with_geometry(gatv2_attention.static_geometry() + dot_attention.static_geometry()).geometry

    torch._dynamo.reset()
    compiled = torch.compile(lists, backend="aot_eager", fullgraph=True, dynamic=True)
    for m in (src.numel(), src.numel() - 41):
        got, want = compiled(src[:m], dst[:m], removed[:m]), lists(src[:m], dst[:m], removed[:m])
        assert len(got) == len(want) == 12
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b)
    torch._dynamo.reset()
