"""DGL ``EdgeConv``, propagation-postponed on :func:`gnn_fastpath.segment_reduce` (see
:mod:`..edge_conv`).

Stock (DGL 2.1.0, ``batch_norm=False``): ``theta_ij = theta(x_i - x_j)`` (``fn.v_sub_u``:
destination minus source, the opposite sign of the DGCNN paper's ``x_j - x_i``),
``phi_i = phi(x_i)``, then ``update_all(fn.e_add_v("theta", "phi", "e"), fn.max)``. With
``theta(z) = W z + b`` that is

.. math::
    h_i = \\max_j (W x_i - W x_j + b + \\phi(x_i)) = U_i - \\min_j W x_j,
    \\qquad U_i = W x_i + b + \\phi(x_i),

so the fused path runs ``theta``'s matmul on the nodes (its ``weight``/``bias`` read directly:
``theta`` must be a plain ``nn.Linear`` without hooks), calls ``phi`` as a submodule on the
destination features, and reduces ``P = W x_src`` [N_src, F] with one
``segment_reduce(min)``: no [M, F] edge tensor (stock forms three). DGL's max rules carry
over: a tie's whole gradient goes to the first or the last tied edge in DGL's edge order, as
the running DGL build does for ``copy_e`` + ``fn.max``, the form DGL runs ``e_add_v`` in
(:func:`.ties.tie_break`), NaN messages never win, and a
destination without in-edges gets 0 with no gradient (DGL writes its -inf as 0).

Known differences (inherent to the reorganisation; see :mod:`..edge_conv`): values agree to
float rounding, so a maximum reached by two messages only by rounding (or by BLAS rounding
equal feature rows differently by their position: real graphs with repeated feature rows
meet it) is a tie on one path and not on the other, and the gradient goes to another edge of
equal features. Non-finite features: stock drops each non-finite message (a destination with
non-finite own features gets 0, a source with an infinite ``W x_j`` turns the row's maximum
into an infinity written as 0), while here U_i stays non-finite and an infinite minimum of P
is dropped alone (the row gets U_i). A ``segment_reduce`` taking the destination term
(``max_j (u_i - p_j)`` with DGL's rules) would make both exact, node-level; the op does not
offer it yet.

Destination features: a pair's second tensor, a block's first ``num_dst_nodes`` rows, else
the features themselves; features ``[N, *, F]`` (the Linear maps the last dimension).

``batch_norm=True`` normalises the per-edge messages across all edges (``bn`` over
``g.edata["e"]``): a statistic of the [M, F] edge tensor itself, which no node-level
reorganisation gives; it runs stock (reason ``batch_norm``).

Reduced precision, derived from DGL 2.1's code: under CUDA autocast (A) ``theta``/``phi``
give A, and the message (gsddmm ``e_add_v``, which casts its operands to A) and its max
(gspmm) are A; in a half module everything is the module's dtype. Here, for such 16-bit
messages, ``theta``'s two node-level products run in float32 (autocast off), ``phi`` runs as
stock runs it, the op reduces the float32 P and ``U - min`` is rounded once to stock's dtype:
U and P cancel where x_j is near x_i, so rounding them to 16 bits separately would cost
accuracy stock does not lose (see :func:`..edge_conv.split_linear`; float32 node data is
twice the bytes of a 16-bit reduction). Under CPU autocast the layer runs stock
(:func:`.graph.check_precision`).

Falls back (Unsupported) also for: heterographs with several edge types, features of fewer
than 2 dimensions, of different trailing shapes on the two sides or whose row counts do not
match the graph, a feature pair on a graph with one node type that is not a block (stock's
``dstdata`` write replaces the source features there: :func:`.graph.check_pair_frames`), a
``theta`` that is not a hook-free ``nn.Linear``, and a graph without edges
(DGL 2.1's backward of that max indexes edge 0, which does not exist: stock raises).
"""
from __future__ import annotations

from torch import nn

from gnn_fastpath.ops.dispatch import require
from .. import edge_conv
from ..shim import Unsupported, autocast_dtype, check_like, has_module_hooks, linear_dtype
from . import ties
from .graph import check_call, check_pair_frames, check_zero_in_degree, graph_of, node_features


def _check_inputs(module, g, feat, n_src: int, n_dst: int, is_block: bool):
    """(feat_src, feat_dst) after the checks stock would fail later (those run stock)."""
    if module.batch_norm:
        raise Unsupported("batch_norm", "batch_norm=True normalises the [M, F] edge messages across edges "
                                        "(not representable on node-level data)")
    theta = module.theta
    if type(theta) is not nn.Linear or has_module_hooks(theta):
        what = "an nn.Linear with hooks" if type(theta) is nn.Linear else f"a {type(theta).__name__}"
        raise Unsupported("theta", f"theta is {what} (the fused path reads a plain nn.Linear's weight and bias)")
    check_pair_frames(g, feat)
    feat_src, feat_dst = node_features(feat, n_src, n_dst, is_block, "[N, *, F]")
    if theta.weight.shape[1] != feat_src.shape[-1]:
        raise Unsupported("input", f"theta takes {theta.weight.shape[1]} features, the input has {feat_src.shape[-1]}")
    for name, p in module.named_parameters():
        check_like(f"parameter {name}", p, feat_src)
    return feat_src, feat_dst


def fused_forward(module, backend, graph, feat):
    """``EdgeConv.forward(g, feat)`` on the fused op."""
    g = graph
    n_src, n_dst, is_block, x = check_call(g, feat)
    feat_src, feat_dst = _check_inputs(module, g, feat, n_src, n_dst, is_block)

    G = graph_of(g)
    check_zero_in_degree(module, G)
    if G.num_edges == 0:
        raise Unsupported("empty_graph", "a graph without edges (DGL 2.1's backward of its max indexes edge 0)")
    require("segment_reduce", x.device, x.dtype, G)  # before phi runs

    tie = ties.tie_break(g.device, "copy_e")  # DGL runs e_add_v + max as copy_e + max
    theta = module.theta
    # stock's message dtype: gsddmm casts to A under CUDA autocast, else theta's output dtype
    message_dtype = (autocast_dtype("cuda") if x.is_cuda else None) or linear_dtype(feat_src, theta.weight)
    compute = edge_conv.compute_dtype(message_dtype)  # float32 node terms for 16-bit messages
    u = edge_conv.linear(feat_dst, theta.weight, theta.bias, compute) + module.phi(feat_dst)
    p = edge_conv.linear(feat_src, theta.weight, None, compute)
    # max_j (U_i - P_j) = U_i - min_j P_j; every destination has an in-edge unless allowed
    out = edge_conv.reduce_postponed(G, u, p, "max", tie_break=tie, non_finite="drop", negate=True,
                                     empty_rows=bool(module._allow_zero_in_degree))
    return out.to(message_dtype)
