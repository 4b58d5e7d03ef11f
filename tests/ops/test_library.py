"""The custom operators (gnn_fastpath.ops.library): every forward and backward operator passes
torch.library.opcheck; the public ops on GraphTensors equal the same ops on the eager Graph;
the extra row of removed edges equals the graph built without them; attention dropout's
backward uses the forward's mask. CUDA versions under the ``cuda`` marker."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import pytest
import torch
from torch import Tensor

import gnn_fastpath
from gnn_fastpath import Graph, reference
from gnn_fastpath.graph.tensors import GraphTensors, as_graph, from_coo
from gnn_fastpath.ops import library
from gnn_fastpath.ops.dot_attention import DotAttentionFunction
from gnn_fastpath.ops.gat_attention import GATAttentionFunction
from gnn_fastpath.ops.gatv2_attention import GATv2AttentionFunction

from zoo import random_edges

pytestmark = pytest.mark.skipif(not library.AVAILABLE, reason="torch has no torch.library.register_fake (< 2.4)")

L = torch.ops.gnn_fastpath
H, D, F = 2, 3, 4
SLOPE = 0.2
FAMILIES = ("gat_attention", "gatv2_attention", "dot_attention", "spmm", "segment_reduce")
#: The per-edge (caller-order) inputs of each family: sliced when edges are removed.
EDGE_INPUTS = {"edge_score", "edge_weight", "edge_term"}


# ------------------------------------------------------------------------------ graphs
@dataclass
class Coo:
    src: Tensor
    dst: Tensor
    n_src: int
    n_dst: int

    @property
    def m(self) -> int:
        return self.src.numel()


def _coo(n_src: int, n_dst: int, m: int, seed: int) -> Coo:
    """Self loops, duplicate edges, an empty destination row, caller order shuffled."""
    edge_index, _ = random_edges(n_src, n_dst, m, seed, empty_rows=1)
    return Coo(edge_index[0], edge_index[1], n_src, n_dst)


@pytest.fixture(scope="module", params=["homogeneous", "bipartite"])
def coo(request) -> Coo:
    return _coo(9, 9, 30, 1) if request.param == "homogeneous" else _coo(9, 6, 26, 2)


@pytest.fixture(scope="module")
def graphs(coo):
    """(GraphTensors built traceably, the eager Graph) of the same edges."""
    return (from_coo(coo.src, coo.dst, coo.n_src, coo.n_dst),
            Graph.from_coo(coo.src, coo.dst, coo.n_src, coo.n_dst))


@pytest.fixture(scope="module")
def removed_graphs(coo):
    """(mask of removed edges, GraphTensors with them in the extra row, eager Graph of the
    kept edges only). The self loops and every fourth edge are removed."""
    removed = (coo.src == coo.dst) | (torch.arange(coo.m) % 4 == 1)
    assert 0 < int(removed.sum()) < coo.m
    kept = ~removed
    return (removed, from_coo(coo.src, coo.dst, coo.n_src, coo.n_dst, removed=removed),
            Graph.from_coo(coo.src[kept], coo.dst[kept], coo.n_src, coo.n_dst))


# ------------------------------------------------------------------------------ inputs
def _shapes(family: str, n_src: int, n_dst: int, m: int) -> Dict[str, tuple]:
    """The tensor inputs of a family in the public op's order (optional ones included)."""
    if family == "gat_attention":
        return {"x_src": (n_src, H, D), "score_src": (n_src, H), "score_dst": (n_dst, H), "edge_score": (m, H),
                "edge_weight": (m,)}
    if family == "gatv2_attention":
        return {"x_src": (n_src, H, D), "x_dst": (n_dst, H, D), "att": (H, D), "edge_term": (m, H, D)}
    if family == "dot_attention":
        return {"q": (n_dst, H, D), "k": (n_src, H, D), "v": (n_src, H, D), "edge_term": (m, H, D)}
    return {"x": (n_src, F), "edge_weight": (m,)}


def make_inputs(family: str, n_src: int, n_dst: int, m: int, optional: bool, *, dtype=torch.float64,
                device="cpu", seed: int = 0, ties: bool = False) -> Dict[str, Optional[Tensor]]:
    """Leaf tensors requiring grad; the optional edge inputs None unless ``optional``.
    ``ties``: integer-valued features and weights (many tied extremes)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in _shapes(family, n_src, n_dst, m).items():
        if name in EDGE_INPUTS and not optional:
            out[name] = None
            continue
        if ties:
            t = torch.randint(-2, 3, shape, generator=gen).to(dtype)
            if name == "edge_weight":
                t = t.abs() + 1
        else:
            t = torch.randn(shape, generator=gen, dtype=dtype)
            if name == "edge_weight":
                t = t.abs() + 0.5
        out[name] = t.to(device).requires_grad_()
    return out


def call_public(family: str, graph, t: Dict[str, Optional[Tensor]], opt: dict):
    """``gnn_fastpath.<family>(graph, ...)`` with the family's options ``opt``."""
    ret, p = opt.get("ret", False), opt.get("p", 0.0)
    if family == "gat_attention":
        return gnn_fastpath.gat_attention(graph, t["x_src"], t["score_src"], t["score_dst"], t["edge_score"], SLOPE,
                                          ret, p, t["edge_weight"])
    if family == "gatv2_attention":
        return gnn_fastpath.gatv2_attention(graph, t["x_src"], t["x_dst"], t["att"], SLOPE, t["edge_term"], ret, p)
    if family == "dot_attention":
        return gnn_fastpath.dot_attention(graph, t["q"], t["k"], t["v"], 0.7, t["edge_term"], ret, p)
    if family == "spmm":
        return gnn_fastpath.spmm(graph, t["x"], t["edge_weight"], opt.get("norm", "none"))
    return gnn_fastpath.segment_reduce(graph, t["x"], opt.get("reduce", "max"), t["edge_weight"],
                                       opt.get("tie_break", "split"))


def _outputs(result) -> Tuple[Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


def _weights(outputs, seed: int = 7):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outputs]


def run_with_grads(family, graph, t, opt, weights=None, select=None):
    """(outputs, {input name: grad}) of ``sum(w * out)`` over the outputs; ``select[i]``: a
    mask of the rows of output ``i`` that enter the loss (None: all)."""
    for v in t.values():
        if v is not None:
            v.grad = None
    outs = _outputs(call_public(family, graph, t, opt))
    weights = weights or _weights(outs)
    loss = 0.0
    for i, (o, w) in enumerate(zip(outs, weights)):
        term = o * w
        if select is not None and select[i] is not None:
            term = term[select[i]]
        loss = loss + term.sum()
    loss.backward()
    return outs, {k: v.grad for k, v in t.items() if v is not None}


def _options(family: str):
    """Option sets of the value tests, with ids."""
    if family in ("gat_attention", "gatv2_attention", "dot_attention"):
        return [({"ret": r}, f"ret={r}") for r in (False, True, "dropped")]
    if family == "spmm":
        return [({"norm": n}, f"norm={n}") for n in ("none", "left", "right", "both")]
    return [({"reduce": r, "tie_break": tb}, f"{r}-{tb}") for r in ("max", "min") for tb in ("split", "first")]


VALUE_CASES = [pytest.param(f, o, opt, id=f"{f}-{oid}-{'edge' if opt else 'noedge'}")
               for f in FAMILIES for (o, oid) in _options(f) for opt in (False, True)]


def _ties(family: str) -> bool:
    return family == "segment_reduce"


def _detached(t):
    return {k: None if v is None else v.detach().clone().requires_grad_() for k, v in t.items()}


# ---------------------------------------------------------------------- opcheck (CPU)
@dataclass
class OpCase:
    name: str
    forward: Callable[[GraphTensors], tuple]  # gt -> the forward operator's arguments
    backward: Callable[[GraphTensors, tuple, tuple], tuple]  # (gt, fwd args, fwd outputs) -> backward args


def _needs(inputs, first_only: bool):
    """The backward operators' ``needs``: one flag per differentiable input (False for None)."""
    flags = [t is not None for t in inputs]
    if first_only:
        flags = [flags[0]] + [False] * (len(flags) - 1)
    return flags


def _attention_cases(device="cpu", dtype=torch.float32):
    cases = []
    rng = torch.tensor([1234, 0], dtype=torch.int64, device=device)
    for family, (opt_a, opt_b) in (("gat_attention", ("edge_score", "edge_weight")),
                                   ("gatv2_attention", ("edge_term", None)),
                                   ("dot_attention", ("edge_term", None))):
        presence = [(a, b) for a in (False, True) for b in ((False, True) if opt_b else (False,))]
        for (a, b), code, p, first_only in itertools.chain(
                itertools.product(presence, (0, 1, 2), (0.0,), (False,)),
                [(presence[-1], code, 0.3, False) for code in (0, 2)],
                [(presence[-1], 1, 0.0, True)]):
            cases.append(_attention_case(family, a, b, code, p, rng if p else None, first_only, device, dtype))
    return cases


def _attention_case(family, a, b, code, p, rng, first_only, device, dtype):
    name = f"{family}-opt{int(a)}{int(b)}-code{code}-p{p}" + ("-needs_first" if first_only else "")

    def inputs(gt: GraphTensors):
        n_src, n_dst, m = gt.n_src, gt.indptr.numel() - 1, gt.num_edges
        t = make_inputs(family, n_src, n_dst, m, True, dtype=dtype, device=device, seed=3)
        names = list(t)
        if family == "gat_attention":
            t["edge_score"] = t["edge_score"] if a else None
            t["edge_weight"] = t["edge_weight"] if b else None
        else:
            t["edge_term"] = t["edge_term"] if a else None
        return [t[k] for k in names]

    def forward(gt):
        tensors = inputs(gt)
        scalar = SLOPE if family != "dot_attention" else 0.6
        return (*gt.operands, *tensors, scalar, p, rng, code, dtype)

    def backward(gt, fargs, fout):
        tensors = fargs[library.N_GRAPH:-5]
        scalar = fargs[-5]
        out, lse, alpha = (o.detach() for o in fout)
        gen = torch.Generator().manual_seed(5)
        grad_out = torch.randn(out.shape, generator=gen, dtype=out.dtype).to(device)
        grad_alpha = torch.randn(alpha.shape, generator=gen, dtype=alpha.dtype).to(device) if code else None
        plain = [None if x is None else x.detach() for x in tensors]
        return (*gt.operands, *plain, out, lse, grad_out, alpha if code else None, grad_alpha, scalar, p, rng, code,
                _needs(plain, first_only))

    return OpCase(name, forward, backward)


def _spmm_cases(device="cpu", dtype=torch.float32):
    cases = []
    for w, norm, first_only in itertools.product((False, True), ("none", "left", "right", "both"), (False, True)):
        if first_only and not w:
            continue

        def forward(gt, w=w, norm=norm):
            t = make_inputs("spmm", gt.n_src, gt.indptr.numel() - 1, gt.num_edges, w, dtype=dtype, device=device)
            return (*gt.operands, t["x"], t["edge_weight"], norm, dtype)

        def backward(gt, fargs, fout, norm=norm, first_only=first_only):
            x, ew = fargs[library.N_GRAPH], fargs[library.N_GRAPH + 1]
            grad_out = torch.randn(fout.shape, dtype=fout.dtype, device=device)
            need_w = ew is not None and not first_only
            # x is passed only when the edge-weight gradient reads it (as the autograd does)
            return (*gt.operands, x.detach() if need_w else None, None if ew is None else ew.detach(), norm,
                    grad_out, x.dtype, True, need_w)

        cases.append(OpCase(f"spmm-w{int(w)}-{norm}" + ("-needs_x" if first_only else ""), forward, backward))
    return cases


def _segment_cases(device="cpu", dtype=torch.float32):
    cases = []
    for w, reduce, tie, need_grad in itertools.product((False, True), ("max", "min"), ("split", "first"),
                                                       (True, False)):
        def forward(gt, w=w, reduce=reduce, tie=tie, need_grad=need_grad):
            t = make_inputs("segment_reduce", gt.n_src, gt.indptr.numel() - 1, gt.num_edges, w, dtype=dtype,
                            device=device, ties=True)
            return (*gt.destination_major().operands, t["x"], t["edge_weight"], reduce, tie, "keep", need_grad)

        def backward(gt, fargs, fout, reduce=reduce, tie=tie):
            x, ew = fargs[library.N_GRAPH], fargs[library.N_GRAPH + 1]
            result, aux = (o.detach() for o in fout)
            grad_out = torch.randn(result.shape, dtype=result.dtype, device=device)
            return (*gt.destination_major().operands, x.detach(), None if ew is None else ew.detach(), result, aux,
                    grad_out, reduce, tie, "keep", True, ew is not None)

        cases.append(OpCase(f"segment_reduce-w{int(w)}-{reduce}-{tie}-grad{int(need_grad)}", forward, backward))
    return cases


def _op_cases(device="cpu"):
    return _attention_cases(device) + _spmm_cases(device) + _segment_cases(device)


OP_CASES = _op_cases()


def _family(case: OpCase) -> str:
    return case.name.split("-")[0]


def _assert_opcheck(op, args, test_utils=None):
    kwargs = {} if test_utils is None else {"test_utils": test_utils}
    result = torch.library.opcheck(op, args, **kwargs)
    assert result, "opcheck ran no test"
    bad = {k: v for k, v in result.items() if v != "SUCCESS"}
    assert not bad, bad


@pytest.fixture(scope="module", params=["plain", "extra_row"])
def op_graph(request, coo) -> GraphTensors:
    if request.param == "plain":
        return from_coo(coo.src, coo.dst, coo.n_src, coo.n_dst)
    return from_coo(coo.src, coo.dst, coo.n_src, coo.n_dst, removed=coo.src == coo.dst)


@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c.name)
def test_forward_operator_opcheck(case, op_graph):
    """Schema, fake implementation, autograd registration (none: the family's Function is the
    autograd, so outputs must not require grad) and AOT dispatch with dynamic shapes of the
    forward operator."""
    _assert_opcheck(getattr(L, _family(case)).default, case.forward(op_graph))


def _backward_args(case: OpCase, gt: GraphTensors) -> tuple:
    family = _family(case)
    fargs = case.forward(gt)
    with torch.no_grad():
        fout = getattr(L, family).default(*fargs)
    return case.backward(gt, fargs, fout)


@pytest.mark.parametrize("case", OP_CASES, ids=lambda c: c.name)
def test_backward_operator_opcheck(case, op_graph):
    """The same for the backward operator (under AOTDispatcher its CPU implementation, which
    recomputes the reference with autograd inside the kernel, must still give its eager
    values: not zeros)."""
    _assert_opcheck(getattr(L, _family(case) + "_backward").default, _backward_args(case, op_graph))


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_autograd_gradients_on_the_reference_operators(graphs, coo, family):
    """torch.compile with compiled autograd (the backward traced into a graph as well): the
    gradients equal eager ones. The backward operators then run inside an AOT graph, where
    the caller has excluded autograd's dispatch keys."""
    gt, _ = graphs
    t = make_inputs(family, coo.n_src, coo.n_dst, coo.m, True, dtype=torch.float32, ties=_ties(family))
    names = [k for k, v in t.items() if v is not None]
    t2 = _detached(t)
    expected, expected_grads = run_with_grads(family, gt, t, {})

    def fn(*tensors):
        return call_public(family, gt, dict(zip(names, tensors)), {})

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager")):
        out = compiled(*[t2[k] for k in names])
        (out * _weights([out])[0]).sum().backward()
    torch._dynamo.reset()
    _assert_close(out.detach(), expected[0], "output", atol=1e-6, rtol=1e-5)
    for k in names:
        _assert_close(t2[k].grad, expected_grads[k], f"grad of {k}", atol=1e-6, rtol=1e-5)


def test_every_family_has_both_operators():
    for family in FAMILIES:
        assert isinstance(getattr(L, family).default, torch._ops.OpOverload)
        assert isinstance(getattr(L, family + "_backward").default, torch._ops.OpOverload)
    assert {_family(c) for c in OP_CASES} == set(FAMILIES)


# ------------------------------------------------------------- values: GraphTensors == Graph
def _assert_close(actual, expected, what, atol=1e-12, rtol=1e-10):
    assert actual.shape == expected.shape, what
    assert actual.dtype == expected.dtype, what
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("family,opt,optional", VALUE_CASES)
def test_graph_tensors_equal_eager_graph(graphs, coo, family, opt, optional):
    """The public op on GraphTensors (the operators) equals it on the eager Graph (float64):
    outputs (alpha in caller order) and every input's gradient."""
    gt, g = graphs
    t = make_inputs(family, coo.n_src, coo.n_dst, coo.m, optional, ties=_ties(family))
    t2 = _detached(t)
    expected, expected_grads = run_with_grads(family, g, t, opt)
    actual, actual_grads = run_with_grads(family, gt, t2, opt)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        _assert_close(a, e, f"output {i}")
    assert actual_grads.keys() == expected_grads.keys()
    for k, e in expected_grads.items():
        assert e is not None and actual_grads[k] is not None, k
        _assert_close(actual_grads[k], e, f"grad of {k}")


@pytest.mark.parametrize("family", ["gat_attention", "spmm", "segment_reduce"])
def test_graph_tensors_equal_eager_graph_float32(graphs, coo, family):
    """The same in float32 (different CSR edge orders: sums may round differently)."""
    gt, g = graphs
    t = make_inputs(family, coo.n_src, coo.n_dst, coo.m, True, dtype=torch.float32, ties=_ties(family))
    t2 = _detached(t)
    opt = {"ret": True}
    expected, expected_grads = run_with_grads(family, g, t, opt)
    actual, actual_grads = run_with_grads(family, gt, t2, opt)
    for i, (a, e) in enumerate(zip(actual, expected)):
        _assert_close(a, e, f"output {i}", atol=1e-6, rtol=1e-5)
    for k, e in expected_grads.items():
        _assert_close(actual_grads[k], e, f"grad of {k}", atol=1e-6, rtol=1e-5)


def test_graph_tensors_of_an_empty_graph():
    """M = 0: every op gives zeros (and zero gradients) through the operators."""
    empty = torch.empty(0, dtype=torch.int64)
    gt = from_coo(empty, empty, 4, 3)
    for family in FAMILIES:
        t = make_inputs(family, 4, 3, 0, True)
        outs, grads = run_with_grads(family, gt, t, {"ret": True})
        assert outs[0].shape[0] == 3 and not outs[0].abs().sum(), family
        for k, gr in grads.items():
            assert gr is not None and not gr.abs().sum(), (family, k)


# ------------------------------------------------------------- the extra row of removed edges
@pytest.mark.parametrize("family,opt,optional", VALUE_CASES)
def test_extra_row_equals_graph_without_removed_edges(removed_graphs, coo, family, opt, optional):
    """Removed edges in the extra row take no part: outputs and gradients equal those of the
    graph built from the kept edges (spmm's left/both norms included: out-degrees count the
    kept edges only), and the removed edges' edge-input gradients are exactly 0.
    (alpha of removed edges is not a result: the loss reads kept edges' alpha only.)"""
    removed, gt, g_kept = removed_graphs
    assert gt.extra_row and gt.n_dst == coo.n_dst and gt.indptr.numel() == coo.n_dst + 2
    kept = ~removed
    t = make_inputs(family, coo.n_src, coo.n_dst, coo.m, optional, ties=_ties(family))
    t_kept = {k: None if v is None else (v.detach()[kept] if k in EDGE_INPUTS else v.detach()).clone()
              .requires_grad_() for k, v in t.items()}
    expected, expected_grads = run_with_grads(family, g_kept, t_kept, opt)
    weights = _weights(expected)
    if len(expected) == 2:  # alpha [M_kept, H]: spread the loss weights over all M edges
        full = torch.zeros((coo.m,) + tuple(weights[1].shape[1:]), dtype=weights[1].dtype)
        full[kept] = weights[1]
        weights = [weights[0], full]
    actual, actual_grads = run_with_grads(family, gt, t, opt, weights, select=[None, kept])
    _assert_close(actual[0], expected[0], "output")
    if len(expected) == 2:
        assert actual[1].shape[0] == coo.m
        _assert_close(actual[1][kept], expected[1], "alpha of kept edges")
    for k, e in expected_grads.items():
        a = actual_grads[k]
        if k in EDGE_INPUTS:
            _assert_close(a[kept], e, f"grad of {k} (kept edges)")
            assert torch.equal(a[removed], torch.zeros_like(a[removed])), f"grad of {k} on removed edges"
        else:
            _assert_close(a, e, f"grad of {k}")


def test_extra_row_with_every_edge_removed(coo):
    """All edges removed: every destination row is empty (zeros), every gradient 0."""
    gt = from_coo(coo.src, coo.dst, coo.n_src, coo.n_dst, removed=torch.ones(coo.m, dtype=torch.bool))
    for family in FAMILIES:
        t = make_inputs(family, coo.n_src, coo.n_dst, coo.m, True)
        outs, grads = run_with_grads(family, gt, t, {}, select=[None])
        assert outs[0].shape[0] == coo.n_dst
        assert not outs[0].abs().sum(), family
        for k, gr in grads.items():
            assert not gr.abs().sum(), (family, k)


# ------------------------------------------------------------------------ attention dropout
ATTENTION = ("gat_attention", "gatv2_attention", "dot_attention")
P = 0.4


def _operator_fn(family, gt, names, t, rng, code, p=P, out_dtype=torch.float64):
    """f(*differentiable inputs) -> out or (out, alpha) through the family's autograd Function
    on the GraphTensors (so through its forward and backward operators) with a fixed rng."""
    scalar = 0.6 if family == "dot_attention" else SLOPE
    function = {"gat_attention": GATAttentionFunction, "gatv2_attention": GATv2AttentionFunction,
                "dot_attention": DotAttentionFunction}[family]

    def f(*diff):
        values = dict(t)
        values.update(zip(names, diff))
        tensors = [values[k] for k in _shapes(family, 1, 1, 1)]
        return function.apply(*tensors, gt, scalar, library._ATTENTION_VALUES[code], p, rng, None, out_dtype)

    return f


def _reference(family, graph, t, code, p=P):
    """The reference op of ``family`` on ``graph`` (out, or (out, alpha) for codes 1 and 2)."""
    ret = library._ATTENTION_VALUES[code]
    if family == "gat_attention":
        return reference.gat_attention(graph, t["x_src"], t["score_src"], t["score_dst"], t["edge_score"], SLOPE, ret,
                                       p, t["edge_weight"], out_dtype=torch.float64)
    if family == "gatv2_attention":
        return reference.gatv2_attention(graph, t["x_src"], t["x_dst"], t["att"], SLOPE, t["edge_term"], ret, p,
                                         out_dtype=torch.float64)
    return reference.dot_attention(graph, t["q"], t["k"], t["v"], 0.6, t["edge_term"], ret, p, torch.float64)


@pytest.mark.parametrize("family", ATTENTION)
@pytest.mark.parametrize("code", [0, 1, 2])
def test_dropout_backward_uses_the_forward_mask(graphs, coo, family, code):
    """gradcheck through the Function on the operators with dropout > 0: the analytical
    backward (the backward operator) agrees with finite differences of the forward, which holds only if it drops the
    forward's edges; outputs and gradients equal the reference run with the same rng seed.
    The mask is real (some kept weight is dropped), fixed by ``rng`` and changes with it."""
    gt, _ = graphs
    t = make_inputs(family, coo.n_src, coo.n_dst, coo.m, True, seed=11)
    names = [k for k, v in t.items() if v is not None]
    rng = torch.tensor([98765, 0], dtype=torch.int64)
    f = _operator_fn(family, gt, names, t, rng, code)
    diff = [t[k] for k in names]
    assert torch.autograd.gradcheck(f, diff, eps=1e-6, atol=1e-7, rtol=1e-5)
    # the same rng draws the same mask; another rng another one; p=0 none
    with torch.no_grad():
        a = f(*diff)
        b = f(*diff)
        other = _operator_fn(family, gt, names, t, torch.tensor([4321, 0]), code)(*diff)
        plain = _operator_fn(family, gt, names, t, None, code, p=0.0)(*diff)
    # the reference evaluated with the operator's rng (its CPU mask comes from torch's
    # generator seeded by rng[0]): the same outputs, and autograd through it the operator's
    # gradients
    leaves = [v.detach().clone().requires_grad_() for v in diff]
    ref_inputs = dict(t)
    ref_inputs.update(zip(names, leaves))
    with library.fixed_rng(rng):
        ref = _reference(family, as_graph(gt), ref_inputs, code)
    ops_out = f(*diff)
    ops_out, ref = (ops_out if code else (ops_out,)), (ref if code else (ref,))
    weights = _weights(ref)
    grads = torch.autograd.grad([(o * w).sum() for o, w in zip(ops_out, weights)], diff)
    ref_grads = torch.autograd.grad([(o * w).sum() for o, w in zip(ref, weights)], leaves)
    for o, r in zip(ops_out, ref):
        _assert_close(o.detach(), r.detach(), "output vs reference")
    for n, g, r in zip(names, grads, ref_grads):
        _assert_close(g, r, f"grad of {n} vs reference")
    first = lambda r: r[0] if isinstance(r, tuple) else r  # noqa: E731
    assert torch.equal(first(a), first(b))
    assert not torch.allclose(first(a), first(other))
    assert not torch.allclose(first(a), first(plain))
    if code == 2:  # the weights the aggregation used: dropped ones 0, kept ones scaled
        dropped, weights = a[1], plain[1]
        zero = dropped == 0
        assert zero.any() and (~zero).any()
        torch.testing.assert_close(dropped[~zero], weights[~zero] / (1 - P))
    if code == 1:  # the softmax weights themselves: no dropout applied
        torch.testing.assert_close(a[1], plain[1])


@pytest.mark.parametrize("family", ["gat_attention", "dot_attention"])
def test_public_op_dropout_gradient_follows_its_own_mask(graphs, coo, family):
    """Through the public op (a fresh rng per call): the values' gradient is linear in the
    dropped weights the same call returned, so each call's backward must use that call's mask.
    Two calls drop differently."""
    gt, _ = graphs
    src, dst = coo.src, coo.dst
    results = []
    for seed in (0, 1):
        t = make_inputs(family, coo.n_src, coo.n_dst, coo.m, True, seed=4)
        torch.manual_seed(100 + seed)
        outs, grads = run_with_grads(family, gt, t, {"ret": "dropped", "p": P}, select=[None, None])
        out, dropped = outs
        w_out = _weights(outs)[0]
        value = "x_src" if family == "gat_attention" else "v"
        # d/d value_j of sum_i w_i . sum_{e: dst=i} alpha_e value_{src e}: sum_e alpha_e w_{dst e}
        expected = torch.zeros_like(t[value]).index_add_(0, src, dropped.detach().unsqueeze(-1) * w_out[dst])
        if family == "gat_attention":
            _assert_close(grads[value], expected, "grad of x_src")
            # the output itself is the dropped weights' sum
            msg = dropped.detach().unsqueeze(-1) * t["x_src"].detach()[src]
        else:
            _assert_close(grads[value], expected, "grad of v")  # edge_term adds to values, not to dv
            msg = dropped.detach().unsqueeze(-1) * (t["v"].detach()[src] + t["edge_term"].detach())
        rebuilt = torch.zeros_like(out).index_add_(0, dst, msg)
        _assert_close(out.detach(), rebuilt, "output from the dropped weights")
        results.append(dropped.detach())
    assert not torch.equal(results[0] == 0, results[1] == 0), "two calls drew the same mask"


# ------------------------------------------------------------------------------------ CUDA
CUDA_VALUE_CASES = [pytest.param(f, o, opt, id=f"{f}-{oid}-{'edge' if opt else 'noedge'}")
                    for f in FAMILIES for (o, oid) in _options(f) for opt in (False, True)]


@pytest.fixture(scope="module")
def cuda_coo():
    """A larger graph on the GPU: a super node and empty rows besides loops and duplicates."""
    edge_index, _ = random_edges(300, 200, 3000, 5, empty_rows=3, super_node_degree=700)
    src, dst = edge_index.cuda()
    return Coo(src, dst, 300, 200)


@pytest.mark.cuda
@pytest.mark.parametrize("extra_row", [False, True])
def test_cuda_opcheck(cuda_coo, extra_row):
    """Every forward and backward operator case passes opcheck on CUDA tensors (float32)."""
    c = cuda_coo
    gt = from_coo(c.src, c.dst, c.n_src, c.n_dst, removed=(c.src == c.dst) if extra_row else None)
    for case in _op_cases("cuda"):
        family = _family(case)
        fargs = case.forward(gt)
        _assert_opcheck(getattr(L, family).default, fargs)
        with torch.no_grad():
            fout = getattr(L, family).default(*fargs)
        _assert_opcheck(getattr(L, family + "_backward").default, case.backward(gt, fargs, fout))


def _to_cpu64(t):
    return {k: None if v is None else v.detach().double().cpu().requires_grad_() for k, v in t.items()}


@pytest.mark.cuda
@pytest.mark.parametrize("family,opt,optional", CUDA_VALUE_CASES)
def test_cuda_graph_tensors_equal_eager_graph(cuda_coo, family, opt, optional):
    """On the kernels, float32: the operators on GraphTensors (static Graph) equal the eager
    Graph's kernels and the float64 reference, outputs and every gradient."""
    c = cuda_coo
    gt = from_coo(c.src, c.dst, c.n_src, c.n_dst)
    g = Graph.from_coo(c.src, c.dst, c.n_src, c.n_dst)
    g_cpu = Graph.from_coo(c.src.cpu(), c.dst.cpu(), c.n_src, c.n_dst)
    t = make_inputs(family, c.n_src, c.n_dst, c.m, optional, dtype=torch.float32, device="cuda",
                    ties=_ties(family))
    t_eager, t_ref = _detached(t), _to_cpu64(t)
    actual, actual_grads = run_with_grads(family, gt, t, opt)
    weights = _weights(actual)
    eager, eager_grads = run_with_grads(family, g, t_eager, opt, weights)
    ref, ref_grads = run_with_grads(family, g_cpu, t_ref, opt, [w.double().cpu() for w in weights])
    for i, (a, e, r) in enumerate(zip(actual, eager, ref)):
        _assert_close(a, e, f"output {i} vs eager kernels", atol=1e-4, rtol=1e-4)
        _assert_close(a.double().cpu(), r, f"output {i} vs float64 reference", atol=1e-4, rtol=1e-4)
    for k in actual_grads:
        _assert_close(actual_grads[k], eager_grads[k], f"grad of {k} vs eager kernels", atol=1e-4, rtol=1e-4)
        _assert_close(actual_grads[k].double().cpu(), ref_grads[k], f"grad of {k} vs reference", atol=1e-4,
                      rtol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_extra_row_equals_graph_without_removed_edges(cuda_coo, family):
    c = cuda_coo
    removed = (c.src == c.dst) | (torch.arange(c.m, device="cuda") % 5 == 0)
    kept = ~removed
    gt = from_coo(c.src, c.dst, c.n_src, c.n_dst, removed=removed)
    g_kept = Graph.from_coo(c.src[kept], c.dst[kept], c.n_src, c.n_dst)
    t = make_inputs(family, c.n_src, c.n_dst, c.m, True, dtype=torch.float32, device="cuda", ties=_ties(family))
    t_kept = {k: None if v is None else (v.detach()[kept] if k in EDGE_INPUTS else v.detach()).clone()
              .requires_grad_() for k, v in t.items()}
    expected, expected_grads = run_with_grads(family, g_kept, t_kept, {})
    actual, actual_grads = run_with_grads(family, gt, t, {}, _weights(expected))
    _assert_close(actual[0], expected[0], "output", atol=1e-4, rtol=1e-4)
    for k, e in expected_grads.items():
        a = actual_grads[k]
        if k in EDGE_INPUTS:
            _assert_close(a[kept], e, f"grad of {k} (kept)", atol=1e-4, rtol=1e-4)
            assert torch.equal(a[removed], torch.zeros_like(a[removed])), k
        else:
            _assert_close(a, e, f"grad of {k}", atol=1e-4, rtol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("family", ["gat_attention", "dot_attention"])
def test_cuda_dropout_gradient_follows_its_own_mask(cuda_coo, family):
    """The Philox mask of the forward is the backward's: the values' gradient equals the
    dropped weights' scatter, and the output their weighted sum; the same rng tensor replays
    the same mask, another draws another."""
    c = cuda_coo
    gt = from_coo(c.src, c.dst, c.n_src, c.n_dst)
    t = make_inputs(family, c.n_src, c.n_dst, c.m, True, dtype=torch.float32, device="cuda", seed=4)
    outs, grads = run_with_grads(family, gt, t, {"ret": "dropped", "p": P})
    out, dropped = outs
    w_out = _weights(outs)[0]
    value = "x_src" if family == "gat_attention" else "v"
    expected = torch.zeros_like(t[value]).index_add_(0, c.src, dropped.detach().unsqueeze(-1) * w_out[c.dst])
    _assert_close(grads[value], expected, f"grad of {value}", atol=1e-4, rtol=1e-4)
    base = t["x_src"].detach()[c.src] if family == "gat_attention" else t["v"].detach()[c.src] + t["edge_term"].detach()
    rebuilt = torch.zeros_like(out).index_add_(0, c.dst, dropped.detach().unsqueeze(-1) * base)
    _assert_close(out.detach(), rebuilt, "output", atol=1e-4, rtol=1e-4)
    zero = dropped == 0
    assert zero.any() and (~zero).any()
    names = [k for k, v in t.items() if v is not None]
    plain = {k: None if v is None else v.detach() for k, v in t.items()}
    with torch.no_grad():
        runs = [_operator_fn(family, gt, names, plain, torch.tensor(r, device="cuda"), 2,
                             out_dtype=torch.float32)(*[plain[k] for k in names])[1]
                for r in ([5, 0], [5, 0], [6, 0])]
    assert torch.equal(runs[0] == 0, runs[1] == 0)
    assert not torch.equal(runs[0] == 0, runs[2] == 0)


ATTENTION_FAMILIES = ["gat_attention", "gatv2_attention", "dot_attention"]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("family", ATTENTION_FAMILIES)
def test_cuda_graph_tensors_split_rows_in_16bit(cuda_coo, family, dtype):
    """16-bit attention on GraphTensors: the static work list splits the super node's row
    (700 in-edges, chunks of 256), so the merge and the 16-bit split-row accumulators of the
    compiled path run; outputs and gradients equal the eager Graph's kernels within 16-bit
    rounding (both accumulate in float32 and round once)."""
    c = cuda_coo
    gt = from_coo(c.src, c.dst, c.n_src, c.n_dst)
    g = Graph.from_coo(c.src, c.dst, c.n_src, c.n_dst)
    assert int((gt.indptr[1:] - gt.indptr[:-1]).max()) > 256
    t = make_inputs(family, c.n_src, c.n_dst, c.m, True, dtype=torch.float32, device="cuda")
    t = {k: None if v is None else v.detach().to(dtype).requires_grad_() for k, v in t.items()}
    actual, actual_grads = run_with_grads(family, gt, t, {"ret": True})
    eager, eager_grads = run_with_grads(family, g, _detached(t), {"ret": True}, _weights(actual))
    for i, (a, e) in enumerate(zip(actual, eager)):
        assert a.dtype == e.dtype
        _assert_close(a.float(), e.float(), f"output {i} vs eager kernels", atol=2e-2, rtol=2e-2)
    for k in actual_grads:
        assert actual_grads[k].dtype == eager_grads[k].dtype
        _assert_close(actual_grads[k].float(), eager_grads[k].float(), f"grad of {k} vs eager kernels", atol=5e-2,
                      rtol=2e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("family", ATTENTION_FAMILIES)
def test_cuda_graph_tensors_scattered_split_rows(family):
    """Several long rows at scattered ids among many short ones (a sampled batch's shape with a
    few hubs): the static work list splits them wherever they sit, its merges visit exactly
    them (they stop at the first entry without chunks), and outputs and gradients equal the
    eager Graph's kernels (float32)."""
    gen = torch.Generator().manual_seed(11)
    n, hubs = 2000, {7: 300, 555: 1100, 1290: 520, 1999: 258}
    src = [torch.randint(0, n, (3 * n,), generator=gen)]
    dst = [torch.randint(0, n, (3 * n,), generator=gen)]
    for row, degree in hubs.items():
        src.append(torch.randint(0, n, (degree,), generator=gen))
        dst.append(torch.full((degree,), row))
    order = torch.randperm(sum(s.numel() for s in src), generator=gen)
    src, dst = torch.cat(src)[order].cuda(), torch.cat(dst)[order].cuda()
    gt = from_coo(src, dst, n, n)
    g = Graph.from_coo(src, dst, n, n)
    t = make_inputs(family, n, n, src.numel(), True, dtype=torch.float32, device="cuda", seed=3)
    actual, actual_grads = run_with_grads(family, gt, t, {"ret": True})
    eager, eager_grads = run_with_grads(family, g, _detached(t), {"ret": True}, _weights(actual))
    for i, (a, e) in enumerate(zip(actual, eager)):
        _assert_close(a, e, f"output {i} vs eager kernels", atol=1e-4, rtol=1e-4)
    for k in actual_grads:
        _assert_close(actual_grads[k], eager_grads[k], f"grad of {k} vs eager kernels", atol=1e-4, rtol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("variant", [None, "transposed"], ids=["rule", "forced-transposed"])
@pytest.mark.parametrize("family", ATTENTION_FAMILIES)
def test_cuda_extra_row_attention_weights_and_forced_backward(cuda_coo, monkeypatch, family, variant):
    """The compiled path's work list leaves the extra row out, so no kernel walks the removed
    edges: their attention weights and edge-input gradients are still exactly 0, the kept
    edges' weights equal those of the graph without them, and a forced source-major backward
    (which would meet the removed edges in the transpose) gives the same gradients."""
    if variant is not None:
        monkeypatch.setenv(f"GNN_FASTPATH_{family.split('_')[0].upper()}_BWD", variant)
    c = cuda_coo
    removed = (c.src == c.dst) | (torch.arange(c.m, device="cuda") % 5 == 0)
    kept = ~removed
    assert int(removed.sum()) > 256  # a row the static list would have split
    gt = from_coo(c.src, c.dst, c.n_src, c.n_dst, removed=removed)
    g_kept = Graph.from_coo(c.src[kept], c.dst[kept], c.n_src, c.n_dst)
    t = make_inputs(family, c.n_src, c.n_dst, c.m, True, dtype=torch.float32, device="cuda", ties=_ties(family))
    t_kept = {k: None if v is None else (v.detach()[kept] if k in EDGE_INPUTS else v.detach()).clone()
              .requires_grad_() for k, v in t.items()}
    expected, expected_grads = run_with_grads(family, g_kept, t_kept, {"ret": True})
    weights = _weights(expected)
    full = torch.zeros((c.m,) + tuple(weights[1].shape[1:]), dtype=weights[1].dtype, device="cuda")
    full[kept] = weights[1]
    actual, actual_grads = run_with_grads(family, gt, t, {"ret": True}, [weights[0], full])
    _assert_close(actual[0], expected[0], "output", atol=1e-4, rtol=1e-4)
    _assert_close(actual[1][kept], expected[1], "alpha of kept edges", atol=1e-4, rtol=1e-4)
    assert torch.equal(actual[1][removed], torch.zeros_like(actual[1][removed])), "alpha of removed edges"
    for k, e in expected_grads.items():
        a = actual_grads[k]
        assert torch.isfinite(a).all(), k
        if k in EDGE_INPUTS:
            _assert_close(a[kept], e, f"grad of {k} (kept)", atol=1e-4, rtol=1e-4)
            assert torch.equal(a[removed], torch.zeros_like(a[removed])), k
        else:
            _assert_close(a, e, f"grad of {k}", atol=1e-4, rtol=1e-4)
