"""Min/max aggregation kernels against the float64 reference.

Relative error ||got - want|| / ||want|| < 1e-4 of the fp32 CUDA results against
``gnn_fastpath.reference.segment_reduce`` on float64 copies: the output and the gradients of
x and of the edge weights, for max and min, every tie rule, with and without edge weights,
over graphs with heavy destinations (a super node with >= 100k in-edges and several rows of
a few hundred to a few thousand edges, cut into work items), empty rows, bipartite shapes,
no edges, and F in {1, 7, 64, 512}. Tie cases use small integers (ReLU-like: many exact
zeros) and weights that keep every product exact in fp32, so fp32 and fp64 see the same ties.
"""
from __future__ import annotations

import pytest
import torch
from kernel_checks import assert_close

from gnn_fastpath import Graph, reference
from gnn_fastpath.cuda import segment_reduce as sr_kernels
from gnn_fastpath.ops import backend_for, segment_reduce
from zoo import random_edges

pytestmark = pytest.mark.cuda

WIDTHS = (1, 7, 64, 512)
TIE_BREAKS = ("split", "even", "first", "last")




def _heavy_rows(n_src, n_dst, seed):
    """Random edges plus destinations 1..6 with 300..3000 extra in-edges (heavy, several items)."""
    edge_index, _ = random_edges(n_src, n_dst, 8000, seed=seed, empty_rows=7)
    gen = torch.Generator().manual_seed(seed)
    extra = []
    for row, deg in zip(range(1, 7), (300, 511, 512, 777, 1500, 3000)):
        src = torch.randint(0, n_src, (deg,), generator=gen)
        extra.append(torch.stack([src, torch.full_like(src, row)]))
    edge_index = torch.cat([edge_index] + extra, 1)
    return edge_index[:, torch.randperm(edge_index.size(1), generator=gen)], (n_src, n_dst)


_GRAPHS = {
    "random": lambda: random_edges(300, 300, 3000, seed=1, empty_rows=20),
    "super": lambda: random_edges(2000, 2000, 20000, seed=2, empty_rows=10, super_node_degree=110_000),
    "heavy_rows": lambda: _heavy_rows(1500, 1000, seed=3),
    "bipartite": lambda: random_edges(500, 300, 4000, seed=4, empty_rows=5),
    "no_edges": lambda: random_edges(50, 40, 0, seed=5, self_loops=False, duplicates=False),
}
_cache = {}


def _graph(name):
    if name not in _cache:
        edge_index, (n_src, n_dst) = _GRAPHS[name]()
        _cache[name] = Graph.from_edge_index(edge_index.cuda(), (n_src, n_dst))
    return _cache[name]


def _inputs(graph, F, weighted, ties, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if ties:  # small integers, ReLU'd: exact zeros and repeated values
        x = torch.relu(torch.randint(-3, 4, (graph.n_src, F), device="cuda", generator=gen).float())
        pick = torch.randint(0, 3, (graph.num_edges,), device="cuda", generator=gen)
        w = torch.tensor([-1.0, 0.5, 2.0], device="cuda")[pick] if weighted else None
    else:
        x = torch.randn(graph.n_src, F, device="cuda", generator=gen)
        w = torch.randn(graph.num_edges, device="cuda", generator=gen) if weighted else None
    g = torch.randn(graph.n_dst, F, device="cuda", generator=gen)
    return x, w, g


def _run(fn, x, w, g):
    x = x.clone().requires_grad_(True)
    w = None if w is None else w.clone().requires_grad_(True)
    out = fn(x, w)
    out.backward(g)
    return out.detach(), x.grad, None if w is None else w.grad


def _check(graph, F, reduce, weighted, tie_break, ties, seed=0):
    x, w, g = _inputs(graph, F, weighted, ties, seed)
    assert backend_for("segment_reduce", x) == "cuda"
    got = _run(lambda x, w: segment_reduce(graph, x, reduce, w, tie_break), x, w, g)
    want = _run(lambda x, w: reference.segment_reduce(graph, x, reduce, w, tie_break), x.double(),
                None if w is None else w.double(), g.double())
    label = f"F={F}, {reduce}, weighted={weighted}, tie_break={tie_break}, ties={ties}"
    for name, a, b in zip(("out", "dx", "dw"), got, want):
        if b is not None:
            assert_close(f"{name} ({label})", a, b)


# ------------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("graph_name", list(_GRAPHS))
@pytest.mark.parametrize("F", WIDTHS)
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("weighted", [False, True])
def test_matches_reference(graph_name, F, reduce, weighted):
    _check(_graph(graph_name), F, reduce, weighted, "split", ties=False)


@pytest.mark.parametrize("graph_name", ["random", "super", "heavy_rows", "bipartite"])
@pytest.mark.parametrize("F", WIDTHS)
@pytest.mark.parametrize("tie_break", TIE_BREAKS)
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("weighted", [False, True])
def test_ties(graph_name, F, tie_break, reduce, weighted):
    _check(_graph(graph_name), F, reduce, weighted, tie_break, ties=True, seed=1)


def test_heavy_graph_really_has_heavy_rows():
    for name in ("super", "heavy_rows"):
        work = sr_kernels.row_chunks(_graph(name))
        assert work.n_split > 0 and work.split_rows.numel() == work.n_split
        assert work.n_split_items > work.n_split  # split rows are cut into several items


def test_trailing_dims_and_misaligned_rows():
    graph = _graph("heavy_rows")
    x = torch.randn(graph.n_src, 2, 6, device="cuda", requires_grad=True)
    out = segment_reduce(graph, x, "max")
    assert out.shape == (graph.n_dst, 2, 6)
    g = torch.randn_like(out)
    out.backward(g)
    xr = x.detach().double().requires_grad_(True)
    want = reference.segment_reduce(graph, xr, "max")
    want.backward(g.double())
    assert_close("out", out, want)
    assert_close("dx", x.grad, xr.grad)
    # a row-misaligned view (F % 4 == 0 but base address not 16-byte aligned): scalar loads
    base = torch.randn(graph.n_src * 8 + 1, device="cuda")
    xv = base[1:].view(graph.n_src, 8)
    assert_close("misaligned", segment_reduce(graph, xv, "min"), reference.segment_reduce(graph, xv.double(), "min"))


def test_no_grad_saves_nothing():
    graph = _graph("super")
    x = torch.randn(graph.n_src, 64, device="cuda")
    with torch.no_grad():
        out = segment_reduce(graph, x, "max", tie_break="first")
    assert_close("out", out, reference.segment_reduce(graph, x.double(), "max"))


# ------------------------------------------------------------------------------- caching
#: graph.memo key of the min/max work list (gnn_fastpath.cuda.worklist.for_graph over the
#: destination rows, chunks of CHUNK edges from SPLIT_FROM edges on, interleaved).
WORK_KEY = ("row_chunks", False, sr_kernels.CHUNK, sr_kernels.SPLIT_FROM, "row", True, "split_row")


def test_work_lists_built_once_per_graph():
    edge_index, sizes = _heavy_rows(800, 600, seed=9)
    graph = Graph.from_edge_index(edge_index.cuda(), sizes)
    x = torch.randn(sizes[0], 32, device="cuda", requires_grad=True)
    segment_reduce(graph, x, "max", tie_break="last").sum().backward()
    work = graph._memo[WORK_KEY]
    built = dict(graph._memo)  # everything derived so far (work list, caller-order sources, ...)
    assert sr_kernels.row_chunks(graph) is work
    for _ in range(3):
        segment_reduce(graph, x, "max", tie_break="last").sum().backward()
        segment_reduce(graph, x, "min").sum().backward()
    assert all(graph._memo[key] is value for key, value in built.items()), "per-graph data was rebuilt"
    assert sr_kernels.row_chunks(graph) is work
    graph2 = Graph.from_edge_index(edge_index[:, ::2].contiguous().cuda(), sizes)
    assert WORK_KEY not in graph2._memo
    got = segment_reduce(graph2, x.detach(), "max")
    work2 = graph2._memo[WORK_KEY]  # built for the new graph, on its first call
    assert work2 is not work and sr_kernels.row_chunks(graph2) is work2
    assert int((work2.items[:, 2] - work2.items[:, 1]).sum()) == graph2.num_edges  # graph2's rows
    assert_close("new graph", got, reference.segment_reduce(graph2, x.detach().double(), "max"))


# ------------------------------------------------------------------------------- streams
@pytest.mark.parametrize("tie_break", ["split", "last"])
def test_non_default_stream(tie_break):
    graph = _graph("super")
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        x = torch.randn(graph.n_src, 64, device="cuda", requires_grad=True)
        w = torch.randn(graph.num_edges, device="cuda", requires_grad=True)
        out = segment_reduce(graph, x, "max", w, tie_break)
        g = torch.randn_like(out)
        out.backward(g)
        out2 = out * 1.0
    stream.synchronize()
    xr = x.detach().double().requires_grad_(True)
    wr = w.detach().double().requires_grad_(True)
    want = reference.segment_reduce(graph, xr, "max", wr, tie_break)
    want.backward(g.double())
    assert_close("out", out2, want)
    assert_close("dx", x.grad, xr.grad)
    assert_close("dw", w.grad, wr.grad)


# ---------------------------------------------------------------------------- NaN and infinity
NON_FINITE_RULES = [("split", "keep", False), ("even", "keep", False), ("first", "keep", True),
                    ("last", "keep", False), ("first", "drop", True), ("last", "drop", False)]


@pytest.mark.parametrize("name", ["random", "heavy_rows"])
@pytest.mark.parametrize("F", [7, 64])
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("tie_break,non_finite,weighted", NON_FINITE_RULES)
@pytest.mark.parametrize("bwd", ["atomic", "transposed"])
def test_non_finite_matches_reference(monkeypatch, name, F, reduce, tie_break, non_finite, weighted, bwd):
    """NaN and +-inf in features (and weights): the kernels (light rows and the atomically
    merged chunks of long rows) follow the reference's rule bit for bit in value and gradient,
    NaN positions included; with either backward scatter (split/even: a -inf message sets
    "walk all", which the source-major pass leaves to the walk)."""
    monkeypatch.setenv("GNN_FASTPATH_SR_BWD", bwd)
    graph = _graph(name)
    gen = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randint(-3, 4, (graph.n_src, F), generator=gen, device="cuda").float()
    pick = torch.rand(graph.n_src, F, generator=gen, device="cuda")
    x[pick < 0.02] = float("nan")
    x[(pick >= 0.02) & (pick < 0.03)] = float("inf")
    x[(pick >= 0.03) & (pick < 0.04)] = float("-inf")
    w = None
    if weighted:
        w = torch.randint(1, 3, (graph.num_edges,), generator=gen, device="cuda").float()
        w[torch.rand(graph.num_edges, generator=gen, device="cuda") < 0.01] = float("nan")
    results = []
    for run in (lambda *a: segment_reduce(*a), lambda *a: reference.segment_reduce(*a)):
        xr = x.clone().requires_grad_()
        wr = None if w is None else w.clone().requires_grad_()
        out = run(graph, xr, reduce, wr, tie_break, non_finite)
        g = torch.autograd.grad(out.sum(), [xr] + ([wr] if wr is not None else []))
        results.append((out, g))
    (out, grads), (ref_out, ref_grads) = results
    assert backend_for("segment_reduce", x) == "cuda"
    torch.testing.assert_close(out, ref_out, equal_nan=True, rtol=0, atol=0)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-5)
    if non_finite == "drop":
        assert torch.isfinite(out).all()


# --------------------------------------------------------------------- saved state layout
def _saved(graph, x, w, tie_break, reduce="max"):
    """(out, aux [n_dst, F], walk_all, row_walks) the forward saves, through the op's autograd
    Function; aux's saved winners (CSR positions for split/even) as caller edge ids."""
    from gnn_fastpath.ops.segment_reduce import SegmentReduceFunction

    xr = x.clone().requires_grad_(True)
    out = SegmentReduceFunction.apply(xr, w, graph, reduce, tie_break, "keep")
    state = out.grad_fn.saved_tensors[3]
    aux, walk_all, row_walks = sr_kernels.saved_state(state, graph.n_dst, x.size(1))
    if tie_break in ("split", "even"):
        perm = graph.kernel_csr().perm
        aux = torch.where(aux >= 0, perm[aux.clamp(min=0).long()].to(aux.dtype), aux)
    return out.detach(), aux, walk_all, row_walks


def _winners(graph, x, w, reduce):
    """Per (row, feature) the number of edges reaching the extreme and the caller id of the
    last of them, on the float32 products the kernels compare (one IEEE rounding each, as
    torch's float32 multiply; float64 products could separate values float32 ties)."""
    dst, tied = _tied(graph, x, w, reduce)
    n = torch.zeros(graph.n_dst, x.size(1), dtype=torch.int64, device=x.device).index_add_(0, dst, tied.long())
    ids = torch.arange(graph.num_edges, device=x.device)[:, None].expand_as(tied)
    last = torch.full_like(n, -1).scatter_reduce(0, dst[:, None].expand_as(tied), torch.where(tied, ids, -1), "amax")
    return n, last


def _tied(graph, x, w, reduce):
    """(dst [M], tied [M, F]): whether each edge's message reaches its row's extreme."""
    src, dst = graph.caller_coo()
    msg = (x.float()[src] * (1.0 if w is None else w.float()[:, None])).double()
    if reduce == "min":
        msg = -msg
    best = torch.full((graph.n_dst, x.size(1)), float("-inf"), dtype=torch.float64, device=x.device)
    best = best.scatter_reduce(0, dst[:, None].expand_as(msg), msg, "amax")
    return dst, msg == best[dst]


@pytest.mark.parametrize("graph_name", ["random", "super", "heavy_rows"])
@pytest.mark.parametrize("tie_break", ["split", "even"])
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("ties", [False, True])
def test_counting_rules_save_the_winner(graph_name, tie_break, reduce, ties):
    """split/even save the winning edge where one edge reaches the extreme (so the
    backward scatters along it) and -1 - n where n != 1 edges do (those rows are walked),
    on light rows and on the atomically merged chunks of long rows; no -inf, no flag. split
    saves a single winner at exactly 0 as a walk too (n = 1: torch's untouched zero halves
    its gradient, which the walk gives)."""
    graph = _graph(graph_name)
    x, w, _ = _inputs(graph, 64, True, ties, seed=3)
    out, aux, walk_all, row_walks = _saved(graph, x, w, tie_break, reduce)
    n, last = _winners(graph, x, w, reduce)
    single = (n == 1) & (out != 0) if tie_break == "split" else n == 1
    want = torch.where(single, last, -1 - n).to(torch.int32)
    assert torch.equal(aux, want)
    assert walk_all.item() == 0
    # a row walks where one of its elements does (rows without edges need no walk)
    assert torch.equal(row_walks.bool(), ((want < 0) & (n > 0)).any(1))
    if not ties:
        assert (aux >= 0).float().mean() > 0.9  # the common case: no walk
    else:
        assert (aux < -1).any() and (aux >= 0).any()


def _tied_sources(graph, x, reduce):
    """Per (row, feature) of the unweighted messages: (smallest, largest) source among the
    edges reaching the extreme (equal: they are all duplicates of one edge)."""
    dst, tied = _tied(graph, x, None, reduce)
    index, ids = dst[:, None].expand_as(tied), graph.caller_coo()[0][:, None].expand_as(tied)
    big = torch.iinfo(torch.int64).max
    shape = (graph.n_dst, x.size(1))
    lo = torch.full(shape, big, device=x.device).scatter_reduce(0, index, torch.where(tied, ids, big), "amin")
    hi = torch.full(shape, -1, device=x.device).scatter_reduce(0, index, torch.where(tied, ids, -1), "amax")
    return lo, hi


@pytest.mark.parametrize("graph_name", ["random", "super", "heavy_rows"])
@pytest.mark.parametrize("tie_break", ["split", "even"])
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("ties", [False, True])
def test_duplicate_edges_tying_alone_go_along_one_winner(graph_name, tie_break, reduce, ties):
    """Unweighted, on rows whose sources ascend: where the only edges reaching a non-zero
    extreme are duplicates of one edge, the forward saves one of them as the single winner
    (their gradient shares all reach that one source), so the row does not walk; every other
    element keeps the counting rule's state, with every duplicate counted. Long rows too: their
    chunks are cut at changes of source, so one chunk holds all of a source's duplicates. The
    gradients against the reference: test_ties and test_matches_reference (these graphs all
    hold duplicate edges)."""
    graph = _graph(graph_name)
    assert graph.sources_sorted
    x, _, _ = _inputs(graph, 64, False, ties, seed=5)
    out, aux, walk_all, row_walks = _saved(graph, x, None, tie_break, reduce)
    n, _ = _winners(graph, x, None, reduce)
    lo, hi = _tied_sources(graph, x, reduce)
    src = graph.caller_coo()[0]
    zero_walks = (out == 0) if tie_break == "split" else torch.zeros_like(out, dtype=torch.bool)
    single = (n == 1) & ~zero_walks
    dups = (n > 1) & (lo == hi) & (out != 0)
    if not ties:
        heavy = (graph.in_degree() >= sr_kernels.SPLIT_FROM)[:, None].expand_as(n)
        assert dups.any(), "the graph should have duplicate edges winning alone"
        if graph_name != "random":  # the others have long rows, cut into chunks
            assert dups[heavy].any()
    # a saved single winner: one edge, or duplicates of it, reach the extreme
    assert torch.equal(src[aux.clamp(min=0).long()][aux >= 0], lo[aux >= 0])
    assert torch.equal(aux >= 0, single | dups)
    # elsewhere the tie count
    walk = ~(single | dups) & (n > 1)
    assert torch.equal(aux[walk], (-1 - n[walk]).to(torch.int32))
    assert walk_all.item() == 0
    assert torch.equal(row_walks.bool(), ((aux < 0) & (n > 0)).any(1))


@pytest.mark.parametrize("graph_name", ["super", "heavy_rows"])
@pytest.mark.parametrize("tie_break", ["split", "even"])
@pytest.mark.parametrize("weighted", [False, True])
def test_walk_takes_shorter_items_once_the_graph_outlived_a_step(monkeypatch, graph_name, tie_break, weighted):
    """The walk's own work list (rows cut every WALK_CHUNK edges) is built for a graph that
    outlived a training step, and taken where the walk's grid is at its wave cap (batch > 1;
    forced here, these graphs are small); before that the walk takes the forward's list. Both
    walk every tie."""
    monkeypatch.setattr(sr_kernels, "walk_batch", lambda n_items, lanes, fblocks, resident: min(lanes, 4))
    edge_index, sizes = _GRAPHS[graph_name]()
    graph = Graph.from_edge_index(edge_index.cuda(), sizes)

    def walk_list_built():
        return any(isinstance(k, tuple) and k[:4] == ("row_chunks", False, sr_kernels.WALK_CHUNK,
                                                      sr_kernels.WALK_CHUNK) for k in graph._memo)

    _check(graph, 64, "max", weighted, tie_break, ties=True, seed=4)  # the first step
    assert not graph.outlived_a_step() and not walk_list_built()
    _check(graph, 64, "min", weighted, tie_break, ties=True, seed=5)  # the next step's forward
    assert graph.outlived_a_step() and walk_list_built()
    work = sr_kernels.walk_chunks(graph)
    lengths = work.items[:, 2] - work.items[:, 1]
    assert int(lengths.max()) <= sr_kernels.WALK_CHUNK < sr_kernels.CHUNK
    assert int(lengths.sum()) == graph.num_edges


def test_unsorted_rows_keep_duplicate_ties():
    """A graph whose rows came grouped but with descending sources (kept as they came) does
    not know its duplicates sit together: their ties are counted and walked."""
    edge_index, (n_src, n_dst) = _GRAPHS["random"]()
    order = torch.sort(edge_index[1] * n_src + (n_src - 1 - edge_index[0])).indices
    graph = Graph.from_edge_index(edge_index[:, order].cuda(), (n_src, n_dst))
    assert not graph.sources_sorted
    assert torch.equal(graph.kernel_csr().indices.cpu(), edge_index[0, order].to(torch.int32))
    x, _, g = _inputs(graph, 64, False, False, seed=5)
    _, aux, _, _ = _saved(graph, x, None, "split", "max")
    n, _ = _winners(graph, x, None, "max")
    assert (n > 1).any()
    assert torch.equal(aux[n > 1], (-1 - n[n > 1]).to(torch.int32))
    _check(graph, 64, "max", False, "split", ties=False, seed=5)


@pytest.mark.parametrize("batch", [1, 3, 32])
@pytest.mark.parametrize("graph_name", ["random", "super", "heavy_rows"])
@pytest.mark.parametrize("F", (7, 64, 512))
@pytest.mark.parametrize("tie_break", ["split", "even"])
@pytest.mark.parametrize("weighted", [False, True])
def test_tie_walk_batches_items(monkeypatch, batch, graph_name, F, tie_break, weighted):
    """The walk's groups take several items each (batch, at most one per lane): every walking
    item is walked once, whatever the batch (the launcher's own choice is 1 on these small
    graphs)."""
    monkeypatch.setattr(sr_kernels, "walk_batch", lambda n_items, lanes, fblocks, resident: min(lanes, batch))
    _check(_graph(graph_name), F, "max", weighted, tie_break, ties=True, seed=2)


@pytest.mark.parametrize("graph_name", ["random", "heavy_rows"])
@pytest.mark.parametrize("weighted", [True, False])
def test_negative_infinity_sets_walk_all(graph_name, weighted):
    """A weighted -inf message anywhere sets the flag (split's losing edge gets 0 * inf = NaN
    through w * x, which only the walk gives); an unweighted one does not (a losing edge's
    gradient is an exact 0, which the scatter along the winners gives). Either way the
    gradients match the reference, NaNs included."""
    graph = _graph(graph_name)
    gen = torch.Generator(device="cuda").manual_seed(8)
    x = torch.randn(graph.n_src, 7, device="cuda", generator=gen)
    w = torch.rand(graph.num_edges, device="cuda", generator=gen) + 0.5 if weighted else None
    x[5, 3] = float("-inf")
    assert graph.out_degree()[5] > 0  # the -inf is a message
    _, _, walk_all, _ = _saved(graph, x, w, "split")
    assert walk_all.item() == int(weighted)
    grads = []
    for run in (segment_reduce, reference.segment_reduce):
        xr = x.clone().requires_grad_(True)
        wr = None if w is None else w.clone().requires_grad_(True)
        run(graph, xr, "max", wr, "split").sum().backward()
        grads.append((xr.grad,) + ((wr.grad,) if weighted else ()))
    # the case is real: torch's rule gives weighted losing edges NaN, unweighted ones 0
    assert grads[1][-1].isnan().any() == weighted
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["nan", "+inf", "-inf"])
@pytest.mark.parametrize("tie_break", ["split", "even"])
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("bwd", ["atomic", "transposed"])
def test_one_kind_of_non_finite(monkeypatch, kind, tie_break, reduce, bwd):
    """One kind of non-finite value at a time, so walked and scattered elements mix: NaN
    extremes walk (a row whose first message is NaN saves -1, which no edge of the
    source-major pass may match: "even" sends such an element nothing), a unique +-inf winner
    is scattered along its arg, -inf sets the flag."""
    monkeypatch.setenv("GNN_FASTPATH_SR_BWD", bwd)
    graph = _graph("heavy_rows")
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(graph.n_src, 64, device="cuda", generator=gen)
    x[torch.rand(graph.n_src, 64, device="cuda", generator=gen) < 0.01] = float(kind)
    g = torch.randn(graph.n_dst, 64, device="cuda", generator=gen)
    grads = []
    for run in (segment_reduce, reference.segment_reduce):
        xr = x.clone().requires_grad_(True)
        out = run(graph, xr, reduce, None, tie_break)
        out.backward(g)
        grads.append((out.detach(), xr.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(grads[0][1], grads[1][1], equal_nan=True, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("long_row", [False, True], ids=["short_row", "long_row"])
@pytest.mark.parametrize("tie_break,share", [("split", 0.5), ("even", 1.0)])
def test_single_winner_at_zero(tie_break, share, long_row):
    """torch's split rule counts the untouched zero of the output as a second candidate: a
    single edge reaching exactly 0 gets g / 2. The split forward saves such an element as a
    walk (n = 1), so the scatter along single winners never reads the output; "even" keeps the
    winner. A long row (>= SPLIT_FROM edges, merged from chunks) saves it the same way."""
    losers = sr_kernels.SPLIT_FROM + 20 if long_row else 1
    src = torch.tensor([0] + [1] * losers + [2])
    dst = torch.tensor([0] * (1 + losers) + [1])
    graph = Graph.from_edge_index(torch.stack([src, dst]).cuda(), (3, 2))
    x = torch.tensor([[0.0], [-1.0], [3.0]], device="cuda", requires_grad=True)
    out = segment_reduce(graph, x, "max", tie_break=tie_break)
    out.backward(torch.tensor([[4.0], [2.0]], device="cuda"))
    assert out.detach().flatten().tolist() == [0.0, 3.0]
    assert x.grad.flatten().tolist() == [4.0 * share, 0.0, 2.0]
    _, aux, _, row_walks = _saved(graph, x.detach(), None, tie_break)
    if tie_break == "split":
        assert aux.flatten().tolist() == [-2, 1 + losers] and row_walks.tolist() == [1, 0]
    else:
        assert aux.flatten().tolist() == [0, 1 + losers] and row_walks.tolist() == [0, 0]


# ------------------------------------------------------------ sliced scatter with hub copies
def _hub_source():
    """The "super" graph reversed: source 0 has 110k out-edges (a real hub)."""
    return _GRAPHS["super"]()[0].flip(0), (2000, 2000)


_SLICED_GRAPHS = {name: _GRAPHS[name] for name in ("random", "heavy_rows", "bipartite", "no_edges")}
_SLICED_GRAPHS["hub_source"] = _hub_source


def _force_slices(monkeypatch, hubs=5):
    monkeypatch.setenv("GNN_FASTPATH_SR_SCATTER", "slices")
    monkeypatch.setenv("GNN_FASTPATH_SR_BWD", "atomic")
    monkeypatch.setattr(sr_kernels, "SCATTER_HUBS", hubs)
    monkeypatch.setattr(sr_kernels, "SCATTER_REPLICAS", 3)


@pytest.mark.parametrize("graph_name", list(_SLICED_GRAPHS))
@pytest.mark.parametrize("F", (7, 64, 100, 512))
@pytest.mark.parametrize("tie_break", TIE_BREAKS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_sliced_scatter_matches_reference(monkeypatch, graph_name, F, tie_break, weighted, ties):
    """The atomic scatter in feature slices (GNN_FASTPATH_SR_SCATTER=slices; by rule only where
    dx outgrows the L2) with 5 hub sources of 3 row copies each, so that hub and plain sources
    both scatter (on "hub_source" one hub has 110k out-edges; "no_edges" scatters nothing):
    every gradient against the float64 reference, for F a multiple of the slice, below it and
    with a padded last slice."""
    _force_slices(monkeypatch)
    edge_index, sizes = _SLICED_GRAPHS[graph_name]()
    graph = Graph.from_edge_index(edge_index.cuda(), sizes)
    for reduce in ("max", "min"):
        _check(graph, F, reduce, weighted, tie_break, ties=ties, seed=3)
    if graph.num_edges == 0:
        return
    key = "position" if tie_break in ("split", "even") else "caller"
    target, hub_src = graph.memo_get(("segment_reduce", "hubs", key, 5))
    out_deg = torch.bincount(graph.kernel_csr().indices.long(), minlength=graph.n_src)
    assert hub_src.numel() == 5 and int(out_deg[hub_src.long()].min()) >= int(out_deg.sort().values[-5])
    assert int((target < 0).sum()) == int(out_deg[hub_src.long()].sum())  # every hub edge goes to a copy


@pytest.mark.parametrize("tie_break", TIE_BREAKS)
def test_sliced_scatter_weight_gradient_only(monkeypatch, tie_break):
    """Only the weights need a gradient (x does not): the scatter runs without dx, so without
    hub copies, and dw matches the float64 reference. Then more hubs than sources (every
    source of a 300-node graph a hub), dx and dw both."""
    _force_slices(monkeypatch)
    graph = Graph.from_edge_index(_hub_source()[0].cuda(), (2000, 2000))
    x, w, g = _inputs(graph, 64, True, False, seed=8)
    w_got, w_want = w.clone().requires_grad_(), w.double().requires_grad_()
    segment_reduce(graph, x, "max", w_got, tie_break).backward(g)
    reference.segment_reduce(graph, x.double(), "max", w_want, tie_break).backward(g.double())
    assert_close(f"dw ({tie_break})", w_got.grad, w_want.grad)
    assert not any(k[:2] == ("segment_reduce", "hubs") for k in graph._memo if isinstance(k, tuple))
    _force_slices(monkeypatch, hubs=1000)
    small = Graph.from_edge_index(_GRAPHS["random"]()[0].cuda(), (300, 300))
    _check(small, 64, "max", True, tie_break, ties=False, seed=9)
    key = "position" if tie_break in ("split", "even") else "caller"
    assert small.memo_get(("segment_reduce", "hubs", key, 1000))[1].numel() == 300


# ------------------------------------------------- source-major ("transposed") backward
def _symmetric(n, m, seed, hub=0):
    """An undirected graph: random edges (self loops, duplicates) stored both ways, plus
    node 0 joined to ``hub`` random nodes (a long row both ways: the work list's chunks)."""
    edge_index, _ = random_edges(n, n, m, seed=seed)
    if hub:
        other = torch.randint(1, n, (hub,), generator=torch.Generator().manual_seed(seed))
        edge_index = torch.cat([edge_index, torch.stack([torch.zeros_like(other), other])], 1)
    return torch.cat([edge_index, edge_index.flip(0)], 1), (n, n)


_SOURCE_MAJOR_GRAPHS = {
    "random": _GRAPHS["random"],
    "heavy_rows": _GRAPHS["heavy_rows"],
    "bipartite": _GRAPHS["bipartite"],
    # source 0 with 110k out-edges: a source row cut into many chunks that add their sums
    "hub_source": lambda: (_GRAPHS["super"]()[0].flip(0), (2000, 2000)),
    "symmetric": lambda: _symmetric(400, 3000, seed=6),
    "symmetric_hub": lambda: _symmetric(1500, 9000, seed=7, hub=2500),
}


@pytest.mark.parametrize("graph_name", list(_SOURCE_MAJOR_GRAPHS))
@pytest.mark.parametrize("F", (7, 64, 512))
@pytest.mark.parametrize("tie_break", ["split", "even"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ties", [False, True])
def test_transposed_backward_matches_reference(monkeypatch, graph_name, F, tie_break, weighted, ties):
    """The source-major backward (GNN_FASTPATH_SR_BWD=transposed) against the float64
    reference: single winners by the source-major pass, ties by the walk, every gradient; on
    symmetric graphs over the forward CSR (no transpose built)."""
    monkeypatch.setenv("GNN_FASTPATH_SR_BWD", "transposed")
    edge_index, sizes = _SOURCE_MAJOR_GRAPHS[graph_name]()
    graph = Graph.from_edge_index(edge_index.cuda(), sizes)
    for reduce in ("max", "min"):
        _check(graph, F, reduce, weighted, tie_break, ties=ties, seed=2)
    symmetric = graph_name.startswith("symmetric")
    assert graph.is_symmetric() == symmetric
    # a symmetric graph walks its own CSR: the source-major CSR shares the forward's arrays
    assert (graph.kernel_source_csr().indices is graph.kernel_csr().indices) == symmetric

