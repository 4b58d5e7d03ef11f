"""PyG SAGEConv: stock vs gnn_fastpath (reference ops on the CPU; CUDA under the cuda marker).

Features are integer-valued (and the projection's ReLU leaves many exact zeros), so max/min
meet tied extremes everywhere: the gradient comparisons check each path's tie rule
(``"split"`` for PyG's scatter, ``"first"`` for torch.sparse.mm), and :func:`test_tie_rule_is_exercised` shows that a wrong rule
fails on these inputs.
"""
from __future__ import annotations

import copy
import itertools

import pytest
import torch

import gnn_fastpath

from .conftest import make_graph

KEY = "pyg.SAGEConv"
F_IN, F_OUT, F_SRC, F_DST = 6, 5, 6, 4
N = 18
AGGRS = ["max", "min", "mean", "sum", "add"]
KINDS = ["tensor", "int32", "edge_index_obj", "coo", "csr"]


@pytest.fixture(autouse=True, scope="module")
def _string_aggregation_first(pyg):
    """PyG compiles SAGEConv's ``propagate`` at its first instantiation, with the fused sparse
    branch only if that instance fuses: make the first one a plain string aggregation."""
    from torch_geometric.nn import SAGEConv

    SAGEConv(2, 2, aggr="mean")


def _conv(aggr="mean", in_channels=F_IN, **kwargs):
    from torch_geometric.nn import SAGEConv

    return SAGEConv(in_channels, F_OUT, aggr=aggr, **kwargs)


def _tied(n, f=F_IN, seed=0):
    """Integer-valued features in {-2, ..., 2}: ties everywhere, many zeros."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, (n, f), generator=gen).float().requires_grad_()


def _graph(kind, n_src=N, n_dst=N, m=60, seed=0):
    """A graph input with zero in-degree rows, self loops and duplicates; a torch.sparse
    adjacency gets integer values in {1, 2} (weighted messages tie too)."""
    graph, nnz = make_graph(kind, n_src, n_dst, m, seed)
    if kind in ("coo", "csr"):
        coo = graph.to_sparse_coo().coalesce() if kind == "csr" else graph
        gen = torch.Generator().manual_seed(seed + 100)
        values = torch.randint(1, 3, (nnz,), generator=gen).float()
        coo = torch.sparse_coo_tensor(coo.indices(), values, coo.shape).coalesce()
        graph = coo.to_sparse_csr() if kind == "csr" else coo
    return graph


def _stock_inputs(kind, x, edge_index, *rest):
    # Stock's gradients are wrong for an int32 edge_index on torch 2.13 CPU (the backward of
    # scatter with an expanded int32 index): compare against stock on the int64 copy.
    return ((x, edge_index.long(), *rest), {}) if kind == "int32" else None


# --------------------------------------------------------------------------- fused grids
@pytest.mark.parametrize("aggr,kind,project", list(itertools.product(AGGRS, KINDS, [False, True])))
def test_aggregations_and_graph_inputs(check, aggr, kind, project):
    conv = _conv(aggr, project=project)
    x, edge_index = _tied(N), _graph(kind, seed=int(project))
    check.compare(conv, x, edge_index, stock_inputs=_stock_inputs(kind, x, edge_index))


@pytest.mark.parametrize("aggr,root_weight,bias,normalize", list(itertools.product(
    ["max", "mean", "sum"], [True, False], [True, False], [True, False])))
def test_module_arguments(check, aggr, root_weight, bias, normalize):
    conv = _conv(aggr, root_weight=root_weight, bias=bias, normalize=normalize, project=normalize)
    check.compare(conv, _tied(N, seed=2), _graph("tensor", seed=3))


@pytest.mark.parametrize("name", ["SumAggregation", "MeanAggregation", "MaxAggregation", "MinAggregation"])
@pytest.mark.parametrize("kind", ["tensor", "coo", "csr"])
def test_aggregation_modules(check, name, kind):
    """A plain aggregation module instead of its string: stock does not fuse then, so a
    torch.sparse adjacency's values are ignored and min/max split ties (scatter)."""
    from torch_geometric.nn import aggr

    conv = _conv(getattr(aggr, name)())
    assert not conv.fuse
    check.compare(conv, _tied(N, seed=4), _graph(kind, seed=5))


@pytest.mark.parametrize("aggr,kind", list(itertools.product(["max", "mean", "sum"], ["tensor", "edge_index_obj", "coo", "csr"])))
def test_bipartite(check, aggr, kind):
    n_src, n_dst = 20, 12
    conv = _conv(aggr, in_channels=(F_SRC, F_DST), project=aggr == "max")
    x = (_tied(n_src, F_SRC, seed=6), _tied(n_dst, F_DST, seed=7))
    check.compare(conv, x, _graph(kind, n_src, n_dst, seed=8))


@pytest.mark.parametrize("aggr", ["max", "min", "mean", "sum"])
def test_size_and_missing_target_side(check, aggr):
    """``size`` sets the target count (trailing targets without edges); ``(x_src, None)``
    skips the root weight and takes its target count from ``size``, or from ``x_src``."""
    n_src, n_dst = 15, 11
    edge_index = _graph("tensor", n_src, 8, seed=9)  # targets < 8: rows 8..10 stay empty
    conv = _conv(aggr, in_channels=(F_SRC, F_DST))
    out = check.compare(conv, (_tied(n_src, F_SRC), _tied(n_dst, F_DST, seed=1)), edge_index,
                        size=(n_src, n_dst))[2]
    assert out.shape == (n_dst, F_OUT)
    out = check.compare(conv, (_tied(n_src, F_SRC), None), edge_index, (n_src, n_dst))[2]
    assert out.shape == (n_dst, F_OUT)
    out = check.compare(conv, (_tied(n_src, F_SRC), None), edge_index)[2]
    assert out.shape == (n_src, F_OUT)


@pytest.mark.parametrize("aggr", ["max", "mean"])
def test_empty_graph(check, aggr):
    check.compare(_conv(aggr, project=True), _tied(7), torch.empty(2, 0, dtype=torch.long))


@pytest.fixture
def deterministic_conv():
    """SAGEConv built under torch.use_deterministic_algorithms (its aggregation then reduces
    by segment whenever the graph gives a target pointer)."""
    previous = torch.are_deterministic_algorithms_enabled()

    def build(aggr, **kwargs):
        torch.use_deterministic_algorithms(True)
        try:
            return _conv(aggr() if callable(aggr) else aggr, **kwargs)
        finally:
            torch.use_deterministic_algorithms(previous)

    return build


def _sorted_edge_index(n_src=N, n_dst=N, seed=0):
    from torch_geometric import EdgeIndex

    edge_index, _ = make_graph("tensor", n_src, n_dst, 60, seed)
    return EdgeIndex(edge_index, sparse_size=(n_src, n_dst)).sort_by("col")[0]


def _deterministic_case(deterministic_conv, aggr, kind):
    from torch_geometric.nn import aggr as aggr_mod

    if kind == "sorted_edge_index":
        conv, edge_index = deterministic_conv(aggr, project=True), _sorted_edge_index(seed=10)
        assert edge_index.is_sorted_by_col
    else:  # a module aggregation does not fuse: message + aggregate with the CSR pointer
        module = {"max": "MaxAggregation", "min": "MinAggregation", "mean": "MeanAggregation",
                  "sum": "SumAggregation"}[aggr]
        conv, edge_index = deterministic_conv(getattr(aggr_mod, module)), _graph("csr", seed=11)
    assert conv.aggr_module._deterministic
    return conv, edge_index


@pytest.mark.parametrize("aggr", ["mean", "sum"])
@pytest.mark.parametrize("kind", ["sorted_edge_index", "csr_module_aggr"])
def test_deterministic_segment_path(check, deterministic_conv, aggr, kind):
    """Stock reduces by ``torch._segment_reduce``: sum and mean are the same op."""
    conv, edge_index = _deterministic_case(deterministic_conv, aggr, kind)
    check.compare(conv, _tied(N, seed=12), edge_index)


@pytest.mark.parametrize("aggr", ["max", "min"])
@pytest.mark.parametrize("kind", ["sorted_edge_index", "csr_module_aggr"])
def test_fallback_deterministic_segment_max(check, deterministic_conv, aggr, kind):
    """torch's _segment_reduce backward divides a tie's gradient among the tied entries only
    when it is positive: no tie rule reproduces it, so max/min run stock there."""
    from gnn_fastpath.integrations.pyg.sage_conv import _csr_gives_pointer

    conv, edge_index = _deterministic_case(deterministic_conv, aggr, kind)
    if kind == "csr_module_aggr" and not _csr_gives_pointer(conv):
        pytest.skip("PyG's untemplated collect hands a CSR adjacency no pointer (scatter path)")
    check.fallback(conv, _tied(N, seed=12), edge_index, reason="segment_ties")


def test_torch_segment_reduce_tie_gradient_depends_on_sign():
    """The torch behaviour behind 'segment_ties' (if torch fixes it, revisit the fallback)."""
    src = torch.ones(3, 1, requires_grad=True)
    out = torch._segment_reduce(src, "max", offsets=torch.tensor([0, 3]), initial=None)
    positive, = torch.autograd.grad(out, src, torch.tensor([[3.0]]), retain_graph=True)
    negative, = torch.autograd.grad(out, src, torch.tensor([[-3.0]]))
    assert positive.flatten().tolist() == [1.0, 1.0, 1.0]
    assert negative.flatten().tolist() == [-3.0, -3.0, -3.0]


def _wrong_rule(monkeypatch, rule):
    original = gnn_fastpath.ops.segment_reduce

    def patched(graph, x, reduce="max", edge_weight=None, tie_break="split"):
        return original(graph, x, reduce, edge_weight, rule)

    monkeypatch.setattr(gnn_fastpath.ops, "segment_reduce", patched)


@pytest.mark.parametrize("case,wrong", [("tensor", "even"), ("tensor", "first"), ("csr", "split"),
                                        ("csr", "last")])
def test_tie_rule_is_exercised(check, monkeypatch, case, wrong):
    """On these inputs another tie rule than stock's gives other gradients: the grids above
    really check the rules. (Without ``project``: ties at the zeros of its ReLU carry no
    gradient further back, ties between equal integer features do.)"""
    conv, edge_index = _conv("max"), _graph(case, seed=1)
    x = _tied(N, seed=12)
    check.compare(conv, x, edge_index)  # the right rule
    _wrong_rule(monkeypatch, wrong)
    with pytest.raises(AssertionError, match="grad of"):
        check.compare(conv, x, edge_index)


def test_graph_memoised_and_ops_used(monkeypatch):
    """max/min run segment_reduce, mean/sum spmm, with the caller's Graph (cached)."""
    calls = []
    for name in ("segment_reduce", "spmm"):
        original = getattr(gnn_fastpath.ops, name)
        monkeypatch.setattr(gnn_fastpath.ops, name,
                            lambda g, x, *a, _n=name, _o=original, **k: calls.append((_n, g)) or _o(g, x, *a, **k))
    edge_index = _graph("tensor", seed=13)
    x = torch.randn(N, F_IN)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        for aggr in ("max", "min", "mean", "sum"):
            _conv(aggr)(x, edge_index)
    assert [c[0] for c in calls] == ["segment_reduce", "segment_reduce", "spmm", "spmm"]
    assert len({id(c[1]) for c in calls}) == 1
    assert gnn_fastpath.stats()[KEY] == {"fused": {"cuda": 0, "reference": 4}, "fallback": {}}


def test_cora(check, cora):
    for aggr in ("mean", "max"):
        conv = _conv(aggr, in_channels=cora.num_features, project=aggr == "max")
        check.compare(conv, cora.x.clone().requires_grad_(), cora.edge_index)


def test_tolokers(check, tolokers):
    x, edge_index = tolokers
    conv = _conv("max", in_channels=x.size(1))
    check.compare(conv, x.clone().requires_grad_(), edge_index)


# --------------------------------------------------------------------------- fallbacks
@pytest.mark.parametrize("aggr", ["lstm", "std", "softmax", ["mean", "max"], "powermean_module"])
def test_fallback_other_aggregations(check, aggr):
    from torch_geometric.nn.aggr import PowerMeanAggregation

    if aggr == "powermean_module":
        aggr = PowerMeanAggregation(learn=True)
    edge_index = _sorted_edge_index(12, 12, seed=1)  # lstm takes targets sorted
    check.fallback(_conv(aggr), _tied(12), edge_index.as_subclass(torch.Tensor), reason="aggr")


class _MessageSubclass:
    """Built lazily (the class must derive from PyG's SAGEConv)."""

    @staticmethod
    def make():
        from torch_geometric.nn import SAGEConv

        class DoubledMessages(SAGEConv):
            def message(self, x_j):
                return 2 * x_j

        return DoubledMessages(F_IN, F_OUT, aggr="max")


def test_fallback_subclass_overriding_message(check):
    check.fallback(_MessageSubclass.make(), _tied(12), _graph("tensor", 12, 12), reason="subclass")


def test_subclass_without_overrides_is_fused(check):
    from torch_geometric.nn import SAGEConv

    class Plain(SAGEConv):
        pass

    conv = Plain(F_IN, F_OUT, aggr="min", project=True)
    x, edge_index = _tied(12), _graph("tensor", 12, 12)
    expected = copy.deepcopy(conv)(x, edge_index)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        actual = conv(x, edge_index)
    check.close(actual, expected, "output")
    assert gnn_fastpath.stats()[KEY] == {"fused": {"cuda": 0, "reference": 1}, "fallback": {}}


class _FirstInstanceUnfused:
    """A class whose first instance has a module aggregation: PyG compiles its propagate
    without the fused branch, and its later fusing instances raise on sparse input."""

    @staticmethod
    def make():
        from torch_geometric.nn import SAGEConv
        from torch_geometric.nn.aggr import MaxAggregation

        class Compiled(SAGEConv):
            pass

        Compiled(F_IN, F_OUT, aggr=MaxAggregation())
        return Compiled(F_IN, F_OUT, aggr="max")


def test_fallback_propagate_without_fused_branch(check):
    from gnn_fastpath.integrations.pyg.sage_conv import _runs_fused

    conv = _FirstInstanceUnfused.make()
    if _runs_fused(conv):
        pytest.skip("PyG could not compile this class's propagate from its template")
    check.fallback(conv, _tied(12), _graph("csr", 12, 12), reason="aggr")


@pytest.mark.parametrize("case", ["flow", "size_mismatch", "batched_x", "sparse_values_grad", "uncoalesced_coo",
                                  "x_dst_width_dtype"])
def test_fallback_arguments(check, case):
    n = 12
    edge_index, x, kwargs, conv = _graph("tensor", n, n), _tied(n), {}, _conv("max")
    if case == "flow":
        reason, conv = "flow", _conv("max", flow="target_to_source")
    elif case == "size_mismatch":  # stock raises ValueError
        reason, kwargs = "size", dict(size=(n, n + 3))
    elif case == "batched_x":  # stock propagates along node_dim=-2
        reason, x = "input", torch.randn(2, n, F_IN)
    elif case == "sparse_values_grad":
        reason = "sparse_grad"
        adj = _graph("csr", n, n)
        edge_index = torch.sparse_csr_tensor(adj.crow_indices(), adj.col_indices(),
                                             adj.values().clone().requires_grad_(), adj.shape)
    elif case == "uncoalesced_coo":
        reason = "edge_index"
        edge_index = torch.sparse_coo_tensor(edge_index.flip(0), torch.rand(edge_index.size(1)), (n, n))
    else:  # a float64 target side: stock's lin_r raises
        reason, x = "dtype", (x, torch.randn(n, F_IN, dtype=torch.float64))
    check.fallback(conv, x, edge_index, reason=reason, **kwargs)


# --------------------------------------------------------------------------- GPU
def _cuda_run(module, x, edge_index, enabled):
    x = tuple(t.detach().clone().requires_grad_() for t in x) if isinstance(x, tuple) else \
        x.detach().clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    if enabled:
        with gnn_fastpath.enabled(frameworks="pyg"):
            out = module(x, edge_index)
    else:
        out = module(x, edge_index)
    gen = torch.Generator().manual_seed(7)
    (out * torch.randn(out.shape, generator=gen).to(out.device)).sum().backward()
    xs = x if isinstance(x, tuple) else (x,)
    return out, [p.grad for p in module.parameters()] + [t.grad for t in xs]


@pytest.mark.cuda
@pytest.mark.parametrize("aggr,kind", [("max", "tensor"), ("min", "edge_index_obj"), ("mean", "tensor"),
                                       ("sum", "tensor"), ("mean", "csr"), ("sum", "coo"), ("max", "bipartite"),
                                       ("max", "super_node"), ("mean", "super_node")])
def test_cuda_matches_stock(check, aggr, kind):
    import torch_geometric.typing

    n_src, n_dst = (20, 12) if kind == "bipartite" else (N, N)
    if kind == "bipartite":
        conv = _conv(aggr, in_channels=(F_SRC, F_DST), project=True)
        x = (_tied(n_src, F_SRC), _tied(n_dst, F_DST, seed=1))
        edge_index = _graph("tensor", n_src, n_dst, seed=2)
    elif kind == "super_node":  # target 0 gets 300 more in-edges (the kernels' heavy rows)
        from zoo import random_edges

        conv, x = _conv(aggr), _tied(N)
        edge_index, _ = random_edges(N, N, 60, 4, empty_rows=2, super_node_degree=300)
    else:
        conv, x, edge_index = _conv(aggr, project=True), _tied(N), _graph(kind, seed=3)
    if torch_geometric.typing.WITH_TORCH_SCATTER and aggr in ("max", "min"):
        # stock's torch_scatter.scatter_max gives a tie's gradient to an arbitrary tied edge
        x = tuple(torch.randn_like(t) for t in x) if isinstance(x, tuple) else torch.randn_like(x)
    cuda = lambda t: tuple(u.cuda() for u in t) if isinstance(t, tuple) else t.cuda()  # noqa: E731
    x, edge_index = cuda(x), edge_index.cuda()
    expected, expected_grads = _cuda_run(copy.deepcopy(conv).cuda(), x, edge_index, False)
    actual, actual_grads = _cuda_run(copy.deepcopy(conv).cuda(), x, edge_index, True)
    assert actual.is_cuda
    check.close(actual, expected, "output")
    floor = 1e-2 * max(g.abs().max().item() for g in expected_grads)
    for i, (a, e) in enumerate(zip(actual_grads, expected_grads)):
        check.close(a, e, f"grad {i}", floor=floor)
    counts = gnn_fastpath.stats()[KEY]
    assert counts["fused"]["cuda"] > 0 and counts["fallback"] == {}, counts


@pytest.mark.cuda
def test_cuda_sparse_max_runs_stock(check):
    """Stock raises NotImplementedError for max over a CUDA torch.sparse adjacency: so does
    the enabled layer (it runs stock), counted under 'sparse_reduce'."""
    check.fallback(_conv("max").cuda(), _tied(N).detach().cuda(), _graph("csr").cuda(), reason="sparse_reduce")


@pytest.mark.parametrize("aggr", ["max", "min"])
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_max_min_keep_torch_non_finite_semantics(check, aggr, bad):
    """PyG's max/min (torch scatter_reduce): NaN wins, infinities are values; value and
    every gradient (NaN included) as stock."""
    from torch_geometric.nn import SAGEConv

    torch.manual_seed(0)
    edge_index = torch.tensor([[0, 1, 2, 0, 3, 1], [1, 2, 0, 2, 1, 3]])
    x = torch.randn(4, 5)
    x[0, :3] = float(bad)
    conv = SAGEConv(5, 3, aggr=aggr)
    x_stock, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = conv(x_stock, edge_index)
    want.sum().backward()
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        got = conv(x_ours, edge_index)
        got.sum().backward()
    torch.testing.assert_close(got, want, equal_nan=True)
    torch.testing.assert_close(x_ours.grad, x_stock.grad, equal_nan=True)
