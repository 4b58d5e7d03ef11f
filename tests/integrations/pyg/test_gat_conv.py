"""PyG GATConv: stock vs gnn_fastpath (reference ops on the CPU; CUDA under the cuda marker)."""
from __future__ import annotations

import copy
import itertools

import pytest
import torch

import gnn_fastpath
from gnn_fastpath import Graph

from .conftest import make_graph

KEY = "pyg.GATConv"
F_IN, F_SRC, F_DST = 6, 5, 7


def _conv(**kwargs):
    from torch_geometric.nn import GATConv

    kwargs.setdefault("in_channels", F_IN)
    kwargs.setdefault("out_channels", 4)
    torch.manual_seed(kwargs.pop("seed", 0))
    conv = GATConv(**kwargs)
    if conv.bias is not None:  # stock initialises the bias to 0: make it count
        with torch.no_grad():
            conv.bias.normal_()
    return conv


def _x(n, f=F_IN):
    return torch.randn(n, f, requires_grad=True)


# lin: in_channels=int (one projection ``lin``); split: in_channels=(F, F), so a single x goes
# through ``lin_src`` and ``lin_dst`` separately.
MODULE_GRID = list(itertools.product([1, 2], [True, False], [True, False], [True, False], [True, False],
                                     ["lin", "split"]))


@pytest.mark.parametrize("heads,concat,residual,bias,add_self_loops,lin", MODULE_GRID)
def test_module_arguments(check, heads, concat, residual, bias, add_self_loops, lin):
    conv = _conv(in_channels=F_IN if lin == "lin" else (F_IN, F_IN), heads=heads, concat=concat,
                 residual=residual, bias=bias, add_self_loops=add_self_loops,
                 negative_slope=0.1 if heads == 2 else 0.2)
    assert (conv.lin is None) == (lin == "split")
    edge_index, _ = make_graph("tensor", 20, 20, 50, seed=heads)
    rw = [None, True][(concat + residual + bias) % 2]
    check.compare(conv, _x(20), edge_index, return_attention_weights=rw)


FILLS = ["mean", 0.5, None, "tensor", "max", "add", "min", "mul", 2]


@pytest.mark.parametrize("fill_value", FILLS)
@pytest.mark.parametrize("edge_dim", [3, "1d"])
@pytest.mark.parametrize("bipartite", [None, "more_src"])
def test_edge_attr_and_fill_value(check, fill_value, edge_dim, bipartite):
    n_src, n_dst = (18, 18) if bipartite is None else (19, 11)
    one_d = edge_dim == "1d"
    if fill_value == "tensor":
        fill_value = torch.tensor(0.7) if one_d else torch.tensor([0.1, -0.2, 0.3])
    conv = _conv(in_channels=(F_SRC, F_DST) if bipartite else F_IN, heads=2, edge_dim=1 if one_d else 3,
                 fill_value=fill_value)
    edge_index, m = make_graph("tensor", n_src, n_dst, 45, seed=3)
    if bipartite:  # targets below min(N_src, N_dst): stock can reduce fill_value over them
        edge_index = edge_index[:, edge_index[1] < n_dst]
        m = edge_index.size(1)
    edge_attr = torch.randn(m, requires_grad=True) if one_d else torch.randn(m, 3, requires_grad=True)
    x = (_x(n_src, F_SRC), _x(n_dst, F_DST)) if bipartite else _x(n_src)
    check.compare(conv, x, edge_index, edge_attr, return_attention_weights=True)


@pytest.mark.parametrize("add_self_loops", [True, False])
@pytest.mark.parametrize("fill_value", ["mean", 0.5, "tensor", "max"])
def test_edge_attr_without_edge_dim_is_ignored(check, add_self_loops, fill_value):
    """Stock's edge_update uses edge_attr only with lin_edge: without edge_dim it runs the
    self-loop bookkeeping on it (remove, fill) and then ignores it. So does the fused path."""
    if fill_value == "tensor":
        fill_value = torch.tensor([1.0, 2.0])
    conv = _conv(heads=2, add_self_loops=add_self_loops, fill_value=fill_value)
    edge_index, m = make_graph("tensor", 16, 16, 40, seed=5)
    check.compare(conv, _x(16), edge_index, torch.randn(m, 2, requires_grad=True), return_attention_weights=True)


# A torch.sparse adjacency with add_self_loops falls back (test_fallback_arguments); an int32
# edge_index is compared with stock on its int64 copy, whose returned edge_index is int64.
GRAPH_GRID = [(kind, bipartite, loops, rw)
              for kind, bipartite, loops, rw in itertools.product(
                  ["tensor", "int32", "edge_index_obj", "coo", "csr"], [None, "more_dst", "more_src"],
                  [True, False], [None, True])
              if not (loops and kind in ("coo", "csr")) and not (kind == "int32" and rw)]


@pytest.mark.parametrize("kind,bipartite,add_self_loops,rw", GRAPH_GRID)
def test_graph_inputs(check, kind, bipartite, add_self_loops, rw):
    n_src, n_dst = {None: (18, 18), "more_dst": (11, 19), "more_src": (19, 11)}[bipartite]
    # fill_value "mean" (the default) would make stock fail when N_dst > N_src: a number here.
    conv = _conv(in_channels=(F_SRC, F_DST) if bipartite else F_IN, heads=2, add_self_loops=add_self_loops,
                 edge_dim=2, fill_value=0.5 if bipartite == "more_dst" else "mean", residual=True)
    edge_index, m = make_graph(kind, n_src, n_dst, 45, seed=n_dst)
    x = (_x(n_src, F_SRC), _x(n_dst, F_DST)) if bipartite else _x(n_src)
    edge_attr = torch.randn(m, 2, requires_grad=True)
    kwargs = dict(edge_attr=edge_attr, return_attention_weights=rw)
    # Stock's gradients are wrong for int32 edge_index on torch 2.13 CPU (scatter_add_'s
    # backward with an expanded int32 index): compare against stock on the int64 copy.
    stock_inputs = ((x, edge_index.long()), kwargs) if kind == "int32" else None
    check.compare(conv, x, edge_index, stock_inputs=stock_inputs, **kwargs)


@pytest.mark.parametrize("add_self_loops", [True, False])
@pytest.mark.parametrize("n_src,n_dst", [(14, 14), (16, 9), (9, 16)])
def test_pair_with_one_projection(check, add_self_loops, n_src, n_dst):
    """A module built with in_channels=int given an (x_src, x_dst) pair: ``lin`` projects both."""
    conv = _conv(heads=2, add_self_loops=add_self_loops, residual=True, fill_value=1.5, edge_dim=2)
    edge_index, m = make_graph("tensor", n_src, n_dst, 40, seed=n_src)
    x = (_x(n_src), _x(n_dst))
    check.compare(conv, x, edge_index, torch.randn(m, 2, requires_grad=True), return_attention_weights=True)


@pytest.mark.parametrize("size", [False, True])
@pytest.mark.parametrize("add_self_loops", [True, False])
@pytest.mark.parametrize("kind", ["tensor", "coo"])
def test_pair_without_targets(check, size, add_self_loops, kind):
    """``(x_src, None)``: the logit is the source term alone, no residual, and the output has
    ``size[1]`` rows (else one per source)."""
    if kind == "coo" and add_self_loops:
        pytest.skip("a torch.sparse adjacency with add_self_loops falls back")
    n_src = 15
    n_dst = 9 if size or kind == "coo" else n_src
    conv = _conv(in_channels=(F_SRC, F_DST), heads=2, add_self_loops=add_self_loops, residual=True,
                 edge_dim=2, fill_value="max" if size else "add")
    edge_index, m = make_graph(kind, n_src, n_dst, 40, seed=4)
    kwargs = dict(edge_attr=torch.randn(m, 2, requires_grad=True), return_attention_weights=True)
    if size:
        kwargs["size"] = (n_src, n_dst)
    _, _, out = check.compare(conv, (_x(n_src, F_SRC), None), edge_index, **kwargs)
    assert out[0].shape == (n_dst, 8)


@pytest.mark.parametrize("bipartite", [False, True])
@pytest.mark.parametrize("add_self_loops", [True, False])
def test_size_argument(check, bipartite, add_self_loops):
    n_src, n_dst = (17, 10) if bipartite else (13, 13)
    conv = _conv(in_channels=(F_SRC, F_DST) if bipartite else F_IN, heads=2, add_self_loops=add_self_loops)
    edge_index, _ = make_graph("tensor", n_src, n_dst, 40, seed=7)
    x = (_x(n_src, F_SRC), _x(n_dst, F_DST)) if bipartite else _x(n_src)
    check.compare(conv, x, edge_index, size=(n_src, n_dst), return_attention_weights=True)
    check.compare(conv, x, edge_index, None, (n_src, n_dst))  # positional, as stock's signature


def test_returned_edge_index_with_loops_matches_stock(check):
    conv = _conv(heads=2)
    edge_index, _ = make_graph("tensor", 15, 15, 40)
    _, _, out = check.compare(conv, _x(15), edge_index, return_attention_weights=True)
    ei = out[1][0]
    n_loops = int((edge_index[0] == edge_index[1]).sum())
    assert n_loops > 0
    assert ei.size(1) == edge_index.size(1) - n_loops + 15
    assert torch.equal(ei[:, -15:], torch.arange(15).repeat(2, 1))


def test_graph_without_edges(check):
    """No edges (and no loops added): stock's edge_update returns before lin_edge, whose
    gradients stay None; the output is the bias (and residual) alone."""
    conv = _conv(heads=2, add_self_loops=False, edge_dim=2, residual=True)
    edge_index = torch.empty(2, 0, dtype=torch.long)
    _, fused, out = check.compare(conv, _x(6), edge_index, torch.randn(0, 2), return_attention_weights=True)
    assert fused.lin_edge.weight.grad is None
    assert out[1][1].shape == (0, 2)


@pytest.mark.parametrize("training", [False, True])
def test_dropout_eval_and_zero(check, training):
    conv = _conv(heads=2, dropout=0.0 if training else 0.6, edge_dim=2)
    conv.train(training)
    edge_index, m = make_graph("tensor", 15, 15, 40)
    check.compare(conv, _x(15), edge_index, torch.randn(m, 2), return_attention_weights=True)


def test_dropout_distribution():
    """Training with p > 0: stock returns alpha *after* dropout; so does the fused path:
    about p of the weights zeroed, the rest scaled by 1 / (1 - p), and the output is the
    aggregate of exactly the returned weights."""
    torch.manual_seed(0)
    p = 0.5
    conv = _conv(heads=2, dropout=p, bias=False)
    edge_index, _ = make_graph("tensor", 200, 200, 1500)
    x = torch.randn(200, F_IN)
    conv.eval()
    with torch.no_grad():
        _, (_, alpha_eval) = conv(x, edge_index, return_attention_weights=True)
        conv.train()
        _, (_, alpha_stock) = conv(x, edge_index, return_attention_weights=True)
        with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
            out, (ei, alpha_fused) = conv(x, edge_index, return_attention_weights=True)
        xs = conv.lin(x).view(-1, 2, 4)
        manual = torch.zeros(200, 2, 4).index_add_(0, ei[1], alpha_fused.unsqueeze(-1) * xs[ei[0]])
    assert gnn_fastpath.stats()[KEY]["fused"]["reference"] == 1
    for alpha in (alpha_stock, alpha_fused):
        kept = alpha != 0
        assert abs(kept.float().mean().item() - (1 - p)) < 0.04
        torch.testing.assert_close(alpha[kept], alpha_eval[kept] / (1 - p), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out, manual.view(200, 8), rtol=1e-5, atol=1e-6)


def test_looped_graph_built_once(monkeypatch):
    conv = _conv(heads=2, edge_dim=2)
    edge_index, m = make_graph("tensor", 16, 16, 40)
    x, edge_attr = torch.randn(16, F_IN), torch.randn(m, 2)
    builds = []
    original = Graph.from_coo.__func__
    monkeypatch.setattr(Graph, "from_coo", classmethod(lambda cls, *a, **k: builds.append(1) or original(cls, *a, **k)))
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        first = conv(x, edge_index, edge_attr)
        assert len(builds) == 2  # the input's Graph and its looped Graph
        for _ in range(3):
            torch.testing.assert_close(conv(x, edge_index, edge_attr), first, rtol=0, atol=0)
    assert len(builds) == 2
    assert gnn_fastpath.stats()[KEY]["fused"]["reference"] == 4


def test_state_dict_unchanged(check):
    conv = _conv(heads=2, edge_dim=3, residual=True)
    before = {k: v.clone() for k, v in conv.state_dict().items()}
    edge_index, m = make_graph("tensor", 12, 12, 30)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        conv(torch.randn(12, F_IN), edge_index, torch.randn(m, 3))
    after = conv.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
    assert [n for n, _ in conv.named_buffers()] == []
    assert gnn_fastpath.stats()[KEY]["fused"]["reference"] == 1


def test_gat_model_with_edge_features(check):
    """PyG's GAT model (v2=False) with edge features: every layer fused, as stock."""
    from torch_geometric.nn.models import GAT

    torch.manual_seed(0)
    stock = GAT(F_IN, 8, num_layers=2, out_channels=3, heads=2, edge_dim=2).eval()
    model = copy.deepcopy(stock)
    edge_index, m = make_graph("tensor", 20, 20, 60)
    x, edge_attr = torch.randn(20, F_IN), torch.randn(m, 2)
    expected = stock(x, edge_index, edge_attr=edge_attr)
    with gnn_fastpath.enabled(frameworks="pyg", cpu="reference"):
        actual = model(x, edge_index, edge_attr=edge_attr)
    assert gnn_fastpath.stats()[KEY] == {"fused": {"cuda": 0, "reference": 2}, "fallback": {}}
    check.close(actual, expected, "output")


def test_cora(check, cora):
    conv = _conv(in_channels=cora.num_features, out_channels=8, heads=2)
    check.compare(conv, cora.x.clone().requires_grad_(), cora.edge_index, return_attention_weights=True)


def test_tolokers(check, tolokers):
    x, edge_index = tolokers
    conv = _conv(in_channels=x.size(1), out_channels=8, heads=2, residual=True, concat=False)
    check.compare(conv, x.clone().requires_grad_(), edge_index)


# --------------------------------------------------------------------------- fallbacks
def test_fallback_lazy_then_fused(check):
    conv = _conv(in_channels=-1, residual=True)
    edge_index, _ = make_graph("tensor", 12, 12, 30)
    x = torch.randn(12, F_IN)
    _, fused = check.fallback(conv, x, edge_index, reason="lazy", calls=1)
    check.compare(fused, x.requires_grad_(), edge_index)


def test_fallback_subclass(check):
    from torch_geometric.nn import GATConv

    class Mine(GATConv):
        def message(self, x_j, alpha):
            return 2 * super().message(x_j, alpha)

    edge_index, _ = make_graph("tensor", 12, 12, 30)
    check.fallback(Mine(F_IN, 4), torch.randn(12, F_IN), edge_index, reason="subclass")


@pytest.mark.parametrize("case", ["aggr_mean", "flow", "sparse_self_loops", "fill_beyond_min", "fill_bad_string",
                                  "fill_bad_tensor_ignored", "edge_attr_rows", "edge_attr_3d",
                                  "return_attention_int", "x_3d", "size_mismatch", "size_with_none",
                                  "att_src_shape"])
def test_fallback_arguments(check, case):
    n, m_default = 12, 30
    edge_index, m = make_graph("tensor", n, n, m_default)
    x = torch.randn(n, F_IN)
    kwargs, conv, reason = {}, _conv(heads=2), None
    if case == "aggr_mean":
        reason, conv = "aggr", _conv(heads=2, aggr="mean")
    elif case == "flow":
        reason, conv = "flow", _conv(heads=2, flow="target_to_source")
    elif case == "sparse_self_loops":
        reason = "sparse_self_loops"
        edge_index, _ = make_graph("csr", n, n, m_default)
    elif case == "fill_beyond_min":  # bipartite, a kept edge targets node >= min(N_src, N_dst): stock raises
        reason = "fill_value"
        conv = _conv(in_channels=(F_SRC, F_DST), edge_dim=2)
        edge_index, m = make_graph("tensor", 8, 14, 40)
        x = (torch.randn(8, F_SRC), torch.randn(14, F_DST))
        kwargs["edge_attr"] = torch.randn(m, 2)
    elif case == "fill_bad_string":  # stock raises
        reason, conv = "fill_value", _conv(edge_dim=2, fill_value="median")
        kwargs["edge_attr"] = torch.randn(m, 2)
    elif case == "fill_bad_tensor_ignored":  # stock's expand raises, even for an edge_attr it then ignores
        reason, conv = "fill_value", _conv(fill_value=torch.tensor([1.0, 2.0, 3.0]))
        kwargs["edge_attr"] = torch.randn(m, 2)
    elif case == "edge_attr_rows":  # stock raises
        reason, conv = "edge_attr", _conv(edge_dim=2)
        kwargs["edge_attr"] = torch.randn(m + 1, 2)
    elif case == "edge_attr_3d":
        reason, conv = "edge_attr", _conv(edge_dim=2, add_self_loops=False)
        kwargs["edge_attr"] = torch.randn(m, 1, 2)
    elif case == "return_attention_int":
        reason, kwargs["return_attention_weights"] = "return_attention_weights", 1
    elif case == "x_3d":
        reason, x = "input", torch.randn(2, n, F_IN)
    elif case == "size_mismatch":  # stock raises
        reason, kwargs["size"] = "size", (n, n + 1)
    elif case == "size_with_none":  # stock's min(size) raises with add_self_loops
        reason, kwargs["size"] = "size", (None, n)
    elif case == "att_src_shape":
        reason = "attn"
        conv.att_src = torch.nn.Parameter(torch.randn(1, 1, 4))  # broadcasts over heads in stock
    check.fallback(conv, x, edge_index, reason=reason, **kwargs)


@pytest.mark.parametrize("add_self_loops", [True, False])
def test_fallback_torch_sparse_tensor(check, add_self_loops):
    """A torch_sparse.SparseTensor adjacency runs stock (set_diag for self loops, the
    attention returned as the SparseTensor's values), counted under "edge_index"."""
    torch_sparse = pytest.importorskip("torch_sparse")
    edge_index, _ = make_graph("tensor", 12, 12, 30, loops=False)
    adj_t = torch_sparse.SparseTensor.from_edge_index(edge_index.flip(0), sparse_sizes=(12, 12))
    check.fallback(_conv(heads=2, add_self_loops=add_self_loops), torch.randn(12, F_IN), adj_t,
                   reason="edge_index", return_attention_weights=True)


# --------------------------------------------------------------------------- GPU
def _cuda_run(module, args, kwargs, enabled):
    args = tuple(tuple(t.detach().clone().requires_grad_() if t is not None else None for t in a)
                 if isinstance(a, tuple) else a.detach().clone().requires_grad_() if a.is_floating_point() else a
                 for a in args)
    module.zero_grad(set_to_none=True)
    if enabled:
        with gnn_fastpath.enabled(frameworks="pyg"):
            out = module(*args, **kwargs)
    else:
        out = module(*args, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    out, alpha = outs[0], outs[1][1] if len(outs) > 1 else None
    gen = torch.Generator().manual_seed(7)
    loss = (out * torch.randn(out.shape, generator=gen).to(out.device)).sum()
    if alpha is not None:
        loss = loss + (alpha * torch.randn(alpha.shape, generator=gen).to(out.device)).sum()
    loss.backward()
    leaves = [t for a in args for t in (a if isinstance(a, tuple) else (a,)) if t is not None and t.requires_grad]
    return (out, alpha), [p.grad for p in module.parameters()] + [t.grad for t in leaves]


@pytest.mark.cuda
@pytest.mark.parametrize("case", ["plain", "edge_dim", "bipartite", "mean_heads", "super_node", "no_targets"])
def test_cuda_matches_stock(check, case):
    from zoo import random_edges

    n = 40
    edge_index, m = make_graph("tensor", n, n, 160, seed=1)
    x = (_x(n),)
    kwargs = dict(return_attention_weights=True)
    if case == "plain":
        conv = _conv(heads=4, out_channels=32, residual=True)
    elif case == "edge_dim":
        conv = _conv(heads=2, out_channels=64, edge_dim=3)
        kwargs["edge_attr"] = torch.randn(m, 3)
    elif case == "bipartite":
        conv = _conv(in_channels=(F_SRC, F_DST), heads=2, out_channels=16, residual=True)
        edge_index, _ = make_graph("tensor", 30, 12, 100, seed=2)
        x = ((_x(30, F_SRC), _x(12, F_DST)),)
    elif case == "mean_heads":
        conv = _conv(heads=3, out_channels=8, concat=False)
    elif case == "super_node":  # target 0 gets 300 more in-edges (the kernels' heavy rows)
        conv = _conv(heads=2, out_channels=32)
        edge_index, _ = random_edges(n, n, 60, 4, empty_rows=2, super_node_degree=300)
    else:
        conv = _conv(in_channels=(F_SRC, F_DST), heads=2, out_channels=16, add_self_loops=False)
        edge_index, _ = make_graph("tensor", 30, 12, 100, seed=2)
        x = ((_x(30, F_SRC), None),)
        kwargs["size"] = (30, 12)
    cuda = lambda t: (tuple(u.cuda() if u is not None else None for u in t) if isinstance(t, tuple)  # noqa: E731
                      else t.cuda())
    args = tuple(cuda(a) for a in x) + (edge_index.cuda(),)
    kwargs = {k: cuda(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    expected, expected_grads = _cuda_run(copy.deepcopy(conv).cuda(), args, kwargs, False)
    actual, actual_grads = _cuda_run(copy.deepcopy(conv).cuda(), args, kwargs, True)
    assert actual[0].is_cuda
    for a, e, what in zip(actual, expected, ("output", "attention")):
        check.close(a, e, what)
    floor = 1e-2 * max(g.abs().max().item() for g in expected_grads if g is not None)
    for i, (a, e) in enumerate(zip(actual_grads, expected_grads)):
        assert (a is None) == (e is None), i
        if e is not None:
            check.close(a, e, f"grad {i}", floor=floor)
    counts = gnn_fastpath.stats()[KEY]
    assert counts["fused"]["cuda"] > 0 and counts["fallback"] == {}, counts
