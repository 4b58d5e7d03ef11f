"""PyG ``GATConv`` on :func:`gnn_fastpath.gat_attention`.

Reproduces ``torch_geometric.nn.conv.GATConv.forward`` (PyG 2.8) step by step: ``res``,
then ``lin`` (a homogeneous module: one projection for both sides, applied to each side of
a pair) or ``lin_src``/``lin_dst`` (a module built with ``in_channels=(F_src, F_dst)``, also
for a single feature tensor), called as submodules in stock's order; the per-node logit
terms ``(x_src * att_src).sum(-1)`` and ``(x_dst * att_dst).sum(-1)`` computed from the
module's own parameters (so autograd gives their gradients); stock's self-loop handling
(every existing loop removed, ``(i, i)`` appended for ``i < min(N_src, N_dst)`` or
``min(size)``, loop edge attributes from ``fill_value`` of every kind, see :mod:`.graph`);
``lin_edge`` on the (looped) edge attributes and the edge term
``(lin_edge(edge_attr).view(-1, H, C) * att_edge).sum(-1)``; one fused op for the LeakyReLU
logits, softmax, attention dropout and aggregation; then concat or head mean, residual and
bias.

Also as stock: a pair ``(x_src, None)`` aggregates over the source logit alone, sizes the
output from ``size[1]`` (else the source count) and skips the residual; ``edge_attr`` given
to a module without ``edge_dim`` is ignored (after the self-loop bookkeeping it would fail
in); a graph without edges skips ``lin_edge`` (stock's ``edge_update`` returns early).

``return_attention_weights`` (truthy, as stock checks it) returns ``(out, (edge_index,
alpha))``, ``edge_index`` with the added loops exactly as stock builds it and alpha after
dropout (stock's ``edge_update`` applies dropout before returning alpha); for a torch.sparse
adjacency (without added loops) ``(out, (adj_with_alpha_values, alpha))``, as stock.

What differs from stock: attention dropout with p > 0 in training draws its own random
numbers (same keep probability 1 - p and scale 1 / (1 - p)); stock and fused agree exactly
at p = 0 and in eval mode.

Reduced precision (see :mod:`..shim`): the op gets stock's projections as they come (bf16
or fp16 under autocast, the module dtype in a half module) and the logit terms in stock's
dtype (float32 under autocast: 16-bit projections times float32 ``att_*``); its
``out_dtype`` is the dtype of stock's messages ``alpha.unsqueeze(-1) * x_j``, replayed by
:func:`..shim.result_dtype`: float32 under autocast, the module dtype in a half module.

Falls back (Unsupported) for: ``aggr`` other than sum, ``flow="target_to_source"``, a
torch.sparse adjacency with ``add_self_loops=True`` (stock rebuilds and coalesces it), a
string ``fill_value`` that is not a PyG reduction or whose reduction stock cannot index,
``size`` that disagrees with the features (or holds ``None`` where stock takes
``min(size)``), x not 2-D, ``edge_attr`` not one row per edge, attention parameters of
another shape than (1, heads, out_channels), and the graph inputs listed in :mod:`.graph`
(``torch_sparse.SparseTensor`` among them).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from gnn_fastpath import ops
from gnn_fastpath.ops.dispatch import require
from ..shim import Unsupported, check_like, finite_number
from .graph import (EdgeIndex, attention_dropout, attention_out_dtype, attention_result, attention_self_loops,
                    check_inputs, check_message_passing, check_return_attention, graph_of, is_sparse,
                    looped_edge_attr, looped_needs_exact_graph, pair_features, pyg_softmax, split_pair)

#: The tensor deciding device and dtype: ``x``, or ``x[0]`` of a pair.
features = pair_features


def _stock_dtypes(x: Tensor, att: Tensor):
    """(alpha, message) as stock's ``edge_update`` and ``message`` type them."""
    score = (x * att).sum(dim=-1)
    alpha = pyg_softmax(torch.nn.functional.leaky_relu(score + score))
    return alpha, alpha.unsqueeze(-1) * x


def _propagate_size(edge_index, size) -> list:
    """The ``[N_src, N_dst]`` that ``MessagePassing._check_input`` starts from (None: taken
    from the features)."""
    if EdgeIndex is not None and isinstance(edge_index, EdgeIndex):
        return [edge_index.num_rows, edge_index.num_cols]
    if is_sparse(edge_index):
        return [edge_index.size(1), edge_index.size(0)]
    return list(size) if size is not None else [None, None]


def _sizes(edge_index, size, n_src: int, x_dst: Optional[Tensor]) -> Tuple[int, int]:
    """(N_src, N_dst) as stock's ``propagate`` finds them, or Unsupported where stock would
    raise or disagree with the features."""
    if size is not None:
        if (not isinstance(size, (tuple, list)) or len(size) != 2
                or any(s is not None and (not isinstance(s, int) or isinstance(s, bool)) for s in size)):
            raise Unsupported("size", f"size={size!r} (the fused path takes two ints or None)")
    if isinstance(edge_index, Tensor) and not is_sparse(edge_index) and size is not None:
        prop = list(size)
    else:
        prop = _propagate_size(edge_index, None)
    if prop[0] not in (None, n_src):
        raise Unsupported("size", f"the graph has {prop[0]} sources, x {n_src} rows")
    if x_dst is not None:
        n_dst = x_dst.size(0)
        if prop[1] not in (None, n_dst):
            raise Unsupported("size", f"the graph has {prop[1]} targets, x[1] {n_dst} rows")
    else:  # stock's size_i = size[1], else size[0]
        n_dst = prop[1] if prop[1] is not None else n_src
    if size is not None and any(s not in (None, n) for s, n in zip(size, (n_src, n_dst))):
        raise Unsupported("size", f"size={tuple(size)} but the inputs give ({n_src}, {n_dst})")
    return n_src, n_dst


def _num_loops(size, n_src: int, n_dst: int, x_dst: Optional[Tensor]) -> int:
    """How many self loops stock's ``add_self_loops`` appends: ``min(size)`` when given, else
    the sources, or min(sources, targets) with target features; Unsupported where stock's
    ``min(size)`` raises or the loops would reach beyond the targets."""
    if size is not None:
        if None in tuple(size):
            raise Unsupported("size", f"size={tuple(size)} with add_self_loops (stock takes min(size))")
        num_loops = min(size)
    else:
        num_loops = n_src if x_dst is None else min(n_src, n_dst)
    if num_loops > min(n_src, n_dst):
        raise Unsupported("size", f"{num_loops} self loops for ({n_src}, {n_dst}) nodes")
    return num_loops


def _check_edge_attr(module, edge_attr, num_edges: int, like: Tensor) -> bool:
    """Whether ``edge_attr`` enters the logits (``lin_edge`` exists); Unsupported for one that
    does, or one that stock's self-loop handling indexes, not of one row per edge."""
    if edge_attr is None:
        return False
    used = module.lin_edge is not None
    if used:
        check_like("edge_attr", edge_attr, like)
    elif module.add_self_loops:  # stock indexes and fills it, then ignores it
        if not isinstance(edge_attr, Tensor) or not edge_attr.is_floating_point():
            raise Unsupported("edge_attr", "edge_attr without edge_dim that is not a floating tensor")
        if edge_attr.device != like.device:
            raise Unsupported("device", f"edge_attr is on {edge_attr.device}, features on {like.device}")
        fill = module.fill_value
        if isinstance(fill, Tensor):  # stock expands it over the loops: same shapes, no copy here
            attr = fill if edge_attr.dim() == fill.dim() else fill.unsqueeze(0)
            try:
                attr.expand((1,) + tuple(edge_attr.shape[1:]))
            except RuntimeError as exc:
                raise Unsupported("fill_value", str(exc)) from None
    else:
        return False  # ignored by stock altogether
    if edge_attr.dim() not in (1, 2) or edge_attr.size(0) != num_edges:
        raise Unsupported("edge_attr", f"edge_attr of shape {tuple(edge_attr.shape)} "
                                       f"(expected [{num_edges}] or [{num_edges}, edge_dim])")
    return used


def _check_att(name: str, param, H: int, C: int) -> None:
    if not isinstance(param, Tensor) or tuple(param.shape) != (1, H, C):
        shape = tuple(param.shape) if isinstance(param, Tensor) else type(param).__name__
        raise Unsupported("attn", f"{name} of shape {shape}, expected (1, {H}, {C})")


def forward(module, backend: str, x, edge_index, edge_attr=None, size=None, return_attention_weights=None):
    """Fused ``GATConv.forward``: same arguments, same return value."""
    check_message_passing(module)
    x_src, x_dst = split_pair(x, none_target=True)
    pair = not isinstance(x, Tensor)
    check_inputs(module, x_src)
    check_return_attention(return_attention_weights, module)
    targets = x_src if not pair else x_dst  # stock's x_dst: the same tensor for one x
    n_src, n_dst = _sizes(edge_index, size, x_src.size(0), targets)
    base = graph_of(edge_index, n_src, n_dst, x_src,
                    static=not looped_needs_exact_graph(module, return_attention_weights, edge_attr))
    use_edge = _check_edge_attr(module, edge_attr, base.num_edges, x_src)
    graph, looped = attention_self_loops(module, edge_index, base, edge_attr,
                                         lambda: _num_loops(size, n_src, n_dst, targets))
    p = attention_dropout(module)
    slope = finite_number("negative_slope", module.negative_slope)

    H, C = int(module.heads), int(module.out_channels)
    _check_att("att_src", module.att_src, H, C)
    _check_att("att_dst", module.att_dst, H, C)
    if use_edge:
        _check_att("att_edge", module.att_edge, H, C)
    require("gat_attention", x_src.device, x_src.dtype, graph, heads=(H, C))  # before any submodule runs

    res = None
    if not pair:
        if module.res is not None:
            res = module.res(x_src)
        if module.lin is not None:
            h_src = h_dst = module.lin(x_src).view(-1, H, C)
        else:
            h_src = module.lin_src(x_src).view(-1, H, C)
            h_dst = module.lin_dst(x_src).view(-1, H, C)
    else:
        if x_dst is not None and module.res is not None:
            res = module.res(x_dst)
        lin_src, lin_dst = (module.lin, module.lin) if module.lin is not None else (module.lin_src, module.lin_dst)
        h_src = lin_src(x_src).view(-1, H, C)
        h_dst = None if x_dst is None else lin_dst(x_dst).view(-1, H, C)

    score_src = (h_src * module.att_src).sum(dim=-1)
    if h_dst is not None:
        score_dst = (h_dst * module.att_dst).sum(dim=-1)
    else:  # stock's alpha_i is None: the logit is the source term alone
        score_dst = score_src.new_zeros(n_dst, H)

    edge_score = None
    if use_edge and graph.num_edges:  # stock's edge_update returns before lin_edge without edges
        if looped is not None:
            edge_attr = looped_edge_attr(module.fill_value, edge_attr, looped)
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        edge_score = (module.lin_edge(edge_attr).view(-1, H, C) * module.att_edge).sum(dim=-1)

    out_dtype = attention_out_dtype("GATConv", _stock_dtypes, h_src, module.att_src.dtype)
    # Stock returns alpha after dropout ("dropped"): its edge_update applies the dropout.
    out = ops.gat_attention(graph, h_src, score_src, score_dst, edge_score, negative_slope=slope,
                            return_attention="dropped" if return_attention_weights else False, dropout=p,
                            out_dtype=out_dtype)
    return attention_result(module, out, res, edge_index, looped, return_attention_weights)
