"""Argument validation of the public ops: ValueError naming the argument and the bad value."""
import re

import numpy as np
import pytest
import torch

import gnn_fastpath
from gnn_fastpath import ops
from gnn_fastpath.graph import Graph

N_SRC, N_DST, M, H, D, F = 5, 4, 7, 2, 3, 6


@pytest.fixture(scope="module")
def g():
    ei = torch.tensor([[0, 1, 2, 3, 4, 0, 2], [0, 1, 2, 3, 0, 1, 1]])
    return Graph.from_edge_index(ei, (N_SRC, N_DST))


def t(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


@pytest.fixture
def gat_args():
    return {"x_src": t(N_SRC, H, D), "x_dst": t(N_DST, H, D), "att": t(H, D)}


@pytest.fixture
def dot_args():
    return {"q": t(N_DST, H, D), "k": t(N_SRC, H, D), "v": t(N_SRC, H, D)}


def test_valid_calls_pass(g, gat_args, dot_args):
    assert ops.gatv2_attention(g, **gat_args).shape == (N_DST, H, D)
    assert ops.dot_attention(g, **dot_args).shape == (N_DST, H, D)
    assert ops.spmm(g, t(N_SRC, F)).shape == (N_DST, F)
    assert ops.segment_reduce(g, t(N_SRC, F)).shape == (N_DST, F)
    # the package's top-level names are the ops
    assert gnn_fastpath.gatv2_attention is ops.gatv2_attention
    assert gnn_fastpath.spmm is ops.spmm


# ---------------------------------------------------------------------------- graph argument
@pytest.mark.parametrize("bad", [torch.tensor([[0, 1], [1, 0]]), None, "graph", [[0], [1]]])
def test_wrong_graph_type(bad, gat_args, dot_args):
    name = type(bad).__name__
    pattern = rf"graph must be a gnn_fastpath.Graph.*got {name}"
    with pytest.raises(ValueError, match=pattern):
        ops.gatv2_attention(bad, **gat_args)
    with pytest.raises(ValueError, match=pattern):
        ops.dot_attention(bad, **dot_args)
    with pytest.raises(ValueError, match=pattern):
        ops.spmm(bad, t(N_SRC, F))
    with pytest.raises(ValueError, match=pattern):
        ops.segment_reduce(bad, t(N_SRC, F))


# ---------------------------------------------------------------------------- gatv2
@pytest.mark.parametrize("arg, value, pattern", [
    ("x_src", t(N_SRC + 1, H, D), r"x_src must have shape \[5, \*, \*\], got \[6, 2, 3\]"),
    ("x_src", t(N_SRC, H * D), r"x_src must have shape \[5, \*, \*\], got \[5, 6\]"),
    ("x_src", torch.zeros(N_SRC, H, D, dtype=torch.int64), r"x_src must be a floating-point tensor.*int64"),
    ("x_src", [[0.0]], r"x_src must be a torch.Tensor, got list"),
    ("x_dst", t(N_DST, H + 1, D), r"x_dst must have shape \[4, 2, 3\], got \[4, 3, 3\]"),
    ("x_dst", t(N_DST, H, D + 1), r"x_dst must have shape \[4, 2, 3\], got \[4, 2, 4\]"),
    ("x_dst", t(N_SRC, H, D), r"x_dst must have shape \[4, 2, 3\], got \[5, 2, 3\]"),
    ("x_dst", t(N_DST, H, D, dtype=torch.float64), r"x_dst has dtype torch.float64.*torch.float32"),
    ("att", t(H, D + 1), r"att must have shape \[2, 3\], got \[2, 4\]"),
    ("att", t(D), r"att must have shape \[2, 3\], got \[3\]"),
    ("att", t(1, H, D), r"att must have shape \[2, 3\], got \[1, 2, 3\]"),
    ("edge_term", t(M + 1, H, D), r"edge_term must have shape \[7, 2, 3\], got \[8, 2, 3\]"),
    ("edge_term", t(M, H, D + 1), r"edge_term must have shape \[7, 2, 3\], got \[7, 2, 4\]"),
    ("edge_term", t(M, H * D), r"edge_term must have shape \[7, 2, 3\], got \[7, 6\]"),
    ("edge_term", torch.zeros(M, H, D, dtype=torch.int32), r"edge_term must be a floating-point.*int32"),
])
def test_gatv2_bad_tensor(g, gat_args, arg, value, pattern):
    gat_args[arg] = value
    with pytest.raises(ValueError, match=pattern):
        ops.gatv2_attention(g, **gat_args)


@pytest.mark.parametrize("arg, value, pattern", [
    ("dropout", -0.1, r"dropout must be in \[0, 1\], got -0.1"),
    ("dropout", 1.5, r"dropout must be in \[0, 1\], got 1.5"),
    ("dropout", float("nan"), r"dropout must be in \[0, 1\], got nan"),
    ("return_attention", "yes", r"return_attention must be False, True or 'dropped', got 'yes'"),
    ("return_attention", "True", r"return_attention must be False, True or 'dropped', got 'True'"),
    ("return_attention", 2, r"return_attention must be False, True or 'dropped', got 2"),
    ("return_attention", None, r"return_attention must be False, True or 'dropped', got None"),
])
def test_gatv2_bad_option(g, gat_args, arg, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        ops.gatv2_attention(g, **gat_args, **{arg: value})


# ---------------------------------------------------------------------------- dot
@pytest.mark.parametrize("arg, value, pattern", [
    ("k", t(N_SRC - 1, H, D), r"k must have shape \[5, \*, \*\], got \[4, 2, 3\]"),
    ("k", t(N_SRC, H * D), r"k must have shape \[5, \*, \*\], got \[5, 6\]"),
    ("q", t(N_DST, H, D + 1), r"q must have shape \[4, 2, 3\], got \[4, 2, 4\]"),
    ("q", t(N_DST, H + 1, D), r"q must have shape \[4, 2, 3\], got \[4, 3, 3\]"),
    ("q", t(N_SRC, H, D), r"q must have shape \[4, 2, 3\], got \[5, 2, 3\]"),
    ("v", t(N_SRC, H, D + 1), r"v must have shape \[5, 2, 3\], got \[5, 2, 4\]"),
    ("v", t(N_DST, H, D), r"v must have shape \[5, 2, 3\], got \[4, 2, 3\]"),
    ("v", t(N_SRC, H, D, dtype=torch.float64), r"v has dtype torch.float64"),
    ("q", torch.zeros(N_DST, H, D, dtype=torch.int64), r"q must be a floating-point tensor"),
    ("edge_term", t(M - 1, H, D), r"edge_term must have shape \[7, 2, 3\], got \[6, 2, 3\]"),
    ("edge_term", t(M, H, D, dtype=torch.float64), r"edge_term has dtype torch.float64"),
])
def test_dot_bad_tensor(g, dot_args, arg, value, pattern):
    dot_args[arg] = value
    with pytest.raises(ValueError, match=pattern):
        ops.dot_attention(g, **dot_args)


@pytest.mark.parametrize("arg, value, pattern", [
    ("dropout", -1, r"dropout must be in \[0, 1\], got -1"),
    ("dropout", 2.0, r"dropout must be in \[0, 1\], got 2.0"),
    ("return_attention", "drop", r"return_attention must be False, True or 'dropped', got 'drop'"),
])
def test_dot_bad_option(g, dot_args, arg, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        ops.dot_attention(g, **dot_args, **{arg: value})


@pytest.mark.parametrize("value", [False, True, "dropped"])
def test_return_attention_valid_values(g, gat_args, dot_args, value):
    for res in (ops.gatv2_attention(g, **gat_args, return_attention=value),
                ops.dot_attention(g, **dot_args, return_attention=value)):
        if value is False:
            assert isinstance(res, torch.Tensor)
        else:
            out, alpha = res
            assert out.shape == (N_DST, H, D) and alpha.shape == (M, H)


@pytest.mark.parametrize("p", [0, 0.0, 1, 1.0, 0.5])
def test_dropout_boundaries_accepted(g, gat_args, p):
    ops.gatv2_attention(g, **gat_args, dropout=p)


# ---------------------------------------------------------------------------- gat
@pytest.fixture
def gat1_args():
    return {"x_src": t(N_SRC, H, D), "score_src": t(N_SRC, H), "score_dst": t(N_DST, H)}


def test_gat_valid_calls_pass(g, gat1_args):
    assert ops.gat_attention(g, **gat1_args).shape == (N_DST, H, D)
    out, alpha = ops.gat_attention(g, **gat1_args, edge_score=t(M, H), edge_weight=t(M), return_attention="dropped")
    assert out.shape == (N_DST, H, D) and alpha.shape == (M, H)


@pytest.mark.parametrize("arg, value, pattern", [
    ("x_src", t(N_SRC + 1, H, D), r"x_src must have shape \[5, \*, \*\], got \[6, 2, 3\]"),
    ("x_src", t(N_SRC, H * D), r"x_src must have shape \[5, \*, \*\], got \[5, 6\]"),
    ("x_src", torch.zeros(N_SRC, H, D, dtype=torch.int64), r"x_src must be a floating-point tensor.*int64"),
    ("score_src", t(N_SRC, H + 1), r"score_src must have shape \[5, 2\], got \[5, 3\]"),
    ("score_src", t(N_DST, H), r"score_src must have shape \[5, 2\], got \[4, 2\]"),
    ("score_src", t(N_SRC, H, 1), r"score_src must have shape \[5, 2\], got \[5, 2, 1\]"),
    ("score_dst", t(N_SRC, H), r"score_dst must have shape \[4, 2\], got \[5, 2\]"),
    ("score_dst", torch.zeros(N_DST, H, dtype=torch.int32), r"score_dst must be a floating-point tensor.*int32"),
    ("score_dst", [[0.0]], r"score_dst must be a torch.Tensor, got list"),
    ("edge_score", t(M + 1, H), r"edge_score must have shape \[7, 2\], got \[8, 2\]"),
    ("edge_score", t(M, H, 1), r"edge_score must have shape \[7, 2\], got \[7, 2, 1\]"),
    ("edge_weight", t(M, 1), r"edge_weight must have shape \[7\], got \[7, 1\]"),
    ("edge_weight", t(M + 1), r"edge_weight must have shape \[7\], got \[8\]"),
    ("edge_weight", torch.ones(M, dtype=torch.int64), r"edge_weight must be a floating-point tensor"),
])
def test_gat_bad_tensor(g, gat1_args, arg, value, pattern):
    gat1_args[arg] = value
    with pytest.raises(ValueError, match=pattern):
        ops.gat_attention(g, **gat1_args)


@pytest.mark.parametrize("arg, value, pattern", [
    ("dropout", -0.1, r"dropout must be in \[0, 1\], got -0.1"),
    ("dropout", float("nan"), r"dropout must be in \[0, 1\], got nan"),
    ("return_attention", "yes", r"return_attention must be False, True or 'dropped', got 'yes'"),
    ("return_attention", None, r"return_attention must be False, True or 'dropped', got None"),
    ("negative_slope", float("inf"), r"negative_slope must be finite, got inf"),
    ("negative_slope", "a", r"negative_slope must be a real number, got 'a' of type str"),
    ("out_dtype", torch.float16, r"out_dtype must be None, the features' dtype \(torch.float32\) or torch.float32"),
])
def test_gat_bad_option(g, gat1_args, arg, value, pattern):
    with pytest.raises(ValueError, match=pattern):
        ops.gat_attention(g, **gat1_args, **{arg: value})


@pytest.mark.parametrize("on_meta, pattern", [
    (["score_src"], r"score_src is on meta, x_src and score_dst on cpu"),
    (["x_src"], r"x_src is on meta, score_src and score_dst on cpu"),
    (["edge_weight"], r"edge_weight is on meta, x_src, score_src and score_dst on cpu"),
])
def test_gat_device_mismatch_names_the_odd_ones(g, gat1_args, on_meta, pattern):
    if "edge_weight" in on_meta:
        gat1_args["edge_weight"] = t(M)
    for name in on_meta:
        gat1_args[name] = meta(gat1_args[name])
    with pytest.raises(ValueError, match=pattern + r": the tensor arguments must all be on one device"):
        ops.gat_attention(g, **gat1_args)


def test_gat_score_dtypes_may_differ(g, gat1_args):
    """Scores and weights are parameter-like: float32 next to 16-bit features (autocast)."""
    gat1_args["x_src"] = gat1_args["x_src"].to(torch.bfloat16)
    assert ops.gat_attention(g, **gat1_args, edge_weight=t(M)).dtype == torch.bfloat16
    assert ops.gat_attention(g, **gat1_args, out_dtype=torch.float32).dtype == torch.float32


def test_gat_bipartite_shapes_checked_per_side(g):
    with pytest.raises(ValueError, match=r"score_src must have shape \[5"):
        ops.gat_attention(g, t(N_SRC, H, D), t(N_DST, H), t(N_SRC, H))


# ---------------------------------------------------------------------------- spmm / segment_reduce
@pytest.mark.parametrize("op", ["spmm", "segment_reduce"])
@pytest.mark.parametrize("x, pattern", [
    (t(N_SRC + 1, F), r"x must have shape \[5, \*\], got \[6, 6\]"),
    (t(N_DST, F), r"x must have shape \[5, \*\], got \[4, 6\]"),
    (t(N_SRC), r"x must be a tensor of shape \[N_src, F...\], got torch.Size\(\[5\]\)"),
    (torch.tensor(1.0), r"x must be a tensor of shape \[N_src, F...\]"),
    (torch.zeros(N_SRC, F, dtype=torch.int64), r"x must be a floating-point tensor, got dtype torch.int64"),
    ([[1.0] * F] * N_SRC, r"x must be a tensor of shape \[N_src, F...\], got list"),
])
def test_aggregation_bad_x(g, op, x, pattern):
    with pytest.raises(ValueError, match=pattern):
        getattr(ops, op)(g, x)


@pytest.mark.parametrize("op", ["spmm", "segment_reduce"])
@pytest.mark.parametrize("w, pattern", [
    (t(M + 1), r"edge_weight must have shape \[7\], got \[8\]"),
    (t(M, 1), r"edge_weight must have shape \[7\], got \[7, 1\]"),
    (torch.ones(M, dtype=torch.int64), r"edge_weight must be a floating-point tensor"),
    ([1.0] * M, r"edge_weight must be a torch.Tensor, got list"),
])
def test_aggregation_bad_edge_weight(g, op, w, pattern):
    x = t(N_SRC, F)
    with pytest.raises(ValueError, match=pattern):
        if op == "spmm":
            ops.spmm(g, x, w)
        else:
            ops.segment_reduce(g, x, "max", w)


@pytest.mark.parametrize("op", ["spmm", "segment_reduce"])
@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float32, torch.float64), (torch.bfloat16, torch.float32),
                                             (torch.float16, torch.float16)])
def test_aggregation_weight_dtype_promotes(g, op, x_dtype, w_dtype):
    """An edge weight of another floating dtype is a parameter-like input (autocast keeps
    weights float32 while features are 16-bit): the result has torch's promoted dtype."""
    x, w = t(N_SRC, F).to(x_dtype), t(M).to(w_dtype)
    out = ops.spmm(g, x, w) if op == "spmm" else ops.segment_reduce(g, x, "max", w)
    assert out.dtype == torch.promote_types(x_dtype, w_dtype)


def test_gatv2_att_dtype_may_differ(g, gat_args):
    """att is a parameter: under autocast it stays float32 while the projections are 16-bit."""
    for name in ("x_src", "x_dst"):
        gat_args[name] = gat_args[name].to(torch.bfloat16)
    assert ops.gatv2_attention(g, **gat_args).dtype == torch.bfloat16


@pytest.mark.parametrize("norm", ["sym", "None", None, "LEFT", ""])
def test_spmm_bad_norm(g, norm):
    with pytest.raises(ValueError, match=rf"norm must be one of 'none', 'left', 'right', 'both'; got {norm!r}"):
        ops.spmm(g, t(N_SRC, F), norm=norm)


@pytest.mark.parametrize("reduce", ["sum", "mean", "MAX", None])
def test_segment_reduce_bad_reduce(g, reduce):
    with pytest.raises(ValueError, match=rf"reduce must be one of 'max', 'min'; got {reduce!r}"):
        ops.segment_reduce(g, t(N_SRC, F), reduce)


def test_bipartite_shapes_checked_per_side(g):
    """x_src/k/v are sized by n_src, x_dst/q by n_dst: swapping them is an error."""
    assert g.n_src != g.n_dst
    with pytest.raises(ValueError, match=r"x_src must have shape \[5"):
        ops.gatv2_attention(g, t(N_DST, H, D), t(N_SRC, H, D), t(H, D))
    with pytest.raises(ValueError, match=r"k must have shape \[5"):
        ops.dot_attention(g, t(N_SRC, H, D), t(N_DST, H, D), t(N_DST, H, D))


def test_backend_is_reference_on_cpu(g):
    assert ops.backend_for("gatv2_attention", t(N_SRC, H, D)) == "reference"
    assert ops.backend_for("gat_attention", t(N_SRC, H, D)) == "reference"
    with ops.force_reference():
        assert ops.backend_for("spmm", t(N_SRC, F)) == "reference"


# ---------------------------------------------------------------------------- scalar options (issue 15)
@pytest.mark.parametrize("value, pattern", [
    ("x", r"scale must be a real number or None, got 'x' of type str"),
    (float("nan"), r"scale must be finite, got nan"),
    (float("inf"), r"scale must be finite, got inf"),
    (-float("inf"), r"scale must be finite, got -inf"),
    (10**400, r"scale must be finite, got 1000"),
    (True, r"scale must be a real number or None, got True of type bool"),
    (1 + 0j, r"scale must be a real number or None, got \(1\+0j\) of type complex"),
    (torch.tensor(0.5), r"scale must be a real number or None, got tensor\(0.5000\) of type Tensor.*float\(t\)"),
    ([0.5], r"scale must be a real number or None, got \[0.5\] of type list"),
])
def test_dot_bad_scale(g, dot_args, value, pattern):
    """Was: TypeError inside the reference op ('x'), all-NaN output (nan, inf), silent True == 1."""
    with pytest.raises(ValueError, match=pattern):
        ops.dot_attention(g, **dot_args, scale=value)


@pytest.mark.parametrize("value, pattern", [
    ("a", r"negative_slope must be a real number, got 'a' of type str"),
    (None, r"negative_slope must be a real number, got None of type NoneType"),
    (float("nan"), r"negative_slope must be finite, got nan"),
    (float("inf"), r"negative_slope must be finite, got inf"),
    (False, r"negative_slope must be a real number, got False of type bool"),
    (torch.tensor(0.2), r"negative_slope must be a real number, got tensor\(0.2000\) of type Tensor"),
])
def test_gatv2_bad_negative_slope(g, gat_args, value, pattern):
    """Was: TypeError inside torch's leaky_relu ('a', None), all-NaN output (nan)."""
    with pytest.raises(ValueError, match=pattern):
        ops.gatv2_attention(g, **gat_args, negative_slope=value)


@pytest.mark.parametrize("value", [0.5, 2, 0, -1.5, np.float32(0.5), np.int64(2)])
def test_real_scalars_accepted(g, gat_args, dot_args, value):
    """Any finite real (Python or numpy int/float) is taken, with the float's result."""
    torch.testing.assert_close(ops.dot_attention(g, **dot_args, scale=value),
                               ops.dot_attention(g, **dot_args, scale=float(value)))
    torch.testing.assert_close(ops.gatv2_attention(g, **gat_args, negative_slope=value),
                               ops.gatv2_attention(g, **gat_args, negative_slope=float(value)))


def test_scale_none_is_the_default(g, dot_args):
    torch.testing.assert_close(ops.dot_attention(g, **dot_args, scale=None),
                               ops.dot_attention(g, **dot_args, scale=1.0 / D**0.5))


@pytest.mark.parametrize("value", ["yes", "False", 1, 0, None, 2.0, np.bool_(True)])
def test_gcn_norm_improved_must_be_bool(value):
    """Was: any truthy value (even "False") silently meant True."""
    sq = Graph.from_edge_index(torch.tensor([[0, 1, 0, 1], [1, 0, 0, 1]]))
    with pytest.raises(ValueError, match=rf"improved must be a bool \(True or False\), got {re.escape(repr(value))}"):
        ops.gcn_norm_values(sq, improved=value)
    assert ops.gcn_norm_values(sq, improved=True).shape == (4,)
    assert ops.gcn_norm_values(sq, improved=False).shape == (4,)


# ---------------------------------------------------------------------------- devices (issue 15)
# Rule (gnn_fastpath/ops/_checks.py): the graph may be on any device; every tensor argument on
# one device; a mismatch lists the arguments off the majority device first, then the rest.
def meta(x):
    return x.to("meta")


@pytest.mark.parametrize("on_meta, pattern", [
    (["x_src"], r"x_src is on meta, x_dst and att on cpu"),  # was: blamed x_dst
    (["x_dst"], r"x_dst is on meta, x_src and att on cpu"),
    (["att"], r"att is on meta, x_src and x_dst on cpu"),
    (["edge_term"], r"edge_term is on meta, x_src, x_dst and att on cpu"),
    (["x_dst", "att", "edge_term"], r"x_src is on cpu, x_dst, att and edge_term on meta"),
    (["x_src", "x_dst"], r"att and edge_term are on cpu, x_src and x_dst on meta"),  # tie: x_src's device
])
def test_gatv2_device_mismatch_names_the_odd_ones(g, gat_args, on_meta, pattern):
    if "edge_term" in pattern:
        gat_args["edge_term"] = t(M, H, D)
    for name in on_meta:
        gat_args[name] = meta(gat_args[name])
    with pytest.raises(ValueError, match=pattern + r": the tensor arguments must all be on one device"):
        ops.gatv2_attention(g, **gat_args)


@pytest.mark.parametrize("on_meta, pattern", [
    (["k"], r"k is on meta, q and v on cpu"),  # was: blamed q
    (["q"], r"q is on meta, k and v on cpu"),
    (["v"], r"v is on meta, q and k on cpu"),
    (["q", "k"], r"v is on cpu, q and k on meta"),
])
def test_dot_device_mismatch_names_the_odd_ones(g, dot_args, on_meta, pattern):
    for name in on_meta:
        dot_args[name] = meta(dot_args[name])
    with pytest.raises(ValueError, match=pattern):
        ops.dot_attention(g, **dot_args)


@pytest.mark.parametrize("op", ["spmm", "segment_reduce"])
@pytest.mark.parametrize("x_meta, w_meta, pattern", [
    (False, True, r"edge_weight is on meta, x on cpu"),
    (True, False, r"edge_weight is on cpu, x on meta"),  # a tie goes to x, the first argument
])
def test_aggregation_device_mismatch(g, op, x_meta, w_meta, pattern):
    x, w = t(N_SRC, F), t(M)
    x, w = (meta(x) if x_meta else x), (meta(w) if w_meta else w)
    with pytest.raises(ValueError, match=pattern + r": the tensor arguments must all be on one device"):
        getattr(ops, op)(g, x, edge_weight=w)


def test_features_on_one_device_take_the_graph_from_any(g, gat_args, dot_args):
    """The CPU graph is copied to the features' device (meta here): no error, meta results."""
    assert ops.gatv2_attention(g, **{k: meta(v) for k, v in gat_args.items()}).device.type == "meta"
    assert ops.dot_attention(g, **{k: meta(v) for k, v in dot_args.items()}).device.type == "meta"
    assert ops.spmm(g, meta(t(N_SRC, F)), meta(t(M))).device.type == "meta"
    assert ops.segment_reduce(g, meta(t(N_SRC, F)), "max", meta(t(M))).device.type == "meta"


@pytest.mark.parametrize("op", ["gat_attention", "gatv2_attention", "dot_attention", "spmm", "segment_reduce"])
def test_graph_on_meta_cannot_serve_real_features(g, gat_args, dot_args, op):
    """Was: NotImplementedError 'Cannot copy out of meta tensor' from inside Graph.to."""
    gat1 = {"x_src": t(N_SRC, H, D), "score_src": t(N_SRC, H), "score_dst": t(N_DST, H)}
    args = {"gat_attention": gat1, "gatv2_attention": gat_args, "dot_attention": dot_args}.get(op, {"x": t(N_SRC, F)})
    with pytest.raises(ValueError, match=r"graph is on meta, a device without data; it cannot be copied to cpu"):
        getattr(ops, op)(g.to("meta"), **args)


@pytest.mark.parametrize("op", ["spmm", "segment_reduce"])
def test_meta_edge_index_through_graph_of(op):
    """Was: RuntimeError 'Tensor.item() cannot be called on meta tensors' inside Graph.of."""
    ei = torch.tensor([[0, 1, 2, 3, 4, 0, 2], [0, 1, 2, 3, 0, 1, 1]], device="meta")
    with pytest.raises(ValueError, match=r"edge_index is on meta"):
        getattr(ops, op)(Graph.of(ei, (N_SRC, N_DST)), meta(t(N_SRC, F)))
